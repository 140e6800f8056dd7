"""Index arithmetic over gather: gather_nd, boolean_mask, tensor_scatter_nd_add/update, roll, repeat, one_hot.

Every differentiable op here flattens the indexed dimensions and calls the gather primitive (or a matmul
with a constant 0/1 matrix), so it inherits derivatives of any order; the indices themselves are numpy
values fixed at call time.
"""
import math

import numpy as np

from ..tensor import Tensor, floatx
from . import linalg as _linalg
from . import shape as _shape
from .core import as_tensor, composite, constant_value, non_differentiable, normalize_axis, promote


def _int_array(indices, what):
    idx = constant_value(indices, "indices")
    if idx.dtype.kind not in "iu":
        raise TypeError(f"{what}: indices must be integers, got dtype {idx.dtype}")
    return idx.astype(np.int64)


def take_along_axis(x, idx, axis):
    """x's entries at integer positions `idx` along `axis` (idx has x's shape elsewhere), one flat gather."""
    axis = normalize_axis(axis, x.ndim, "take_along_axis")
    last = x.ndim - 1
    perm = [d for d in range(x.ndim) if d != axis] + [axis]
    xt = _shape.transpose(x, perm)
    it = np.transpose(idx, perm)
    rows, n, k = math.prod(xt.shape[:-1]), xt.shape[-1], it.shape[-1]
    flat = it.reshape(rows, k) + (np.arange(rows) * n)[:, None]
    y = _shape.reshape(_shape.gather(_shape.reshape(xt, (-1,)), flat.reshape(-1)), it.shape)
    return _shape.transpose(y, np.argsort(perm).tolist()) if axis != last else y


def _flat_positions(idx, dims, what):
    """Row-major positions of the index tuples idx[..., :] into dims; out-of-range ones raise."""
    bad = (idx < 0) | (idx >= np.asarray(dims, np.int64))
    if bad.any():
        where = tuple(np.argwhere(bad.any(axis=-1))[0])
        raise ValueError(f"{what}: index {idx[where].tolist()} (at indices{list(where)}) is out of range "
                         f"for shape {tuple(dims)}")
    return np.ravel_multi_index(tuple(np.moveaxis(idx, -1, 0)), dims) if dims else np.zeros(idx.shape[:-1], np.int64)


# -- gather_nd / boolean_mask ----------------------------------------------------------------
@composite
def gather_nd(params, indices, batch_dims=0, name=None):
    """Slices of `params` at index tuples `indices[..., :k]` (tf.gather_nd).

    >>> import jitape as jt
    >>> jt.gather_nd(jt.constant([[1.0, 2.0], [3.0, 4.0]]), [[1, 0], [0, 1]]).numpy()
    array([3., 2.], dtype=float32)
    """
    x = as_tensor(params)
    idx = _int_array(indices, "gather_nd")
    b = int(batch_dims)
    if idx.ndim < 1 or not 0 <= b < idx.ndim or b > x.ndim:
        raise ValueError(f"gather_nd: batch_dims {batch_dims} is invalid for indices of shape {idx.shape} and "
                         f"params of shape {x.shape}")
    k = idx.shape[-1]
    if b + k > x.ndim or idx.shape[:b] != x.shape[:b]:
        raise ValueError(f"gather_nd: indices of shape {idx.shape} (batch_dims {b}) do not match params of "
                         f"shape {x.shape}: expected indices shape {x.shape[:b]} + (..., k <= {x.ndim - b})")
    dims = x.shape[b:b + k]
    positions = _flat_positions(idx, dims, "gather_nd")
    batch = math.prod(x.shape[:b])
    positions = positions.reshape(batch, -1) + (np.arange(batch) * math.prod(dims))[:, None]
    rest = x.shape[b + k:]
    flat = _shape.reshape(x, (batch * math.prod(dims),) + rest)
    return _shape.reshape(_shape.gather(flat, positions.reshape(-1)), idx.shape[:-1] + rest)


@composite
def boolean_mask(tensor, mask, axis=None, name=None):
    """The entries of `tensor` where `mask` (covering dims axis..axis+mask.ndim) is True, flattened there.

    >>> import jitape as jt
    >>> jt.boolean_mask(jt.constant([1.0, 2.0, 3.0]), [True, False, True]).numpy()
    array([1., 3.], dtype=float32)
    """
    x = as_tensor(tensor)
    m = constant_value(mask, "the mask of jt.boolean_mask")
    if m.dtype != np.bool_:
        raise TypeError(f"boolean_mask: mask must be boolean, got dtype {m.dtype}")
    axis = 0 if axis is None else normalize_axis(axis, x.ndim, "boolean_mask")
    if m.ndim == 0 or x.shape[axis:axis + m.ndim] != m.shape:
        raise ValueError(f"boolean_mask: mask of shape {m.shape} must match dimensions {axis}.. of tensor "
                         f"shape {x.shape}")
    flat = _shape.reshape(x, x.shape[:axis] + (m.size,) + x.shape[axis + m.ndim:])
    return _shape.gather(flat, np.flatnonzero(m), axis=axis)


# -- scatter ---------------------------------------------------------------------------------
def _scatter_rows(tensor, indices, updates, what):
    """tensor and updates as (rows, inner) tensors, and the row each update goes to."""
    t = as_tensor(tensor)
    u = as_tensor(updates)
    idx = _int_array(indices, what)
    if idx.ndim < 1 or idx.shape[-1] > t.ndim:
        raise ValueError(f"{what}: indices of shape {idx.shape} need a last dimension <= rank {t.ndim} of "
                         f"tensor shape {t.shape}")
    k = idx.shape[-1]
    expected = idx.shape[:-1] + t.shape[k:]
    if u.shape != expected:
        raise ValueError(f"{what}: updates have shape {u.shape}, expected {expected} for indices {idx.shape} "
                         f"and tensor {t.shape}")
    rows = _flat_positions(idx, t.shape[:k], what).reshape(-1)
    return t, u, rows, math.prod(t.shape[:k]), math.prod(t.shape[k:])


def _scatter_matrix(rows, n_rows, dtype):
    """The constant (n_rows, len(rows)) 0/1 matrix sending update m to row rows[m]."""
    s = np.zeros((n_rows, rows.size), dtype)
    s[rows, np.arange(rows.size)] = 1
    return Tensor(s)


@composite
def tensor_scatter_nd_add(tensor, indices, updates, name=None):
    """`tensor` with `updates` added at index tuples `indices` (duplicate indices add up).

    >>> import jitape as jt
    >>> jt.tensor_scatter_nd_add(jt.zeros(3), [[0], [2], [0]], jt.constant([1.0, 2.0, 3.0])).numpy()
    array([4., 0., 2.], dtype=float32)
    """
    t, u, rows, n_rows, inner = _scatter_rows(tensor, indices, updates, "tensor_scatter_nd_add")
    if t.dtype.kind != "f" and u.dtype.kind != "f":
        out = np.array(t._value).reshape(n_rows, inner)
        np.add.at(out, rows, np.reshape(u._value, (rows.size, inner)))
        return Tensor(out.reshape(t.shape))
    t, u = promote(t, u)
    added = _linalg.matmul(_scatter_matrix(rows, n_rows, t.dtype), _shape.reshape(u, (rows.size, inner)))
    return t + _shape.reshape(added, t.shape)


@composite
def tensor_scatter_nd_update(tensor, indices, updates, name=None):
    """`tensor` with the entries at index tuples `indices` replaced by `updates`.

    With duplicate indices the last update wins (TensorFlow leaves the order unspecified); the gradient
    of an overwritten update is zero.

    >>> import jitape as jt
    >>> jt.tensor_scatter_nd_update(jt.zeros(3), [[2]], jt.constant([5.0])).numpy()
    array([0., 0., 5.], dtype=float32)
    """
    t, u, rows, n_rows, inner = _scatter_rows(tensor, indices, updates, "tensor_scatter_nd_update")
    last = np.zeros(rows.size, np.bool_)
    last[rows.size - 1 - np.unique(rows[::-1], return_index=True)[1]] = True
    if t.dtype.kind != "f" and u.dtype.kind != "f":
        out = np.array(t._value).reshape(n_rows, inner)
        out[rows[last]] = np.reshape(u._value, (rows.size, inner))[last]
        return Tensor(out.reshape(t.shape))
    t, u = promote(t, u)
    keep = np.ones((n_rows, 1), t.dtype)
    keep[rows] = 0
    kept = _shape.reshape(t, (n_rows, inner)) * Tensor(keep)
    placed = _linalg.matmul(_scatter_matrix(rows[last], n_rows, t.dtype),
                            _shape.gather(_shape.reshape(u, (rows.size, inner)), np.flatnonzero(last)))
    return _shape.reshape(kept + placed, t.shape)


# -- roll / repeat ---------------------------------------------------------------------------
@composite
def roll(input, shift, axis, name=None):
    """Elements shifted by `shift` along `axis` (ints or equal-length lists), wrapping around.

    >>> import jitape as jt
    >>> jt.roll(jt.constant([1.0, 2.0, 3.0]), 1, 0).numpy()
    array([3., 1., 2.], dtype=float32)
    """
    x = as_tensor(input)
    shifts = np.atleast_1d(np.asarray(shift)).reshape(-1)
    axes = np.atleast_1d(np.asarray(axis)).reshape(-1)
    if shifts.dtype.kind not in "iu" or axes.dtype.kind not in "iu" or shifts.size != axes.size:
        raise ValueError(f"roll: shift and axis must be integers of one length, got shift={shift!r}, axis={axis!r}")
    total = {}
    for s, a in zip(shifts.tolist(), axes.tolist()):
        a = normalize_axis(a, x.ndim, "roll")
        total[a] = total.get(a, 0) + s          # repeated axes add up, as in TensorFlow
    for a, s in total.items():
        n = x.shape[a]
        s = s % n if n else 0
        if s:
            x = _shape.concat([_shape._axis_window(x, a, n - s, 1, s), _shape._axis_window(x, a, 0, 1, n - s)], a)
    return x


@composite
def repeat(input, repeats, axis=None, name=None):
    """Each element repeated `repeats` times along `axis` (the flattened input when None), as np.repeat.

    >>> import jitape as jt
    >>> jt.repeat(jt.constant([1.0, 2.0]), 2, axis=0).numpy()
    array([1., 1., 2., 2.], dtype=float32)
    """
    x = as_tensor(input)
    if axis is None:
        x, axis = _shape.reshape(x, (-1,)), 0
    axis = normalize_axis(axis, x.ndim, "repeat")
    reps = constant_value(repeats, "the repeats of jt.repeat")
    n = x.shape[axis]
    if reps.dtype.kind not in "iu" or reps.ndim > 1 or (reps < 0).any() or reps.size not in (1, n):
        raise ValueError(f"repeat: repeats must be non-negative integers, a scalar or one per element of "
                         f"axis {axis} (size {n}); got {reps.tolist()!r}")
    return _shape.gather(x, np.repeat(np.arange(n), reps.reshape(-1) if reps.ndim else int(reps)), axis=axis)


# -- one_hot ---------------------------------------------------------------------------------
@non_differentiable
def one_hot(indices, depth, on_value=None, off_value=None, axis=None, dtype=None, name=None):
    """A one-hot encoding with a new axis of size `depth` (out-of-range indices give all off_value).

    dtype defaults to on_value's (else off_value's) dtype, else jt.floatx() (float32, as TensorFlow).

    >>> import jitape as jt
    >>> jt.one_hot([0, 2], 3).numpy()
    array([[1., 0., 0.],
           [0., 0., 1.]], dtype=float32)
    """
    idx = _int_array(indices, "one_hot")
    depth = int(depth)
    if depth < 0:
        raise ValueError(f"one_hot: depth must be >= 0, got {depth}")
    given = [as_tensor(v)._value for v in (on_value, off_value) if v is not None]
    if any(np.ndim(v) for v in given):
        raise ValueError("one_hot: on_value and off_value must be scalars")
    dtype = np.dtype(given[0].dtype if dtype is None and given else floatx() if dtype is None else dtype)
    on = np.asarray(1 if on_value is None else as_tensor(on_value)._value, dtype)
    off = np.asarray(0 if off_value is None else as_tensor(off_value)._value, dtype)
    axis = -1 if axis is None else int(axis)
    if not -1 <= axis <= idx.ndim:
        raise ValueError(f"one_hot: axis must be -1 or in [0, {idx.ndim}], got {axis}")
    hot = idx[..., None] == np.arange(depth)
    if axis != -1:
        hot = np.moveaxis(hot, -1, axis)
    return Tensor(np.where(hot, on, off).astype(dtype)[()])
