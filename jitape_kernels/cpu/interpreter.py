"""The CPU forward and reverse interpreters: one compiled loop over a Program's instruction rows.

The dispatch is an if-chain over opcode families that LLVM turns into a jump
table; each family's work is done by the kernels of its module.
"""
import numpy as np
from numba import njit

from .. import opcodes as oc
from .elementwise import (binary_forward, binary_partials, binary_reverse, binary_reverse_1d, binary_value,
                          unary_derivative, unary_forward, unary_reverse, unary_reverse_1d, unary_value, where_forward,
                          where_linear)
from .linalg import (inv_forward, inv_reverse, matmul_forward, matmul_reverse, solve_forward,
                     solve_reverse)
from .reduction import cumsum_forward, cumsum_linear, reduce_forward, reduce_linear
from .shape import mapped_forward, mapped_linear, moved_forward, moved_linear


@njit(cache=True, error_model="numpy", inline="always")
def params(op, iattr, fattr, a):
    if op == oc.CLIP:
        return fattr[iattr[a]], fattr[iattr[a] + 1]
    if op == oc.ELU or op == oc.SCALE or op == oc.POWC or op == oc.POLYGAMMA:
        return fattr[iattr[a]], 0.0
    return 0.0, 0.0


@njit(cache=True, error_model="numpy")
def forward_sweep(code, slots, iattr, fattr, arena):
    """Recompute every instruction's output in the arena from its inputs, in program order."""
    for r in range(code.shape[0]):
        op = code[r, oc.OP]
        a = code[r, oc.ATTR]
        size = slots[code[r, oc.OUT], oc.SIZE]
        o = code[r, oc.OUT_OFF]
        i0 = code[r, oc.IN0_OFF]
        if size == 1 and op <= oc.BINARY_LAST:
            # scalar chains: no array views, the rule inlined
            if op <= oc.UNARY_LAST:
                p0, p1 = params(op, iattr, fattr, a)
                arena[o] = unary_value(op, arena[i0], p0, p1)
            else:
                arena[o] = binary_value(op, arena[i0], arena[code[r, oc.IN1_OFF]])
            continue
        out = arena[o:o + size]
        n0 = slots[code[r, oc.IN0], oc.SIZE]
        x = arena[i0:i0 + n0]
        if op <= oc.UNARY_LAST:
            p0, p1 = params(op, iattr, fattr, a)
            unary_forward(op, x, out, p0, p1)
        elif op <= oc.BINARY_LAST:
            i1 = code[r, oc.IN1_OFF]
            binary_forward(op, x, arena[i1:i1 + size], out)
        elif op == oc.WHERE:
            i1 = code[r, oc.IN1_OFF]
            i2 = code[r, oc.IN2_OFF]
            where_forward(x, arena[i1:i1 + size], arena[i2:i2 + size], out)
        elif op <= oc.PROD:
            reduce_forward(op, x, out, iattr[a], iattr[a + 1], iattr[a + 2])
        elif op == oc.CUMSUM:
            cumsum_forward(x, out, iattr[a], iattr[a + 1], iattr[a + 2], iattr[a + 3] != 0, iattr[a + 4] != 0)
        elif op <= oc.PAD:
            mapped_forward(op, iattr, a, x, out)
        elif op <= oc.GATHER:
            moved_forward(op, iattr, a, x, out)
        elif op == oc.MATMUL:
            i1 = code[r, oc.IN1_OFF]
            n1 = slots[code[r, oc.IN1], oc.SIZE]
            matmul_forward(iattr, a, x, arena[i1:i1 + n1], out)
        elif op == oc.SOLVE:
            i1 = code[r, oc.IN1_OFF]
            n1 = slots[code[r, oc.IN1], oc.SIZE]
            solve_forward(iattr, a, x, arena[i1:i1 + n1], out)
        else:
            inv_forward(iattr, a, x, out)


@njit(cache=True, error_model="numpy")
def reverse_instruction(code, r, slots, iattr, fattr, arena, adjoint):
    """Accumulate instruction r's output cotangents ([size, K] rows of `adjoint`) into its active inputs."""
    K = adjoint.shape[1]
    op = code[r, oc.OP]
    a = code[r, oc.ATTR]
    size = slots[code[r, oc.OUT], oc.SIZE]
    o = code[r, oc.OUT_OFF]
    go = code[r, oc.OUT_ADJ]
    empty = adjoint[0:0]
    flat = adjoint.reshape(adjoint.size)    # K = 1: contiguous 1-D views for the vectorised kernels
    y = arena[o:o + size]
    g_out = adjoint[go:go + size]
    i0 = code[r, oc.IN0_OFF]
    n0 = slots[code[r, oc.IN0], oc.SIZE]
    x = arena[i0:i0 + n0]
    j0 = code[r, oc.IN0_ADJ]
    g0 = adjoint[j0:j0 + n0] if j0 >= 0 else empty
    if op <= oc.UNARY_LAST:
        if j0 >= 0:
            p0, p1 = params(op, iattr, fattr, a)
            if K == 1:
                unary_reverse_1d(op, x, y, flat[go:go + size], flat[j0:j0 + n0], p0, p1)
            else:
                unary_reverse(op, x, y, g_out, g0, p0, p1)
        return
    if op <= oc.BINARY_LAST or op == oc.MATMUL or op == oc.SOLVE:
        i1 = code[r, oc.IN1_OFF]
        n1 = slots[code[r, oc.IN1], oc.SIZE]
        j1 = code[r, oc.IN1_ADJ]
        g1 = adjoint[j1:j1 + n1] if j1 >= 0 else empty
        w = arena[i1:i1 + n1]
        if op <= oc.BINARY_LAST and K == 1:
            # an inactive input (row -1) gets a placeholder view that the kernel never writes
            binary_reverse_1d(op, x, w, y, flat[go:go + size], flat[max(j0, 0):max(j0, 0) + n0],
                              flat[max(j1, 0):max(j1, 0) + n1], j0 >= 0, j1 >= 0)
        elif op <= oc.BINARY_LAST:
            binary_reverse(op, x, w, y, g_out, g0, g1, j0 >= 0, j1 >= 0)
        elif op == oc.MATMUL:
            matmul_reverse(iattr, a, x, w, g_out, g0, g1, j0 >= 0, j1 >= 0)
        else:
            solve_reverse(iattr, a, x, y, g_out, g0, g1, j0 >= 0, j1 >= 0)
        return
    # the linear kernels run transposed here; a run-time True (not a literal) lets the tangent sweep
    # share their compiled code
    transpose = K > 0
    if op == oc.WHERE:
        j1 = code[r, oc.IN1_ADJ]
        j2 = code[r, oc.IN2_ADJ]
        where_linear(x, g_out, adjoint[j1:j1 + size] if j1 >= 0 else empty,
                     adjoint[j2:j2 + size] if j2 >= 0 else empty, j1 >= 0, j2 >= 0, transpose)
        return
    if j0 < 0:
        return
    if op <= oc.PROD:
        reduce_linear(op, x, y, g_out, g0, iattr[a], iattr[a + 1], iattr[a + 2], transpose)
    elif op == oc.CUMSUM:
        cumsum_linear(g_out, g0, iattr[a], iattr[a + 1], iattr[a + 2], iattr[a + 3] != 0, iattr[a + 4] != 0,
                      transpose)
    elif op <= oc.PAD:
        mapped_linear(op, iattr, a, g_out, g0, transpose)
    elif op <= oc.GATHER:
        moved_linear(op, iattr, a, g_out, g0, transpose)
    else:
        inv_reverse(iattr, a, y, g_out, g0)


@njit(cache=True, error_model="numpy")
def reverse_sweep(code, slots, iattr, fattr, arena, adjoint):
    """Accumulate K cotangent columns from outputs into inputs, last instruction first.

    Rows whose output is inactive were pruned at lowering; an inactive input
    (adjoint row -1) is skipped, so its derivative is never computed.
    """
    K = adjoint.shape[1]
    for r in range(code.shape[0] - 1, -1, -1):
        op = code[r, oc.OP]
        a = code[r, oc.ATTR]
        size = slots[code[r, oc.OUT], oc.SIZE]
        o = code[r, oc.OUT_OFF]
        go = code[r, oc.OUT_ADJ]
        if size == 1 and op <= oc.BINARY_LAST:
            # scalar chains: no array views, the rule inlined
            i0 = code[r, oc.IN0_OFF]
            j0 = code[r, oc.IN0_ADJ]
            if op <= oc.UNARY_LAST:
                if j0 >= 0:
                    p0, p1 = params(op, iattr, fattr, a)
                    d = unary_derivative(op, arena[i0], arena[o], p0, p1)
                    for k in range(K):
                        adjoint[j0, k] += adjoint[go, k] * d
            else:
                i1 = code[r, oc.IN1_OFF]
                j1 = code[r, oc.IN1_ADJ]
                da, db = binary_partials(op, arena[i0], arena[i1], arena[o])
                for k in range(K):
                    g = adjoint[go, k]
                    if j0 >= 0:
                        adjoint[j0, k] += g * da
                    if j1 >= 0:
                        adjoint[j1, k] += g * db
            continue
        reverse_instruction(code, r, slots, iattr, fattr, arena, adjoint)


@njit(cache=True, error_model="numpy")
def reachability(rows, n_slots, targets, sources, values):
    """(need, active) per slot: `need` when a target depends on it, `active` when its value depends on a
    source (`values` True) or its derivative does (False: compare rows pass no activity on, their outputs are
    piecewise constant). rows: [n, >= 5] with out, in0..in2 in columns 1..4, as recorded and as in code."""
    n = rows.shape[0]
    need = np.zeros(n_slots, np.bool_)
    for t in targets:
        if t >= 0:
            need[t] = True
    for r in range(n - 1, -1, -1):
        if need[rows[r, 1]] and (values or not oc.COMPARE_FIRST <= rows[r, 0] <= oc.BINARY_LAST):
            for c in range(2, 5):
                if rows[r, c] >= 0:
                    need[rows[r, c]] = True
    active = np.zeros(n_slots, np.bool_)
    for s in sources:
        if s >= 0:
            active[s] = True
    for r in range(n):
        if not values and oc.COMPARE_FIRST <= rows[r, 0] <= oc.BINARY_LAST:
            continue
        for c in range(2, 5):
            s = rows[r, c]
            if s >= 0 and active[s]:
                active[rows[r, 1]] = True
    return need, active


@njit(cache=True, error_model="numpy")
def derivative_plan(code, slots, targets, sources):
    """The rows of a Program with a fixed arena layout (a replayed function) that a derivative of the targets
    w.r.t. the sources runs, with their adjoint rows filled in: (code [m, W], adjoint_rows [n_slots],
    adjoint_size). Rows kept are those on a path from a source to a target."""
    n_slots = slots.shape[0]
    need, active = reachability(code, n_slots, targets, sources, False)
    adjoint_rows = np.full(n_slots, -1, np.int64)
    adjoint_size = 0
    for s in range(n_slots):
        if need[s] and active[s]:
            adjoint_rows[s] = adjoint_size
            adjoint_size += slots[s, oc.SIZE]
    m = 0
    for r in range(code.shape[0]):
        if adjoint_rows[code[r, oc.OUT]] >= 0:
            m += 1
    kept = np.empty((m, oc.W), np.int64)
    k = 0
    for r in range(code.shape[0]):
        if adjoint_rows[code[r, oc.OUT]] >= 0:
            kept[k] = code[r]
            for c in range(4):
                s = code[r, oc.OUT + c]
                kept[k, oc.OUT_ADJ + c] = adjoint_rows[s] if s >= 0 else -1
            k += 1
    return kept, adjoint_rows, adjoint_size


@njit(cache=True, error_model="numpy")
def plan(records, slot_rows, targets, sources, values):
    """Lower recorded rows to a Program: prune, activity analysis, arena and adjoint offsets.

    records   [n, 6] (op, out, in0, in1, in2, attr) as recorded by a tape
    slot_rows [n_slots, 3 + MAXRANK] (size, rank, is_float64, dims...) as recorded
    targets, sources: slots (-1 entries, for tensors the tape did not record, are skipped)
    values: keep the rows the targets' values need (a replayed function), not only their derivatives' rows
    Returns (code [m, W], slots [n_slots, S], adjoint_rows [n_slots], scalar_slots,
    array_slots, arena_size, adjoint_size, is_float64). Rows kept are those on a path
    from a source to a target; a slot gets an adjoint row only when it is such a path's.
    """
    n = records.shape[0]
    n_slots = slot_rows.shape[0]
    need, active = reachability(records, n_slots, targets, sources, values)
    keep = np.zeros(n, np.bool_)
    used = np.zeros(n_slots, np.bool_)
    m = 0
    for r in range(n):
        out = records[r, 1]
        if need[out] and active[out]:
            keep[r] = True
            m += 1
            for c in range(1, 5):
                if records[r, c] >= 0:
                    used[records[r, c]] = True
    for t in targets:
        if t >= 0:
            used[t] = True
    for s in sources:
        if s >= 0:
            used[s] = True
    slots = np.zeros((n_slots, oc.S), np.int64)
    slots[:, oc.OFFSET] = -1
    adjoint_rows = np.full(n_slots, -1, np.int64)
    n_scalar = 0
    n_array = 0
    is_float64 = False
    for s in range(n_slots):
        slots[s, oc.SIZE] = slot_rows[s, 0]
        slots[s, oc.RANK] = slot_rows[s, 1]
        slots[s, oc.DIMS:] = slot_rows[s, 3:]
        if used[s]:
            is_float64 = is_float64 or slot_rows[s, 2] == 1
            if slot_rows[s, 1] == 0:
                n_scalar += 1
            else:
                n_array += 1
    scalar_slots = np.empty(n_scalar, np.int64)
    array_slots = np.empty(n_array, np.int64)
    # scalars first: they are packed with one np.fromiter, arrays with one np.concatenate
    offset = 0
    k = 0
    for s in range(n_slots):
        if used[s] and slot_rows[s, 1] == 0:
            slots[s, oc.OFFSET] = offset
            offset += 1
            scalar_slots[k] = s
            k += 1
    k = 0
    for s in range(n_slots):
        if used[s] and slot_rows[s, 1] != 0:
            slots[s, oc.OFFSET] = offset
            offset += slot_rows[s, 0]
            array_slots[k] = s
            k += 1
    adjoint_size = 0
    for s in range(n_slots):
        if used[s] and need[s] and active[s]:
            adjoint_rows[s] = adjoint_size
            adjoint_size += slot_rows[s, 0]
    code = np.full((m, oc.W), -1, np.int64)
    k = 0
    for r in range(n):
        if keep[r]:
            for c in range(6):
                code[k, c] = records[r, c]
            for c in range(4):
                s = records[r, 1 + c]
                if s >= 0:
                    code[k, oc.OUT_OFF + c] = slots[s, oc.OFFSET]
                    code[k, oc.OUT_ADJ + c] = adjoint_rows[s]
            k += 1
    return code, slots, adjoint_rows, scalar_slots, array_slots, offset, adjoint_size, is_float64
