"""The TensorFlow-named primitives beyond the registry's sampled cases: digamma/polygamma kernels against
scipy on a wide range, numpy dispatch, cumsum in batch Jacobians and per-example gradients, bad input."""
import numpy as np
import pytest
import scipy.special

import jitape as jt

WIDE = np.concatenate([np.linspace(0.01, 40, 301), [1e-4, 1e4, -0.5, -2.5, -3.7, -0.01]])


@pytest.mark.parametrize("order", [0, 1, 2, 3])
def test_polygamma_kernels_match_scipy(order):
    """The compiled derivative of polygamma(n) is polygamma(n + 1): the gradient checks the njit series."""
    x = jt.constant(WIDE)
    with jt.GradientTape() as tape:
        tape.watch(x)
        y = jt.math.polygamma(order, x)
    np.testing.assert_allclose(y.numpy(), scipy.special.polygamma(order, WIDE), rtol=1e-13)
    np.testing.assert_allclose(tape.gradient(y, x).numpy(), scipy.special.polygamma(order + 1, WIDE), rtol=1e-12)


def test_lgamma_gradient_is_digamma():
    x = jt.constant(WIDE)
    with jt.GradientTape() as tape:
        tape.watch(x)
        y = jt.lgamma(x)
    np.testing.assert_allclose(tape.gradient(y, x).numpy(), scipy.special.digamma(WIDE), rtol=1e-12, atol=1e-13)


def test_numpy_dispatch():
    a = np.array([[0.3, -0.6, 0.9], [0.2, 0.4, -0.1]])
    t = jt.constant(a)
    for fn in (np.sinh, np.cosh, np.arcsinh, np.arctanh, np.arcsin, np.arccos, np.arctan, np.expm1,
               scipy.special.erf, scipy.special.erfc):
        assert isinstance(fn(t), jt.Tensor)
        np.testing.assert_allclose(fn(t).numpy(), fn(a), rtol=1e-14)
    np.testing.assert_allclose(np.log10(jt.constant(a + 1)).numpy(), np.log10(a + 1), rtol=1e-14)
    np.testing.assert_allclose(np.log2(jt.constant(a + 1)).numpy(), np.log2(a + 1), rtol=1e-14)
    np.testing.assert_allclose(np.arctan2(t, 0.5).numpy(), np.arctan2(a, 0.5), rtol=1e-14)
    for fn in (np.cumsum, np.cumprod):
        np.testing.assert_allclose(fn(t).numpy(), fn(a), rtol=1e-14)
        np.testing.assert_allclose(fn(t, axis=1).numpy(), fn(a, axis=1), rtol=1e-14)


def test_cumprod_with_zeros_has_exact_gradients():
    x = jt.constant([2.0, 0.0, 3.0, 0.0, 5.0], dtype="float64")
    with jt.GradientTape() as tape:
        tape.watch(x)
        y = jt.reduce_sum(jt.cumprod(x))
    # d/dx_i sum_j prod_{k<=j} x_k, only the products with one zero (at x_i) survive
    np.testing.assert_allclose(tape.gradient(y, x).numpy(), [1.0, 2.0 + 6.0, 0.0, 0.0, 0.0])


def test_cumsum_keeps_rows_apart_unless_along_the_batch():
    x = jt.constant(np.random.default_rng(0).normal(size=(4, 3)))
    with jt.GradientTape(persistent=True) as tape:
        tape.watch(x)
        inside = jt.cumsum(jt.sinh(x), axis=1, exclusive=True) * jt.digamma(jt.exp(x))
        across = jt.cumsum(x, axis=0)
    full = tape.jacobian(inside, x).numpy()
    np.testing.assert_allclose(tape.batch_jacobian(inside, x).numpy(), np.stack([full[b, :, b] for b in range(4)]))
    with pytest.raises(ValueError, match="mixes rows of the batch .op cumsum"):
        tape.batch_jacobian(across, x)


def test_cumsum_per_example_gradients():
    rng = np.random.default_rng(1)
    x = jt.constant(rng.normal(size=(5, 3)))
    w = jt.Variable(rng.normal(size=(3, 2)))
    with jt.GradientTape() as tape:
        losses = jt.reduce_sum(jt.square(jt.cumsum(jt.matmul(x, w), axis=1, reverse=True)), axis=1)
    per_example = tape.per_example_gradients(losses, w).numpy()
    for b in range(5):
        with jt.GradientTape() as one:
            loss = jt.reduce_sum(jt.square(jt.cumsum(jt.matmul(x[b:b + 1], w), axis=1, reverse=True)))
        np.testing.assert_allclose(per_example[b], one.gradient(loss, w).numpy(), rtol=1e-12)


def test_bad_input():
    x = jt.constant([1.0, 2.0])
    with pytest.raises(ValueError, match="order a must be >= 0"):
        jt.math.polygamma(-1, x)
    with pytest.raises(TypeError, match="one non-negative integer"):
        jt.math.polygamma([1, 2], x)
    with pytest.raises(ValueError, match="cumsum: the input must have rank >= 1"):
        jt.cumsum(jt.constant(1.0))
    with pytest.raises(ValueError, match="axis 2 is out of range"):
        jt.cumprod(x, axis=2)
    np.testing.assert_array_equal(jt.cumsum(jt.constant([1, 2, 3]), reverse=True).numpy(), [6, 5, 3])
