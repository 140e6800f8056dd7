"""The TensorFlow-name ops beyond what the registry test checks: tuple results (top_k, slogdet), batch_dims,
TensorFlow's defaults, numpy dispatch, and the errors for bad arguments."""
import numpy as np
import pytest

import jitape as jt

RNG = np.random.default_rng(0)
X = RNG.normal(size=(2, 3, 4))
A = RNG.normal(size=(3, 4, 4))


def close(t, expected):
    np.testing.assert_allclose(np.asarray(t), expected, rtol=1e-12, atol=1e-12)


def test_top_k_returns_values_and_int32_indices():
    out = jt.math.top_k(jt.constant([[1.0, 3.0, 3.0, 2.0]]), k=3)
    assert out is not None and out.indices.dtype == jt.int32
    close(out.values, [[3.0, 3.0, 2.0]])
    np.testing.assert_array_equal(out.indices.numpy(), [[1, 2, 3]])       # ties: the lower index first
    values, indices = out
    assert values is out.values and jt.nn.top_k is jt.math.top_k


def test_slogdet_sign_and_det_signs():
    sign, logdet = jt.linalg.slogdet(jt.constant(A))
    np_sign, np_logdet = np.linalg.slogdet(A)
    close(sign, np_sign)
    close(logdet, np_logdet)
    x = jt.constant(A)
    with jt.GradientTape() as tape:
        tape.watch(x)
        sign, logdet = jt.linalg.slogdet(x)
    assert tape.gradient(sign, x) is None
    close(jt.linalg.det(jt.constant([[0.0, 1.0], [1.0, 0.0]])), -1.0)
    assert float(jt.linalg.det(jt.constant([[1.0, 2.0], [2.0, 4.0]]))) == 0.0       # exactly singular


def test_a_replayed_lu_never_uses_stale_pivots_or_signs():
    """det and slogdet choose pivot rows from values: in a jt.function those choices are guards (a replay whose
    pivots differ traces again) and slogdet's sign is recorded. Before, a replay returned the traced sign (1 for
    a negative determinant) and nan through a first pivot that had become zero."""
    sign = jt.function(lambda a: jt.linalg.slogdet(a)[0])
    det = jt.function(lambda a: jt.linalg.det(a))
    d_det = jt.grad(lambda a: jt.linalg.det(a))
    positive, negative = np.array([[2.0, 1.0], [1.0, 3.0]]), np.array([[1.0, 2.0], [3.0, 4.0]])
    zero_first_pivot = np.array([[0.0, 1.0], [2.0, 0.0]])
    for m in (positive, negative, np.array([[-3.0, 1.0], [1.0, 2.0]]), zero_first_pivot, positive):
        assert float(sign(jt.constant(m))) == np.linalg.slogdet(m)[0]
        assert float(det(jt.constant(m))) == pytest.approx(np.linalg.det(m))
        np.testing.assert_allclose(d_det(jt.constant(m)).numpy(), np.linalg.det(m) * np.linalg.inv(m).T)
    assert sign.trace_count <= 3 and det.trace_count <= 3


def test_det_gradient_is_det_times_inverse_transpose():
    x = jt.constant(A)
    with jt.GradientTape() as tape:
        tape.watch(x)
        d = jt.linalg.det(x)
    close(tape.gradient(d, x), np.linalg.det(A)[:, None, None] * np.swapaxes(np.linalg.inv(A), -1, -2))


def test_argmax_defaults_to_axis_0_and_int64():
    out = jt.argmax(jt.constant(X))
    assert out.dtype == jt.int64
    np.testing.assert_array_equal(out.numpy(), np.argmax(X, 0))
    with pytest.raises(TypeError, match="output_type must be int32 or int64"):
        jt.argmax(jt.constant(X), output_type=jt.float32)


def test_one_hot_options():
    np.testing.assert_array_equal(jt.one_hot([1, -1], 3, axis=0).numpy(), [[0, 0], [1, 0], [0, 0]])
    out = jt.one_hot([[2]], 3, on_value=7, off_value=1)
    assert out.dtype == jt.int32 and out.shape == (1, 1, 3)
    np.testing.assert_array_equal(out.numpy(), [[[1, 1, 7]]])
    with pytest.raises(ValueError, match="axis must be -1 or in"):
        jt.one_hot([1], 3, axis=3)
    with pytest.raises(TypeError, match="indices must be integers"):
        jt.one_hot([1.5], 3)


def test_gather_nd_with_batch_dims():
    idx = np.array([[[1], [0]], [[2], [2]]])
    close(jt.gather_nd(jt.constant(X), idx, batch_dims=1), np.stack([X[0, [1, 0]], X[1, [2, 2]]]))


def test_index_errors_name_the_index_and_shape():
    with pytest.raises(ValueError, match=r"gather_nd: index \[2, 3\].*out of range for shape \(2, 3\)"):
        jt.gather_nd(jt.constant(X), [[2, 3]])
    with pytest.raises(ValueError, match=r"tensor_scatter_nd_add: index \[-1\]"):
        jt.tensor_scatter_nd_add(jt.zeros(3), [[-1]], jt.constant([1.0]))
    with pytest.raises(ValueError, match="updates have shape"):
        jt.tensor_scatter_nd_update(jt.zeros((3, 2)), [[0]], jt.constant([1.0]))
    with pytest.raises(ValueError, match="label 3 is outside the valid range of classes \\[0, 3\\)"):
        jt.nn.sparse_softmax_cross_entropy_with_logits([0, 3], jt.zeros((2, 3)))
    with pytest.raises(TypeError, match="labels must be integers"):
        jt.nn.sparse_softmax_cross_entropy_with_logits([0.0], jt.zeros((1, 3)))
    with pytest.raises(ValueError, match="mask of shape"):
        jt.boolean_mask(jt.constant(X), np.ones(3, bool))


def test_integer_scatter_and_band_part_stay_integer():
    out = jt.tensor_scatter_nd_add(jt.constant([1, 2, 3]), [[0], [0]], jt.constant([5, 5]))
    np.testing.assert_array_equal(out.numpy(), [11, 2, 3])
    out = jt.tensor_scatter_nd_update(jt.constant([1, 2, 3]), [[2], [2]], jt.constant([8, 9]))
    np.testing.assert_array_equal(out.numpy(), [1, 2, 9])
    assert jt.linalg.band_part(jt.constant([[1, 2], [3, 4]]), 0, 0).dtype == jt.int32


def test_linalg_errors():
    with pytest.raises(ValueError, match="not symmetric positive definite"):
        jt.linalg.cholesky(jt.constant([[1.0, 2.0], [2.0, 1.0]]))
    with pytest.raises(ValueError, match="square matrices"):
        jt.linalg.det(jt.zeros((2, 3)))
    with pytest.raises(ValueError, match="last axis of size 3"):
        jt.linalg.cross(jt.zeros(2), jt.zeros(2))
    with pytest.raises(ValueError, match="zero on its diagonal"):
        jt.linalg.triangular_solve(jt.constant([[0.0, 1.0], [1.0, 1.0]]), jt.ones((2, 1)))


def test_sorting_errors():
    with pytest.raises(ValueError, match="direction must be 'ASCENDING' or 'DESCENDING'"):
        jt.sort(jt.constant([1.0]), direction="UP")
    with pytest.raises(ValueError, match=r"k must be in \[0, 3\]"):
        jt.math.top_k(jt.zeros(3), k=4)
    with pytest.raises(ValueError, match="repeats must be non-negative"):
        jt.repeat(jt.zeros(3), [1, 2])
    with pytest.raises(ValueError, match="shift and axis must be integers of one length"):
        jt.roll(jt.zeros(3), [1, 2], 0)


def test_relu6_gradient_is_one_strictly_inside():
    x = jt.constant([-1.0, 0.0, 3.0, 6.0, 7.0])
    with jt.GradientTape() as tape:
        tape.watch(x)
        y = jt.nn.relu6(x)
    np.testing.assert_array_equal(tape.gradient(y, x).numpy(), [0, 0, 1, 0, 0])


def test_log_sigmoid_is_stable_and_swish_is_silu():
    np.testing.assert_allclose(jt.nn.log_sigmoid(jt.constant([-800.0, 800.0], jt.float64)).numpy(), [-800.0, 0.0])
    assert jt.nn.swish is jt.nn.silu
    close(jt.nn.silu(jt.constant(X), beta=2.0), X / (1 + np.exp(-2 * X)))


def test_numpy_functions_dispatch_to_the_recorded_ops():
    x = jt.constant(X)
    square = jt.constant(A)
    with jt.GradientTape(persistent=True) as tape:
        tape.watch([x, square])
        outs = [np.sort(x, axis=1), np.roll(x, 2), np.roll(x, 1, axis=2), np.repeat(x, 2, axis=0), np.std(x, axis=1),
                np.trace(square[0]), np.diagonal(square, axis1=1, axis2=2), np.cross(x[..., :3], x[..., 1:]),
                np.linalg.det(square), np.linalg.slogdet(square)[1],
                np.linalg.cholesky(square @ np.swapaxes(square, -1, -2) + np.eye(4))]
    refs = [np.sort(X, axis=1), np.roll(X, 2), np.roll(X, 1, axis=2), np.repeat(X, 2, axis=0), np.std(X, axis=1),
            np.trace(A[0]), np.diagonal(A, axis1=1, axis2=2), np.cross(X[..., :3], X[..., 1:]),
            np.linalg.det(A), np.linalg.slogdet(A)[1], np.linalg.cholesky(A @ np.swapaxes(A, -1, -2) + np.eye(4))]
    for out, ref in zip(outs, refs):
        assert isinstance(out, jt.Tensor)
        np.testing.assert_allclose(out.numpy(), ref, rtol=1e-10, atol=1e-12)
        assert any(g is not None for g in tape.gradient(out, [x, square]))      # recorded, not a numpy result
    np.testing.assert_array_equal(np.argmax(x).numpy(), np.argmax(X))
    np.testing.assert_array_equal(np.argmin(x, axis=2).numpy(), np.argmin(X, axis=2))
    np.testing.assert_array_equal(np.argsort(x, axis=0).numpy(), np.argsort(X, axis=0, kind="stable"))
    assert bool(np.any(x > 2.0)) == bool(np.any(X > 2.0)) and np.all(jt.not_equal(x, 0.0), axis=0).shape == (3, 4)
    with pytest.raises(ValueError, match="ddof=0 only"):
        np.std(x, ddof=1)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("matrix", [
    [[1.0, 2.0], [2.0, 4.0]],                                   # the zero pivot comes last: the adjugate
    [[0.0, 0.0, 1.0], [0.0, 2.0, 3.0], [0.0, 1.0, 5.0]],        # a zero column first: no derivative here
    [[1.0, 2.0, 3.0], [2.0, 4.0, 6.0], [1.0, 0.0, 1.0]],
])
def test_det_of_a_singular_matrix_is_zero_and_its_gradient_never_silently_wrong(matrix):
    a = jt.constant(np.array(matrix))
    with jt.GradientTape() as tape:
        tape.watch(a)
        d = jt.linalg.det(a)
    assert float(d) == 0.0
    got = tape.gradient(d, a).numpy()
    A = np.array(matrix)
    cofactors = np.array([[(-1) ** (i + j) * np.linalg.det(np.delete(np.delete(A, i, 0), j, 1))
                           for j in range(len(A))] for i in range(len(A))])
    finite = np.isfinite(got)
    np.testing.assert_allclose(got[finite], cofactors[finite], atol=1e-12)
