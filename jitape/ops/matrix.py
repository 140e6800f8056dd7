"""jt.linalg composites: matvec, cross, diag_part, trace, band_part, triangular_solve, and the unrolled
factorisations cholesky (column by column) and det / slogdet (LU with partial pivoting).

The factorisations are loops of slices, matmuls and gathers over the trailing dimensions, batched over
the leading ones; pivot rows are chosen from numpy values at call time (eager semantics), so every
result is differentiable to any order.
"""
import math

import numpy as np

from ..tensor import Tensor
from ..tracing import _traces, observe
from . import elementwise as _ew
from . import linalg as _linalg
from . import reduction as _red
from . import shape as _shape
from .core import as_tensor, broadcast_shapes, composite, float_tensor, promote


def _swap_last(x):
    return _shape.transpose(x, tuple(range(x.ndim - 2)) + (x.ndim - 1, x.ndim - 2))


def _matrices(x, what, square=True):
    if x.ndim < 2 or (square and x.shape[-1] != x.shape[-2]):
        kind = "square matrices (..., n, n)" if square else "matrices (..., m, n)"
        raise ValueError(f"{what}: expected {kind}, got shape {x.shape}")
    return x


@composite
def matvec(a, b, transpose_a=False, adjoint_a=False, a_is_sparse=False, b_is_sparse=False, name=None):
    """The matrix-vector product a @ b over batches: a (..., m, n), b (..., n) -> (..., m).

    >>> import jitape as jt
    >>> jt.linalg.matvec(jt.eye(2) * 2.0, jt.constant([1.0, 3.0])).numpy()
    array([2., 6.], dtype=float32)
    """
    a, b = promote(a, b)
    _matrices(a, "linalg.matvec", square=False)
    if b.ndim < 1:
        raise ValueError(f"linalg.matvec: b must have rank >= 1, got shape {b.shape}")
    y = _linalg.matmul(a, _shape.expand_dims(b, -1), transpose_a=transpose_a or adjoint_a)
    return _shape.squeeze(y, -1)


@composite
def cross(a, b, name=None):
    """The cross product of 3-vectors along the last axis (numpy broadcasting over the others).

    >>> import jitape as jt
    >>> jt.linalg.cross(jt.constant([1.0, 0.0, 0.0]), jt.constant([0.0, 1.0, 0.0])).numpy()
    array([0., 0., 1.], dtype=float32)
    """
    a, b = promote(a, b)
    if a.ndim < 1 or b.ndim < 1 or a.shape[-1] != 3 or b.shape[-1] != 3:
        raise ValueError(f"linalg.cross: both inputs need a last axis of size 3, got shapes {a.shape} and {b.shape}")
    shape = broadcast_shapes(a.shape, b.shape, "linalg.cross")
    a1, a2, a3 = _shape.unstack(_shape.broadcast_to(a, shape), axis=-1)
    b1, b2, b3 = _shape.unstack(_shape.broadcast_to(b, shape), axis=-1)
    return _shape.stack([a2 * b3 - a3 * b2, a3 * b1 - a1 * b3, a1 * b2 - a2 * b1], axis=-1)


@composite
def diag_part(input, name=None, k=0):
    """The main diagonal of each matrix in (..., m, n): shape (..., min(m, n)).

    >>> import jitape as jt
    >>> jt.linalg.diag_part(jt.constant([[1.0, 2.0], [3.0, 4.0]])).numpy()
    array([1., 4.], dtype=float32)
    """
    x = _matrices(as_tensor(input), "linalg.diag_part", square=False)
    if k != 0:
        raise ValueError(f"linalg.diag_part: only the main diagonal (k=0) is supported, got k={k}")
    m, n = x.shape[-2:]
    flat = _shape.reshape(x, x.shape[:-2] + (m * n,))
    return _shape.gather(flat, np.arange(min(m, n)) * (n + 1), axis=x.ndim - 2)


@composite
def trace(x, name=None):
    """The sum of the main diagonal of each matrix in (..., m, n).

    >>> import jitape as jt
    >>> float(jt.linalg.trace(jt.constant([[1.0, 2.0], [3.0, 4.0]])))
    5.0
    """
    return _red.reduce_sum(diag_part(x), axis=-1)


def _band_mask(m, n, num_lower, num_upper):
    offset = np.arange(m)[:, None] - np.arange(n)[None, :]        # row - column: > 0 below the diagonal
    return ((num_lower < 0) | (offset <= num_lower)) & ((num_upper < 0) | (-offset <= num_upper))


@composite
def band_part(input, num_lower, num_upper, name=None):
    """Each matrix with entries outside the band zeroed: num_lower sub-, num_upper superdiagonals kept
    (-1 keeps that whole triangle). band_part(x, -1, 0) is the lower triangle.

    >>> import jitape as jt
    >>> jt.linalg.band_part(jt.ones((2, 2)), 0, -1).numpy()
    array([[1., 1.],
           [0., 1.]], dtype=float32)
    """
    x = _matrices(as_tensor(input), "linalg.band_part", square=False)
    num_lower, num_upper = int(num_lower), int(num_upper)
    mask = _band_mask(*x.shape[-2:], num_lower, num_upper)
    if x.dtype.kind != "f":
        return Tensor(np.where(mask, x._value, 0).astype(x.dtype))
    return x * Tensor(mask.astype(x.dtype))


@composite
def triangular_solve(matrix, rhs, lower=True, adjoint=False, name=None):
    """X with T @ X = rhs, where T is matrix's lower (or upper) triangle; the other triangle is ignored.
    With adjoint=True, solves T^T @ X = rhs. Batch dimensions broadcast.

    >>> import jitape as jt
    >>> jt.linalg.triangular_solve(jt.constant([[2.0, 9.0], [1.0, 1.0]]), jt.constant([[2.0], [3.0]])).numpy()
    array([[1.],
           [2.]], dtype=float32)
    """
    a, b = promote(matrix, rhs)
    _matrices(a, "linalg.triangular_solve")
    if b.ndim < 2 or b.shape[-2] != a.shape[-1]:
        raise ValueError(f"linalg.triangular_solve: rhs shape {b.shape} does not match matrix shape {a.shape} "
                         f"(expected (..., {a.shape[-1]}, k))")
    t = band_part(a, -1, 0) if lower else band_part(a, 0, -1)
    if np.any(np.diagonal(t._value, axis1=-2, axis2=-1) == 0):
        raise ValueError("linalg.triangular_solve: the triangular matrix has a zero on its diagonal (singular)")
    batch = broadcast_shapes(a.shape[:-2], b.shape[:-2], "linalg.triangular_solve")
    t = _shape.broadcast_to(t, batch + a.shape[-2:])
    b = _shape.broadcast_to(b, batch + b.shape[-2:])
    return _linalg.solve(_swap_last(t) if adjoint else t, b)


# -- cholesky ------------------------------------------------------------------------------
@composite
def cholesky(input, name=None):
    """The lower-triangular L with L @ L^T = input, for symmetric positive-definite matrices (..., n, n).

    Only the lower triangle of `input` is read, as in TensorFlow and numpy.

    >>> import jitape as jt
    >>> jt.linalg.cholesky(jt.constant([[4.0, 2.0], [2.0, 2.0]])).numpy()
    array([[2., 0.],
           [1., 1.]], dtype=float32)
    """
    a = _matrices(float_tensor(input, "linalg.cholesky"), "linalg.cholesky")
    try:
        np.linalg.cholesky(a._value)
    except np.linalg.LinAlgError:
        raise ValueError(f"linalg.cholesky: the input (shape {a.shape}) is not symmetric positive definite "
                         f"(its lower triangle is used)") from None
    n = a.shape[-1]
    batch = a.shape[:-2]
    columns = []            # column j of L: (..., n - j) entries from the diagonal down
    done = None             # L[..., :, :j], the columns already computed
    for j in range(n):
        v = _shape.squeeze(_shape.slice(a, (0,) * len(batch) + (j, j), batch + (n - j, 1)), -1)
        if done is not None:
            below = _shape.slice(done, (0,) * len(batch) + (j, 0), batch + (n - j, j))
            row = _shape.slice(done, (0,) * len(batch) + (j, 0), batch + (1, j))
            v = v - _shape.squeeze(_linalg.matmul(below, row, transpose_b=True), -1)
        pivot = _ew.sqrt(_shape.slice(v, (0,) * len(batch) + (0,), batch + (1,)))
        column = _shape.pad(v / pivot, [(0, 0)] * len(batch) + [(j, 0)])
        columns.append(_shape.expand_dims(column, -1))
        done = _shape.concat(columns, -1)
    return done


# -- LU determinants -----------------------------------------------------------------------
def _lu_pivots(a):
    """The diagonal of U in P A = L U (partial pivoting) as a (batch, n) tensor, and each P's sign."""
    n = a.shape[-1]
    batch = math.prod(a.shape[:-2])
    s = _shape.reshape(a, (batch, n, n))          # the trailing block still to be eliminated
    parity = np.ones(batch, a.dtype)
    diagonal = []
    for j in range(n):
        m = n - j
        column = np.abs(s._value[:, :, 0])
        pivot = np.argmax(column, axis=1)
        if _traces.active:
            _guard_pivots(s, pivot, batch, m)
        if pivot.any():
            perm = np.tile(np.arange(m), (batch, 1))
            rows = np.arange(batch)
            perm[rows, pivot], perm[rows, 0] = 0, pivot
            parity = np.where(pivot != 0, -parity, parity)
            s = _shape.reshape(_shape.gather(_shape.reshape(s, (batch * m, m)),
                                             (perm + m * rows[:, None]).reshape(-1)), (batch, m, m))
        d = _shape.slice(s, (0, 0, 0), (batch, 1, 1))
        diagonal.append(_shape.reshape(d, (batch,)))
        if m == 1:
            break
        # a zero column (singular input) has nothing to eliminate: divide by 1 instead of 0
        zero = column[np.arange(batch), pivot] == 0
        safe_d = _ew.where(zero[:, None, None], 1.0, d) if zero.any() else d
        if zero.any():
            # that branch has no derivative (the determinant's, the adjugate, is not what it computes): a term
            # of value 0 whose derivative is nan (0 * sqrt'(0)) at every entry of the zero column makes the
            # gradient loud, never silently wrong; matrices with a nonzero pivot here read a constant instead
            column_entries = _ew.where(zero[:, None, None], _shape.slice(s, (0, 0, 0), (batch, m, 1)), 1.0)
            loud = _ew.scale(_red.reduce_sum(_ew.sqrt(_ew.square(column_entries)), axis=(1, 2)), 0.0)
            diagonal[-1] = diagonal[-1] + loud
        factors = _shape.slice(s, (0, 1, 0), (batch, m - 1, 1)) / safe_d
        s = _shape.slice(s, (0, 1, 1), (batch, m - 1, m - 1)) - \
            _linalg.matmul(factors, _shape.slice(s, (0, 0, 1), (batch, 1, m - 1)))
    return _shape.stack(diagonal, axis=1), parity


def _guard_pivots(s, pivot, batch, m):
    """In a jt.function trace, the pivot rows chosen from s's values become guards, so a replay whose pivots
    (or whose zero columns) differ traces again: recorded tests that the chosen entry of each first column is
    still a largest one in magnitude, and whether it is zero."""
    column = _ew.abs(_shape.reshape(_shape.slice(s, (0, 0, 0), (batch, m, 1)), (batch * m,)))
    chosen = _shape.gather(column, pivot + m * np.arange(batch))
    how = "the pivot rows of an LU factorisation (linalg.det, linalg.slogdet)"
    observe(_ew.greater_equal(chosen, _red.reduce_max(_shape.reshape(column, (batch, m)), axis=1)), how)
    observe(_ew.equal(chosen, 0.0), how)


@composite
def det(input, name=None):
    """The determinant of each square matrix in (..., n, n): the product of U's diagonal in a pivoted LU.

    An exactly singular matrix (a zero pivot before the last column) gives exactly 0 and a nan gradient:
    this LU has no derivative there (TensorFlow raises for that gradient).

    >>> import jitape as jt
    >>> float(jt.linalg.det(jt.constant([[2.0, 1.0], [4.0, 3.0]])))
    2.0
    """
    a = _matrices(float_tensor(input, "linalg.det"), "linalg.det")
    if a.shape[-1] == 0:
        return Tensor(np.ones(a.shape[:-2], a.dtype)[()])
    u, parity = _lu_pivots(a)
    return _shape.reshape(_red.reduce_prod(u, axis=1) * Tensor(parity), a.shape[:-2])


@composite
def slogdet(input, name=None):
    """(sign, log|det|) of each square matrix in (..., n, n); sign is a constant (no gradient), as in TF.

    >>> import jitape as jt
    >>> sign, logdet = jt.linalg.slogdet(jt.constant([[1.0, 2.0], [3.0, 4.0]]))
    >>> float(sign), round(float(logdet), 4)
    (-1.0, 0.6931)
    """
    a = _matrices(float_tensor(input, "linalg.slogdet"), "linalg.slogdet")
    if a.shape[-1] == 0:
        return Tensor(np.ones(a.shape[:-2], a.dtype)[()]), Tensor(np.zeros(a.shape[:-2], a.dtype)[()])
    u, parity = _lu_pivots(a)
    # recorded (a replay recomputes the signs of its pivots), a constant to derivatives
    sign = _ew.stop_gradient(_shape.reshape(_red.reduce_prod(_ew.sign(u), axis=1) * Tensor(parity), a.shape[:-2]))
    log_abs = _red.reduce_sum(_ew.log(_ew.abs(u)), axis=1)
    return sign, _shape.reshape(log_abs, a.shape[:-2])
