"""Program: a tape lowered to flat arrays (code, slots, attribute pools, arena), and its listing.

Lowering is a fixed number of vectorised calls whatever the tape's length:
the recorded integer rows go to the compiled `plan` (pruning, activity,
offsets) and the recorded values are packed with one np.fromiter (scalars) and
one np.concatenate (arrays).
"""
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from jitape_kernels import opcodes as oc
from jitape_kernels.planning import READS_ALL, READS_ANY_ORDER, READS_FIRST_ORDER, READS_REVERSE, plan

from . import config, recycling


@dataclass(eq=False)
class Program:
    """Plain data (pickles, saves to .npz): see jitape_kernels.opcodes for the encoding."""
    code: np.ndarray            # [n_instr, W] int64
    slots: np.ndarray           # [n_slots, S] int64
    iattr: np.ndarray           # int64
    fattr: np.ndarray           # float64
    arena: np.ndarray           # float32 or float64
    adjoint_rows: np.ndarray    # [n_slots] int64, -1 for inactive slots
    adjoint_size: int
    targets: np.ndarray         # slot of each target (-1: not recorded on the tape)
    sources: np.ndarray         # slot of each source (-1: not recorded on the tape)
    source_aliases: tuple       # per source: slots of its earlier values (a variable assigned while recorded)
    # the arena never changes (a persistent tape's Program): the cotangents of its scalar target seeded with one
    # are kept once a sweep computed them, so a gradient and then an HVP or a Hessian share one reverse sweep
    keeps_cotangents: bool = False
    # per slot, the address of a value the sweeps read where it lives, not in the arena (0: in the arena);
    # NO_HOMES: every value is in the arena (see lower)
    homes: np.ndarray = None
    # what the sweeps plan of the Program once (the kernels' scratch, source rows), shared by the Programs of
    # one kept plan (see _planned); a cache, not part of the Program
    memo: dict = None

    def __post_init__(self):
        if self.homes is None:
            self.homes = NO_HOMES
        if self.memo is None:
            self.memo = {}

    def __getstate__(self):
        self.complete()
        state = dict(self.__dict__)
        state.pop("cotangents", None)       # a cache, not part of the Program
        state["memo"] = {}
        return state

    def complete(self):
        """Fill the arena rows no derivative rule of this Program reads (planned with fewer reads than
        READS_ALL, they were left unwritten) and those of the values its sweeps read where they live (`homes`,
        see lower): before the Program is handed out, pickled or saved."""
        unfilled = self.__dict__.pop("unfilled", None)
        if unfilled is not None:
            values, n_scalar, array_slots = unfilled
            start = n_scalar + int(self.slots[array_slots, oc.SIZE].sum())
            rest = np.flatnonzero(self.slots[:, oc.OFFSET] >= start)    # laid out after the values read, in slot order
            if rest.size:
                np.concatenate([np.ravel(values[s]) for s in rest.tolist()], axis=None,
                               out=self.arena[start:start + int(self.slots[rest, oc.SIZE].sum())], casting="same_kind")
        away = self.__dict__.pop("away", None)
        if away is not None:
            values, home_slots = away
            for s in home_slots:
                offset = self.slots[s, oc.OFFSET]
                self.arena[offset:offset + self.slots[s, oc.SIZE]] = values[s].reshape(-1)
            self.homes = NO_HOMES
        return self

    def __len__(self):
        return self.code.shape[0]

    @property
    def dtype(self):
        return self.arena.dtype

    def slot_shape(self, slot):
        return tuple(int(d) for d in self.slots[slot, oc.DIMS:oc.DIMS + self.slots[slot, oc.RANK]])

    def __str__(self):
        lines = [f"Program: {len(self)} instructions, {int(np.sum(self.slots[:, oc.OFFSET] >= 0))} slots, "
                 f"arena {self.arena.size} x {self.dtype.name}, adjoint {self.adjoint_size} rows",
                 f"  sources {_slot_list(self.sources)}  targets {_slot_list(self.targets)}"]
        lines.extend(self.instruction(r) for r in range(len(self)))
        return "\n".join(lines)

    def instruction(self, r):
        """One listing line: `index  %out = opname(%in, ...)  out_shape`."""
        row = self.code[r]
        ins = ", ".join(f"%{s}" for s in row[oc.IN0:oc.IN2 + 1] if s >= 0)
        attr = f"  attr@{row[oc.ATTR]}" if row[oc.ATTR] >= 0 else ""
        return f"{r:5d}  %{row[oc.OUT]} = {oc.NAMES[row[oc.OP]]}({ins})  {self.slot_shape(row[oc.OUT])}{attr}"

    __repr__ = __str__


class ArenaFill(NamedTuple):
    """The recorded values that fill a planned arena: the scalar slots' (its first rows, in order), then the array
    slots', back to back from row `start` to row `stop`."""
    scalars: list
    arrays: list
    start: int
    stop: int


def arena_fill(slots, scalar_slots, array_slots):
    """The ArenaFill of plan()'s scalar_slots and array_slots."""
    arrays = array_slots.tolist()
    if not arrays:
        return ArenaFill(scalar_slots.tolist(), arrays, 0, 0)
    last = arrays[-1]
    return ArenaFill(scalar_slots.tolist(), arrays, int(slots[arrays[0], oc.OFFSET]),
                     int(slots[last, oc.OFFSET] + slots[last, oc.SIZE]))


def fill_arena(values, slots, fill, size, dtype, allocate, home_slots=()):
    """The arena of a planned Program: the recorded values of the slots its sweeps read (`fill`, an ArenaFill),
    scalars first (one np.fromiter), then arrays (one np.concatenate per run between `home_slots`, whose values
    are read where they live); the rest of the arena is left as allocated (NaN with
    jt.config.check_unread_values, so a kernel reading a value its opcode does not declare, or a home slot's
    rows, shows)."""
    arena = allocate(size, dtype)
    if config.check_unread_values:
        arena.fill(np.nan)
    scalars = fill.scalars
    if len(scalars) > _SCALARS_ONE_BY_ONE:
        arena[:len(scalars)] = np.fromiter(map(values.__getitem__, scalars), dtype, len(scalars))
    else:
        for row, slot in enumerate(scalars):
            arena[row] = values[slot]
    arrays = fill.arrays
    if not home_slots:
        if len(arrays) == 1:        # np.concatenate's setup costs more than the copy of a small value
            value = values[arrays[0]]
            arena[fill.start:fill.stop] = value if value.ndim == 1 else value.reshape(-1)
        elif arrays:
            np.concatenate(list(map(values.__getitem__, arrays)), axis=None, out=arena[fill.start:fill.stop],
                           casting="same_kind")
        return arena
    # the runs of array slots between home slots; a run's slots lie back to back in the arena
    at = np.searchsorted(arrays, home_slots).tolist()
    for first, last in zip([0] + [i + 1 for i in at], at + [len(arrays)]):
        if first < last:
            start, end = int(slots[arrays[first], oc.OFFSET]), arrays[last - 1]
            np.concatenate(list(map(values.__getitem__, arrays[first:last])), axis=None,
                           out=arena[start:int(slots[end, oc.OFFSET] + slots[end, oc.SIZE])], casting="same_kind")
    return arena


# up to this many scalars, assigning them one by one costs less than np.fromiter's setup (~0.8 us)
_SCALARS_ONE_BY_ONE = 16


NO_HOMES = np.zeros(0, np.int64)
NO_FLOAT_ATTRIBUTES = np.zeros(0, np.float64)     # shared: nothing can write an entry of it
# below this a value's copy (in cache: ~10 us for 40,000 float64) costs less than reading it where it lives
# (its address ~2 us, a run of the arena's fill more)
HOME_MIN_ENTRIES = 1 << 16      # above the CPU scalar loops' SMALL rows, which read the arena directly


def _home_slots(values, slots, array_slots, dtype):
    """The slots among `array_slots` whose recorded values the sweeps can read where they live: large,
    C-contiguous arrays of the arena's dtype."""
    large = array_slots[slots[array_slots, oc.SIZE] >= HOME_MIN_ENTRIES].tolist()
    return [s for s in large if type(values[s]) is np.ndarray and values[s].dtype == dtype
            and values[s].flags.c_contiguous]


def _slot_list(slots):
    return "[" + ", ".join(f"%{s}" if s >= 0 else "-" for s in slots) + "]"


def _slot_if_tracked(tape, t):
    # a watched tensor no op consumed still has a slot, so gradient(x, x) is ones
    return tape._slot(t) if t._id in tape._tracked else -1


def lower(tape, targets, sources, allocate=np.empty, reads=READS_ALL):
    """The Program computing d(targets)/d(sources) from what `tape` recorded.

    `allocate(size, dtype)` provides the arena (a reused workspace for internal sweeps). `reads` (see
    jitape_kernels.planning): which derivative rules will run on it, so that its arena is filled only with the
    values they read (READS_ALL: every value; the Program handed out by tape.program). A persistent tape keeps
    its Programs (each with an arena of its own, filled with what the rules of any order read), keyed by what
    was recorded so far and the (targets, sources) slots: repeated derivatives of one recording never plan again.
    With reads other than READS_ALL (the Programs of the tape's own derivatives), large recorded values are not
    copied: the sweeps read them where the tape keeps them (Program.homes: their addresses; the tape's list of
    values holds them, and recorded values are never written in place); complete() copies them in before a
    Program is handed out.
    """
    # one target and one source (the commonest) without a comprehension's frame each
    target_slots = (_slot_if_tracked(tape, targets[0]),) if len(targets) == 1 else tuple(
        [_slot_if_tracked(tape, t) for t in targets])
    source_slots = (_slot_if_tracked(tape, sources[0]),) if len(sources) == 1 else tuple(
        [_slot_if_tracked(tape, s) for s in sources])
    aliases = tuple(tuple(tape._aliases.get(s._id, ())) for s in sources) if tape._aliases else ((),) * len(sources)
    if not tape._persistent:
        return _lower(tape, target_slots, source_slots, aliases, allocate, reads)
    key = (len(tape._rows), len(tape._slot_rows), target_slots, source_slots, aliases)
    program = tape._programs.get(key)
    if program is None:
        if len(tape._programs) >= _PROGRAMS_KEPT:
            tape._programs.pop(next(iter(tape._programs)))
        program = tape._programs[key] = _lower(tape, target_slots, source_slots, aliases, recycling.take,
                                               READS_ANY_ORDER)
        recycling.keep(program, program.arena)
        program.keeps_cotangents = True
    return program.complete() if reads == READS_ALL else program


_PROGRAMS_KEPT = 8      # per persistent tape: a gradient, a Jacobian, a Hessian ... of one recording


class _Plan:
    """plan()'s results for one recording, derivative and set of reads, with what a Program of it needs beside
    its values, and `memo`: what its sweeps plan of it once (see Program.memo)."""
    __slots__ = ("code", "slots", "adjoint_rows", "fill", "array_slots", "arena_size", "adjoint_size", "dtype",
                 "iattr", "targets", "sources", "source_aliases", "memo")

    def __init__(self, rows, slot_rows, iattr, target_slots, source_slots, aliases, reads):
        rows = np.frombuffer(rows, np.int64).reshape(-1, 6)
        slot_rows = np.frombuffer(slot_rows, np.int64).reshape(-1, 3 + oc.MAXRANK)
        self.targets = np.array(target_slots, np.int64)
        self.sources = np.array(source_slots, np.int64)
        self.source_aliases = tuple(np.array(a, np.int64) for a in aliases)
        self.code, self.slots, self.adjoint_rows, scalar_slots, self.array_slots, arena_size, adjoint_size, \
            is_float64 = plan(rows, slot_rows, self.targets, np.concatenate((self.sources, *self.source_aliases)),
                              False, reads, SHARED_ROWS_MIN if reads in (READS_FIRST_ORDER, READS_REVERSE) else 0)
        self.fill = arena_fill(self.slots, scalar_slots, self.array_slots)
        self.arena_size, self.adjoint_size = int(arena_size), int(adjoint_size)
        self.dtype = np.dtype(np.float64 if is_float64 else np.float32)
        self.iattr = np.frombuffer(iattr, np.int64).copy()
        self.memo = {}


# A first-order Program's (READS_FIRST_ORDER, READS_REVERSE: a non-persistent tape's Jacobians or gradient) slots of
# at least this many entries (8 KB of float64) share adjoint rows where their cotangents are never live at once
# (planning.adjoint_layout), so a large sweep reuses rows still in cache; smaller ones, a few cache lines each, keep
# rows of their own. Other Programs own every row: a persistent tape's keep cotangents a second-order sweep reads
SHARED_ROWS_MIN = 1024


def _planned(tape, target_slots, source_slots, aliases, reads):
    """The _Plan of a derivative of what `tape` recorded. It depends on the recorded rows, slot rows and int
    attributes alone: the non-persistent tapes of a training loop, which record the same rows every step, plan
    once (kept for recordings of up to _PLANNED_ROWS rows). Their Programs share its arrays, which nothing writes;
    a persistent tape's Programs, which tape.program hands out, and a Program planned to be handed out
    (READS_ALL) own theirs."""
    rows, slot_rows, iattr = b"".join(tape._rows), b"".join(tape._slot_rows), bytes(tape._iattr)
    if tape._persistent or reads == READS_ALL or len(rows) > _PLANNED_ROWS * 48:
        return _Plan(rows, slot_rows, iattr, target_slots, source_slots, aliases, reads)
    key = (rows, slot_rows, iattr, target_slots, source_slots, aliases, reads)
    found = _plans.get(key)
    if found is None:
        if len(_plans) >= _PLANS_KEPT:
            _plans.pop(next(iter(_plans), None), None)     # another thread may have taken it
        found = _plans[key] = _Plan(rows, slot_rows, iattr, target_slots, source_slots, aliases, reads)
    return found


_plans = {}
_PLANS_KEPT = 16      # a training loop needs one or a few; a kept plan of 4,096 rows holds ~1.3 MB
_PLANNED_ROWS = 4096


def _lower(tape, target_slots, source_slots, aliases, allocate, reads):
    planned = _planned(tape, target_slots, source_slots, aliases, reads)
    slots = planned.slots
    home_slots = (_home_slots(tape._values, slots, planned.array_slots, planned.dtype)
                  if reads != READS_ALL and planned.arena_size >= HOME_MIN_ENTRIES else [])
    arena = fill_arena(tape._values, slots, planned.fill, planned.arena_size, planned.dtype, allocate, home_slots)
    fattr = np.frombuffer(tape._fattr, np.float64).copy() if tape._fattr else NO_FLOAT_ATTRIBUTES
    program = Program(planned.code, slots, planned.iattr, fattr, arena, planned.adjoint_rows, planned.adjoint_size,
                      planned.targets, planned.sources, planned.source_aliases, memo=planned.memo)
    if home_slots:
        program.homes = np.zeros(slots.shape[0], np.int64)
        program.homes[home_slots] = [tape._values[s].__array_interface__["data"][0] for s in home_slots]
        program.away = (tape._values, home_slots)
    if reads != READS_ALL:
        # the tape's list of values only grows (slot numbers stay valid); complete() finds the slots left out
        program.unfilled = (tape._values, len(planned.fill.scalars), planned.array_slots)
    return program

