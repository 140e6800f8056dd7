"""jt.grad, value_and_grad, jacobian, hessian and hessian_vector_product: equal to the tape's results on every
call (traced, replayed, replayed on new values), on nests, with aux, nested, and without planning again."""
import numpy as np
import pytest

import jitape as jt
import jitape.replay as replay_module
from tests.test_tape import _count_python_calls


def _loss(x, params):
    h = jt.tanh(jt.matmul(x, params["w"]) + params["b"])
    return jt.reduce_sum(h * h) + jt.reduce_sum(params["w"] ** 3)


def _tape_grads(x, params):
    with jt.GradientTape() as tape:
        tape.watch([x, params])
        y = _loss(x, params)
    return y, tape.gradient(y, params)


def _params(rng):
    return {"w": jt.constant(rng.normal(size=(3, 2))), "b": jt.constant(rng.normal(size=2))}


def test_grad_and_value_and_grad_of_nests_equal_the_tape_on_every_call():
    rng = np.random.default_rng(0)
    vg = jt.value_and_grad(_loss, argnums=1)
    g = jt.grad(_loss, argnums=1)
    for _ in range(3):
        x, params = jt.constant(rng.normal(size=(4, 3))), _params(rng)
        value, grads = vg(x, params)
        expected_value, expected = _tape_grads(x, params)
        assert float(value) == pytest.approx(float(expected_value), rel=1e-12)
        for key in ("w", "b"):
            np.testing.assert_allclose(grads[key].numpy(), expected[key].numpy(), rtol=1e-10)
            np.testing.assert_allclose(g(x, params)[key].numpy(), expected[key].numpy(), rtol=1e-10)


def test_argnums_tuples_has_aux_and_unconnected_arguments():
    def f(a, b, c):
        return jt.reduce_sum(a * a), {"double": a * 2.0}

    vg = jt.value_and_grad(f, argnums=(0, 2), has_aux=True)
    a, b, c = jt.constant([1.0, 2.0]), 5.0, jt.constant([3.0])
    for scale in (1.0, 3.0, -2.0, 0.5):       # traced, bound, then taken in the replay's call
        (value, aux), (ga, gc) = vg(a * scale, b, c)
        assert float(value) == pytest.approx(5.0 * scale ** 2)
        np.testing.assert_allclose(aux["double"].numpy(), [2.0 * scale, 4.0 * scale])
        np.testing.assert_allclose(ga.numpy(), [2.0 * scale, 4.0 * scale])
        np.testing.assert_array_equal(gc.numpy(), [0.0])


def test_gradients_of_scalars_keep_their_dtypes_on_every_call():
    g = jt.grad(lambda x, y, z: x * y + jt.reduce_sum(z) * y, argnums=(0, 1, 2))
    for scale in (1.0, 2.0, 3.0, 4.0):
        x, y = jt.constant(np.float32(scale)), jt.constant(np.float64(2.0))     # a float64 arena
        z = jt.constant(np.full(3, scale, np.float32))
        gx, gy, gz = g(x, y, z)
        assert (gx.dtype, gy.dtype, gz.dtype) == (np.float32, np.float64, np.float32)
        assert (float(gx), float(gy)) == (2.0, scale + 3 * scale) and gz.numpy().tolist() == [2.0] * 3


def test_jacobian_hessian_and_hvp_equal_the_tape():
    rng = np.random.default_rng(2)
    f = lambda x: jt.reduce_sum(jt.exp(x[:2] * x[1:]) * x[0])     # noqa: E731
    vector = lambda x: jt.sin(x) * jt.reduce_sum(x)                # noqa: E731
    jac, hes, hvp = jt.jacobian(vector), jt.hessian(f), jt.hessian_vector_product(f)
    for _ in range(3):
        x = jt.constant(rng.normal(size=3))
        v = rng.normal(size=3)
        with jt.GradientTape(persistent=True) as tape:
            tape.watch(x)
            y, s = vector(x), f(x)
        np.testing.assert_allclose(jac(x).numpy(), tape.jacobian(y, x).numpy(), rtol=1e-6)
        np.testing.assert_allclose(hes(x).numpy(), tape.hessian(s, x).numpy(), rtol=1e-5)
        np.testing.assert_allclose(hvp(v, x).numpy(), tape.hessian_vector_product(s, x, v).numpy(), rtol=1e-5)


def test_hvp_replays_new_vectors_and_points_and_agrees_with_the_tape_and_a_loaded_function(tmp_path):
    # the replay of the traced tape HVP (v an input, never a traced constant), a kwarg, v cast to the argument's
    # dtype, zeros for an argument f does not read, the loaded function's sweeps, and under an outer tape v's
    # own derivative (H symmetric: d sum(H v) / dv = H 1)
    rng = np.random.default_rng(7)

    def f(x, y, scale=1.0):
        return jt.reduce_sum(jt.tanh(x * y) ** 3) * scale + jt.reduce_sum(y * y)

    hvp = jt.hessian_vector_product(f)
    loaded_path = tmp_path / "f.npz"
    for step in range(4):
        x, y = jt.constant(rng.normal(size=4)), jt.constant(rng.normal(size=4))
        v = rng.normal(size=4)
        with jt.GradientTape(persistent=True) as tape:
            tape.watch(x)
            s = f(x, y, scale=2.0)
        want = tape.hessian_vector_product(s, x, v).numpy()
        got = hvp(jt.constant(v.astype(np.float32)), x, y, scale=2.0)
        assert got.dtype == np.float64 and got.shape == (4,)
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-6)       # v rounded to float32, then cast
        np.testing.assert_allclose(hvp(list(v), x, y, scale=2.0).numpy(), want, rtol=1e-12, atol=1e-14)
        unread = jt.hessian_vector_product(lambda a, b: jt.reduce_sum(b * b), argnums=0)(v, x, y)
        assert unread.dtype == np.float64 and unread.numpy().tolist() == [0.0] * 4
        if step == 0:
            traced = jt.function(lambda a, b: f(a, b, scale=2.0))
            traced(x, y)
            jt.save(loaded_path, traced)
        loaded = jt.load(loaded_path)
        np.testing.assert_allclose(jt.hessian_vector_product(loaded)(v, x, y).numpy(), want, rtol=1e-12, atol=1e-14)
        vt = jt.constant(v)
        with jt.GradientTape() as outer:
            outer.watch(vt)
            total = jt.reduce_sum(hvp(vt, x, y, scale=2.0))
        np.testing.assert_allclose(outer.gradient(total, vt).numpy(), tape.hessian(s, x).numpy().sum(0), rtol=1e-12)
        with jt.GradientTape() as outer:        # under a recording tape, an unread argument's HVP: zeros too
            outer.watch(y)
            assert jt.hessian_vector_product(lambda a, b: jt.reduce_sum(b * b))(v, x, y).numpy().tolist() == [0.0] * 4


def test_an_hvp_that_retraces_warns_naming_the_function_and_keeps_its_settings():
    def cubes(x):
        return jt.reduce_sum(x ** 3)

    hvp = jt.hessian_vector_product(jt.function(cubes, retrace_warning=2))
    with pytest.warns(UserWarning, match=r"'hessian_vector_product\(cubes\)' traced 3 times"):
        for n in range(1, 4):
            np.testing.assert_allclose(hvp(np.ones(n), jt.constant(np.full(n, 2.0))).numpy(), np.full(n, 12.0))


def test_grad_of_grad_and_grad_under_a_tape():
    f = lambda x: jt.reduce_sum(x ** 4)     # noqa: E731
    second = jt.grad(lambda x: jt.reduce_sum(jt.grad(f)(x)))
    x = jt.constant([1.0, -2.0], jt.float64)
    np.testing.assert_allclose(second(x).numpy(), 12 * x.numpy() ** 2)
    with jt.GradientTape() as tape:
        tape.watch(x)
        g = jt.grad(f)(x)
    np.testing.assert_allclose(tape.jacobian(g, x).numpy(), np.diag(12 * x.numpy() ** 2))


def test_repeated_calls_plan_once_and_cost_the_same_python_calls_whatever_the_length(monkeypatch):
    planned = []
    real = replay_module.derivative_plan
    monkeypatch.setattr(replay_module, "derivative_plan", lambda *a: planned.append(1) or real(*a))

    def chain(n):
        def f(x):
            for _ in range(n):
                x = jt.sin(x) * 0.5 + x
            return jt.reduce_sum(x)
        return jt.grad(f)

    counts = {}
    for n in (500, 5_000):
        g = chain(n)
        x = jt.constant([0.1, 0.2])
        g(x)
        g(x)
        counts[n], _ = _count_python_calls(lambda: g(x))
    assert counts[500] == counts[5_000], counts
    assert len(planned) == 2        # once per function


def test_errors_name_the_argument():
    with pytest.raises(TypeError, match="argument 0 must hold float"):
        jt.grad(lambda n: n * 1.0)(3)
    with pytest.raises(TypeError, match="float scalar"):
        jt.grad(lambda x: x * 2.0)(jt.constant([1.0, 2.0]))
    with pytest.raises(ValueError, match="argnums 2 out of range"):
        jt.grad(lambda x: x, argnums=2)(jt.constant(1.0))


def test_variables_as_differentiated_arguments():
    w = jt.Variable([1.0, 2.0])
    unused = jt.Variable([5.0])
    g = jt.grad(lambda w, u: jt.reduce_sum(w ** 3), argnums=(0, 1))
    for values in ([1.0, 2.0], [3.0, -1.0]):
        w.assign(values)
        gw, gu = g(w, unused)
        np.testing.assert_allclose(gw.numpy(), 3 * np.array(values) ** 2)
        np.testing.assert_array_equal(gu.numpy(), [0.0])
    np.testing.assert_allclose(jt.hessian(lambda w: jt.reduce_sum(w ** 3))(w).numpy(), np.diag([18.0, -6.0]))


def test_after_two_calls_a_variant_takes_the_gradient_in_its_replay_call_and_guards_still_choose(monkeypatch):
    """From a variant's second call on, value_and_grad binds the reverse sweep as the replay's last step: the
    same numbers as the tape, zeros for an argument f never reads, and a guard that flips still retraces."""
    taken = []
    real = replay_module.Concrete.gradients
    monkeypatch.setattr(replay_module.Concrete, "gradients", lambda self, *a: taken.append(1) or real(self, *a))

    def f(x, unused, w):
        y = jt.reduce_sum(x * x * w)
        if y > 1.0:         # a guard: every replay checks the branch its variant took
            return y * 3.0 + jt.reduce_sum(w)
        return jt.sin(y)

    vg = jt.value_and_grad(f, argnums=(0, 1, 2))
    rng = np.random.default_rng(3)
    w = jt.Variable(rng.normal(size=3))
    for i in range(9):
        x = jt.constant(rng.normal(size=3) * (2.0 if i % 4 < 2 else 0.1))
        unused = jt.constant(rng.normal(size=(2, 2)))
        w.assign(rng.normal(size=3))
        value, (gx, gu, gw) = vg(x, unused, w)
        with jt.GradientTape() as tape:
            tape.watch([x, w])
            expected = f(x, unused, w)
        ex, ew = tape.gradient(expected, [x, w])
        assert float(value) == pytest.approx(float(expected), rel=1e-12)
        np.testing.assert_allclose(gx.numpy(), ex.numpy(), rtol=1e-12)
        np.testing.assert_allclose(gw.numpy(), ew.numpy(), rtol=1e-12)
        np.testing.assert_array_equal(gu.numpy(), np.zeros((2, 2)))
        assert gx.dtype == x.dtype and gu.shape == (2, 2)
    assert len(taken) >= 4      # each branch's variant: traced, replayed and bound, then taken in the call


def test_grad_of_a_loaded_function_on_every_call(tmp_path):
    f = jt.function(lambda x: jt.reduce_sum(jt.sin(x) * x))
    f(jt.constant([0.1, 0.2, 0.3]))
    jt.save(tmp_path / "f.npz", f)
    dg = jt.grad(jt.load(tmp_path / "f.npz"))
    for scale in range(1, 5):      # traced variant loaded; plain replay then bound; then the gradient in the call
        x = np.array([0.1, 0.2, 0.3], np.float32) * scale
        np.testing.assert_allclose(dg(jt.constant(x)).numpy(), np.sin(x) + x * np.cos(x), rtol=1e-6)


@pytest.mark.parametrize("n_out, argnums", [(2, (0, 1, 2)), (5, 0)])    # (5, 0): 5 outputs of 3 inputs, forward
def test_jacobians_on_every_call_in_the_replay_call_when_one_reverse_sweep(monkeypatch, n_out, argnums):
    taken = []
    real = replay_module.Concrete.gradients
    monkeypatch.setattr(replay_module.Concrete, "gradients", lambda self, *a: taken.append(1) or real(self, *a))

    def f(x, unused, w):
        y = jt.tanh(jt.matmul(w, x)) * x[0]
        return y if jt.reduce_sum(x) > 0 else -y       # a guard on the comparison

    jac = jt.jacobian(f, argnums=argnums)
    rng = np.random.default_rng(5)
    for i in range(8):
        x = jt.constant(rng.normal(size=3) + (1.0 if i % 3 else -1.0))
        unused = jt.constant(rng.normal(size=1))
        w = jt.constant(rng.normal(size=(n_out, 3)))
        found = jac(x, unused, w)
        with jt.GradientTape(persistent=True) as tape:
            tape.watch([x, w])
            y = f(x, unused, w)
        jx = found[0] if argnums != 0 else found
        np.testing.assert_allclose(jx.numpy(), tape.jacobian(y, x).numpy(), rtol=1e-12)
        assert jx.shape == (n_out, 3)
        if argnums != 0:
            np.testing.assert_allclose(found[2].numpy(), tape.jacobian(y, w).numpy(), rtol=1e-12)
            np.testing.assert_array_equal(found[1].numpy(), np.zeros((n_out, 1)))
    assert (len(taken) >= 3) == (argnums != 0)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_large_replayed_gradients_are_read_only_views_that_keep_their_values(dtype):
    """A jt.grad replay lends its large gradients from its adjoint buffer (no copy); while one lives, later calls
    take a fresh buffer, so every gradient keeps the values it was returned with. Small ones are copies."""
    from jitape.tensor import VIEWS_FROM
    n = VIEWS_FROM + 5
    rng = np.random.default_rng(4)
    inputs = [jt.constant(rng.standard_normal(n).astype(dtype)) for _ in range(4)]
    expected = [np.exp(x.numpy() - x.numpy().max()) / np.sum(np.exp(x.numpy() - x.numpy().max())) for x in inputs]
    g = jt.grad(lambda v, w: jt.reduce_logsumexp(v) + jt.reduce_sum(w * w))
    small = jt.constant(np.arange(3.0, dtype=dtype))
    results = [g(x, small) for x in inputs] + [g(inputs[0], small)]     # from the second call on: lent
    held = results[1:3]
    del results
    again = [g(x, small) for x in inputs[1:3]]
    for got, x, want in zip(held + again, inputs[1:3] * 2, expected[1:3] * 2):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-5 if dtype == "float32" else 1e-12)
    assert not held[0]._value.flags.writeable and held[0]._value.base is not None
    both = jt.grad(lambda v, w: jt.reduce_logsumexp(v) + jt.reduce_sum(w * w), argnums=(0, 1))
    for _ in range(3):
        large, tiny = both(inputs[0], small)
    assert not large._value.flags.writeable and tiny._value.flags.writeable      # a view, and a copy of its own
    assert tiny.numpy().tolist() == [0.0, 2.0, 4.0] and not np.shares_memory(large._value, tiny._value)


def test_a_replay_whose_lent_gradients_are_dropped_keeps_its_buffer():
    """Counting the buffer's references finds no lent gradient alive in a loop that drops them: no new buffer per
    call (a weak reference to the buffer, which counts for nothing, tells)."""
    import weakref
    from jitape.tensor import VIEWS_FROM
    f = replay_module.Function(lambda v: jt.reduce_logsumexp(v), differentiated=True)
    g = jt.grad(f)
    x = jt.constant(np.linspace(-1.0, 1.0, VIEWS_FROM + 1))
    g(x)
    g(x)
    (concrete,) = [c for variants in f._variants.values() for c in variants]

    def buffer():
        (entry,) = concrete._gradient_rows.values()
        return weakref.ref(entry[0])

    bound = buffer()
    for _ in range(3):
        g(x)
    assert buffer()() is bound() is not None
    kept = g(x)
    g(x)
    assert bound() is not None and buffer()() is not bound()      # kept lives on in the first buffer
    np.testing.assert_allclose(kept.numpy(), np.exp(x.numpy()) / np.sum(np.exp(x.numpy())), rtol=1e-12)


def test_a_grad_s_first_call_binds_only_the_replay_its_later_calls_run():
    """A traced variant of jt.grad binds its gradient's replay, which later calls run, and no plain replay
    (Function.replay's bound_later); one whose gradient is not bound (f's value does not depend on the trace's
    inputs) binds its plain replay at its second call, and every call's gradient is right."""
    x = jt.constant(np.linspace(0.1, 1.0, 5))
    bound = replay_module.Function(lambda x: jt.reduce_sum(jt.sin(x) * x), differentiated=True)
    grad = jt.grad(bound)
    want = np.sin(x.numpy()) + x.numpy() * np.cos(x.numpy())
    np.testing.assert_allclose(grad(x).numpy(), want, rtol=1e-14)
    (concrete,) = [c for variants in bound._variants.values() for c in variants]
    assert list(concrete._replayers) == [(jt.config.backend, ("value_and_grad", (0,)))]
    for _ in range(2):
        np.testing.assert_allclose(grad(x).numpy(), want, rtol=1e-14)
    unbound = replay_module.Function(lambda x: jt.constant(2.0, dtype=x.dtype) * 3.0, differentiated=True)
    value_and_grad = jt.value_and_grad(unbound)
    for calls in range(1, 4):
        value, g = value_and_grad(x)
        assert float(value) == 6.0 and np.array_equal(g.numpy(), np.zeros(5))
        (concrete,) = [c for variants in unbound._variants.values() for c in variants]
        assert list(concrete._replayers) == ([] if calls == 1 else [jt.config.backend])
