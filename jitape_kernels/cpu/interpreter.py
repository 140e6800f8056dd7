"""The CPU forward and reverse interpreters: one compiled loop over a Program's instruction rows.

The dispatch is an if-chain over opcode families that LLVM turns into a jump
table; each family's work is done by the kernels of its module.

numba links a callee's whole module, kernels included, into each caller and
optimizes and compiles it again. So the rows' kernels (one function per op
family and direction: FORWARD_ROW_KERNELS, REVERSE_ROW_KERNELS), the fused
groups' block kernels (fused_forward, fused_reverse) and the scalar loops are
called through addresses (a table, `row_kernels`: see
jitape_kernels.cpu.row_kernels) by forward_sweep, reverse_sweep and
replay_sweep (and the reverse row kernels by the second-order and per-example
sweeps), which link none of them: each is compiled once per dtype, when a
Program first needs it. Between those and an entry point, the row loops
(_forward_rows, _reverse_rows) are functions of their own (numba's inlining
copies a callee's IR block by block with its whole scope: inlined into
replay_sweep, a cold compile of 14 s instead of 9), and the row dispatch inside
them is inlined (inline="always"), so no row pays for a call.
"""
import numpy as np
from numba import types
from numba.extending import overload

from .. import njit, opcodes as oc
from ..planning import FORWARDED
from ..layout import (BLOCK, GUARD_BROKEN, HOST_STEP, REPLAY_HELD, SC_ATTR, SC_FLAGS, SC_IN0, SC_IN0_ADJ, SC_IN0_OFF,
                      SC_IN1, SC_IN1_ADJ, SC_IN1_OFF, SC_OP, SC_OUT_ADJ, SC_OUT_OFF, SC_RUN)
from .elementwise import (_put, binary_forward, binary_partials, binary_reverse, binary_reverse_1d, binary_value,
                          unary_derivative, unary_forward, unary_reverse, unary_reverse_1d, unary_value, where_forward,
                          where_linear)
from . import linalg, reduction
from .addressed import call_at, call_returning
from .fusion import KERNEL_ADDRESS, KERNEL_ARG_COUNT, KERNEL_ARGS, KERNEL_END, call_kernel
from .linalg import inv_forward, inv_reverse, matmul_forward, matmul_reverse, solve_forward, solve_reverse
from .reduction import cumsum_forward, cumsum_linear, reduce_forward, reduce_linear
from .shape import (broadcast_block, broadcast_sum_block, contiguous_run, mapped_forward, mapped_linear,
                    moved_forward, moved_linear, tile_linear)
from .unowned import at_address, unowned
from .workspace import new_work


# elementwise instructions of at most this many entries run the per-element rules inline (as scalars do):
# below it, the views and calls of the vectorised kernels cost more than their loops save
SMALL = 16


def _small_row_rule(op, n0, size):
    """Whether a row of `op` with n0 input and `size` output entries is small: run inline by the scalar loops
    (K = 1) where a larger one calls its row kernel. An elementwise row of at most SMALL entries, a TILE of one
    entry (a scalar broadcast) to at most SMALL, or a SUM of at most SMALL entries into one (a whole sum).
    SLICE and PLACE rows moving one run of at most SMALL entries are run inline too (shape.contiguous_run).
    Without branches, so that it serves scalars in compiled code (small_row) and arrays of rows (small_rows)."""
    return (((op <= oc.BINARY_LAST) | ((op == oc.TILE) & (n0 == 1))) & (size <= SMALL)) | (
        (op == oc.SUM) & (size == 1) & (n0 <= SMALL))


small_row = njit(cache=True, error_model="numpy", inline="always")(_small_row_rule)


def small_rows(code, slots):
    """Per row of `code`, whether small_row calls it small (the rows whose forward row kernel no sweep calls):
    numpy's, so that planning a replay loads no kernel for it."""
    return _small_row_rule(code[:, oc.OP], slots[code[:, oc.IN0], oc.SIZE], slots[code[:, oc.OUT], oc.SIZE])


@njit(cache=True, error_model="numpy", inline="always")
def params(op, iattr, fattr, a):
    if op == oc.CLIP:
        return fattr[iattr[a]], fattr[iattr[a] + 1]
    if op == oc.ELU or op == oc.SCALE or op == oc.POWC or op == oc.POLYGAMMA:
        return fattr[iattr[a]], 0.0
    return 0.0, 0.0


@njit(cache=True, error_model="numpy")
def forward_sweep(code, slots, iattr, fattr, arena, temps, row_kernels):
    """Recompute every instruction's output in the arena from its inputs, in program order. temps: the kernels'
    scratch, at least planned_temps' entries for one column; row_kernels: the table of addressed kernels
    (row_kernels.forward_kernels), holding the forward row kernels of the families `code` holds."""
    _forward_span(code, 0, code.shape[0], slots, iattr, fattr, arena, new_work(), temps, row_kernels)


@njit(cache=True, error_model="numpy", inline="always")
def _forward_span(code, r0, r1, slots, iattr, fattr, arena, work, temps, row_kernels):
    """forward_sweep over rows r0..r1-1, with the sweep's workspace (jitape_kernels.cpu.workspace) and scratch."""
    code, slots, iattr, fattr, arena, work, temps = (unowned(code), unowned(slots), unowned(iattr), unowned(fattr),
                                                     unowned(arena), unowned(work), unowned(temps))
    r = r0
    while r < r1:
        r = next_row(row_kernels, SCALAR_ROWS_FORWARD, (code, r, r1, slots, iattr, fattr, arena))
        if r < r1:
            _forward_row(code, r, slots, iattr, fattr, arena, work, temps, row_kernels, temps[:0])
            r += 1


@njit(cache=True, error_model="numpy")
def scalar_rows_forward(operands):
    """forward_sweep over rows r0, r0+1, ... (before r1) while they are small rows (small_row: elementwise rows
    of at most SMALL entries, the rule inlined per entry (no views), a scalar broadcast to or a whole sum of at
    most SMALL entries) or SLICE/PLACE rows moving one run of at most SMALL entries; the first row that is not
    (r1: none). A loop of its own, as scalar_rows_reverse (addressed, as the row kernels: called once per
    stretch of rows)."""
    code, r0, r1, slots, iattr, fattr, arena = operands
    for r in range(r0, r1):
        op = code[r, oc.OP]
        o = code[r, oc.OUT_OFF]
        i0 = code[r, oc.IN0_OFF]
        if op == oc.TILE or op == oc.SUM:
            if not small_row(op, slots[code[r, oc.IN0], oc.SIZE], slots[code[r, oc.OUT], oc.SIZE]):
                return r
            if op == oc.TILE:
                for e in range(slots[code[r, oc.OUT], oc.SIZE]):
                    arena[o + e] = arena[i0]
            else:       # in numpy's order, as reduction.sum_forward sums a short row
                arena[o] = reduction.lane_sum(arena, i0, slots[code[r, oc.IN0], oc.SIZE])
            continue
        if op > oc.BINARY_LAST:
            src, dst, n = contiguous_run(op, iattr, code[r, oc.ATTR])
            if n < 0 or n > SMALL:
                return r
            for e in range(n):
                arena[o + dst + e] = arena[i0 + src + e]
            continue
        size = slots[code[r, oc.OUT], oc.SIZE]
        if size > SMALL:
            return r
        if size == 1:
            if op <= oc.UNARY_LAST:
                p0, p1 = params(op, iattr, fattr, code[r, oc.ATTR])
                arena[o] = unary_value(op, arena[i0], p0, p1)
            else:
                arena[o] = binary_value(op, arena[i0], arena[code[r, oc.IN1_OFF]])
        elif op <= oc.UNARY_LAST:
            p0, p1 = params(op, iattr, fattr, code[r, oc.ATTR])
            for e in range(size):
                arena[o + e] = unary_value(op, arena[i0 + e], p0, p1)
        else:
            i1 = code[r, oc.IN1_OFF]
            for e in range(size):
                arena[o + e] = binary_value(op, arena[i0 + e], arena[i1 + e])
    return r1


@njit(cache=True, error_model="numpy", inline="always")
def _forward_row(code, r, slots, iattr, fattr, arena, work, temps, row_kernels, stash):
    """forward_sweep's work for row r (not one that scalar_rows_forward runs): its family's forward row kernel,
    through its address in row_kernels. stash: see forward_operands."""
    call_addressed(row_kernels, FORWARD_KERNEL_OF[code[r, oc.OP]],
                   forward_operands(code, r, slots, iattr, fattr, arena, work, temps, stash))


@njit(cache=True, error_model="numpy", inline="always")
def call_addressed(row_kernels, index, operands):
    """Run the addressed kernel in row `index` of the table row_kernels (its address and its signature's key:
    row_kernels.kernel_table) over the tuple `operands`."""
    call_at(row_kernels[index, 0], row_kernels[index, 1], (operands,))


@njit(cache=True, error_model="numpy", inline="always")
def next_row(row_kernels, index, operands):
    """call_addressed for a scalar loop, which returns the row after those it ran."""
    return call_returning(row_kernels[index, 0], row_kernels[index, 1], (operands,), 0)


@njit(cache=True, error_model="numpy", inline="always")
def forward_operands(code, r, slots, iattr, fattr, arena, work, temps, stash):
    """Row r's operands as every forward row kernel takes them: (op, its attribute block, iattr, fattr, work,
    temps, stash, the output's entries, input 0's, input 1's and input 2's (input 0's where the row has none)).
    stash: a LOGSUMEXP row's stash in a replay's scratch (see _stashes), else empty."""
    x = _entries(code, r, oc.IN0_OFF, arena, 0, slots[code[r, oc.IN0], oc.SIZE])
    w = _entries(code, r, oc.IN1_OFF, arena, 0, slots[code[r, oc.IN1], oc.SIZE]) if code[r, oc.IN1] >= 0 else x
    v = _entries(code, r, oc.IN2_OFF, arena, 0, slots[code[r, oc.IN2], oc.SIZE]) if code[r, oc.IN2] >= 0 else x
    return (code[r, oc.OP], code[r, oc.ATTR], iattr, fattr, work, temps, stash,
            _entries(code, r, oc.OUT_OFF, arena, 0, slots[code[r, oc.OUT], oc.SIZE]), x, w, v)


# Each forward row kernel takes forward_operands' tuple: op, a (its attribute block), iattr, fattr, work, temps,
# stash, out, x, w, v. Called through addresses only (forward_sweep, replay_sweep): no sweep links them.


@njit(cache=True, error_model="numpy")
def forward_unary_row(operands):
    op, a, iattr, fattr, work, temps, stash, out, x, w, v = operands
    p0, p1 = params(op, iattr, fattr, a)
    unary_forward(op, x, out, p0, p1)


@njit(cache=True, error_model="numpy")
def forward_binary_row(operands):
    op, a, iattr, fattr, work, temps, stash, out, x, w, v = operands
    binary_forward(op, x, w, out)


@njit(cache=True, error_model="numpy")
def forward_where_row(operands):
    op, a, iattr, fattr, work, temps, stash, out, x, w, v = operands
    where_forward(x, w, v, out)


@njit(cache=True, error_model="numpy")
def forward_sum_row(operands):
    op, a, iattr, fattr, work, temps, stash, out, x, w, v = operands
    reduction.sum_forward(x, out, iattr[a], iattr[a + 1], iattr[a + 2], work)


@njit(cache=True, error_model="numpy")
def forward_reduce_row(operands):
    op, a, iattr, fattr, work, temps, stash, out, x, w, v = operands
    if stash.size:      # a LOGSUMEXP keeping its exponentials for the replay's gradient
        reduction.logsumexp_forward(x, out, iattr[a], iattr[a + 1], iattr[a + 2], work, temps, stash)
    else:
        reduce_forward(op, x, out, iattr[a], iattr[a + 1], iattr[a + 2], work, temps)


@njit(cache=True, error_model="numpy")
def forward_cumsum_row(operands):
    op, a, iattr, fattr, work, temps, stash, out, x, w, v = operands
    cumsum_forward(x, out, iattr[a], iattr[a + 1], iattr[a + 2], iattr[a + 3] != 0, iattr[a + 4] != 0, temps)


@njit(cache=True, error_model="numpy")
def forward_mapped_row(operands):
    op, a, iattr, fattr, work, temps, stash, out, x, w, v = operands
    mapped_forward(op, iattr, a, x, out, work)


@njit(cache=True, error_model="numpy")
def forward_moved_row(operands):
    op, a, iattr, fattr, work, temps, stash, out, x, w, v = operands
    moved_forward(op, iattr, a, x, out)


@njit(cache=True, error_model="numpy")
def forward_matmul_row(operands):
    op, a, iattr, fattr, work, temps, stash, out, x, w, v = operands
    matmul_forward(iattr, a, x, w, out)


@njit(cache=True, error_model="numpy")
def forward_solve_row(operands):
    op, a, iattr, fattr, work, temps, stash, out, x, w, v = operands
    solve_forward(iattr, a, x, w, out, temps)


@njit(cache=True, error_model="numpy")
def forward_inv_row(operands):
    op, a, iattr, fattr, work, temps, stash, out, x, w, v = operands
    inv_forward(iattr, a, x, out, temps)


# The forward row kernels, one per op family (compare rows are binary rows), SUM apart from its family
FORWARD_KINDS = ("unary", "binary", "where", "sum", "reduce", "cumsum", "mapped", "moved", "matmul", "solve", "inv")
FORWARD_ROW_KERNELS = (forward_unary_row, forward_binary_row, forward_where_row, forward_sum_row, forward_reduce_row,
                       forward_cumsum_row, forward_mapped_row, forward_moved_row, forward_matmul_row,
                       forward_solve_row, forward_inv_row)


@njit(cache=True, error_model="numpy", inline="always")
def _entries(code, r, column, rows, start, stop):
    """Entries [start, stop) of the rows at row r's offset in `column`."""
    offset = code[r, column]
    return rows[offset + start:offset + stop]


@njit(cache=True, error_model="numpy", inline="always")
def _operand(code, r, column, base, places, rows, scratch, start, stop):
    """Entries [start, stop) of the operand in `column` (OUT, IN0..IN2) of fused row r: its `rows` (base OUT_OFF:
    the arena's, OUT_ADJ: a flat K = 1 adjoint's) at the row's offset in the column `base` names, or the scratch
    buffer planned for it."""
    p = places[r, column - oc.OUT]
    if p < 0:
        return _entries(code, r, column + base - oc.OUT, rows, start, stop)
    return scratch[p * BLOCK:p * BLOCK + stop - start]


@njit(cache=True, error_model="numpy")
def fused_forward(operands):
    """Rows r0..r1-1 of a fused group (see jitape_kernels.layout): elementwise over the first row's size each,
    or a broadcasting TILE (of one entry: a fill), BLOCK entries at a time. Called through its address (as the
    row kernels: replay_sweep links none of the block kernels)."""
    code, r0, r1, slots, iattr, fattr, arena, places, scratch, work = operands
    size = slots[code[r0, oc.OUT], oc.SIZE]
    for start in range(0, size, BLOCK):
        stop = min(start + BLOCK, size)
        for r in range(r0, r1):
            op = code[r, oc.OP]
            out = _operand(code, r, oc.OUT, oc.OUT_OFF, places, arena, scratch, start, stop)
            if op == oc.TILE:       # its input, smaller than the group's rows, is in the arena
                i0 = code[r, oc.IN0_OFF]
                n0 = slots[code[r, oc.IN0], oc.SIZE]
                if n0 == 1:
                    out[:] = arena[i0]
                else:
                    broadcast_block(iattr, code[r, oc.ATTR], arena[i0:i0 + n0], out, start, work)
                continue
            x = _operand(code, r, oc.IN0, oc.OUT_OFF, places, arena, scratch, start, stop)
            if op <= oc.UNARY_LAST:
                p0, p1 = params(op, iattr, fattr, code[r, oc.ATTR])
                unary_forward(op, x, out, p0, p1)
            elif op <= oc.BINARY_LAST:
                binary_forward(op, x, _operand(code, r, oc.IN1, oc.OUT_OFF, places, arena, scratch, start, stop), out)
            else:
                where_forward(x, _operand(code, r, oc.IN1, oc.OUT_OFF, places, arena, scratch, start, stop),
                              _operand(code, r, oc.IN2, oc.OUT_OFF, places, arena, scratch, start, stop), out)


@njit(cache=True, error_model="numpy")
def scalar_run_forward(operands):
    """Rows r0..r1-1, scalar elementwise rows, from their compact rows (layout.scalar_runs): no slot table and no
    size checks, 20% faster than scalar_rows_forward on a scalar chain. Addressed."""
    scalars, r0, r1, iattr, fattr, arena = operands
    for r in range(r0, r1):
        op = scalars[r, SC_OP]
        a = arena[scalars[r, SC_IN0_OFF]]
        if op <= oc.UNARY_LAST:
            p0, p1 = params(op, iattr, fattr, scalars[r, SC_ATTR])
            arena[scalars[r, SC_OUT_OFF]] = unary_value(op, a, p0, p1)
        else:
            arena[scalars[r, SC_OUT_OFF]] = binary_value(op, a, arena[scalars[r, SC_IN1_OFF]])


@njit(cache=True, error_model="numpy")
def _forward_rows(code, r0, r1, slots, iattr, fattr, arena, fused, places, scratch, work, temps, scalars, kernels,
                  kernel_args, row_kernels):
    """forward_sweep over rows r0..r1-1, running the fused groups that `fused` marks (fused[r] > r: rows
    r..fused[r]-1) by their generated kernels where `kernels` has one (cpu.fusion), else block by block
    (fused_forward, addressed in row_kernels), and the scalar runs that `scalars` marks (layout.scalar_runs) from
    their compact rows."""
    code, slots, iattr, fattr, arena, fused, places, scratch, scalars = (
        unowned(code), unowned(slots), unowned(iattr), unowned(fattr), unowned(arena), unowned(fused),
        unowned(places), unowned(scratch), unowned(scalars))
    r = r0
    while r < r1:
        if fused[r] > r:
            if kernels[r, KERNEL_ADDRESS] != 0:
                start = kernels[r, KERNEL_ARGS]
                call_kernel(kernels[r, KERNEL_ADDRESS],
                            (arena, iattr, fattr, kernel_args[start:start + kernels[r, KERNEL_ARG_COUNT]]))
                r = kernels[r, KERNEL_END]      # past the group, and the reduction of it the kernel computed
            else:
                call_addressed(row_kernels, FUSED_FORWARD,
                               (code, r, fused[r], slots, iattr, fattr, arena, places, scratch, work))
                r = fused[r]
            continue
        if scalars[r, SC_RUN] > r:
            stop = min(scalars[r, SC_RUN], r1)
            call_addressed(row_kernels, SCALAR_RUN_FORWARD, (scalars, r, stop, iattr, fattr, arena))
            r = stop
            continue
        if _stashes(code, r):
            _forward_row(code, r, slots, iattr, fattr, arena, work, temps, row_kernels, _stash(code, r, slots, scratch))
            r += 1
            continue
        q = r + 1
        while q < r1 and fused[q] <= q and scalars[q, SC_RUN] <= q and not _stashes(code, q):
            q += 1
        _forward_span(code, r, q, slots, iattr, fattr, arena, work, temps, row_kernels)
        r = q


@njit(cache=True, error_model="numpy", inline="always")
def _stashes(code, r):
    """Whether row r is a LOGSUMEXP with a stash in a replay's scratch (opcodes.STASH)."""
    return code[r, oc.OP] == oc.LOGSUMEXP and code[r, oc.STASH] >= 0


@njit(cache=True, error_model="numpy", inline="always")
def _stash(code, r, slots, scratch):
    """Row r's stash (see _stashes): its input's size and then its output's size of entries, starting
    code[r, STASH] entries before the end of `scratch`."""
    start = scratch.size - code[r, oc.STASH]
    return scratch[start:start + slots[code[r, oc.IN0], oc.SIZE] + slots[code[r, oc.OUT], oc.SIZE]]


@njit(cache=True, error_model="numpy")
def logsumexp_reverse_from_stash(operands):
    """_reverse_row of a LOGSUMEXP row with a stash, one column: its input's cotangent from the stashed
    exponentials (reduction.logsumexp_from_stash), set where written first (as every reduction's). Addressed."""
    code, r, slots, iattr, flat, written, stash = operands
    j0 = code[r, oc.IN0_ADJ]
    if not written[code[r, oc.OUT]] or j0 < 0:
        return
    first = not written[code[r, oc.IN0]]
    written[code[r, oc.IN0]] = True
    a = code[r, oc.ATTR]
    go = code[r, oc.OUT_ADJ]
    reduction.logsumexp_from_stash(stash, flat[go:go + slots[code[r, oc.OUT], oc.SIZE]],
                                   flat[j0:j0 + slots[code[r, oc.IN0], oc.SIZE]], iattr[a], iattr[a + 1],
                                   iattr[a + 2], first)


# The reverse row kernels, one per op family (opcodes.FAMILY_ORDER's; compare rows, which no derivative runs, are
# binary rows), SUM and TILE apart from their families (the commonest, and a fifth of their families' compile),
# all of one signature (row_operands'): every sweep that runs reverse rules (reverse, replay, second-order, per
# example) calls them through a table of addresses (row_kernels), so a new user's first gradient compiles the
# kernels its Program uses, not all of them, and each is compiled once per dtype whatever sweeps call it.
REVERSE_KINDS = ("unary", "binary", "where", "sum", "reduce", "cumsum", "tile", "mapped", "moved", "matmul", "solve",
                 "inv")


def _kinds_of_opcodes(kinds, own):
    """Per opcode, the index in `kinds` of its row kernel: its name's or its family's in `own`, else its family."""
    return np.array([kinds.index(own.get(name, own.get(family, family)))
                     for name, family in zip(oc.NAMES, oc.FAMILIES)], np.int64)


# per opcode, its reverse row kernel's index (in REVERSE_KINDS, and in the table of addressed kernels)
REVERSE_KERNEL_OF = _kinds_of_opcodes(REVERSE_KINDS, {"compare": "binary", "sum": "sum", "tile": "tile"})


@njit(cache=True, error_model="numpy", inline="always")
def _reverse_instruction(code, r, slots, iattr, fattr, arena, adjoint, work, temps, homes, assign0, assign1,
                         row_kernels):
    """Accumulate instruction r's output cotangents ([size, K] rows of `adjoint`) into its active inputs: its
    family's reverse row kernel, through its address in the table row_kernels. homes: per slot, the address of
    a value read where it lives instead of in the arena (0: in the arena), or empty (every value in the arena):
    see value_of. assign0/assign1: input 0's / input 1's rows are first written here and hold no values yet
    (only the kernels that `sets_first_write` names take them: they set those rows; the caller zeroes the
    others')."""
    call_addressed(row_kernels, REVERSE_KERNEL_OF[code[r, oc.OP]],
                   row_operands(code, r, slots, iattr, fattr, arena, adjoint, work, temps, homes, assign0, assign1))


@njit(cache=True, error_model="numpy", inline="always")
def row_operands(code, r, slots, iattr, fattr, arena, adjoint, work, temps, homes, assign0, assign1):
    """Row r's operands as every row kernel takes them: (op, its attribute block, iattr, fattr, work, temps, the
    adjoint [rows, K] and flat (K = 1: contiguous 1-D views for the vectorised kernels), the values of the output
    and inputs 0 and 1 (input 0's where there is no input 1), the adjoint rows of the output and inputs 0-2 (-1:
    inactive), the sizes of the output and inputs 0 and 1, whether both inputs are one slot, assign0, assign1):
    the same types from reverse_sweep and replay_sweep, so their row kernels compile once per dtype."""
    size = slots[code[r, oc.OUT], oc.SIZE]
    n0 = slots[code[r, oc.IN0], oc.SIZE]
    x = value_of(arena, homes, code[r, oc.IN0], code[r, oc.IN0_OFF], n0)
    n1 = slots[code[r, oc.IN1], oc.SIZE] if code[r, oc.IN1] >= 0 else 0
    w = value_of(arena, homes, code[r, oc.IN1], code[r, oc.IN1_OFF], n1) if code[r, oc.IN1] >= 0 else x
    return (code[r, oc.OP], code[r, oc.ATTR], iattr, fattr, work, temps, adjoint, adjoint.reshape(adjoint.size),
            value_of(arena, homes, code[r, oc.OUT], code[r, oc.OUT_OFF], size), x, w, code[r, oc.OUT_ADJ],
            code[r, oc.IN0_ADJ], code[r, oc.IN1_ADJ], code[r, oc.IN2_ADJ], size, n0, n1,
            code[r, oc.IN0] == code[r, oc.IN1], assign0, assign1)


# Each row kernel takes row_operands' tuple: op, a (its attribute block), iattr, fattr, work, temps, adjoint, flat,
# y, x, w (values), go, j0, j1, j2 (adjoint rows), size, n0, n1, same (both inputs one slot), assign0, assign1
# (one tuple: numba inlines no call with *args).


@njit(cache=True, error_model="numpy")
def reverse_unary_row(operands):
    (op, a, iattr, fattr, work, temps, adjoint, flat, y, x, w, go, j0, j1, j2, size, n0, n1, same, assign0,
     assign1) = operands
    if j0 < 0:
        return
    p0, p1 = params(op, iattr, fattr, a)
    if adjoint.shape[1] == 1:
        unary_reverse_1d(op, x, y, flat[go:go + size], flat[j0:j0 + n0], p0, p1, assign0)
    else:
        unary_reverse(op, x, y, adjoint[go:go + size], adjoint[j0:j0 + n0], p0, p1, assign0)


@njit(cache=True, error_model="numpy")
def reverse_binary_row(operands):
    (op, a, iattr, fattr, work, temps, adjoint, flat, y, x, w, go, j0, j1, j2, size, n0, n1, same, assign0,
     assign1) = operands
    if adjoint.shape[1] == 1:
        # an inactive input (row -1) gets a placeholder view that the kernel never writes
        binary_reverse_1d(op, x, w, y, flat[go:go + size], flat[max(j0, 0):max(j0, 0) + n0],
                          flat[max(j1, 0):max(j1, 0) + n1], j0 >= 0, j1 >= 0, assign0, assign1, same)
    else:
        binary_reverse(op, x, w, y, adjoint[go:go + size], adjoint[max(j0, 0):max(j0, 0) + n0 * (j0 >= 0)],
                       adjoint[max(j1, 0):max(j1, 0) + n1 * (j1 >= 0)], j0 >= 0, j1 >= 0, assign0, assign1)


@njit(cache=True, error_model="numpy")
def reverse_matmul_row(operands):
    (op, a, iattr, fattr, work, temps, adjoint, flat, y, x, w, go, j0, j1, j2, size, n0, n1, same, assign0,
     assign1) = operands
    matmul_reverse(iattr, a, x, w, adjoint[go:go + size], adjoint[max(j0, 0):max(j0, 0) + n0 * (j0 >= 0)],
                   adjoint[max(j1, 0):max(j1, 0) + n1 * (j1 >= 0)], j0 >= 0, j1 >= 0, temps, assign0, assign1)


@njit(cache=True, error_model="numpy")
def reverse_solve_row(operands):
    (op, a, iattr, fattr, work, temps, adjoint, flat, y, x, w, go, j0, j1, j2, size, n0, n1, same, assign0,
     assign1) = operands
    solve_reverse(iattr, a, x, y, adjoint[go:go + size], adjoint[max(j0, 0):max(j0, 0) + n0 * (j0 >= 0)],
                  adjoint[max(j1, 0):max(j1, 0) + n1 * (j1 >= 0)], j0 >= 0, j1 >= 0, temps)


# the linear kernels below run transposed here (the tangent sweep runs them as they are); their `transpose` is a
# run-time True (K > 0), not a literal, so that both sweeps share their compiled code


@njit(cache=True, error_model="numpy")
def reverse_where_row(operands):
    (op, a, iattr, fattr, work, temps, adjoint, flat, y, x, w, go, j0, j1, j2, size, n0, n1, same, assign0,
     assign1) = operands
    where_linear(x, adjoint[go:go + size], adjoint[max(j1, 0):max(j1, 0) + size * (j1 >= 0)],
                 adjoint[max(j2, 0):max(j2, 0) + size * (j2 >= 0)], j1 >= 0, j2 >= 0, adjoint.shape[1] > 0)


@njit(cache=True, error_model="numpy")
def reverse_sum_row(operands):
    (op, a, iattr, fattr, work, temps, adjoint, flat, y, x, w, go, j0, j1, j2, size, n0, n1, same, assign0,
     assign1) = operands
    if j0 >= 0:
        reduction.sum_linear(adjoint[go:go + size], adjoint[j0:j0 + n0], iattr[a], iattr[a + 1], iattr[a + 2],
                             adjoint.shape[1] > 0, assign0)


@njit(cache=True, error_model="numpy")
def reverse_reduce_row(operands):
    (op, a, iattr, fattr, work, temps, adjoint, flat, y, x, w, go, j0, j1, j2, size, n0, n1, same, assign0,
     assign1) = operands
    if j0 >= 0:
        reduce_linear(op, x, y, adjoint[go:go + size], adjoint[j0:j0 + n0], iattr[a], iattr[a + 1], iattr[a + 2],
                      adjoint.shape[1] > 0, temps, assign0)


@njit(cache=True, error_model="numpy")
def reverse_cumsum_row(operands):
    (op, a, iattr, fattr, work, temps, adjoint, flat, y, x, w, go, j0, j1, j2, size, n0, n1, same, assign0,
     assign1) = operands
    if j0 >= 0:
        cumsum_linear(adjoint[go:go + size], adjoint[j0:j0 + n0], iattr[a], iattr[a + 1], iattr[a + 2],
                      iattr[a + 3] != 0, iattr[a + 4] != 0, adjoint.shape[1] > 0, temps)


@njit(cache=True, error_model="numpy")
def reverse_tile_row(operands):
    (op, a, iattr, fattr, work, temps, adjoint, flat, y, x, w, go, j0, j1, j2, size, n0, n1, same, assign0,
     assign1) = operands
    if j0 >= 0:
        tile_linear(iattr, a, adjoint[go:go + size], adjoint[j0:j0 + n0], adjoint.shape[1] > 0, work, assign0)


@njit(cache=True, error_model="numpy")
def reverse_mapped_row(operands):
    (op, a, iattr, fattr, work, temps, adjoint, flat, y, x, w, go, j0, j1, j2, size, n0, n1, same, assign0,
     assign1) = operands
    if j0 >= 0:
        mapped_linear(op, iattr, a, adjoint[go:go + size], adjoint[j0:j0 + n0], adjoint.shape[1] > 0, work, assign0)


@njit(cache=True, error_model="numpy")
def reverse_moved_row(operands):
    (op, a, iattr, fattr, work, temps, adjoint, flat, y, x, w, go, j0, j1, j2, size, n0, n1, same, assign0,
     assign1) = operands
    if j0 >= 0:
        moved_linear(op, iattr, a, adjoint[go:go + size], adjoint[j0:j0 + n0], adjoint.shape[1] > 0, assign0)


@njit(cache=True, error_model="numpy")
def reverse_inv_row(operands):
    (op, a, iattr, fattr, work, temps, adjoint, flat, y, x, w, go, j0, j1, j2, size, n0, n1, same, assign0,
     assign1) = operands
    if j0 >= 0:
        inv_reverse(iattr, a, y, adjoint[go:go + size], adjoint[j0:j0 + n0], temps)


REVERSE_ROW_KERNELS = (reverse_unary_row, reverse_binary_row, reverse_where_row, reverse_sum_row, reverse_reduce_row,
                       reverse_cumsum_row, reverse_tile_row, reverse_mapped_row, reverse_moved_row, reverse_matmul_row,
                       reverse_solve_row, reverse_inv_row)


@njit(cache=True, error_model="numpy")
def reverse_instruction(code, r, slots, iattr, fattr, arena, adjoint, work, temps, homes, row_kernels):
    """_reverse_instruction as a function of its own, for the sweeps of other modules (second-order, per example):
    inlined into their loops, it made the second-order sweep of W10's Hessian-vector product 10% slower.
    row_kernels: the table of addressed kernels holding the row's reverse row kernel."""
    _reverse_instruction(code, r, slots, iattr, fattr, arena, adjoint, work, temps, homes, False, False, row_kernels)


@njit(cache=True, error_model="numpy", inline="always")
def value_of(arena, homes, slot, offset, size):
    """The value of `slot`: its arena rows, or the array at its address in `homes` (a large recorded value a
    tape's derivative sweeps read where the tape keeps it: jitape.program's homes)."""
    if homes.size != 0 and homes[slot] != 0:
        return at_address(homes[slot], size, arena)
    return arena[offset:offset + size]


@njit(cache=True, error_model="numpy", inline="always")
def sets_first_write(op, K, distinct_inputs):
    """Whether op's reverse kernel sets (rather than adds to) the rows of an input it writes first: the
    elementwise kernels, the reductions, the moves whose transposed map writes each input entry once
    (TRANSPOSE, PAD, PLACE), and matmul when its operands are different slots (it writes one operand's rows
    before the other's)."""
    return (op <= oc.BINARY_LAST or oc.SUM <= op <= oc.REDUCE_LAST or op == oc.TRANSPOSE or op == oc.PAD
            or op == oc.PLACE or (op == oc.MATMUL and distinct_inputs))


@njit(cache=True, error_model="numpy")
def reverse_sweep(code, slots, iattr, fattr, arena, adjoint, written, homes, temps, row_kernels):
    """Accumulate K cotangent columns from outputs into inputs, last instruction first. homes: see
    reverse_instruction (empty: every value is in the arena); temps: the kernels' scratch, at least
    planned_temps' entries for K columns; row_kernels: the addresses of the row kernels of the families `code`
    holds, compiled for these arrays' types (row_kernels.reverse_table).

    Only the rows of slots marked in `written` (per slot: the seeded targets) hold
    values on entry; a slot's rows are initialised by their first write (set by
    the elementwise kernels, zeroed before the others add to them) and marked, so
    no buffer is filled per call. An instruction whose output was never written
    has a zero cotangent and is skipped. On return `written` marks every slot
    whose rows hold values: the others' cotangents are zero.
    Rows whose output is inactive were pruned at lowering; an inactive input
    (adjoint row -1) is skipped, so its derivative is never computed.
    """
    _reverse_rows(code, slots, iattr, fattr, arena, adjoint, written, new_work(), temps, homes, None, None, None, None,
                  None, None, row_kernels)


@njit(cache=True, error_model="numpy")
def _reverse_rows(code, slots, iattr, fattr, arena, adjoint, written, work, temps, homes, scalars, groups, places,
                  scratch, kernels, kernel_args, row_kernels):
    """reverse_sweep with a workspace (jitape_kernels.cpu.workspace). A replay's gradient step (with one column)
    also gives the compact rows of its scalar runs (`scalars`: layout.scalar_runs) and its fused reverse groups
    (`groups`, `places`, `scratch`: layout.reverse_groups; groups[r] > 1: rows r down to r - groups[r] + 1) with
    their generated kernels (`kernels`, `kernel_args`: cpu.fusion.GroupKernels'), which run from those;
    reverse_sweep gives None, and numba prunes their branches from its compiled code. row_kernels: the table of
    addressed kernels (reverse_sweep's or replay_sweep's)."""
    code, slots, iattr, fattr, arena, adjoint, written, work, temps, homes = (
        unowned(code), unowned(slots), unowned(iattr), unowned(fattr), unowned(arena), unowned(adjoint),
        unowned(written), unowned(work), unowned(temps), unowned(homes))
    K = adjoint.shape[1]
    flat = adjoint.reshape(adjoint.size)
    run_rows = _run_rows(scalars)
    r = code.shape[0] - 1
    while r >= 0:
        if K == 1:
            if scalars is not None:
                if scalars[r, SC_RUN] > 0:
                    call_addressed(row_kernels, SCALAR_RUN_REVERSE,
                                   (scalars, r, scalars[r, SC_RUN], iattr, fattr, arena, flat, written))
                    r -= scalars[r, SC_RUN]
                    continue
            r = next_row(row_kernels, SCALAR_ROWS_REVERSE, (code, r, slots, iattr, fattr, arena, flat, written))
            if r >= 0:
                r = next_row(row_kernels, SMALL_ROWS_REVERSE,
                             (code, r, slots, iattr, fattr, arena, flat, written, run_rows))
            if r < 0:
                break
            if scalars is not None:
                if scalars[r, SC_RUN] > 0:
                    continue
                if groups[r] > 1:
                    call_addressed(row_kernels, FUSED_REVERSE, (code, r, groups[r], slots, iattr, fattr, arena, flat,
                                                                written, places, scratch, scalars, work, kernels,
                                                                kernel_args))
                    r -= groups[r]
                    continue
                if _stashes(code, r):
                    call_addressed(row_kernels, LOGSUMEXP_FROM_STASH,
                                   (code, r, slots, iattr, flat, written, _stash(code, r, slots, scratch)))
                    r -= 1
                    continue
        else:
            r = next_row(row_kernels, SMALL_ROWS_REVERSE_COLUMNS,
                         (code, r, slots, iattr, fattr, arena, adjoint, written))
            if r < 0:
                break
        _reverse_row(code, r, slots, iattr, fattr, arena, adjoint, written, work, temps, homes, row_kernels)
        r -= 1


@njit(cache=True, error_model="numpy")
def fused_reverse(operands):
    """Rows r, r-1, .., r-count+1 of a fused reverse group (jitape_kernels.layout.reverse_groups) with one column:
    elementwise rows of one size, SUMs, MAXs and MINs reading that size and broadcasts to it, BLOCK entries at a
    time (a broadcast's input's cotangent summed block by block in the adjoint rows, an extremum's shares worked
    out before the blocks), the cotangents that only
    the group writes and reads in scratch buffers. Which rows run and which inputs they write first are the
    step's planned flags (scalars[:, SC_FLAGS]: planning.reverse_flags), so every block runs the same rules; the
    inputs they write are marked in `written` for the rows and moves after the group. The values the rules read
    are in the arena (the run layout keeps what derivative rows read there). A group with a generated kernel
    (kernels[r]: cpu.fusion.GroupKernels' table of the step's rows) runs it instead, shares included. Called
    through its address (as fused_forward)."""
    (code, r, count, slots, iattr, fattr, arena, flat, written, places, scratch, scalars, work, kernels,
     kernel_args) = operands
    for q in range(r, r - count, -1):
        if scalars[q, SC_FLAGS] != 0:
            for c in range(3):
                if code[q, oc.IN0 + c] >= 0 and code[q, oc.IN0_ADJ + c] >= 0:
                    written[code[q, oc.IN0 + c]] = True
    if kernels[r, KERNEL_ADDRESS] != 0:
        start = kernels[r, KERNEL_ARGS]
        call_kernel(kernels[r, KERNEL_ADDRESS],
                    (arena, flat, iattr, fattr, kernel_args[start:start + kernels[r, KERNEL_ARG_COUNT]]))
        return
    for q in range(r, r - count, -1):
        op = code[q, oc.OP]
        if scalars[q, SC_FLAGS] != 0 and (op == oc.MAX or op == oc.MIN) and code[q, oc.IN0_ADJ] >= 0:
            go, n_out = code[q, oc.OUT_ADJ], slots[code[q, oc.OUT], oc.SIZE]     # each row's share, first
            reduction.extremum_shares(_entries(code, q, oc.IN0_OFF, arena, 0, slots[code[q, oc.IN0], oc.SIZE]),
                                      _entries(code, q, oc.OUT_OFF, arena, 0, n_out), flat[go:go + n_out],
                                      iattr[code[q, oc.ATTR] + 1])
    # the larger of the first row's operands: a SUM's input, a TILE's output
    size = max(slots[code[r, oc.IN0], oc.SIZE], slots[code[r, oc.OUT], oc.SIZE])
    for start in range(0, size, BLOCK):
        stop = min(start + BLOCK, size)
        for q in range(r, r - count, -1):
            flags = scalars[q, SC_FLAGS]
            if flags == 0:
                continue
            op = code[q, oc.OP]
            has0 = code[q, oc.IN0_ADJ] >= 0
            if op == oc.TILE:       # its input smaller: its cotangent all in the adjoint rows, zeroed first if set
                if has0:
                    j0 = code[q, oc.IN0_ADJ]
                    g_in = flat[j0:j0 + slots[code[q, oc.IN0], oc.SIZE]]
                    if start == 0 and flags & 2:
                        g_in[:] = 0
                    broadcast_sum_block(iattr, code[q, oc.ATTR],
                                        _operand(code, q, oc.OUT, oc.OUT_ADJ, places, flat, scratch, start, stop),
                                        g_in, start, work)
                continue
            g0 = _operand(code, q, oc.IN0, oc.OUT_ADJ, places, flat, scratch, start, stop) if has0 else flat[:0]
            if op == oc.SUM:
                a = code[q, oc.ATTR]
                go = code[q, oc.OUT_ADJ]
                reduction.sum_transposed_block(flat[go:go + slots[code[q, oc.OUT], oc.SIZE]], g0, iattr[a + 1],
                                               iattr[a + 2], start, flags & 2 != 0)
                continue
            if op == oc.MAX or op == oc.MIN:
                if has0:
                    go, n_out = code[q, oc.OUT_ADJ], slots[code[q, oc.OUT], oc.SIZE]
                    reduction.extremum_transposed_block(_entries(code, q, oc.IN0_OFF, arena, start, stop),
                                                        _entries(code, q, oc.OUT_OFF, arena, 0, n_out),
                                                        flat[go:go + n_out], g0, iattr[code[q, oc.ATTR] + 1], start,
                                                        flags & 2 != 0)
                continue
            g_out = _operand(code, q, oc.OUT, oc.OUT_ADJ, places, flat, scratch, start, stop)
            x = _entries(code, q, oc.IN0_OFF, arena, start, stop)
            if op <= oc.UNARY_LAST:
                p0, p1 = params(op, iattr, fattr, code[q, oc.ATTR])
                y = _entries(code, q, oc.OUT_OFF, arena, start, stop)
                unary_reverse_1d(op, x, y, g_out, g0, p0, p1, flags & 2 != 0)
                continue
            has1 = code[q, oc.IN1_ADJ] >= 0
            g1 = _operand(code, q, oc.IN1, oc.OUT_ADJ, places, flat, scratch, start, stop) if has1 else flat[:0]
            if op <= oc.BINARY_LAST:
                # an inactive input gets a placeholder view that the kernel never writes
                y = _entries(code, q, oc.OUT_OFF, arena, start, stop)
                w = _entries(code, q, oc.IN1_OFF, arena, start, stop)
                binary_reverse_1d(op, x, w, y, g_out, g0 if has0 else g_out, g1 if has1 else g_out, has0, has1,
                                  flags & 2 != 0, flags & 4 != 0)
                continue
            has2 = code[q, oc.IN2_ADJ] >= 0     # WHERE: its inputs' cotangents are added to, so first zeroed
            g2 = _operand(code, q, oc.IN2, oc.OUT_ADJ, places, flat, scratch, start, stop) if has2 else flat[:0]
            if flags & 4:
                g1[:] = 0
            if flags & 8:
                g2[:] = 0
            n = stop - start
            where_linear(x, g_out.reshape(n, 1), g1.reshape(g1.size, 1), g2.reshape(g2.size, 1), has1, has2, True)


@njit(cache=True, error_model="numpy")
def scalar_rows_reverse(operands):
    """reverse_sweep with one column over rows r0, r0-1, ... while they are scalar elementwise rows; the
    first row that is not (-1: none). A loop of its own: compiled inside the general row's code, a scalar chain
    runs at half this speed. Addressed, as the row kernels: called once per stretch of rows."""
    code, r0, slots, iattr, fattr, arena, flat, written = operands
    for r in range(r0, -1, -1):
        op = code[r, oc.OP]
        if op > oc.BINARY_LAST or slots[code[r, oc.OUT], oc.SIZE] != 1:
            return r
        if not written[code[r, oc.OUT]]:
            continue
        o = code[r, oc.OUT_OFF]
        g = flat[code[r, oc.OUT_ADJ]]
        i0 = code[r, oc.IN0_OFF]
        j0 = code[r, oc.IN0_ADJ]
        first0 = j0 >= 0 and not written[code[r, oc.IN0]]
        if j0 >= 0:
            written[code[r, oc.IN0]] = True
        if op <= oc.UNARY_LAST:
            if j0 >= 0:
                p0, p1 = params(op, iattr, fattr, code[r, oc.ATTR])
                d = unary_derivative(op, arena[i0], arena[o], p0, p1)
                if first0:
                    flat[j0] = g * d
                else:
                    flat[j0] += g * d
            continue
        i1 = code[r, oc.IN1_OFF]
        j1 = code[r, oc.IN1_ADJ]
        # x * x: the second input's row is the first's, just set (first1 False)
        first1 = j1 >= 0 and not written[code[r, oc.IN1]]
        if j1 >= 0:
            written[code[r, oc.IN1]] = True
        da, db = binary_partials(op, arena[i0], arena[i1], arena[o])
        if j0 >= 0:
            if first0:
                flat[j0] = g * da
            else:
                flat[j0] += g * da
        if j1 >= 0:
            if first1:
                flat[j1] = g * db
            else:
                flat[j1] += g * db
    return -1


@njit(cache=True, error_model="numpy")
def scalar_run_reverse(operands):
    """Rows r down to r - count + 1 of a gradient step with one column, scalar elementwise rows, from their compact
    rows and planned flags (layout.scalar_runs): no slot table and no reads of `written` (its inputs' entries are
    set as the sweep would), 40% faster than scalar_rows_reverse on a scalar chain; a FORWARDED row (planning's)
    only marks them. Addressed."""
    scalars, r, count, iattr, fattr, arena, flat, written = operands
    for q in range(r, r - count, -1):
        flags = scalars[q, SC_FLAGS]
        if flags == 0:      # its output's cotangent is zero
            continue
        op = scalars[q, SC_OP]
        j0 = scalars[q, SC_IN0_ADJ]
        if j0 >= 0:
            written[scalars[q, SC_IN0]] = True
        j1 = scalars[q, SC_IN1_ADJ]
        if j1 >= 0:
            written[scalars[q, SC_IN1]] = True
        if flags & FORWARDED:       # its inputs' cotangents are its output's
            continue
        g = flat[scalars[q, SC_OUT_ADJ]]
        a = arena[scalars[q, SC_IN0_OFF]]
        # set or add spelled out: through _put, whose flag varies per row here, the loop ran 1.4x slower
        if op <= oc.UNARY_LAST:
            if j0 >= 0:
                p0, p1 = params(op, iattr, fattr, scalars[q, SC_ATTR])
                d = g * unary_derivative(op, a, arena[scalars[q, SC_OUT_OFF]], p0, p1)
                if flags & 2:
                    flat[j0] = d
                else:
                    flat[j0] += d
            continue
        da, db = binary_partials(op, a, arena[scalars[q, SC_IN1_OFF]], arena[scalars[q, SC_OUT_OFF]])
        if j0 >= 0:
            if flags & 2:
                flat[j0] = g * da
            else:
                flat[j0] += g * da
        if j1 >= 0:
            if flags & 4:
                flat[j1] = g * db
            else:
                flat[j1] += g * db


def _run_rows(scalars):
    """The compact rows small_rows_reverse reads a replay's scalar runs from: `scalars`, or none (an empty table,
    of the same type: reverse_sweep and a replay's gradient steps call one compiled small_rows_reverse) where
    `scalars` is None. An overload: numba prunes a branch on `scalars is None` for arguments only."""


@overload(_run_rows, inline="always")
def _run_rows_overload(scalars):
    if isinstance(scalars, types.NoneType):
        return lambda scalars: np.zeros((0, SC_FLAGS + 1), np.int64)
    return lambda scalars: scalars


@njit(cache=True, error_model="numpy", inline="always")
def _starts_run(scalars, r):
    """Whether row r starts a scalar run of `scalars` (compact rows: layout.scalar_runs; none in reverse_sweep)."""
    return r < scalars.shape[0] and scalars[r, SC_RUN] > 0


@njit(cache=True, error_model="numpy", inline="always")
def _input_rows(code, r, c, written):
    """Row r's input c (0 or 1): its arena offset, its adjoint row (-1: inactive) and whether the row writes its
    rows first (they are then marked written; x * x: the second input's rows are the first's, just set, so not
    first for it)."""
    i, j, s = code[r, oc.IN0_OFF + c], code[r, oc.IN0_ADJ + c], code[r, oc.IN0 + c]
    first = j >= 0 and not written[s]
    if j >= 0:      # after the loads: a store to `written` makes the compiler load `code` again after it
        written[s] = True
    return i, j, first


@njit(cache=True, error_model="numpy", inline="always")
def _row_start(code, r, written):
    """Row r's output arena offset and adjoint row, then input 0's _input_rows."""
    o, go = code[r, oc.OUT_OFF], code[r, oc.OUT_ADJ]
    i0, j0, first0 = _input_rows(code, r, 0, written)
    return o, go, i0, j0, first0


@njit(cache=True, error_model="numpy", inline="always")
def _accumulate(adjoint, j, k, value, first):
    if first:
        adjoint[j, k] = value
    else:
        adjoint[j, k] += value


@njit(cache=True, error_model="numpy")
def small_rows_reverse_columns(operands):
    """reverse_sweep with K > 1 columns over rows r0, r0-1, ... while they are elementwise rows of at most SMALL
    entries, each rule inlined per entry (no views); the first row that is not (-1: none). A loop of its own,
    called through its address once per stretch of such rows: inlined into the sweeps, these rules were 3 s of a
    cold replay or reverse sweep's compile."""
    code, r0, slots, iattr, fattr, arena, adjoint, written = operands
    K = adjoint.shape[1]
    for r in range(r0, -1, -1):
        op = code[r, oc.OP]
        size = slots[code[r, oc.OUT], oc.SIZE]
        if size > SMALL or op > oc.BINARY_LAST:
            return r
        if not written[code[r, oc.OUT]]:
            continue
        o, go, i0, j0, first0 = _row_start(code, r, written)
        if op <= oc.UNARY_LAST:
            if j0 >= 0:
                p0, p1 = params(op, iattr, fattr, code[r, oc.ATTR])
                for e in range(size):
                    d = unary_derivative(op, arena[i0 + e], arena[o + e], p0, p1)
                    for k in range(K):
                        _accumulate(adjoint, j0 + e, k, adjoint[go + e, k] * d, first0)
            continue
        i1, j1, first1 = _input_rows(code, r, 1, written)
        for e in range(size):
            da, db = binary_partials(op, arena[i0 + e], arena[i1 + e], arena[o + e])
            for k in range(K):
                g = adjoint[go + e, k]
                if j0 >= 0:
                    _accumulate(adjoint, j0 + e, k, g * da, first0)
                if j1 >= 0:
                    _accumulate(adjoint, j1 + e, k, g * db, first1)
    return -1


@njit(cache=True, error_model="numpy")
def small_rows_reverse(operands):
    """reverse_sweep with one column over rows r0, r0-1, ... while they are small rows (small_row) or SLICE/PLACE
    rows moving one run of at most SMALL entries; the first row that is not, or that starts a scalar run (see
    _reverse_rows) (-1: none).
    A loop of its own: in the general row's code a small row pays for its views (~60 ns), and a scalar chain
    runs faster still in scalar_rows_reverse's straight-line loop (25% slower in this one). Addressed; scalars:
    a replay's scalar runs, or none (reverse_sweep: see _run_rows)."""
    code, r0, slots, iattr, fattr, arena, flat, written, scalars = operands
    for r in range(r0, -1, -1):
        if _starts_run(scalars, r):
            return r
        op = code[r, oc.OP]
        if op == oc.TILE or op == oc.SUM:
            size = slots[code[r, oc.OUT], oc.SIZE]
            if not small_row(op, slots[code[r, oc.IN0], oc.SIZE], size):
                return r
        elif op > oc.BINARY_LAST:
            src, dst, size = contiguous_run(op, iattr, code[r, oc.ATTR])
            if size < 0 or size > SMALL:
                return r
        else:
            size = slots[code[r, oc.OUT], oc.SIZE]
            if size > SMALL:
                return r
        if not written[code[r, oc.OUT]]:
            continue
        o, go, i0, j0, first0 = _row_start(code, r, written)
        if op == oc.TILE:           # a scalar broadcast: its entries' cotangents summed (as shape.tile_linear sums)
            if j0 >= 0:
                total = reduction.lane_sum(flat, go, size)
                if first0:
                    flat[j0] = 0
                flat[j0] += total
            continue
        if op == oc.SUM:            # a whole sum: its cotangent to every entry
            if j0 >= 0:
                for e in range(slots[code[r, oc.IN0], oc.SIZE]):
                    _put(flat, j0 + e, flat[go], first0)
            continue
        if op > oc.BINARY_LAST:     # a run moved: its cotangent moves back (a SLICE's other entries get zeros)
            if j0 >= 0:
                if first0 and op == oc.SLICE:
                    flat[j0:j0 + slots[code[r, oc.IN0], oc.SIZE]] = 0
                for e in range(size):
                    _put(flat, j0 + src + e, flat[go + dst + e], first0 and op == oc.PLACE)
            continue
        if op <= oc.UNARY_LAST:
            if j0 >= 0:
                p0, p1 = params(op, iattr, fattr, code[r, oc.ATTR])
                for e in range(size):
                    _put(flat, j0 + e, flat[go + e] * unary_derivative(op, arena[i0 + e], arena[o + e], p0, p1),
                         first0)
            continue
        i1, j1, first1 = _input_rows(code, r, 1, written)
        for e in range(size):
            g = flat[go + e]
            da, db = binary_partials(op, arena[i0 + e], arena[i1 + e], arena[o + e])
            if j0 >= 0:
                _put(flat, j0 + e, g * da, first0)
            if j1 >= 0:
                _put(flat, j1 + e, g * db, first1)
    return -1


@njit(cache=True, error_model="numpy", inline="always")
def _reverse_row(code, r, slots, iattr, fattr, arena, adjoint, written, work, temps, homes, row_kernels):
    """reverse_sweep's work for row r (row_kernels: see _reverse_rows): its row kernel, through its address."""
    if not written[code[r, oc.OUT]]:
        return
    sets = sets_first_write(code[r, oc.OP], adjoint.shape[1], code[r, oc.IN0] != code[r, oc.IN1])
    assign0 = assign1 = False
    # whether every input it writes holds its cotangent in the output's rows (planning.cotangent_homes): an input
    # its rule copies the output's cotangent to, of the output's size, in the same rows (rows of another slot
    # live at this row are others, but where both are empty)
    forwards = oc.COTANGENT_IS_OUTPUTS[code[r, oc.OP]]
    forwarded = forwards != 0
    for c in range(oc.IN0, oc.IN2 + 1):
        s = code[r, c]
        j = code[r, c + oc.IN0_ADJ - oc.IN0]
        if s >= 0 and j >= 0:
            forwarded = forwarded and forwards >> (c - oc.IN0) & 1 == 1 and j == code[r, oc.OUT_ADJ] \
                and slots[s, oc.SIZE] == slots[code[r, oc.OUT], oc.SIZE]
            if written[s]:
                continue
            written[s] = True
            if sets and c == oc.IN0:
                assign0 = True
            elif sets and c == oc.IN1:
                assign1 = True
            else:
                adjoint[j:j + slots[s, oc.SIZE]] = 0
    if forwarded:
        return
    _reverse_instruction(code, r, slots, iattr, fattr, arena, adjoint, work, temps, homes, assign0, assign1,
                         row_kernels)


@njit(cache=True, error_model="numpy")
def replay_sweep(code, slots, iattr, fattr, arena, steps, step_code, moves, adjoint, guards, expected, fused, places,
                 scratch, temps, step_groups, step_places, scalars, step_scalars, kernels, kernel_args, resume,
                 row_kernels):
    """A whole replay in one call: forward segments of `code`, each but the last ending at a gradient step,
    then the guard checks. Returns REPLAY_HELD (-1) when every guard holds, GUARD_BROKEN (-2) when one does not,
    or s >= 0 where it stopped before host step s (a Hessian inside a jt.function: see jitape.replay), which its
    caller runs before calling again.

    steps    [n, 8]  position (the rows of code before the step), step_code start, stop, the target's adjoint
                     row (-1: unreached; HOST_STEP: a host step, the replay returns), target size, moves start,
                     stop, target slot
    step_code        the steps' derivative rows, each step's planned over its own adjoint rows
    moves    [m, 4]  adjoint row (-1: the source is unreached, its gradient is zero), size, arena offset (-1: the
                     gradient stays in the adjoint rows, for the caller), source slot (its gradient is zero too
                     when the sweep never wrote it)
    adjoint  [r, K]  one buffer serving every step (r >= each step's rows); K = 1: gradients, the target's
                     entries seeded with ones; K > 1: one step, a Jacobian, the target seeded with the identity
    guards   [g, 3]  arena offset, size, offset in `expected` of the value the trace computed (NaN equals NaN)
    fused, places, scratch   the fused groups of a run layout (jitape_kernels.layout; fused all 0: none)
    temps            the kernels' scratch: at least planned_temps' entries of code and step_code for K columns
    step_groups, step_places   per step_code row, its fused reverse group (layout.reverse_groups; K = 1 only),
                     whose scratch buffers are `scratch`'s too
    scalars, step_scalars   the compact rows of code's and step_code's scalar runs (layout.scalar_runs; the
                     reverse's with K = 1 only)
    kernels, kernel_args    the generated kernels of the fused groups, a row per row of code then of step_code
                     (cpu.fusion.GroupKernels; addresses 0: none)
    resume   [1]     the host step after which this call resumes, the rows before it already run (-1: from
                     the start); set back to -1 on entry
    row_kernels      the reverse row kernels of step_code's families, as reverse_sweep takes them
    """
    written = np.zeros(slots.shape[0], np.bool_)
    work = new_work()
    first = resume[0] + 1
    resume[0] = -1
    start = steps[first - 1, 0] if first > 0 else 0
    for s in range(first, steps.shape[0] + 1):
        # one call site of the inlined forward rows (two doubled replay_sweep's compile of them)
        stop = steps[s, 0] if s < steps.shape[0] else code.shape[0]
        _forward_rows(code, start, stop, slots, iattr, fattr, arena, fused, places, scratch, work, temps,
                      scalars, kernels, kernel_args, row_kernels)
        if s == steps.shape[0]:
            break
        seed = steps[s, 3]
        if seed == HOST_STEP:
            return s
        written[:] = False
        if seed >= 0:
            if adjoint.shape[1] == 1:       # a gradient (of the target's entries summed)
                adjoint[seed:seed + steps[s, 4]] = 1
            else:                           # a Jacobian: column i seeds the target's entry i
                adjoint[seed:seed + steps[s, 4]] = 0
                for i in range(min(steps[s, 4], adjoint.shape[1])):
                    adjoint[seed + i, i] = 1
            written[steps[s, 7]] = True
            rows = slice(steps[s, 1], steps[s, 2])
            _reverse_rows(step_code[rows], slots, iattr, fattr, arena, adjoint, written, work, temps, work[:0],
                          step_scalars[rows], step_groups[rows], step_places[rows], scratch,
                          kernels[code.shape[0] + steps[s, 1]:code.shape[0] + steps[s, 2]], kernel_args,
                          row_kernels)
        for m in range(steps[s, 5], steps[s, 6]):
            row, size, offset, source = moves[m, 0], moves[m, 1], moves[m, 2], moves[m, 3]
            if offset < 0:
                # a gradient the caller reads from the adjoint rows: zeros where the sweep never wrote them
                if row >= 0 and not written[source]:
                    adjoint[row:row + size] = 0
                continue
            for i in range(size):
                arena[offset + i] = adjoint[row + i, 0] if row >= 0 and written[source] else 0
        start = stop
    for g in range(guards.shape[0]):
        offset, size, e = guards[g, 0], guards[g, 1], guards[g, 2]
        for i in range(size):
            value, traced = arena[offset + i], expected[e + i]
            if value != traced and not (value != value and traced != traced):
                return GUARD_BROKEN
    return REPLAY_HELD


@njit(cache=True, error_model="numpy")
def planned_temps(code, iattr):
    """(fixed, per column): one scratch buffer of fixed + K * per column entries serves every kernel of `code` in
    any sweep with K columns (forward, reverse, tangent, second order), each instruction's rule being its module's
    temps_entries; the sweeps take it as `temps`, so no kernel allocates per instruction."""
    fixed = per_column = 0
    for r in range(code.shape[0]):
        op = code[r, oc.OP]
        if oc.SUM <= op <= oc.CUMSUM:
            f, c = reduction.temps_entries(op, iattr, code[r, oc.ATTR])
        elif op == oc.MATMUL or op == oc.SOLVE or op == oc.INV:
            f, c = linalg.temps_entries(op, iattr, code[r, oc.ATTR])
        else:
            continue
        fixed = max(fixed, f)
        per_column = max(per_column, c)
    return fixed, per_column


# The table of addressed kernels (row_kernels) that forward_sweep, reverse_sweep and replay_sweep take: a row per
# kernel (its address, the key of the signature it was compiled for; row_kernels.kernel_table fills the rows a
# Program needs): the reverse row kernels, the forward row kernels, the fused groups' block kernels, then the
# scalar loops (each called once per stretch of rows: compiled once per dtype, not into every sweep).
ADDRESSED_KERNELS = REVERSE_ROW_KERNELS + FORWARD_ROW_KERNELS + (
    fused_forward, fused_reverse, scalar_rows_forward, scalar_run_forward, scalar_rows_reverse, small_rows_reverse,
    scalar_run_reverse, logsumexp_reverse_from_stash, small_rows_reverse_columns)
FORWARD_FIRST = len(REVERSE_ROW_KERNELS)
(FUSED_FORWARD, FUSED_REVERSE, SCALAR_ROWS_FORWARD, SCALAR_RUN_FORWARD, SCALAR_ROWS_REVERSE, SMALL_ROWS_REVERSE,
 SCALAR_RUN_REVERSE, LOGSUMEXP_FROM_STASH, SMALL_ROWS_REVERSE_COLUMNS) = range(
    FORWARD_FIRST + len(FORWARD_ROW_KERNELS), len(ADDRESSED_KERNELS))
# per opcode, its forward row kernel's row in the table
FORWARD_KERNEL_OF = FORWARD_FIRST + _kinds_of_opcodes(FORWARD_KINDS, {"compare": "binary", "sum": "sum"})
