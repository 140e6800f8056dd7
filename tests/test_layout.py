"""The run layout of plain replays (jitape_kernels.layout): copies read their input's rows, elementwise runs of
one large size and the broadcasts into them run as fused groups block by block, and values read only inside a
group never reach the arena; every replay equals the same function run eagerly."""
import inspect

import numpy as np
import pytest

import jitape as jt
from jitape import replay
from jitape.replay import Function
from jitape_kernels import opcodes as oc
from jitape_kernels import layout
from jitape_kernels.cpu.interpreter import replay_sweep
from jitape_kernels.layout import BLOCK, FUSE_MIN_SIZE


def _only_variant(f):
    (concrete,) = [c for variants in f._variants.values() for c in variants]
    return concrete


def _chain(x, w, v):
    """Elementwise rows of x's size around copies, a scalar broadcast, a compare and where, a value read twice
    and a stop_gradient; a variable write and two outputs from the middle of the chain."""
    a = jt.reshape(x, (-1,)) * 2.0 + w
    b = jt.where(a > 0.5, jt.sqrt(jt.abs(a)), a * a)
    c = jt.stop_gradient(b) - jt.exp(-a)
    v.assign(c * 0.5)
    return jt.reduce_sum(c), jt.identity(b)


@pytest.mark.parametrize("n", [FUSE_MIN_SIZE - 1, FUSE_MIN_SIZE, FUSE_MIN_SIZE + 2 * BLOCK + 5])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_fused_replay_equals_eager_on_sizes_around_the_blocks(n, dtype):
    rng = np.random.default_rng(n)
    v = jt.Variable(np.zeros(n, dtype))
    w = jt.Variable(dtype(0.25))
    f = jt.function(_chain)
    for _ in range(3):
        x = rng.normal(size=(n,)).astype(dtype)
        total, b = f(jt.constant(x), w, v)
        written = v.numpy()
        expected_total, expected_b = _chain(jt.constant(x), w, v)
        np.testing.assert_allclose(b.numpy(), expected_b.numpy(), rtol=1e-6)
        np.testing.assert_allclose(written, v.numpy(), rtol=1e-6, atol=1e-7)
        assert float(total) == pytest.approx(float(expected_total), rel=1e-5)
        w.assign(w + 0.5)
    concrete = _only_variant(f)
    assert f.trace_count == 1
    assert np.any(concrete._fused) == (n >= FUSE_MIN_SIZE)
    ops = concrete._run_code[:, oc.OP]
    assert not np.any((ops == oc.COPY) | (ops == oc.STOP_GRADIENT))     # copies read their input's rows


# (shape of the group's rows, shape broadcast into them): rows and columns crossing block boundaries, a middle axis
# (runs carried across two axes), several axes of one entry, a scalar (a fill)
BROADCASTS = [((FUSE_MIN_SIZE + 7,), (1,)), ((1000, 37), (1, 37)), ((1000, 37), (1000, 1)), ((40, 25, 37), (40, 1, 37)),
              ((9, 7, 5, 3, 97), (1, 7, 1, 3, 1)), ((7, 3, 3001), (7, 1, 3001)), ((16, BLOCK + 3), (16, 1))]


@pytest.mark.parametrize("shape,small", BROADCASTS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_broadcasts_run_in_fused_groups_and_equal_eager_bit_for_bit(shape, small, dtype):
    rng = np.random.default_rng(len(shape))
    x = jt.constant(rng.normal(size=shape).astype(dtype))
    b = jt.constant(rng.normal(size=small).astype(dtype))

    def f(x, b):       # arithmetic only: equal bits whatever computes it
        return (x * 0.5 - b) * (x + b) + b * b

    replayed = jt.function(f)
    for _ in range(2):
        np.testing.assert_array_equal(replayed(x, b).numpy(), f(x, b).numpy())
    concrete = _only_variant(replayed)
    grouped = {r for start in np.flatnonzero(concrete._fused).tolist() for r in range(start, concrete._fused[start])}
    tiles = np.flatnonzero(concrete._run_code[:, oc.OP] == oc.TILE).tolist()
    assert tiles and set(tiles) <= grouped


@pytest.mark.parametrize("shape,small", BROADCASTS[1:4])
def test_bound_gradients_run_broadcasts_in_their_fused_groups(shape, small):
    """A jt.grad replay of a differentiated variant (fused groups on the canonical layout) runs broadcasts in its
    groups too; its gradients w.r.t. both operands equal the tape's."""
    rng = np.random.default_rng(len(shape))
    x, b = jt.constant(rng.normal(size=shape)), jt.constant(rng.normal(size=small))

    def f(x, b):
        return jt.reduce_sum(jt.exp((x * 0.5 - b) * 0.1) * (x + b))

    fn = Function(f, differentiated=True)
    derivative = jt.grad(fn, argnums=(0, 1))
    derivative(x, b), derivative(x, b)      # traced, then bound
    with jt.GradientTape() as tape:
        tape.watch([x, b])
        y = f(x, b)
    for got, want in zip(derivative(x, b), tape.gradient(y, [x, b])):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-12)
    concrete = _only_variant(fn)
    (fused, _), = concrete.purpose_layouts.values()
    grouped = {r for start in np.flatnonzero(fused).tolist() for r in range(start, fused[start])}
    tiles = np.flatnonzero(concrete._run_code[:, oc.OP] == oc.TILE).tolist()
    assert tiles and set(tiles) <= grouped


def test_a_tile_that_repeats_more_than_single_entries_stays_out_of_groups():
    x = jt.constant(np.arange(2 * FUSE_MIN_SIZE, dtype=np.float64))
    b = jt.constant(np.array([1.0, 2.0]))
    replayed = jt.function(lambda x, b: (x * 0.5 + jt.tile(b, [FUSE_MIN_SIZE])) * x)
    np.testing.assert_array_equal(replayed(x, b).numpy(), replayed.python_function(x, b).numpy())
    concrete = _only_variant(replayed)
    (tile,) = np.flatnonzero(concrete._run_code[:, oc.OP] == oc.TILE)
    assert np.any(concrete._fused)
    assert not any(start <= tile < concrete._fused[start] for start in np.flatnonzero(concrete._fused))


def test_values_read_only_inside_a_group_never_reach_the_arena():
    n = FUSE_MIN_SIZE + 3
    f = jt.function(lambda x: jt.reduce_sum(jt.tanh(x * 3.0 + 1.0) * x - x))
    x = jt.constant(np.linspace(-1.0, 1.0, n))
    f(x)
    concrete = _only_variant(f)
    (start,) = np.flatnonzero(concrete._fused)
    stop = concrete._fused[start]
    assert stop - start >= 4
    in_scratch = [concrete._run_code[r, oc.OUT] for r in range(start, stop) if concrete._places[r, 0] >= 0]
    # every value but the last (the sum reads it after the group); buffers reused as values die
    assert len(in_scratch) == stop - start - 1 and concrete._places[stop - 1, 0] == -1
    assert concrete._scratch.size <= 3 * BLOCK
    for slot in in_scratch:
        concrete.arena[concrete._span(slot)] = np.nan
    assert float(f(x)) == pytest.approx(float(jt.reduce_sum(jt.tanh(x * 3.0 + 1.0) * x - x)), rel=1e-12)
    for slot in in_scratch:
        assert np.all(np.isnan(concrete.arena[concrete._span(slot)]))


def test_a_fused_function_differentiated_by_a_tape_or_jt_grad_uses_every_value():
    n = FUSE_MIN_SIZE + 1

    def f(x):
        return jt.reduce_sum(jt.sin(x) * x + jt.reshape(x, (-1,)) * 0.5)

    fn = jt.function(f)
    x = jt.constant(np.linspace(-2.0, 2.0, n))
    expected = np.cos(x.numpy()) * x.numpy() + np.sin(x.numpy()) + 0.5
    with jt.GradientTape() as tape:
        tape.watch(x)
        y = fn(x)
    np.testing.assert_allclose(tape.gradient(y, x).numpy(), expected, rtol=1e-12)
    np.testing.assert_allclose(jt.grad(fn)(x).numpy(), expected, rtol=1e-12)
    fn(x)       # the plain replay runs fused
    assert np.any(_only_variant(fn)._fused)


def test_a_variant_in_its_run_layout_refuses_to_plan_a_derivative():
    f = jt.function(lambda x: jt.reduce_sum(jt.sin(x) * x))
    f(jt.constant(np.ones(FUSE_MIN_SIZE)))
    with pytest.raises(ValueError, match="run layout"):
        _only_variant(f).program([0], [0])


@pytest.mark.parametrize("bind", [jt.grad, jt.jacobian])
def test_bound_gradients_replay_fused_groups_of_the_values_they_do_not_read(bind):
    """jt.grad / jt.jacobian replays of a differentiated variant run fused groups on its canonical layout: the
    outputs and the values the gradient's rules read (opcodes.FIRST_ORDER_READS) reach the arena, the others
    (here x * 1.5, which the linear rules of + 0.25 do not read) only scratch; results equal eager ones."""
    n = FUSE_MIN_SIZE + 7
    # differentiated: the jt.function that jt.grad and jt.jacobian replay
    fn = Function(lambda x: jt.reduce_logsumexp(x * 1.5 + 0.25, keepdims=bind is jt.jacobian), differentiated=True)
    derivative = bind(fn)
    rng = np.random.default_rng(3)

    def eager(x):
        with jt.GradientTape() as tape:
            tape.watch(x)
            y = jt.reduce_logsumexp(x * 1.5 + 0.25, keepdims=bind is jt.jacobian)
        return (tape.jacobian if bind is jt.jacobian else tape.gradient)(y, x).numpy()

    x = jt.constant(rng.normal(size=n))
    derivative(x), derivative(x)           # traced, then bound
    concrete = _only_variant(fn)
    (fused, places), = concrete.purpose_layouts.values()
    in_scratch = [concrete._run_code[r, oc.OUT] for r in np.flatnonzero(places[:, 0] >= 0)]
    assert np.any(fused) and len(in_scratch) >= 2
    for slot in in_scratch:
        concrete.arena[concrete._span(slot)] = np.nan
    for _ in range(2):
        x = jt.constant(rng.normal(size=n))
        np.testing.assert_allclose(derivative(x).numpy(), eager(x), rtol=1e-12, atol=1e-15)
    for slot in in_scratch:
        assert np.all(np.isnan(concrete.arena[concrete._span(slot)]))


def _bound_arrays(concrete):
    """The arrays the variant's one bound purpose replays with, by replay_sweep's parameter names."""
    (_, arrays), = concrete._bindings.values()
    return dict(zip(inspect.signature(replay_sweep.py_func).parameters, arrays))


def _no_reverse_groups(step_code, steps, slots, iattr, moves):
    groups, places, _ = layout.reverse_groups(step_code, steps, slots, iattr, moves)
    return np.zeros_like(groups), places, 0


def _sum_rows(x):
    """Sums over every axis arrangement SUM's cotangent broadcasts back from: all, the last (inner 1), the first
    and the middle (inner > 1)."""
    return jt.reduce_sum(x) + jt.reduce_sum(jt.reduce_sum(x, axis=2) ** 2) + jt.reduce_sum(
        jt.exp(jt.reduce_sum(x, axis=0) * 0.1)) + jt.reduce_sum(jt.reduce_sum(x, axis=1) * 0.5)


# functions of (x, b) whose reverse sweeps have fused groups: chains, a value read by several rows, x * x, where with
# both branches active, a stop_gradient, sums broadcasting their cotangents back
REVERSE_CASES = {
    "logsumexp": lambda x, b: jt.reduce_logsumexp(jt.sin(x * 1.5) * x - b),
    "chain": lambda x, b: jt.reduce_sum(jt.tanh(jt.exp(x * 0.1) * b + x) * x - jt.sqrt(x * x + 1.0) / (b + 2.0)),
    "where": lambda x, b: jt.reduce_sum(jt.where(x > b, jt.sin(x) * b, x * x - b) * jt.stop_gradient(x)),
    "sums": lambda x, b: _sum_rows(x * b + jt.log1p(x * x)),
    "broadcasts": lambda x, b: _broadcasts(x * b + jt.log1p(x * x)),
    "extrema": lambda x, b: _extrema(x * b + jt.log1p(x * x)),
}


def _extrema(x):
    """Maxima and minima along the last axis (whose reverses join a fused group), every row's extremum tied
    twice, and one along another axis."""
    twice = jt.concat([jt.exp(x * 0.5), jt.exp(x * 0.5)], axis=2)
    along_last = jt.reduce_max(twice, axis=2) * 2.0 + jt.reduce_min(jt.square(x - 3.0), axis=2)
    return jt.reduce_sum(along_last) + jt.reduce_sum(jt.reduce_max(x, axis=1))


def _broadcasts(x):
    """Broadcasts whose reverses join a fused group (their innermost axis copies the input: summed in order) and
    one whose reverse does not (its innermost axis repeats: row sums)."""
    joins = jt.square(x - jt.reduce_sum(x, axis=0)) * jt.exp(x * 0.1 - jt.reduce_max(x, axis=(0, 1)))
    return jt.reduce_sum(joins * 0.5 + (x - jt.reduce_mean(x, axis=2, keepdims=True)))


@pytest.mark.parametrize("n", [FUSE_MIN_SIZE - 2, FUSE_MIN_SIZE + 2 * BLOCK + 4])
@pytest.mark.parametrize("case", sorted(REVERSE_CASES))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fused_reverse_groups_equal_the_row_by_row_sweep_bit_for_bit(monkeypatch, n, case, dtype):
    """jt.grad replays run fused reverse groups (layout.reverse_groups) where rows are large enough: their
    gradients equal the same replay's without groups bit for bit, and the tape's."""
    f = REVERSE_CASES[case]
    rng = np.random.default_rng(n)
    shape = (2, n // 4, 2)
    xs = [jt.constant(rng.uniform(0.1, 1.0, shape).astype(dtype)) for _ in range(2)]
    b = jt.constant(dtype(0.5))
    grouped = Function(f, differentiated=True)
    derivative = jt.grad(grouped, argnums=(0, 1))
    results = [derivative(x, b) for x in xs + xs]      # traced, bound, replayed
    monkeypatch.setattr(replay, "reverse_groups", _no_reverse_groups)
    plain = jt.grad(Function(f, differentiated=True), argnums=(0, 1))
    for x, got in zip(xs + xs, results):
        want = plain(x, b)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g.numpy(), w.numpy())
        with jt.GradientTape() as tape:
            tape.watch([x, b])
            y = f(x, b)
        for g, w in zip(got, tape.gradient(y, [x, b])):
            np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=2e-4 if dtype == np.float32 else 1e-11)
    arrays = _bound_arrays(_only_variant(grouped))
    groups, places = arrays["step_groups"], arrays["step_places"]
    assert np.any(groups > 1) == (x.numpy().size >= FUSE_MIN_SIZE)
    if np.any(groups > 1):
        assert np.any(places[:, 0] >= 0)        # a cotangent only its group writes and reads lives in scratch
        in_groups = np.zeros(groups.size, np.bool_)
        for r in np.flatnonzero(groups > 1).tolist():
            in_groups[r - groups[r] + 1:r + 1] = True
        tiles = arrays["step_code"][:, oc.OP] == oc.TILE
        assert np.any(in_groups & tiles) == (case == "broadcasts")
        extrema = np.isin(arrays["step_code"][:, oc.OP], [oc.MAX, oc.MIN])
        assert np.any(in_groups & extrema) == (case == "extrema")
        if case == "broadcasts":
            assert np.any(tiles & ~in_groups)       # a fill's and a row sum's reverses stay rows of their own


def test_a_traced_gradient_of_an_intermediate_reads_its_cotangent_from_the_adjoint_rows():
    """A gradient step inside a jt.function w.r.t. a tensor its fused group computes: the group keeps that
    tensor's cotangent in the adjoint rows (a source), and the replay equals eager."""
    def f(x):
        with jt.GradientTape() as tape:
            tape.watch(x)
            h = jt.exp(x * 0.5)
            tape.watch(h)
            y = jt.reduce_sum(jt.sin(h) * h + x)
        gx, gh = tape.gradient(y, [x, h])
        return gx * 2.0 + gh

    replayed = jt.function(f)
    rng = np.random.default_rng(5)
    for _ in range(3):
        x = jt.constant(rng.normal(size=FUSE_MIN_SIZE + 2 * BLOCK + 1))
        np.testing.assert_allclose(replayed(x).numpy(), f(x).numpy(), rtol=1e-12)
    concrete = _only_variant(replayed)
    assert np.any(concrete._step_groups > 1)


def _no_scalar_runs(code, slots, positions=(), steps=None, flags=None):
    rows = layout.scalar_runs(code, slots, positions, steps, flags)
    rows[:, layout.SC_RUN] = 0
    return rows


def _scalar_chain(x, b):
    y = x
    for _ in range(40):
        y = jt.sin(y) * x + 0.5 * y
    return y * b


def _scalar_mixed(x, b):
    """Scalar runs around array rows, a value read by many rows, x * x, an unreached input's rows (b only through
    a stop_gradient) and an input read before and after an array row."""
    v = jt.stack([x, x * 2.0, x * 3.0, x, x])
    s = jt.reduce_sum(v * v) * x + x * x
    t = s / (jt.stop_gradient(b) + 2.0) - jt.exp(x * 0.1)
    return jt.reduce_sum(v * t) + t * t - jt.square(x)


@pytest.mark.parametrize("f", [_scalar_chain, _scalar_mixed], ids=["chain", "mixed"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_scalar_runs_equal_the_row_by_row_sweeps_bit_for_bit(monkeypatch, f, dtype):
    """Replays run scalar rows from compact rows with planned flags (layout.scalar_runs): their values and
    gradients equal the same replays' without runs bit for bit, and the tape's."""
    values = [(dtype(0.3), dtype(1.5)), (dtype(-0.7), dtype(0.25)), (dtype(1.1), dtype(-3.0))]
    with_runs = Function(f, differentiated=True)
    derivative = jt.value_and_grad(with_runs, argnums=(0, 1))
    results = [derivative(jt.constant(x), jt.constant(b)) for x, b in values + values]
    monkeypatch.setattr(replay, "scalar_runs", _no_scalar_runs)
    plain = jt.value_and_grad(Function(f, differentiated=True), argnums=(0, 1))
    for (x, b), (value, grads) in zip(values + values, results):
        want_value, want = plain(jt.constant(x), jt.constant(b))
        assert value.numpy() == want_value.numpy()
        for g, w in zip(grads, want):
            np.testing.assert_array_equal(g.numpy(), w.numpy())
        x, b = jt.constant(x), jt.constant(b)
        with jt.GradientTape() as tape:
            tape.watch([x, b])
            y = f(x, b)
        for g, w in zip(grads, tape.gradient(y, [x, b], unconnected_gradients="zero")):
            np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-4 if dtype == np.float32 else 1e-12)
    arrays = _bound_arrays(_only_variant(with_runs))
    scalars, step_scalars = arrays["scalars"], arrays["step_scalars"]
    assert np.any(scalars[:, layout.SC_RUN] > 0) and np.any(step_scalars[:, layout.SC_RUN] > 0)


def test_scalar_runs_in_traced_gradient_steps_and_jacobians():
    """A jt.function taking two gradients inside (two steps: runs end at their positions) and a jt.jacobian (K
    columns: its reverse runs row by row) equal eager."""
    def f(x):
        with jt.GradientTape(persistent=True) as tape:
            tape.watch(x)
            y = _scalar_chain(x, 2.0)
            z = y * y + x
        g = tape.gradient(y, x)
        h = tape.gradient(z, x)
        return g * h + _scalar_chain(g, x)

    replayed = jt.function(f)
    for x in (0.3, -0.2, 0.9, 0.3):
        x = jt.constant(np.float64(x))
        np.testing.assert_allclose(replayed(x).numpy(), f(x).numpy(), rtol=1e-12)
    concrete = _only_variant(replayed)
    assert len(concrete._steps) == 2
    assert np.any(concrete._scalars[:, layout.SC_RUN] > 0) and np.any(concrete._step_scalars[:, layout.SC_RUN] > 0)
    jacobian = jt.jacobian(lambda x: jt.stack([_scalar_chain(x[0], x[1]), x[0] * x[1]]))
    for x in ([0.3, 1.5], [-0.4, 2.0]):
        x = jt.constant(np.array(x))
        with jt.GradientTape() as tape:
            tape.watch(x)
            y = jt.stack([_scalar_chain(x[0], x[1]), x[0] * x[1]])
        np.testing.assert_allclose(jacobian(x).numpy(), tape.jacobian(y, x).numpy(), rtol=1e-12)


def _lines(axis, rows):
    """rows as lines of the reduced axis: (3, n) along axis 1 (contiguous), (n, 3) along axis 0."""
    rows = np.asarray(rows, np.float64)
    return rows if axis == 1 else np.ascontiguousarray(rows.T)


STASH_CASES = {
    "far from 0": lambda axis, rng: _lines(axis, 1000.0 + 3.0 * rng.normal(size=(3, 7))),
    "long lines": lambda axis, rng: _lines(axis, 3.0 * rng.normal(size=(3, FUSE_MIN_SIZE + 5))),
    "-inf entries": lambda axis, rng: _lines(axis, np.where(rng.normal(size=(3, 9)) > 0.8, -np.inf,
                                                            rng.normal(size=(3, 9)))),
    # an inf line (inf result), a NaN line, an all -inf line (-inf result): NaN cotangents where eager has them
    "inf, NaN and -inf lines": lambda axis, rng: _lines(axis, [[1.0, np.inf, 2.0], [np.nan, 0.0, 1.0],
                                                               [-np.inf, -np.inf, -np.inf]]),
}


@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("case", sorted(STASH_CASES))
def test_replayed_logsumexp_gradients_read_the_exponentials_their_forward_stashed(case, axis):
    """A logsumexp that a replay's gradient step with one column differentiates (jt.grad's bound step, and a
    tape's gradient inside the function) gets a stash (layout.logsumexp_stashes): its forward leaves the
    exponentials and their sums' reciprocals at the end of the replay's scratch and its reverse reads them. The
    gradients equal the eager sweep's (exp(x - y)) with NaN where it has NaN, on new values each call; a
    Jacobian's replay (K columns) and a replay nothing differentiates plan no stash."""
    rng = np.random.default_rng(11)
    weights = jt.constant(np.arange(1.0, 4.0))

    def loss(v):
        return jt.reduce_sum(jt.reduce_logsumexp(v, axis=axis) * weights)

    def eager(x):
        with jt.GradientTape() as tape:
            tape.watch(x)
            total = loss(x)
        return tape.gradient(total, x)

    fn = Function(loss, differentiated=True)
    derivative, step, forward = jt.grad(fn), jt.function(eager), Function(loss)
    for _ in range(3):      # traced, then replayed on new values
        x = jt.constant(STASH_CASES[case](axis, rng))
        with np.errstate(invalid="ignore", divide="ignore"):
            expected = eager(x).numpy()
            for got in (derivative(x), step(x)):
                np.testing.assert_allclose(got.numpy(), expected, rtol=1e-12, atol=1e-300)
            forward(x)
    entries = x.numpy().size + 3
    arrays = _bound_arrays(_only_variant(fn))
    for run_code, scratch in ((arrays["code"], arrays["scratch"]),
                              (_only_variant(step)._run_code, _only_variant(step)._scratch)):
        (row,) = np.flatnonzero(run_code[:, oc.OP] == oc.LOGSUMEXP)
        assert run_code[row, oc.STASH] == entries and scratch.size >= entries
    (row,) = np.flatnonzero(arrays["step_code"][:, oc.OP] == oc.LOGSUMEXP)
    assert arrays["step_code"][row, oc.STASH] == entries
    run_code = _only_variant(forward)._run_code
    assert np.all(run_code[run_code[:, oc.OP] == oc.LOGSUMEXP, oc.STASH] < 0)
    lines = Function(lambda v: jt.reduce_logsumexp(v, axis=axis), differentiated=True)
    jacobian = jt.jacobian(lines)
    x = jt.constant(STASH_CASES[case](axis, rng))
    with jt.GradientTape() as tape, np.errstate(invalid="ignore", divide="ignore"):
        tape.watch(x)
        y = jt.reduce_logsumexp(x, axis=axis)
    with np.errstate(invalid="ignore", divide="ignore"):
        expected = tape.jacobian(y, x).numpy()
        for _ in range(2):
            np.testing.assert_allclose(jacobian(x).numpy(), expected, rtol=1e-12, atol=1e-300)
    run_code = _bound_arrays(_only_variant(lines))["code"]
    assert np.all(run_code[run_code[:, oc.OP] == oc.LOGSUMEXP, oc.STASH] < 0)


def test_two_gradient_steps_share_one_logsumexp_stash():
    """Two gradients of one logsumexp inside a function (two steps of one replay) read the one stash its forward
    left; both equal eager."""
    def f(v):
        with jt.GradientTape(persistent=True) as tape:
            tape.watch(v)
            y = jt.reduce_logsumexp(v * 2.0)
            z = y * y
        return tape.gradient(y, v), tape.gradient(z, v)

    traced = jt.function(f)
    rng = np.random.default_rng(2)
    for _ in range(3):
        x = jt.constant(rng.normal(size=50) * 4.0)
        for got, want in zip(traced(x), f(x)):
            np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-12)
    concrete = _only_variant(traced)
    assert len(concrete.gradient_steps) == 2
    stashed = concrete._step_code[concrete._step_code[:, oc.OP] == oc.LOGSUMEXP, oc.STASH]
    assert stashed.size == 2 and np.all(stashed == 50 + 1)     # 50 exponentials, one reciprocal


# slots of the hoisting cases: 0 a large input, 1 a small one, 2 and 4 large values, 3 a small one
_SIZES = np.array([FUSE_MIN_SIZE, 25, FUSE_MIN_SIZE, 25, FUSE_MIN_SIZE, 25])


def _rows(*rows):
    return np.array([list(r) + [-1] * (6 - len(r)) for r in rows], np.int64)


@pytest.mark.parametrize("small,moves", [
    ((oc.ADD, 3, 1, 1), True),              # reads nothing the first large run touches
    ((oc.ADD, 3, 1, 2), False),             # reads what it computes
    ((oc.ADD, 3, 0, 1), False),             # reads what it reads: the terms of slot 0's cotangent keep their order
    ((oc.PLACE, 3, 1), False),              # several rows write a PLACE's output
    ((replay.GRADIENT_STEP, 3, 1, 1), False),
])
def test_small_rows_between_two_runs_of_large_rows_of_one_size_move_before_the_first(small, moves):
    rows = _rows((oc.MUL, 2, 0, 0), small, (oc.ADD, 4, 2, 0), (oc.SUM, 5, 4))
    order = layout.hoisted(rows, _SIZES)
    assert order.tolist() == ([1, 0, 2, 3] if moves else [0, 1, 2, 3])


def test_small_rows_between_large_rows_of_other_sizes_stay():
    sizes = _SIZES.copy()
    sizes[4] = 2 * FUSE_MIN_SIZE
    rows = _rows((oc.MUL, 2, 0, 0), (oc.ADD, 3, 1, 1), (oc.TILE, 4, 2))
    assert layout.hoisted(rows, sizes).tolist() == [0, 1, 2]


def test_hoisted_rows_join_two_groups_and_change_no_bit(monkeypatch):
    """W8's pattern: a small sum between a product and the squared norms of its result. Replays with the rows
    moved (one group more in the forward and the reverse) give the bits of replays without, values and gradients."""
    def f(x, c, a, b):
        u = (x - c) * 0.5
        v = u + jt.sin(a)       # a broadcast added after a row of the small values
        w = jt.exp(a) + b
        return jt.reduce_sum(jt.reduce_sum(v * v, axis=1) * w[0]) + jt.reduce_sum(w)

    rng = np.random.default_rng(2)
    args = [jt.constant(rng.normal(size=s)) for s in [(FUSE_MIN_SIZE // 16, 16), (1, 16), (16,), (16,)]]

    def replays():
        g = jt.grad(Function(f, differentiated=True), argnums=(0, 1, 2, 3))
        value = jt.function(f)
        return [t.numpy() for _ in range(3) for t in g(*args)][-4:] + [value(*args).numpy() for _ in range(3)][-1:]

    orders = []
    monkeypatch.setattr(replay, "hoisted", lambda rows, sizes: orders.append(layout.hoisted(rows, sizes)) or orders[-1])
    moved = replays()
    assert all(np.any(order != np.arange(order.size)) for order in orders)
    monkeypatch.setattr(replay, "hoisted", lambda rows, sizes: np.arange(rows.shape[0]))
    for got, want in zip(moved, replays()):
        np.testing.assert_array_equal(got, want)
