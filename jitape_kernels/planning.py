"""Planning: which rows of a recording a derivative runs, where each slot lives in the arena, which slots get
adjoint rows. Host code shared by every backend (the kernels of a backend only run what is planned here).
"""
import numpy as np

from . import njit, opcodes as oc


@njit(cache=True, error_model="numpy", inline="always")
def passes_derivatives(op):
    """Whether an instruction's output can depend on the sources' derivatives: not for STOP_GRADIENT and the
    comparisons (recorded so that replays recompute their values; constants to every derivative)."""
    return op != oc.STOP_GRADIENT and not oc.COMPARE_FIRST <= op <= oc.BINARY_LAST


@njit(cache=True, error_model="numpy")
def reachability(rows, n_slots, targets, sources, values):
    """(need, active) per slot: `need` when a target depends on it, `active` when its value depends on a
    source (`values` True) or its derivative does (False: rows that do not pass derivatives pass no activity
    on). rows: [n, >= 5] with out, in0..in2 in columns 1..4, as recorded and as in code."""
    n = rows.shape[0]
    need = np.zeros(n_slots, np.bool_)
    for t in targets:
        if t >= 0:
            need[t] = True
    for r in range(n - 1, -1, -1):
        if need[rows[r, 1]] and (values or passes_derivatives(rows[r, 0])):
            for c in range(2, 5):
                if rows[r, c] >= 0:
                    need[rows[r, c]] = True
    active = np.zeros(n_slots, np.bool_)
    for s in sources:
        if s >= 0:
            active[s] = True
    for r in range(n):
        if not values and not passes_derivatives(rows[r, 0]):
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
            for c in range(oc.W):
                kept[k, c] = code[r, c]
            for c in range(4):
                s = code[r, oc.OUT + c]
                kept[k, oc.OUT_ADJ + c] = adjoint_rows[s] if s >= 0 else -1
            k += 1
    return kept, adjoint_rows, adjoint_size


# What of the recorded values plan() lays out to be copied into the arena: every used slot's, or only those read
# by the derivative rules of the Program's kept rows: first-order sweeps' (opcodes.FIRST_ORDER_READS), or the
# sweeps' of every order (opcodes.DERIVATIVE_READS)
READS_ALL, READS_FIRST_ORDER, READS_ANY_ORDER = 0, 1, 2


@njit(cache=True, error_model="numpy")
def plan(records, slot_rows, targets, sources, values, reads):
    """Lower recorded rows to a Program: prune, activity analysis, arena and adjoint offsets.

    records   [n, 6] (op, out, in0, in1, in2, attr) as recorded by a tape
    slot_rows [n_slots, 3 + MAXRANK] (size, rank, is_float64, dims...) as recorded
    targets, sources: slots (-1 entries, for tensors the tape did not record, are skipped)
    values: keep the rows the targets' values need (a replayed function), not only their derivatives' rows
    reads: READS_ALL, or which derivative rules will run (READS_FIRST_ORDER, READS_ANY_ORDER): the values no
    kept row's rules read are laid out last in the arena (in slot order) and left out of
    scalar_slots/array_slots, so they are never copied
    Returns (code [m, W], slots [n_slots, S], adjoint_rows [n_slots], scalar_slots,
    array_slots, arena_size, adjoint_size, is_float64). Rows kept are those on a path
    from a source to a target; a slot gets an adjoint row only when it is such a path's.
    scalar_slots then array_slots are the slots whose values fill the arena's start, in offset order.
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
    if reads != READS_ALL:
        table = oc.FIRST_ORDER_READS if reads == READS_FIRST_ORDER else oc.DERIVATIVE_READS
        read = np.zeros(n_slots, np.bool_)
        for r in range(n):
            if keep[r]:
                bits = table[records[r, 0]]
                for c in range(3):
                    if bits & (1 << c) and records[r, 2 + c] >= 0:
                        read[records[r, 2 + c]] = True
                if bits & oc.READ_OUT:
                    read[records[r, 1]] = True
    else:
        read = used
    slots = np.zeros((n_slots, oc.S), np.int64)
    slots[:, oc.OFFSET] = -1
    adjoint_rows = np.full(n_slots, -1, np.int64)
    n_scalar = 0
    n_array = 0
    is_float64 = False
    for s in range(n_slots):
        slots[s, oc.SIZE] = slot_rows[s, 0]
        slots[s, oc.RANK] = slot_rows[s, 1]
        for d in range(oc.MAXRANK):     # entry by entry: an array assigned to a slice compiles numba's
            slots[s, oc.DIMS + d] = slot_rows[s, 3 + d]     # shape-mismatch message (~4 s cold)
        if used[s]:
            is_float64 = is_float64 or slot_rows[s, 2] == 1
        if read[s]:
            if slot_rows[s, 1] == 0:
                n_scalar += 1
            else:
                n_array += 1
    scalar_slots = np.empty(n_scalar, np.int64)
    array_slots = np.empty(n_array, np.int64)
    # the values read, scalars first: they are packed with one np.fromiter, arrays with one np.concatenate;
    # then the slots whose values no sweep reads (their rows of the arena are never written)
    offset = 0
    k = 0
    for s in range(n_slots):
        if read[s] and slot_rows[s, 1] == 0:
            slots[s, oc.OFFSET] = offset
            offset += 1
            scalar_slots[k] = s
            k += 1
    k = 0
    for s in range(n_slots):
        if read[s] and slot_rows[s, 1] != 0:
            slots[s, oc.OFFSET] = offset
            offset += slot_rows[s, 0]
            array_slots[k] = s
            k += 1
    for s in range(n_slots):
        if used[s] and not read[s]:
            slots[s, oc.OFFSET] = offset
            offset += slot_rows[s, 0]
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


@njit(cache=True, error_model="numpy")
def reverse_flags(code, target, n_slots):
    """Per row of a reverse sweep over `code` seeded at the slot `target` alone (a replay's gradient step), what
    the sweep's `written` will find there, row by row: bit 0, the row runs (its output's cotangent was written);
    bit 1 + c, its input c (IN0..IN2) is first written there (set, not added to). Fixed by the plan, so a replay's
    scalar runs and fused reverse groups run from these bits (interpreter.scalar_run_reverse, fused_reverse)
    without reading `written`."""
    written = np.zeros(n_slots, np.bool_)
    written[target] = True
    flags = np.zeros(code.shape[0], np.int64)
    for r in range(code.shape[0] - 1, -1, -1):
        if not written[code[r, oc.OUT]]:
            continue
        bits = 1
        for c in range(3):
            s = code[r, oc.IN0 + c]
            if s >= 0 and code[r, oc.IN0_ADJ + c] >= 0:
                if not written[s]:
                    bits |= 2 << c
                written[s] = True
        flags[r] = bits
    return flags
