"""The vectorised exp, log, tanh and sigmoid rules of the CPU kernels (jitape_kernels.cpu.vectormath) against numpy
over their whole range, and the replayed forward of exp, log, tanh, sigmoid and sums against numpy's."""
import numpy as np
import pytest

import jitape as jt
from jitape_kernels.cpu.vectormath import exp_array, log_array, sigmoid_array, tanh_array


def _sigmoid(x):
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


RULES = [(exp_array, np.exp, 1), (log_array, np.log, 1), (tanh_array, np.tanh, 3), (sigmoid_array, _sigmoid, 3)]
SPECIALS = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-300, -1e-300, 5e-324, 1e-310, 2.2250738585072014e-308, 1.0, -1.0,
            np.sqrt(2), np.sqrt(0.5), 1.3830, 1.4199, 19.06, 20.0, -20.0, 40.0, 709.78, 709.79, 710.0, -708.4, -745.13,
            -745.14, -746.0, 1e308, -1e308, 1.7976931348623157e308]


def _inputs(dtype):
    rng = np.random.default_rng(3)
    parts = [3 * rng.standard_normal(5000), rng.uniform(-750, 710, 5000), rng.uniform(-1e-4, 1e-4, 2000),
             rng.uniform(-30, 30, 5000), np.exp(rng.uniform(-745, 709, 5000)), 1 + rng.uniform(-1e-5, 1e-5, 2000),
             rng.uniform(0.5, 2.0, 5000), np.array(SPECIALS)]
    with np.errstate(over="ignore"):
        return np.concatenate(parts).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kernel,reference,max_ulps", RULES, ids=["exp", "log", "tanh", "sigmoid"])
def test_rules_agree_with_numpy(kernel, reference, max_ulps, dtype):
    x = _inputs(dtype)
    out = np.empty_like(x)
    kernel(x, out)
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        # the rules compute in float64 (numpy's float32 log is up to 3 ulps from the rounded float64 value)
        expected = reference(x.astype(np.float64)).astype(dtype)
    nan = np.isnan(expected)
    np.testing.assert_array_equal(np.isnan(out), nan)
    finite = ~nan & np.isfinite(expected)
    np.testing.assert_array_equal(out[~nan & ~finite], expected[~nan & ~finite])     # overflow to inf alike
    np.testing.assert_array_max_ulp(out[finite], expected[finite], maxulp=max_ulps + (dtype == np.float32))
    zero = ~nan & (expected == 0)
    np.testing.assert_array_equal(np.signbit(out[zero]), np.signbit(expected[zero]))


@pytest.mark.parametrize("op", [jt.exp, jt.math.log, jt.tanh, jt.sigmoid])
def test_replayed_forward_uses_them(op):
    x = jt.constant(_inputs(np.float64)[:5000])
    f = jt.function(op)
    f(x)
    np.testing.assert_array_max_ulp(f(x).numpy(), op(x).numpy(), maxulp=3)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("shape,axis", [((0,), None), ((7,), None), ((8,), None), ((129,), None), ((1000,), None),
                                        ((100_003,), None), ((640_001,), None), ((5, 12_345), 1), ((3, 300), 1), ((300, 3), 0), ((4, 129, 5), 1),
                                        ((6, 40, 7), 2), ((6, 40, 7), 0), ((50, 60), None),
                                        # rows of 8 to SHORT_ROWS entries: summed in one loop, no call per row
                                        ((700, 10), 1), ((20, 32), 1), ((9, 33), 1)])
def test_replayed_sums_equal_numpys_bit_for_bit(shape, axis, dtype):
    rng = np.random.default_rng(5)
    x = jt.constant((rng.standard_normal(shape) * 10.0 ** rng.uniform(-3, 3, shape)).astype(dtype))
    f = jt.function(lambda v: jt.reduce_sum(v, axis=axis))
    f(x)
    assert f.trace_count == 1
    np.testing.assert_array_equal(f(x).numpy(), np.sum(x.numpy(), axis=axis))
