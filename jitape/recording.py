"""The recording: the thread-local stack of recording tapes, and what a tape keeps of each op it tracks.

A tape records each op whose inputs it tracks twice over: as a Python record
(primitive, inputs, output, params) for the recorded path that nested tapes
need (recorded.py), and as flat integer rows plus the recorded values, which
lower to a Program without any Python per op (program.py).

The Python records lie flat in one list, five entries per op (see
append_record), and name tensors by id, so that an op leaves no object alive
on a tape: Python's cyclic garbage collector traverses every object a tape
keeps in its full collections, whose number grows with what recordings keep and
whose cost grows with everything else the process holds (a process with
TensorFlow, PyTorch and JAX loaded spent half of W9's eager gradient in them
with three objects per op). records() rebuilds the tensors from their ids and
recorded values, as VariableRead does: tapes and derivatives tell tensors apart
by id alone.
"""
import functools
import math
import struct
import threading
import warnings
from array import array
from contextlib import contextmanager

from jitape_kernels import opcodes as oc

from . import nest
from .tensor import Tensor, Variable, VariableRead, _ids

_PAD = tuple((1,) * (oc.MAXRANK - r) for r in range(oc.MAXRANK + 1))
# Rows are appended as packed bytes: bytearray.extend(bytes) costs a tenth of array.extend(tuple), and the
# lowering reads the bytearrays as int64 arrays without a copy.
_pack_row = struct.Struct("6q").pack        # op, out, in0, in1, in2, attr
_pack_int = struct.Struct("q").pack
_SLOT_ROW = struct.Struct(f"{3 + oc.MAXRANK}q")


@functools.lru_cache(maxsize=4096)
def packed_attributes(iblock):
    """An integer attribute block as packed int64 bytes (blocks repeat: a loop records the same windows)."""
    return array("q", iblock).tobytes()


# the packed slot rows of (up to 4,096) shapes recorded so far, by is_float64: a dict lookup in the hot path
_slot_rows_by_shape = ({}, {})


def _slot_row(shape, is_float64, what="jitape"):
    """The recorded slot row of a value, packed: size, rank, is_float64, dims padded with ones. what: the op
    recording it, for the error a rank above MAXRANK raises."""
    rank = len(shape)
    if rank > oc.MAXRANK:
        raise ValueError(f"{what}: jitape records tensors of rank at most {oc.MAXRANK}, got shape {shape}")
    row = _SLOT_ROW.pack(math.prod(shape), rank, is_float64, *shape, *_PAD[rank])
    if len(_slot_rows_by_shape[is_float64]) < 4096:
        _slot_rows_by_shape[is_float64][shape] = row
    return row


# the fifth entry of an op's record: its fourth holds its only input, or the tuple of its inputs (none, or three
# or more); otherwise the fourth and fifth are its two inputs
_ONE_INPUT = object()
_INPUTS = object()


def _entry(t):
    """A recorded input: a tensor's id (the tape holds its value in its slot), or a variable's read itself."""
    return t._id if type(t) is Tensor else t


def append_record(records, prim, inputs, out, params):
    """Append an op's record to a tape's `records` as five entries: prim, out's id, params and its inputs (every
    input has a slot on the tape, as out has)."""
    n = len(inputs)
    if n == 2:
        records.extend((prim, out._id, params, _entry(inputs[0]), _entry(inputs[1])))
    elif n == 1:
        records.extend((prim, out._id, params, _entry(inputs[0]), _ONE_INPUT))
    else:
        records.extend((prim, out._id, params, tuple(map(_entry, inputs)), _INPUTS))


class _State(threading.local):
    def __init__(self):
        self.recording = []


_state = _State()


def recording_tapes():
    """The tapes recording in this thread, innermost last."""
    return _state.recording


class Recording:
    """What a tape records and how: watching, the integer rows, slots and values of every tracked op, and
    the recording stack. GradientTape adds the derivatives."""
    _is_trace = False       # jt.function's traces (replay._Trace) say True

    def __init__(self, persistent=False, watch_accessed_variables=True):
        self._persistent = bool(persistent)
        self._watch_accessed_variables = bool(watch_accessed_variables)
        self._recording = False
        self._used = False
        self._clear()

    def _clear(self):
        self._records = []              # per op, five entries (see append_record); records() reads them
        self._rows = []                 # per instruction, 6 int64 (op, out, in0, in1, in2, attr) as bytes
        self._slot_rows = []            # per slot, 3 + MAXRANK int64 (size, rank, is_float64, dims) as bytes (a
                                        # list: an append costs a tenth of a recorded op less than bytearray's +=)
        self._iattr = bytearray()       # int64
        self._fattr = array("d")
        self._values = []               # recorded value of each slot
        self._slot_of = {}              # tensor id -> slot
        self._tracked = set()           # ids of watched tensors and of recorded outputs
        self._variables = {}            # id -> watched Variable, in watch order
        self._aliases = {}              # variable id -> its earlier slots (values before an assignment)
        self._programs = {}             # lowered Programs of a persistent tape (program.lower)

    # -- context ---------------------------------------------------------------------------
    def _push(self):
        if self._recording:
            raise ValueError("GradientTape is already recording: a tape cannot be entered twice")
        _state.recording.append(self)
        self._recording = True
        return self

    def _pop(self, *exc):
        stack = _state.recording
        if stack and stack[-1] is self:     # the innermost (the common case)
            del stack[-1]
        else:
            for i in range(len(stack) - 1, -1, -1):
                if stack[i] is self:
                    del stack[i]
                    break
        self._recording = False

    __enter__ = _push       # a method call less per tape
    __exit__ = _pop         # (returns None: exceptions propagate)

    @contextmanager
    def stop_recording(self):
        """Pause recording on this tape inside the block."""
        if not self._recording:
            raise ValueError("GradientTape.stop_recording: the tape is not recording; use it inside "
                             "the tape's `with` block")
        self._pop()
        try:
            yield
        finally:
            self._push()

    def records(self):
        """(primitive, inputs, output, params) of every op this tape recorded, in order; each tensor rebuilt
        from its id and the value the tape recorded for it (one object per id)."""
        values, slot_of, rebuilt = self._values, self._slot_of, {}

        def tensor(entry):
            if type(entry) is not int:      # a variable's read
                return entry
            t = rebuilt.get(entry)
            if t is None:
                t = rebuilt[entry] = _new_object(Tensor)
                t._value = values[slot_of[entry]]
                t._id = entry
            return t

        r = self._records
        return [(prim, (tensor(first),) if second is _ONE_INPUT else tuple(map(tensor, first)) if second is _INPUTS
                 else (tensor(first), tensor(second)), tensor(out), params)
                for prim, out, params, first, second in zip(r[0::5], r[1::5], r[2::5], r[3::5], r[4::5])]

    def reset(self):
        """Forget everything recorded so far; the tape keeps recording if it was."""
        self._clear()
        self._used = False

    # -- watching --------------------------------------------------------------------------
    def watch(self, tensor):
        """Track `tensor` (a float Tensor/Variable, or a nested list/tuple/dict of them)."""
        for t in (tensor,) if type(tensor) is Tensor else nest.flatten(tensor):      # one tensor: at once
            if not isinstance(t, Tensor):
                raise TypeError(f"GradientTape.watch: expected a Tensor or Variable, got "
                                f"{type(t).__name__}: {t!r}")
            if t.dtype.kind != "f":
                warnings.warn(f"GradientTape.watch: the dtype of the watched tensor must be floating "
                              f"(float32 or float64), got {t.dtype}; it is not watched", stacklevel=2)
                continue
            self._tracked.add(t._id)
            if isinstance(t, Variable):
                self._variables[t._id] = t
            elif t._id not in self._slot_of and t.shape in _slot_rows_by_shape[t._value.itemsize == 8]:
                self._new_slot(t)       # now: its first reads then take record's inline path

    def watched_variables(self):
        """The variables this tape watches, in the order they were first watched."""
        return tuple(self._variables.values())

    # -- recording (`record` writes every tape's rows inline; these are its other paths) -------
    def _connected(self, inputs):
        tracked = self._tracked
        connected = False
        for t in inputs:
            if t._id in tracked:
                connected = True
            elif t._watchable and self._watch_accessed_variables:
                tracked.add(t._id)
                self._variables[t._id] = t
                connected = True
        return connected

    def _slot(self, t):
        slot = self._slot_of.get(t._id)
        if slot is not None:
            if not t._is_variable or self._values[slot] is t._value:
                return slot
            # a variable read again after an assignment: a new slot; the old one stays its alias
            self._aliases.setdefault(t._id, []).append(slot)
        return self._new_slot(t)

    def _new_slot(self, t):
        v = t._value
        shape = v.shape
        row = _slot_rows_by_shape[v.itemsize == 8].get(shape) or _slot_row(shape, v.itemsize == 8)  # may raise
        slot = len(self._values)
        self._values.append(v)
        self._slot_rows.append(row)
        self._slot_of[t._id] = slot
        return slot

    def _attr(self, iblock, fblock):
        """Append an op's attribute block (`iblock`: ints, or ints packed by `packed_attributes`; `fblock`:
        floats, whose position leads the int block); its position in the int attributes, or -1."""
        if type(iblock) is not bytes:
            iblock = packed_attributes(iblock)
        if fblock:
            iblock = _pack_int(len(self._fattr)) + iblock
            self._fattr.extend(fblock)
        if not iblock:
            return -1
        start = len(self._iattr) >> 3
        self._iattr += iblock
        return start

    def _add_row(self, opcode, out, in0, in1, in2, attr):
        self._rows.append(_pack_row(opcode, out, in0, in1, in2, attr))

    def _record_first_reads(self, prim, inputs, out, params, iblock, fblock):
        """record's recording where an input has no slot yet (a constant, or a watched tensor's first use) or is a
        variable, or where an op has no inputs or three."""
        tracked = self._tracked
        connected = False
        for t in inputs:
            if t._is_variable:      # _connected watches a variable if the tape watches what it reads
                connected = self._connected(inputs)
                break
            if t._id in tracked:
                connected = True
        if not connected:
            return
        # every new slot's row (rank <= MAXRANK) before anything is recorded
        for t in (*inputs, out):
            v = t._value
            if v.shape not in _slot_rows_by_shape[v.itemsize == 8]:
                _slot_row(v.shape, v.itemsize == 8, prim.name)
        ins = [-1, -1, -1]
        reads_variable = False
        for i, t in enumerate(inputs):
            if t._is_variable:
                reads_variable = True
                ins[i] = self._slot(t)
            else:
                slot = self._slot_of.get(t._id)
                ins[i] = self._new_slot(t) if slot is None else slot
        attr = self._attr(iblock, fblock) if iblock or fblock else -1
        self._rows.append(_pack_row(prim.opcode, self._new_slot(out), ins[0], ins[1], ins[2], attr))
        append_record(self._records, prim, _snapshots(inputs) if reads_variable else inputs, out, params)
        tracked.add(out._id)

    def _record_rows(self, prim, inputs, out, params, rows):
        """Record one op lowered to several rows: `rows` is ((opcode, input positions, iblock), ...)."""
        if not self._connected(inputs):
            return
        slots = [self._slot(t) for t in inputs]
        out_slot = self._slot(out)
        for opcode, positions, iblock in rows:
            ins = [slots[p] for p in positions] + [-1] * (3 - len(positions))
            self._add_row(opcode, out_slot, ins[0], ins[1], ins[2], self._attr(iblock, ()))
        append_record(self._records, prim, _snapshots(inputs), out, params)
        self._tracked.add(out._id)

    # -- differentiation -------------------------------------------------------------------
    def _must_record(self, seeds=(), tapes=None):
        """Whether a recording tape (of `tapes`, default all) tracks a tensor this tape's derivatives read (a
        recorded value or a seed): only then must the derivative be recorded with the Python VJPs; otherwise
        the compiled sweep gives the same numbers and records nothing either."""
        slot_of = self._slot_of
        for tape in _state.recording if tapes is None else tapes:
            tracked = tape._tracked
            if any(isinstance(s, Tensor) and s._id in tracked for s in seeds):
                return True
            small, large = (tracked, slot_of) if len(tracked) <= len(slot_of) else (slot_of, tracked)
            if any(i in large for i in small):
                return True
        return False


def emit(prim, inputs, value, params=None, iblock=(), fblock=()):
    """As record, for an op of any number of inputs (`inputs`, a tuple; `where` has three): one or two take
    record's inline path, others Recording._record_first_reads."""
    if 1 <= len(inputs) <= 2:
        return record(prim, inputs[0], inputs[-1] if len(inputs) == 2 else None, value, params, iblock, fblock)
    out = _new_object(Tensor)
    out._value = value
    out._id = next(_ids)
    for tape in _state.recording:
        tape._record_first_reads(prim, inputs, out, params, iblock, fblock)
    return out


def record(prim, first, second, value, params=None, iblock=(), fblock=()):
    """Wrap `value` (already computed by prim.forward from `first`, and `second` unless None) and record it on
    every tape that tracks an input: the hot path of eager recording, inline for inputs that already have slots
    and read no variable (a method call per tape would cost a twentieth of a recorded op; the inputs as
    arguments, not a tuple, another); everything else takes Recording._record_first_reads.
    Nothing is recorded before the output's slot row is known to be valid (rank <= MAXRANK), so an op that
    raises leaves every tape as it was. params: the op's parameters for its Python VJP; iblock, fblock: its
    attribute block (ints, or ints packed by `packed_attributes`; floats)."""
    out = _new_object(Tensor)       # Tensor(value) without its __init__ call: a fortieth of a recorded op
    out._value = value
    out._id = out_id = next(_ids)
    for tape in _state.recording:
        slot_of = tape._slot_of
        tracked = tape._tracked
        i0 = first._id
        s0 = None if first._is_variable else slot_of.get(i0)
        connected = i0 in tracked
        if second is None:
            s1 = -1
        else:
            i1 = second._id
            s1 = None if second._is_variable else slot_of.get(i1)
            connected = connected or i1 in tracked
        if s0 is None or s1 is None:
            tape._record_first_reads(prim, (first,) if second is None else (first, second), out, params, iblock,
                                     fblock)
            continue
        if not connected:
            continue
        row = _slot_rows_by_shape[value.itemsize == 8].get(value.shape) or _slot_row(value.shape,
                                                                                     value.itemsize == 8, prim.name)
        # _attr's appends inline for the common blocks: none, one float (scale, powc), packed ints (a cached window)
        if fblock:
            if iblock or len(fblock) != 1:
                attr = tape._attr(iblock, fblock)
            else:
                iattr = tape._iattr
                attr = len(iattr) >> 3
                iattr += _pack_int(len(tape._fattr))
                tape._fattr.append(fblock[0])
        elif iblock:
            if type(iblock) is bytes:
                attr = len(tape._iattr) >> 3
                tape._iattr += iblock
            else:
                attr = tape._attr(iblock, fblock)
        else:
            attr = -1
        values = tape._values
        slot = len(values)
        values.append(value)
        tape._slot_rows.append(row)
        slot_of[out_id] = slot
        tape._rows.append(_pack_row(prim.opcode, slot, s0, s1, -1, attr))
        # append_record, inline
        tape._records.extend((prim, out_id, params, i0, _ONE_INPUT if second is None else i1))
        tracked.add(out_id)
    return out


_new_object = object.__new__


def _snapshots(inputs):
    """Inputs as recorded for the Python VJPs: each Variable replaced by the value it had at this read."""
    return tuple(VariableRead(t) if type(t) is Variable else t for t in inputs)
