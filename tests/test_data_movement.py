"""TRANSPOSE, SLICE and PAD on every kernel path (runs along a contiguous last axis, matrix transposes in
tiles, and index maps; slices and concats of one short run, which the scalar loops move), broadcasts (a
scalar's, short rows', long rows', along a last or middle axis), reductions and running sums over contiguous
and strided axes on their K = 1 and K-column paths, and MAX/MIN's eight-lane forward, against numpy: replayed
values, gradients (K = 1), HVPs (one tangent column and the second-order rules) and Jacobians (K columns), for
last axes shorter and longer than a run and than a transpose's tile."""
import numpy as np
import pytest

import jitape as jt
from jitape import execute
from jitape_kernels.cpu.workspace import LANES

CASES = [
    ("transpose keeps the last axis", lambda t: jt.transpose(t, (1, 0, 2)), lambda a: np.transpose(a, (1, 0, 2))),
    ("transpose moves the last axis", lambda t: jt.transpose(t, (2, 0, 1)), lambda a: np.transpose(a, (2, 0, 1))),
    ("transpose swaps the last two", lambda t: jt.transpose(t, (0, 2, 1)), lambda a: np.transpose(a, (0, 2, 1))),
    ("transpose reverses the axes", lambda t: jt.transpose(t, (2, 1, 0)), lambda a: np.transpose(a, (2, 1, 0))),
    ("transpose over a unit axis", lambda t: jt.transpose(t[:, 1:2], (2, 1, 0)),
     lambda a: np.transpose(a[:, 1:2], (2, 1, 0))),
    ("contiguous slice", lambda t: t[1:, ::2, 1:], lambda a: a[1:, ::2, 1:]),
    ("strided slice", lambda t: t[:, 1:, ::2], lambda a: a[:, 1:, ::2]),
    ("dropped axis", lambda t: t[1, :, 2:], lambda a: a[1, :, 2:]),
    ("pad", lambda t: jt.pad(t, [[1, 0], [0, 2], [3, 1]]), lambda a: np.pad(a, [[1, 0], [0, 2], [3, 1]])),
    # one contiguous run (the sweeps' scalar loops move runs of up to 16 entries without views)
    ("a run within a row", lambda t: t[1, 2, 1:3], lambda a: a[1, 2, 1:3]),
    ("a run of whole rows", lambda t: t[1, 1:3], lambda a: a[1, 1:3]),
    ("a reversed row", lambda t: t[1, 2, ::-1], lambda a: a[1, 2, ::-1]),
    ("concat of runs", lambda t: jt.concat([t[0, 0, :2], t[2, 1, 1:]], 0),
     lambda a: np.concatenate([a[0, 0, :2], a[2, 1, 1:]], 0)),
]


def _replayed_and_recorded(op, reference, a, rng):
    """Check op's replay against `reference` on a; then (x, expected, weights, persistent tape, y = op(x),
    total = sum(y * weights)) for the derivative checks."""
    x = jt.constant(a)
    expected = reference(a)
    weights = rng.standard_normal(np.shape(expected))
    replayed = jt.function(op)
    replayed(x)
    np.testing.assert_array_equal(replayed(x).numpy(), expected)
    with jt.GradientTape(persistent=True) as tape:
        tape.watch(x)
        y = op(x)
        total = jt.reduce_sum(y * weights)
    return x, expected, weights, tape, y, total


def _check_hessian_vector_products(op, x, weights, rng):
    """An HVP of sum(op(x)^2 * weights) carries one tangent column through op and one cotangent back: the
    compiled one of a persistent tape and jt.hessian_vector_product's replay against recorded nested tapes."""
    v = jt.constant(rng.standard_normal(x.shape))

    def squared(t):
        return jt.reduce_sum(jt.square(op(t)) * weights)
    with jt.GradientTape() as outer:
        outer.watch(x)
        with jt.GradientTape() as inner:
            inner.watch(x)
            h = squared(x)
        recorded = outer.gradient(jt.reduce_sum(inner.gradient(h, x) * v), x).numpy()
    atol = 1e-12 * max(1.0, np.abs(recorded).max())
    with jt.GradientTape(persistent=True) as tape:
        tape.watch(x)
        h = squared(x)
    np.testing.assert_allclose(tape.hessian_vector_product(h, x, v).numpy(), recorded, rtol=1e-12, atol=atol)
    hvp = jt.hessian_vector_product(squared)
    hvp(v, x)
    np.testing.assert_allclose(hvp(v, x).numpy(), recorded, rtol=1e-12, atol=atol)


@pytest.mark.parametrize("last", [3, 7, 8, 20, 70])
@pytest.mark.parametrize("name,op,reference", CASES, ids=[c[0] for c in CASES])
def test_moves_on_every_path(name, op, reference, last):
    rng = np.random.default_rng(last)
    a = rng.standard_normal((3, 4, last))
    x, expected, weights, tape, y, total = _replayed_and_recorded(op, reference, a, rng)
    # the map is linear: its gradient and its Jacobian (K columns) are exact
    jacobian = np.stack([reference(e.reshape(a.shape)) for e in np.eye(a.size)], axis=-1).reshape(
        expected.shape + a.shape)
    np.testing.assert_array_equal(tape.gradient(total, x).numpy(), np.tensordot(weights, jacobian, weights.ndim))
    np.testing.assert_array_equal(tape.jacobian(y, x).numpy(), jacobian)
    program = execute.lowered(tape, [y], [x])
    for mode in ("forward", "reverse"):        # tangent columns through the map, cotangent columns through its transpose
        (found,) = execute.source_jacobians(program, y.size, [x], mode)
        np.testing.assert_array_equal(found.reshape(jacobian.shape), jacobian)
    grad = jt.grad(lambda v: jt.reduce_sum(op(v) * weights))
    grad(x)
    np.testing.assert_array_equal(grad(x).numpy(), np.tensordot(weights, jacobian, weights.ndim))
    _check_hessian_vector_products(op, x, weights, rng)


SUMMED = [
    ("broadcast of a scalar", lambda t: jt.broadcast_to(t[1, 2, 0], (6, t.shape[2])),
     lambda a: np.broadcast_to(a[1, 2, 0], (6, a.shape[2]))),
    ("broadcast of a row", lambda t: jt.broadcast_to(t[0, 1:2], (5, 2, t.shape[2])),
     lambda a: np.broadcast_to(a[0, 1:2], (5, 2, a.shape[2]))),
    ("broadcast of a column", lambda t: jt.broadcast_to(t[:, :, :1], (3, 4, 5)),
     lambda a: np.broadcast_to(a[:, :, :1], (3, 4, 5))),
    ("broadcast along a middle axis", lambda t: jt.broadcast_to(t[:, :1], t.shape), lambda a: np.broadcast_to(a[:, :1], a.shape)),
    ("sum over the last axis", lambda t: jt.reduce_sum(t, axis=2), lambda a: np.sum(a, axis=2)),
    ("sum over a middle axis", lambda t: jt.reduce_sum(t, axis=1), lambda a: np.sum(a, axis=1)),
    ("sum of everything", lambda t: jt.reduce_sum(t), lambda a: np.sum(a)),
    ("max over the last axis", lambda t: jt.reduce_max(t, axis=2), lambda a: np.max(a, axis=2)),
    ("max over a middle axis", lambda t: jt.reduce_max(t, axis=1), lambda a: np.max(a, axis=1)),
    ("min over the first axis", lambda t: jt.reduce_min(t, axis=0), lambda a: np.min(a, axis=0)),
    ("prod over a middle axis", lambda t: jt.reduce_prod(t, axis=1), lambda a: np.prod(a, axis=1)),
    ("running sum over the last axis", lambda t: jt.cumsum(t, axis=2), lambda a: np.cumsum(a, axis=2)),
    ("exclusive running sum from the end", lambda t: jt.cumsum(t, axis=1, exclusive=True, reverse=True),
     lambda a: np.concatenate([np.cumsum(a[:, ::-1], axis=1)[:, -2::-1], np.zeros_like(a[:, :1])], axis=1)),
]


@pytest.mark.parametrize("last", [1, 3, 8, 20, 3000])
@pytest.mark.parametrize("name,op,reference", SUMMED, ids=[c[0] for c in SUMMED])
def test_broadcasts_and_reductions_on_every_path(name, op, reference, last):
    rng = np.random.default_rng(last)
    a = rng.standard_normal((3, 4, last))
    a[1, 2, -1] = a[1, 2, 0]        # a tied maximum is possible: its cotangent is split
    x, expected, weights, tape, y, total = _replayed_and_recorded(op, reference, a, rng)
    # the Python VJPs on a nested tape are the reference of the compiled sweeps
    with jt.GradientTape() as outer:
        outer.watch(x)
        with jt.GradientTape() as inner:
            inner.watch(x)
            recorded_total = jt.reduce_sum(op(x) * weights)
        recorded = inner.gradient(recorded_total, x)
    np.testing.assert_allclose(tape.gradient(total, x).numpy(), recorded.numpy(), rtol=1e-13, atol=1e-13)
    grad = jt.grad(lambda v: jt.reduce_sum(op(v) * weights))
    grad(x)
    np.testing.assert_allclose(grad(x).numpy(), recorded.numpy(), rtol=1e-13, atol=1e-13)
    _check_hessian_vector_products(op, x, weights, rng)
    if a.size <= 300:
        jacobian = tape.jacobian(y, x).numpy()
        np.testing.assert_allclose(np.tensordot(weights, jacobian, np.ndim(expected)), recorded.numpy(),
                                   rtol=1e-13, atol=1e-13)
        program = execute.lowered(tape, [y], [x])
        for mode in ("forward", "reverse"):
            (found,) = execute.source_jacobians(program, y.size, [x], mode)
            np.testing.assert_allclose(found.reshape(jacobian.shape), jacobian, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("reduce,reference", [(jt.reduce_max, np.max), (jt.reduce_min, np.min)], ids=["max", "min"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_replayed_extrema_with_nan_and_infinities(reduce, reference, dtype):
    rng = np.random.default_rng(11)
    for n in [1, 2, 7, 8, 9, 15, 16, 17, 33, LANES - 1, LANES, LANES + 1, 2 * LANES + 3, 1000]:
        f = jt.function(lambda v: reduce(v))        # one per size: every later call replays
        values = rng.standard_normal(n).astype(dtype)
        variants = [values]
        for special in (np.nan, np.inf, -np.inf):
            for position in {0, n // 2, n - 1}:
                v = values.copy()
                v[position] = special
                variants.append(v)
        for v in variants:
            f(jt.constant(v))
            np.testing.assert_array_equal(f(jt.constant(v)).numpy(), reference(v))
    rows = rng.standard_normal((5, 19)).astype(dtype)
    rows[2, 11] = np.nan
    g = jt.function(lambda v: reduce(v, axis=1))
    g(jt.constant(rows))
    np.testing.assert_array_equal(g(jt.constant(rows)).numpy(), reference(rows, axis=1))
