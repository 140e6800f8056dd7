"""Sweeps allocate their kernels' metadata and scratch once (jitape_kernels.cpu.workspace, planned_temps), not per
instruction: the number of numba allocations of a forward, reverse, tangent, second-order, per-example or replayed
sweep does not grow with the number of broadcasts, tiles, transposes, slices, pads, reductions (PROD's partials,
MAX/MIN's tie counts across an outer axis, running sums across rows), matrix products, solves and inverses it
runs (no index map, no temporary per instruction)."""
import numpy as np
import pytest
from numba.core.runtime import _nrt_python as nrt

import jitape as jt
from jitape import backend, execute
from jitape_kernels.cpu import forward_kernels, forward_sweep, new_temps


def _chain(x, repeats):
    """`repeats` rounds of broadcasts, transposes (a swap of runs, a matrix transpose, a reversal of three axes),
    slices (in runs and strided), pads, a tile of whole rows and reductions (MAX and MIN over a contiguous
    axis: over an outer one, their K = 1 cotangent keeps a row of tie counts, scratch of the tensor's size)."""
    y = x
    for _ in range(repeats):
        wide = jt.broadcast_to(jt.reduce_sum(y, axis=1, keepdims=True), (6, 40)) + jt.pad(jt.reduce_sum(y, axis=0), [[2, 2]])
        swapped = jt.transpose(jt.reshape(wide, (2, 3, 40)), (1, 0, 2))         # runs of 40 behind a swap
        cut = jt.pad(jt.reshape(swapped, (6, 40))[:, 4:36], [[0, 0], [2, 2]])   # slice and pad in runs
        reversed_axes = jt.reshape(jt.transpose(jt.reshape(y, (2, 3, 36)), (2, 1, 0)), (36, 6))    # strided runs
        tiled = jt.tile(jt.transpose(reversed_axes)[:, ::2], [1, 2])       # a strided slice, tiles of rows
        y = jt.tanh(cut + jt.reduce_min(y, axis=1, keepdims=True)) * jt.reduce_max(y, axis=1, keepdims=True) \
            + 0.5 * tiled
    return jt.reduce_sum(y * y)


def _algebra_chain(x, repeats):
    """`repeats` rounds of the ops whose kernels need scratch: solve and inv (LAPACK's factors and column-major
    copies), matmul (products added in place; K columns: stacked rows), cumsum across rows and MAX across an outer
    axis (running sums, tie counts across the inner axis), PROD along and across rows (partials; second order:
    suffix products and their tangents)."""
    y = x
    for _ in range(repeats):
        square = y[:, :6] + 6.0 * jt.eye(6, dtype=x.dtype)
        mixed = jt.matmul(jt.linalg.inv(square), jt.linalg.solve(square, y))
        y = jt.tanh(mixed + 0.1 * jt.cumsum(y, axis=0) + 0.1 * jt.reduce_max(y, axis=0)
                    + 0.1 * jt.reduce_prod(0.5 * y[:, :4] + 1.0, axis=1, keepdims=True)
                    + 0.1 * jt.reduce_prod(0.1 * y + 1.0, axis=0))
    return jt.reduce_sum(y * y)


CHAINS = {"data movement": _chain, "algebra": _algebra_chain}


def _allocations(run):
    before = nrt.memsys_get_stats_alloc()
    run()
    return nrt.memsys_get_stats_alloc() - before


@pytest.fixture(autouse=True)
def _counting():
    # numba's allocation counters (NUMBA_NRT_STATS), on for these tests only
    enabled = nrt.memsys_stats_enabled()
    nrt.memsys_enable_stats()
    yield
    if not enabled:
        nrt.memsys_disable_stats()


def _sweeps(chain, repeats):
    x = jt.constant(np.random.default_rng(repeats).standard_normal((6, 36)))
    with jt.GradientTape(persistent=True) as tape:
        tape.watch(x)
        y = CHAINS[chain](x, repeats)
    program = execute.lowered(tape, [y], [x])
    cpu = backend.current()
    adjoint = np.empty((program.adjoint_size, 1))
    written = np.zeros(program.slots.shape[0], np.bool_)

    def reverse():
        written[:] = False
        written[program.targets[0]] = True
        adjoint[program.adjoint_rows[program.targets[0]]] = 1
        cpu.reverse(program, adjoint, written)

    temps = new_temps(program.code, program.iattr, 1, program.dtype)
    table = forward_kernels(program.code, program.slots, program.iattr, program.fattr, program.arena, temps)
    runs = {"forward": lambda: forward_sweep(program.code, program.slots, program.iattr, program.fattr,
                                             program.arena, temps, table),
            "reverse": reverse}
    return program, runs


@pytest.mark.parametrize("chain", sorted(CHAINS))
@pytest.mark.parametrize("sweep", ["forward", "reverse"])
def test_allocations_per_sweep_do_not_grow_with_instructions(sweep, chain):
    counts = []
    for repeats in (1, 4):
        program, runs = _sweeps(chain, repeats)
        runs[sweep]()        # compiled and warmed
        counts.append((program.code.shape[0], _allocations(runs[sweep])))
    (rows_short, short), (rows_long, long) = counts
    assert rows_long > 3 * rows_short - 10
    assert long == short, f"{sweep}: {short} allocations for {rows_short} rows, {long} for {rows_long}"


@pytest.mark.parametrize("chain", sorted(CHAINS))
def test_hessian_sweeps_allocate_per_sweep_not_per_instruction(chain):
    """tape.hessian: a tangent sweep and a second-order sweep (K columns) after the reverse sweep."""
    counts = []
    for repeats in (1, 4):
        x = jt.constant(np.random.default_rng(repeats).standard_normal((6, 36)))
        with jt.GradientTape(persistent=True) as tape:
            tape.watch(x)
            y = CHAINS[chain](x, repeats)
        tape.hessian(y, x)
        counts.append(_allocations(lambda: tape.hessian(y, x)))
    assert counts[0] == counts[1]


@pytest.mark.parametrize("chain", sorted(CHAINS))
def test_replayed_gradients_allocate_per_call_not_per_instruction(chain):
    """jt.grad of a jt.function: one compiled forward replay and reverse sweep per call."""
    counts = []
    for repeats in (1, 4):
        gradient = jt.grad(jt.function(lambda x, repeats=repeats: CHAINS[chain](x, repeats)))
        x = jt.constant(np.random.default_rng(repeats).standard_normal((6, 36)))
        gradient(x), gradient(x)
        counts.append(_allocations(lambda: gradient(x)))
    assert counts[0] == counts[1]


def test_per_example_sweeps_allocate_per_sweep_not_per_instruction():
    """The per-example sweep through layers of matmuls with shared weights (junctions: example-major copies), a
    cumsum across features and PROD and MAX along them."""
    counts = []
    for layers in (1, 4):
        rng = np.random.default_rng(layers)
        x = jt.constant(rng.standard_normal((5, 6)))
        weights = [jt.Variable(0.3 * rng.standard_normal((6, 6))) for _ in range(layers)]
        with jt.GradientTape(persistent=True) as tape:
            h = x
            for w in weights:
                h = jt.tanh(jt.matmul(h, w)) + 0.1 * jt.cumsum(h, axis=1)
                h = h * jt.reduce_prod(0.1 * h + 1.0, axis=1, keepdims=True) + jt.reduce_max(h, axis=1, keepdims=True)
            losses = jt.reduce_sum(h * h, axis=1)
        program, (_, code, modes, n_row, n_param, _, layouts) = execute.per_example_program(tape, losses, weights)
        cpu = backend.current()
        row_adjoint, param_adjoint = np.zeros((n_row, 1)), np.zeros((n_param, 5))

        def sweep():
            cpu.per_example(program, code, modes, layouts, row_adjoint, param_adjoint)
        sweep()
        counts.append((code.shape[0], _allocations(sweep)))
    (rows_short, short), (rows_long, long) = counts
    assert rows_long > 3 * rows_short - 10
    assert long == short, f"{short} allocations for {rows_short} rows, {long} for {rows_long}"
