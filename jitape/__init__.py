"""jitape: reverse-mode autodiff with TensorFlow's GradientTape model and a Numba-compiled core.

>>> import jitape as jt
>>> x = jt.constant(3.0)
>>> with jt.GradientTape() as g:
...     g.watch(x)
...     y = x * x
>>> g.gradient(y, x)
jitape.Tensor(6.0, shape=(), dtype=float32)
"""
from importlib.metadata import PackageNotFoundError, version as _version

from . import autodiff, config, dtypes, layers, optimizers, random
from .control_flow import cond, scan, while_loop
from .creation import eye, fill, linspace, ones, ones_like, range, zeros, zeros_like
from .namespaces import linalg, math, nn
from .ops import (abs, add, broadcast_to, cast, clip_by_norm, clip_by_value, concat, cos, divide, einsum,
                  equal, exp, expand_dims, gather, greater, greater_equal, identity, less, less_equal, log,
                  log1p, matmul, maximum, minimum, multiply, negative, norm, not_equal, pad, pow, reduce_logsumexp,
                  reduce_max, reduce_mean, reduce_min, reduce_prod, reduce_sum, reduce_variance, reshape, round,
                  sigmoid, sign, sin, slice, softplus, sqrt, square, squeeze, stack, stop_gradient, subtract,
                  tan, tanh, tensordot, tile, transpose, unstack, where)
from .ops import (acos, acosh, argmax, argmin, argsort, asin, asinh, atan, atan2, atanh, boolean_mask, cosh,
                  cumprod, cumsum, digamma, erf, erfc, expm1, gather_nd, lgamma, log2, log10, one_hot, reduce_all,
                  reduce_any, reduce_std, repeat, roll, sinh, sort, tensor_scatter_nd_add, tensor_scatter_nd_update,
                  top_k)
from .dtypes import bool, float32, float64, int32, int64
from .replay import Function, function
from .functional import grad, hessian, hessian_vector_product, jacobian, value_and_grad
from .module import Module
from .program import Program
from .tape import GradientTape, UnconnectedGradients
from .tensor import Tensor, TensorShape, Variable, constant, convert_to_tensor, floatx, set_floatx

try:
    __version__ = _version("jitape")
except PackageNotFoundError:
    __version__ = "0.0.0+unknown"


def __getattr__(name):
    # jt.save, jt.load and jt.ProgramFileError import their module on first use: zipfile, hashlib and json
    # are not worth a new user's first run
    if name in ("save", "load", "ProgramFileError"):
        from . import saving
        return getattr(saving, name)
    raise AttributeError(f"module 'jitape' has no attribute {name!r}")
