"""Reductions: reduce_sum/max/min/prod/logsumexp as one [outer, n, inner] instruction each; mean on top;
the running sum cumsum (one linear instruction) and cumprod.

Axes that are not adjacent are first made adjacent by one transpose, so any
axis set is a single reduce instruction.
"""
import math

import numpy as np

from jitape_kernels import opcodes as oc
from jitape_kernels.cpu.reduction import SHORT_ROWS, short_row_sums

from ..tensor import Tensor
from . import elementwise as _ew
from . import shape as _shape
from .core import (Primitive, as_tensor, composite, constant_value, float_tensor, non_differentiable,
                   normalize_axis, record)


def _reduce_np(ufunc):
    # ufunc.reduce, not np.sum & co.: the same arithmetic without their Python dispatch (~1 us a call)
    def forward(x, outer, n, inner, out_shape):
        if outer == 1 and inner == 1:
            return np.asarray(ufunc.reduce(x, axis=None)).reshape(out_shape)[()]
        return ufunc.reduce(x.reshape(outer, n, inner), axis=1).reshape(out_shape)[()]
    return forward


def _sum_np(x, outer, n, inner, out_shape):
    if inner == 1 and 1 < n <= SHORT_ROWS and outer * n >= _ew.STRIDED_FROM and x.dtype.kind == "f":
        # many short rows: one compiled loop in numpy's order (short_row_sums), not numpy's call per row
        out = np.empty(outer, x.dtype)
        short_row_sums(np.ascontiguousarray(x.reshape(outer, n)), out)     # one compiled signature
        return out.reshape(out_shape)
    return _add_reduce(x, outer, n, inner, out_shape)


_add_reduce = _reduce_np(np.add)


def _reduce_rule(shapes, params):
    outer, n, inner, out_shape = params
    if math.prod(shapes[0]) != outer * n * inner:
        raise ValueError(f"reduce: input shape {shapes[0]} does not match {(outer, n, inner)}")
    return out_shape


def _spread(g, outer, n, inner):
    """g of shape (outer, inner) broadcast over the reduced middle axis: (outer, n, inner)."""
    return _shape.broadcast_to(_shape.reshape(g, (outer, 1, inner)), (outer, n, inner))


def _sum_vjp(g, out, ins, p, w):
    outer, n, inner, _ = p
    return (_shape.reshape(_spread(g, outer, n, inner), ins[0].shape),)


def _extremum_vjp(g, out, ins, p, w):
    # TensorFlow splits the gradient evenly between tied extrema; the split is locally constant
    outer, n, inner, _ = p
    hit = _ew.cast(_ew.equal(_shape.reshape(ins[0], (outer, n, inner)), _shape.reshape(out, (outer, 1, inner))),
                   g.dtype)         # recorded comparisons: a replayed derivative recomputes the ties
    # each reduced entry's share divided once, then masked, as the compiled reverse does: the same bits, and one
    # division per reduced entry rather than per input entry
    share = _ew.divide(_shape.reshape(g, (outer, 1, inner)), _ew.maximum(reduce_sum(hit, 1, keepdims=True), 1.0))
    return (_shape.reshape(_shape.broadcast_to(share, (outer, n, inner)) * hit, ins[0].shape),)


def _prod_vjp(g, out, ins, p, w):
    # d prod / d x_a = product of the other entries: a masked product, exact when entries are zero
    outer, n, inner, _ = p
    rows = _shape.broadcast_to(_shape.reshape(ins[0], (outer, 1, n, inner)), (outer, n, n, inner))
    others = _ew.where(np.eye(n, dtype=bool)[None, :, :, None], 1.0, rows)
    excluded = reduce_prod(others, axis=2)
    return (_shape.reshape(_spread(g, outer, n, inner) * excluded, ins[0].shape),)


def _logsumexp_np(x, outer, n, inner, out_shape):
    """log(sum(exp(x - s))) + s along the middle axis, s the largest entry where finite, else 0 (an inf or NaN
    entry, or an empty axis's log(0) = -inf, then comes out unshifted, as numpy's)."""
    if n == 0:
        return np.full(out_shape, -np.inf, x.dtype)[()]
    if outer == 1 and inner == 1:       # every entry: the same steps on scalars (a third of a small call's cost)
        flat = x.reshape(-1)
        peak = np.maximum.reduce(flat)
        shift = peak if math.isfinite(peak) else x.dtype.type(0)
        exps = flat - shift
        np.exp(exps, out=exps)
        return (np.log(np.add.reduce(exps)) + shift).reshape(out_shape)[()]
    v = x.reshape(outer, n, inner)
    peak = np.maximum.reduce(v, axis=1, keepdims=True)
    shift = np.where(np.isfinite(peak), peak, x.dtype.type(0))
    exps = v - shift
    np.exp(exps, out=exps)      # in place: a second large array's fresh pages cost more than the exp (5x on 640,000)
    total = np.add.reduce(exps, axis=1)
    return (np.log(total) + shift[:, 0]).reshape(out_shape)[()]


def _logsumexp_vjp(g, out, ins, p, w):
    # the softmax exp(x - out), recorded from the output: a derivative of this one sees out's dependence on x
    outer, n, inner, _ = p
    softmax = _ew.exp(_shape.reshape(ins[0], (outer, n, inner)) - _shape.reshape(out, (outer, 1, inner)))
    return (_shape.reshape(_spread(g, outer, n, inner) * softmax, ins[0].shape),)


_sum = Primitive("reduce_sum", oc.SUM, _sum_np, _reduce_rule, _sum_vjp)
_max = Primitive("reduce_max", oc.MAX, _reduce_np(np.maximum), _reduce_rule, _extremum_vjp)
_min = Primitive("reduce_min", oc.MIN, _reduce_np(np.minimum), _reduce_rule, _extremum_vjp)
_prod = Primitive("reduce_prod", oc.PROD, _reduce_np(np.multiply), _reduce_rule, _prod_vjp)
_logsumexp = Primitive("reduce_logsumexp", oc.LOGSUMEXP, _logsumexp_np, _reduce_rule, _logsumexp_vjp)


def reduction_axes(axis, ndim, what):
    """Sorted, normalised axes (all of them for None)."""
    if axis is None:
        return tuple(range(ndim))
    if isinstance(axis, (int, np.integer)):
        axes = (axis,)
    elif isinstance(axis, tuple) and all(isinstance(a, (int, np.integer)) for a in axis):
        axes = axis        # the common case, without a round trip through numpy
    else:
        axes = constant_value(axis, "a reduction axis").reshape(-1).tolist()
    return tuple(sorted({normalize_axis(int(a), ndim, what) for a in axes}))


def _reduce(prim, input_tensor, axis, keepdims, what):
    x = as_tensor(input_tensor)
    axes = reduction_axes(axis, x.ndim, what)
    kept_shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
    out_shape = kept_shape if keepdims else tuple(d for i, d in enumerate(x.shape) if i not in axes)
    if not axes:
        return x
    if (prim is _max or prim is _min) and any(x.shape[a] == 0 for a in axes):
        raise ValueError(f"{what}: cannot reduce an empty axis (shape {x.shape}, axis {axes})")
    if axes != tuple(range(axes[0], axes[-1] + 1)):
        rest = tuple(i for i in range(x.ndim) if i not in axes)
        x = _shape.transpose(x, rest + axes)
        axes = tuple(range(len(rest), x.ndim))
    outer = math.prod(x.shape[:axes[0]])
    n = math.prod(x.shape[axes[0]:axes[-1] + 1])
    inner = math.prod(x.shape[axes[-1] + 1:])
    params = (outer, n, inner, out_shape)
    value = prim.forward(x._value, *params)
    if x.dtype.kind != "f":
        return Tensor(value)
    return record(prim, x, None, value, params, (outer, n, inner))


def reduce_sum(input_tensor, axis=None, keepdims=False, name=None):
    """Sum over `axis` (all axes when None)."""
    return _reduce(_sum, input_tensor, axis, keepdims, "reduce_sum")


def reduce_max(input_tensor, axis=None, keepdims=False, name=None):
    """Maximum over `axis`; the gradient is shared evenly between ties, as in TensorFlow."""
    return _reduce(_max, input_tensor, axis, keepdims, "reduce_max")


def reduce_min(input_tensor, axis=None, keepdims=False, name=None):
    """Minimum over `axis`; the gradient is shared evenly between ties, as in TensorFlow."""
    return _reduce(_min, input_tensor, axis, keepdims, "reduce_min")


def reduce_prod(input_tensor, axis=None, keepdims=False, name=None):
    """Product over `axis` (exact gradients with zero entries)."""
    return _reduce(_prod, input_tensor, axis, keepdims, "reduce_prod")


@composite
def reduce_mean(input_tensor, axis=None, keepdims=False, name=None):
    """Mean over `axis` (all axes when None)."""
    x = float_tensor(input_tensor, "reduce_mean")
    axes = reduction_axes(axis, x.ndim, "reduce_mean")
    count = math.prod(x.shape[a] for a in axes)
    return _ew.divide(reduce_sum(x, axes, keepdims), x.dtype.type(count))


def reduce_logsumexp(input_tensor, axis=None, keepdims=False, name=None):
    """log(sum(exp(x))) over `axis`, shifted by the largest entry where it is finite: one LOGSUMEXP instruction,
    so a replay shifts by its own maximum."""
    return _reduce(_logsumexp, float_tensor(input_tensor, "reduce_logsumexp"), axis, keepdims, "reduce_logsumexp")


@composite
def reduce_variance(input_tensor, axis=None, keepdims=False, name=None):
    """Population variance over `axis`."""
    x = float_tensor(input_tensor, "reduce_variance")
    mean = reduce_mean(x, axis, keepdims=True)
    return reduce_mean(_ew.square(x - mean), axis, keepdims)


# -- running sums and products ---------------------------------------------------------------
def _cumulative_axis(x, axis, what):
    """(outer, n, inner) of the [outer, n, inner] view of x whose middle axis is `axis`."""
    if x.ndim == 0:
        raise ValueError(f"{what}: the input must have rank >= 1, got a scalar")
    if isinstance(axis, Tensor):
        axis = axis._value
    if np.ndim(axis) or not isinstance(np.asarray(axis).item(), int):
        raise TypeError(f"{what}: axis must be one integer, got {axis!r}")
    axis = normalize_axis(int(axis), x.ndim, what)
    return math.prod(x.shape[:axis]), x.shape[axis], math.prod(x.shape[axis + 1:])


def _running_np(ufunc, x, outer, n, inner, exclusive, reverse):
    """ufunc's running reduction along the middle axis of x viewed as [outer, n, inner], in x's dtype."""
    v = x.reshape(outer, n, inner)
    if reverse:
        v = v[:, ::-1]
    out = ufunc.accumulate(v, axis=1, dtype=x.dtype)
    if exclusive:
        first = np.full((outer, min(n, 1), inner), ufunc.identity, x.dtype)
        out = np.concatenate([first, out[:, :-1]], axis=1)
    if reverse:
        out = out[:, ::-1]
    return np.ascontiguousarray(out).reshape(x.shape)[()]


def _cumsum_np(x, outer, n, inner, exclusive, reverse):
    return _running_np(np.add, x, outer, n, inner, exclusive, reverse)


def _cumsum_rule(shapes, params):
    outer, n, inner = params[:3]
    if math.prod(shapes[0]) != outer * n * inner:
        raise ValueError(f"cumsum: input shape {shapes[0]} does not match {(outer, n, inner)}")
    return shapes[0]


def _emit_cumsum(x, outer, n, inner, exclusive, reverse):
    params = (outer, n, inner, exclusive, reverse)
    return record(_cumsum, x, None, _cumsum_np(x._value, *params), params,
                  (outer, n, inner, int(exclusive), int(reverse)))


# the transposed running sum runs the other way with the same exclusivity
_cumsum = Primitive("cumsum", oc.CUMSUM, _cumsum_np, _cumsum_rule,
                    lambda g, out, ins, p, w: (_emit_cumsum(g, p[0], p[1], p[2], p[3], not p[4]),))


def cumsum(x, axis=0, exclusive=False, reverse=False, name=None):
    """Running sums along `axis`, from the end when `reverse`, each entry excluded from its own sum when
    `exclusive` (TensorFlow's tf.math.cumsum). One linear instruction.

    >>> import jitape as jt
    >>> jt.cumsum(jt.constant([1.0, 2.0, 3.0]), exclusive=True).numpy()
    array([0., 1., 3.], dtype=float32)
    """
    x = as_tensor(x)
    outer, n, inner = _cumulative_axis(x, axis, "cumsum")
    if x.dtype.kind != "f":
        return Tensor(_cumsum_np(x._value, outer, n, inner, bool(exclusive), bool(reverse)))
    return _emit_cumsum(x, outer, n, inner, bool(exclusive), bool(reverse))


@composite
def cumprod(x, axis=0, exclusive=False, reverse=False, name=None):
    """Running products along `axis` (TensorFlow's tf.math.cumprod), exact with zero entries: entry j is
    reduce_prod of the inputs it covers, masked over an [n, n] broadcast (O(n^2) along the axis).

    >>> import jitape as jt
    >>> jt.cumprod(jt.constant([1.0, 2.0, 3.0]), reverse=True).numpy()
    array([6., 6., 3.], dtype=float32)
    """
    x = as_tensor(x)
    outer, n, inner = _cumulative_axis(x, axis, "cumprod")
    if x.dtype.kind != "f":
        return Tensor(_running_np(np.multiply, x._value, outer, n, inner, bool(exclusive), bool(reverse)))
    j, i = np.arange(n)[:, None], np.arange(n)[None, :]       # output entry j covers inputs i
    if reverse:
        covers = i > j if exclusive else i >= j
    else:
        covers = i < j if exclusive else i <= j
    rows = _shape.broadcast_to(_shape.reshape(x, (outer, 1, n, inner)), (outer, n, n, inner))
    covered = _ew.where(covers[None, :, :, None], rows, 1.0)
    return _shape.reshape(reduce_prod(covered, axis=2), x.shape)
@composite
def reduce_std(input_tensor, axis=None, keepdims=False, name=None):
    """Population standard deviation over `axis`: sqrt(reduce_variance) (its gradient is infinite where
    the variance is 0, as in TensorFlow).

    >>> import jitape as jt
    >>> float(jt.math.reduce_std(jt.constant([1.0, 3.0])))
    1.0
    """
    return _ew.sqrt(reduce_variance(input_tensor, axis, keepdims))


def _logical_reduce(fn, input_tensor, axis, keepdims, what):
    x = as_tensor(input_tensor)
    axes = reduction_axes(axis, x.ndim, what)
    return Tensor(np.asarray(fn(x._value != 0, axis=axes, keepdims=keepdims))[()])


@non_differentiable
def reduce_any(input_tensor, axis=None, keepdims=False, name=None):
    """Logical or over `axis` (bool result; nonzero numbers count as True)."""
    return _logical_reduce(np.any, input_tensor, axis, keepdims, "reduce_any")


@non_differentiable
def reduce_all(input_tensor, axis=None, keepdims=False, name=None):
    """Logical and over `axis` (bool result; nonzero numbers count as True).

    >>> import jitape as jt
    >>> jt.reduce_all(jt.constant([[True, False], [True, True]]), axis=1).numpy()
    array([False,  True])
    """
    return _logical_reduce(np.all, input_tensor, axis, keepdims, "reduce_all")
