"""Compiled kernels of the elementwise opcodes (unary, binary, where): forward, reverse, and the
tangent and second-order kernels of forward-over-reverse Hessians.

Inputs and outputs are flat arena views of equal size; adjoints and tangents
are [size, K] views. The scalar rules compute in float64 and round once on store; float
parameters (elu alpha, clip bounds, scale, exponent) were rounded to the
program's dtype when recorded, so float32 products match numpy's bit for bit.

Written over an input: a replay writes a variable's new value over its old one
(layout._in_place), so the row computing it may have its output in one of its
inputs' rows. Over two arrays that are one, LLVM's overlap check fails and runs
the unvectorised loop, 3-5x slower, so the forward loops of the updates that
training steps make (arithmetic over its first input, or either where it
commutes; maximum as AMSGrad's; where; a scaling) are called with one array for
both, an inlined copy of the loops per such call. Other ops written over their
input run unvectorised, with the same results.
"""
import math

from .. import njit, opcodes as oc
from .vectormath import exp_array, log_array, sigmoid_array, tanh_array

_TWO_OVER_SQRT_PI = 1.1283791670955126
# B_2, B_4, ..., B_24: the Bernoulli numbers of the Euler-Maclaurin and asymptotic series below
_BERNOULLI = (1 / 6, -1 / 30, 1 / 42, -1 / 30, 5 / 66, -691 / 2730, 7 / 6, -3617 / 510, 43867 / 798,
              -174611 / 330, 854513 / 138, -236364091 / 2730)


@njit(cache=True, error_model="numpy")
def digamma(x):
    """psi(x) = d lgamma / dx: recurrence up to x >= 10, then the asymptotic series (float64, ~1e-15
    relative); reflection below 0. -inf at 0 and nan at the negative integers, as scipy.special.digamma."""
    acc = 0.0
    if x <= 0:
        if x == math.floor(x):
            return -math.inf if x == 0 else math.nan
        # psi(x) = psi(1 - x) - pi cot(pi x)
        acc = -math.pi / math.tan(math.pi * x)
        x = 1 - x
    while x < 10:
        acc -= 1 / x
        x += 1
    inv2 = 1 / (x * x)
    power = inv2
    series = 0.0
    for j in range(8):
        series += _BERNOULLI[j] / (2 * j + 2) * power
        power *= inv2
    return acc + math.log(x) - 0.5 / x - series


@njit(cache=True, error_model="numpy")
def polygamma(n, x):
    """The n-th derivative of digamma: (-1)^(n+1) n! zeta(n+1, x) for n >= 1, the Hurwitz zeta by a shift
    to x + N >= 12 + n and the Euler-Maclaurin tail (float64, ~1e-15 relative); digamma for n = 0."""
    if n <= 0:
        return digamma(x)
    if x != x or x < -1e7:
        return math.nan          # the shift below would take more than 10^7 steps
    if x == math.inf:
        return 0.0
    s = n + 1.0
    total = 0.0
    w = x
    while w < 12 + n:
        total += w ** -s
        w += 1
    # tail: w^(1-s)/(s-1) + w^-s/2 + sum_j B_2j/(2j)! s(s+1)...(s+2j-2) w^(-s-2j+1)
    total += w ** (1 - s) / (s - 1) + 0.5 * w ** -s
    rising = s                      # s (s+1) ... (s+2j-2)
    factorial = 2.0                 # (2j)!
    power = w ** (-s - 1)           # w^(-s-2j+1)
    inv2 = 1 / (w * w)
    for j in range(1, 13):
        total += _BERNOULLI[j - 1] / factorial * rising * power
        rising *= (s + 2 * j - 1) * (s + 2 * j)
        factorial *= (2 * j + 1) * (2 * j + 2)
        power *= inv2
    n_factorial = 1.0
    for k in range(2, n + 1):
        n_factorial *= k
    return (n_factorial if n % 2 == 1 else -n_factorial) * total


# The rarer unary ops (SINH .. STOP_GRADIENT) are called, not inlined: the common rules above are inlined into
# every sweep's loops, and inlining these too would compile each of their bodies once per call site.
@njit(cache=True, error_model="numpy")
def special_value(op, x, p0):
    """unary_value of SINH .. STOP_GRADIENT (x already float64; p0: polygamma's order)."""
    if op == oc.STOP_GRADIENT:
        return x
    if op == oc.SINH:
        return math.sinh(x)
    if op == oc.COSH:
        return math.cosh(x)
    if op == oc.ASINH:
        return math.asinh(x)
    if op == oc.ACOSH:
        return math.acosh(x) if x >= 1 else math.nan
    if op == oc.ATANH:
        return math.atanh(x) if abs(x) < 1 else (math.copysign(math.inf, x) if abs(x) == 1 else math.nan)
    if op == oc.ASIN:
        return math.asin(x) if abs(x) <= 1 else math.nan
    if op == oc.ACOS:
        return math.acos(x) if abs(x) <= 1 else math.nan
    if op == oc.ATAN:
        return math.atan(x)
    if op == oc.EXPM1:
        return math.expm1(x)
    if op == oc.ERF:
        return math.erf(x)
    if op == oc.ERFC:
        return math.erfc(x)
    if op == oc.LGAMMA:
        return math.lgamma(x) if not (x <= 0 and x == math.floor(x)) else math.inf
    if op == oc.DIGAMMA:
        return digamma(x)
    # POLYGAMMA: p0 is the order n
    return polygamma(int(p0), x)


@njit(cache=True, error_model="numpy")
def special_derivative(op, x, y, p0):
    """unary_derivative of SINH .. STOP_GRADIENT."""
    if op == oc.STOP_GRADIENT:
        return 0.0
    if op == oc.SINH:
        return math.cosh(x)
    if op == oc.COSH:
        return math.sinh(x)
    if op == oc.ASINH:
        return 1 / math.sqrt(x * x + 1)
    if op == oc.ACOSH:
        return 1 / math.sqrt((x - 1) * (x + 1))
    if op == oc.ATANH:
        return 1 / ((1 - x) * (1 + x))
    if op == oc.ASIN:
        return 1 / math.sqrt((1 - x) * (1 + x))
    if op == oc.ACOS:
        return -1 / math.sqrt((1 - x) * (1 + x))
    if op == oc.ATAN:
        return 1 / (1 + x * x)
    if op == oc.EXPM1:
        return math.exp(x)
    if op == oc.ERF:
        return _TWO_OVER_SQRT_PI * math.exp(-x * x)
    if op == oc.ERFC:
        return -_TWO_OVER_SQRT_PI * math.exp(-x * x)
    if op == oc.LGAMMA:
        return digamma(x)
    if op == oc.DIGAMMA:
        return polygamma(1, x)
    return polygamma(int(p0) + 1, x)


@njit(cache=True, error_model="numpy")
def special_second_derivative(op, x, y, p0):
    """unary_second_derivative of SINH .. STOP_GRADIENT."""
    if op == oc.SINH or op == oc.COSH:
        return y
    if op == oc.ASINH:
        q = x * x + 1
        return -x / (q * math.sqrt(q))
    if op == oc.ACOSH:
        q = (x - 1) * (x + 1)
        return -x / (q * math.sqrt(q))
    if op == oc.ATANH:
        q = (1 - x) * (1 + x)
        return 2 * x / (q * q)
    if op == oc.ASIN or op == oc.ACOS:
        q = (1 - x) * (1 + x)
        d = x / (q * math.sqrt(q))
        return d if op == oc.ASIN else -d
    if op == oc.ATAN:
        q = 1 + x * x
        return -2 * x / (q * q)
    if op == oc.EXPM1:
        return math.exp(x)
    if op == oc.ERF:
        return -2 * x * _TWO_OVER_SQRT_PI * math.exp(-x * x)
    if op == oc.ERFC:
        return 2 * x * _TWO_OVER_SQRT_PI * math.exp(-x * x)
    if op == oc.LGAMMA:
        return polygamma(1, x)
    if op == oc.DIGAMMA:
        return polygamma(2, x)
    if op == oc.POLYGAMMA:
        return polygamma(int(p0) + 2, x)
    return 0.0


@njit(cache=True, error_model="numpy", inline="always")
def maximum(a, b):
    """numpy's maximum: a NaN in either operand is the result, ties (signed zeros) give b."""
    return a if a > b or a != a else b


@njit(cache=True, error_model="numpy", inline="always")
def minimum(a, b):
    """numpy's minimum (see maximum)."""
    return a if a < b or a != a else b


@njit(cache=True, error_model="numpy", inline="always")
def sign(x):
    """numpy's sign: NaN stays NaN, signed zeros give 0."""
    return 1.0 if x > 0 else (-1.0 if x < 0 else (x if x != x else 0.0))


@njit(cache=True, error_model="numpy", inline="always")
def unary_value(op, x, p0, p1):
    x = float(x)
    if op == oc.COPY:
        return x
    if op == oc.NEG:
        return -x
    if op == oc.SQUARE:
        return x * x
    if op == oc.SQRT:
        return math.sqrt(x)
    if op == oc.EXP:
        return math.exp(x)
    if op == oc.LOG:
        return math.log(x) if x > 0 else (-math.inf if x == 0 else math.nan)
    if op == oc.LOG1P:
        return math.log1p(x) if x > -1 else (-math.inf if x == -1 else math.nan)
    if op == oc.SIN:
        return math.sin(x)
    if op == oc.COS:
        return math.cos(x)
    if op == oc.TAN:
        return math.tan(x)
    if op == oc.TANH:
        return math.tanh(x)
    if op == oc.ABS:
        return abs(x)
    if op == oc.SIGN:
        return sign(x)
    if op == oc.SIGMOID:
        if x >= 0:
            return 1 / (1 + math.exp(-x))
        e = math.exp(x)
        return e / (1 + e)
    if op == oc.RELU:
        return maximum(x, 0.0)
    if op == oc.ELU:
        return x if x > 0 else p0 * math.expm1(minimum(x, 0.0))
    if op == oc.SOFTPLUS:
        return maximum(x, 0.0) + math.log1p(math.exp(-abs(x)))
    if op == oc.CLIP:
        return minimum(maximum(x, p0), p1)
    if op == oc.SCALE:
        return p0 * x
    if op == oc.POWC:
        return x ** p0
    return special_value(op, x, p0)


@njit(cache=True, error_model="numpy", inline="always")
def unary_derivative(op, x, y, p0, p1):
    """dy/dx at x, given the recorded output y (reused where it is cheaper)."""
    x = float(x)
    y = float(y)
    if op == oc.COPY:
        return 1.0
    if op == oc.NEG:
        return -1.0
    if op == oc.SQUARE:
        return 2 * x
    if op == oc.SQRT:
        return 0.5 / y
    if op == oc.EXP:
        return y
    if op == oc.LOG:
        return 1 / x
    if op == oc.LOG1P:
        return 1 / (1 + x)
    if op == oc.SIN:
        return math.cos(x)
    if op == oc.COS:
        return -math.sin(x)
    if op == oc.TAN:
        return 1 + y * y
    if op == oc.TANH:
        return 1 - y * y
    if op == oc.ABS:
        return sign(x)
    if op == oc.SIGN:
        return 0.0
    if op == oc.SIGMOID:
        return y * (1 - y)
    if op == oc.RELU:
        return 1.0 if x > 0 else 0.0
    if op == oc.ELU:
        return 1.0 if x > 0 else y + p0
    if op == oc.SOFTPLUS:
        if x >= 0:
            return 1 / (1 + math.exp(-x))
        e = math.exp(x)
        return e / (1 + e)
    if op == oc.CLIP:
        return 1.0 if (x >= p0 and x <= p1) else 0.0
    if op == oc.SCALE:
        return p0
    if op == oc.POWC:
        # TensorFlow's rule, c * x**(c-1)
        return p0 * x ** (p0 - 1)
    return special_derivative(op, x, y, p0)


@njit(cache=True, error_model="numpy", inline="always")
def unary_second_derivative(op, x, y, p0, p1):
    """d²y/dx² at x, given the recorded output y; 0 for the piecewise-linear rules."""
    x = float(x)
    y = float(y)
    if op == oc.SQUARE:
        return 2.0
    if op == oc.SQRT:
        return -0.25 / (y * y * y)
    if op == oc.EXP:
        return y
    if op == oc.LOG:
        return -1 / (x * x)
    if op == oc.LOG1P:
        return -1 / ((1 + x) * (1 + x))
    if op == oc.SIN or op == oc.COS:
        return -y
    if op == oc.TAN:
        return 2 * y * (1 + y * y)
    if op == oc.TANH:
        return -2 * y * (1 - y * y)
    if op == oc.SIGMOID:
        return y * (1 - y) * (1 - 2 * y)
    if op == oc.ELU:
        return 0.0 if x > 0 else y + p0
    if op == oc.SOFTPLUS:
        s = unary_derivative(op, x, y, p0, p1)
        return s * (1 - s)
    if op == oc.POWC:
        return p0 * (p0 - 1) * x ** (p0 - 2)
    if op >= oc.SINH:
        return special_second_derivative(op, x, y, p0)
    return 0.0


@njit(cache=True, error_model="numpy")
def unary_forward(op, x, out, p0, p1):
    # the commonest ops as branch-free loops (they vectorise; exp, log, tanh and sigmoid by vectormath's rules);
    # the rest through unary_value's dispatch
    n = x.size
    if op == oc.SCALE:
        if out.ctypes.data == x.ctypes.data:        # written over its input (module docstring)
            _scale(out, out, p0)
        else:
            _scale(x, out, p0)
    elif op == oc.COPY or op == oc.STOP_GRADIENT:
        for i in range(n):
            out[i] = x[i]
    elif op == oc.NEG:
        for i in range(n):
            out[i] = -x[i]
    elif op == oc.SQUARE:
        for i in range(n):
            out[i] = x[i] * x[i]
    elif op == oc.SQRT:
        for i in range(n):
            out[i] = math.sqrt(x[i])
    elif op == oc.RELU:
        for i in range(n):
            out[i] = maximum(x[i], 0.0)
    elif op == oc.EXP:
        exp_array(x, out)
    elif op == oc.LOG:
        log_array(x, out)
    elif op == oc.TANH:
        tanh_array(x, out)
    elif op == oc.SIGMOID:
        sigmoid_array(x, out)
    else:
        for i in range(n):
            out[i] = unary_value(op, x[i], p0, p1)


@njit(cache=True, error_model="numpy", inline="always")
def _scale(x, out, factor):
    """unary_forward's SCALE loop (inlined per call: module docstring), in the arrays' dtype (the factor was
    recorded in it: float32 products are the double product's rounding), where a float64 factor would halve the
    float32 vectors."""
    c = x.dtype.type(factor)
    for i in range(x.size):
        out[i] = x[i] * c


@njit(cache=True, error_model="numpy")
def unary_reverse(op, x, y, g_out, g_in, p0, p1, assign=False):
    """g_in += g_out f'(x) over K columns (the tangent sweep's kernel too: a diagonal Jacobian is its own
    transpose); assign: g_in's first write (its rows hold no values yet), so it is set rather than added to."""
    K = g_out.shape[1]
    for i in range(x.size):
        d = unary_derivative(op, x[i], y[i], p0, p1)
        for k in range(K):
            _put(g_in, (i, k), g_out[i, k] * d, assign)


@njit(cache=True, error_model="numpy")
def unary_second(op, x, y, g_out, t_in, gt_in, p0, p1):
    """Second-order term of x's cotangent tangent: gt_in[i] += g_out[i] f''(x_i) t_in[i] (g_out one column);
    none for the rules whose f'' is zero everywhere (as the recorded VJPs, which have no such term)."""
    if op == oc.COPY or op == oc.NEG or op == oc.SCALE or op == oc.RELU or op == oc.ABS or op == oc.SIGN \
            or op == oc.CLIP or op == oc.STOP_GRADIENT:
        return
    K = t_in.shape[1]
    for i in range(x.size):
        c = g_out[i] * unary_second_derivative(op, x[i], y[i], p0, p1)
        if c != 0:
            for k in range(K):
                gt_in[i, k] += c * t_in[i, k]


@njit(cache=True, error_model="numpy")
def unary_reverse_1d(op, x, y, g_out, g_in, p0, p1, assign):
    """K = 1 on contiguous 1-D adjoints: the common rules in the arrays' dtype, so LLVM vectorises them.
    assign: g_in's first write (its rows hold no values yet), so it is set rather than added to."""
    n = x.size
    if op == oc.COPY:
        for i in range(n):
            _put(g_in, i, g_out[i], assign)
    elif op == oc.NEG:
        for i in range(n):
            _put(g_in, i, -g_out[i], assign)
    elif op == oc.SCALE:
        c = g_out.dtype.type(p0)
        for i in range(n):
            _put(g_in, i, g_out[i] * c, assign)
    elif op == oc.RELU:
        one, zero = g_out.dtype.type(1), g_out.dtype.type(0)
        for i in range(n):
            # a NaN cotangent stays NaN, as g * derivative does
            _put(g_in, i, g_out[i] * (one if x[i] > 0 else zero), assign)
    elif op == oc.SQUARE:
        for i in range(n):
            _put(g_in, i, g_out[i] * (x[i] + x[i]), assign)
    elif op == oc.EXP:
        for i in range(n):
            _put(g_in, i, g_out[i] * y[i], assign)
    elif op == oc.TANH:
        for i in range(n):
            _put(g_in, i, g_out[i] * (1 - y[i] * y[i]), assign)
    elif op == oc.SIGMOID:
        for i in range(n):
            _put(g_in, i, g_out[i] * (y[i] * (1 - y[i])), assign)
    elif op == oc.LOG:          # unary_derivative's rules, in float64 as there: the same numbers, vectorised
        for i in range(n):
            _put(g_in, i, g_out[i] * (1 / float(x[i])), assign)
    elif op == oc.SQRT:
        for i in range(n):
            _put(g_in, i, g_out[i] * (0.5 / float(y[i])), assign)
    else:
        for i in range(n):
            _put(g_in, i, g_out[i] * unary_derivative(op, x[i], y[i], p0, p1), assign)


@njit(cache=True, error_model="numpy", inline="always")
def _put(g, i, value, assign):
    """g[i] = value on a first write, else g[i] += value (assign is loop-invariant: LLVM unswitches it)."""
    if assign:
        g[i] = value
    else:
        g[i] += value


@njit(cache=True, error_model="numpy", inline="always")
def binary_value(op, a, b):
    a = float(a)
    b = float(b)
    if op == oc.ADD:
        return a + b
    if op == oc.SUB:
        return a - b
    if op == oc.MUL:
        return a * b
    if op == oc.DIV:
        return a / b
    if op == oc.POW:
        return a ** b
    if op == oc.MAXIMUM:
        return maximum(a, b)
    if op == oc.MINIMUM:
        return minimum(a, b)
    if op == oc.ATAN2:      # atan2(a, b) = the angle of the point (b, a), TensorFlow's argument order (y, x)
        return math.atan2(a, b)
    # the compare family: 1.0 where the comparison holds, else 0.0
    if op == oc.GREATER:
        holds = a > b
    elif op == oc.GREATER_EQUAL:
        holds = a >= b
    elif op == oc.LESS:
        holds = a < b
    elif op == oc.LESS_EQUAL:
        holds = a <= b
    elif op == oc.EQUAL:
        holds = a == b
    else:
        holds = a != b
    return 1.0 if holds else 0.0


@njit(cache=True, error_model="numpy", inline="always")
def binary_partials(op, a, b, y):
    """(dy/da, dy/db); ties of maximum/minimum go to the first operand, as in TensorFlow."""
    a = float(a)
    b = float(b)
    y = float(y)
    one = 1.0
    zero = 0.0
    if op == oc.ADD:
        return one, one
    if op == oc.SUB:
        return one, -one
    if op == oc.MUL:
        return b, a
    if op == oc.DIV:
        return one / b, -y / b
    if op == oc.POW:
        db = y * math.log(a) if a > 0 else zero
        return b * a ** (b - 1), db
    if op == oc.MAXIMUM:        # as the Python VJPs' masks: where either operand is NaN, neither gets g
        return (one if a >= b else zero), (one if a < b else zero)
    if op == oc.MINIMUM:
        return (one if a <= b else zero), (one if a > b else zero)
    if op == oc.ATAN2:
        r = a * a + b * b
        return b / r, -a / r
    return zero, zero       # the compare family: piecewise constant


@njit(cache=True, error_model="numpy", inline="always")
def binary_second_partials(op, a, b, y):
    """(d/da dy/da, d/db dy/da, d/da dy/db, d/db dy/db): the derivatives of binary_partials' rules."""
    a = float(a)
    b = float(b)
    y = float(y)
    zero = 0.0
    if op == oc.MUL:
        return zero, 1.0, 1.0, zero
    if op == oc.DIV:
        return zero, -1 / (b * b), -1 / (b * b), 2 * y / (b * b)
    if op == oc.POW:
        aa = b * (b - 1) * a ** (b - 2)
        if a > 0:
            log_a = math.log(a)
            ab = a ** (b - 1) * (1 + b * log_a)
            return aa, ab, ab, y * log_a * log_a
        return aa, a ** (b - 1), zero, zero     # dy/db is 0 where a <= 0
    if op == oc.ATAN2:
        r = a * a + b * b
        r2 = r * r
        cross = (a * a - b * b) / r2
        return -2 * a * b / r2, cross, cross, 2 * a * b / r2
    return zero, zero, zero, zero


@njit(cache=True, error_model="numpy")
def binary_forward(op, a, b, out):
    # arithmetic and compares as branch-free loops (they vectorise); the rest through binary_value's dispatch
    n = a.size
    if op == oc.ADD or op == oc.SUB or op == oc.MUL or op == oc.DIV or op == oc.MAXIMUM or op == oc.MINIMUM:
        # written over one of its inputs (module docstring), the loops name one array for both: over its first,
        # or over its second where the op commutes (IEEE sums and products do, bit for bit)
        out_is_a = out.ctypes.data == a.ctypes.data
        if out_is_a or out.ctypes.data == b.ctypes.data and (op == oc.ADD or op == oc.MUL):
            _arithmetic(op, out, b if out_is_a else a, out)
        else:
            _arithmetic(op, a, b, out)
    elif op == oc.GREATER:      # the compare family as selects (binary_value's dispatch per entry: 5-9x slower)
        for i in range(n):
            out[i] = 1.0 if a[i] > b[i] else 0.0
    elif op == oc.GREATER_EQUAL:
        for i in range(n):
            out[i] = 1.0 if a[i] >= b[i] else 0.0
    elif op == oc.LESS:
        for i in range(n):
            out[i] = 1.0 if a[i] < b[i] else 0.0
    elif op == oc.LESS_EQUAL:
        for i in range(n):
            out[i] = 1.0 if a[i] <= b[i] else 0.0
    elif op == oc.EQUAL:
        for i in range(n):
            out[i] = 1.0 if a[i] == b[i] else 0.0
    elif op == oc.NOT_EQUAL:
        for i in range(n):
            out[i] = 1.0 if a[i] != b[i] else 0.0
    else:
        for i in range(n):
            out[i] = binary_value(op, a[i], b[i])


@njit(cache=True, error_model="numpy", inline="always")
def _arithmetic(op, a, b, out):
    """binary_forward's ADD, SUB, MUL, DIV, MAXIMUM and MINIMUM loops (inlined per call: module docstring)."""
    n = a.size
    if op == oc.ADD:
        for i in range(n):
            out[i] = a[i] + b[i]
    elif op == oc.SUB:
        for i in range(n):
            out[i] = a[i] - b[i]
    elif op == oc.MUL:
        for i in range(n):
            out[i] = a[i] * b[i]
    elif op == oc.DIV:
        for i in range(n):
            out[i] = a[i] / b[i]
    elif op == oc.MAXIMUM:      # in the arrays' dtype: the bits binary_value gives
        for i in range(n):
            out[i] = maximum(a[i], b[i])
    else:
        for i in range(n):
            out[i] = minimum(a[i], b[i])


@njit(cache=True, error_model="numpy")
def strided_arithmetic(op, a, b, out):
    """out = a op b (ADD, SUB, MUL, DIV, MAXIMUM, MINIMUM) over [rows, cols, run] arrays of any strides, a broadcast
    axis's 0 included: the eager ops whose operands numpy iterates in short runs (jitape.ops.elementwise). numpy
    calls its inner loop once per run of the trailing axes its operands share a layout over, 10 entries for W8's
    (n, k, d) broadcasts, and is 2-3x slower there than these loops. IEEE arithmetic in the arrays' dtype, and
    maximum/minimum as binary_forward's: numpy's bits."""
    if a.shape != out.shape or b.shape != out.shape:
        raise ValueError("strided_arithmetic: the operands' shapes differ from the output's")
    rows, cols, run = out.shape
    if op == oc.ADD:
        for r in range(rows):
            for c in range(cols):
                for i in range(run):
                    out[r, c, i] = a[r, c, i] + b[r, c, i]
    elif op == oc.SUB:
        for r in range(rows):
            for c in range(cols):
                for i in range(run):
                    out[r, c, i] = a[r, c, i] - b[r, c, i]
    elif op == oc.MUL:
        for r in range(rows):
            for c in range(cols):
                for i in range(run):
                    out[r, c, i] = a[r, c, i] * b[r, c, i]
    elif op == oc.DIV:
        for r in range(rows):
            for c in range(cols):
                for i in range(run):
                    out[r, c, i] = a[r, c, i] / b[r, c, i]
    elif op == oc.MAXIMUM:
        for r in range(rows):
            for c in range(cols):
                for i in range(run):
                    out[r, c, i] = maximum(a[r, c, i], b[r, c, i])
    elif op == oc.MINIMUM:
        for r in range(rows):
            for c in range(cols):
                for i in range(run):
                    out[r, c, i] = minimum(a[r, c, i], b[r, c, i])
    else:
        raise ValueError("strided_arithmetic: not an arithmetic opcode")


@njit(cache=True, error_model="numpy")
def binary_reverse(op, a, b, y, g_out, g_a, g_b, want_a, want_b, assign_a=False, assign_b=False):
    """g_a += g_out da and g_b += g_out db over K columns; assign_a / assign_b: that input's first write (set, not
    added to: a's rows before b's, so x * x's second input adds to what its first set)."""
    K = g_out.shape[1]
    for i in range(a.size):
        da, db = binary_partials(op, a[i], b[i], y[i])
        # branch-free inner loops over the K contiguous columns vectorise
        if want_a:
            for k in range(K):
                _put(g_a, (i, k), g_out[i, k] * da, assign_a)
        if want_b:
            for k in range(K):
                _put(g_b, (i, k), g_out[i, k] * db, assign_b)


@njit(cache=True, error_model="numpy")
def binary_tangent(op, a, b, y, t_a, t_b, t_out, has_a, has_b):
    """t_out += dy/da t_a + dy/db t_b over K tangent columns (an input without a tangent is skipped)."""
    for i in range(a.size):
        da, db = binary_partials(op, a[i], b[i], y[i])
        if has_a:
            _add_scaled_row(t_out, i, da, t_a)
        if has_b:
            _add_scaled_row(t_out, i, db, t_b)


@njit(cache=True, error_model="numpy", inline="always")
def _add_scaled_row(out, i, scale, t):
    """out[i, :] += scale * t[i, :]: a column loop without branches, which vectorises."""
    for k in range(out.shape[1]):
        out[i, k] += scale * t[i, k]


@njit(cache=True, error_model="numpy")
def binary_second(op, a, b, y, g_out, t_a, t_b, gt_a, gt_b, has_a, has_b, live_a, live_b):
    """Second-order terms of the inputs' cotangent tangents, g_out one column; only MUL, DIV, POW, ATAN2 have
    them (MUL only when both inputs are active, DIV only when the divisor is). live_a / live_b: whether the
    input's tangent can be nonzero (not computed from empty tensors only)."""
    if not ((op == oc.MUL and has_a and has_b) or (op == oc.DIV and has_b) or op == oc.POW or op == oc.ATAN2):
        return
    K = gt_a.shape[1] if has_a else gt_b.shape[1]
    if op == oc.MUL:
        # each input's term is the other's tangent (x * x, both one slot, adds its two terms in this order, as
        # the general loop does)
        for i in range(a.size):
            g = float(g_out[i])
            if live_b:
                _add_scaled_row(gt_a, i, g, t_b)
            if live_a:
                _add_scaled_row(gt_b, i, g, t_a)
        return
    for i in range(a.size):
        aa, ab, ba, bb = binary_second_partials(op, a[i], b[i], y[i])
        g = float(g_out[i])
        # a term is skipped, not multiplied by zero, when its partial is structurally zero (MUL's aa, bb) or its
        # input has no tangent: 0 * inf would turn an infinite Hessian into nan
        use_aa, use_ab = live_a and aa != 0, live_b and ab != 0
        use_ba, use_bb = live_a and ba != 0, live_b and bb != 0
        for k in range(K):
            if has_a:
                gt_a[i, k] += g * ((aa * t_a[i, k] if use_aa else 0.0) + (ab * t_b[i, k] if use_ab else 0.0))
            if has_b:
                gt_b[i, k] += g * ((ba * t_a[i, k] if use_ba else 0.0) + (bb * t_b[i, k] if use_bb else 0.0))


@njit(cache=True, error_model="numpy")
def binary_reverse_1d(op, a, b, y, g_out, g_a, g_b, want_a, want_b, assign_a, assign_b, same=False):
    """K = 1 on contiguous 1-D adjoints: add, subtract and multiply as plain vector loops. assign_a/_b: the
    first write of g_a/g_b (set rather than added; g_a's rows come first when both are one slot). same: both
    inputs are one slot (x * x), whose cotangent takes both terms in one pass, in the order two passes add them."""
    n = a.size
    if same and op == oc.MUL:
        if want_a:
            for i in range(n):
                term = g_out[i] * b[i]
                if assign_a:
                    g_a[i] = term + term
                else:
                    g_a[i] = (g_a[i] + term) + term
    elif op == oc.ADD or op == oc.SUB:
        if want_a:
            for i in range(n):
                _put(g_a, i, g_out[i], assign_a)
        if want_b:
            if op == oc.ADD:
                for i in range(n):
                    _put(g_b, i, g_out[i], assign_b)
            else:
                for i in range(n):
                    _put(g_b, i, -g_out[i], assign_b)
    elif op == oc.MUL:
        if want_a:
            for i in range(n):
                _put(g_a, i, g_out[i] * b[i], assign_a)
        if want_b:
            for i in range(n):
                _put(g_b, i, g_out[i] * a[i], assign_b)
    elif op == oc.DIV:          # binary_partials' rules, in float64 as there: the same numbers, vectorised
        if want_a:
            for i in range(n):
                _put(g_a, i, g_out[i] * (1 / float(b[i])), assign_a)
        if want_b:
            for i in range(n):
                _put(g_b, i, g_out[i] * (-float(y[i]) / float(b[i])), assign_b)
    else:
        for i in range(n):
            da, db = binary_partials(op, a[i], b[i], y[i])
            if want_a:
                _put(g_a, i, g_out[i] * da, assign_a)
            if want_b:
                _put(g_b, i, g_out[i] * db, assign_b)


@njit(cache=True, error_model="numpy")
def where_forward(cond, a, b, out):
    if out.ctypes.data == a.ctypes.data:        # written over an input (module docstring)
        _select(cond, out, b, out)
    elif out.ctypes.data == b.ctypes.data:
        _select(cond, a, out, out)
    else:
        _select(cond, a, b, out)


@njit(cache=True, error_model="numpy", inline="always")
def _select(cond, a, b, out):
    # both entries loaded before the select: a load under the condition (b[i] where cond[i] is 0) cannot be
    # made unconditional (LLVM does not know b holds a.size entries), and the loop ran unvectorised, 3-6x slower
    for i in range(a.size):
        x = a[i]
        y = b[i]
        out[i] = x if cond[i] != 0 else y


@njit(cache=True, error_model="numpy")
def where_linear(cond, out_rows, a_rows, b_rows, has_a, has_b, transpose):
    """WHERE's linear map over K columns: out += a or b, entry by entry as cond selects (tangents), or
    transposed, the selected input += out (cotangents). An input without rows (has_ False) is skipped."""
    K = out_rows.shape[1]
    for i in range(cond.size):
        chosen = cond[i] != 0
        if not (has_a if chosen else has_b):
            continue
        rows = a_rows if chosen else b_rows
        for k in range(K):
            if transpose:
                rows[i, k] += out_rows[i, k]
            else:
                out_rows[i, k] += rows[i, k]
