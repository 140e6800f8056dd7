"""A jt.function called under recording tapes is one recorded op: every derivative of a tape around it (compiled
reverse, forward-mode and chunked Jacobians, Hessians, batch Jacobians, per-example gradients, the recorded path
of nested tapes) equals the one of the same computation recorded op by op, and recording it costs the same
Python calls whatever the function's length."""
import numpy as np
import pytest

import jitape as jt
from tests.test_newton import _three_nested_derivatives
from tests.test_tape import _count_python_calls


def _model(x, s, w, scale):
    """Per-row losses (B,) of x (B, 3) with a value-dependent mask, slices, a concat and a variable read."""
    h = jt.tanh(jt.matmul(x, w) * s * scale)
    h = jt.where(h > 0.1, h * h, -h)
    h = jt.concat([h[:, :2], jt.exp(h[:, 2:])], axis=1)
    return jt.reduce_sum(h * h, axis=1) + jt.reduce_max(h, axis=1) + jt.reduce_sum(jt.sin(x), axis=1)


def _tapes(fn, x, s, w, scale):
    """The derivatives of fn's losses taken on tapes, every path."""
    results = {}
    with jt.GradientTape(persistent=True) as tape:
        tape.watch([x, s])
        losses = fn(x, s, w, scale)
        total = jt.reduce_sum(losses)
        column = losses[:, None]
    results["value"] = losses
    results["gradient"] = tape.gradient(total, [x, s, w])
    results["jacobian reverse"] = tape.jacobian(losses, [x, w])
    results["jacobian forward"] = tape.jacobian(losses, s)
    results["batch jacobian"] = tape.batch_jacobian(column, x)
    results["per example"] = tape.per_example_gradients(losses, [w, s])
    results["hessian"] = tape.hessian(total, x)
    results["hvp"] = tape.hessian_vector_product(total, w, jt.ones_like(w))
    return results


def _assert_same(got, want, what):
    got, want = jt.nest.flatten(got), jt.nest.flatten(want)
    assert len(got) == len(want) and None not in got + want, what
    for a, b in zip(got, want):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-9, atol=1e-12, err_msg=what)


@pytest.mark.parametrize("seed", range(3))
def test_a_call_under_a_tape_differentiates_as_its_ops_recorded_one_by_one(seed, jacobian_budget):
    rng = np.random.default_rng(seed)
    x = jt.constant(rng.normal(size=(4, 3)))
    s = jt.constant(rng.uniform(0.5, 1.5))
    w = jt.Variable(rng.normal(size=(3, 4)))
    f = jt.function(_model)
    for budget in (None, 200):      # 200 bytes: Jacobians in chunks of a column or two
        if budget:
            jacobian_budget(budget)
        want = _tapes(_model, x, s, w, 0.7)
        for _ in range(2):      # the first call traces, the second replays
            got = _tapes(f, x, s, w, 0.7)
            for key in want:
                _assert_same(got[key], want[key], key)
    assert f.trace_count == 1


def test_nested_tapes_over_a_call_take_its_recorded_vjp_to_any_order():
    w = jt.Variable([1.5, 0.5, -2.0], dtype=jt.float64)
    f = jt.function(lambda x: jt.sin(x * w) * x * x)
    x = jt.constant([0.3, -1.2, 0.8], jt.float64)
    want = _three_nested_derivatives(f.python_function, x)
    for _ in range(2):
        for got, expected in zip(_three_nested_derivatives(f, x), want):
            np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=1e-12)


def test_a_call_that_takes_gradients_inside_is_differentiated_through_them():
    @jt.function
    def slope(x):
        with jt.GradientTape() as tape:
            tape.watch(x)
            y = jt.reduce_sum(x ** 3)
        return tape.gradient(y, x)

    x = jt.constant([1.0, -2.0], jt.float64)
    slope(x)        # replayed outside tapes: its gradient is a compiled step
    with jt.GradientTape() as tape:
        tape.watch(x)
        g = slope(x)
    np.testing.assert_allclose(g.numpy(), 3 * x.numpy() ** 2)
    np.testing.assert_allclose(tape.jacobian(g, x).numpy(), np.diag(6 * x.numpy()))


def test_a_guard_that_flips_under_a_tape_never_returns_the_stale_branch():
    @jt.function
    def f(x):
        if jt.reduce_sum(x) > 0:
            return jt.reduce_sum(x * x)
        return jt.reduce_sum(jt.sin(x))

    for values in ([1.0, 2.0], [-1.0, -2.0], [3.0, -1.0], [-3.0, 1.0]):
        x = jt.constant(values, jt.float64)
        with jt.GradientTape() as tape:
            tape.watch(x)
            y = f(x)
        want = 2 * x.numpy() if sum(values) > 0 else np.cos(x.numpy())
        np.testing.assert_allclose(tape.gradient(y, x).numpy(), want)
    assert f.trace_count == 2


def test_outputs_passed_through_constants_and_unconnected_inputs():
    @jt.function
    def f(x, y, n):
        return {"same": x, "scaled": x * float(n), "other": y * 2.0, "n": n, "fixed": jt.constant(1.0)}

    x, y = jt.constant([1.0, 2.0]), jt.constant([3.0])
    with jt.GradientTape(persistent=True) as tape:
        tape.watch(x)
        out = f(x, y, 3)
    assert out["n"] == 3
    np.testing.assert_allclose(tape.gradient(out["same"], x).numpy(), [1.0, 1.0])
    np.testing.assert_allclose(tape.gradient(out["scaled"], x).numpy(), [3.0, 3.0])
    assert tape.gradient(out["other"], x) is None
    assert tape.gradient(out["fixed"], x) is None


def test_a_recorded_derivative_after_the_call_assigned_a_variable_it_read_raises():
    w = jt.Variable([1.0, 2.0], dtype=jt.float64)
    f = jt.function(lambda x: jt.reduce_sum(w * x * x))
    x = jt.constant([0.5, 0.25], jt.float64)
    with jt.GradientTape() as outer:
        outer.watch(x)
        with jt.GradientTape() as inner:
            inner.watch(x)
            y = f(x)
        w.assign([5.0, 5.0])
        with pytest.raises(ValueError, match="variable .* was assigned after the call"):
            inner.gradient(y, x)
    # the compiled path differentiates the values the call read
    with jt.GradientTape() as tape:
        tape.watch(x)
        y = f(x)
    w.assign([7.0, 7.0])
    np.testing.assert_allclose(tape.gradient(y, x).numpy(), 2 * 5.0 * x.numpy())


def test_a_loaded_function_under_a_tape(tmp_path):
    f = jt.function(lambda x: jt.reduce_sum(jt.exp(x) * x))
    x = jt.constant([0.1, -0.4], jt.float64)
    f(x)
    jt.save(tmp_path / "f.npz", f)
    loaded = jt.load(tmp_path / "f.npz")
    with jt.GradientTape() as tape:
        tape.watch(x)
        y = loaded(x)
    xv = x.numpy()
    np.testing.assert_allclose(tape.gradient(y, x).numpy(), np.exp(xv) * (1 + xv))


def _chain(n):
    def chain(x):
        y = x
        for _ in range(n // 4):
            y = jt.sin(y) * x + 0.5 * y
        return jt.reduce_sum(y)
    return jt.function(chain)


def test_a_call_under_a_tape_costs_the_same_python_calls_whatever_its_length():
    x = jt.constant([0.3, 0.2], jt.float64)
    counts = {}
    for n in (1_000, 10_000):
        f = _chain(n)

        def record():
            with jt.GradientTape() as tape:
                tape.watch(x)
                y = f(x)
            return tape, y

        record()        # traces
        counts[n], (tape, y) = _count_python_calls(record)
        with jt.GradientTape() as eager:
            eager.watch(x)
            want = f.python_function(x)
        np.testing.assert_allclose(tape.gradient(y, x).numpy(), eager.gradient(want, x).numpy(), rtol=1e-12)
    assert counts[1_000] == counts[10_000], counts


def test_recorded_per_example_gradients_through_a_call():
    rng = np.random.default_rng(0)
    x = jt.constant(rng.normal(size=(4, 3)))
    w = jt.Variable(rng.normal(size=(3, 2)))
    f = jt.function(lambda x: jt.reduce_sum(jt.tanh(jt.matmul(x, w)), axis=1))

    def outer_gradient(fn):
        with jt.GradientTape() as outer:
            with jt.GradientTape() as tape:
                losses = fn(x)
            (per_example,) = tape.per_example_gradients(losses, [w])
            total = jt.reduce_sum(per_example * per_example)
        return per_example, outer.gradient(total, w)

    for got, want in zip(outer_gradient(f), outer_gradient(f.python_function)):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-12)


def test_forward_mode_over_a_call_compiled_and_recorded():
    f = jt.function(lambda x: jt.tanh(x * x) * jt.exp(x))
    x = jt.constant([0.3, -0.7, 1.1], jt.float64)
    v = np.array([1.0, -2.0, 0.5])

    def jvps(fn):
        with jt.GradientTape() as outer:
            outer.watch(x)
            with jt.autodiff.ForwardAccumulator(x, v) as acc:
                y = fn(x)
            jvp = acc.jvp(y)        # recorded: the outer tape tracks x
            total = jt.reduce_sum(jvp * jvp)
        with jt.autodiff.ForwardAccumulator(x, v) as acc:
            compiled = acc.jvp(fn(x))
        return jvp, outer.gradient(total, x), compiled

    want = jvps(f.python_function)
    for _ in range(2):
        for got, expected in zip(jvps(f), want):
            np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=1e-12)
