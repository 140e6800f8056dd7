"""Sweeps allocate their kernels' metadata once (jitape_kernels.cpu.workspace), not per instruction: the number of
numba allocations of a forward, reverse, tangent or second-order sweep does not grow with the number of
broadcasts, tiles, transposes, slices, pads and reductions it runs (no index map, no scratch per instruction)."""
import numpy as np
import pytest
from numba.core.runtime import _nrt_python as nrt

import jitape as jt
from jitape import backend, execute
from jitape_kernels.cpu import forward_sweep


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


def _sweeps(repeats):
    x = jt.constant(np.random.default_rng(repeats).standard_normal((6, 36)))
    with jt.GradientTape(persistent=True) as tape:
        tape.watch(x)
        y = _chain(x, repeats)
    program = execute.lowered(tape, [y], [x])
    cpu = backend.current()
    adjoint = np.empty((program.adjoint_size, 1))
    written = np.zeros(program.slots.shape[0], np.bool_)

    def reverse():
        written[:] = False
        written[program.targets[0]] = True
        adjoint[program.adjoint_rows[program.targets[0]]] = 1
        cpu.reverse(program, adjoint, written)

    runs = {"forward": lambda: forward_sweep(program.code, program.slots, program.iattr, program.fattr,
                                             program.arena),
            "reverse": reverse}
    return program, runs


@pytest.mark.parametrize("sweep", ["forward", "reverse"])
def test_allocations_per_sweep_do_not_grow_with_instructions(sweep):
    counts = []
    for repeats in (1, 4):
        program, runs = _sweeps(repeats)
        runs[sweep]()        # compiled and warmed
        counts.append((program.code.shape[0], _allocations(runs[sweep])))
    (rows_short, short), (rows_long, long) = counts
    assert rows_long > 3 * rows_short - 10
    assert long == short, f"{sweep}: {short} allocations for {rows_short} rows, {long} for {rows_long}"


def test_hessian_sweeps_allocate_per_sweep_not_per_instruction():
    """tape.hessian: a tangent sweep and a second-order sweep (K columns) after the reverse sweep."""
    counts = []
    for repeats in (1, 4):
        x = jt.constant(np.random.default_rng(repeats).standard_normal((6, 36)))
        with jt.GradientTape(persistent=True) as tape:
            tape.watch(x)
            y = _chain(x, repeats)
        tape.hessian(y, x)
        counts.append(_allocations(lambda: tape.hessian(y, x)))
    assert counts[0] == counts[1]
