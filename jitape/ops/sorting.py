"""Ordering ops: argmax, argmin and argsort (integer results, not differentiable); sort and top_k, whose
values are a gather at the positions numpy's stable argsort picks (differentiable to any order)."""
import collections

import numpy as np

from ..tensor import Tensor
from .core import as_tensor, composite, non_differentiable, normalize_axis, reads_values
from .indexing import take_along_axis

TopKV2 = collections.namedtuple("TopKV2", ["values", "indices"])

_DIRECTIONS = ("ASCENDING", "DESCENDING")


def _index_dtype(output_type, what):
    dtype = np.dtype(output_type)
    if dtype not in (np.dtype(np.int32), np.dtype(np.int64)):
        raise TypeError(f"{what}: output_type must be int32 or int64, got {dtype}")
    return dtype


def _arg_extremum(fn, input, axis, output_type, what):
    x = as_tensor(input)
    if x.ndim == 0:
        raise ValueError(f"{what}: input must have rank >= 1, got a scalar")
    axis = normalize_axis(0 if axis is None else int(axis), x.ndim, what)
    if x.shape[axis] == 0:
        raise ValueError(f"{what}: axis {axis} of shape {x.shape} is empty")
    return Tensor(fn(x._value, axis=axis).astype(_index_dtype(output_type, what))[()])


@non_differentiable
def argmax(input, axis=None, output_type=np.int64, name=None):
    """Index of the largest value along `axis` (0 when None, as TensorFlow); the first one on ties.

    >>> import jitape as jt
    >>> jt.argmax(jt.constant([[1.0, 5.0], [7.0, 2.0]]), axis=1).numpy()
    array([1, 0])
    """
    return _arg_extremum(np.argmax, input, axis, output_type, "argmax")


@non_differentiable
def argmin(input, axis=None, output_type=np.int64, name=None):
    """Index of the smallest value along `axis` (0 when None, as TensorFlow); the first one on ties."""
    return _arg_extremum(np.argmin, input, axis, output_type, "argmin")


@reads_values
def _order(x, axis, direction, what):
    """Stable sorting positions of x along axis; descending keeps equal values in their original order."""
    if direction not in _DIRECTIONS:
        raise ValueError(f"{what}: direction must be 'ASCENDING' or 'DESCENDING', got {direction!r}")
    v = x._value
    if direction == "DESCENDING":
        v = -(v.astype(np.int64) if v.dtype.kind in "ub" else v)
    return np.argsort(v, axis=axis, kind="stable")


def _sort_axis(x, axis, what):
    if x.ndim == 0:
        raise ValueError(f"{what}: values must have rank >= 1, got a scalar")
    return normalize_axis(int(axis), x.ndim, what)


@non_differentiable
def argsort(values, axis=-1, direction="ASCENDING", stable=False, name=None):
    """Positions (int32) that sort `values` along `axis`; always stable here, whatever `stable` says.

    >>> import jitape as jt
    >>> jt.argsort(jt.constant([3.0, 1.0, 2.0])).numpy()
    array([1, 2, 0], dtype=int32)
    """
    x = as_tensor(values)
    axis = _sort_axis(x, axis, "argsort")
    return Tensor(_order(x, axis, direction, "argsort").astype(np.int32))


@composite
def sort(values, axis=-1, direction="ASCENDING", name=None):
    """`values` sorted along `axis`; the gradient flows back to each value's original position.

    >>> import jitape as jt
    >>> jt.sort(jt.constant([3.0, 1.0, 2.0]), direction="DESCENDING").numpy()
    array([3., 2., 1.], dtype=float32)
    """
    x = as_tensor(values)
    axis = _sort_axis(x, axis, "sort")
    return take_along_axis(x, _order(x, axis, direction, "sort"), axis)


@composite
def top_k(input, k=1, sorted=True, name=None):
    """The k largest entries along the last axis and their int32 positions, as (values, indices).

    Ties go to the lower index, as TensorFlow; the result is sorted (descending) even when sorted=False.

    >>> import jitape as jt
    >>> values, indices = jt.math.top_k(jt.constant([1.0, 4.0, 3.0]), k=2)
    >>> values.numpy(), indices.numpy()
    (array([4., 3.], dtype=float32), array([1, 2], dtype=int32))
    """
    x = as_tensor(input)
    if x.ndim == 0:
        raise ValueError("top_k: input must have rank >= 1, got a scalar")
    k = int(k)
    if not 0 <= k <= x.shape[-1]:
        raise ValueError(f"top_k: k must be in [0, {x.shape[-1]}] for input shape {x.shape}, got {k}")
    positions = _order(x, x.ndim - 1, "DESCENDING", "top_k")[..., :k]
    return TopKV2(take_along_axis(x, positions, x.ndim - 1), Tensor(positions.astype(np.int32)))
