"""A jt.function called under recording tapes: one compiled replay, recorded on every tape that tracks its inputs
as one op.

The op is recorded twice over, as every op is (see jitape.recording):
- for the compiled sweeps, as the rows of the replayed variant's Program, its slots mapped onto the tape's
  (inputs onto the slots of the argument tensors and variables read, every other value onto a new slot holding
  the value the replay computed): the tape's reverse, tangent and second-order sweeps differentiate the call
  with everything around it, and recording it costs no Python per instruction;
- for the recorded path (nested tapes), as one record per output whose VJP is the traced VJP of the function,
  itself a jt.function call, so a tape around it records it in turn.

The replay runs the function's differentiable twin (replay.Function.twin), whose traces record inner gradients
with their VJPs rather than as compiled gradient steps, so every row is an instruction the sweeps know.
"""
import numpy as np

from jitape_kernels import opcodes as oc

from . import nest
from .recording import _snapshots, _state, append_record
from .tape import GradientTape
from .tensor import Tensor


class _CallPrimitive:
    """The recorded-path face of a call: params is the _CallVJP of one output."""
    name = "jt.function call"
    opcode = None
    differentiable = True

    @staticmethod
    def vjp(g, out, inputs, params, wants):
        return params(g, inputs)


CALL = _CallPrimitive()


def recorded_call(function, args, kwargs):
    """function(*args, **kwargs) replayed, recorded as one op on each recording tape that tracks an input."""
    twin = function.twin()
    stack = _state.recording
    tapes = stack[:]
    del stack[:]        # a first call traces: the tapes must not record the trace's ops one by one
    try:
        concrete, leaves, traced = twin.replay(args, kwargs)
    finally:
        stack[:0] = tapes
    outputs = concrete.finish() if traced is None else traced[0]
    inputs = [(slot, leaves[i] if isinstance(leaves[i], Tensor) else Tensor(np.asarray(leaves[i])))
              for i, slot in concrete.arg_slots]
    inputs += [(slot, variable) for variable, slot in concrete.variable_inputs]
    input_tensors = [t for _, t in inputs]
    recording = [tape for tape in tapes if tape._connected(input_tensors)]
    if recording:
        if concrete.gradient_steps or concrete.host_steps:
            raise ValueError(f"{function.__name__!r} takes derivatives inside with the compiled sweeps (a loaded "
                             f"function): its calls cannot be differentiated by the tapes recording them")
        out_leaves = nest.flatten(outputs)
        vjps = [_CallVJP(twin, concrete, leaves, (args, kwargs), index) for index in range(len(out_leaves))]
        for tape in recording:
            _record(tape, concrete, inputs, out_leaves, vjps)
    return outputs


def _record(tape, concrete, inputs, out_leaves, vjps):
    """The call's rows, slots and values appended to `tape`, and one record per recorded output; a fixed number
    of numpy calls whatever the Program's length. Values are read from the arena by fancy indexing (copies:
    the next replay overwrites the arena)."""
    slots, code, values = concrete.slots, concrete.code, concrete.arena
    n = slots.shape[0]
    mapping = np.full(n + 1, -1, np.int64)          # index -1 (an absent input) maps to -1
    for slot, t in inputs:
        mapping[slot] = tape._slot(t)
    fresh = np.flatnonzero(mapping[:n] < 0)
    # the new slots, scalars first: the tape holds a scalar's value as a numpy scalar, an array's as an array
    fresh = fresh[np.argsort(slots[fresh, oc.RANK] != 0, kind="stable")]
    mapping[fresh] = len(tape._values) + np.arange(fresh.size)
    n_scalar = int(np.sum(slots[fresh, oc.RANK] == 0))
    tape._values.extend(values[slots[fresh[:n_scalar], oc.OFFSET]])
    arrays = fresh[n_scalar:]
    starts, sizes = slots[arrays, oc.OFFSET], slots[arrays, oc.SIZE]
    ends = np.cumsum(sizes)
    gathered = values[np.repeat(starts - ends + sizes, sizes) + np.arange(int(ends[-1]) if ends.size else 0)]
    tape._values.extend(map(gathered.__getitem__, map(slice, (ends - sizes).tolist(), ends.tolist())))
    rows = np.empty((fresh.size, 3 + oc.MAXRANK), np.int64)
    rows[:, 0], rows[:, 1] = slots[fresh, oc.SIZE], slots[fresh, oc.RANK]
    rows[:, 2] = concrete.dtype.itemsize == 8
    rows[:, 3:] = slots[fresh, oc.DIMS:]
    tape._slot_rows.append(rows.tobytes())
    instructions = code[:, [oc.OP, oc.OUT, oc.IN0, oc.IN1, oc.IN2, oc.ATTR]]
    instructions[:, 1:5] = mapping[instructions[:, 1:5]]
    has_attr = instructions[:, 5] >= 0
    iattr = concrete.iattr.copy()
    # a float attribute's block holds its fattr index first: the call's floats follow the tape's
    iattr[np.unique(code[has_attr & (_FLOAT_COUNT[code[:, oc.OP]] > 0), oc.ATTR])] += len(tape._fattr)
    instructions[has_attr, 5] += len(tape._iattr) // 8     # the tape's attributes are packed int64
    tape._iattr += iattr.tobytes()
    tape._fattr.frombytes(concrete.fattr.tobytes())
    tape._rows.append(instructions.tobytes())
    snapshots = _snapshots([t for _, t in inputs])
    for entry, out, vjp in zip(concrete.outputs, out_leaves, vjps):
        if entry[0] == "slot" and isinstance(out, Tensor):
            tape._slot_of[out._id] = int(mapping[entry[1]])
            tape._tracked.add(out._id)
            append_record(tape._records, CALL, snapshots, out, vjp)


_FLOAT_COUNT = np.array(oc.FLOAT_COUNT)


class _CallVJP:
    """The VJP of one output of a recorded call: the gradient of that output w.r.t. the call's float argument
    leaves and the variables it read, computed by a jt.function (so it is recorded by the tapes around it)."""

    def __init__(self, twin, concrete, leaves, structure, index):
        self.twin, self.concrete, self.leaves, self.structure, self.index = twin, concrete, leaves, structure, index

    def __call__(self, g, inputs):
        if not self.twin.has_python:
            raise ValueError(f"the loaded function {self.twin.__name__!r}: a derivative of its call that must itself "
                             f"be recorded (nested tapes) needs its Python code")
        n_args = len(self.concrete.arg_slots)
        for (variable, _), read in zip(self.concrete.variable_inputs, inputs[n_args:]):
            if variable._value is not read._value:
                raise ValueError(f"a derivative of a jt.function call of {self.twin.__name__!r} that must itself be "
                                 f"recorded: variable {variable.name!r} was assigned after the call; take the "
                                 f"derivative before assigning it")
        vjp = self.concrete.memo.get(("vjp", self.index))
        if vjp is None:
            vjp = self.concrete.memo["vjp", self.index] = self._vjp_function()
        return vjp(list(inputs[:n_args]), g)

    def _vjp_function(self):
        python, template, structure, index = self.twin.python_function, self.leaves, self.structure, self.index
        positions = [i for i, _ in self.concrete.arg_slots]
        variables = [v for v, _ in self.concrete.variable_inputs]

        def vjp(arg_inputs, g):
            leaves = list(template)
            for position, t in zip(positions, arg_inputs):
                leaves[position] = t
            args, kwargs = nest.pack_like(structure, leaves)
            with GradientTape() as tape:
                tape.watch(arg_inputs)
                out = nest.flatten(python(*args, **kwargs))[index]
            return tape.gradient(out, list(arg_inputs) + variables, output_gradients=g,
                                 unconnected_gradients="zero")

        vjp.__name__ = f"vjp_of_{self.twin.__name__}"
        return self.twin.sibling(vjp)
