"""jt.optimizers: SGD and Adam against Keras 3's update formulas."""

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import jitape as jt

DTYPES = ["float32", "float64"]


def sgd_reference(value, grads, lr, momentum, nesterov):
    """Keras 3 SGD.update_step, out of place, in the variable's dtype."""
    d = value.dtype.type
    m = np.zeros_like(value)
    values = []
    for g in grads:
        g = g.astype(value.dtype)
        if momentum == 0:
            value = value - g * d(lr)
        else:
            m = m * d(momentum) - g * d(lr)
            value = value + (m * d(momentum) - g * d(lr)) if nesterov else value + m
        values.append(value)
    return values


def adam_reference(value, grads, lr, beta_1, beta_2, epsilon, amsgrad):
    """Keras 3 Adam.update_step, out of place, in the variable's dtype."""
    d = value.dtype.type
    m = np.zeros_like(value)
    v = np.zeros_like(value)
    v_hat = np.zeros_like(value)
    values = []
    for step, g in enumerate(grads, start=1):
        g = g.astype(value.dtype)
        alpha = d(lr) * np.sqrt(d(1) - d(beta_2) ** d(step)) / (d(1) - d(beta_1) ** d(step))
        m = m + (g - m) * d(1 - beta_1)
        v = v + (g * g - v) * d(1 - beta_2)
        if amsgrad:
            v_hat = np.maximum(v_hat, v)
        denom = np.sqrt(v_hat if amsgrad else v) + d(epsilon)
        value = value - m * alpha / denom
        values.append(value)
    return values


def run(opt, init, grads, as_tensor=False):
    var = jt.Variable(init)
    values = []
    for g in grads:
        opt.apply_gradients([(jt.constant(g) if as_tensor else g, var)])
        values.append(var.numpy())
    return values


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("momentum, nesterov", [(0.0, False), (0.9, False), (0.9, True),
                                                (0.5, True)])
@pytest.mark.parametrize("shape", [(3, 4), ()])     # (): numpy scalars, updated apart
def test_sgd_matches_keras_formula(dtype, momentum, nesterov, shape):
    rng = np.random.default_rng(0)
    init = np.asarray(rng.normal(size=shape).astype(dtype))
    grads = [rng.normal(size=shape).astype(dtype) for _ in range(6)]
    opt = jt.optimizers.SGD(learning_rate=0.1, momentum=momentum, nesterov=nesterov)
    got = run(opt, init, grads, as_tensor=True)
    for g, e in zip(got, sgd_reference(init, grads, 0.1, momentum, nesterov)):
        assert g.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(g, e)
    assert opt.iterations == 6


def test_sgd_closed_form():
    w = jt.Variable(np.array([1.0, 2.0]))
    opt = jt.optimizers.SGD(learning_rate=0.5, momentum=0.5)
    for _ in range(2):
        opt.apply_gradients([(np.array([1.0, -1.0]), w)])
    # m1 = -0.5 g, m2 = 0.5 m1 - 0.5 g = -0.75 g; total = -1.25 g.
    np.testing.assert_allclose(w.numpy(), [1.0 - 1.25, 2.0 + 1.25])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("amsgrad", [False, True])
@pytest.mark.parametrize("shape", [(5,), ()])
def test_adam_matches_keras_formula(dtype, amsgrad, shape):
    rng = np.random.default_rng(1)
    init = np.asarray(rng.normal(size=shape).astype(dtype))
    grads = [np.asarray(rng.normal(scale=s, size=shape).astype(dtype)) for s in (1, 3, 0.1, 2, 1e-3, 1)]
    opt = jt.optimizers.Adam(learning_rate=0.01, amsgrad=amsgrad)
    got = run(opt, init, grads)
    expected = adam_reference(init, grads, 0.01, 0.9, 0.999, 1e-7, amsgrad)
    for g, e in zip(got, expected):
        assert g.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(g, e)


def test_adam_first_step_is_about_lr_times_sign():
    w = jt.Variable(np.array([1.0, -1.0, 0.5]))
    jt.optimizers.Adam(learning_rate=0.1).apply_gradients([(np.array([3.0, -0.2, 1e-3]), w)])
    np.testing.assert_allclose(w.numpy(), [0.9, -0.9, 0.4], rtol=1e-3)


@settings(max_examples=40, deadline=None)
@given(hnp.arrays(np.float64, hnp.array_shapes(min_dims=0, max_dims=3, max_side=4),
                  elements=st.floats(-1e3, 1e3)),
       st.sampled_from(DTYPES), st.floats(1e-4, 1.0), st.floats(0.0, 0.99), st.booleans())
def test_optimizers_any_shape(g64, dtype, lr, beta_1, amsgrad):
    init = np.ones(g64.shape, dtype)
    grads = [g64.astype(dtype), (-g64 / 2).astype(dtype)]
    adam = run(jt.optimizers.Adam(lr, beta_1=beta_1, amsgrad=amsgrad), init, grads)
    for g, e in zip(adam, adam_reference(init, grads, lr, beta_1, 0.999, 1e-7, amsgrad)):
        np.testing.assert_array_equal(g, e)
    sgd = run(jt.optimizers.SGD(lr, momentum=beta_1, nesterov=amsgrad), init, grads)
    for g, e in zip(sgd, sgd_reference(init, grads, lr, beta_1, amsgrad)):
        np.testing.assert_array_equal(g, e)


def test_slots_are_per_variable():
    a = jt.Variable(np.zeros(2))
    b = jt.Variable(np.zeros(2))
    opt = jt.optimizers.SGD(learning_rate=1.0, momentum=0.9)
    opt.apply_gradients([(np.ones(2), a), (-np.ones(2), b)])
    opt.apply_gradients([(np.ones(2), a), (-np.ones(2), b)])
    np.testing.assert_allclose(a.numpy(), [-2.9, -2.9])
    np.testing.assert_allclose(b.numpy(), [2.9, 2.9])


def test_learning_rate_schedule_receives_iterations():
    seen = []

    def schedule(step):
        seen.append(step)
        return 0.1 / (1 + step)

    w = jt.Variable(0.0)
    opt = jt.optimizers.SGD(learning_rate=schedule)
    for _ in range(3):
        opt.apply_gradients([(1.0, w)])
    assert seen == [0, 1, 2]
    np.testing.assert_allclose(float(w), -(0.1 + 0.05 + 0.1 / 3), rtol=1e-6)


def test_grad_dtype_is_cast_and_inputs_are_not_mutated():
    w = jt.Variable(np.ones(3, np.float32))
    before = w._value
    g = np.array([1.0, 2.0, 3.0])  # float64 gradient for a float32 variable
    g_copy = g.copy()
    opt = jt.optimizers.Adam(0.1)
    opt.apply_gradients([(g, w)])
    opt.apply_gradients([(g, w)])
    assert w.dtype == np.float32
    np.testing.assert_array_equal(g, g_copy)
    np.testing.assert_array_equal(before, np.ones(3, np.float32))


def test_none_gradients_are_skipped_with_a_warning():
    a, b = jt.Variable(1.0, name="a"), jt.Variable(1.0, name="b")
    opt = jt.optimizers.SGD(learning_rate=0.5)
    with pytest.warns(UserWarning, match=re.escape(repr([b.name]))):
        opt.apply_gradients(zip([jt.constant(1.0), None], [a, b]))
    assert float(a) == 0.5 and float(b) == 1.0
    assert opt.iterations == 1
    with pytest.raises(ValueError, match="No gradients"):
        opt.apply_gradients(zip([None, None], [a, b]))
    with pytest.raises(ValueError, match="No gradients"):
        opt.apply_gradients([])
    assert opt.iterations == 1


@pytest.mark.parametrize("make", [lambda: jt.optimizers.SGD(0.1, momentum=0.9),
                                  lambda: jt.optimizers.Adam(0.1)])
def test_shape_mismatch_is_rejected_before_any_update(make):
    good = jt.Variable(np.zeros(3), name="good")
    bad = jt.Variable(np.zeros((2, 2)), name="kernel")
    opt = make()
    opt.apply_gradients([(np.ones(3), good), (np.ones((2, 2)), bad)])
    state = (good.numpy(), bad.numpy(), opt.iterations)
    with pytest.raises(ValueError, match=r"kernel.*\(4,\).*\(2, 2\)"):
        opt.apply_gradients([(np.ones(3), good), (np.ones(4), bad)])
    np.testing.assert_array_equal(good.numpy(), state[0])
    np.testing.assert_array_equal(bad.numpy(), state[1])
    assert opt.iterations == state[2]
    # The slots are untouched too: the next step equals an uninterrupted run.
    opt.apply_gradients([(np.ones(3), good), (np.ones((2, 2)), bad)])
    fresh = jt.Variable(np.zeros(3))
    ref = make()
    for _ in range(2):
        ref.apply_gradients([(np.ones(3), fresh)])
    np.testing.assert_array_equal(good.numpy(), fresh.numpy())


def test_bad_pairs_and_arguments():
    w = jt.Variable(1.0)
    opt = jt.optimizers.SGD()
    with pytest.raises(TypeError, match="Variable"):
        opt.apply_gradients([(1.0, jt.constant(1.0))])
    with pytest.raises(TypeError, match="pairs"):
        opt.apply_gradients([w])
    with pytest.raises(TypeError, match="real"):
        opt.apply_gradients([("grad", w)])
    with pytest.raises(TypeError, match="learning_rate"):
        jt.optimizers.Adam(learning_rate="fast")
    with pytest.raises(ValueError, match="momentum"):
        jt.optimizers.SGD(momentum=1.5)
    assert float(w) == 1.0 and opt.iterations == 0


def test_seed_002_linear_regression():
    class LinearModel(jt.Module):
        def __init__(self):
            self.w = jt.Variable(2.0)
            self.b = jt.Variable(1.0)

        def __call__(self, x):
            return self.w * x + self.b

    model = LinearModel()
    x = jt.constant([1.0, 2.0, 3.0])
    y = jt.constant([3.0, 5.0, 7.0])
    optimizer = jt.optimizers.SGD(learning_rate=0.01)
    w, b = np.float32(2.0), np.float32(1.0)
    xs, ys = np.array([1, 2, 3], np.float32), np.array([3, 5, 7], np.float32)
    for _ in range(100):
        with jt.GradientTape() as tape:
            loss = jt.reduce_mean(jt.square(y - model(x)))
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        err = w * xs + b - ys
        w, b = w - np.float32(0.01) * np.mean(2 * err * xs), b - np.float32(0.01) * np.mean(2 * err)
    np.testing.assert_allclose([float(model.w), float(model.b)], [w, b], rtol=1e-5)


def test_adam_trains_a_dense_network():
    rng = np.random.default_rng(7)
    x = rng.normal(size=(64, 3)).astype(np.float32)
    y = (x @ np.array([[1.0], [-2.0], [0.5]], np.float32)) ** 2
    jt.random.set_seed(0)
    l1 = jt.layers.Dense(16, activation="relu")
    l2 = jt.layers.Dense(1)
    opt = jt.optimizers.Adam(0.01)
    losses = []
    for _ in range(200):
        with jt.GradientTape() as tape:
            loss = jt.reduce_mean(jt.square(l2(l1(x)) - y))
        params = l1.trainable_variables + l2.trainable_variables
        opt.apply_gradients(zip(tape.gradient(loss, params), params))
        losses.append(float(loss))
    assert losses[-1] < 0.1 * losses[0]
