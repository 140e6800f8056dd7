"""The generated kernels of fused groups (jitape_kernels.cpu.fusion): every elementwise op and every broadcast a
group holds, and the reduction after it a kernel computes, give the block-by-block run's bits, in plain replays,
bound gradients, loaded functions and in-place variable updates; groups compile at the configured run, and
broadcasts that do not fit one loop nest keep the block path; the reverse groups of bound gradients run generated
kernels with the block path's bits too."""
import inspect
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import jitape as jt
from jitape import nest
from jitape.replay import Function
from jitape_kernels import opcodes as oc
from jitape_kernels.cpu import fusion, interpreter
from jitape_kernels.cpu.reduction import SHORT_ROWS
from jitape_kernels.layout import BLOCK, FUSE_MIN_SIZE, SC_FLAGS

from .test_layout import BROADCASTS, REVERSE_CASES, _bound_arrays, _only_variant

N = FUSE_MIN_SIZE + BLOCK + 3


# (opcode, a value of it over u and y) for every op a generated kernel evaluates (fusion._ENTRY_RULES) but SCALE,
# which every case's u holds
RULES = [(oc.NEG, lambda u, y: -u), (oc.SQUARE, lambda u, y: jt.square(u)), (oc.SQRT, lambda u, y: jt.sqrt(u)),
         (oc.ABS, lambda u, y: jt.abs(u)), (oc.RELU, lambda u, y: jt.nn.relu(u)), (oc.EXP, lambda u, y: jt.exp(u)),
         (oc.LOG, lambda u, y: jt.math.log(u)), (oc.TANH, lambda u, y: jt.tanh(u)),
         (oc.SIGMOID, lambda u, y: jt.sigmoid(u)), (oc.ADD, lambda u, y: u + y), (oc.SUB, lambda u, y: u - y),
         (oc.MUL, lambda u, y: u * y), (oc.DIV, lambda u, y: u / y), (oc.MAXIMUM, jt.maximum),
         (oc.MINIMUM, jt.minimum), (oc.GREATER, lambda u, y: u > y), (oc.GREATER_EQUAL, lambda u, y: u >= y),
         (oc.LESS, lambda u, y: u < y), (oc.LESS_EQUAL, lambda u, y: u <= y),
         (oc.EQUAL, lambda u, y: jt.equal(u, jt.round(y))), (oc.NOT_EQUAL, jt.not_equal),
         (oc.WHERE, lambda u, y: jt.where(u > y, u, y))]
# vectormath's rules, whose fused multiply-adds LLVM places per loop: a generated kernel's values of them are
# the block path's within one unit in the last place
VECTORMATH = {oc.EXP, oc.LOG, oc.TANH, oc.SIGMOID}


def _kernel_table(replay):
    """The generated kernels' table a bound replay passes replay_sweep (its `kernels` argument)."""
    return replay.args[_KERNELS_ARGUMENT]


_KERNELS_ARGUMENT = list(inspect.signature(interpreter.replay_sweep.py_func).parameters).index("kernels")


def _generated_rows(concrete, table, fused):
    """The opcodes of the rows in groups that run generated kernels."""
    ops = set()
    for r0 in np.flatnonzero(table[:, fusion.KERNEL_ADDRESS]).tolist():
        ops.update(concrete._run_code[r0:fused[r0], oc.OP].tolist())
    return ops


def test_every_op_with_an_entry_rule_has_a_case():
    assert {op for op, _ in RULES} | {oc.SCALE} == set(fusion._ENTRY_RULES)


@pytest.mark.parametrize("op,rule", RULES, ids=[oc.NAMES[op] for op, _ in RULES])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_every_op_with_an_entry_rule_in_a_generated_kernel_gives_the_block_path_s_bits(kernels_at, op, rule, dtype):
    """Bit for bit but for vectormath's rules (VECTORMATH: within one unit in the last place)."""
    rng = np.random.default_rng(7)
    x = jt.constant(rng.uniform(-1.5, 1.5, (N // 8, 8)).astype(dtype))
    y = jt.constant(rng.uniform(0.25, 2.0, (N // 8, 8)).astype(dtype))
    c = jt.constant(rng.uniform(-0.5, 0.5, (N // 8, 1)).astype(dtype))

    def f(x, y, c):
        u = x * 0.75 + c        # SCALE, and a column broadcast into the group
        return jt.cast(rule(u, y), u.dtype)

    values = {}
    for runs in (None, 1):
        kernels_at(runs)
        replayed = jt.function(f)
        replayed(x, y, c)       # the trace
        values[runs] = replayed(x, y, c).numpy()
    got, want = values[1], values[None]
    assert got.dtype == want.dtype == dtype
    if op in VECTORMATH:
        np.testing.assert_array_max_ulp(got, want, maxulp=1)
    else:
        np.testing.assert_array_equal(got, want)
    concrete = _only_variant(replayed)
    assert _generated_rows(concrete, _kernel_table(concrete._replayers["cpu"]), concrete._fused) >= {op, oc.SCALE}


@pytest.mark.parametrize("op", [jt.sin, jt.math.lgamma, lambda u: jt.pow(u, u), lambda u: jt.nn.elu(u, 0.5)])
def test_a_group_with_an_op_without_an_entry_rule_keeps_the_block_path(kernels_at, op):
    kernels_at(1)
    f = jt.function(lambda x: op(x * 0.5 + 1.0) * x)
    x = jt.constant(np.linspace(0.5, 1.5, N))
    f(x), f(x)      # traced, then replayed
    concrete = _only_variant(f)
    assert concrete._fused.any()
    assert not _kernel_table(concrete._replayers["cpu"])[:, fusion.KERNEL_ADDRESS].any()


@pytest.mark.parametrize("shape,small", BROADCASTS + [((300, 70), (300, 70)), ((70, 300), (1, 1))])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_broadcasts_in_generated_kernels_give_the_block_path_s_bits(kernels_at, shape, small, dtype):
    """Columns, rows, fills and copies fit one loop nest; an input repeated along two runs of axes (a middle
    axis) keeps the block path, as does a group whose broadcasts need two nests."""
    rng = np.random.default_rng(len(shape))
    x = jt.constant(rng.normal(size=shape).astype(dtype))
    b = jt.constant(rng.normal(size=small).astype(dtype))

    def f(x, b):
        return jt.sqrt(jt.abs(x * 0.5 - b)) * (x + b) + b * b

    kernels_at(None)
    blocks = jt.function(f)
    blocks(x, b)
    expected = blocks(x, b).numpy()
    kernels_at(1)
    generated = jt.function(f)
    generated(x, b)
    np.testing.assert_array_equal(generated(x, b).numpy(), expected)
    concrete = _only_variant(generated)
    table = _kernel_table(concrete._replayers["cpu"])
    starts = np.flatnonzero(concrete._fused).tolist()
    assert starts
    tiles = [r for r in range(len(concrete._run_code)) if concrete._run_code[r, oc.OP] == oc.TILE]
    runs = [fusion._broadcast_runs(concrete.iattr, int(concrete._run_code[r, oc.ATTR])) for r in tiles]
    nests = fusion.loop_nest(int(np.prod(shape)), runs) is not None
    assert all(table[r, fusion.KERNEL_ADDRESS] != 0 for r in starts) == nests


# (shape, axis) of a reduction right after a group: rows of at most SHORT_ROWS entries (left to the reduction's
# row kernel), rows summed pairwise (over 128), an inner axis kept (entry by entry), all three axes, one row of
# every entry
REDUCED = [((N // 8, 8), 1), ((80, 300), 1), ((300, 64), 0), ((30, 40, 20), 1), ((N,), 0)]


def _bits(a):
    return np.asarray(a).view(np.uint64 if a.dtype == np.float64 else np.uint32)


@pytest.mark.parametrize("reduce", [jt.reduce_sum, jt.reduce_min, jt.reduce_max], ids=["sum", "min", "max"])
@pytest.mark.parametrize("shape,axis", REDUCED, ids=[f"{s}-{a}" for s, a in REDUCED])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_reduction_after_a_group_computed_in_its_kernel_gives_the_reduction_kernel_s_bits(kernels_at, reduce,
                                                                                           shape, axis, dtype):
    """Signed zeros (which the first of two equal extrema decides) and NaN included. Short rows along the last
    axis stay the reduction kernel's (a call per row of a few entries is slower than its pass)."""
    rng = np.random.default_rng(len(shape) + axis)
    x = rng.uniform(-2, 2, shape).astype(dtype)
    x.reshape(-1)[::7] = -0.0
    x.reshape(-1)[3::7] = 0.0
    x.reshape(-1)[::997] = np.nan
    y = np.where(rng.uniform(size=shape) < 0.5, dtype(-0.0), dtype(0.0)).astype(dtype)
    x, y = jt.constant(x), jt.constant(y)

    def f(x, y):
        return reduce(jt.where(jt.abs(x) > 1.5, x * 0.5 + y, y - x * 0.25), axis)

    values = {}
    for runs in (None, 1):
        kernels_at(runs)
        replayed = jt.function(f)
        replayed(x, y)
        values[runs] = replayed(x, y).numpy()
    np.testing.assert_array_equal(_bits(values[1]), _bits(values[None]))
    concrete = _only_variant(replayed)
    table, (r0,) = _kernel_table(concrete._replayers["cpu"]), np.flatnonzero(concrete._fused)
    absorbed = not (axis == len(shape) - 1 and shape[axis] <= SHORT_ROWS)
    assert table[r0, fusion.KERNEL_ADDRESS] != 0 and table[r0, fusion.KERNEL_END] == concrete._fused[r0] + absorbed


@pytest.mark.parametrize("axis", [1, 0])
def test_a_reduced_value_is_stored_only_where_a_later_use_reads_it(kernels_at, axis):
    """Stored when it is also an output, or a gradient step reads it (min's reverse compares with it); else the
    kernel keeps each row in a buffer of its own (inner axis: not at all)."""
    rng = np.random.default_rng(5)
    x, c = jt.constant(rng.normal(size=(400, 50))), jt.constant(rng.normal(size=(1, 50)))

    def distance(x, c):
        return jt.square(x - c) * 0.5

    def also_an_output(x, c):
        d = distance(x, c)
        return jt.reduce_min(d, axis), d

    functions = {"forward": lambda x, c: jt.reduce_min(distance(x, c), axis), "also an output": also_an_output,
                 "gradient": lambda x, c: jt.reduce_sum(jt.reduce_min(distance(x, c), axis))}
    results = {}
    for runs in (None, 1):
        kernels_at(runs)
        got = results[runs] = {}
        for name, f in functions.items():
            if name == "gradient":
                derivative = jt.grad(Function(f, differentiated=True), argnums=1)
                got[name] = [derivative(x, c).numpy() for _ in range(2)][-1]
                continue
            replayed = jt.function(f)
            replayed(x, c)
            got[name] = [np.asarray(v) for v in nest.flatten(replayed(x, c))]
            if runs == 1:
                concrete = _only_variant(replayed)
                (r0,) = np.flatnonzero(concrete._fused)
                kept = np.zeros(concrete.slots.shape[0], np.bool_)
                kept[concrete._live] = True
                source, _, absorbs = fusion._group_source(concrete._run_code, concrete.slots, concrete.iattr,
                                                          concrete._places, r0, int(concrete._fused[r0]),
                                                          np.float64, kept)
                assert absorbs
                assert bool(re.search(r"^ +o\d+ = arena", source, re.M)) == (name == "also an output")
                assert ("row = np.empty" in source) == (name == "forward" and axis == 1)
    for name in functions:
        for got, want in zip(results[1][name], results[None][name]):
            np.testing.assert_array_equal(got, want)


def test_a_bound_gradient_s_groups_run_generated_kernels_with_the_block_path_s_gradients(kernels_at):
    rng = np.random.default_rng(3)
    x, b = jt.constant(rng.normal(size=(1000, 37))), jt.constant(rng.normal(size=(1, 37)))

    def f(x, b):
        return jt.reduce_sum(jt.exp((x * 0.5 - b) * 0.1) * (x + b))

    results = []
    for runs in (None, 1):
        kernels_at(runs)
        fn = Function(f, differentiated=True)
        derivative = jt.grad(fn, argnums=(0, 1))
        for _ in range(3):
            got = [g.numpy() for g in derivative(x, b)]
        results.append(got)
        (replay,) = [replay for key, replay in _only_variant(fn)._replayers.items() if isinstance(key, tuple)]
        assert _kernel_table(replay)[:, fusion.KERNEL_ADDRESS].any() == (runs is not None)
    for got, want in zip(*results):
        np.testing.assert_array_equal(got, want)
    with jt.GradientTape() as tape:
        tape.watch([x, b])
        y = f(x, b)
    for got, want in zip(results[1], tape.gradient(y, [x, b])):
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-12)


def test_a_group_writing_a_variable_over_its_old_value_keeps_the_block_path(kernels_at):
    """A training step's update written over the variable's own rows (layout._in_place) would run a generated
    loop unvectorised (its overlap check fails), where the block kernels name one array for both."""
    values = {}
    for runs in (None, 1):
        kernels_at(runs)
        v = jt.Variable(np.ones(N))
        m = jt.Variable(np.zeros(N))

        @jt.function
        def step(g):
            m.assign(m * 0.9 + g * 0.1)
            v.assign(v - 0.01 * m / (jt.abs(m) + 1e-3))
            return jt.reduce_sum(v)

        gradients = np.random.default_rng(9).normal(size=(5, N))
        totals = [float(step(jt.constant(g))) for g in gradients]
        values[runs] = (totals, v.numpy(), m.numpy())
        concrete = _only_variant(step)
        assert concrete._fused.any()
        assert not _kernel_table(concrete._replayers["cpu"])[:, fusion.KERNEL_ADDRESS].any()
    for got, want in zip(values[1], values[None]):
        np.testing.assert_array_equal(got, want)


def test_groups_compile_at_the_configured_run_and_never_with_none(kernels_at):
    x = jt.constant(np.linspace(-1, 1, N))
    kernels_at(3)
    f = jt.function(lambda x: jt.exp(x * 0.5) + x * x)
    f(x)        # the trace
    for replay in range(1, 5):
        f(x)
        table = _kernel_table(_only_variant(f)._replayers["cpu"])
        assert (table[:, fusion.KERNEL_ADDRESS] != 0).any() == (replay >= 3)
    kernels_at(None)
    g = jt.function(lambda x: jt.exp(x * 0.5) + x * x)
    for _ in range(4):
        g(x)
    assert not _kernel_table(_only_variant(g)._replayers["cpu"])[:, fusion.KERNEL_ADDRESS].any()


def test_a_group_s_kernel_is_generated_once_per_structure_and_dtype(kernels_at):
    """Two functions whose groups have one structure share one kernel; its source lives in the kernel cache."""
    kernels_at(1)
    a = jt.function(lambda x: jt.tanh(x) * x - 1.5)
    b = jt.function(lambda y: jt.tanh(y) * y - 1.5)
    x = jt.constant(np.linspace(-2, 2, N))
    a(x), b(x)      # the traces
    np.testing.assert_array_equal(a(x).numpy(), b(x).numpy())
    first, second = (_kernel_table(_only_variant(f)._replayers["cpu"])[:, fusion.KERNEL_ADDRESS] for f in (a, b))
    assert first.any() and np.array_equal(first, second)
    assert list(fusion._GENERATED_DIR.glob("group_*.py"))


def test_a_loaded_function_s_gradient_runs_generated_kernels_with_the_saved_function_s_bits(kernels_at, tmp_path):
    kernels_at(1)
    x = jt.constant(np.linspace(-2, 2, N).reshape(-1, 1) * np.ones((1, 4)))
    b = jt.constant(np.array([[0.5, -1.0, 2.0, 0.25]]))
    f = Function(lambda x, b: jt.reduce_sum(jt.sqrt(jt.abs(x - b)) * x + b), differentiated=True)
    f(x, b)
    jt.save(tmp_path / "f.npz", f)
    loaded = jt.load(tmp_path / "f.npz")
    gradients = [jt.grad(fn, argnums=(0, 1)) for fn in (f, loaded)]
    for _ in range(3):
        (saved_x, saved_b), (loaded_x, loaded_b) = (g(x, b) for g in gradients)
    np.testing.assert_array_equal(loaded_x.numpy(), saved_x.numpy())
    np.testing.assert_array_equal(loaded_b.numpy(), saved_b.numpy())
    (replay,) = [replay for key, replay in _only_variant(loaded)._replayers.items() if isinstance(key, tuple)]
    assert _kernel_table(replay)[:, fusion.KERNEL_ADDRESS].any()


def test_a_loaded_function_s_calls_run_fused_groups_and_a_tape_recording_one_still_reads_every_value(kernels_at,
                                                                                                      tmp_path):
    """A loaded variant keeps every value (tapes recording its calls read them), so its plain calls run a replay
    of their own with fused groups on the canonical layout."""
    kernels_at(1)
    x = jt.constant(np.linspace(-2, 2, N))
    f = jt.function(lambda x: jt.reduce_sum(jt.exp(x * 0.5) * x + jt.tanh(x)))
    f(x)
    jt.save(tmp_path / "f.npz", f)
    loaded = jt.load(tmp_path / "f.npz")
    for _ in range(3):
        np.testing.assert_array_equal(loaded(x).numpy(), f(x).numpy())
    concrete = _only_variant(loaded)
    assert not concrete._fused.any()
    lean = concrete._replayers["cpu", "outputs"]
    assert _kernel_table(lean)[:, fusion.KERNEL_ADDRESS].any()
    with jt.GradientTape() as tape:     # other values than the lean calls left in the arena
        tape.watch(x)
        y = loaded(x * 0.5)
    with jt.GradientTape() as eager:
        eager.watch(x)
        z = x * 0.5
        want = jt.reduce_sum(jt.exp(z * 0.5) * z + jt.tanh(z))
    np.testing.assert_allclose(tape.gradient(y, x).numpy(), eager.gradient(want, x).numpy(), rtol=1e-13)


def test_a_new_process_loads_a_generated_kernel_from_the_cache_without_compiling():
    script = f"""
import numpy as np
import jitape as jt
from jitape_kernels.cpu import fusion
jt.config.fused_kernel_runs = 1
f = jt.function(lambda x: jt.tanh(x) * x + 0.125)
x = jt.constant(np.linspace(0, 1, {N}))
f(x), f(x)
print(len(fusion._COMPILED), sum(kernel._cache_hits for kernel in fusion._COMPILED.values()))
"""
    environment = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    runs = [subprocess.run([sys.executable, "-c", script], env=environment, capture_output=True, text=True,
                           check=True).stdout.split() for _ in range(2)]
    assert runs[1] == ["1", "1"]


# (opcode, a value of it over u and y) for every op a reverse group's generated kernel runs (fusion._UNARY_TERMS,
# _BINARY_TERMS) but SCALE, which every case's u holds; u * u (one slot read twice) in LOG's and SQRT's
REVERSE_RULES = [(oc.COPY, lambda u, y: jt.identity(u) * y), (oc.NEG, lambda u, y: -u),
                 (oc.RELU, lambda u, y: jt.nn.relu(u)), (oc.SQUARE, lambda u, y: jt.square(u)),
                 (oc.EXP, lambda u, y: jt.exp(u)), (oc.TANH, lambda u, y: jt.tanh(u)),
                 (oc.SIGMOID, lambda u, y: jt.sigmoid(u)), (oc.LOG, lambda u, y: jt.math.log(u * u + y)),
                 (oc.SQRT, lambda u, y: jt.sqrt(u * u + y)), (oc.LOG1P, lambda u, y: jt.math.log1p(u * u)),
                 (oc.ADD, lambda u, y: u + y),
                 (oc.SUB, lambda u, y: u - y), (oc.MUL, lambda u, y: u * y), (oc.DIV, lambda u, y: u / y)]


def _generated_reverse_rows(arrays):
    """The opcodes of the step-code rows in reverse groups that run generated kernels (a bound purpose's arrays)."""
    table, groups, code = arrays["kernels"], arrays["step_groups"], arrays["step_code"]
    n_run = arrays["code"].shape[0]
    ops = set()
    for r in np.flatnonzero(table[n_run:, fusion.KERNEL_ADDRESS]).tolist():
        ops.update(code[r - groups[r] + 1:r + 1, oc.OP].tolist())
    return ops


def _gradients_both_ways(kernels_at, f, args):
    """jt.grad of f w.r.t. every argument, replayed block by block and by generated kernels (the variant's bound
    arrays of the latter too)."""
    results = {}
    for runs in (None, 1):
        kernels_at(runs)
        replayed = Function(f, differentiated=True)
        g = jt.grad(replayed, argnums=tuple(range(len(args))))
        g(*args), g(*args)      # traced, then bound
        results[runs] = [t.numpy() for t in g(*args)]
    return results[None], results[1], _bound_arrays(_only_variant(replayed))


def test_every_reverse_rule_has_a_case():
    assert {op for op, _ in REVERSE_RULES} | {oc.SCALE} == set(fusion._UNARY_TERMS) | set(fusion._BINARY_TERMS)


# every rule in float32, where the block kernels' mixed float32 / float64 operands decide the bits; in float64 the
# rules with float64 casts or integer constants
REVERSE_RULE_CASES = [(op, rule, np.float32) for op, rule in REVERSE_RULES] + [
    (op, rule, np.float64) for op, rule in REVERSE_RULES if op in (oc.DIV, oc.LOG, oc.TANH, oc.SIGMOID)]


@pytest.mark.parametrize("op,rule,dtype", REVERSE_RULE_CASES,
                         ids=[f"{np.dtype(d).name}-{oc.NAMES[op]}" for op, _, d in REVERSE_RULE_CASES])
def test_every_reverse_rule_in_a_generated_kernel_gives_the_block_path_s_bits(kernels_at, op, rule, dtype):
    """A bound gradient's reverse groups by generated kernels: every rule, SUM's broadcast cotangent and a value's
    cotangent summed over several rows give the block path's bits (signed zeros included: RELU's and the -0.0
    entries of x)."""
    rng = np.random.default_rng(11)
    x = rng.uniform(-1.5, 1.5, (N // 8, 8)).astype(dtype)
    x[::7, 3] = -0.0
    y = jt.constant(rng.uniform(0.25, 2.0, (N // 8, 8)).astype(dtype))
    c = jt.constant(rng.uniform(-0.5, 0.5, (N // 8, 1)).astype(dtype))

    def f(x, y, c):
        u = (x + c) * 0.75
        return jt.reduce_sum(jt.cast(rule(u, y), u.dtype) * y + u, axis=1)[3] + jt.reduce_sum(u * y)

    blocks, generated, arrays = _gradients_both_ways(kernels_at, f, [jt.constant(x), y, c])
    for got, want in zip(generated, blocks):
        assert got.dtype == want.dtype == dtype
        np.testing.assert_array_equal(_bits(got), _bits(want))
    assert _generated_reverse_rows(arrays) >= {op, oc.SCALE, oc.SUM}


@pytest.mark.parametrize("case", ["chain", "sums", "broadcasts", "extrema"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_reverse_groups_with_sums_broadcasts_and_extrema_in_generated_kernels_give_the_block_path_s_bits(
        kernels_at, case, dtype):
    """test_layout's reverse cases: SUM's cotangent broadcast back along every axis arrangement, broadcasts summed
    in order into their inputs' cotangents and MAX / MIN along the last axis with every row's extremum tied."""
    rng = np.random.default_rng(3)
    x = jt.constant(rng.uniform(0.1, 1.0, (2, (N + 3) // 4, 2)).astype(dtype))
    blocks, generated, arrays = _gradients_both_ways(kernels_at, REVERSE_CASES[case], [x, jt.constant(dtype(0.5))])
    for got, want in zip(generated, blocks):
        np.testing.assert_array_equal(_bits(got), _bits(want))
    ops = _generated_reverse_rows(arrays)
    assert {"sums": oc.SUM, "broadcasts": oc.TILE, "extrema": oc.MIN}.get(case, oc.MUL) in ops


def test_a_jacobian_s_replay_generates_no_reverse_group_kernel(kernels_at):
    """Its step runs K columns row by row: a kernel for its reverse groups would never run. Its forward groups
    still run theirs."""
    kernels_at(1)

    def f(x):
        u = jt.tanh(x * 0.5) * x + 1.0
        return jt.stack([jt.reduce_sum(u * u), jt.reduce_sum(u)])

    replayed = Function(f, differentiated=True)
    jacobian = jt.jacobian(replayed)
    x = jt.constant(np.linspace(-1.0, 1.0, N))
    eager = jacobian(x).numpy()     # the trace
    np.testing.assert_allclose(jacobian(x).numpy(), eager, rtol=1e-14)
    arrays = _bound_arrays(_only_variant(replayed))
    assert (arrays["step_groups"] > 1).any()
    assert not arrays["kernels"][arrays["code"].shape[0]:, fusion.KERNEL_ADDRESS].any()


@pytest.mark.parametrize("bias", [(1, 1, 50), (1, 2, 50)], ids=["rows split", "whole rows"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_reverse_kernel_divides_tied_extrema_s_cotangents_as_the_block_path(kernels_at, bias, dtype):
    """Minima of rows of 100 with ties in every row: a kernel whose innermost loop runs along whole rows counts
    each row's ties before it; one whose innermost loop a broadcast splits (a bias of 50 entries) leaves the shares
    to extremum_shares before its loops. Both give the block path's bits."""
    rng = np.random.default_rng(9)
    x = jt.constant(np.round(rng.uniform(0.0, 3.0, (FUSE_MIN_SIZE // 100 + 8, 2, 50)), 0).astype(dtype))
    c = jt.constant(rng.uniform(-0.5, 0.5, bias).astype(dtype))

    def f(x, c):
        u = jt.reshape(jt.square(x - c) * 0.5, (x.shape[0], 100))
        return jt.reduce_sum(jt.reduce_min(u, axis=1))

    blocks, generated, arrays = _gradients_both_ways(kernels_at, f, [x, c])
    for got, want in zip(generated, blocks):
        np.testing.assert_array_equal(_bits(got), _bits(want))
    assert {oc.MIN, oc.TILE} <= _generated_reverse_rows(arrays)
    code, groups = arrays["step_code"], arrays["step_groups"]
    (r,) = [r for r in np.flatnonzero(groups > 1).tolist() if oc.MIN in code[r - groups[r] + 1:r + 1, oc.OP]]
    source, _ = fusion._reverse_source(code, arrays["slots"], arrays["iattr"], arrays["step_places"],
                                       arrays["step_scalars"][:, SC_FLAGS], r, int(groups[r]), dtype)
    split = bias == (1, 1, 50)
    assert ("extremum_shares(x" in source) == split and ("ties" in source) != split
