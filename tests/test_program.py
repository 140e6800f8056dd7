"""Random programs: chains of mixed ops over shared inputs, differentiated by the compiled sweep, by the
recorded Python VJPs and by central differences (float64). Integration bugs that per-op tests miss
(pruning, slot sharing, multi-row concat, broadcasting, tensors read many times) show up here."""
import pickle
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jitape as jt
import jitape.program
import jitape.tape
from jitape import execute, recycling
from jitape.program import SHARED_ROWS_MIN, lower
from jitape_kernels.cpu.interpreter import SMALL
from jitape_kernels.cpu.linalg import STACKED_INNER_MAX
from jitape_kernels.planning import READS_ANY_ORDER, READS_FIRST_ORDER

STEPS = st.lists(st.tuples(st.integers(0, 11), st.integers(0, 10**6)), min_size=1, max_size=12)


def _apply(step, seed, pool):
    """One op on tensors of the pool (all of one shape (3, n)); returns a tensor of that shape."""
    rng = np.random.default_rng(seed)
    a = pool[rng.integers(len(pool))]
    b = pool[rng.integers(len(pool))]
    c = float(rng.uniform(0.5, 1.5))
    if step == 0:
        return jt.sin(a) * b
    if step == 1:
        return a + b * c
    if step == 2:
        return jt.tanh(a - b)
    if step == 3:
        return a * jt.reduce_mean(b, axis=1, keepdims=True)
    if step == 4:
        return jt.reshape(jt.transpose(a * b, (1, 0)), a.shape)
    if step == 5:
        return jt.concat([a[:, :2], jt.exp(-jt.square(b[:, 2:]))], axis=1)
    if step == 6:
        return jt.matmul(a, jt.transpose(b)) @ jt.ones(a.shape, dtype="float64") * 0.1
    if step == 7:
        return jt.where(a > 0, a * b, b)
    if step == 8:
        return jt.nn.softplus(a) * jt.reduce_max(b, axis=0)
    if step == 9:
        return jt.stack([a[0], b[1], a[2] * b[2]])
    if step == 10:
        return a / (1.0 + jt.square(b))
    return jt.nn.sigmoid(a) + jt.gather(b, [2, 0, 1], axis=0)


def _program(values, steps, ct):
    inputs = [jt.constant(v) for v in values]
    pool = list(inputs)
    for step, seed in steps:
        pool.append(_apply(step, seed, pool))
    return inputs, jt.reduce_sum(pool[-1] * ct)


def _recorded(values, steps, ct):
    """(a persistent tape, its watched inputs, the pool of tensors, the loss) of one random program."""
    inputs = [jt.constant(v) for v in values]
    with jt.GradientTape(persistent=True) as tape:
        tape.watch(inputs)
        pool = list(inputs)
        for step, seed in steps:
            pool.append(_apply(step, seed, pool))
        loss = jt.reduce_sum(pool[-1] * ct)
    return tape, inputs, pool, loss


@settings(max_examples=40, deadline=None)
@given(STEPS, st.integers(0, 10**6))
def test_random_programs_agree_on_both_paths_and_with_finite_differences(steps, seed):
    rng = np.random.default_rng(seed)
    values = [rng.uniform(-1.5, 1.5, (3, 4)) for _ in range(3)]
    ct = rng.uniform(0.5, 1.5, (3, 4))
    tape, inputs, pool, loss = _recorded(values, steps, ct)
    compiled = tape.gradient(loss, inputs, unconnected_gradients="zero")
    with jt.GradientTape() as enclosing:      # watching the inputs selects the recorded path
        enclosing.watch(inputs)
        recorded = tape.gradient(loss, inputs, unconnected_gradients="zero")
    h = 1e-6
    for k, v in enumerate(values):
        numeric = np.zeros_like(v)
        for idx in np.ndindex(v.shape):
            shifted = []
            for sign in (1, -1):
                vs = [x.copy() for x in values]
                vs[k][idx] += sign * h
                shifted.append(float(_program(vs, steps, ct)[1]))
            numeric[idx] = (shifted[0] - shifted[1]) / (2 * h)
        np.testing.assert_allclose(compiled[k].numpy(), recorded[k].numpy(), rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(compiled[k].numpy(), numeric, rtol=1e-5, atol=1e-6)


def _poisoned(self, name, size, dtype):
    return np.full(size, np.nan, dtype)


def _poisoned_scratch(self, size, dtype):
    return np.full(size, np.nan, dtype)


@settings(max_examples=30, deadline=None)
@given(STEPS, st.integers(0, 10**6))
def test_sweeps_read_no_row_before_writing_it(steps, seed):
    """Cotangent rows are initialised by their first write, never by a fill of the buffer: with every executor
    buffer handed out full of NaN, gradients (several targets), Jacobians (K columns, both modes) and Hessians
    are the same numbers, also chunked one column per sweep."""
    rng = np.random.default_rng(seed)
    values = [rng.uniform(-1.5, 1.5, (3, 4)) for _ in range(3)]
    ct = rng.uniform(0.5, 1.5, (3, 4))

    def derivatives():
        tape, inputs, pool, loss = _recorded(values, steps, ct)
        with tape:
            tall = jt.concat([pool[-1], pool[-1] * 2.0], axis=0)     # 24 rows: forward mode w.r.t. 12 entries
        found = tape.gradient([loss, jt.reduce_sum(pool[-2])], inputs, unconnected_gradients="zero")
        found += tape.jacobian(pool[-1], inputs, unconnected_gradients="zero")
        found.append(tape.jacobian(tall, inputs[0], unconnected_gradients="zero"))
        found.append(tape.hessian(loss, inputs[1]))
        return [None if f is None else f.numpy() for f in found]

    clean = derivatives()
    with mock.patch.object(recycling._Workspace, "take", _poisoned), \
            mock.patch.object(recycling._Workspace, "scratch", _poisoned_scratch):
        poisoned = derivatives()
        with mock.patch.object(jt.config, "jacobian_memory_bytes", 1):     # one column per sweep
            chunked = derivatives()
    for c, p, q in zip(clean, poisoned, chunked):
        if c is None:
            assert p is None and q is None
        else:
            assert not np.isnan(p).any() and not np.isnan(q).any()
            np.testing.assert_array_equal(p, c)
            np.testing.assert_allclose(q, c, rtol=1e-12, atol=1e-14)


WIDE = (3, SHARED_ROWS_MIN // 2)       # every value of a random program large enough to share adjoint rows


@settings(max_examples=25, deadline=None)
@given(STEPS, st.integers(0, 10**6))
def test_first_order_sweeps_over_shared_adjoint_rows_give_the_numbers_of_rows_of_their_own(steps, seed):
    """A non-persistent tape's first-order Program lays large slots never live at once over the same adjoint
    rows (planning.adjoint_layout); a persistent tape's owns every row. On random programs of large values, its
    gradients (two targets), reverse Jacobians (K columns, also one per sweep) and forward-mode Jacobians
    (tangent sweeps over the shared rows) equal the persistent tape's bit for bit, with every executor buffer
    handed out full of NaN too: no sweep reads a row outside its slot's lifetime."""
    rng = np.random.default_rng(seed)
    values = [rng.uniform(-1.5, 1.5, WIDE) for _ in range(3)]
    scale0 = np.float64(rng.uniform(0.5, 1.5))
    ct = rng.uniform(0.5, 1.5, WIDE)
    derivatives = ("gradient", "jacobian", "forward jacobian")

    def derivative(kind, persistent):
        inputs = [jt.constant(v) for v in values]
        scale = jt.constant(scale0)
        with jt.GradientTape(persistent=persistent) as tape:
            tape.watch(inputs + [scale])
            pool = [inputs[0] * scale] + inputs[1:]
            for step, s in steps:
                pool.append(_apply(step, s, pool))
            loss = jt.reduce_sum(pool[-1] * ct)
            second = jt.reduce_sum(pool[-2])
            rows = jt.reduce_sum(pool[-1], axis=1)
        if kind == "gradient":
            found = tape.gradient([loss, second], inputs, unconnected_gradients="zero")
        elif kind == "jacobian":        # reverse mode, K = 3 columns
            found = tape.jacobian(rows, inputs, unconnected_gradients="zero")
        else:                           # forward mode: one tangent column for 1,536 target entries
            found = [tape.jacobian(pool[-1], scale, unconnected_gradients="zero")]
        return [f.numpy() for f in found]

    owned = {kind: derivative(kind, True) for kind in derivatives}
    with mock.patch.object(jt.config, "jacobian_memory_bytes", 1):     # one column per sweep
        owned["chunked"] = derivative("jacobian", True)
    with jt.GradientTape() as tape:
        x = jt.constant(values[0])
        tape.watch(x)
        chain = jt.reduce_sum(jt.tanh(jt.sin(x) * 2.0) * 3.0)
    # the source's rows and the loss's, and two slots' rows for the four intermediates: the rows are shared
    assert lower(tape, [chain], [x], reads=READS_FIRST_ORDER).adjoint_size == 3 * x.numpy().size + 1
    with mock.patch.object(recycling._Workspace, "take", _poisoned), \
            mock.patch.object(recycling._Workspace, "scratch", _poisoned_scratch):
        for kind in derivatives:
            for shared, own in zip(derivative(kind, False), owned[kind]):
                np.testing.assert_array_equal(shared, own)
        with mock.patch.object(jt.config, "jacobian_memory_bytes", 1):     # one column per sweep
            for shared, own in zip(derivative("jacobian", False), owned["chunked"]):
                np.testing.assert_array_equal(shared, own)


@pytest.mark.parametrize("width", [8, STACKED_INNER_MAX + 4])
def test_first_writes_of_k_columns_set_rows_full_of_nan(width):
    """Reverse-mode Jacobians (K columns) and gradients of rows above the scalar loops' size: the elementwise
    kernels (unary, binary, and x * x, whose one pass sets both terms), the moves that write each input entry
    once (TRANSPOSE, PAD, and PLACE, concat's rows) and matmul's K-column rows (stacked where short: width 8 in
    sweeps of three columns; one product per row otherwise) set an input's rows on their first write. With every executor buffer handed out
    full of NaN, the Jacobian and the gradient are the clean ones, in one sweep of K columns or in sweeps of
    three, and they match central differences."""
    rng = np.random.default_rng(width)
    x0 = rng.uniform(-1.0, 1.0, (5, 24))
    w = jt.constant(rng.uniform(-0.5, 0.5, (24, width)))

    def f(x):
        # each move is the only reader of its input, so it writes that input's rows first
        moved = jt.transpose(jt.transpose(jt.sin(x) * 0.5) * 2.0)
        padded = jt.pad(jt.cos(x), [[1, 0], [0, 0]])[1:]
        joined = jt.concat([jt.tanh(x), jt.exp(x * 0.1)], axis=0)
        return jt.tanh(jt.matmul(jt.sin(x) * x + x * x + moved + padded + joined[:5] * joined[5:], w))

    def recorded():
        x = jt.constant(x0)
        with jt.GradientTape(persistent=True) as tape:
            tape.watch(x)
            y = f(x)
        return tape, x, y

    def jacobian():
        tape, x, y = recorded()
        return tape.jacobian(y, x).numpy()

    def gradient():
        x = jt.constant(x0)
        with jt.GradientTape() as tape:
            tape.watch(x)
            total = jt.reduce_sum(f(x))
        return tape.gradient(total, x).numpy()

    clean, clean_gradient = jacobian(), gradient()
    tape, x, y = recorded()
    program = execute.lowered(tape, [y], [x])
    per_column = (program.adjoint_size + y.numpy().size) * program.dtype.itemsize
    with mock.patch.object(recycling._Workspace, "take", _poisoned), \
            mock.patch.object(recycling._Workspace, "scratch", _poisoned_scratch):
        poisoned, poisoned_gradient = jacobian(), gradient()
        with mock.patch.object(jt.config, "jacobian_memory_bytes", 3 * per_column):
            assert execute._columns_per_sweep(program, y.numpy().size) == 3
            chunked = jacobian()
    np.testing.assert_array_equal(poisoned, clean)
    np.testing.assert_array_equal(poisoned_gradient, clean_gradient)
    np.testing.assert_allclose(clean_gradient, clean.sum(axis=(0, 1)), rtol=1e-12, atol=1e-12)

    def traced(x):      # the gradient as a replay's gradient step, its adjoint buffer the replay's own
        with jt.GradientTape() as tape:
            tape.watch(x)
            total = jt.reduce_sum(f(x))
        return tape.gradient(total, x)

    replayed = jt.function(traced)
    replayed(jt.constant(x0))
    clean_replay = replayed(jt.constant(x0)).numpy()     # its forward values are the kernels' (within ulps)
    np.testing.assert_allclose(clean_replay, clean_gradient, rtol=1e-12, atol=1e-12)
    (concrete,) = [c for variants in replayed._variants.values() for c in variants]
    concrete._adjoint.fill(np.nan)
    np.testing.assert_array_equal(replayed(jt.constant(x0)).numpy(), clean_replay)
    np.testing.assert_allclose(chunked, clean, rtol=1e-12, atol=1e-14)
    h = 1e-6
    for index in [(0, 0), (2, 7), (4, 23)]:
        shifted = [x0.copy(), x0.copy()]
        shifted[0][index] += h
        shifted[1][index] -= h
        numeric = (f(jt.constant(shifted[0])).numpy() - f(jt.constant(shifted[1])).numpy()) / (2 * h)
        np.testing.assert_allclose(clean[(slice(None), slice(None)) + index], numeric, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("first", [True, False], ids=["first-write", "adds"])
def test_the_cotangent_of_x_times_x_is_both_terms_bit_for_bit(dtype, first):
    """x * x's reverse rule takes both terms in one pass, in the order two passes add them: g x + g x where it
    writes x's cotangent first, (c + g x) + g x where x's cotangent c is already there (a later reader of x, here
    x * 3 weighted by h, wrote it), overflow to inf included; eagerly and in a jt.grad replay."""
    rng = np.random.default_rng(7)
    x0 = rng.uniform(-2.0, 2.0, 1000).astype(dtype)
    x0[:3] = [np.finfo(dtype).max, -np.finfo(dtype).max / 2, 0.0]
    g, h = rng.uniform(-1.0, 1.0, (2, 1000)).astype(dtype)
    g[0] = 0.75         # g x0[0] + g x0[0] overflows
    weights, later = jt.constant(g), jt.constant(h)

    def f(x):
        loss = jt.reduce_sum(weights * (x * x))
        return loss if first else loss + jt.reduce_sum(x * 3.0 * later)

    with np.errstate(over="ignore", invalid="ignore"):
        expected = g * x0 + g * x0 if first else (h * np.dtype(dtype).type(3) + g * x0) + g * x0
        x = jt.constant(x0)
        with jt.GradientTape() as tape:
            tape.watch(x)
            loss = f(x)
        np.testing.assert_array_equal(tape.gradient(loss, x).numpy(), expected)
        replayed = jt.grad(f)
        for _ in range(2):          # the trace, then the compiled replay
            np.testing.assert_array_equal(replayed(x).numpy(), expected)
    assert np.isinf(expected[0])


@settings(max_examples=25, deadline=None)
@given(STEPS, st.integers(0, 10**6))
def test_random_programs_replay_on_new_values(steps, seed):
    """The program as a jt.function traced on one draw and replayed on others: value and gradient equal eager."""
    rng = np.random.default_rng(seed)
    ct = rng.uniform(0.5, 1.5, (3, 4))
    loss = lambda *inputs: _program([x.numpy() for x in inputs], steps, ct)[1]    # noqa: E731

    def traced(*inputs):
        pool = list(inputs)
        for step, s in steps:
            pool.append(_apply(step, s, pool))
        return jt.reduce_sum(pool[-1] * ct)

    value_and_grad = jt.value_and_grad(traced, argnums=(0, 1, 2))
    for _ in range(3):
        inputs = [jt.constant(rng.uniform(-1.5, 1.5, (3, 4))) for _ in range(3)]
        with jt.GradientTape() as tape:
            tape.watch(inputs)
            expected = traced(*inputs)
        expected_grads = tape.gradient(expected, inputs, unconnected_gradients="zero")
        value, grads = value_and_grad(*inputs)
        assert float(value) == pytest.approx(float(loss(*inputs)), rel=1e-10, abs=1e-12)
        for g, e in zip(grads, expected_grads):
            np.testing.assert_allclose(g.numpy(), e.numpy(), rtol=1e-9, atol=1e-12)


def test_a_persistent_tape_plans_each_derivative_once(monkeypatch):
    import jitape.program as program_module
    planned = []
    real = program_module.plan
    monkeypatch.setattr(program_module, "plan", lambda *a: planned.append(1) or real(*a))
    monkeypatch.setattr(program_module, "_plans", {})       # no plan kept from another tape's recording
    x = jt.constant([0.5, -0.25, 2.0])
    with jt.GradientTape(persistent=True) as tape:
        tape.watch(x)
        y = jt.reduce_sum(jt.sin(x) * x)
    first = [tape.gradient(y, x).numpy(), tape.jacobian(y, x).numpy(), tape.hessian(y, x).numpy()]
    assert len(planned) == 1        # one (target, source) pair: the gradient, Jacobian and Hessian share it
    for _ in range(3):
        again = [tape.gradient(y, x).numpy(), tape.jacobian(y, x).numpy(), tape.hessian(y, x).numpy()]
        for a, b in zip(first, again):
            np.testing.assert_array_equal(a, b)
    assert len(planned) == 1
    with tape:                      # recording more: a new Program
        z = y * 2.0
    np.testing.assert_allclose(tape.gradient(z, x).numpy(), 2 * first[0], rtol=1e-6)
    assert len(planned) == 2


def test_tapes_recording_the_same_rows_plan_once(monkeypatch):
    """A training loop records the same rows on a fresh tape every step: the plan of the first serves the rest,
    with each tape's own values; another recording (shapes, an op's attributes, the sources, a dtype) plans
    anew, and so does a Program handed out or a persistent tape's."""
    planned = []
    real = jitape.program.plan
    monkeypatch.setattr(jitape.program, "plan", lambda *a: planned.append(1) or real(*a))
    monkeypatch.setattr(jitape.program, "_plans", {})
    rng = np.random.default_rng(3)

    def step(value, axis=0, dtype=np.float64, both=False):
        x, w = jt.constant(value.astype(dtype)), jt.constant(np.full(value.shape[-1], 0.5, dtype))
        with jt.GradientTape() as tape:
            tape.watch([x, w])
            y = jt.reduce_sum(jt.reduce_sum(jt.sin(x) * w, axis) ** 2)
        found = tape.gradient(y, [x, w] if both else x)
        s = np.sin(value) * 0.5
        expected = np.cos(value) * 0.5 * 2 * np.expand_dims(np.sum(s, axis), axis)
        np.testing.assert_allclose((found[0] if both else found).numpy(), expected,
                                   rtol=1e-5 if dtype == np.float32 else 1e-12)

    for _ in range(4):
        step(rng.standard_normal((3, 4)))
    assert len(planned) == 1
    step(rng.standard_normal((3, 4)), axis=1)       # the same rows but for the reduction's axis
    step(rng.standard_normal((2, 4)))
    step(rng.standard_normal((3, 4)), both=True)
    step(rng.standard_normal((3, 4)), dtype=np.float32)
    assert len(planned) == 5
    for _ in range(2):
        step(rng.standard_normal((3, 4)), axis=1)
        step(rng.standard_normal((3, 4)), both=True)
    assert len(planned) == 5
    x = jt.constant(rng.standard_normal((3, 4)))
    with jt.GradientTape() as tape:
        tape.watch(x)
        y = jt.reduce_sum(jt.sin(x))
    tape.program(y, x)
    tape.program(y, x)
    assert len(planned) == 7        # handed out: arrays of its own, never a kept plan's
    for _ in range(2):              # a persistent tape's Programs are handed out too (tape.program)
        with jt.GradientTape(persistent=True) as tape:
            tape.watch(x)
            y = jt.reduce_sum(jt.sin(x))
        tape.program(y, x)
    assert len(planned) == 9


def test_repeated_gradients_on_a_persistent_tape_make_the_same_python_calls_whatever_the_length():
    from tests.test_tape import _count_python_calls
    counts = {}
    for n in (1_000, 10_000):
        x = jt.constant(0.3)
        with jt.GradientTape(persistent=True) as tape:
            tape.watch(x)
            y = x
            for _ in range(n // 2):
                y = jt.sin(y) * 0.5
        tape.gradient(y, x)
        counts[n], _ = _count_python_calls(lambda: tape.gradient(y, x))
    assert counts[1_000] == counts[10_000], counts


def test_a_program_pickles_with_its_own_arrays_only():
    import pickle
    x = jt.constant(np.linspace(0, 1, 50))
    with jt.GradientTape() as tape:
        tape.watch(x)
        y = jt.reduce_sum(jt.exp(x) * x)
    program = tape.program(y, x)
    data = pickle.dumps(program)
    assert len(data) < 8_000
    copy = pickle.loads(data)
    for name in ("code", "slots", "iattr", "fattr", "arena", "adjoint_rows", "targets", "sources"):
        np.testing.assert_array_equal(getattr(copy, name), getattr(program, name))
    assert str(copy) == str(program)


def test_first_order_arena_holds_only_the_values_derivative_rules_read():
    """A first-order Program copies only what its derivative rules read (opcodes.FIRST_ORDER_READS): here exp's
    output; the linear ops' values (x, the shift, the scaled exp) are never copied. Its gradient is exact with
    every other entry of the arena NaN (the tests run with jt.config.check_unread_values)."""
    x = jt.constant(np.linspace(-1.0, 1.0, 50))
    with jt.GradientTape() as tape:
        tape.watch(x)
        e = jt.exp(x - 0.5)
        y = jt.reduce_sum(jt.transpose(jt.reshape(e, (5, 10))) * 2.0)

    def nan_arena(size, dtype):
        return np.full(size, np.nan, dtype)

    lean = lower(tape, [y], [x], nan_arena, READS_FIRST_ORDER)
    full = lower(tape, [y], [x], nan_arena)
    filled = lean.arena[~np.isnan(lean.arena)]
    np.testing.assert_array_equal(filled, e.numpy())
    assert not np.isnan(full.arena).any() and full.arena.size == lean.arena.size
    np.testing.assert_array_equal(tape.gradient(y, x).numpy(), 2.0 * e.numpy())


def test_a_persistent_tapes_arena_holds_what_derivatives_of_any_order_read_until_it_is_handed_out():
    """A persistent tape's Program copies the values its rules of any order read (opcodes.DERIVATIVE_READS:
    sin's output too, for its second derivative), and its gradient, Hessian and HVP are exact with the other
    rows NaN (jt.config.check_unread_values); tape.program() and pickling fill them (Program.complete)."""
    x = jt.constant(np.linspace(-1.0, 1.0, 12))
    xs = x.numpy() - 0.5

    def recorded():
        with jt.GradientTape(persistent=True) as tape:
            tape.watch(x)
            s = jt.sin(x - 0.5)
            y = jt.reduce_sum(jt.reshape(s, (3, 4)) * 2.0)
        return tape, y

    tape, y = recorded()
    program = lower(tape, [y], [x], reads=READS_ANY_ORDER)
    kept = program.arena[~np.isnan(program.arena)]
    np.testing.assert_array_equal(np.sort(kept), np.sort(np.concatenate([xs, np.sin(xs)])))
    np.testing.assert_allclose(tape.gradient(y, x).numpy(), 2.0 * np.cos(xs))
    np.testing.assert_allclose(tape.hessian(y, x).numpy(), np.diag(-2.0 * np.sin(xs)))
    np.testing.assert_allclose(tape.hessian_vector_product(y, x, jt.ones_like(x)).numpy(), -2.0 * np.sin(xs))
    assert tape.program(y, x) is program and not np.isnan(program.arena).any()
    tape, y = recorded()
    copy = pickle.loads(pickle.dumps(lower(tape, [y], [x], reads=READS_ANY_ORDER)))
    assert not np.isnan(copy.arena).any()


# Large values read where they live (Program.homes): each case's reverse rules read large recorded values
# (x, w, outputs) through every family of reverse kernel; the float32 and strided operands stay in the arena
N = 256        # (N, N) = 65,536 entries: program.HOME_MIN_ENTRIES
HOME_CASES = {
    "unary and binary": lambda x, w: jt.sin(x) * w + jt.exp(x * 0.1) / (w * w + 1.0),
    "matmul": lambda x, w: jt.tanh(x @ w),
    "solve": lambda x, w: jt.linalg.solve(w + 20.0 * jt.eye(N, dtype="float64"), x),
    "reductions": lambda x, w: jt.reduce_max(x * w, axis=0) + jt.reduce_prod(jt.sigmoid(x), axis=1),
    "where": lambda x, w: jt.where(x > 0, x * w, -w),
    "strided and float32 operands": lambda x, w: jt.reduce_sum(x[:, ::2] * w[:, 1::2]) + jt.reduce_sum(jt.cast(
        jt.cast(x, "float32")[:, :N // 2] * jt.cast(w, "float32")[:, N // 2:], "float64")) + jt.exp(x * 0.01),
}


@pytest.mark.parametrize("case", list(HOME_CASES))
def test_large_values_read_where_they_live_give_the_gradient_of_a_filled_arena(case, monkeypatch):
    f = HOME_CASES[case]
    rng = np.random.default_rng(3)
    x, w = jt.constant(rng.standard_normal((N, N))), jt.constant(rng.standard_normal((N, N)))

    def gradient():
        with jt.GradientTape() as tape:
            tape.watch([x, w])
            y = jt.reduce_sum(f(x, w))
        return [g.numpy() for g in tape.gradient(y, [x, w])]

    programs = []
    monkeypatch.setattr(jitape.tape, "source_gradients", lambda program, *rest: programs.append(program) or
                        execute.source_gradients(program, *rest))
    found = gradient()
    (program,) = programs
    assert np.count_nonzero(program.homes) >= 1 and np.isnan(program.arena).any()     # homes' rows: NaN
    monkeypatch.setattr(jitape.program, "HOME_MIN_ENTRIES", 1 << 62)      # every value copied into the arena
    for g, e in zip(found, gradient()):
        np.testing.assert_array_equal(g, e)
    again = execute.source_gradients(program.complete(), [np.ones((1, 1))], [x, w])    # the values copied in
    assert program.homes.size == 0
    for g, e in zip(again, found):
        np.testing.assert_array_equal(g.numpy(), e)


def _chunked(jacobian):
    """`jacobian()` with jt.config.jacobian_memory_bytes so small that each sweep carries one column."""
    kept = jt.config.jacobian_memory_bytes
    jt.config.jacobian_memory_bytes = 1
    try:
        return jacobian()
    finally:
        jt.config.jacobian_memory_bytes = kept


def _every_derivative(persistent):
    """Every derivative path of a tape (sweeps: reverse K = 1, K > 1 and chunked, tangent, second-order, per-example)
    over ops whose rules read their values: matmul, sin, exp, sigmoid, max, prod."""
    rng = np.random.default_rng(5)
    x, w = jt.constant(rng.standard_normal((4, 6))), jt.constant(rng.standard_normal((6, 8)) * 0.5)
    results = []
    for derivative in range(9):
        with jt.GradientTape(persistent=persistent) as tape:
            tape.watch([x, w])
            h = x @ w
            rows = jt.sin(h) * jt.exp(h * 0.1)                                                 # (4, 8)
            per_example = jt.reduce_sum(rows, axis=1) + jt.reduce_max(x, axis=1) * jt.reduce_prod(jt.sigmoid(x), axis=1)
            y = jt.reduce_sum(per_example)
        results += [np.asarray(r) for r in (
            (lambda: tape.gradient(y, [x, w])),
            (lambda: [tape.jacobian(per_example, x)]),       # reverse mode: K = 4 columns
            (lambda: [tape.jacobian(rows, x)]),              # forward mode: K = 24 tangent columns
            (lambda: [tape.batch_jacobian(rows, x)]),
            (lambda: tape.per_example_gradients(per_example, [w])),
            (lambda: [tape.hessian(y, x)]),
            (lambda: [tape.hessian_vector_product(y, w, jt.ones_like(w))]),
            (lambda: [_chunked(lambda: tape.jacobian(rows, w))]),        # reverse mode, one column per sweep
            (lambda: [_chunked(lambda: tape.jacobian(per_example, x))]),
        )[derivative]()]
    return results


@pytest.mark.parametrize("persistent", [False, True])
def test_every_derivative_path_reads_values_where_they_live(persistent, monkeypatch):
    monkeypatch.setattr(jitape.program, "HOME_MIN_ENTRIES", 1 << 62)
    expected = _every_derivative(persistent)
    homes = []
    home_slots = jitape.program._home_slots
    monkeypatch.setattr(jitape.program, "_home_slots", lambda *args: homes.append(home_slots(*args)) or homes[-1])
    monkeypatch.setattr(jitape.program, "HOME_MIN_ENTRIES", SMALL + 1)   # every value the scalar loops do not take
    found = _every_derivative(persistent)
    assert len(homes) >= 9 and all(len(h) >= 3 for h in homes)      # x, w, and values the rules read
    for f, e in zip(found, expected):
        np.testing.assert_array_equal(f, e)


def test_values_small_enough_for_the_scalar_loops_stay_in_the_arena():
    """The CPU sweeps' loops over rows of at most SMALL entries read the arena directly."""
    assert jitape.program.HOME_MIN_ENTRIES > SMALL


def test_programs_handed_out_hold_every_value(monkeypatch):
    monkeypatch.setattr(jitape.program, "HOME_MIN_ENTRIES", SMALL + 1)
    x = jt.constant(np.linspace(-1.0, 1.0, 20).reshape(4, 5))
    with jt.GradientTape(persistent=True) as tape:
        tape.watch(x)
        y = jt.reduce_sum(jt.sin(x) * x)
    assert np.count_nonzero(lower(tape, [y], [x], reads=READS_ANY_ORDER).homes) == 2
    g = tape.gradient(y, x).numpy()     # the kept Program, its values at home
    program = tape.program(y, x)        # the same Program, its values copied in
    assert program.homes.size == 0 and not np.isnan(program.arena).any()
    np.testing.assert_array_equal(tape.gradient(y, x).numpy(), g)
    with jt.GradientTape() as tape:
        tape.watch(x)
        y = jt.reduce_sum(jt.sin(x) * x)
    copy = pickle.loads(pickle.dumps(lower(tape, [y], [x], reads=READS_FIRST_ORDER)))
    assert copy.homes.size == 0 and not np.isnan(copy.arena).any()
