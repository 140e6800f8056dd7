"""The run layout of a plain replay: how a traced function's Program runs when nothing differentiates it.

A replay that only computes outputs, guards and variable writes need not keep
every value: a copy (COPY, STOP_GRADIENT) reads its input's arena rows instead
of writing its own, and runs of elementwise rows and broadcasts over the same
large size run as one fused group, block by block (interpreter.fused_forward),
so a block's values stay in cache from the row that writes them to the rows
that read them and the values nothing after the group reads live only in
block-sized scratch buffers. A variable's new value may take the rows of the
value it replaces (_in_place). The canonical layout (every slot's own rows)
stays what derivatives, tapes and saving see; this one is derived from it per
traced variant.

Before any of it, a traced Program's small rows that part two runs of large
rows of one size are moved before the first run where nothing changes but the
order (hoisted): the two runs then form one group, in the forward and in the
reverse.

Every replay, plain or taking gradients, also runs three plans of this module:
the fused reverse groups of its gradient steps (reverse_groups, the reverse
sweep's counterpart of the fused groups), the compact rows of its scalar
runs (scalar_runs), and the stashes where a differentiated logsumexp's forward
leaves its exponentials for its reverse (logsumexp_stashes).

Host code shared by every backend, planned once per variant.
"""
import numpy as np

from . import opcodes as oc
from .planning import FORWARDED

BLOCK = 1024            # entries per block of a fused group: a row's operands stay in L1 (8,192: 1.5x slower)
FUSE_MIN_SIZE = 16384       # smaller groups gain nothing from blocks

# A replay's steps (interpreter.replay_sweep's `steps`): a row whose target adjoint row (column 3) is HOST_STEP is a
# host step, run by the replay's caller (a Hessian inside a jt.function: jitape.replay), where the replay returns
# the step's index; otherwise it returns REPLAY_HELD when every guard held, GUARD_BROKEN when one did not
HOST_STEP = -2
REPLAY_HELD, GUARD_BROKEN = -1, -2

# The compact rows of scalar runs (scalar_runs): the code columns a scalar elementwise row reads, then at a run's
# first row (in sweep order) its stop row (forward) or its number of rows (reverse), and in a gradient step every
# row's planned flags (planning.reverse_flags, given by derivative_plan), which fused reverse groups run from too
(SC_OP, SC_OUT_OFF, SC_IN0_OFF, SC_IN1_OFF, SC_ATTR, SC_OUT_ADJ, SC_IN0_ADJ, SC_IN1_ADJ, SC_IN0, SC_IN1, SC_RUN,
 SC_FLAGS) = range(12)
_SCALAR_COLUMNS = [oc.OP, oc.OUT_OFF, oc.IN0_OFF, oc.IN1_OFF, oc.ATTR, oc.OUT_ADJ, oc.IN0_ADJ, oc.IN1_ADJ, oc.IN0,
                   oc.IN1]


def hoisted(rows, sizes):
    """The order of a traced Program's recorded rows (op, out, in0, in1, in2, attr; sizes: per slot) in which each
    run of rows under FUSE_MIN_SIZE entries between two runs of larger rows of one size comes before the first of
    those, where that run writes nothing the small rows read and reads nothing they read (each cotangent then sums
    its terms in the same order): the two large runs form one fused group. W8's `alphas + sum_qs` (25 entries)
    parted its centred points' product from their squared norms, forward and reverse. Rows of negative opcodes
    (a trace's gradient steps) and PLACE rows (several write one output) stay where they are, and so do the rows
    of their runs."""
    op = rows[:, 0]
    size = sizes[rows[:, 1]]
    large = (size >= FUSE_MIN_SIZE) & (op >= 0)
    order = np.arange(rows.shape[0])
    if large.all() or not large.any():
        return order
    order = order.tolist()
    n, i = len(order), 0
    while i < n:
        if not large[order[i]]:
            i += 1
            continue
        first, run_size = i, size[order[i]]
        while i < n and large[order[i]] and size[order[i]] == run_size:
            i += 1
        stop = i
        while stop < n and not large[order[stop]]:
            stop += 1
        if stop == i or stop == n or size[order[stop]] != run_size:
            continue
        group, small = order[first:i], order[i:stop]
        touched = set(rows[group, 1:5].ravel().tolist()) - {-1}
        if all(op[r] >= 0 and op[r] != oc.PLACE and touched.isdisjoint(rows[r, 1:5].tolist()) for r in small):
            order[first:stop] = small + group
            i = first + len(small)      # the merged run, which may part from the next one the same way
    return np.array(order, np.int64)


def _fusable(code, slots, iattr):
    """Per row, whether it can join a fused group: an elementwise op (unary, binary, compare, where) whose
    inputs have its size, or a TILE that broadcasts (every input axis 1 or the output's; of one entry, a fill),
    which interpreter.fused_forward runs block by block."""
    size = slots[code[:, oc.OUT], oc.SIZE]
    if not (size >= FUSE_MIN_SIZE).any():
        return np.zeros(code.shape[0], np.bool_)
    op = code[:, oc.OP]
    elementwise = op <= oc.WHERE
    same = np.ones(code.shape[0], np.bool_)
    for c in (oc.IN0, oc.IN1, oc.IN2):
        present = code[:, c] >= 0
        same &= ~present | (slots[np.maximum(code[:, c], 0), oc.SIZE] == size)
    broadcast = np.zeros(code.shape[0], np.bool_)
    for r in np.flatnonzero(op == oc.TILE).tolist():   # attributes: rank, in_dims[rank], out_dims[rank]
        a = code[r, oc.ATTR]
        rank = iattr[a]
        in_dims, out_dims = iattr[a + 1:a + 1 + rank], iattr[a + 1 + rank:a + 1 + 2 * rank]
        broadcast[r] = bool(np.all((in_dims == 1) | (in_dims == out_dims)))
    return (elementwise & same | broadcast) & (size >= FUSE_MIN_SIZE)


def _in_place(run, root, offsets, slots, positions, step_code, live, pairs):
    """Give each written variable's new value (pairs: (the slot it is read in at entry, the slot it is written
    from)) the rows of the value it replaces, where nothing reads that value after the row writing the new one
    (that row itself only as an elementwise op: entry by entry, each read before its write): a replay then
    updates the variable in place in its arena, where the next call finds it (replay.Concrete.run)."""
    live_roots = set(root[live].tolist())
    step_reads = np.asarray(oc.FIRST_ORDER_READS, np.int64)[step_code[:, oc.OP]]
    read_by_steps = set()
    for c, bit in ((oc.OUT, oc.READ_OUT), (oc.IN0, oc.READ_IN0), (oc.IN1, oc.READ_IN1), (oc.IN2, oc.READ_IN2)):
        read_by_steps.update(root[step_code[(step_code[:, c] >= 0) & (step_reads & bit != 0), c]].tolist())
    last_step = int(np.max(positions)) if len(positions) else -1     # a step runs before the row at its position
    producer = {slot: r for r, slot in enumerate(run[:, oc.OUT].tolist())}
    taken = set()
    for read, written in pairs:
        old, new = int(root[read]), int(root[written])
        r = producer.get(new)
        if r is None or old == new or old in taken or new in taken or old in live_roots \
                or slots[old, oc.SIZE] != slots[new, oc.SIZE] or old in read_by_steps and last_step > r:
            continue
        reads = np.flatnonzero((run[:, oc.IN0:oc.IN2 + 1] == old).any(axis=1))
        if reads.size and (reads[-1] > r or reads[-1] == r and run[r, oc.OP] > oc.WHERE):
            continue
        offsets[root == new] = offsets[old]
        taken.update((old, new))


def run_layout(code, slots, iattr, positions, step_code, live, in_place=()):
    """(run code, slot offsets, positions, fused, places, scratch buffers) for replaying `code` (over `slots`
    and `iattr`; rows with gradient steps before the rows `positions` name, whose derivative rows are
    `step_code`) when only the slots marked in `live` (outputs, guards, writes) and the values the steps'
    derivative rules read (opcodes.FIRST_ORDER_READS) must hold their values afterwards: copies elided, and
    fused_groups' groups. in_place: (slot read, slot written) of variables a replay may update in their own rows
    (see _in_place).

    run code   code without the copies, reading the slot a copy copied where it read the copy; its offset
               columns (and step_code's, rewritten in place) hold `offsets`
    positions  the steps' positions in the run code
    """
    op = code[:, oc.OP]
    copies = ((op == oc.COPY) | (op == oc.STOP_GRADIENT)) & (
        slots[code[:, oc.OUT], oc.SIZE] == slots[np.maximum(code[:, oc.IN0], 0), oc.SIZE])
    # a copy's output is its input's value: the run code reads the slot that holds it (its root)
    root = np.arange(slots.shape[0])
    for r in np.flatnonzero(copies).tolist():       # in program order: a copy of a copy reads the first's input
        root[code[r, oc.OUT]] = root[code[r, oc.IN0]]
    offsets = slots[root, oc.OFFSET]
    keep = ~copies
    run = code[keep]
    for c in (oc.IN0, oc.IN1, oc.IN2):
        run[:, c] = np.where(run[:, c] >= 0, root[np.maximum(run[:, c], 0)], -1)
    before = np.concatenate([[0], np.cumsum(keep)])
    positions = before[np.asarray(positions, np.int64)]
    if in_place:
        _in_place(run, root, offsets, slots, positions, step_code, live, in_place)
    oc.fill_offset_columns(run, offsets)
    oc.fill_offset_columns(step_code, offsets)
    return (run, offsets, positions, *fused_groups(run, slots, iattr, positions, step_code, live, root))


def fused_groups(run, slots, iattr, positions, step_code, live, root=None):
    """(fused, places, scratch buffers): the fused groups of a replay of the run code `run` (run_layout's, or a
    variant's code), with gradient steps before the rows `positions` name, whose derivative rows are
    `step_code`, when only the slots marked in `live` and the values the steps' derivative rules read must hold
    their values afterwards. root: per slot, the slot whose rows hold its value (run_layout's); None: every slot
    its own (the canonical layout: a layout for one purpose of a variant whose other uses read that one).

    fused      per run-code row r: the stop row of the fused group starting at r, else 0
    places     per run-code row [4]: the scratch buffer of its output and inputs in its group (-1: arena rows)
    """
    n = run.shape[0]
    fused = np.zeros(n, np.int64)
    places = np.full((n, 4), -1, np.int64)
    fusable = _fusable(run, slots, iattr)
    if not fusable.any():       # no group (every row under FUSE_MIN_SIZE: a scalar chain's 4,000 rows)
        return fused, places, 0
    root = np.arange(slots.shape[0]) if root is None else root
    size = slots[run[:, oc.OUT], oc.SIZE]
    # a group ends where fusable rows of one size end, and at every gradient step (it reads the values before)
    starts = fusable & ~(np.concatenate([[False], fusable[:-1] & (size[1:] == size[:-1])]) if n else fusable)
    starts[positions[positions < n]] |= fusable[positions[positions < n]]
    # the last run-code row that reads each slot's value; live slots and those the steps read: after every row
    last_read = np.full(slots.shape[0], -1, np.int64)
    for c in (oc.IN0, oc.IN1, oc.IN2):
        reads = run[:, c] >= 0
        np.maximum.at(last_read, run[reads, c], np.flatnonzero(reads))
    step_reads = np.asarray(oc.FIRST_ORDER_READS, np.int64)[step_code[:, oc.OP]]
    for c, bit in ((oc.OUT, oc.READ_OUT), (oc.IN0, oc.READ_IN0), (oc.IN1, oc.READ_IN1), (oc.IN2, oc.READ_IN2)):
        read = (step_code[:, c] >= 0) & (step_reads & bit != 0)
        last_read[root[step_code[read, c]]] = n
    last_read[root[live]] = n
    n_scratch = 0
    for start in np.flatnonzero(starts).tolist():
        stop = start + 1
        while stop < n and fusable[stop] and size[stop] == size[start] and not starts[stop]:
            stop += 1
        if stop - start < 2:
            continue
        fused[start] = stop
        place, free, used = {}, [], 0
        for r in range(start, stop):
            for c in (oc.IN0, oc.IN1, oc.IN2):
                places[r, c - oc.OUT] = place.get(run[r, c], -1)
            out = run[r, oc.OUT]
            if last_read[out] < stop:       # read only inside the group: a scratch buffer
                if not free:
                    free.append(used)
                    used += 1
                place[out] = places[r, 0] = free.pop()
            for c in (oc.OUT, oc.IN0, oc.IN1, oc.IN2):     # after the row: its inputs' buffers never hold its output
                s = run[r, c]
                if s in place and last_read[s] <= r:
                    free.append(place.pop(s))
        n_scratch = max(n_scratch, used)
    return fused, places, n_scratch


def _reverse_fusable(code, slots, iattr):
    """Per derivative row, the size its fused reverse group runs over, or 0 where it cannot join one: an
    elementwise row (unary, binary, where) whose inputs have its size, a SUM (its cotangent a broadcast of the
    reduced one's), a MAX or MIN along the last axis (its tied extrema's shares, worked out before the group's
    blocks), or a broadcast whose reverse sums entry by entry (_sums_in_order), of at least FUSE_MIN_SIZE
    entries."""
    if not (slots[:, oc.SIZE] >= FUSE_MIN_SIZE).any():     # no slot that large: no row joins a group
        return np.zeros(code.shape[0], np.int64)
    op = code[:, oc.OP]
    size = slots[code[:, oc.OUT], oc.SIZE]
    elementwise = (op < oc.COMPARE_FIRST) | (op == oc.WHERE)      # compares carry no cotangent
    for c in (oc.IN0, oc.IN1, oc.IN2):
        present = code[:, c] >= 0
        elementwise &= ~present | (slots[np.maximum(code[:, c], 0), oc.SIZE] == size)
    along_last = np.zeros(op.size, np.bool_)
    for r in np.flatnonzero((op == oc.MAX) | (op == oc.MIN)).tolist():
        along_last[r] = iattr[code[r, oc.ATTR] + 2] == 1
    reduced = ((op == oc.SUM) | along_last) & (slots[np.maximum(code[:, oc.IN0], 0), oc.SIZE] > size)
    size = np.where(reduced, slots[np.maximum(code[:, oc.IN0], 0), oc.SIZE], size)
    summed = np.zeros(op.size, np.bool_)
    for r in np.flatnonzero((op == oc.TILE) & (size >= FUSE_MIN_SIZE)).tolist():
        summed[r] = _sums_in_order(iattr, int(code[r, oc.ATTR]))
    return np.where((elementwise | reduced | summed) & (size >= FUSE_MIN_SIZE), size, 0)


def _sums_in_order(iattr, a):
    """Whether TILE a's reverse adds its cotangent's entries to its input's in order (shape.mapped_linear's
    _broadcast_walk over a broadcast whose innermost axis copies the input), so a fused reverse group adds them
    block by block with the same bits. Not a fill's (a row sum in lanes), a short bias's (_short_rows_sum: each
    entry's repeats summed apart, below shape._SHORT entries), one repeating along its innermost axis (row sums),
    nor a tile of whole blocks."""
    rank = int(iattr[a])
    in_dims, out_dims = iattr[a + 1:a + 1 + rank], iattr[a + 1 + rank:a + 1 + 2 * rank]
    if not np.all((in_dims == 1) | (in_dims == out_dims)) or in_dims.prod() == 1:
        return False
    leading = np.flatnonzero(in_dims != 1)[0]
    if np.all(in_dims[leading:] == out_dims[leading:]) and in_dims.prod() < 8:
        return False
    innermost = np.flatnonzero(out_dims != 1)[-1]
    return bool(in_dims[innermost] == out_dims[innermost])


def reverse_groups(step_code, steps, slots, iattr, moves):
    """(groups, places, scratch buffers) for the reverse sweeps of gradient steps with one column
    (interpreter.fused_reverse): runs of consecutive derivative rows of one step that _reverse_fusable gives one
    size run as one group, block by block, so a block's cotangents stay in cache from the row that writes them
    to the row that reads them, and a cotangent only the group writes and reads lives in a block-sized scratch
    buffer, never in the adjoint buffer.

    steps, moves   replay_sweep's (the seeded target of step s: steps[s, 7]; its sources: moves' column 3)
    groups         per step_code row r: the rows of the group whose first row (in sweep order) is r, else 0
    places         per row [4]: the scratch buffer of the cotangent of its output and inputs (-1: adjoint rows)
    """
    n = step_code.shape[0]
    groups = np.zeros(n, np.int64)
    places = np.full((n, 4), -1, np.int64)
    group_size = _reverse_fusable(step_code, slots, iattr)
    n_scratch = 0
    for s in range(steps.shape[0]):
        lo, hi = int(steps[s, 1]), int(steps[s, 2])
        if not group_size[lo:hi].any():     # no group (a scalar chain's step): no writers to list row by row
            continue
        rows = step_code[lo:hi]
        # the rows (of this step) that write each slot's cotangent: a reader of the slot whose input is active
        writers = {}
        for c in (oc.IN0, oc.IN1, oc.IN2):
            for r in np.flatnonzero((rows[:, c] >= 0) & (rows[:, c + oc.IN0_ADJ - oc.IN0] >= 0)).tolist():
                writers.setdefault(int(rows[r, c]), []).append(lo + r)
        kept = {int(steps[s, 7])} | set(moves[steps[s, 5]:steps[s, 6], 3].tolist())
        # a broadcast's input whose cotangent other rows write too: block by block, their sums would interleave;
        # an extremum whose cotangent the step keeps: its shares are written over it
        for r in np.flatnonzero(group_size[lo:hi] > 0).tolist():
            if rows[r, oc.OP] == oc.TILE and len(writers.get(int(rows[r, oc.IN0]), ())) > 1:
                group_size[lo + r] = 0
            if rows[r, oc.OP] in (oc.MAX, oc.MIN) and int(rows[r, oc.OUT]) in kept:
                group_size[lo + r] = 0
        top = hi - 1
        while top >= lo:
            bottom = top
            summed = set()      # the inputs of the group's broadcasts: complete only after its last block
            while bottom > lo and group_size[top] and group_size[bottom - 1] == group_size[top]:
                if step_code[bottom, oc.OP] == oc.TILE:
                    summed.add(int(step_code[bottom, oc.IN0]))
                if int(step_code[bottom - 1, oc.OUT]) in summed:      # reads such a cotangent: a group of its own
                    break
                bottom -= 1
            if top > bottom:
                groups[top] = top - bottom + 1
                n_scratch = max(n_scratch, _reverse_places(step_code, bottom, top, writers, kept, places))
            top = bottom - 1
    return groups, places, n_scratch


def _reverse_places(code, bottom, top, writers, kept, places):
    """Scratch buffers for the cotangents group rows top..bottom write and read, none of them written outside the
    group or read after it (kept: the seeded target and the sources); the number of buffers used."""
    produced = {int(code[r, oc.OUT]): r for r in range(bottom, top + 1)}
    inner = {s for s, r in produced.items()
             if s not in kept and s in writers and all(bottom <= w <= top for w in writers[s])}
    place, free, used = {}, [], 0
    for r in range(top, bottom - 1, -1):
        for c in (oc.IN0, oc.IN1, oc.IN2):
            s = int(code[r, c])
            if s in inner and code[r, c + oc.IN0_ADJ - oc.IN0] >= 0:
                if s not in place:      # its first write: a buffer the row's output cotangent never holds
                    if not free:
                        free.append(used)
                        used += 1
                    place[s] = free.pop()
                places[r, c - oc.OUT] = place[s]
        out = int(code[r, oc.OUT])
        if out in place:            # read by its producer, last: the buffer is free after this row
            places[r, 0] = place[out]
            free.append(place.pop(out))
    return used


def logsumexp_stashes(run_code, step_code, slots):
    """(run code, step code, entries): copies of a replay's codes whose LOGSUMEXP rows that a gradient step with
    one column differentiates (the step's row has an active input) have a stash (opcodes.STASH): `entries` more
    at the end of the replay's scratch, where the forward row leaves its exponentials and their sums' reciprocals
    and the step's row reads them (reduction.logsumexp_forward, logsumexp_from_stash), so that reverse takes
    no second pass of exponentials. The fused groups' scratch buffers come before them."""
    reverse = (step_code[:, oc.OP] == oc.LOGSUMEXP) & (step_code[:, oc.IN0_ADJ] >= 0)
    marked = (run_code[:, oc.OP] == oc.LOGSUMEXP) & (run_code[:, oc.STASH] >= 0)
    if not reverse.any() and not marked.any():
        return run_code, step_code, 0
    run_code, step_code = run_code.copy(), step_code.copy()
    for code in (run_code, step_code):
        code[code[:, oc.OP] == oc.LOGSUMEXP, oc.STASH] = -1
    entries = 0
    for r in np.flatnonzero((run_code[:, oc.OP] == oc.LOGSUMEXP) & np.isin(run_code[:, oc.OUT],
                                                                           step_code[reverse, oc.OUT])).tolist():
        entries += int(slots[run_code[r, oc.IN0], oc.SIZE] + slots[run_code[r, oc.OUT], oc.SIZE])
        run_code[r, oc.STASH] = entries
        step_code[reverse & (step_code[:, oc.OUT] == run_code[r, oc.OUT]), oc.STASH] = entries
    return run_code, step_code, entries


def _runs(scalar, cuts):
    """(starts, stops) of the runs of True in `scalar`, each also ended before every row in `cuts`."""
    n = scalar.size
    cut = np.zeros(n + 1, np.bool_)
    cut[np.asarray(cuts, np.int64)] = True
    starts = np.flatnonzero(scalar & (cut[:n] | ~np.concatenate([[False], scalar[:-1]])))
    breaks = np.union1d(np.flatnonzero(~scalar | cut[:n]), [n])
    return starts, breaks[np.searchsorted(breaks, starts, side="right")]


def scalar_runs(code, slots, positions=(), steps=None, flags=None):
    """The compact rows (SC_* columns) of `code`, whose runs of scalar elementwise rows replays run from them
    (interpreter.scalar_run_forward and scalar_run_reverse): no slot table, no size checks, and in a gradient
    step no reads of `written`. Forward (the run code, `positions` its gradient steps'): no run crosses a
    position, SC_RUN of a run's first row is its stop. Reverse (steps: replay_sweep's, over the steps' derivative
    rows `code`): runs within a step, SC_RUN of a run's last row (the sweep's first) its number of rows, SC_FLAGS
    `flags`, per row, as derivative_plan planned them from the step's target (planning.reverse_flags)."""
    rows = np.zeros((code.shape[0], SC_FLAGS + 1), np.int64)
    if not code.shape[0]:
        return rows
    rows[:, :SC_RUN] = code[:, _SCALAR_COLUMNS]
    scalar = (code[:, oc.OP] <= oc.BINARY_LAST) & (slots[code[:, oc.OUT], oc.SIZE] == 1)
    if steps is None:
        starts, stops = _runs(scalar, positions)
        rows[starts, SC_RUN] = stops
        return rows
    starts, stops = _runs(scalar, steps[:, 1])
    rows[stops - 1, SC_RUN] = stops - starts
    rows[:, SC_FLAGS] = flags
    # a FORWARDED row of a run whose inputs no row outside the step's runs produces: nothing reads the marks it
    # leaves in `written` (rows of runs read their flags, the moves only sources', which are never forwarded), so
    # it is flagged as a row that never runs (W1's adds: ~1 us of its 15 us reverse)
    depth = np.zeros(code.shape[0] + 1, np.int64)
    np.add.at(depth, starts, 1)
    np.add.at(depth, stops, -1)
    in_run = np.cumsum(depth[:-1]) > 0
    for lo, hi in steps[:, 1:3].tolist():
        skipped = lo + np.flatnonzero((flags[lo:hi] & FORWARDED != 0) & in_run[lo:hi])
        if skipped.size:
            loose = np.zeros(slots.shape[0] + 1, np.bool_)      # produced outside runs; entry -1: no input
            loose[code[lo:hi][~in_run[lo:hi], oc.OUT]] = True
            rows[skipped[~loose[code[skipped, oc.IN0:oc.IN1 + 1]].any(axis=1)], SC_FLAGS] = 0
    return rows
