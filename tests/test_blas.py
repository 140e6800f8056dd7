"""jitape_kernels/cpu/blas.py: gemm on caller memory (C = alpha op(A) op(B) + beta C, beta = 1 adding in place)
and solve_columns (LAPACK gesv on a copy in the caller's scratch) agree with numpy, on empty and one-entry
dimensions too, leave their operands as they were, and refuse what they cannot serve."""
import numpy as np
import pytest
from numba.core.errors import TypingError

from jitape_kernels.cpu.blas import gemm, solve_columns, strided_gemm

SHAPES = [(3, 4, 5), (1, 1, 1), (0, 3, 2), (3, 0, 2), (7, 5, 0), (1, 9, 1), (33, 17, 20)]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("m, k, n", SHAPES)
@pytest.mark.parametrize("trans_a", [False, True])
@pytest.mark.parametrize("trans_b", [False, True])
def test_gemm_sets_and_adds_the_product(dtype, m, k, n, trans_a, trans_b):
    rng = np.random.default_rng(m * 100 + k * 10 + n)
    a = rng.standard_normal((k, m) if trans_a else (m, k)).astype(dtype)
    b = rng.standard_normal((n, k) if trans_b else (k, n)).astype(dtype)
    product = (a.T if trans_a else a).astype(np.float64) @ (b.T if trans_b else b).astype(np.float64)
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == np.float32 else dict(rtol=1e-12, atol=1e-12)
    a0, b0 = a.copy(), b.copy()
    c = rng.standard_normal((m, n)).astype(dtype)
    c0 = c.copy()
    gemm(2.0, a, trans_a, b, trans_b, 1.0, c)           # added in place
    np.testing.assert_allclose(c, 2.0 * product + c0, **tol)
    c[...] = np.nan                                      # beta = 0 never reads C
    gemm(1.0, a, trans_a, b, trans_b, 0.0, c)
    np.testing.assert_allclose(c, product, **tol)
    assert np.array_equal(a, a0) and np.array_equal(b, b0)


def test_gemm_refuses_operands_that_do_not_match_and_views_that_are_not_contiguous():
    with pytest.raises(ValueError, match="shapes"):
        gemm(1.0, np.ones((2, 3)), False, np.ones((4, 2)), False, 0.0, np.ones((2, 2)))
    with pytest.raises(TypingError):
        gemm(1.0, np.ones((3, 2)).T, False, np.ones((3, 2)), False, 0.0, np.ones((2, 2)))
    with pytest.raises(TypingError):
        gemm(1.0, np.ones((3, 4))[:, :2], False, np.ones((2, 2)), False, 0.0, np.ones((3, 2)))


@pytest.mark.parametrize("m, k, n", SHAPES)
@pytest.mark.parametrize("trans_a", [False, True])
@pytest.mark.parametrize("trans_b", [False, True])
def test_strided_gemm_multiplies_matrices_whose_rows_lie_apart_and_equals_numpy_s_matmul(m, k, n, trans_a, trans_b):
    """Each matrix a strided window of a wider array (rows ld entries apart), as numpy's matmul hands BLAS the
    items of a transposed view: the same bits as numpy's product of those views, and nothing outside the windows
    written."""
    rng = np.random.default_rng(m * 100 + k * 10 + n + 7)
    rows_a, cols_a = (k, m) if trans_a else (m, k)
    rows_b, cols_b = (n, k) if trans_b else (k, n)
    wide_a = rng.standard_normal((rows_a, cols_a + 3))
    wide_b = rng.standard_normal((rows_b, cols_b + 2))
    wide_c = rng.standard_normal((m, n + 4))
    a, b = wide_a[:, 1:1 + cols_a], wide_b[:, 2:2 + cols_b]
    expected = np.matmul(a.T if trans_a else a, b.T if trans_b else b)
    before = wide_c.copy()
    strided_gemm(1.0, wide_a.reshape(-1)[1:], cols_a + 3, trans_a, wide_b.reshape(-1)[2:], cols_b + 2, trans_b, 0.0,
                 wide_c.reshape(-1)[3:], n + 4, m, n, k)
    if min(m, k, n) >= 2:       # numpy's matmul calls gemm (below 2, gemv or its own loops)
        assert np.array_equal(wide_c[:, 3:3 + n], expected)
    np.testing.assert_allclose(wide_c[:, 3:3 + n], expected, rtol=1e-12, atol=1e-12)
    outside = np.ones(wide_c.shape, bool)
    outside[:, 3:3 + n] = False
    assert np.array_equal(wide_c[outside], before[outside])


def test_strided_gemm_refuses_matrices_that_do_not_fit_their_arrays():
    a, b, c = np.ones(6), np.ones(6), np.zeros(4)
    with pytest.raises(ValueError, match="does not fit"):       # rows closer than a row's length
        strided_gemm(1.0, a, 2, False, b, 2, False, 0.0, c, 2, 2, 2, 3)
    with pytest.raises(ValueError, match="does not fit"):       # the last row runs past the array
        strided_gemm(1.0, a, 4, False, b, 2, False, 0.0, c, 2, 2, 2, 3)
    with pytest.raises(ValueError, match="does not fit"):       # C's rows
        strided_gemm(1.0, a, 3, False, b, 2, False, 0.0, c, 3, 2, 2, 3)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n, m", [(1, 1), (3, 2), (10, 7), (0, 2), (4, 0)])
@pytest.mark.parametrize("transposed", [False, True])
def test_solve_columns_solves_in_place_as_numpy(dtype, n, m, transposed):
    rng = np.random.default_rng(n * 10 + m)
    a = (rng.standard_normal((n, n)) + 3 * np.eye(n)).astype(dtype)
    b = rng.standard_normal((n, m)).astype(dtype)
    a0 = a.copy()
    columns = b.T.copy().reshape(-1)        # column-major (n, m), a copy: b stays as it was
    temps = np.full(n * n + 2 * n + 1, np.nan, dtype)
    solve_columns(a, transposed, columns, temps)
    expected = np.linalg.solve((a.T if transposed else a).astype(np.float64), b.astype(np.float64))
    tol = dict(rtol=1e-3, atol=1e-4) if dtype == np.float32 else dict(rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(columns.reshape(m, n).T, expected, **tol)
    assert np.array_equal(a, a0)


def test_solve_columns_raises_numpys_error_on_a_singular_matrix():
    with pytest.raises(np.linalg.LinAlgError, match="singular"):
        solve_columns(np.zeros((2, 2)), False, np.ones(2), np.empty(8))
