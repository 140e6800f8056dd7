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


@njit(cache=True, error_model="numpy", inline="always")
def _mark(flags, slots):
    """flags[s] = True for each slot s >= 0 listed in `slots` (-1: a tensor the tape did not record)."""
    for s in slots:
        if s >= 0:
            flags[s] = True


@njit(cache=True, error_model="numpy", inline="always")
def _pinned(n_slots, targets, sources):
    """Per slot, whether it is a target or a source: seeded before a sweep or read after it, so its adjoint rows
    are never shared, nor forwarded."""
    pinned = np.zeros(n_slots, np.bool_)
    _mark(pinned, targets)
    _mark(pinned, sources)
    return pinned


@njit(cache=True, error_model="numpy")
def reachability(rows, n_slots, targets, sources, values):
    """(need, active) per slot: `need` when a target depends on it, `active` when its value depends on a
    source (`values` True) or its derivative does (False: rows that do not pass derivatives pass no activity
    on). rows: [n, >= 5] with out, in0..in2 in columns 1..4, as recorded and as in code."""
    n = rows.shape[0]
    need = np.zeros(n_slots, np.bool_)
    _mark(need, targets)
    for r in range(n - 1, -1, -1):
        if need[rows[r, 1]] and (values or passes_derivatives(rows[r, 0])):
            for c in range(2, 5):
                if rows[r, c] >= 0:
                    need[rows[r, c]] = True
    active = np.zeros(n_slots, np.bool_)
    _mark(active, sources)
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
    adjoint_size, flags [m]: reverse_flags' of the kept rows, and the (code, flags) of a sweep that only runs
    reverse over them: forwarded_cotangents', the targets and sources pinned). Rows kept are those on a path
    from a source to a target. One compiled call for both: a replay's first gradient loads no second planner."""
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
    flags = reverse_flags(kept, targets, n_slots)
    forwarded, forwarded_flags = forwarded_cotangents(kept, flags, adjoint_rows, slots[:, oc.SIZE],
                                                      _pinned(n_slots, targets, sources))
    return kept, adjoint_rows, adjoint_size, flags, forwarded, forwarded_flags


# reverse_flags' bits per row: 1, the row runs; 2 << c, input c is first written there; FORWARDED, every input it
# writes holds its cotangent in the output's adjoint rows (forwarded_cotangents): the row computes nothing
FORWARDED = 16
RUNS_AND_SETS = 1 | 2 | 4 | 8       # a row that runs and writes each input first (a sweep's `written` decides)

# What of the recorded values plan() lays out to be copied into the arena: every used slot's, or only those read
# by the derivative rules of the Program's kept rows: first-order sweeps' (opcodes.FIRST_ORDER_READS), or the
# sweeps' of every order (opcodes.DERIVATIVE_READS). READS_REVERSE: first-order reverse sweeps only (a
# non-persistent tape's gradient), whose forwarded cotangents (cotangent_homes) share their output's rows
READS_ALL, READS_FIRST_ORDER, READS_ANY_ORDER, READS_REVERSE = 0, 1, 2, 3


@njit(cache=True, error_model="numpy")
def plan(records, slot_rows, targets, sources, values, reads, share_from):
    """Lower recorded rows to a Program: prune, activity analysis, arena and adjoint offsets.

    records   [n, 6] (op, out, in0, in1, in2, attr) as recorded by a tape
    slot_rows [n_slots, 3 + MAXRANK] (size, rank, is_float64, dims...) as recorded
    targets, sources: slots (-1 entries, for tensors the tape did not record, are skipped)
    values: keep the rows the targets' values need (a replayed function), not only their derivatives' rows
    reads: READS_ALL, or which derivative rules will run (READS_FIRST_ORDER, READS_ANY_ORDER, READS_REVERSE): the
    values no kept row's rules read are laid out last in the arena (in slot order) and left out of
    scalar_slots/array_slots, so they are never copied; with READS_REVERSE, forwarded cotangents (cotangent_homes)
    are read in their home's adjoint rows
    share_from: slots of at least this many entries share adjoint rows where never live at once (see
    adjoint_layout; 0: none do)
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
    pinned = _pinned(n_slots, targets, sources)
    for s in range(n_slots):
        if pinned[s]:
            used[s] = True
    if reads != READS_ALL:
        table = oc.DERIVATIVE_READS if reads == READS_ANY_ORDER else oc.FIRST_ORDER_READS
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
            k += 1
    for s in range(n_slots):
        if used[s] and need[s] and active[s]:
            adjoint_rows[s] = 0     # active: its row is laid out below
    home = np.arange(n_slots)
    if reads == READS_REVERSE:
        home, _ = cotangent_homes(code, np.full(m, RUNS_AND_SETS, np.int64), adjoint_rows >= 0, slot_rows[:, 0],
                                  pinned)
    adjoint_size = adjoint_layout(code, slot_rows[:, 0], adjoint_rows, pinned, share_from, home)
    for k in range(m):
        for c in range(4):
            s = code[k, oc.OUT + c]
            if s >= 0:
                code[k, oc.OUT_ADJ + c] = adjoint_rows[s]
    return code, slots, adjoint_rows, scalar_slots, array_slots, offset, adjoint_size, is_float64


@njit(cache=True, error_model="numpy")
def adjoint_layout(code, sizes, adjoint_rows, pinned, share_from, home):
    """Lay out the adjoint rows of the active slots (adjoint_rows[s] >= 0 on entry; set to each slot's first row)
    and return the adjoint's size. Slots of at least `share_from` entries (0: none) share rows where they are
    never live at once, for Programs whose sweeps are first-order (reverse and tangent sweeps, never a
    second-order sweep, which reads every cotangent of an earlier sweep): a slot's rows are live from the first
    row of `code` that writes it (its value's tangent, forward) to the last that reads it (where a reverse sweep
    first writes its cotangent), both included, and the `pinned` slots' (targets, sources: seeded before a sweep
    or read after it) always. A dead slot's rows hold what another slot left, as a new workspace buffer holds
    what an earlier sweep left: every sweep writes a slot's rows before it reads them. A large sweep thus reuses
    rows still in cache (W8's adjoint 1.87 -> 0.83 M entries). home: per slot, the slot whose rows hold its
    cotangent (cotangent_homes'; itself where none forwards it): a home's rows serve every slot it holds, live
    from the first of them written to the last read."""
    n_slots = adjoint_rows.shape[0]
    m = code.shape[0]
    first = np.full(n_slots, m, np.int64)
    last = np.full(n_slots, -1, np.int64)
    for k in range(m if share_from > 0 else 0):     # lifetimes, where rows may be shared
        out = home[code[k, oc.OUT]]
        first[out] = min(first[out], k)
        for c in range(3):
            s = code[k, oc.IN0 + c]
            if s >= 0:
                last[home[s]] = max(last[home[s]], k)
    shared = np.zeros(n_slots, np.bool_)
    size = 0
    n_shared = 0
    for s in range(n_slots):
        if adjoint_rows[s] < 0 or home[s] != s:     # a forwarded slot: its home's rows (below)
            continue
        if 0 < share_from <= sizes[s] and not pinned[s] and first[s] < m and first[s] <= last[s]:
            shared[s] = True
            n_shared += 1
        else:
            adjoint_rows[s] = size
            size += sizes[s]
    if n_shared == 0:
        return _homes_rows(adjoint_rows, home, size)
    # free blocks of the shared region, (start, size) unordered, adjacent ones merged; row by row, a shared slot
    # takes a block where its first writer runs and gives it back after its last reader (not sooner: the reverse
    # rule of that row reads one and writes the other)
    free_start = np.empty(n_shared + 1, np.int64)
    free_size = np.empty(n_shared + 1, np.int64)
    n_free = 0
    top = size          # the shared region's end
    for k in range(m):
        s = home[code[k, oc.OUT]]
        if shared[s] and first[s] == k:
            need = sizes[s]
            best = -1
            for i in range(n_free):
                if free_size[i] >= need and (best < 0 or free_size[i] < free_size[best]):
                    best = i
            if best < 0:
                for i in range(n_free):         # a free block at the top grows to fit
                    if free_start[i] + free_size[i] == top:
                        best = i
                        top += need - free_size[i]
                        free_size[i] = need
                        break
            if best < 0:
                adjoint_rows[s] = top
                top += need
            else:
                adjoint_rows[s] = free_start[best]
                free_start[best] += need
                free_size[best] -= need
                if free_size[best] == 0:
                    n_free -= 1
                    free_start[best], free_size[best] = free_start[n_free], free_size[n_free]
        for c in range(3):
            s = code[k, oc.IN0 + c]
            if s >= 0 and shared[home[s]] and last[home[s]] == k:
                s = home[s]
                shared[s] = False       # given back once (x * x reads x twice)
                n_free = _free(free_start, free_size, n_free, adjoint_rows[s], sizes[s])
    return _homes_rows(adjoint_rows, home, top)


@njit(cache=True, error_model="numpy", inline="always")
def _homes_rows(adjoint_rows, home, size):
    """Give each forwarded active slot its home's adjoint rows; return `size`."""
    for s in range(adjoint_rows.shape[0]):
        if adjoint_rows[s] >= 0 and home[s] != s:
            adjoint_rows[s] = adjoint_rows[home[s]]
    return size


@njit(cache=True, error_model="numpy")
def _free(free_start, free_size, n_free, start, size):
    """Add the block (start, size) to the n_free blocks, merged with the blocks adjacent to it; the new count."""
    i = 0
    while i < n_free:
        if free_start[i] + free_size[i] == start or start + size == free_start[i]:
            start, size = min(start, free_start[i]), size + free_size[i]
            n_free -= 1
            free_start[i], free_size[i] = free_start[n_free], free_size[n_free]
            i = 0       # the merged block may now touch one seen before
            continue
        i += 1
    free_start[n_free] = start
    free_size[n_free] = size
    return n_free + 1


@njit(cache=True, error_model="numpy")
def cotangent_homes(code, flags, active, sizes, pinned):
    """(home, flags) for a sweep that only runs reverse over `code` (rows of a Program; flags: reverse_flags'
    bits per row; active, sizes, pinned: per slot): where a row copies its output's cotangent into an input
    (opcodes.COTANGENT_IS_OUTPUTS: add, sub's first input, copy) that it writes first, that is read by no other
    row and has the output's size, and that is not `pinned` (a target or a source), the input's cotangent is
    kept in the output's adjoint rows instead of copied there: nothing writes them after that row, which is the
    last of the sweep to read the output's. home: per slot, the slot whose rows hold its cotangent (itself, or
    its chain of such rows' last output). Where every input the row writes is such, its flags gain FORWARDED
    (the row only marks them written). A scalar chain's sweep then carries no copy on its path (W1's
    y = m + h: 20 -> 16 us). Not for tangent or second-order sweeps: their inputs' tangents are distinct
    values."""
    m = code.shape[0]
    n_slots = sizes.shape[0]
    readers = np.zeros(n_slots, np.int64)
    for r in range(m):
        for c in range(3):
            s = code[r, oc.IN0 + c]
            if s >= 0:
                readers[s] += 1
    home = np.arange(n_slots)
    forwarded_flags = flags.copy()
    for r in range(m - 1, -1, -1):      # sweep order: an output's home is known before its inputs'
        if flags[r] & 1 == 0:
            continue
        out = code[r, oc.OUT]
        bits = oc.COTANGENT_IS_OUTPUTS[code[r, oc.OP]]
        every = True
        writes = False
        for c in range(3):
            s = code[r, oc.IN0 + c]
            if s < 0 or not active[s]:
                continue
            writes = True
            if bits & (1 << c) and flags[r] & (2 << c) and readers[s] == 1 and not pinned[s] \
                    and sizes[s] == sizes[out]:
                home[s] = home[out]
            else:
                every = False
        if writes and every:
            forwarded_flags[r] |= FORWARDED
    return home, forwarded_flags


@njit(cache=True, error_model="numpy")
def forwarded_cotangents(code, flags, adjoint_rows, sizes, pinned):
    """derivative_plan's rows (`code`, its `adjoint_rows`) and flags for a sweep that only runs reverse over
    them: cotangent_homes', each slot's adjoint columns naming its home's rows (a forwarded slot's own rows are
    left unused)."""
    home, forwarded_flags = cotangent_homes(code, flags, adjoint_rows >= 0, sizes, pinned)
    forwarded = code.copy()
    for r in range(code.shape[0]):
        for c in range(4):
            s = code[r, oc.OUT + c]
            if s >= 0 and code[r, oc.OUT_ADJ + c] >= 0:
                forwarded[r, oc.OUT_ADJ + c] = adjoint_rows[home[s]]
    return forwarded, forwarded_flags


@njit(cache=True, error_model="numpy")
def reverse_flags(code, targets, n_slots):
    """Per row of a reverse sweep over `code` seeded at the slots `targets` alone (a replay's gradient step: its
    target), what the sweep's `written` will find there, row by row: bit 0, the row runs (its output's cotangent
    was written); bit 1 + c, its input c (IN0..IN2) is first written there (set, not added to). Fixed by the
    plan, so a replay's scalar runs and fused reverse groups run from these bits (interpreter.scalar_run_reverse,
    fused_reverse) without reading `written`. Planned with the rows (derivative_plan): a kernel of its own was
    one more load of a process's first replayed gradient."""
    written = np.zeros(n_slots, np.bool_)
    _mark(written, targets)
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
