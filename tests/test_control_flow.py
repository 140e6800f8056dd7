"""jt.cond, jt.while_loop and jt.scan (jitape/control_flow.py): values against plain Python/numpy,
gradients through the iterations against central differences, nested tapes, and misuse."""
import collections

import numpy as np
import pytest

import jitape as jt


def central_difference(f, x0, h=1e-6):
    return (f(x0 + h) - f(x0 - h)) / (2 * h)


# -- cond --------------------------------------------------------------------------------------
@pytest.mark.parametrize("pred, expected", [(True, 6.0), (False, 9.0), (jt.constant(True), 6.0), (jt.constant(0.0), 9.0)])
def test_cond_runs_one_branch(pred, expected):
    x = jt.constant(3.0, jt.float64)
    calls = []
    out = jt.cond(pred, lambda: calls.append("t") or x * 2.0, lambda: calls.append("f") or x * x)
    assert float(out) == expected and len(calls) == 1


def test_cond_gradient_flows_through_the_branch_taken():
    x = jt.constant(3.0, jt.float64)
    with jt.GradientTape() as tape:
        tape.watch(x)
        y = jt.cond(x > 2.0, lambda: jt.sin(x) * x, lambda: x)
    assert float(tape.gradient(y, x)) == pytest.approx(np.cos(3.0) * 3.0 + np.sin(3.0), rel=1e-12)


def test_cond_errors():
    with pytest.raises(ValueError, match="scalar"):
        jt.cond(jt.constant([True, False]), lambda: 1, lambda: 2)
    with pytest.raises(TypeError, match="false_fn must be callable"):
        jt.cond(True, lambda: 1, None)


# -- while_loop --------------------------------------------------------------------------------
def _power_loop(x, n=4):
    """x ** (2 ** n) by repeated squaring, with the counter as a Python int."""
    return jt.while_loop(lambda i, y: i < n, lambda i, y: (i + 1, y * y), (0, x))[1]


def test_while_loop_values_match_python():
    i, total, parts = jt.while_loop(lambda i, t, p: t < 100.0,
                                    lambda i, t, p: (i + 1, t * 3.0, {"a": p["a"] + 1.0, "b": [p["b"][0] * 2.0]}),
                                    [0, jt.constant(1.0), {"a": jt.constant(0.0), "b": [jt.constant(1.0)]}])
    assert (i, float(total), float(parts["a"]), float(parts["b"][0])) == (5, 243.0, 5.0, 32.0)


def test_while_loop_single_variable_and_maximum_iterations():
    out = jt.while_loop(lambda v: v < 1000.0, lambda v: v * 2.0, jt.constant(1.0), maximum_iterations=3)
    assert float(out) == 8.0
    assert jt.while_loop(lambda v: True, lambda v: v + 1, 0, maximum_iterations=0) == 0


def test_while_loop_keeps_a_namedtuple():
    State = collections.namedtuple("State", "i value")
    (out,) = jt.while_loop(lambda s: s.i < 2, lambda s: (State(s.i + 1, s.value + 1.0),), (State(0, jt.constant(0.0)),))
    assert isinstance(out, State) and out.i == 2 and float(out.value) == 2.0
    with pytest.raises(ValueError, match="structure of loop_vars"):     # a plain tuple is not the namedtuple
        jt.while_loop(lambda s: s.i < 2, lambda s: ((s.i + 1, s.value),), (State(0, jt.constant(0.0)),))
    i, value = jt.while_loop(lambda i, v: i < 3, lambda i, v: State(i + 1, v * 2.0), State(0, jt.constant(1.0)))
    assert (i, float(value)) == (3, 8.0)


def test_while_loop_gradient_matches_central_differences():
    x0 = 1.1
    x = jt.constant(x0, jt.float64)
    with jt.GradientTape() as tape:
        tape.watch(x)
        y = _power_loop(jt.sin(x))
    expected = central_difference(lambda v: np.sin(v) ** 16, x0)
    assert float(tape.gradient(y, x)) == pytest.approx(expected, rel=1e-7)


def test_while_loop_second_derivative_through_nested_tapes():
    x0 = 0.7
    x = jt.constant(x0, jt.float64)
    with jt.GradientTape() as outer:
        outer.watch(x)
        with jt.GradientTape() as inner:
            inner.watch(x)
            y = _power_loop(x, n=2)            # x ** 4
        dy = inner.gradient(y, x)
    assert float(dy) == pytest.approx(4 * x0 ** 3, rel=1e-12)
    assert float(outer.gradient(dy, x)) == pytest.approx(12 * x0 ** 2, rel=1e-12)


def test_while_loop_value_dependent_iteration_count():
    """Newton's method for sqrt(a): the iteration count depends on a; d sqrt(a)/da = 1 / (2 sqrt(a))."""
    a = jt.constant(2.0, jt.float64)
    with jt.GradientTape() as tape:
        tape.watch(a)
        root = jt.while_loop(lambda r: jt.abs(r * r - a) > 1e-12, lambda r: 0.5 * (r + a / r), a)
    assert float(root) == pytest.approx(np.sqrt(2.0), rel=1e-14)
    assert float(tape.gradient(root, a)) == pytest.approx(1 / (2 * np.sqrt(2.0)), rel=1e-8)


def test_while_loop_errors():
    with pytest.raises(ValueError, match="structure of loop_vars"):
        jt.while_loop(lambda i, y: i < 2, lambda i, y: (i + 1,), (0, jt.constant(1.0)))
    with pytest.raises(ValueError, match="structure of loop_vars"):
        jt.while_loop(lambda i, y: i < 2, lambda i, y: (i + 1, [y]), (0, jt.constant(1.0)))
    with pytest.raises(TypeError, match="body must be callable"):
        jt.while_loop(lambda i: i < 2, None, [0])
    with pytest.raises(ValueError, match="scalar"):
        jt.while_loop(lambda v: v < 2.0, lambda v: v + 1.0, jt.constant([0.0, 1.0]))
    with pytest.raises(ValueError, match="maximum_iterations"):
        jt.while_loop(lambda v: v < 2, lambda v: v + 1, 0, maximum_iterations=-1)


# -- scan --------------------------------------------------------------------------------------
def test_scan_values_match_numpy():
    xs = np.array([1.0, -2.0, 3.0, 0.5])
    np.testing.assert_allclose(jt.scan(lambda acc, x: acc + x, jt.constant(xs)).numpy(), np.cumsum(xs))
    np.testing.assert_allclose(jt.scan(lambda acc, x: acc * x, jt.constant(xs), initializer=jt.constant(2.0)).numpy(),
                               2.0 * np.cumprod(xs))
    np.testing.assert_allclose(jt.scan(lambda acc, x: acc + x, jt.constant(xs), reverse=True).numpy(),
                               np.cumsum(xs[::-1])[::-1])


def test_scan_nested_elems_and_accumulator():
    a, b = np.array([1.0, 2.0, 3.0]), np.array([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]])
    out = jt.scan(lambda acc, e: (acc[0] + e[0], acc[1] * 2.0 + e[1]), (jt.constant(a), jt.constant(b)),
                  initializer=(jt.constant(0.0), jt.zeros(2)))
    np.testing.assert_allclose(out[0].numpy(), np.cumsum(a))
    expected, acc = [], np.zeros(2)
    for row in b:
        acc = acc * 2 + row
        expected.append(acc)
    np.testing.assert_allclose(out[1].numpy(), expected)
    assert isinstance(out, tuple) and out[1].shape == (3, 2)


def test_scan_gradient_matches_central_differences():
    """A linear recurrence h_t = tanh(w * h_(t-1) + x_t); d sum(h) / d w."""
    xs = np.array([0.3, -0.2, 0.5, 0.1])

    def loss(w):
        h, total = 0.0, 0.0
        for x in xs:
            h = np.tanh(w * h + x)
            total += h
        return total

    w = jt.constant(0.8, jt.float64)
    with jt.GradientTape() as tape:
        tape.watch(w)
        hs = jt.scan(lambda h, x: jt.tanh(w * h + x), jt.constant(xs), initializer=jt.constant(0.0, jt.float64))
        total = jt.reduce_sum(hs)
    assert float(total) == pytest.approx(loss(0.8), rel=1e-12)
    assert float(tape.gradient(total, w)) == pytest.approx(central_difference(loss, 0.8), rel=1e-7)


def test_scan_errors():
    with pytest.raises(ValueError, match="same leading dimension"):
        jt.scan(lambda acc, e: acc, (jt.zeros(2), jt.zeros(3)), initializer=jt.constant(0.0))
    with pytest.raises(ValueError, match="structure of the accumulator"):
        jt.scan(lambda acc, x: (acc, acc), jt.zeros(2), initializer=jt.constant(0.0))
    with pytest.raises(ValueError, match="no initializer"):
        jt.scan(lambda acc, x: acc, jt.zeros((0,)))
    assert jt.scan(lambda acc, x: acc + x, jt.zeros((0,)), initializer=jt.constant(1.0)).shape == (0,)
