"""jitape_kernels.cpu.elementwise: the vectorised forward loops give the bits of the per-entry rules they
replace (binary_value, unary_value), and replays running them give eager's (numpy's) values, in both dtypes,
on arrays with NaN, infinities, signed zeros and ties, at sizes that take each replay path (rows inline below
SMALL, rows one by one, fused groups of blocks)."""
import numpy as np
import pytest

import jitape as jt
from jitape_kernels import opcodes as oc
from jitape_kernels.cpu.elementwise import binary_forward, binary_value, unary_forward, unary_value
from jitape_kernels.layout import FUSE_MIN_SIZE

pytestmark = pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")     # eager inf * 0

SPECIAL = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 2.5]

BINARY = {
    "maximum": (oc.MAXIMUM, jt.maximum), "minimum": (oc.MINIMUM, jt.minimum),
    "greater": (oc.GREATER, jt.greater), "greater_equal": (oc.GREATER_EQUAL, jt.greater_equal),
    "less": (oc.LESS, jt.less), "less_equal": (oc.LESS_EQUAL, jt.less_equal),
    "equal": (oc.EQUAL, jt.equal), "not_equal": (oc.NOT_EQUAL, jt.not_equal),
}


def _operands(n, dtype, seed=0):
    """Two arrays of n entries: every pair of SPECIAL values, then random values with ties between a and b."""
    rng = np.random.default_rng(seed)
    pairs = np.array([(a, b) for a in SPECIAL for b in SPECIAL], np.float64)
    a = rng.choice([-1.5, -0.5, 0.0, 0.5, 1.5], n).astype(np.float64)
    b = np.where(rng.random(n) < 0.3, a, rng.standard_normal(n))
    count = min(n, len(pairs))
    a[:count], b[:count] = pairs[:count, 0], pairs[:count, 1]
    return a.astype(dtype), b.astype(dtype)


def _same_bits(actual, expected):
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape and actual.dtype == expected.dtype
    nan = np.isnan(expected) if expected.dtype.kind == "f" else np.zeros(expected.shape, bool)
    np.testing.assert_array_equal(np.isnan(actual) if actual.dtype.kind == "f" else nan, nan)
    assert np.array_equal(actual[~nan].view(np.uint8) if actual.dtype.kind == "f" else actual[~nan],
                          expected[~nan].view(np.uint8) if expected.dtype.kind == "f" else expected[~nan])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_loops_equal_the_per_entry_rule(name, dtype):
    op = BINARY[name][0]
    a, b = _operands(200, dtype)
    out = np.empty_like(a)
    binary_forward(op, a, b, out)
    _same_bits(out, np.array([binary_value(op, x, y) for x, y in zip(a, b)]).astype(dtype))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_scale_loop_equals_the_per_entry_rule(dtype):
    x, _ = _operands(200, dtype)
    factor = float(dtype(0.1))          # as recorded: the factor in the tensor's dtype
    out = np.empty_like(x)
    unary_forward(oc.SCALE, x, out, factor, 0.0)
    _same_bits(out, np.array([unary_value(oc.SCALE, v, factor, 0.0) for v in x]).astype(dtype))
    _same_bits(out, x * dtype(0.1))


@pytest.mark.parametrize("n", [7, 300, FUSE_MIN_SIZE + 5])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_replays_equal_eager(name, dtype, n):
    """Replayed on new values of the traced shapes: the compare family inside a product (so it is a row of a
    fused group where the arrays are large), maximum and minimum alone."""
    _, call = BINARY[name]
    compare = name not in ("maximum", "minimum")

    def f(a, b):
        y = call(a, b)
        return jt.cast(y, a.dtype) * a if compare else y

    replayed = jt.function(f)
    replayed(*map(jt.constant, _operands(n, dtype, seed=1)))
    a, b = map(jt.constant, _operands(n, dtype, seed=2))
    _same_bits(replayed(a, b).numpy(), f(a, b).numpy())


@pytest.mark.parametrize("n", [7, 300, FUSE_MIN_SIZE + 5])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_scale_replays_equal_eager(dtype, n):
    def f(x):
        return (x * 0.1 + 1.0) * 3.7

    replayed = jt.function(f)
    replayed(jt.constant(_operands(n, dtype, seed=1)[0]))
    x = jt.constant(_operands(n, dtype, seed=2)[0])
    _same_bits(replayed(x).numpy(), f(x).numpy())
