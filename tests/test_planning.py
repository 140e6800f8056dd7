"""Planning (jitape_kernels.planning): the adjoint layout of first-order Programs, whose large slots share rows
where they are never live at once; gradient steps whose adds, subs and copies forward their output's cotangent
to inputs only they read."""
from unittest import mock

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import jitape as jt
from jitape import execute, replay
from jitape.program import SHARED_ROWS_MIN, lower
from jitape_kernels import opcodes as oc
from jitape_kernels.layout import BLOCK, FUSE_MIN_SIZE
from jitape_kernels.planning import (FORWARDED, READS_ANY_ORDER, READS_FIRST_ORDER, READS_REVERSE, RUNS_AND_SETS,
                                     adjoint_layout, cotangent_homes, derivative_plan)

from .test_fusion import _bits, _generated_reverse_rows
from .test_layout import _bound_arrays, _only_variant

LARGE, SMALL = SHARED_ROWS_MIN, SHARED_ROWS_MIN - 1


def _code(rows, n_leaves):
    """Instruction rows of a recording: rows[k] = (the slots row k reads, whether it writes a new slot or the
    previous row's again, as concat's PLACE rows share one output); (code, the number of slots). The layout reads
    only OUT and IN0..IN2."""
    code = np.full((len(rows), oc.W), -1, np.int64)
    n_slots = n_leaves
    for k, (ins, again) in enumerate(rows):
        if not (again and k):
            n_slots += 1
        code[k, oc.OUT] = n_slots - 1
        code[k, oc.IN0:oc.IN0 + len(ins)] = ins
    return code, n_slots


def _live(code, n_slots):
    """Per slot, (first row writing it, last row reading it): its rows' lifetime, computed independently."""
    first = {int(code[k, oc.OUT]): k for k in range(code.shape[0] - 1, -1, -1)}
    last = {}
    for k in range(code.shape[0]):
        for s in code[k, oc.IN0:oc.IN2 + 1]:
            if s >= 0:
                last[int(s)] = k
    return [(first.get(s), last.get(s)) for s in range(n_slots)]


RECORDINGS = st.integers(1, 4).flatmap(lambda n_leaves: st.tuples(
    st.just(n_leaves),
    st.lists(st.tuples(st.lists(st.integers(0, 10**6), min_size=1, max_size=3), st.booleans(), st.booleans(),
                       st.booleans(), st.integers(0, 5)), min_size=1, max_size=60),
    st.lists(st.integers(SMALL - 3, LARGE + 2000), min_size=n_leaves, max_size=n_leaves)))


@settings(max_examples=300, deadline=None)
@given(RECORDINGS)
def test_slots_that_share_adjoint_rows_are_never_live_at_once(recording):
    """Any recording (rows writing one output twice, inactive slots): two slots whose rows overlap are both
    large and unpinned, and one's last read comes before the other's first write; the pinned (sources, target)
    and small slots have rows of their own, inactive ones none; the layout is never larger than one row per
    active slot, and without sharing it is exactly that."""
    n_leaves, steps, leaf_sizes = recording
    rows, n_slots = [], n_leaves
    for k, (picks, _, again, _, _) in enumerate(steps):
        # mostly recent slots (short lifetimes, so rows are shared), now and then any
        rows.append(([n_slots - 1 - pick % min(n_slots, 3 if pick % 5 else 10**6) for pick in picks], again))
        n_slots += not (again and k)
    code, n_slots = _code(rows, n_leaves)
    produced = steps[:n_slots - n_leaves]       # per slot a row wrote: its size, whether active, whether pinned
    sizes = np.array(leaf_sizes + [LARGE + 7 * s if large else 1 + s for s, (_, large, _, _, _) in enumerate(produced)],
                     np.int64)
    inactive = [n_leaves + s for s, (_, _, _, off, _) in enumerate(produced) if off]
    pinned = np.zeros(n_slots, np.bool_)
    pinned[:n_leaves] = True        # sources; then targets: the last slot, and intermediates read by later rows
    pinned[-1] = True
    pinned[[n_leaves + s for s, (_, _, _, _, pin) in enumerate(produced) if pin == 0]] = True
    active = np.zeros(n_slots, np.int64)
    active[inactive] = -1
    total_active = sizes[active >= 0].sum()
    unshared = active.copy()
    assert adjoint_layout(code, sizes, unshared, pinned, 0, np.arange(n_slots)) == total_active
    assert (unshared[inactive] == -1).all()
    layout = active.copy()
    total = adjoint_layout(code, sizes, layout, pinned, LARGE, np.arange(n_slots))
    assert total <= total_active and (layout[inactive] == -1).all()
    used = np.flatnonzero(layout >= 0)
    assert (layout[used] + sizes[used] <= total).all()
    live = _live(code, n_slots)
    for i, a in enumerate(used):
        for b in used[i + 1:]:
            if layout[a] < layout[b] + sizes[b] and layout[b] < layout[a] + sizes[a]:
                assert not pinned[a] and not pinned[b] and sizes[a] >= LARGE and sizes[b] >= LARGE
                (first_a, last_a), (first_b, last_b) = live[a], live[b]
                assert last_a < first_b or last_b < first_a
    # every row an add: the inputs only it reads, of its output's size and unpinned, keep their cotangents in its
    # output's rows (a chain of such rows: in its last output's); a home's rows are live from the first of its
    # slots written to the last read, and two homes whose rows overlap are never live at once
    code[:, oc.OP] = oc.ADD
    home, _ = cotangent_homes(code, np.full(code.shape[0], RUNS_AND_SETS, np.int64), active >= 0, sizes, pinned)
    homed = active.copy()
    assert adjoint_layout(code, sizes, homed, pinned, LARGE, home) <= total_active
    assert (homed[inactive] == -1).all() and (homed[used] == homed[home[used]]).all()
    readers = np.bincount(code[:, oc.IN0:oc.IN2 + 1][code[:, oc.IN0:oc.IN2 + 1] >= 0], minlength=n_slots)
    for s in used[home[used] != used]:
        (k,) = np.flatnonzero((code[:, oc.IN0:oc.IN2 + 1] == s).any(axis=1))
        assert readers[s] == 1 and not pinned[s] and sizes[s] == sizes[code[k, oc.OUT]]
    spans, m = {}, code.shape[0]
    for s in used:
        first, last = live[s]
        lo, hi = spans.get(home[s], (m, -1))
        spans[home[s]] = (min(lo, m if first is None else first), max(hi, -1 if last is None else last))
    roots = sorted(spans)
    for i, a in enumerate(roots):
        for b in roots[i + 1:]:
            if homed[a] < homed[b] + sizes[b] and homed[b] < homed[a] + sizes[a]:
                assert not pinned[a] and not pinned[b] and sizes[a] >= LARGE and sizes[b] >= LARGE
                assert spans[a][1] < spans[b][0] or spans[b][1] < spans[a][0]


def test_a_chain_of_large_ops_needs_the_rows_of_two_slots_and_inactive_slots_get_none():
    """x -> a -> b -> c -> d -> loss: each intermediate's rows are dead once the next op's reverse ran, so the
    four intermediates take two slots' rows; x (the source) and the loss keep their own."""
    code, _ = _code([([0], False), ([1], False), ([2], False), ([3], False), ([4], False)], 1)
    sizes = np.array([LARGE, LARGE, LARGE, LARGE, LARGE, 1], np.int64)
    layout = np.zeros(6, np.int64)
    pinned = np.array([True, False, False, False, False, True])
    assert adjoint_layout(code, sizes, layout, pinned, LARGE, np.arange(6)) == 3 * LARGE + 1
    assert len({layout[1], layout[2]}) == 2 and layout[3] == layout[1] and layout[4] == layout[2]
    inactive = np.array([0, -1, 0, 0, 0, 0], np.int64)
    adjoint_layout(code, sizes, inactive, pinned, LARGE, np.arange(6))
    assert inactive[1] == -1


def _chain(x):
    y = jt.sin(x)
    for _ in range(6):
        y = jt.tanh(y) * 0.9 + x
    return jt.reduce_sum(y * y)


def test_a_tape_s_first_order_program_shares_rows_and_a_persistent_tape_s_does_not():
    """Which Programs share: those a non-persistent tape lowers for first-order derivatives; a persistent tape's
    (kept: its cotangents serve Hessians, whose second-order sweep reads every one) and those of higher
    orders own every row. Both give the same gradient, bit for bit."""
    x = jt.constant(np.linspace(-1.0, 1.0, 2 * LARGE).reshape(2, LARGE))
    programs, gradients = {}, {}
    for persistent, reads in ((False, READS_FIRST_ORDER), (False, READS_ANY_ORDER), (True, READS_FIRST_ORDER)):
        with jt.GradientTape(persistent=persistent) as tape:
            tape.watch(x)
            loss = _chain(x)
        program = programs[persistent, reads] = lower(tape, [loss], [x], reads=reads)
        gradients[persistent, reads] = execute.source_gradients(program, None, [x])[0].numpy()
    rows = lambda program: int(program.slots[program.adjoint_rows >= 0, oc.SIZE].sum())  # noqa: E731
    shared = programs[False, READS_FIRST_ORDER]
    assert shared.adjoint_size < rows(shared) / 3
    for key in ((False, READS_ANY_ORDER), (True, READS_FIRST_ORDER)):
        assert programs[key].adjoint_size == rows(programs[key])
        np.testing.assert_array_equal(gradients[key], gradients[False, READS_FIRST_ORDER])


def test_batch_jacobians_over_shared_rows_equal_those_over_rows_of_their_own():
    """batch_jacobian's reverse sweep (K = target features) and tangent sweep (K = source features, fewer than the
    target's) over a non-persistent tape's shared rows give a persistent tape's numbers, bit for bit."""
    rng = np.random.default_rng(3)
    x0 = rng.uniform(-1.0, 1.0, (64, 32))
    w_narrow, w_wide = jt.constant(rng.uniform(-0.5, 0.5, (32, 8))), jt.constant(rng.uniform(-0.5, 0.5, (32, 48)))

    def batch_jacobians(persistent):
        found = []
        for w in (w_narrow, w_wide):
            x = jt.constant(x0)
            with jt.GradientTape(persistent=persistent) as tape:
                tape.watch(x)
                h = jt.tanh(jt.sin(x) * 2.0) + x * x
                y = jt.matmul(jt.exp(h * 0.5) - h, w)
            program = lower(tape, [y], [x], reads=READS_FIRST_ORDER)
            found.append((tape.batch_jacobian(y, x).numpy(), program.adjoint_size))
        return found

    owned, shared = batch_jacobians(True), batch_jacobians(False)
    for (own, own_rows), (share, shared_rows) in zip(owned, shared):
        assert shared_rows < own_rows
        np.testing.assert_array_equal(share, own)


def test_per_example_gradients_of_a_program_with_shared_rows_lay_out_their_own():
    """A non-persistent tape's per-example Program is planned first-order (its adjoint rows shared), and the
    per-example sweep lays out buffers of its own (rows by layout, parameters by example): the same bits as a
    persistent tape's."""
    rng = np.random.default_rng(5)
    x = jt.constant(rng.uniform(-1.0, 1.0, (256, 32)))
    y = jt.constant(rng.uniform(-1.0, 1.0, (256, 1)))

    def per_example(persistent):
        w1, w2 = jt.Variable(np.linspace(-0.5, 0.5, 32 * 16).reshape(32, 16)), jt.Variable(np.ones((16, 1)) * 0.1)
        with jt.GradientTape(persistent=persistent) as tape:
            h = jt.tanh(jt.matmul(x, w1))
            losses = jt.square(jt.matmul(jt.sin(h) * h, w2) - y)[:, 0]
        program = lower(tape, [losses], [w1, w2], reads=READS_FIRST_ORDER)
        return [g.numpy() for g in tape.per_example_gradients(losses, [w1, w2])], program

    (owned, own_program), (shared, shared_program) = per_example(True), per_example(False)
    assert shared_program.adjoint_size < own_program.adjoint_size
    for s, o in zip(shared, owned):
        np.testing.assert_array_equal(s, o)


# Programs of adds, subs and copies (identity, reshape) among other rules, each reading recent values (so some
# have one reader, some several), an input twice, a sum broadcast back (sizes differ), or sums (scalar rows whose
# inputs rows outside scalar runs produce)
KINDS = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "identity": lambda a, b: jt.identity(a),
         "reshape": lambda a, b: jt.reshape(jt.reshape(a, (1, -1)), a.shape), "mul": lambda a, b: a * b,
         "sin": lambda a, b: jt.sin(a), "scale": lambda a, b: a * 0.5, "twice": lambda a, b: a + a,
         "broadcast": lambda a, b: a + jt.reduce_sum(b), "sums": lambda a, b: jt.reduce_sum(a) + jt.reduce_sum(b)}
STEPS = st.lists(st.tuples(st.sampled_from(sorted(KINDS)), st.integers(0, 3), st.integers(0, 3)), min_size=1,
                 max_size=12)
FUSED = FUSE_MIN_SIZE + BLOCK + 3       # rows in fused reverse groups


def _values(steps, x, w):
    values = [x, w]
    for kind, i, j in steps:
        values.append(KINDS[kind](values[-1 - i % len(values)], values[-1 - j % len(values)]))
    return values


def _loss(steps):
    return lambda x, w: jt.reduce_sum(_values(steps, x, w)[-1])


def _replayed_gradients(steps, x, w, size):
    """Per path, what it gives: a bound jt.grad replay, a tape's gradient inside a jt.function (a gradient step),
    and for small sizes a bound jt.jacobian of the last value (K columns)."""
    grad = jt.grad(_loss(steps), argnums=(0, 1))
    grad(x, w), grad(x, w)      # traced, then bound
    step = jt.function(lambda x, w: _taped(steps, x, w))
    step(x, w)
    found = {"jt.grad": grad(x, w), "gradient step": step(x, w)}
    if size < FUSED:
        jacobian = jt.jacobian(lambda x, w: _values(steps, x, w)[-1], argnums=(0, 1))
        jacobian(x, w), jacobian(x, w)
        found["jt.jacobian"] = jacobian(x, w)
    return {path: [g.numpy() for g in grads] for path, grads in found.items()}


def _taped(steps, x, w):
    with jt.GradientTape() as tape:
        tape.watch([x, w])
        loss = _loss(steps)(x, w)
    return tape.gradient(loss, [x, w], unconnected_gradients="zero")


def _not_forwarded(code, slots, targets, sources):
    """planning.derivative_plan whose reverse-only rows copy every cotangent."""
    kept, adjoint_rows, adjoint_size, flags, _, _ = derivative_plan(code, slots, targets, sources)
    return kept, adjoint_rows, adjoint_size, flags, kept, flags


@settings(max_examples=60, deadline=None)
@given(STEPS, st.sampled_from([(), (5,), (FUSED,)]))
def test_forwarded_cotangents_give_every_replayed_path_the_bits_of_copies(steps, shape):
    """A gradient step's rows with forwarded cotangents (scalar runs, rows one by one, fused reverse groups by
    blocks, K columns) give the bits of the same step that copies them, and the eager tape's gradients."""
    rng = np.random.default_rng(len(steps))
    x, w = (jt.constant(rng.uniform(-1.0, 1.0, shape)) for _ in range(2))
    runs = jt.config.fused_kernel_runs
    jt.config.fused_kernel_runs = None      # the generated kernels: test_a_generated_reverse_kernel_...
    try:
        forwarded = _replayed_gradients(steps, x, w, int(np.prod(shape)))
        with mock.patch.object(replay, "derivative_plan", _not_forwarded):
            copied = _replayed_gradients(steps, x, w, int(np.prod(shape)))
    finally:
        jt.config.fused_kernel_runs = runs
    with jt.GradientTape(persistent=True) as tape:
        tape.watch([x, w])
        last = _values(steps, x, w)[-1]
        loss = jt.reduce_sum(last)
    eager = {"jt.grad": tape.gradient(loss, [x, w], unconnected_gradients="zero")}
    eager["gradient step"] = eager["jt.grad"]
    if "jt.jacobian" in forwarded:
        eager["jt.jacobian"] = tape.jacobian(last, [x, w], unconnected_gradients="zero")
    for path, grads in forwarded.items():
        for got, want, reference in zip(grads, copied[path], eager[path]):
            np.testing.assert_array_equal(_bits(got), _bits(want))
            np.testing.assert_allclose(got, reference.numpy(), rtol=1e-12, atol=1e-12)


def _bound_grad(f, x, w):
    """jt.grad of f w.r.t. both arguments, traced and bound (its second call), with the arrays its replays run."""
    function = replay.Function(f, differentiated=True)
    grad = jt.grad(function, argnums=(0, 1))
    grad(x, w), grad(x, w)
    return grad, _bound_arrays(_only_variant(function))


def test_a_scalar_chain_s_step_forwards_every_add_s_cotangent_and_only_there():
    """W1's y = sin(y) * x + 0.5 * y: each add writes two inputs only it reads, which hold their cotangents in its
    output's rows (FORWARDED: the row computes nothing; its inputs' producers in its scalar run, it is skipped
    as a row that never runs, leaving no marks); the mul's, sin's and scale's inputs keep rows of their own; x (a
    source, read by every mul) is never forwarded."""
    def chain(x, w):
        y = x
        for _ in range(5):
            y = jt.sin(y) * x + 0.5 * y
        return y * w

    x, w = jt.constant(0.3, dtype="float64"), jt.constant(1.5, dtype="float64")
    grad, arrays = _bound_grad(chain, x, w)
    code, flags = arrays["step_code"], arrays["step_scalars"][:, -1]
    adds = code[:, oc.OP] == oc.ADD
    assert adds.sum() == 5 and (flags[adds] == 0).all() and (flags[~adds] != 0).all()
    assert not (flags[~adds] & FORWARDED).any()
    for c in (0, 1):
        assert (code[adds, oc.IN0_ADJ + c] == code[adds, oc.OUT_ADJ]).all()
    kept = ~adds
    assert (code[kept, oc.IN0_ADJ] != code[kept, oc.OUT_ADJ]).all()
    assert set(code[code[:, oc.IN1] == 0, oc.IN1_ADJ].tolist()) == {code[code[:, oc.IN0] == 0, oc.IN0_ADJ][0]}
    with jt.GradientTape(persistent=True) as tape:
        tape.watch([x, w])
        y = chain(x, w)
    for got, want in zip(grad(x, w), tape.gradient(y, [x, w])):
        np.testing.assert_allclose(float(got), float(want), rtol=1e-14)


def test_inputs_read_twice_broadcast_or_pinned_keep_rows_of_their_own():
    """Exactly the inputs of the rule are forwarded: an add's, a sub's first or a copy's input that only that row
    reads, of its output's size, neither the target nor a source. Not x + x's (two reads), a sub's second (its
    cotangent is negated), a scalar's broadcast to the sum's size, nor a source read once by an add."""
    def f(x, w):
        a = jt.sin(x)
        c = jt.cos(x) - jt.exp(w)
        return jt.reduce_sum(jt.identity(a + a) + jt.reduce_sum(c) + (x + w))

    x, w = jt.constant(np.linspace(0.0, 1.0, 4)), jt.constant(np.linspace(1.0, 2.0, 4))
    grad, arrays = _bound_grad(f, x, w)
    code, sizes = arrays["step_code"], arrays["slots"][:, oc.SIZE]
    pinned = set(arrays["moves"][:, 3].tolist()) | set(arrays["steps"][:, 7].tolist())
    readers = np.bincount(code[:, oc.IN0:oc.IN2 + 1][code[:, oc.IN0:oc.IN2 + 1] >= 0], minlength=sizes.size)
    forwarded = set()
    for r in range(code.shape[0]):
        op, out = int(code[r, oc.OP]), code[r, oc.OUT]
        for c in range(3):
            s = code[r, oc.IN0 + c]
            if s < 0 or code[r, oc.IN0_ADJ + c] < 0:
                continue
            rule = (oc.COTANGENT_IS_OUTPUTS[op] >> c & 1 and readers[s] == 1 and int(s) not in pinned
                    and sizes[s] == sizes[out])
            assert (code[r, oc.IN0_ADJ + c] == code[r, oc.OUT_ADJ]) == bool(rule)
            if rule:
                forwarded.add((oc.NAMES[op], c))
    assert {("sub", 0), ("copy", 0), ("add", 0)} <= forwarded and ("sub", 1) not in forwarded
    a_plus_a = (code[:, oc.OP] == oc.ADD) & (code[:, oc.IN0] == code[:, oc.IN1])
    sources_added = (code[:, oc.OP] == oc.ADD) & np.isin(code[:, oc.IN0], sorted(pinned))
    assert a_plus_a.sum() == 1 and sources_added.sum() == 1
    with jt.GradientTape(persistent=True) as tape:
        tape.watch([x, w])
        y = f(x, w)
    for got, want in zip(grad(x, w), tape.gradient(y, [x, w])):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-14)


def test_a_generated_reverse_kernel_with_forwarded_cotangents_gives_the_block_path_s_bits(kernels_at):
    """A fused reverse group whose adds forward cotangents, by a generated kernel and block by block."""
    rng = np.random.default_rng(2)
    x, w = (jt.constant(rng.uniform(-1.0, 1.0, FUSED).astype(np.float32)) for _ in range(2))

    def f(x, w):
        u = jt.tanh(x) * w + x * 0.5        # rules generated kernels have (not sin's)
        v = jt.identity(u * u) + jt.exp(w)
        return jt.reduce_sum(v - u)

    results = {}
    for runs in (None, 1):
        kernels_at(runs)
        function = replay.Function(f, differentiated=True)
        grad = jt.grad(function, argnums=(0, 1))
        grad(x, w), grad(x, w)      # traced, then bound
        results[runs] = [g.numpy() for g in grad(x, w)]
        arrays = _bound_arrays(_only_variant(function))
        assert (arrays["step_scalars"][:, -1] & FORWARDED).any()
    assert {oc.ADD, oc.COPY, oc.SUB} <= _generated_reverse_rows(arrays)
    for got, want in zip(results[1], results[None]):
        np.testing.assert_array_equal(_bits(got), _bits(want))


@settings(max_examples=60, deadline=None)
@given(STEPS, st.sampled_from([(), (5,), (LARGE + 3,)]))
def test_a_tape_s_gradient_over_forwarded_and_shared_rows_gives_a_persistent_tape_s_bits(steps, shape):
    """A non-persistent tape's gradient (READS_REVERSE: forwarded cotangents, large slots' rows shared) and a
    persistent tape's (every slot's rows its own, nothing forwarded) are the same bits, rows run one by one or
    by the scalar loops; its Program forwards where the rule says."""
    rng = np.random.default_rng(len(steps))
    x, w = (jt.constant(rng.uniform(-1.0, 1.0, shape)) for _ in range(2))
    found = {}
    for persistent in (False, True):
        with jt.GradientTape(persistent=persistent) as tape:
            tape.watch([x, w])
            loss = _loss(steps)(x, w)
        if not persistent:
            program = lower(tape, [loss], [x, w], reads=READS_REVERSE)
        found[persistent] = [g.numpy() for g in tape.gradient(loss, [x, w], unconnected_gradients="zero")]
    for got, want in zip(found[False], found[True]):
        np.testing.assert_array_equal(_bits(got), _bits(want))
    code, sizes = program.code, program.slots[:, oc.SIZE]
    readers = np.bincount(code[:, oc.IN0:oc.IN2 + 1][code[:, oc.IN0:oc.IN2 + 1] >= 0], minlength=sizes.size)
    pinned = set(program.targets.tolist()) | set(program.sources.tolist())
    for r in range(code.shape[0]):
        for c in range(3):
            s = code[r, oc.IN0 + c]
            if s >= 0 and code[r, oc.IN0_ADJ + c] >= 0:
                rule = (oc.COTANGENT_IS_OUTPUTS[code[r, oc.OP]] >> c & 1 and readers[s] == 1
                        and int(s) not in pinned and sizes[s] == sizes[code[r, oc.OUT]])
                assert (code[r, oc.IN0_ADJ + c] == code[r, oc.OUT_ADJ]) == bool(rule)
