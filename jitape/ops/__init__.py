"""The op library: family modules, the registry (core.PRIMITIVES / COMPOSITES), Tensor operators and
numpy dispatch (ufuncs and array functions on tensors are recorded like the jitape op)."""
import numpy as np

from ..tensor import Tensor
from . import core, elementwise, indexing, linalg, matrix, nn, reduction, shape, sorting
from .core import COMPOSITES, NON_DIFFERENTIABLE, PRIMITIVES
from .elementwise import (abs, add, cast, clip_by_value, cos, divide, elu, equal, exp, greater,
                          greater_equal, identity, less, less_equal, log, log1p, maximum, minimum,
                          multiply, negative, not_equal, pow, relu, round, sigmoid, sign, sin, softplus,
                          sqrt, square, subtract, tan, tanh, where)
from .linalg import clip_by_norm, einsum, inv, matmul, norm, solve, tensordot
from .nn import log_softmax, sigmoid_cross_entropy_with_logits, softmax, softmax_cross_entropy_with_logits
from .reduction import (reduce_logsumexp, reduce_max, reduce_mean, reduce_min, reduce_prod, reduce_sum,
                        reduce_variance)
# TensorFlow names written as composites (or non-differentiable ops)
from .indexing import boolean_mask, gather_nd, one_hot, repeat, roll, tensor_scatter_nd_add, tensor_scatter_nd_update
from .matrix import band_part, cholesky, cross, det, diag_part, matvec, slogdet, trace, triangular_solve
from .nn import l2_loss, leaky_relu, log_sigmoid, relu6, selu, silu, sparse_softmax_cross_entropy_with_logits, swish
from .reduction import reduce_all, reduce_any, reduce_std
from .sorting import argmax, argmin, argsort, sort, top_k
from .shape import (broadcast_to, concat, expand_dims, gather, getitem, pad, reshape, slice, squeeze, stack,
                    strided_slice, tile, transpose, unstack)


def stop_gradient(input, name=None):
    """The value of `input`, never recorded: no gradient flows through it."""
    t = core.as_tensor(input)
    return Tensor(t._value)


def _reversed(fn):
    return lambda self, other: fn(other, self)


def _install_operators():
    ops = {
        "__add__": add, "__radd__": _reversed(add), "__sub__": subtract, "__rsub__": _reversed(subtract),
        "__mul__": multiply, "__rmul__": _reversed(multiply), "__truediv__": divide,
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
}


def _array_ufunc(self, ufunc, method, *inputs, **kwargs):
    fn = _UFUNCS.get(ufunc)
    if method != "__call__" or fn is None or kwargs.get("out") is not None:
        arrays = [np.asarray(x) if isinstance(x, Tensor) else x for x in inputs]
        return getattr(ufunc, method)(*arrays, **kwargs)
    return fn(*inputs)


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
}


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


def _array_function(self, func, types, args, kwargs):
    fn = _FUNCTIONS.get(func)
    if fn is None:
        def unwrap(x):
            if isinstance(x, Tensor):
                return np.asarray(x)
            if isinstance(x, (list, tuple)):
                return type(x)(unwrap(v) for v in x)
            return x
        return func(*unwrap(args), **{k: unwrap(v) for k, v in kwargs.items()})
    return fn(*args, **kwargs)


_install_operators()
