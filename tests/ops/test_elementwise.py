"""jitape/ops/elementwise.py: a factor on either side of a product records what jt.multiply records (a Python
number or np.float64, not a bool: one SCALE instruction), with numpy's values and the same gradients; arithmetic
on scalars and small arrays (Python's operators: numpy's scalar math) gives the ufuncs' bits and types; a scale's
cached factors keep each dtype's rounding and the sign of zero."""
import numpy as np
import pytest

import jitape as jt
from jitape_kernels import opcodes as oc


@pytest.mark.parametrize("factor", [0.5, 2, -3.0, True, np.float32(0.5), np.float64(0.5), "a tensor"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_factor_on_either_side_of_a_product_records_what_multiply_records(factor, dtype):
    x = jt.constant(np.array([1.0, -2.0, 3.0], dtype))
    f = jt.constant(np.array(0.5, dtype)) if isinstance(factor, str) else factor
    found = []
    for product in (lambda: f * x, lambda: x * f, lambda: jt.multiply(f, x), lambda: jt.multiply(x, f)):
        with jt.GradientTape() as tape:
            tape.watch(x)
            y = product()
            total = jt.reduce_sum(y)
        ops = np.frombuffer(b"".join(tape._rows), np.int64).reshape(-1, 6)[:, 0].tolist()
        found.append((ops, y.dtype, y.numpy().tolist(), tape.gradient(total, x).numpy().tolist()))
    assert all(entry == found[0] for entry in found)
    ops, out_dtype, values, gradient = found[0]
    np.testing.assert_array_equal(values, np.asarray(x.numpy() * np.asarray(f)).astype(out_dtype))
    number = isinstance(factor, (int, float)) and not isinstance(factor, bool)     # np.float64 is a float
    assert (oc.SCALE in ops) == number and (oc.MUL not in ops) == number
    np.testing.assert_allclose(gradient, np.full(3, float(np.asarray(f))), rtol=1e-6)


_SPECIAL = [0.0, -0.0, 1.0, -1.0, 0.1, 3.0e38, -3.0e38, 1.0e-45, np.inf, -np.inf, np.nan, 7.0]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")       # overflow, 0/0, inf - inf: numpy's warnings
@pytest.mark.parametrize("name, ufunc", [("add", np.add), ("subtract", np.subtract), ("multiply", np.multiply),
                                         ("divide", np.true_divide)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("form", ["scalar", "0-d array", "array"])
def test_arithmetic_on_scalars_and_small_arrays_gives_the_ufunc_s_bits_and_types(name, ufunc, dtype, form):
    op = getattr(jt, name)
    for a in _SPECIAL:
        for b in _SPECIAL:
            x, y = dtype(a), dtype(b)
            if form == "0-d array":
                x, y = np.asarray(x), np.asarray(y)
            elif form == "array":
                x, y = np.array([x, y, x]), np.array([y, x, x])
            expected = ufunc(x, y)
            with jt.GradientTape() as tape:
                tx = jt.constant(x)
                tape.watch(tx)
                found = op(tx, jt.constant(y))._value
            assert type(found) is type(expected) and found.dtype == expected.dtype
            np.testing.assert_array_equal(np.asarray(found).reshape(-1).view(np.uint8),
                                          np.asarray(expected).reshape(-1).view(np.uint8))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_scale_s_cached_factor_keeps_the_dtype_s_rounding_and_the_sign_of_zero(dtype):
    x = jt.constant(np.array([1.0, -2.0], dtype))
    for factor in (0.1, -0.0, 0.0, -0.0, 0.1, 1e300, 0.0):
        for _ in range(2):      # a factor's second use reads the cache
            with jt.GradientTape() as tape:
                tape.watch(x)
                y = jt.multiply(x, factor)
            with np.errstate(over="ignore"):
                expected = x._value * dtype(factor)
            np.testing.assert_array_equal(np.signbit(y._value), np.signbit(expected))
            np.testing.assert_array_equal(y._value, expected)
            assert tape._fattr.tolist() == [float(dtype(factor))]       # what the compiled sweeps multiply by
