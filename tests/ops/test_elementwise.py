"""jitape/ops/elementwise.py: a factor on either side of a product records what jt.multiply records (a Python
number or np.float64, not a bool: one SCALE instruction), with numpy's values and the same gradients."""
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
