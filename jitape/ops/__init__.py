"""The op library: family modules, the registry (core.PRIMITIVES / COMPOSITES), Tensor operators and
numpy dispatch (ufuncs and array functions on tensors are recorded like the jitape op)."""
import sys

import numpy as np

from ..tensor import Tensor
from . import core, elementwise, indexing, linalg, matrix, nn, reduction, shape, sorting
from .core import COMPOSITES, NON_DIFFERENTIABLE, PRIMITIVES
from .elementwise import (abs, add, cast, clip_by_value, cos, divide, elu, equal, exp, greater,
                          greater_equal, identity, less, less_equal, log, log1p, maximum, minimum,
                          multiply, negative, not_equal, pow, relu, round, sigmoid, sign, sin, softplus,
                          sqrt, square, stop_gradient, subtract, tan, tanh, where)
from .elementwise import (acos, acosh, asin, asinh, atan, atan2, atanh, cosh, digamma, erf, erfc, expm1, lgamma,
                          log2, log10, polygamma, sinh)
from .linalg import clip_by_norm, einsum, inv, matmul, norm, solve, tensordot
from .nn import gelu, log_softmax, sigmoid_cross_entropy_with_logits, softmax, softmax_cross_entropy_with_logits
from .reduction import (reduce_logsumexp, reduce_max, reduce_mean, reduce_min, reduce_prod, reduce_sum,
                        reduce_variance)
from .reduction import cumprod, cumsum
# TensorFlow names written as composites (or non-differentiable ops)
from .indexing import boolean_mask, gather_nd, one_hot, repeat, roll, tensor_scatter_nd_add, tensor_scatter_nd_update
from .matrix import band_part, cholesky, cross, det, diag_part, matvec, slogdet, trace, triangular_solve
from .nn import l2_loss, leaky_relu, log_sigmoid, relu6, selu, silu, sparse_softmax_cross_entropy_with_logits, swish
from .reduction import reduce_all, reduce_any, reduce_std
from .sorting import argmax, argmin, argsort, sort, top_k
from .shape import (broadcast_to, concat, expand_dims, gather, getitem, pad, reshape, slice, squeeze, stack,
                    strided_slice, tile, transpose, unstack)


def _reversed(fn):
    return lambda self, other: fn(other, self)


def _install_operators():
    ops = {
        "__add__": add, "__radd__": _reversed(add), "__sub__": subtract, "__rsub__": _reversed(subtract),
        "__mul__": multiply, "__rmul__": elementwise.reversed_multiply, "__truediv__": divide,
        "__rtruediv__": _reversed(divide), "__pow__": pow, "__rpow__": _reversed(pow),
        "__matmul__": matmul, "__rmatmul__": _reversed(matmul), "__neg__": negative,
        "__pos__": lambda self: self, "__abs__": abs, "__getitem__": getitem,
        "__lt__": less, "__le__": less_equal, "__gt__": greater, "__ge__": greater_equal,
    }
    for name, fn in ops.items():
        setattr(Tensor, name, fn)
    Tensor.__array_ufunc__ = _array_ufunc
    Tensor.__array_function__ = _array_function
    Tensor.T = property(lambda self: transpose(self))
    Tensor.reshape = lambda self, *shape: reshape(self, shape[0] if len(shape) == 1 else shape)


# numpy ufuncs on tensors are recorded like the jitape op (np.sin(t) is jt.sin(t))
_UFUNCS = {
    np.add: add, np.subtract: subtract, np.multiply: multiply, np.true_divide: divide, np.power: pow,
    np.negative: negative, np.square: square, np.sqrt: sqrt, np.exp: exp, np.log: log, np.log1p: log1p,
    np.sin: sin, np.cos: cos, np.tan: tan, np.tanh: tanh, np.abs: abs, np.absolute: abs, np.sign: sign,
    np.maximum: maximum, np.minimum: minimum, np.matmul: matmul,
    np.less: less, np.less_equal: less_equal, np.greater: greater, np.greater_equal: greater_equal,
    np.equal: equal, np.not_equal: not_equal,
    np.sinh: sinh, np.cosh: cosh, np.arcsinh: asinh, np.arccosh: acosh, np.arctanh: atanh, np.arcsin: asin,
    np.arccos: acos, np.arctan: atan, np.expm1: expm1, np.log10: log10, np.log2: log2, np.arctan2: atan2,
}
# scipy.special's ufuncs, by attribute name: looked up only when scipy.special is loaded (importing it here
# would cost more than the rest of `import jitape`)
_SCIPY_UFUNCS = {"erf": erf, "erfc": erfc, "gammaln": lgamma, "digamma": digamma}


def _ufunc_op(ufunc):
    fn = _UFUNCS.get(ufunc)
    special = sys.modules.get("scipy.special")
    if fn is None and special is not None:
        fn = next((op for name, op in _SCIPY_UFUNCS.items() if getattr(special, name, None) is ufunc), None)
    return fn


# ufuncs whose results are locally constant (no gradient, as in TensorFlow): computed on the values
_CONSTANT_UFUNCS = {
    np.floor, np.ceil, np.rint, np.trunc, np.isnan, np.isinf, np.isfinite, np.signbit, np.logical_and,
    np.logical_or, np.logical_xor, np.logical_not, np.bitwise_and, np.bitwise_or, np.bitwise_xor, np.invert,
    np.left_shift, np.right_shift, np.floor_divide, np.heaviside, np.isnat, np.spacing,
}
# differentiable ufuncs without a jitape mapping: the error names what to write instead
_UFUNC_HINTS = {
    np.cbrt: "jt.sign(x) * jt.abs(x) ** (1 / 3)", np.exp2: "jt.pow(2.0, x)", np.reciprocal: "1 / x",
    np.hypot: "jt.sqrt(x * x + y * y)", np.logaddexp: "jt.reduce_logsumexp(jt.stack([x, y]), axis=0)",
    np.fmax: "jt.maximum", np.fmin: "jt.minimum",
}


_UFUNC_METHODS = {
    (np.add, "reduce"): lambda a, axis=0, dtype=None, keepdims=False, **_: reduce_sum(a, axis, keepdims),
    (np.multiply, "reduce"): lambda a, axis=0, dtype=None, keepdims=False, **_: reduce_prod(a, axis, keepdims),
    (np.maximum, "reduce"): lambda a, axis=0, dtype=None, keepdims=False, **_: reduce_max(a, axis, keepdims),
    (np.minimum, "reduce"): lambda a, axis=0, dtype=None, keepdims=False, **_: reduce_min(a, axis, keepdims),
}


def _untracked(name, inputs, hint=None):
    """The TypeError for numpy code on float tensors that no tape could record."""
    fix = f"use {hint}" if hint else "use the jitape op of the same name (jt.math, jt.linalg, jt.nn)"
    return TypeError(f"numpy.{name} on a jitape tensor is not recorded by GradientTape, so its gradient would be "
                     f"silently lost; {fix}, or call it on np.asarray(tensor) to compute without gradients")


def _floats(args):
    """Whether a float Tensor is among args (one level of lists/tuples deep, as numpy's sequences)."""
    for x in args:
        if isinstance(x, Tensor) and x._value.dtype.kind == "f":
            return True
        if isinstance(x, (list, tuple)) and _floats(x):
            return True
    return False


def _values(x):
    if isinstance(x, Tensor):
        return np.asarray(x)
    if isinstance(x, (list, tuple)):
        return type(x)(_values(v) for v in x)
    return x


def _unobserved(x):
    """_values for functions that read only shapes and dtypes: the arrays without a guard on their values."""
    if isinstance(x, Tensor):
        return x._value
    if isinstance(x, (list, tuple)):
        return type(x)(_unobserved(v) for v in x)
    return x


def _as_result(value):
    """A numpy function's result: arrays become (unrecorded) tensors; scalars, tuples and shapes stay as they are."""
    return Tensor(value) if isinstance(value, np.ndarray) else value


def _array_ufunc(self, ufunc, method, *inputs, **kwargs):
    fn = _ufunc_op(ufunc) if method == "__call__" else _UFUNC_METHODS.get((ufunc, method))
    if fn is not None and "out" not in kwargs and "where" not in kwargs:
        return fn(*inputs) if method == "__call__" else fn(*inputs, **kwargs)
    if any(isinstance(o, Tensor) for o in kwargs.get("out") or ()):
        raise TypeError(f"numpy.{ufunc.__name__}: jitape tensors are immutable and cannot be an `out=` argument")
    if ufunc in _CONSTANT_UFUNCS or not _floats(inputs):
        result = getattr(ufunc, method)(*_values(inputs), **kwargs)
        return Tensor(np.asarray(result)[()]) if isinstance(result, (np.ndarray, np.generic)) else result
    name = ufunc.__name__ if method == "__call__" else f"{ufunc.__name__}.{method}"
    raise _untracked(name, inputs, _UFUNC_HINTS.get(ufunc))


def _axis_kw(fn):
    return lambda a, axis=None, keepdims=False, **_: fn(a, axis, keepdims)


_FUNCTIONS = {
    np.sum: _axis_kw(reduce_sum), np.mean: _axis_kw(reduce_mean), np.max: _axis_kw(reduce_max),
    np.amax: _axis_kw(reduce_max), np.min: _axis_kw(reduce_min), np.amin: _axis_kw(reduce_min),
    np.prod: _axis_kw(reduce_prod), np.var: _axis_kw(reduce_variance),
    np.dot: lambda a, b: tensordot(a, b, ([-1], [max(np.ndim(b) - 2, 0)])) if np.ndim(a) and np.ndim(b) else a * b,
    np.matmul: matmul, np.reshape: lambda a, shape=None, **kw: reshape(a, shape if shape is not None else kw["newshape"]),
    np.transpose: lambda a, axes=None: transpose(a, axes), np.squeeze: lambda a, axis=None: squeeze(a, axis),
    np.expand_dims: lambda a, axis: expand_dims(a, axis),
    np.concatenate: lambda arrays, axis=0, **_: concat(arrays, axis),
    np.stack: lambda arrays, axis=0, **_: stack(arrays, axis),
    np.where: lambda c, x=None, y=None: where(c, x, y), np.clip: lambda a, lo, hi, **_: clip_by_value(a, lo, hi),
    np.einsum: einsum, np.tensordot: lambda a, b, axes=2: tensordot(a, b, axes),
    np.broadcast_to: lambda a, shape, **_: broadcast_to(a, shape), np.tile: lambda a, reps: tile(a, reps),
    np.linalg.norm: lambda x, ord=None, axis=None, keepdims=False: norm(
        x, "euclidean" if ord is None else ord, axis, keepdims),
    np.linalg.solve: solve, np.linalg.inv: inv,
    np.swapaxes: lambda a, axis1, axis2: transpose(a, _swapped(np.ndim(a), axis1, axis2)),
    np.copy: lambda a, **_: identity(a), np.ravel: lambda a, order="C": reshape(a, (-1,)),
    np.cumsum: lambda a, axis=None, dtype=None, out=None: cumsum(reshape(a, (-1,)) if axis is None else a, axis or 0),
    np.cumprod: lambda a, axis=None, dtype=None, out=None: cumprod(reshape(a, (-1,)) if axis is None else a,
                                                                    axis or 0),
}


# numpy functions whose results do not depend differentiably on the values (shapes, tests, indices, masks,
# fresh arrays of a shape): computed on the values
_VALUE_FUNCTIONS = {
    np.shape, np.ndim, np.size, np.result_type, np.allclose, np.isclose, np.array_equal, np.array_equiv,
    np.count_nonzero, np.nonzero, np.flatnonzero, np.argwhere, np.any, np.all, np.iscomplexobj,
    np.isrealobj, np.isreal, np.iscomplex, np.searchsorted, np.may_share_memory, np.shares_memory,
    np.zeros_like, np.ones_like, np.empty_like, np.full_like, np.array_repr, np.array_str, np.array2string,
    np.round, np.around, np.fix, np.argmax, np.argmin, np.argsort, np.min_scalar_type, np.can_cast,
}
# those of them that read only shapes and dtypes: in a jt.function trace they are no guard on values
_SHAPE_FUNCTIONS = {np.shape, np.ndim, np.size, np.result_type, np.zeros_like, np.ones_like, np.empty_like,
                    np.iscomplexobj, np.isrealobj, np.min_scalar_type}


def _flat_axis(fn):
    """numpy's axis=None (the flattened array) for ops whose TensorFlow form takes an axis."""
    return lambda a, axis=None, **kw: fn(reshape(a, (-1,)), 0, **kw) if axis is None else fn(a, axis, **kw)


def _trailing(fn, what):
    """numpy's (offset, axis1, axis2) matrix functions as the TensorFlow op over the last two axes."""
    def call(a, offset=0, axis1=0, axis2=1, **_):
        if offset:
            raise ValueError(f"np.{what} on jitape tensors supports offset=0 only, got {offset}")
        a = core.as_tensor(a)
        axis1, axis2 = axis1 % a.ndim, axis2 % a.ndim
        rest = [d for d in range(a.ndim) if d not in (axis1, axis2)]
        return fn(transpose(a, rest + [axis1, axis2]))
    return call


def _no_ddof(fn, what):
    def call(a, axis=None, dtype=None, out=None, ddof=0, keepdims=False, **_):
        if ddof:
            raise ValueError(f"np.{what} on jitape tensors supports ddof=0 only, got {ddof}")
        return fn(a, axis, keepdims)
    return call


_FUNCTIONS.update({
    np.argmax: lambda a, axis=None, **_: _flat_axis(argmax)(a, axis),
    np.argmin: lambda a, axis=None, **_: _flat_axis(argmin)(a, axis),
    np.argsort: lambda a, axis=-1, **_: _flat_axis(lambda x, ax: argsort(x, ax, stable=True))(a, axis),
    np.sort: lambda a, axis=-1, **_: _flat_axis(sort)(a, axis),
    np.roll: lambda a, shift, axis=None: reshape(roll(reshape(a, (-1,)), shift, 0), np.shape(a))
    if axis is None else roll(a, shift, axis),
    np.repeat: lambda a, repeats, axis=None: repeat(a, repeats, axis),
    np.std: _no_ddof(reduce_std, "std"),
    np.any: lambda a, axis=None, out=None, keepdims=False, **_: reduce_any(a, axis, keepdims),
    np.all: lambda a, axis=None, out=None, keepdims=False, **_: reduce_all(a, axis, keepdims),
    np.trace: _trailing(trace, "trace"), np.diagonal: _trailing(diag_part, "diagonal"),
    np.cross: lambda a, b, **kw: cross(a, b) if not kw else _unsupported("cross", kw),
    np.linalg.det: det, np.linalg.slogdet: slogdet, np.linalg.cholesky: cholesky,
})


def _unsupported(what, kwargs):
    raise ValueError(f"np.{what} on jitape tensors supports no keyword arguments, got {sorted(kwargs)}")


def _swapped(ndim, axis1, axis2):
    perm = list(range(ndim))
    perm[axis1], perm[axis2] = perm[axis2], perm[axis1]
    return perm


def _array_function(self, func, types, args, kwargs):
    fn = _FUNCTIONS.get(func)
    if fn is not None:
        return fn(*args, **kwargs)
    if func in _SHAPE_FUNCTIONS:
        return _as_result(func(*_unobserved(args), **{k: _unobserved(v) for k, v in kwargs.items()}))
    if func in _VALUE_FUNCTIONS or not (_floats(args) or _floats(kwargs.values())):
        return _as_result(func(*_values(args), **{k: _values(v) for k, v in kwargs.items()}))
    raise _untracked(func.__name__, args)


_install_operators()
