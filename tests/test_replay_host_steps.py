"""Hessians and Jacobians taken on inner tapes inside a jt.function: the trace records each as one host step
(replay.HOST_STEP_KINDS) that the replay stops at, runs with the compiled sweeps and resumes after. Replays equal
the eager derivatives (Newton steps, variables read and written, guards, large fused arrays, gradient, Hessian and
Jacobian steps together), functions differentiated from outside record VJPs instead, the Program stays a few rows
whatever the Hessian's size, and saved files keep their host steps (format 3), refuse crafted ones and still read
format 2."""
import json
import subprocess
import sys
import textwrap
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import jitape as jt
from jitape.replay import HOST_STEP_KINDS
from jitape_kernels import opcodes as oc
from jitape_kernels.layout import FUSE_MIN_SIZE
from tests.test_replay import _sgd_step
from tests.test_saving import _rewrite as _rewrite_file

L2 = 1e-3


def _variant(fn, shape=None):
    """The one traced variant of `fn` (or the one whose first argument has `shape`)."""
    found = [variants[0] for key, variants in fn._variants.items()
             if shape is None or key[1][0][1] == shape]
    (concrete,) = found
    return concrete


def _logistic_data(n, d, dtype, seed):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    y = (rng.uniform(size=n) < 1 / (1 + np.exp(-X @ rng.normal(size=d)))).astype(np.float64)
    return jt.constant(X.astype(dtype)), jt.constant(y.astype(dtype))


def _logistic_loss(X, y, w):
    d = w.shape[0]
    logits = jt.matmul(X, jt.reshape(w, (d, 1)))[:, 0]
    return jt.reduce_mean(jt.nn.sigmoid_cross_entropy_with_logits(labels=y, logits=logits)) \
        + L2 * jt.reduce_sum(w * w)


def _newton_step(X, y, w, eps=1e-6):
    """solve(H + eps I, g) of the logistic loss at w, from one persistent tape."""
    d = w.shape[0]
    with jt.GradientTape(persistent=True) as tape:
        tape.watch(w)
        loss = _logistic_loss(X, y, w)
    g = tape.gradient(loss, w)
    h = tape.hessian(loss, w)
    return jt.linalg.solve(h + eps * jt.eye(d, dtype=w.dtype), jt.reshape(g, (d, 1)))[:, 0]


def _newton_step_np(X, y, w, eps=1e-6):
    X, y, w = (np.asarray(a, np.float64) for a in (X, y, w))
    p = 1 / (1 + np.exp(-(X @ w)))
    g = X.T @ (p - y) / len(y) + 2 * L2 * w
    h = (X.T * (p * (1 - p))) @ X / len(y) + 2 * L2 * np.eye(len(w))
    return np.linalg.solve(h + eps * np.eye(len(w)), g)


@pytest.mark.parametrize("dtype,rtol", [(np.float64, 1e-12), (np.float32, 2e-4)])
def test_a_newton_step_with_a_tape_hessian_replays_equal_to_eager(dtype, rtol):
    step = jt.function(_newton_step)
    rng = np.random.default_rng(0)
    rows = {}
    for d in (5, 40):
        X, y = _logistic_data(200, d, dtype, seed=d)
        for _ in range(4):
            w = jt.constant((rng.normal(size=d) * 0.3).astype(dtype))
            got = step(X, y, w)
            expected = _newton_step(X, y, w)
            assert got.dtype == dtype and got.shape == (d,)
            np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=rtol, atol=rtol * 1e-3)
            np.testing.assert_allclose(got.numpy(), _newton_step_np(X.numpy(), y.numpy(), w.numpy()),
                                       rtol=1e-9 if dtype == np.float64 else 5e-3, atol=1e-6)
        concrete = _variant(step, X.shape)
        assert [(kind, len(pairs)) for _, kind, _, pairs, _ in concrete.host_steps] == [("hessian", 1)]
        assert len(concrete.gradient_steps) == 1
        rows[d] = concrete.code.shape[0]
    assert step.trace_count == 2
    assert rows[5] == rows[40], rows


def test_variables_read_inside_are_inputs_of_the_hessian_step():
    X, y = _logistic_data(120, 4, np.float64, seed=1)
    w = jt.Variable(np.zeros(4))

    def hessian():
        with jt.GradientTape() as tape:
            loss = _logistic_loss(X, y, w)
        return tape.hessian(loss, w)

    traced = jt.function(hessian)
    for value in ([0.0, 0.0, 0.0, 0.0], [0.5, -1.0, 2.0, 0.3], [3.0, 1.0, -2.0, 0.0]):
        w.assign(value)
        got = traced()
        np.testing.assert_allclose(got.numpy(), hessian().numpy(), rtol=1e-12, atol=1e-15)
        p = 1 / (1 + np.exp(-(X.numpy() @ np.array(value))))
        np.testing.assert_allclose(got.numpy(), (X.numpy().T * (p * (1 - p))) @ X.numpy() / 120
                                   + 2 * L2 * np.eye(4), rtol=1e-10)
    assert traced.trace_count == 1 and len(_variant(traced).host_steps) == 1


def test_ten_newton_iterations_in_a_function_equal_ten_eager_iterations():
    X, y = _logistic_data(200, 5, np.float64, seed=2)
    eager_w, traced_w = jt.Variable(np.zeros(5)), jt.Variable(np.zeros(5))

    def iteration(w):
        step = _newton_step(X, y, w)
        w.assign_sub(step)
        return jt.reduce_max(jt.abs(step))

    traced = jt.function(lambda: iteration(traced_w))
    for _ in range(10):
        expected = iteration(eager_w)
        got = traced()
        assert float(got) == pytest.approx(float(expected), rel=1e-9, abs=1e-15)
        np.testing.assert_allclose(traced_w.numpy(), eager_w.numpy(), rtol=1e-12, atol=1e-15)
    assert float(got) < 1e-10      # converged: the replays took the Newton steps of their own iterate
    w = traced_w.numpy()
    p = 1 / (1 + np.exp(-(X.numpy() @ w)))
    assert np.abs(X.numpy().T @ (p - y.numpy()) / 200 + 2 * L2 * w).max() < 1e-12
    assert traced.trace_count == 1 and len(_variant(traced).host_steps) == 1


def _coupled(x):
    """A scalar whose Hessian is dense: logsumexp of a fixed map of x, plus a quartic."""
    A = jt.constant(np.linspace(-1.0, 1.0, 3 * x.shape[0]).reshape(3, x.shape[0]), x.dtype)
    return jt.reduce_logsumexp(jt.matmul(A, jt.reshape(x, (-1, 1)))[:, 0]) + 0.25 * jt.reduce_sum(x ** 4)


def test_jt_hessian_called_inside_a_function_is_one_host_step():
    traced = jt.function(lambda x: jt.hessian(_coupled)(x) * 2.0)
    grad = jt.grad(_coupled)
    for values in ([0.3, -0.2, 1.0, 0.5], [1.5, 0.0, -0.7, 2.0], [-1.0, -1.0, 0.2, 0.1]):
        x = jt.constant(values, jt.float64)
        got = traced(x).numpy()
        np.testing.assert_allclose(got, 2.0 * jt.hessian(_coupled)(x).numpy(), rtol=1e-12, atol=1e-14)
        central = np.stack([(grad(x + e * 1e-5).numpy() - grad(x - e * 1e-5).numpy()) / 2e-5
                            for e in np.eye(4)])
        np.testing.assert_allclose(got, 2.0 * central, rtol=1e-6, atol=1e-8)
    concrete = _variant(traced)
    assert [kind for _, kind, _, _, _ in concrete.host_steps] == ["hessian"]
    assert traced.trace_count == 1 and concrete.code.shape[0] < 20


def _two_source_jacobian(a, b, c, M, N):
    with jt.GradientTape(persistent=True) as tape:
        tape.watch([a, b, c])
        y = jt.tanh(jt.matmul(M, jt.reshape(a, (-1, 1))))[:, 0] * jt.reduce_sum(jt.sin(b)) \
            + jt.matmul(N, jt.reshape(b * b, (-1, 1)))[:, 0]
    return tape.jacobian(y, [a, b, c]), tape.jacobian(y, [a, b, c], unconnected_gradients="zero")[2]


@pytest.mark.parametrize("n,p,q,forward", [(12, 2, 3, True), (2, 6, 4, False)])
def test_a_tape_jacobian_of_two_sources_is_one_host_step_in_either_mode(n, p, q, forward):
    """Forward mode where the target has more entries than the sources together (execute._forward_mode), else
    reverse mode with one cotangent column per target entry."""
    assert (p + q < n) == forward
    rng = np.random.default_rng(3)
    M, N = jt.constant(rng.normal(size=(n, p))), jt.constant(rng.normal(size=(n, q)))
    traced = jt.function(lambda a, b, c: _two_source_jacobian(a, b, c, M, N))
    for _ in range(3):
        a, b, c = (jt.constant(rng.normal(size=k)) for k in (p, q, 2))
        (ja, jb, jc), zeros = traced(a, b, c)
        (ea, eb, ec), _ = _two_source_jacobian(a, b, c, M, N)
        assert jc is None and ec is None
        np.testing.assert_array_equal(zeros.numpy(), np.zeros((n, 2)))
        np.testing.assert_allclose(ja.numpy(), ea.numpy(), rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(jb.numpy(), eb.numpy(), rtol=1e-12, atol=1e-14)
        an, bn = a.numpy(), b.numpy()
        central_a = [(_target_np(an + e, bn, M, N) - _target_np(an - e, bn, M, N)) / 2e-6 for e in np.eye(p) * 1e-6]
        central_b = [(_target_np(an, bn + e, M, N) - _target_np(an, bn - e, M, N)) / 2e-6 for e in np.eye(q) * 1e-6]
        np.testing.assert_allclose(ja.numpy(), np.stack(central_a, 1), rtol=1e-6, atol=1e-8)
        np.testing.assert_allclose(jb.numpy(), np.stack(central_b, 1), rtol=1e-6, atol=1e-8)
    concrete = _variant(traced)
    # the second call's connected Jacobians are no outputs: its host step is left out of the Program
    assert [(kind, len(pairs)) for _, kind, _, pairs, _ in concrete.host_steps] == [("jacobian", 2)]
    assert traced.trace_count == 1


def _target_np(a, b, M, N):
    return np.tanh(M.numpy() @ a) * np.sum(np.sin(b)) + N.numpy() @ (b * b)


def test_a_hessian_with_zero_second_derivatives_is_zeros_and_an_unconnected_one_none_as_eager():
    def f(x, z):
        with jt.GradientTape(persistent=True) as tape:
            tape.watch([x, z])
            linear = jt.reduce_sum(x * 3.0 + z)
            other = jt.sin(z)
            scalar_other = jt.reduce_sum(other)
        return tape.hessian(linear, x), tape.hessian(scalar_other, x), tape.jacobian(other, x)

    traced = jt.function(f)
    for values in ([1.0, 2.0], [3.0, -1.0]):
        x, z = jt.constant(values, jt.float64), jt.constant([0.5, 0.1], jt.float64)
        (zeros, none, unconnected), (eager_zeros, eager_none, eager_unconnected) = traced(x, z), f(x, z)
        np.testing.assert_array_equal(zeros.numpy(), np.zeros((2, 2)))
        np.testing.assert_array_equal(eager_zeros.numpy(), np.zeros((2, 2)))
        assert none is eager_none is unconnected is eager_unconnected is None
    assert [kind for _, kind, _, _, _ in _variant(traced).host_steps] == ["hessian"]


def test_a_flipped_guard_never_returns_the_stale_branchs_hessian():
    @jt.function
    def f(x):
        with jt.GradientTape() as tape:
            tape.watch(x)
            if jt.reduce_sum(x) > 0:
                y = jt.reduce_sum(x ** 3)
            else:
                y = jt.reduce_sum(jt.exp(x) * x[0])
        return tape.hessian(y, x)

    for values in ([1.0, 2.0], [-1.0, -2.0], [3.0, -1.0], [-4.0, 1.0], [0.5, 0.25], [-0.5, 0.2]):
        v = np.array(values)
        if v.sum() > 0:
            expected = np.diag(6 * v)
        else:
            expected = np.diag(np.exp(v) * v[0])
            expected[0, :] += np.exp(v)
            expected[:, 0] += np.exp(v)
        np.testing.assert_allclose(f(jt.constant(values, jt.float64)).numpy(), expected, rtol=1e-12)
    assert f.trace_count == 2
    assert all(len(c.host_steps) == 1 for variants in f._variants.values() for c in variants)


def test_a_guard_on_the_hessians_value_is_checked_after_the_host_step_computed_it():
    @jt.function
    def f(x):
        with jt.GradientTape() as tape:
            tape.watch(x)
            y = jt.reduce_sum(x ** 3) - jt.reduce_sum(x)
        h = tape.hessian(y, x)
        if jt.reduce_sum(h) > 0:
            return h * 2.0
        return -h

    for values in ([1.0, 2.0], [-1.0, -2.0], [3.0, -1.0], [-4.0, 1.0], [0.5, 0.25], [-0.5, 0.2], [2.0, 2.0]):
        h = np.diag(6 * np.array(values))
        expected = h * 2.0 if h.sum() > 0 else -h
        np.testing.assert_array_equal(f(jt.constant(values, jt.float64)).numpy(), expected)
    assert f.trace_count == 2


def test_a_function_calling_another_that_takes_a_hessian_inlines_its_host_step():
    inner = jt.function(lambda x: jt.hessian(lambda t: jt.reduce_sum(jt.exp(t) * t))(x))
    outer = jt.function(lambda x: inner(x) * 3.0 + inner(x * 2.0))
    for values in ([1.0, 2.0], [-1.0, 0.5], [0.3, -2.0]):
        x = np.array(values)
        expected = np.diag(3 * np.exp(x) * (x + 2) + np.exp(2 * x) * (2 * x + 2))
        np.testing.assert_allclose(outer(jt.constant(x)).numpy(), expected, rtol=1e-13)
    assert [kind for _, kind, _, _, _ in _variant(outer).host_steps] == ["hessian", "hessian"]
    assert outer.trace_count == 1 and inner.trace_count == 0


def _softplus_tanh_loss(X, w):
    s = jt.tanh(jt.matmul(X, jt.reshape(w, (-1, 1)))[:, 0])
    return jt.reduce_mean(jt.nn.softplus(s) + 0.5 * s * s)


def _softplus_tanh_hessian_np(X, w):
    s = np.tanh(X @ w)
    sig = 1 / (1 + np.exp(-s))
    ds, d2s = 1 - s * s, -2 * s * (1 - s * s)
    d2l = (sig * (1 - sig) + 1) * ds * ds + (sig + s) * d2s
    return (X.T * d2l) @ X / X.shape[0]


@pytest.mark.parametrize("kernel_runs", [None, 1])       # fused groups block by block, or generated kernels
def test_a_hessian_over_large_fused_intermediates_reads_the_values_the_run_layout_keeps(kernels_at, kernel_runs):
    kernels_at(kernel_runs)
    rng = np.random.default_rng(6)
    X = jt.constant(rng.normal(size=(20000, 4)) * 0.5)

    def hessian(X, w):
        with jt.GradientTape() as tape:
            tape.watch(w)
            loss = _softplus_tanh_loss(X, w)
        h = tape.hessian(loss, w)
        return h, jt.reduce_sum(jt.exp(jt.matmul(X, jt.reshape(w, (-1, 1)))) * 1e-3)

    traced = jt.function(hessian)
    for _ in range(3):
        w = jt.constant(rng.normal(size=4))
        (h, extra), (eh, eextra) = traced(X, w), hessian(X, w)
        np.testing.assert_allclose(h.numpy(), eh.numpy(), rtol=1e-11, atol=1e-14)
        np.testing.assert_allclose(h.numpy(), _softplus_tanh_hessian_np(X.numpy(), w.numpy()), rtol=1e-9,
                                   atol=1e-12)
        assert float(extra) == pytest.approx(float(eextra), rel=1e-12)
    concrete = _variant(traced)
    assert 20000 >= FUSE_MIN_SIZE and np.any(concrete._fused)
    assert bool(concrete._pending_kernels) == (kernel_runs is None)
    assert len(concrete.host_steps) == 1 and traced.trace_count == 1


@pytest.mark.parametrize("n,kernel_runs", [(3, None), (20000, None), (20000, 1)])
def test_a_variable_assigned_before_a_host_step_keeps_the_value_its_derivative_reads(kernels_at, n, kernel_runs):
    """The derivative's rows read v's old value (d sin(v x)/dx needs v): the write of v's new value must not
    take v's rows before the host step ran (n = 20000: the write runs in a fused group)."""
    kernels_at(kernel_runs)
    start = np.linspace(0.5, 1.5, n)
    v = jt.Variable(start)

    def f(x):
        with jt.GradientTape() as tape:
            tape.watch(x)
            loss = jt.reduce_sum(jt.sin(v * x[0]) + jt.sin(v * x[1]) * x[0])
        v.assign(v * 0.5 + 0.1)
        with jt.GradientTape() as second:
            second.watch(x)
            y = jt.sin(v * x[1]) + x[0]
        return tape.hessian(loss, x), jt.reduce_sum(second.jacobian(y, x), 0)

    traced = jt.function(f)
    for k in range(4):
        x = jt.constant([0.3, 0.7], jt.float64) * (k + 1.0)
        v.assign(start)
        expected = [t.numpy() for t in f(x)]
        expected_v = v.numpy()
        v.assign(start)
        got = [t.numpy() for t in traced(x)]
        for g, e in zip(got, expected):
            np.testing.assert_allclose(g, e, rtol=1e-12, atol=1e-12)
        np.testing.assert_array_equal(v.numpy(), expected_v)
    concrete = _variant(traced)
    assert [kind for _, kind, _, _, _ in concrete.host_steps] == ["hessian", "jacobian"]
    assert np.any(concrete._fused) == (n >= FUSE_MIN_SIZE) and traced.trace_count == 1


def _interleaved(x, a):
    """A gradient step, a Hessian step, forward rows over both, a Jacobian step whose target reads them, and a
    second Hessian step whose target reads every derivative before it."""
    with jt.GradientTape(persistent=True) as first:
        first.watch([x, a])
        y = jt.reduce_sum(jt.sin(x) * a) + 0.1 * jt.reduce_sum(x ** 4) + jt.reduce_prod(jt.cos(x * a))
    g = first.gradient(y, x)
    h = first.hessian(y, x)
    u = jt.matmul(h, jt.reshape(g, (-1, 1)))[:, 0] + jt.cos(g)
    with jt.GradientTape() as second:
        second.watch(a)
        v = jt.exp(u * 0.1) * jt.tanh(a) + a * a * jt.reduce_sum(u)
    j = second.jacobian(v, a)
    with jt.GradientTape() as third:
        third.watch(x)
        q = jt.reduce_sum(jt.sin(x) * u * x) + jt.reduce_sum(jt.matmul(j, jt.reshape(x ** 3, (-1, 1))))
    h2 = third.hessian(q, x)
    return jt.reduce_sum(h2 * h) + jt.reduce_sum(j * j), u, h2


def test_gradient_hessian_and_jacobian_steps_interleaved_with_rows_that_use_them():
    traced = jt.function(_interleaved)
    rng = np.random.default_rng(7)
    for _ in range(5):
        x, a = jt.constant(rng.normal(size=3)), jt.constant(rng.normal(size=3))
        for got, expected in zip(traced(x, a), _interleaved(x, a)):
            np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=1e-10, atol=1e-12)
    concrete = _variant(traced)
    assert [kind for _, kind, _, _, _ in concrete.host_steps] == ["hessian", "jacobian", "hessian"]
    assert len(concrete.gradient_steps) == 1 and traced.trace_count == 1
    positions = [step[0] for step in concrete.host_steps]
    assert positions == sorted(positions) and positions[0] < positions[-1]


def _hessian_inside(x):
    """sum(H * M) for H the Hessian of exp(a . x): (a' M a) exp(a . x)."""
    a = jt.constant([0.5, -0.3, 0.8], x.dtype)
    with jt.GradientTape() as tape:
        tape.watch(x)
        y = jt.exp(jt.reduce_sum(a * x))
    h = tape.hessian(y, x)
    return jt.reduce_sum(h * jt.constant(np.arange(9.0).reshape(3, 3), x.dtype))


def _hessian_inside_np(x):
    a, M = np.array([0.5, -0.3, 0.8]), np.arange(9.0).reshape(3, 3)
    c = a @ M @ a * np.exp(a @ x)
    return c, c * a, c * np.outer(a, a)


def test_a_function_with_a_host_step_under_an_outer_tape_records_its_differentiable_twin():
    f = jt.function(_hessian_inside)
    for values in ([0.2, -0.4, 1.0], [1.0, 0.5, -0.5], [0.0, 0.3, 0.1]):
        x = jt.constant(values, jt.float64)
        plain = f(x)
        with jt.GradientTape() as outer:
            outer.watch(x)
            s = f(x)
        got = outer.gradient(s, x)
        with jt.GradientTape() as outer:
            outer.watch(x)
            es = _hessian_inside(x)
        expected = outer.gradient(es, x)
        value, gradient, _ = _hessian_inside_np(np.array(values))
        assert float(plain) == float(s) == pytest.approx(float(es), rel=1e-12) == pytest.approx(value, rel=1e-12)
        np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=1e-12)
        np.testing.assert_allclose(got.numpy(), gradient, rtol=1e-12)
    assert len(_variant(f).host_steps) == 1
    twin = _variant(f._twin)
    assert twin.host_steps == [] and twin.gradient_steps == []
    assert f.trace_count == 2


def _inner_hessian(x):
    """The Hessian an inner tape takes, under whatever tapes record around it."""
    with jt.GradientTape() as inner:
        inner.watch(x)
        y = jt.reduce_sum(jt.exp(x) * jt.sin(x[::-1]))
    return inner.hessian(y, x)


def test_a_derivative_inside_that_an_inner_recording_tape_tracks_is_recorded_not_a_host_step():
    def tracked(x, z):
        with jt.GradientTape() as outer:
            outer.watch(x)
            h = _inner_hessian(x)
            s = jt.reduce_sum(h * h)
        return outer.gradient(s, x)

    def untracked(x, z):
        with jt.GradientTape() as unrelated:
            unrelated.watch(z)
            h = _inner_hessian(x)
            s = jt.reduce_sum(z * z)
        return h, unrelated.gradient(s, z)

    rng = np.random.default_rng(8)
    for python, host_steps, gradient_steps in ((tracked, [], 1), (untracked, ["hessian"], 1)):
        traced = jt.function(python)
        for _ in range(3):
            x, z = jt.constant(rng.normal(size=3)), jt.constant(rng.normal(size=2))
            got, expected = jt.nest.flatten(traced(x, z)), jt.nest.flatten(python(x, z))
            for g, e in zip(got, expected):
                np.testing.assert_allclose(g.numpy(), e.numpy(), rtol=1e-11, atol=1e-13)
        concrete = _variant(traced)
        assert [kind for _, kind, _, _, _ in concrete.host_steps] == host_steps, python.__name__
        assert len(concrete.gradient_steps) == gradient_steps and traced.trace_count == 1


def test_jt_grad_and_jt_hessian_of_a_function_taking_a_hessian_inside():
    f = jt.function(_hessian_inside)
    grad, hessian = jt.grad(f), jt.hessian(f)
    for values in ([0.2, -0.4, 1.0], [1.0, 0.5, -0.5]):
        x = jt.constant(values, jt.float64)
        with jt.GradientTape(persistent=True) as outer:
            outer.watch(x)
            s = _hessian_inside(x)
        _, gradient, second = _hessian_inside_np(np.array(values))
        np.testing.assert_allclose(grad(x).numpy(), outer.gradient(s, x).numpy(), rtol=1e-12)
        np.testing.assert_allclose(hessian(x).numpy(), outer.hessian(s, x).numpy(), rtol=1e-12)
        np.testing.assert_allclose(grad(x).numpy(), gradient, rtol=1e-12)
        np.testing.assert_allclose(hessian(x).numpy(), second, rtol=1e-12)
        assert float(f(x)) == pytest.approx(_hessian_inside_np(np.array(values))[0], rel=1e-12)
    assert len(_variant(f).host_steps) == 1


def test_a_60_by_60_hessian_is_one_host_step_of_a_short_program():
    rng = np.random.default_rng(9)
    A = rng.normal(size=(30, 60)) * 0.3

    def hessian(x):
        with jt.GradientTape() as tape:
            tape.watch(x)
            loss = jt.reduce_sum(jt.nn.softplus(jt.matmul(jt.constant(A), jt.reshape(x, (-1, 1))))) \
                + 0.25 * jt.reduce_sum(x ** 4)
        return tape.hessian(loss, x)

    traced = jt.function(hessian)
    for _ in range(3):
        x = rng.normal(size=60)
        got = traced(jt.constant(x)).numpy()
        np.testing.assert_allclose(got, hessian(jt.constant(x)).numpy(), rtol=1e-12, atol=1e-14)
        p = 1 / (1 + np.exp(-(A @ x)))
        np.testing.assert_allclose(got, (A.T * (p * (1 - p))) @ A + np.diag(3 * x ** 2), rtol=1e-10, atol=1e-12)
    concrete = _variant(traced)
    assert concrete.code.shape[0] < 30, concrete.code.shape[0]
    assert [kind for _, kind, _, _, _ in concrete.host_steps] == ["hessian"]


# -- a derivative's tape sees only what it recorded -------------------------------------------------------
def _derivative(tape, kind, z, loss, source):
    """The inner tape's derivative of `kind`: a gradient step, or a Hessian or Jacobian host step."""
    if kind == "gradient":
        return tape.gradient(loss, source)
    return tape.hessian(loss, source) if kind == "hessian" else tape.jacobian(z, source)


def _computed_before_the_tape(x, kind):
    y = jt.sin(x)
    with jt.GradientTape(persistent=True) as tape:
        tape.watch(x)
        z = y * x * x
        loss = jt.reduce_sum(z)
    return _derivative(tape, kind, z, loss, x)


def _computed_under_stop_recording(x, kind):
    with jt.GradientTape(persistent=True) as tape:
        tape.watch(x)
        with tape.stop_recording():
            y = jt.exp(x)
        z = y * x ** 3
        loss = jt.reduce_sum(z)
    return _derivative(tape, kind, z, loss, x)


@pytest.mark.parametrize("kind", ["gradient", "hessian", "jacobian"])
@pytest.mark.parametrize("python", [_computed_before_the_tape, _computed_under_stop_recording])
def test_a_value_the_inner_tape_did_not_record_is_a_constant_of_its_replayed_derivative(python, kind):
    """As in TensorFlow, the tape differentiates only what it recorded: y depends on x, but the tape did not
    record it, so the eager derivative treats y as a constant. The replay must too."""
    traced = jt.function(lambda x: python(x, kind))
    for values in ([0.3, 0.7], [1.3, -0.4], [-2.0, 0.5]):
        x = jt.constant(values, jt.float64)
        np.testing.assert_allclose(traced(x).numpy(), python(x, kind).numpy(), rtol=1e-12, atol=1e-14)
    assert traced.trace_count == 1


@pytest.mark.parametrize("kind", ["gradient", "hessian", "jacobian"])
def test_a_derivative_wrt_a_variable_assigned_after_its_tape_closed_is_taken_at_the_value_read(kind):
    """The tape recorded w**3 * x with w's old value and stopped; w is then assigned. The eager derivative is
    w.r.t. the value the tape read (6 w x on the diagonal, or 3 w² x); the replay must not differentiate w.r.t.
    w's new value, which the target does not depend on."""
    start = np.array([0.5, -1.0, 2.0])
    w = jt.Variable(start)

    def f(x):
        with jt.GradientTape() as tape:
            y = w ** 3 * x
            loss = jt.reduce_sum(y)
        w.assign(w * 0.5)
        return _derivative(tape, kind, y, loss, w)

    traced = jt.function(f)
    for scale in (1.0, 2.0, 3.0):
        x = jt.constant([0.3, 0.7, 1.1], jt.float64) * scale
        per_entry = (6 * start if kind == "hessian" else 3 * start ** 2) * x.numpy()
        expected = per_entry if kind == "gradient" else np.diag(per_entry)
        w.assign(start)
        np.testing.assert_allclose(f(x).numpy(), expected, rtol=1e-12)
        w.assign(start)
        np.testing.assert_allclose(traced(x).numpy(), expected, rtol=1e-12)
        np.testing.assert_array_equal(w.numpy(), start * 0.5)
    assert traced.trace_count == 1


# -- saving ------------------------------------------------------------------------------------------------
def _saved_model():
    """A function with a Hessian step, then rows over it, then a Jacobian step of two sources (forward mode: 8
    target entries, 5 source entries), reading a variable; and a scalar one with a Hessian step."""
    w = jt.Variable(np.array([0.4, -0.3, 0.8]))

    def model(x, a, b):
        with jt.GradientTape() as tape:
            tape.watch(x)
            loss = jt.reduce_sum(jt.nn.softplus(x * w) * jt.exp(0.1 * x)) + jt.reduce_prod(jt.cos(x))
        h = tape.hessian(loss, x)
        hx = jt.matmul(h, jt.reshape(x, (3, 1)))[:, 0]
        with jt.GradientTape() as second:
            second.watch([a, b])
            y = jt.tanh(jt.concat([hx * a[0], b * b * a[1], a * hx[:2]], 0))
        ja, jb = second.jacobian(y, [a, b])
        return {"h": h, "ja": ja, "jb": jb, "hx": hx}

    return w, model, jt.function(model), jt.function(lambda x: _hessian_inside(x) * jt.reduce_sum(w))


def _model_inputs(seed):
    rng = np.random.default_rng(seed)
    return [jt.constant(rng.normal(size=k)) for k in (3, 2, 3)]


def _results(out):
    return {k: out[k].numpy() for k in ("h", "ja", "jb", "hx")}


def _assert_results_equal(got, expected):
    for k in expected:
        np.testing.assert_allclose(got[k], expected[k], rtol=1e-12, atol=1e-14, err_msg=k)


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory):
    directory = tmp_path_factory.mktemp("host_steps")
    w, model, traced, scalar = _saved_model()
    traced(*_model_inputs(0))
    scalar(jt.constant([0.1, 0.2, 0.3], jt.float64))
    jt.save(directory / "model.npz", traced)
    jt.save(directory / "scalar.npz", scalar)
    return directory, w, model, traced, scalar


def test_a_saved_function_with_host_steps_replays_in_a_fresh_interpreter(saved_model, tmp_path):
    directory, w, model, traced, _ = saved_model
    concrete = _variant(traced)
    assert [(kind, len(pairs)) for _, kind, _, pairs, _ in concrete.host_steps] == [("hessian", 1), ("jacobian", 2)]
    inputs = _model_inputs(1)
    expected = _results(traced(*inputs))
    _assert_results_equal(expected, _results(model(*inputs)))
    np.savez(tmp_path / "inputs.npz", *[t.numpy() for t in inputs])
    np.savez(tmp_path / "expected.npz", **expected)
    script = textwrap.dedent(f"""
        import json, numpy as np, jitape as jt
        from jitape_kernels import opcodes as oc
        with np.load({str(directory / 'model.npz')!r}) as raw:
            meta = json.loads(str(raw["meta"]))
        assert meta["version"] == oc.FORMAT_VERSION == 3, meta["version"]
        loaded = jt.load({str(directory / 'model.npz')!r})
        with np.load({str(tmp_path / 'inputs.npz')!r}) as f:
            inputs = [jt.constant(f[k]) for k in sorted(f.files)]
        with np.load({str(tmp_path / 'expected.npz')!r}) as f:
            expected = {{k: f[k] for k in f.files}}
        for _ in range(3):
            out = loaded(*inputs)
            for k, want in expected.items():
                np.testing.assert_allclose(out[k].numpy(), want, rtol=1e-12, atol=1e-14, err_msg=k)
        print("replayed", len(expected))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "replayed 4" in done.stdout


def test_a_loaded_function_with_host_steps_replays_with_its_variables(saved_model):
    directory, w, model, traced, scalar = saved_model
    loaded = jt.load(directory / "model.npz")
    (lw,) = loaded.variables
    before = w.numpy()
    try:
        for value in (before, [1.0, 0.2, -0.5]):
            w.assign(value)
            lw.assign(value)
            for seed in (2, 3):
                inputs = _model_inputs(seed)
                expected = _results(model(*inputs))
                _assert_results_equal(_results(loaded(*inputs)), expected)
                _assert_results_equal(_results(traced(*inputs)), expected)
    finally:
        w.assign(before)
    assert [kind for _, kind, _, _, _ in _variant(loaded).host_steps] == ["hessian", "jacobian"]


def test_a_loaded_function_with_host_steps_cannot_be_differentiated(saved_model):
    directory, w, _, _, scalar = saved_model
    loaded = jt.load(directory / "scalar.npz")
    x = jt.constant([0.5, 0.1, -0.2], jt.float64)
    (lw,) = loaded.variables
    lw.assign(w.numpy())
    assert float(loaded(x)) == pytest.approx(float(scalar(x)), rel=1e-12)
    with pytest.raises(ValueError, match="takes derivatives inside with the compiled sweeps"):
        jt.grad(loaded)(x)
    with pytest.raises(ValueError, match="takes derivatives inside with the compiled sweeps"):
        with jt.GradientTape() as tape:
            tape.watch(x)
            loaded(x)
    assert float(loaded(x)) == pytest.approx(float(scalar(x)), rel=1e-12)


def _rewrite(path, out, edit):
    """Copy the file with `edit(meta)` applied to its JSON description and a fresh checksum: a crafted file."""
    return _rewrite_file(path, out, lambda arrays, meta: edit(meta))


def _steps(meta):
    return meta["variants"][0]["host_steps"]


def _edit_step(index, **changes):
    def edit(meta):
        step = _steps(meta)[index]
        for field, value in changes.items():
            place = ["position", "kind", "target", "pairs", "rows"].index(field)
            step[place] = value(step) if callable(value) else value
    return edit


def _swap_derivative_slots(meta):
    pairs = _steps(meta)[1][3]
    pairs[0][1], pairs[1][1] = pairs[1][1], pairs[0][1]


def _give_the_hessian_the_jacobians_rows(meta):
    """The Jacobian's tape recorded rows after the Hessian's position."""
    _steps(meta)[0][4] = _steps(meta)[1][4]


def _reverse_steps(meta):
    meta["variants"][0]["host_steps"] = _steps(meta)[::-1]


CRAFTED = {
    "unknown kind": (_edit_step(0, kind="gradient"), "host step of kind 'gradient'"),
    "kind as its row opcode": (_edit_step(0, kind=min(HOST_STEP_KINDS)), "host step of kind -9"),
    "a Hessian with two sources": (_edit_step(0, pairs=lambda s: s[3] * 2), "kind 'hessian' with 2 sources"),
    "a Jacobian without sources": (_edit_step(1, pairs=[]), "kind 'jacobian' with 0 sources"),
    "a Hessian of the wrong size": (_edit_step(0, pairs=lambda s: [[s[3][0][0], s[2]]]), "entries, its declared use 9"),
    "a Jacobian of the wrong size": (_swap_derivative_slots, "its declared use"),
    "target out of range": (_edit_step(0, target=10 ** 6), r"slot 1000000 out of range"),
    "source out of range": (_edit_step(1, pairs=lambda s: [[-1, s[3][0][1]], s[3][1]]), r"slot -1 out of range"),
    "derivative slot out of range": (_edit_step(0, pairs=lambda s: [[s[3][0][0], 10 ** 7]]), "out of range"),
    "position past the end": (_edit_step(1, position=10 ** 5), "step position 100000 out of range"),
    "negative position": (_edit_step(0, position=-1), "step position -1 out of range"),
    "position not an int": (_edit_step(0, position=2.0), "step position 2.0 out of range"),
    "rows not an array": (_edit_step(0, rows="nowhere"), "missing array 'nowhere'"),
    "rows past the position": (_give_the_hessian_the_jacobians_rows, "not ascending rows before its position"),
    "host steps out of order": (_reverse_steps, "host steps out of order"),
    "no host_steps in a version 3 file": (lambda m: m["variants"][0].pop("host_steps"), "inconsistent"),
}


@pytest.mark.parametrize("case", sorted(CRAFTED))
def test_crafted_host_steps_are_refused_when_loaded(saved_model, tmp_path, case):
    directory = saved_model[0]
    with np.load(directory / "model.npz") as raw:
        meta = json.loads(str(raw["meta"]))
    (hessian, jacobian) = _steps(meta)
    assert hessian[1] == "hessian" and jacobian[1] == "jacobian" and hessian[0] < jacobian[0]
    edit, message = CRAFTED[case]
    crafted = _rewrite(directory / "model.npz", tmp_path / "crafted.npz", edit)
    with pytest.raises(jt.ProgramFileError, match=message):
        jt.load(crafted)


def _retarget_the_hessian_to_its_source(meta):
    step = _steps(meta)[0]
    step[2] = step[3][0][0]


def _move_the_jacobian_to_the_hessians_position(meta):
    _steps(meta)[1][0] = _steps(meta)[0][0]


@pytest.mark.parametrize("edit", [_edit_step(0, position=0), _edit_step(1, position=0),
                                  _retarget_the_hessian_to_its_source, _move_the_jacobian_to_the_hessians_position],
                         ids=["hessian first", "jacobian first", "non-scalar hessian target", "jacobian moved up"])
def test_crafted_host_steps_the_loader_accepts_run_in_bounds(saved_model, tmp_path, edit):
    """Host steps moved or retargeted within the validated ranges compute nonsense, never out of bounds: the
    loaded function either raises ProgramFileError or returns finite values of the saved shapes."""
    crafted = _rewrite(saved_model[0] / "model.npz", tmp_path / "crafted.npz", edit)
    try:
        loaded = jt.load(crafted)
    except jt.ProgramFileError:
        return
    for seed in (5, 6):
        out = _results(loaded(*_model_inputs(seed)))
        assert {k: v.shape for k, v in out.items()} == {"h": (3, 3), "ja": (8, 2), "jb": (8, 3), "hx": (3,)}
        assert all(np.all(np.isfinite(v)) for v in out.values())


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(which=st.sampled_from(["code", "slots", "iattr", "rows"]), position=st.integers(0, 10 ** 6),
       value=st.sampled_from([-1, 0, 1, 2, 3, 7, 100, 10 ** 6, -(10 ** 6), 2 ** 62]))
def test_fuzz_crafted_files_with_steps_raise_or_run_in_bounds(saved_model, which, position, value,
                                                              tmp_path_factory):
    """An entry of the Program's arrays or of a step's rows set to any value (valid checksum): the file fails
    validation or runs, never out of bounds (bounds-checked in CI), whatever it computes."""
    def edit(arrays, meta):
        variant = meta["variants"][0]
        keys = ([step[-1] for step in variant["gradient_steps"] + variant["host_steps"]] if which == "rows"
                else [variant[which]])
        target = arrays[keys[position % len(keys)]]
        if target.size:
            target.reshape(-1)[position % target.size] = value

    crafted = _rewrite_file(saved_model[0] / "model.npz", tmp_path_factory.mktemp("c") / "c.npz", edit)
    try:
        loaded = jt.load(crafted)
    except jt.ProgramFileError:
        return
    try:
        loaded(*_model_inputs(7))
    except (ValueError, np.linalg.LinAlgError, ZeroDivisionError):
        pass        # a crafted file may compute nonsense, or raise a Python error; never read out of bounds


def test_an_untouched_rewrite_of_a_file_with_host_steps_still_loads(saved_model, tmp_path):
    directory, _, model, _, _ = saved_model
    loaded = jt.load(_rewrite(directory / "model.npz", tmp_path / "same.npz", lambda meta: None))
    inputs = _model_inputs(4)
    _assert_results_equal(_results(loaded(*inputs)), _results(model(*inputs)))


def test_a_format_2_file_without_host_steps_loads_and_replays(tmp_path):
    w = jt.Variable([0.5, -1.0, 2.0])
    step = _sgd_step(w)
    x = jt.constant([1.0, 2.0, 0.5])
    step(x)
    jt.save(tmp_path / "v3.npz", step)

    def as_version_2(meta):
        assert meta["version"] == 3
        meta["version"] = 2
        for variant in meta["variants"]:
            assert variant.pop("host_steps") == []
            for gradient_step in variant["gradient_steps"]:
                gradient_step.pop()         # version 2 steps have no rows: they differentiate every row before them

    loaded = jt.load(_rewrite(tmp_path / "v3.npz", tmp_path / "v2.npz", as_version_2))
    (lw,) = loaded.variables
    lw.assign(w.numpy())
    for _ in range(4):
        assert float(loaded(x)) == pytest.approx(float(step(x)), rel=1e-6)
        np.testing.assert_allclose(lw.numpy(), w.numpy(), rtol=1e-6)
    assert oc.READABLE_VERSIONS == (2, 3) and oc.FORMAT_VERSION == 3


# -- values computed twice are computed once ------------------------------------------------------------------
def test_jt_grad_and_jt_hessian_of_one_function_inside_a_function_share_its_rows_and_its_reverse_sweep():
    """jax.jit(newton)'s way: each of jt.grad(f) and jt.hessian(f) records f on a tape of its own; the Program
    computes f once (equal constants, such as each reduce_mean's count, are one) and the gradient comes from the
    Hessian step's cotangents."""
    X, y = _logistic_data(60, 5, np.float64, 3)
    f = lambda w: _logistic_loss(X, y, w)
    grad, hess = jt.grad(f), jt.hessian(f)
    shift = jt.constant(1e-3 * np.eye(5))

    def newton(w):
        g, h = grad(w), hess(w)
        return g, h, jt.linalg.solve(h + shift, jt.reshape(g, (5, 1)))[:, 0]

    traced = jt.function(newton)
    for seed in range(3):
        w = jt.constant(np.random.default_rng(seed).normal(size=5))
        for got, want in zip(traced(w), newton(w)):
            np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-12, atol=1e-15)
    concrete = _variant(traced)
    (gradient_step,), (hessian_step,) = concrete.gradient_steps, concrete.host_steps
    assert gradient_step[0] == hessian_step[0] and gradient_step[1] == hessian_step[2]
    np.testing.assert_array_equal(gradient_step[3], hessian_step[4])
    once = jt.function(lambda w: hess(w))
    once(w)
    assert concrete.code.shape[0] - _variant(once).code.shape[0] < 6, "f's rows recorded twice"


@pytest.mark.parametrize("kind", ["gradient", "hessian", "jacobian"])
def test_a_value_its_tape_took_as_a_constant_is_not_shared_with_the_same_value_it_recorded(kind):
    """y1 = sin(x) before the tape and y2 = sin(x) on it are equal values, but the tape differentiates only y2:
    d(y1 y2)/dx = y1 cos(x). Sharing one row between them would differentiate both."""
    def python(x):
        y1 = jt.sin(x)
        with jt.GradientTape(persistent=True) as tape:
            tape.watch(x)
            z = y1 * jt.sin(x)
            loss = jt.reduce_sum(z)
        return _derivative(tape, kind, z, loss, x)

    traced = jt.function(python)
    for values in ([0.3, 0.7], [1.3, -0.4]):
        x = jt.constant(values, jt.float64)
        np.testing.assert_allclose(traced(x).numpy(), python(x).numpy(), rtol=1e-12, atol=1e-14)


def test_a_watched_constant_is_not_shared_with_an_equal_constant():
    """c1 and c2 hold 2.0; the tape watches c1 only, so d(c1 x + c2 x²)/dc1 = x, not x + x²."""
    def python(x):
        c1, c2 = jt.constant(2.0, jt.float64), jt.constant(2.0, jt.float64)
        with jt.GradientTape() as tape:
            tape.watch(c1)
            loss = jt.reduce_sum(c1 * x + c2 * x * x)
        return tape.gradient(loss, c1)

    traced = jt.function(python)
    for values in ([0.5, 1.5], [2.0, -1.0]):
        x = jt.constant(values, jt.float64)
        assert float(traced(x)) == pytest.approx(float(python(x))) == pytest.approx(sum(values))


def test_rows_that_differ_in_attributes_shape_or_dtype_are_not_shared():
    """The same op of the same input with another axis, shape or dtype computes another value."""
    def python(x):
        with jt.GradientTape() as tape:
            tape.watch(x)
            loss = (jt.reduce_sum(jt.reduce_sum(x, axis=0) ** 2) + jt.reduce_sum(jt.reduce_sum(x, axis=1) ** 3)
                    + jt.reduce_sum(jt.reshape(x, (6,)) * jt.reshape(x, (6,)))
                    + jt.reduce_sum(jt.cast(jt.cast(x, jt.float32), jt.float64) * jt.cast(x, jt.float64)))
        return tape.gradient(loss, x), tape_hessian_of(x)

    def tape_hessian_of(x):
        with jt.GradientTape() as tape:
            tape.watch(x)
            loss = jt.reduce_sum(jt.reduce_sum(x, axis=0) ** 2) + jt.reduce_sum(jt.reduce_sum(x, axis=1) ** 3)
        return tape.hessian(loss, x)

    traced = jt.function(python)
    for seed in range(3):
        x = jt.constant(np.random.default_rng(seed).normal(size=(2, 3)))
        for got, want in zip(traced(x), python(x)):
            np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6, atol=1e-9)
