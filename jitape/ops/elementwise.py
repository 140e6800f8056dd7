"""Elementwise ops: unary math, activations, binary arithmetic with numpy broadcasting, where, clip, cast.

Binary ops on different shapes insert an explicit broadcast_to (whose VJP
sums), so every recorded elementwise instruction has equal-sized operands.
"""
import math
import operator

import numpy as np

from jitape_kernels import opcodes as oc
from jitape_kernels.cpu.elementwise import strided_arithmetic

from ..recycling import LARGE_BYTES, fresh
from ..tensor import _FLOATS, Tensor
from ..tracing import _traces, observe_all
from . import shape as _shape
from .core import (Primitive, as_tensor, broadcast_shapes, composite, constant_value, emit, float_tensor,
                   non_differentiable, promote, reads_values, record)


def _same(shapes, params):
    return shapes[0]


def _mask(condition, like):
    """`condition` (a recorded comparison) as a 0/1 tensor of `like`'s dtype: derivative masks are locally
    constant, and recorded so that a replayed derivative recomputes them."""
    return cast(condition, like.dtype)


# -- unary -----------------------------------------------------------------------------------
def _unary(name, opcode, forward, vjp):
    prim = Primitive(name, opcode, forward, _same, lambda g, out, ins, p, w: (vjp(g, out, ins[0]),))

    into = isinstance(forward, np.ufunc)      # a large result goes into a recycled buffer (recycling.fresh)

    def op(x, name=None):
        x = x if isinstance(x, Tensor) and x._value.dtype.kind == "f" else float_tensor(x, prim.name)
        v = x._value
        if into and v.nbytes >= LARGE_BYTES:
            return record(prim, x, None, forward(v, out=fresh(v.shape, v.dtype)))
        return record(prim, x, None, forward(v))

    op.__name__ = name
    op.__qualname__ = name
    op.__doc__ = f"Elementwise {name} (differentiable to any order)."
    return op


negative = _unary("negative", oc.NEG, np.negative, lambda g, y, x: negative(g))
square = _unary("square", oc.SQUARE, np.square, lambda g, y, x: g * scale(x, 2.0))
sqrt = _unary("sqrt", oc.SQRT, np.sqrt, lambda g, y, x: divide(scale(g, 0.5), y))
exp = _unary("exp", oc.EXP, np.exp, lambda g, y, x: g * y)
log = _unary("log", oc.LOG, np.log, lambda g, y, x: divide(g, x))
log1p = _unary("log1p", oc.LOG1P, np.log1p, lambda g, y, x: divide(g, add(x, 1.0)))
sin = _unary("sin", oc.SIN, np.sin, lambda g, y, x: g * cos(x))
cos = _unary("cos", oc.COS, np.cos, lambda g, y, x: negative(g * sin(x)))
tan = _unary("tan", oc.TAN, np.tan, lambda g, y, x: g * add(square(y), 1.0))
tanh = _unary("tanh", oc.TANH, np.tanh, lambda g, y, x: g * (1.0 - square(y)))
abs = _unary("abs", oc.ABS, np.abs, lambda g, y, x: g * sign(x))
sign = _unary("sign", oc.SIGN, np.sign, lambda g, y, x: g * _mask(np.zeros_like(x._value), x))


def _sigmoid_np(x):
    # exp of -|x| never overflows; both branches are exact in their half-line (Python 1 keeps float32)
    e = np.exp(-np.abs(x))
    d = 1 + e
    return np.where(x >= 0, 1 / d, e / d)[()]


def _softplus_np(x):
    return (np.maximum(x, 0) + np.log1p(np.exp(-np.abs(x))))[()]


sigmoid = _unary("sigmoid", oc.SIGMOID, _sigmoid_np, lambda g, y, x: g * (y * (1.0 - y)))
relu = _unary("relu", oc.RELU, lambda x: np.maximum(x, 0)[()], lambda g, y, x: g * _mask(greater(x, 0.0), x))
softplus = _unary("softplus", oc.SOFTPLUS, _softplus_np, lambda g, y, x: g * sigmoid(x))


# -- hyperbolic, inverse trigonometric, error and gamma functions ----------------------------
def _kept_dtype(name):
    """scipy.special.<name> as a numpy forward in x's dtype (polygamma computes in float64). scipy.special is
    imported on first use: it costs a third of a second, more than the rest of `import jitape`."""
    def forward(x, *params):
        import scipy.special
        return np.asarray(getattr(scipy.special, name)(*params, x), x.dtype)[()]
    return forward


def _one_minus_square(x):
    return (1.0 - x) * (1.0 + x)      # 1 - x^2 without cancellation near |x| = 1


_TWO_OVER_SQRT_PI = 2 / math.sqrt(math.pi)

sinh = _unary("sinh", oc.SINH, np.sinh, lambda g, y, x: g * cosh(x))
cosh = _unary("cosh", oc.COSH, np.cosh, lambda g, y, x: g * sinh(x))
asinh = _unary("asinh", oc.ASINH, np.arcsinh, lambda g, y, x: divide(g, sqrt(add(square(x), 1.0))))
acosh = _unary("acosh", oc.ACOSH, np.arccosh, lambda g, y, x: divide(g, sqrt((x - 1.0) * (x + 1.0))))
atanh = _unary("atanh", oc.ATANH, np.arctanh, lambda g, y, x: divide(g, _one_minus_square(x)))
asin = _unary("asin", oc.ASIN, np.arcsin, lambda g, y, x: divide(g, sqrt(_one_minus_square(x))))
acos = _unary("acos", oc.ACOS, np.arccos, lambda g, y, x: negative(divide(g, sqrt(_one_minus_square(x)))))
atan = _unary("atan", oc.ATAN, np.arctan, lambda g, y, x: divide(g, add(square(x), 1.0)))
expm1 = _unary("expm1", oc.EXPM1, np.expm1, lambda g, y, x: g * exp(x))
erf = _unary("erf", oc.ERF, _kept_dtype("erf"),
             lambda g, y, x: scale(g * exp(negative(square(x))), _TWO_OVER_SQRT_PI))
erfc = _unary("erfc", oc.ERFC, _kept_dtype("erfc"),
              lambda g, y, x: scale(g * exp(negative(square(x))), -_TWO_OVER_SQRT_PI))
lgamma = _unary("lgamma", oc.LGAMMA, _kept_dtype("gammaln"), lambda g, y, x: g * digamma(x))
digamma = _unary("digamma", oc.DIGAMMA, _kept_dtype("digamma"), lambda g, y, x: g * _polygamma(x, 1))

_polygamma_np = _kept_dtype("polygamma")
_polygamma_prim = Primitive("polygamma", oc.POLYGAMMA, _polygamma_np, _same,
                            lambda g, y, ins, n, w: (g * _polygamma(ins[0], n + 1),))


def _polygamma(x, n):
    return record(_polygamma_prim, x, None, _polygamma_np(x._value, n), n, fblock=(float(n),))


def polygamma(a, x, name=None):
    """The a-th derivative of digamma at x, for a Python integer a >= 0 (a = 0 is digamma); differentiable
    in x to any order (the derivative of polygamma(a) is polygamma(a + 1)), never in a.

    >>> import jitape as jt
    >>> print(jt.math.polygamma(1, jt.constant(1.0, "float64")).numpy().round(6))    # pi^2 / 6
    1.644934
    """
    order = constant_value(a, "the order of jt.math.polygamma")
    if order.ndim or not (order.dtype.kind in "iu" or (order.dtype.kind == "f" and float(order).is_integer())):
        raise TypeError(f"polygamma: the order a must be one non-negative integer, got {a!r} "
                        f"(per-entry orders are not supported)")
    n = int(order)
    if n < 0:
        raise ValueError(f"polygamma: the order a must be >= 0, got {n}")
    x = x if isinstance(x, Tensor) and x._value.dtype.kind == "f" else float_tensor(x, "polygamma")
    return digamma(x) if n == 0 else _polygamma(x, n)


@composite
def log10(x, name=None):
    """Base-10 logarithm: log(x) / log(10)."""
    return scale(log(float_tensor(x, "log10")), 1 / math.log(10))


@composite
def log2(x, name=None):
    """Base-2 logarithm: log(x) / log(2)."""
    return scale(log(float_tensor(x, "log2")), 1 / math.log(2))


def _elu_np(x, alpha):
    # alpha has x's dtype and the Python 0 is weakly typed, so float32 stays float32 without a cast
    return np.where(x > 0, x, alpha * np.expm1(np.minimum(x, 0)))[()]


_elu = Primitive("elu", oc.ELU, _elu_np, _same,
                 lambda g, y, ins, alpha, w: (g * where(ins[0] > 0, 1.0, add(y, alpha)),))


def elu(x, alpha=1.0):
    """Exponential linear unit: x if x > 0 else alpha * (exp(x) - 1)."""
    x = float_tensor(x, "elu")
    a = float(x.dtype.type(alpha))
    return record(_elu, x, None, _elu_np(x._value, x.dtype.type(alpha)), a, fblock=(a,))


def _clip_np(x, lo, hi):
    return np.minimum(np.maximum(x, lo), hi)[()]


_clip = Primitive("clip_by_value", oc.CLIP, _clip_np, _same,
                  lambda g, y, ins, p, w: (g * _mask(greater_equal(ins[0], p[0]), ins[0])
                                           * _mask(less_equal(ins[0], p[1]), ins[0]),))


def clip_by_value(t, clip_value_min, clip_value_max):
    """Clip to [min, max]; the gradient passes where min <= t <= max, as in TensorFlow."""
    t = float_tensor(t, "clip_by_value")
    lo, hi = np.asarray(clip_value_min), np.asarray(clip_value_max)
    if lo.ndim or hi.ndim:
        return minimum(maximum(t, clip_value_min), clip_value_max)
    if lo > hi:
        raise ValueError(f"clip_by_value: clip_value_min {lo} is greater than clip_value_max {hi}")
    lo, hi = t.dtype.type(lo), t.dtype.type(hi)
    return record(_clip, t, None, _clip_np(t._value, lo, hi), (lo, hi), fblock=(float(lo), float(hi)))


def _scale_np(x, c):
    if x.nbytes >= LARGE_BYTES:
        return np.multiply(x, c, out=fresh(x.shape, x.dtype))
    return x * c        # a numpy scalar where x has no axes (numpy's scalar math on a scalar x)


_scale = Primitive("scale", oc.SCALE, _scale_np, _same, lambda g, y, ins, c, w: (scale(g, c),))

_factors = {}       # (dtype, c) -> (c as a numpy scalar of dtype, as a Python float): two conversions of ~0.2 us


def scale(x, c):
    """x * c for a Python number c (one instruction, no constant slot)."""
    v = x._value
    factor = _factors.get((v.dtype, c))
    if factor is None:
        typed = v.dtype.type(c)
        factor = (typed, float(typed))
        if c != 0 and len(_factors) < 4096:        # 0.0 == -0.0 as keys: a zero is converted every time
            _factors[v.dtype, c] = factor
    return record(_scale, x, None, _scale_np(v, factor[0]), factor[0], fblock=(factor[1],))


def _powc_np(x, c):
    return np.power(x, c)[()]


_powc = Primitive("powc", oc.POWC, _powc_np, _same,
                  lambda g, y, ins, c, w: (scale(g * _pow_const(ins[0], c - 1), c),))


def _pow_const(x, c):
    c = x.dtype.type(c)
    return record(_powc, x, None, _powc_np(x._value, c), c, fblock=(float(c),))


def _cast_np(x, dtype):
    return np.asarray(x, dtype)[()]


_cast = Primitive("cast", oc.COPY, _cast_np, _same, lambda g, y, ins, dtype, w: (cast(g, ins[0].dtype),))


def cast(x, dtype):
    """x converted to `dtype`; float-to-float casts are differentiable, others are not recorded."""
    x = as_tensor(x)
    dtype = np.dtype(dtype)
    if x.dtype == dtype:
        return x
    if x.dtype.kind in "fb" and dtype.kind == "f":       # bool: a recorded comparison's 0/1 values
        return record(_cast, x, None, _cast_np(x._value, dtype), dtype)
    return _cast_constant(x, dtype)


@reads_values
def _cast_constant(x, dtype):
    """A cast to an integer or bool dtype: no derivative; in a trace, a guard on x (see jitape.replay)."""
    return Tensor(np.asarray(x._value, dtype)[()])


def identity(x):
    """A new tensor with x's value (recorded: gradients flow through)."""
    x = float_tensor(x, "identity")
    return record(_cast, x, None, x._value, x.dtype)


# -- binary ----------------------------------------------------------------------------------
def _binary_shape(shapes, params):
    sa, sb = shapes
    if sa != sb:
        raise ValueError(f"elementwise operands must have equal shapes after broadcasting, got {sa} and {sb}")
    return sa


_FLOAT32, _FLOAT64 = _FLOATS


def _binary(name, opcode, forward, vjp):
    prim = Primitive(name, opcode, forward, _binary_shape, vjp)
    into = isinstance(forward, np.ufunc)      # a large result goes into a recycled buffer (recycling.fresh)
    strided = opcode in _STRIDED_OPCODES
    scalar = _OPERATORS.get(opcode, forward)

    def large(xv, yv):
        """The value of x op y over operands of one shape and at least STRIDED_FROM entries."""
        if xv.dtype == yv.dtype:
            if strided and not (xv.flags.c_contiguous and yv.flags.c_contiguous):
                out = _strided(opcode, xv, yv)
                if out is not None:
                    return out
            if into:
                return forward(xv, yv, out=fresh(xv.shape, xv.dtype))
        return forward(xv, yv)

    def op(x, y, name=None):
        # the common case, two float tensors of one dtype and shape, without promote's call (a tenth of a
        # recorded op's cost)
        if isinstance(x, Tensor) and isinstance(y, Tensor):
            xv, yv = x._value, y._value
            dtype = xv.dtype
            if yv.dtype is dtype and (dtype is _FLOAT64 or dtype is _FLOAT32) and xv.shape == yv.shape:
                if type(xv) is _ndarray:
                    return record(prim, x, y, large(xv, yv) if xv.size >= STRIDED_FROM else forward(xv, yv))
                return record(prim, x, y, scalar(xv, yv))
        x, y = promote(x, y)
        if x._value.shape != y._value.shape:
            x, y = _broadcast_pair(x, y, prim.name)
        xv, yv = x._value, y._value
        if type(xv) is _ndarray:
            return record(prim, x, y, large(xv, yv) if xv.size >= STRIDED_FROM else forward(xv, yv))
        return record(prim, x, y, scalar(xv, yv))

    op.__name__ = name
    op.__qualname__ = name
    op.__doc__ = f"Elementwise {name} with numpy broadcasting."
    return op


# results of at least this many entries are written by strided_arithmetic where numpy would iterate its operands
# in short runs (below, its call costs less than the kernel's dispatch), and into fresh() arrays
STRIDED_FROM = 1 << 14
SHORT_RUN = 128         # numpy's runs of 64 broadcast entries still took twice the kernel's time, 10 three times
_STRIDED_OPCODES = frozenset((oc.ADD, oc.SUB, oc.MUL, oc.DIV, oc.MAXIMUM, oc.MINIMUM))
# the arithmetic ufuncs on two numpy scalars (every scalar value) through Python's operators: numpy's scalar math
# takes 40 ns where the ufunc's call takes 550 (a scalar chain's records spent a third of their time there); one
# IEEE operation either way, the same bits (on arrays the operators cost more than the ufunc's call)
_ndarray = np.ndarray
_OPERATORS = {oc.ADD: operator.add, oc.SUB: operator.sub, oc.MUL: operator.mul, oc.DIV: operator.truediv}


def _strided(opcode, xv, yv):
    """x op y by strided_arithmetic where numpy would iterate the operands (of one shape and float dtype, up
    to three axes, broadcast or transposed views) in runs shorter than SHORT_RUN; else None. numpy merges two
    trailing axes into one run where every operand's strides continue across them."""
    shape = xv.shape
    if xv.dtype.kind != "f" or len(shape) > 3:
        return None
    run, inner = 1, None        # inner: the run's outermost axis so far (axes of size 1 are left out, as numpy does)
    for axis in range(len(shape) - 1, -1, -1):
        if shape[axis] == 1:
            continue
        if inner is not None and any(v.strides[axis] != v.strides[inner] * shape[inner] for v in (xv, yv)):
            break
        run *= shape[axis]
        inner = axis
        if run >= SHORT_RUN:
            return None
    out = fresh(shape, xv.dtype)
    lead = (1,) * (3 - len(shape))
    a, b = xv.reshape(lead + shape), yv.reshape(lead + shape)      # views: only leading axes of one are added
    a.flags.writeable = b.flags.writeable = False   # one compiled signature whatever the inputs' flags
    strided_arithmetic(opcode, a, b, out.reshape(lead + shape))
    return out


def _broadcast_pair(x, y, what):
    shape = broadcast_shapes(x.shape, y.shape, what)
    return _shape.broadcast_to(x, shape), _shape.broadcast_to(y, shape)


add = _binary("add", oc.ADD, np.add, lambda g, out, ins, p, w: (g, g))
subtract = _binary("subtract", oc.SUB, np.subtract, lambda g, out, ins, p, w: (g, negative(g) if w[1] else None))
_multiply = _binary("multiply", oc.MUL, np.multiply,
                    lambda g, out, ins, p, w: (g * ins[1] if w[0] else None, g * ins[0] if w[1] else None))
divide = _binary("divide", oc.DIV, np.true_divide,
                 lambda g, out, ins, p, w: (divide(g, ins[1]) if w[0] else None,
                                            negative(divide(g * out, ins[1])) if w[1] else None))


def _pow_vjp(g, out, ins, p, w):
    a, b = ins
    da = g * b * _pow_binary(a, b - 1.0) if w[0] else None
    if not w[1]:
        return da, None
    positive = greater(a, 0.0)
    safe_log = log(where(positive, a, 1.0))
    return da, g * where(positive, out * safe_log, 0.0)


_pow_binary = _binary("pow", oc.POW, np.power, _pow_vjp)
maximum = _binary("maximum", oc.MAXIMUM, np.maximum,
                  lambda g, out, ins, p, w: (g * _mask(greater_equal(ins[0], ins[1]), g),
                                             g * _mask(less(ins[0], ins[1]), g)))
minimum = _binary("minimum", oc.MINIMUM, np.minimum,
                  lambda g, out, ins, p, w: (g * _mask(less_equal(ins[0], ins[1]), g),
                                             g * _mask(greater(ins[0], ins[1]), g)))


def _atan2_vjp(g, out, ins, p, w):
    y, x = ins
    r = add(square(y), square(x))
    return (divide(g * x, r) if w[0] else None, negative(divide(g * y, r)) if w[1] else None)


_atan2 = _binary("atan2", oc.ATAN2, np.arctan2, _atan2_vjp)


def atan2(y, x, name=None):
    """The angle of the point (x, y), elementwise with numpy broadcasting (TensorFlow's argument order).

    >>> import jitape as jt
    >>> print(jt.atan2(1.0, -1.0).numpy().round(6))      # 3 pi / 4
    2.356194
    """
    return _atan2(y, x)


def multiply(x, y, name=None):
    """Elementwise x * y with numpy broadcasting; a Python-number factor records one scale instruction."""
    if type(x) is Tensor and type(y) is Tensor:     # the common call, without four checks for a number
        return _multiply(x, y)
    if isinstance(y, (int, float)) and not isinstance(y, bool) and isinstance(x, Tensor) and x.dtype.kind == "f":
        return scale(x, y)
    if isinstance(x, (int, float)) and not isinstance(x, bool) and isinstance(y, Tensor) and y.dtype.kind == "f":
        return scale(y, x)
    return _multiply(x, y)


def reversed_multiply(x, y):
    """y * x (Tensor.__rmul__): a Python number y records one scale instruction, without multiply's checks."""
    if (type(y) is float or type(y) is int) and x._value.dtype.kind == "f":
        return scale(x, y)
    return multiply(y, x)


def pow(x, y, name=None):
    """x ** y; a Python-number exponent records one powc instruction (TensorFlow's gradient rule)."""
    if isinstance(y, (int, float)) and not isinstance(y, bool) and isinstance(x, Tensor) and x.dtype.kind == "f":
        return _pow_const(x, y)
    return _pow_binary(x, y)


# -- where -----------------------------------------------------------------------------------
def _where_np(cond, x, y):
    return np.where(cond != 0, x, y)[()]


def _where_shape(shapes, params):
    sc, sx, sy = shapes
    if not sc == sx == sy:
        raise ValueError(f"where: condition, x and y must have equal shapes after broadcasting, "
                         f"got {sc}, {sx} and {sy}")
    return sx


_where = Primitive("where", oc.WHERE, _where_np, _where_shape,
                   lambda g, out, ins, p, w: (None,
                                              where(ins[0], g, 0.0) if w[1] else None,
                                              where(ins[0], 0.0, g) if w[2] else None))


def where(condition, x=None, y=None):
    """Elements of x where condition holds, else of y (numpy broadcasting); with one argument, the indices."""
    if x is None and y is None:
        return _where_indices(condition)
    if x is None or y is None:
        raise ValueError("where: give both x and y, or neither")
    cond = condition if isinstance(condition, Tensor) else Tensor(np.asarray(condition))
    x, y = promote(x, y)
    shape = broadcast_shapes(broadcast_shapes(cond.shape, x.shape, "where"), y.shape, "where")
    x = _shape.broadcast_to(x, shape)
    y = _shape.broadcast_to(y, shape)
    # a recorded condition (a comparison of traced values) stays recorded: broadcast and cast as instructions
    mask = cast(_shape.broadcast_to(cond, shape), x.dtype)
    return emit(_where, (mask, x, y), _where_np(mask._value, x._value, y._value))


@reads_values
def _where_indices(condition):
    """where(condition) with one argument: the indices where it holds, [n, rank] int64."""
    cond = np.asarray(condition._value if isinstance(condition, Tensor) else condition)
    return Tensor(np.argwhere(cond).astype(np.int64))


# -- not differentiable ----------------------------------------------------------------------
@non_differentiable
def round(x):
    """Round half to even; like TensorFlow, its gradient is None."""
    return Tensor(np.round(as_tensor(x)._value)[()])


def _compare(name, opcode, fn):
    """A comparison: recorded when it reads float tensors (a 0/1 instruction, so a replayed function
    recomputes it; no derivative flows through it), computed on the values otherwise."""
    prim = Primitive(name, opcode, fn, _binary_shape, lambda g, out, ins, p, w: (None, None), differentiable=False)

    def op(x, y, name=None):
        if (isinstance(x, Tensor) and x.dtype.kind == "f") or (isinstance(y, Tensor) and y.dtype.kind == "f"):
            x, y = promote(x, y)
            if x._value.shape != y._value.shape:
                x, y = _broadcast_pair(x, y, prim.name)
            return record(prim, x, y, fn(x._value, y._value)[()])
        x, y = as_tensor(x), as_tensor(y, x if isinstance(x, Tensor) else None)
        if _traces.active:
            observe_all((x, y), f"jt.{name} of non-float tensors")
        return Tensor(fn(x._value, y._value)[()])

    op.__name__ = name
    op.__qualname__ = name
    op.__doc__ = f"Elementwise {name} with numpy broadcasting, a bool tensor (its gradient is None)."
    return non_differentiable(op)


_stop_gradient = Primitive("stop_gradient", oc.STOP_GRADIENT, lambda x: x, _same, lambda g, out, ins, p, w: (None,),
                           differentiable=False)


@non_differentiable
def stop_gradient(input, name=None):
    """The value of `input`; no gradient flows through it. In a jt.function trace it is recorded (a copy that
    every derivative treats as a constant), so a replay recomputes it from its new inputs."""
    x = as_tensor(input)
    if _traces.active and x._value.dtype.kind == "f":
        return record(_stop_gradient, x, None, x._value)
    return Tensor(x._value)


equal = _compare("equal", oc.EQUAL, np.equal)
not_equal = _compare("not_equal", oc.NOT_EQUAL, np.not_equal)
less = _compare("less", oc.LESS, np.less)
less_equal = _compare("less_equal", oc.LESS_EQUAL, np.less_equal)
greater = _compare("greater", oc.GREATER, np.greater)
greater_equal = _compare("greater_equal", oc.GREATER_EQUAL, np.greater_equal)
