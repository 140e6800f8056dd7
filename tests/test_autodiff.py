"""jt.autodiff.ForwardAccumulator: JVPs against tape.jacobian, nests, unconnected targets, nesting with
GradientTape (forward over reverse, reverse over forward), and bad input."""
import numpy as np
import pytest

import jitape as jt
from jitape.execute import source_jvps


def _rng(seed=0):
    return np.random.default_rng(seed)


def _jacobian_times(program, xs, vs):
    """J v from tape.jacobian of program(*xs), summed over the sources."""
    with jt.GradientTape(persistent=True) as tape:
        tape.watch(xs)
        y = program(*xs)
    total = np.zeros(y.shape)
    for x, v in zip(xs, vs):
        j = tape.jacobian(y, x, unconnected_gradients="zero").numpy().reshape(y.size, x.size)
        total += (j @ np.asarray(v).reshape(-1)).reshape(y.shape)
    return total


PROGRAMS = {
    "matmul": (lambda a, b: jt.matmul(a, b), [(3, 4), (4, 2)]),
    "tanh_mlp": (lambda x, w1, w2: jt.matmul(jt.tanh(jt.matmul(x, w1)), w2), [(5, 3), (3, 4), (4, 2)]),
    "reductions": (lambda x: jt.reduce_sum(jt.exp(x), axis=1) * jt.reduce_max(x) + jt.reduce_logsumexp(x, axis=0)[0],
                   [(3, 4)]),
    "new_primitives": (lambda x, y: jt.atan2(jt.sinh(x), jt.exp(y)) + jt.cumsum(jt.erf(x) * jt.lgamma(jt.exp(y)), 1,
                                                                                 reverse=True), [(2, 3), (2, 3)]),
    "scalar_chain": (lambda x: jt.sin(x) * x + 0.5 * jt.square(x), [()]),
}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_jvp_equals_jacobian_times_tangent(name):
    program, shapes = PROGRAMS[name]
    rng = _rng(1)
    xs = [jt.constant(rng.uniform(-1, 1, s)) for s in shapes]
    vs = [rng.uniform(-1, 1, s) for s in shapes]
    with jt.autodiff.ForwardAccumulator(xs, vs) as acc:
        y = program(*xs)
        inside = acc.jvp(y)
    outside = acc.jvp(y)
    expected = _jacobian_times(program, xs, vs)
    for got in (inside, outside):
        assert got.shape == y.shape and got.dtype == np.float64
        np.testing.assert_allclose(got.numpy(), expected, rtol=1e-10, atol=1e-12)


def test_jvp_float32_keeps_dtype():
    x = jt.constant([0.5, -1.0, 2.0])
    with jt.autodiff.ForwardAccumulator(x, jt.constant([1.0, 2.0, 3.0])) as acc:
        y = jt.tanh(x) * x
    jvp = acc.jvp(y)
    assert jvp.dtype == np.float32
    xv = np.array([0.5, -1.0, 2.0])
    np.testing.assert_allclose(jvp.numpy(), ((1 - np.tanh(xv) ** 2) * xv + np.tanh(xv)) * [1, 2, 3], rtol=1e-5)


def test_nested_primals_and_targets():
    rng = _rng(2)
    params = {"w": jt.constant(rng.normal(size=(3, 2))), "b": jt.constant(rng.normal(size=(2,)))}
    tangents = {"w": rng.normal(size=(3, 2)), "b": rng.normal(size=(2,))}
    x = jt.constant(rng.normal(size=(4, 3)))
    with jt.autodiff.ForwardAccumulator(params, tangents) as acc:
        h = jt.matmul(x, params["w"]) + params["b"]
        loss = jt.reduce_mean(jt.square(h))
    out = acc.jvp({"hidden": h, "pair": (loss, params["b"])})
    assert set(out) == {"hidden", "pair"} and isinstance(out["pair"], tuple)
    np.testing.assert_allclose(out["hidden"].numpy(), x.numpy() @ tangents["w"] + tangents["b"], rtol=1e-12)
    dh = x.numpy() @ tangents["w"] + tangents["b"]
    np.testing.assert_allclose(out["pair"][0].numpy(), np.mean(2 * h.numpy() * dh), rtol=1e-12)
    np.testing.assert_allclose(out["pair"][1].numpy(), tangents["b"])      # a primal's JVP is its tangent


def test_unconnected_target():
    x = jt.constant([1.0, 2.0])
    z = jt.constant([3.0, 4.0])
    with jt.autodiff.ForwardAccumulator(x, [1.0, 1.0]) as acc:
        y = z * 2.0
        w = x * 3.0
    assert acc.jvp(y) is None
    np.testing.assert_array_equal(acc.jvp(y, unconnected_gradients="zero").numpy(), [0.0, 0.0])
    none, connected = acc.jvp([y, w])
    assert none is None
    np.testing.assert_allclose(connected.numpy(), [3.0, 3.0])
    assert acc.jvp(jt.constant(5.0)) is None
    with pytest.raises(ValueError, match="unconnected_gradients"):
        acc.jvp(w, unconnected_gradients="zeros")


def test_variables_are_primals():
    v = jt.Variable([[1.0, 2.0], [3.0, 4.0]], dtype="float64")
    with jt.autodiff.ForwardAccumulator(v, np.ones((2, 2))) as acc:
        y = jt.reduce_sum(v * v, axis=0)
    np.testing.assert_allclose(acc.jvp(y).numpy(), [8.0, 12.0])


def test_compiled_helper_is_one_sweep_over_all_targets():
    x = jt.constant(np.linspace(-1, 1, 5))
    with jt.GradientTape(persistent=True) as tape:
        tape.watch(x)
        a = jt.sin(x)
        b = jt.reduce_sum(a * a)
    va, vb = source_jvps(tape, [a, b], [x], [np.ones(5)])
    np.testing.assert_allclose(va, np.cos(x.numpy()))
    np.testing.assert_allclose(vb, np.sum(2 * np.sin(x.numpy()) * np.cos(x.numpy())))


def test_forward_over_reverse_hessian_vector_product():
    rng = _rng(3)
    x = jt.constant(rng.normal(size=4))
    v = rng.normal(size=4)
    with jt.autodiff.ForwardAccumulator(x, v) as acc:
        with jt.GradientTape() as tape:
            tape.watch(x)
            y = jt.reduce_sum(jt.cosh(x) * jt.atan(x))
        g = tape.gradient(y, x)
    with jt.GradientTape(persistent=True) as h_tape:
        h_tape.watch(x)
        y = jt.reduce_sum(jt.cosh(x) * jt.atan(x))
    np.testing.assert_allclose(acc.jvp(g).numpy(), h_tape.hessian(y, x).numpy() @ v, rtol=1e-10)


def test_reverse_over_forward_is_differentiable():
    rng = _rng(4)
    x = jt.constant(rng.uniform(0.5, 1.5, 3))
    v = rng.normal(size=3)
    with jt.GradientTape() as tape:
        tape.watch(x)
        with jt.autodiff.ForwardAccumulator(x, v) as acc:
            y = jt.reduce_sum(jt.lgamma(x) * x)
        jvp = acc.jvp(y)                  # recorded: an enclosing tape is recording
    grad = tape.gradient(jvp, x)
    with jt.GradientTape(persistent=True) as h_tape:
        h_tape.watch(x)
        y = jt.reduce_sum(jt.lgamma(x) * x)
    hessian = h_tape.hessian(y, x).numpy()
    np.testing.assert_allclose(jvp.numpy(), h_tape.gradient(y, x).numpy() @ v, rtol=1e-10)
    np.testing.assert_allclose(grad.numpy(), hessian @ v, rtol=1e-10)


def test_errors():
    x = jt.constant([1.0, 2.0])
    with pytest.raises(ValueError, match="same nested structure"):
        jt.autodiff.ForwardAccumulator([x, x], [np.ones(2)])
    with pytest.raises(ValueError, match=r"tangents\[0\] has shape \(3,\), expected the primal's shape \(2,\)"):
        jt.autodiff.ForwardAccumulator(x, np.ones(3))
    with pytest.raises(TypeError, match=r"tangents\[0\] has dtype float64, expected the primal's dtype float32"):
        jt.autodiff.ForwardAccumulator(x, jt.constant(np.ones(2)))
    with pytest.raises(TypeError, match="primals\\[0\\] must be float32 or float64"):
        jt.autodiff.ForwardAccumulator(jt.constant([1, 2]), [1, 1])
    with pytest.raises(TypeError, match="must be a Tensor or Variable"):
        jt.autodiff.ForwardAccumulator(np.ones(2), np.ones(2))
    acc = jt.autodiff.ForwardAccumulator(x, np.ones(2))
    with pytest.raises(TypeError, match="expected a Tensor"):
        acc.jvp([x, "y"])


def test_an_unrelated_recording_tape_keeps_the_compiled_jvp():
    x = jt.constant([0.5, 1.5])
    with jt.GradientTape() as unrelated:
        unrelated.watch(jt.constant(1.0))
        with jt.autodiff.ForwardAccumulator(x, np.array([1.0, -1.0], np.float32)) as acc:
            y = jt.reduce_sum(jt.sinh(x) * x)
        jvp = acc.jvp(y)
    assert not unrelated._records
    expected = (np.sinh(x.numpy()) + x.numpy() * np.cosh(x.numpy())) @ np.array([1.0, -1.0])
    np.testing.assert_allclose(jvp.numpy(), expected, rtol=1e-6)
