"""jt.function: a Python function traced once per input signature into a Program, replayed in compiled code.

A trace is a persistent tape (`_Trace`) that tracks the float arguments and
every float variable read, and records everything computed from them,
comparisons and the gradients of inner tapes included. What the function reads
into Python from a traced value (`if x > 0`, `float(t)`, an op computed on
values) is a guard (see jitape.tracing): a replay runs the whole Program in one
compiled forward sweep, checks the guards, and when one differs runs another
traced variant whose guards hold, or traces again. Never a stale branch's value.

A traced variant (`Concrete`) declares its inputs (argument leaves, variables
read), its outputs, its guards and the variables it writes. Its Program keeps
every instruction the outputs, guards and writes need, on a compacted slot
table; derivatives of a replay (jt.grad and friends, jitape.functional) plan
once per (sources, target) and reuse the filled arena.
"""
import functools
import operator
import sys
import warnings
import weakref

import numpy as np

from jitape_kernels import opcodes as oc
from jitape_kernels.layout import (BLOCK, HOST_STEP, REPLAY_HELD, SC_FLAGS, fused_groups, hoisted, logsumexp_stashes,
                                   reverse_groups, run_layout, scalar_runs)
from jitape_kernels.planning import READS_ALL, derivative_plan, plan

from . import calls, config, nest, recycling
from . import backend as backends     # not `backend`: Function's argument of that name would shadow it
from .execute import source_blocks, source_hessian, source_jacobians, unit_cotangents
from .program import Program, arena_fill, fill_arena
from .recording import _state
from .tape import GradientTape
from .tensor import VIEWS_FROM, Tensor, Variable, _slot_value
from .tracing import _traces


# The row a trace records for a gradient taken with the compiled sweep inside it (out: the gradient, in0: the
# target, in1: the source). Never an opcode: Concrete turns these rows into gradient steps run by the
# executor between forward segments, so no kernel ever sees one.
GRADIENT_STEP = -7
# ... for a Hessian or a Jacobian taken with the compiled sweeps (out: the derivative, in0: the target, in1: the
# source): host steps, which the replay returns to its caller to run (Concrete.run) before going on; the host steps'
# kinds as a saved function names them
HESSIAN_STEP, JACOBIAN_STEP = -8, -9
HOST_STEP_KINDS = {HESSIAN_STEP: "hessian", JACOBIAN_STEP: "jacobian"}
# run()'s purpose for a call that needs only the outputs, guards and writes (Function.__call__ not recording)
OUTPUTS = "outputs"


class _Trace(GradientTape):
    """The recording of one call of a jt.function."""
    _is_trace = True

    def __init__(self, compiled_gradients=True):
        super().__init__(persistent=True, watch_accessed_variables=True)
        # whether inner tapes' gradients may run the compiled sweep (False when the trace is differentiated
        # itself: jt.grad and friends need the recorded VJPs)
        self.compiled_gradients = compiled_gradients
        self.variable_inputs = {}   # variable id -> (variable, slot of the value it had at the call)
        self.current = {}           # variable id -> (variable, tensor holding the value assigned in the trace)
        self.slot_guards = []       # (slot, expected value, how)
        self.variable_guards = {}   # id -> (variable, expected value, how): variables no instruction reads
        self.kept_constants = []    # slots of broadcast constants, planned as sources so their broadcasts stay
        self.takes_gradients = False    # whether it recorded a gradient step
        self.step_views = {}            # a step row's output slot -> the slots the inner tape's rows computed

    def keep_constant(self, tensor):
        """See tracing.broadcast_constant."""
        if tensor._id not in self._tracked:
            self.watch(tensor)
            self.kept_constants.append(self._slot(tensor))

    def _connected(self, inputs):
        for t in inputs:            # every float variable read is an input, trainable or not
            if t._is_variable and t._id not in self._tracked and t._value.dtype.kind == "f":
                self._tracked.add(t._id)
        return super()._connected(inputs)

    def _slot(self, t):
        if not t._is_variable:
            return super()._slot(t)
        written = self.current.get(t._id)
        if written is not None:
            return super()._slot(written[1])
        slot = self._slot_of.get(t._id)
        if slot is None:
            slot = self._new_slot(t)
            self.variable_inputs[t._id] = (t, slot)
        return slot

    def guard(self, tensor, how):
        if tensor._is_variable and tensor._id not in self._tracked and tensor._id not in self.current:
            if tensor._value.dtype.kind != "f":     # read where no instruction sees it: checked before replay
                self.variable_guards.setdefault(tensor._id, (tensor, np.array(tensor._value), how))
                return
            self._tracked.add(tensor._id)
        if tensor._id in self._tracked:
            self.slot_guards.append((self._slot(tensor), np.array(tensor._value), how))

    def assign(self, variable, tensor):
        self._tracked.add(variable._id)
        self.current[variable._id] = (variable, tensor)

    def step_view(self, tape, sources):
        """What a derivative of the inner `tape` w.r.t. `sources` differentiates of this trace, as a step of its
        Program: (the slots of the values the tape's rows computed: every other value is a constant of the step, as
        the tape did not record it, per source its slot as the tape's rows read it, or the source itself where
        that is its slot in this trace: taken when a step is recorded, so that a view makes no slot); None where
        that slot is not found (a variable this trace assigned, read by the tape only through concat's rows)."""
        inner = np.frombuffer(b"".join(tape._rows), np.int64).reshape(-1, 6)
        id_of = {slot: i for i, slot in tape._slot_of.items()}
        slot_of = self._slot_of
        computed = [slot_of.get(id_of.get(out)) for out in inner[:, 1].tolist()]
        slots, rows = [], None
        for source in sources:
            if not source._is_variable or source._id not in self.current:
                slots.append(source)
                continue
            # a variable assigned in the trace: the value its inner rows read, found through a row both recorded
            slot = None
            read = tape._slot_of.get(source._id, -1)
            if rows is None:
                rows = np.frombuffer(b"".join(self._rows), np.int64).reshape(-1, 6)
            for r in np.flatnonzero((inner[:, 2:5] == read).any(axis=1) & (inner[:, 0] != oc.PLACE)).tolist():
                both = np.flatnonzero(rows[:, 1] == (-1 if computed[r] is None else computed[r]))
                if both.size == 1:
                    slot = int(rows[both[0], 2 + np.flatnonzero(inner[r, 2:5] == read)[0]])
                    break
            if slot is None:
                return None
            slots.append(slot)
        return np.array([s for s in computed if s is not None], np.int64), slots

    def record_gradient(self, target, gradients, view):
        """An inner tape's gradient of `target` ran the compiled sweep (view: step_view's for its sources): one
        GRADIENT_STEP row per connected source (a target this trace does not track has constant gradients: nothing
        to record)."""
        if self._record_step(GRADIENT_STEP, target, gradients, view):
            self.takes_gradients = True

    def record_hessian(self, target, hessian, view):
        """An inner tape's Hessian of `target` w.r.t. one source ran the compiled sweeps: one HESSIAN_STEP row."""
        self._record_step(HESSIAN_STEP, target, [hessian], view)

    def record_jacobian(self, target, jacobians, view):
        """An inner tape's Jacobian of `target` ran the compiled sweep: one JACOBIAN_STEP row per connected
        source."""
        self._record_step(JACOBIAN_STEP, target, jacobians, view)

    def _record_step(self, op, target, derivatives, view):
        """One row of `op` per connected source (derivative None: not connected), remembering what the step
        differentiates (step_view's `view`); whether it recorded any."""
        if target._id not in self._tracked:
            return False
        target_slot = self._slot(target)
        computed, sources = view
        recorded = False
        for source, derivative in zip(sources, derivatives):
            if derivative is not None:
                source_slot = self._slot(source) if isinstance(source, Tensor) else source
                self._tracked.add(derivative._id)
                out = self._new_slot(derivative)
                self.step_views[out] = computed
                self._add_row(op, out, target_slot, source_slot, -1, -1)
                recorded = True
        return recorded


def _leaf_key(leaf):
    """What of an argument leaf selects a trace: shapes and dtypes of float arrays (their values are inputs),
    values of everything else."""
    if isinstance(leaf, Variable):
        return ("variable", leaf._id)
    if isinstance(leaf, (Tensor, np.ndarray)):
        value = leaf._value if isinstance(leaf, Tensor) else leaf
        if value.dtype.kind == "f":
            return ("array", value.shape, value.dtype.char)
        return ("value", value.shape, value.dtype.str, value.tobytes())
    if isinstance(leaf, (bool, int, float, complex, str, bytes, type(None))):
        return ("python", type(leaf).__name__, leaf)
    return ("object", id(leaf))


_NO_ARGUMENTS = ("tensors", ())


def signature(args, kwargs):
    """(the key that selects a trace, the flat argument leaves). Positional tensors alone (the common call) take
    a shortcut that gives the same leaves and an equally distinctive key."""
    if not kwargs:
        if not args:
            return _NO_ARGUMENTS, []
        keys = []
        for a in args:
            if type(a) is not Tensor or a._value.dtype.kind != "f":
                break
            keys.append(("array", a._value.shape, a._value.dtype.char))
        else:
            return ("tensors", tuple(keys)), list(args)
    leaves = nest.flatten((args, kwargs))
    return (_structure((args, kwargs)), tuple(_leaf_key(leaf) for leaf in leaves)), leaves


def _structure(x):
    if isinstance(x, (list, tuple)):
        return (type(x).__name__, tuple(_structure(i) for i in x))
    if isinstance(x, dict):
        return ("dict", tuple((k, _structure(x[k])) for k in sorted(x, key=nest._sort_key)))
    return "*"


def _is_input(leaf):
    value = getattr(leaf, "_value", leaf)
    return (isinstance(leaf, Tensor) and not leaf._is_variable or isinstance(leaf, np.ndarray)) \
        and value.dtype.kind == "f"


class Concrete:
    """One traced variant of a jt.function: a Program over a compacted slot table, its declared inputs
    (argument leaves and variables), outputs, guards and variable writes."""

    def __init__(self, trace, arg_slots, structure, out_leaves, fuse=False):
        self.structure = structure
        var_inputs = list(trace.variable_inputs.values())
        rows = np.frombuffer(b"".join(trace._rows), np.int64).reshape(-1, 6)
        slot_rows = np.frombuffer(b"".join(trace._slot_rows), np.int64).reshape(-1, 3 + oc.MAXRANK)
        # a trace whose inner tapes each recomputed f (jt.grad and jt.hessian of one f) computes it once
        same = np.arange(slot_rows.shape[0])
        if trace.step_views:
            inputs = [s for _, s in arg_slots] + [s for _, s in var_inputs]
            same, kept = _shared_values(rows, slot_rows, np.frombuffer(trace._iattr, np.int64),
                                        np.frombuffer(trace._fattr, np.float64), trace._values, inputs,
                                        trace.step_views)
            rows = rows[kept]
            rows[:, 2:5] = np.where(rows[:, 2:5] >= 0, same[rows[:, 2:5]], -1)
        outputs = []            # per output leaf: ("slot", slot, shape, dtype) or ("value", leaf)
        targets = []
        for leaf in out_leaves:
            if isinstance(leaf, Tensor) and not leaf._is_variable and leaf._id in trace._tracked:
                slot = int(same[trace._slot(leaf)])
                outputs.append(["slot", slot, leaf.shape, leaf.dtype])
                targets.append(slot)
            else:
                outputs.append(["value", leaf])
        writes = []
        for variable, tensor in trace.current.values():
            if tensor._id in trace._tracked:
                slot = int(same[trace._slot(tensor)])
                writes.append([variable, slot])
                targets.append(slot)
            else:
                writes.append([variable, np.array(tensor._value)])
        guards = [[int(same[slot]), expected, how] for slot, expected, how in trace.slot_guards]  # expected: below
        targets += [g[0] for g in guards]
        kept_constants = sorted(set(same[trace.kept_constants].tolist()))      # equal ones shared (see above)
        sources = [s for _, s in arg_slots] + [s for _, s in var_inputs] + kept_constants
        rows = rows[hoisted(rows, slot_rows[:, 0])]
        rows.flags.writeable = False     # plan()'s one signature: a tape's rows are read-only views of its bytes
        code, slots, _, scalar_slots, array_slots, arena_size, _, is_float64 = plan(
            rows, slot_rows, np.array(targets, np.int64), np.array(sources, np.int64), True, READS_ALL, 0)
        self.dtype = np.dtype(np.float64 if is_float64 else np.float32)
        self.arena = fill_arena(trace._values, slots, arena_fill(slots, scalar_slots, array_slots), arena_size,
                                self.dtype, np.empty)
        # compact the slot table to the slots the Program uses
        used = np.flatnonzero(slots[:, oc.OFFSET] >= 0)
        renumber = np.full(slots.shape[0] + 1, -1, np.int64)     # index -1 maps to -1
        renumber[used] = np.arange(used.size)
        code[:, oc.OUT:oc.IN2 + 1] = renumber[code[:, oc.OUT:oc.IN2 + 1]]
        self.slots = slots[used]
        self.iattr, self.fattr = _compacted_attributes(code, np.frombuffer(trace._iattr, np.int64),
                                                       np.frombuffer(trace._fattr, np.float64))
        steps = np.isin(code[:, oc.OP], (GRADIENT_STEP, *HOST_STEP_KINDS))
        self.code = np.ascontiguousarray(code[~steps]) if steps.any() else code     # no copy of a large code
        # per step's output slot, the slots of the values its inner tape computed (only those rows differentiate)
        computed, renumbered = {}, {}
        for slot, view in trace.step_views.items():
            if id(view) not in renumbered:      # one view per tape's derivative, shared by its rows
                kept = renumber[same[view]]
                renumbered[id(view)] = kept[kept >= 0]
            computed[int(renumber[slot])] = renumbered[id(view)]
        # (position in code, target slot, [(source slot, gradient slot)], the rows of code before it that its tape
        # recorded, which it differentiates): consecutive rows of one target over the same rows
        self.gradient_steps = []
        # (position in code, kind (HOST_STEP_KINDS' name), target slot, [(source slot, derivative slot)], rows): a
        # Hessian step has one source; consecutive Jacobian rows of one target over the same rows are one step
        self.host_steps = []
        for r in np.flatnonzero(steps).tolist():
            position = r - int(np.sum(steps[:r]))       # the rows of code before it
            target, pair = int(code[r, oc.IN0]), (int(code[r, oc.IN1]), int(code[r, oc.OUT]))
            rows = np.flatnonzero(np.isin(self.code[:position, oc.OUT], computed[pair[1]]))
            kind = HOST_STEP_KINDS.get(int(code[r, oc.OP]))
            steps_of_kind = self.gradient_steps if kind is None else self.host_steps
            last = steps_of_kind[-1] if steps_of_kind else None
            if last is not None and last[0] == position and last[-3] == target and np.array_equal(last[-1], rows) \
                    and kind != "hessian" and (kind is None or last[1] == kind):
                last[-2].append(pair)
                continue
            steps_of_kind.append([position, target, [pair], rows] if kind is None
                                 else [position, kind, target, [pair], rows])
        self.arg_slots = [(i, int(renumber[s])) for i, s in arg_slots]
        self.variable_inputs = [(v, int(renumber[s])) for v, s in var_inputs]
        for entry in outputs:
            if entry[0] == "slot":
                entry[1] = int(renumber[entry[1]])
        for entry in writes:
            if not isinstance(entry[1], np.ndarray):
                entry[1] = int(renumber[entry[1]])
        for g in guards:
            g[0] = int(renumber[g[0]])
        for g in guards:        # as the arena holds it, once: a replay compares without converting
            g[1] = np.ravel(g[1]).astype(self.dtype)
        self.outputs, self.writes, self.slot_guards = outputs, writes, guards
        self.variable_guards = list(trace.variable_guards.values())
        self._plans = {}
        self.prepare(fuse)

    def prepare(self, fuse=False):
        """Plan what every run needs once: the derivative rows of each gradient step (a reverse sweep over the
        rows before it) with their seeds and the moves of their gradients into the arena, the guard tables, and
        the arena spans of inputs, writes and outputs. fuse: replays run the run layout (jitape_kernels.layout),
        after which only outputs, guards and writes hold their values (nothing may differentiate them). A Hessian
        step is a host step (see run): its derivative rows are planned here, and the values they read kept."""
        step_rows, step_code, step_flags, moves, host_plans = [], [], [], [], []
        n_code = n_adjoint = 0
        live = [e[1] for e in self.outputs if e[0] == "slot"] + [w[1] for w in self.writes
                                                                 if not isinstance(w[1], np.ndarray)]
        live += [g[0] for g in self.slot_guards]
        # a gradient step that a Hessian step at its position shares its target and its one source with is taken
        # from the Hessian's cotangents (its reverse sweep, planned alike, serves both)
        hessians = {(position, target, pairs[0][0]): k for k, (position, kind, target, pairs, _) in
                    enumerate(self.host_steps) if kind == "hessian"}
        gradient_of, gradient_steps = {}, []
        for position, target, pairs, rows in self.gradient_steps:
            k = hessians.get((position, target, pairs[0][0])) if len(pairs) == 1 else None
            if k is None or k in gradient_of or not np.array_equal(rows, self.host_steps[k][4]):
                gradient_steps.append((position, None, target, pairs, rows, -1))
            else:
                gradient_of[k] = pairs[0][1]
        # the steps in program order (steps at one position read nothing another writes)
        ordered = sorted(gradient_steps + [(*step, gradient_of.get(k, -1)) for k, step in enumerate(self.host_steps)],
                         key=operator.itemgetter(0))
        for position, kind, target, pairs, rows, gradient in ordered:
            code, adjoint_rows, adjoint_size, flags, forwarded, forwarded_flags = derivative_plan(
                self.code[rows], self.slots, np.array([target], np.int64), np.array([s for s, _ in pairs], np.int64))
            if kind is not None:
                host_plans.append((kind, code, adjoint_rows, int(adjoint_size), target, pairs, gradient))
                step_rows.append([position, n_code, n_code, HOST_STEP, 0, len(moves), len(moves), target])
                read = code[:, oc.OUT:oc.IN2 + 1]
                live += read[read >= 0].tolist() + [target] + [slot for pair in pairs for slot in pair]
                live += [gradient] if gradient >= 0 else []
                continue
            code, flags = forwarded, forwarded_flags       # a gradient step only runs reverse
            step_rows.append([position, n_code, n_code + code.shape[0], adjoint_rows[target],
                              self.slots[target, oc.SIZE], len(moves), len(moves) + len(pairs), target])
            moves += [[adjoint_rows[s], self.slots[s, oc.SIZE], out, s] for s, out in pairs]     # out: below
            step_code.append(code)
            step_flags.append(flags)
            n_code += code.shape[0]
            n_adjoint = max(n_adjoint, int(adjoint_size))
        self._steps = np.array(step_rows, np.int64).reshape(-1, 8)
        self._step_code = np.concatenate(step_code) if step_code else np.zeros((0, oc.W), np.int64)
        self._step_flags = np.concatenate(step_flags) if step_flags else np.zeros(0, np.int64)
        self._live, self._fuses = np.array(live, np.int64), fuse
        self.purpose_layouts = {}       # per bound purpose, the fused groups and places its replays run
        read_in = {id(variable): slot for variable, slot in self.variable_inputs}
        written = {id(variable): slot for variable, slot in self.writes}
        if fuse:
            in_place = [(read_in[key], slot) for key, slot in written.items()
                        if key in read_in and not isinstance(slot, np.ndarray)]
            self._run_code, self._offsets, self._steps[:, 0], self._fused, self._places, n_scratch = run_layout(
                self.code, self.slots, self.iattr, self._steps[:, 0], self._step_code, self._live, in_place=in_place)
        else:
            self._run_code, self._offsets, n_scratch = self.code, self.slots[:, oc.OFFSET], 0
            self._fused = np.zeros(self.code.shape[0], np.int64)
            self._places = np.full((self.code.shape[0], 4), -1, np.int64)
        for move in moves:          # the gradient slot -> its arena offset
            move[2] = self._offsets[move[2]]
        self._host_steps = self._host_programs(np.flatnonzero(self._steps[:, 3] == HOST_STEP).tolist(), host_plans)
        self._resume = np.full(1, -1, np.int64)     # replay_sweep's `resume`
        self._moves = np.array(moves, np.int64).reshape(-1, 4)
        self._step_groups, self._step_places, n_reverse = reverse_groups(self._step_code, self._steps, self.slots,
                                                                         self.iattr, self._moves)
        self._run_code, self._step_code, n_stash = logsumexp_stashes(self._run_code, self._step_code, self.slots)
        self._scalars = scalar_runs(self._run_code, self.slots, self._steps[:, 0])
        self._step_scalars = scalar_runs(self._step_code, self.slots, steps=self._steps, flags=self._step_flags)
        # the fused groups' buffers (the forward's and the reverse's run apart), then the stashes
        self._scratch_blocks = max(n_scratch, n_reverse)
        self._scratch = np.empty(self._scratch_blocks * BLOCK + n_stash, self.dtype)
        self._adjoint = np.empty((n_adjoint, 1), self.dtype)
        guards, n_expected = [], 0
        for slot, expected, _ in self.slot_guards:
            guards.append([self._offsets[slot], expected.size, n_expected])
            n_expected += expected.size
        self._guards = np.array(guards, np.int64).reshape(-1, 3)
        self._expected = np.concatenate([g[1] for g in self.slot_guards]) if guards else np.zeros(0, self.dtype)
        # inputs as run() reads them: (argument index or variable, start, stop, whether the value is 0-d, so
        # stored as one entry: numpy's slice assignment costs ~1 us more)
        self._arg_spans = [(i, *self._bounds(slot), self.slots[slot, oc.RANK] == 0) for i, slot in self.arg_slots]
        self._variable_spans = [(variable, *self._bounds(slot), variable._value.ndim == 0)
                                for variable, slot in self.variable_inputs]
        # A replay's arena keeps the inputs it was given (only run() writes argument rows): a run skips the
        # Tensors its last run copied (they are immutable), and a plain replay the variables whose version is the
        # one its last finish() saw, where no replay writes their rows or it writes their new values there (in
        # place: see layout.run_layout); it checks none where no variable changed since (Variable._changes).
        self._reuses = fuse
        self._reusable = [id(variable) not in written or not isinstance(written[id(variable)], np.ndarray)
                          and self._bounds(written[id(variable)]) == self._bounds(slot)
                          for variable, slot in self.variable_inputs]
        self._rows_hold_reads = all(self._reusable)
        self._last_args = [None] * len(self._arg_spans)     # weak references to the Tensors last copied
        # after a plain replay's finish(): Variable._changes and, per variable read, the version its rows hold
        self._seen_changes, self._seen_versions = None, [None] * len(self._variable_spans)
        # writes as finish() makes them: (variable, constant or None, start, stop, shape, dtype), dtype None where
        # it is the arena's (no conversion); a variable's shape and dtype never change
        write_spans = [(variable, source, 0, 0, None, None) if isinstance(source, np.ndarray)
                       else (variable, None, *self._bounds(source), variable._value.shape,
                             self._converted(variable._value.dtype))
                       for variable, source in self.writes]
        # Writes whose values finish() leaves in the arena until the variable is read (Variable._defer), as
        # (variable, its value there, the index of its read): a plain replay's new values of the arena's dtype
        # written over the old ones, where no guard can stop a run after its rows ran (the rows would then hold a
        # value the variable never took). The other writes are made at once; their spans end with the index of
        # the read of the rows they write (-1: none).
        read_at = {(id(variable), start, stop): k for k, (variable, start, stop, _) in enumerate(self._variable_spans)}
        in_place = [read_at.get((id(variable), start, stop), -1) if source is None else -1
                    for variable, source, start, stop, _, _ in write_spans]
        deferred = [self._reuses and not self.slot_guards and k >= 0 and span[5] is None
                    for span, k in zip(write_spans, in_place)]
        self._deferred_writes = [(span[0], _ArenaValue(self, span[2], span[3]), k)
                                 for span, k, defer in zip(write_spans, in_place, deferred) if defer]
        self._write_spans = [(*span, k) for span, k, defer in zip(write_spans, in_place, deferred) if not defer]
        # outputs as finish() makes them: (constant, start (-1: the constant is the output), stop, shape, dtype)
        self._output_spans = [(None, *self._bounds(entry[1]), tuple(entry[2]), self._converted(entry[3]))
                              if entry[0] == "slot" else (entry[1], -1, 0, None, None) for entry in self.outputs]
        # f returned one leaf (a tensor, None, a Python value): no nest to rebuild
        self._single_output = not isinstance(self.structure, (list, tuple, dict))
        self._holds = self.variables_hold if self.variable_guards else None
        self._replayers = {}    # backend name (or (name, purpose): see bind_gradient) -> a replay bound to arrays
        self._pending_kernels = []      # the fused groups' kernels to compile (see _group_kernels)
        self._gradient_rows = {}    # purpose -> (its adjoint buffer, (adjoint row, size, dtype) per source)
        self._gradient_reads = {}   # purpose -> per source, the function of the buffer giving its gradient
        self._bindings = {}         # purpose -> (backend, its replay's arrays, the adjoint's place None)
        self._unlent = {}           # purpose -> the references to its adjoint buffer when no gradient is lent
        self.ran = None
        self.runs = 0       # compiled calls that may have written the arena (see _ArenaValue)
        self.finished = 0   # the last of them that finish() ended
        self.memo = {}      # what callers work out once per variant (the layouts of functional derivatives)

    def __len__(self):
        return self.code.shape[0]

    def _host_programs(self, indices, plans):
        """Per host step (by its index among the steps): (its kind, its derivative's Program reading the values
        where the run layout places them, the target's size, per source (its size, the derivative's arena
        offset), the arena offset of the gradient it also takes (-1: none)) (see _host_step)."""
        if not plans:
            return {}
        slots = self.slots.copy()
        slots[:, oc.OFFSET] = self._offsets
        found = {}
        for index, (kind, code, adjoint_rows, adjoint_size, target, pairs, gradient) in zip(indices, plans):
            oc.fill_offset_columns(code, self._offsets)
            program = Program(code, slots, self.iattr, self.fattr, self.arena, adjoint_rows, adjoint_size,
                              np.array([target], np.int64), np.array([s for s, _ in pairs], np.int64),
                              tuple(np.zeros(0, np.int64) for _ in pairs))
            found[index] = (kind, program, int(self.slots[target, oc.SIZE]),
                            [(int(self.slots[s, oc.SIZE]), int(self._offsets[out])) for s, out in pairs],
                            int(self._offsets[gradient]) if gradient >= 0 else -1)
        return found

    def _host_step(self, index):
        """Run host step `index` where a replay stopped before it, over the values the replay computed: a
        Hessian's forward-over-reverse sweeps (execute.source_hessian) or a Jacobian's sweep
        (execute.source_jacobians), as a tape runs them, into the derivatives' arena rows; the next call of the
        replay resumes after it."""
        kind, program, n, sources, gradient = self._host_steps[index]
        arena = self.arena
        if kind == "hessian":
            (size, offset), = sources
            cotangents = unit_cotangents(program)
            if gradient >= 0:
                (block,) = source_blocks(program, cotangents)
                arena[gradient:gradient + size] = 0 if block is None else block[:, 0]
            hessian = arena[offset:offset + size * size]
            if source_hessian(program, size, cotangents=cotangents, out=hessian.reshape(size, size)) is None:
                hessian[:] = 0          # a loaded step whose target does not depend on its source
        else:
            found = source_jacobians(program, n, [_Source(size, self.dtype) for size, _ in sources])
            for jacobian, (size, offset) in zip(found, sources):
                arena[offset:offset + n * size] = 0 if jacobian is None else jacobian.reshape(-1)
        self._resume[0] = index

    def _completed(self, replay):
        """Call a bound replay to its end, running the host steps it stops at: whether every guard held."""
        status = replay()
        while status >= 0:
            self._host_step(status)
            status = replay()
        return status == REPLAY_HELD

    def _converted(self, dtype):
        """`dtype` where values of the arena's dtype must be converted to it, else None."""
        dtype = np.dtype(dtype)
        return None if dtype == self.dtype else dtype

    def _bounds(self, slot):
        offset = int(self._offsets[slot])
        return offset, offset + int(self.slots[slot, oc.SIZE])

    def _span(self, slot):
        return slice(*self._bounds(slot))

    def variables_hold(self):
        """The guard on variables no instruction reads (integer counters): the values traced with."""
        return all(np.array_equal(v._value, expected) for v, expected, _ in self.variable_guards)

    def run(self, leaves, backend_name=None, purpose=None):
        """Replay on the flat argument leaves: fill the inputs, one compiled call. False when a guard differs
        (nothing written then), else True with the arena holding every value of the call. With a `purpose`
        bound by bind_gradient, the call also takes that gradient (self.ran says whether it did); with OUTPUTS,
        the arena holds only the outputs, guards and writes after it (see replayer)."""
        self.ran = None
        if self._holds is not None and not self._holds():
            return False
        self.runs += 1
        if self._pending_kernels:
            self._compile_kernels_when_due()
        arena = self.arena
        last_args = self._last_args
        for k, (i, start, stop, scalar) in enumerate(self._arg_spans) if last_args else ():
            leaf = leaves[i]
            kept = type(leaf) is Tensor
            if kept and last_args[k] is not None and last_args[k]() is leaf:
                continue
            last_args[k] = None
            value = leaf._value if isinstance(leaf, Tensor) else leaf
            if scalar:
                arena[start] = value
            else:
                arena[start:stop] = value.reshape(-1)
            if kept:
                last_args[k] = weakref.ref(leaf)
        seen, self._seen_changes = self._seen_changes, None     # this run may write variables' rows
        if seen != Variable._changes:       # else no variable changed since the last finish()
            versions = self._seen_versions
            for k, (variable, start, stop, scalar) in enumerate(self._variable_spans):
                if seen is not None and self._reusable[k] and variable._version == versions[k]:
                    continue
                if scalar:
                    arena[start] = variable._value
                else:
                    arena[start:stop] = variable._value.reshape(-1)
                versions[k] = variable._version
        name = config.backend if backend_name is None else backend_name
        if purpose is not None and purpose != OUTPUTS:
            replay = self._replayers.get((name, purpose))
            if replay is not None:
                if self._references(purpose) != self._unlent[purpose]:
                    # a gradient lent from the buffer lives (see gradients): this run takes a fresh one
                    adjoint, rows = self._gradient_rows[purpose]
                    self._bind(purpose, np.empty_like(adjoint), rows)
                    replay = self._replayers[name, purpose]
                self.ran = purpose
                return self._completed(replay)
        lean = purpose == OUTPUTS and not self._fuses
        replay = self._replayers.get((name, OUTPUTS) if lean else name)
        return self._completed(replay if replay is not None else self.replayer(backend_name, lean))

    def replayer(self, backend_name=None, lean=False):
        """The replay of this variant's arrays on a backend (default jt.config.backend's), bound once. lean: for
        a variant whose replays keep every value (differentiated or loaded: tapes recording its calls read them),
        the replay of calls that need only the outputs, guards and writes, running fused groups on the canonical
        layout (as a bound gradient's replays do)."""
        device = backends.current(backend_name)
        fused, places, scratch = self._fused, self._places, self._scratch
        if lean:
            fused, places, n_scratch = fused_groups(self.code, self.slots, self.iattr, self._steps[:, 0],
                                                    self._step_code, self._live)
            n_stash = self._scratch.size - self._scratch_blocks * BLOCK
            scratch = np.empty(max(n_scratch, self._scratch_blocks) * BLOCK + n_stash, self.dtype)
        kernels = self._group_kernels(device, self._run_code, self._step_code, fused, places, self._step_groups,
                                      self._step_places, self._step_scalars)
        replay = self._replayers[(device.name, OUTPUTS) if lean else device.name] = device.bind_replay(
            self._run_code, self.slots, self.iattr, self.fattr, self.arena, self._steps, self._step_code, self._moves,
            self._adjoint, self._guards, self._expected, fused, places, scratch,
            device.replay_temps(self._run_code, self._step_code, self.iattr, 1, self.dtype), self._step_groups,
            self._step_places, self._scalars, self._step_scalars, kernels.table, kernels.args, self._resume)
        return replay

    def _group_kernels(self, device, run_code, step_code, fused, places, step_groups, step_places, step_scalars):
        """The generated kernels of a layout's fused groups and its gradient steps' fused reverse groups on
        `device`, compiled by run() once this variant has run jt.config.fused_kernel_runs times (at once where it
        has)."""
        kept = np.zeros(self.slots.shape[0], np.bool_)      # read after the forward rows
        kept[self._live] = True
        read = step_code[:, [oc.OUT, oc.IN0, oc.IN1, oc.IN2]]
        kept[read[read >= 0]] = True
        kernels = device.group_kernels(run_code, self.slots, self.iattr, fused, places, self.dtype, kept, step_code,
                                       step_groups, step_places, step_scalars[:, SC_FLAGS])
        if kernels.pending:
            self._pending_kernels.append(kernels)
            self._compile_kernels_when_due()
        return kernels

    def _compile_kernels_when_due(self):
        due = config.fused_kernel_runs
        if due is not None and self.runs >= due:
            for kernels in self._pending_kernels:
                kernels.compile()
            self._pending_kernels = []

    def bound(self, purpose, backend_name=None):
        """Whether run(..., purpose) takes `purpose`'s gradient in its call (see bind_gradient)."""
        return (config.backend if backend_name is None else backend_name, purpose) in self._replayers

    def bind_gradient(self, purpose, target, sources, dtypes, backend_name=None, columns=1):
        """Bind, as `purpose`, a replay that ends with the reverse sweep of `target` w.r.t. `sources` (slots; -1:
        f never reads it) as one more gradient step, its results left in its adjoint rows: a jt.grad (columns
        1, a scalar target) or jt.jacobian (columns = the target's size) call is then one compiled call.
        gradients(purpose) reads them, as arrays of `dtypes` (one per source: the variant fixes them)."""
        if columns > 1 and self.gradient_steps:
            raise ValueError("Concrete.bind_gradient: a Jacobian step needs a variant without gradient steps")
        program, code, flags = self._derivative([target], sources)
        rows = [int(program.adjoint_rows[s]) if s >= 0 else -1 for s in sources]
        n_code, n_moves = self._step_code.shape[0], self._moves.shape[0]
        step = [self.code.shape[0], n_code, n_code + code.shape[0], program.adjoint_rows[target],
                self.slots[target, oc.SIZE], n_moves, n_moves + len(sources), target]
        moves = [[row, self.slots[s, oc.SIZE] if row >= 0 else 0, -1, max(s, 0)] for row, s in zip(rows, sources)]
        adjoint_shape = (max(self._adjoint.shape[0], program.adjoint_size), columns)
        device = backends.current(backend_name)
        steps, step_code = np.vstack([self._steps, [step]]), np.vstack([self._step_code, code])
        fused, places, n_scratch = self._fused, self._places, self._scratch_blocks
        if not self._fuses:
            # a differentiated variant keeps every value for its other uses; this purpose's replays need only
            # the outputs and what the gradient steps read: fused groups on the canonical layout
            fused, places, n_scratch = fused_groups(self.code, self.slots, self.iattr, steps[:, 0], step_code,
                                                    self._live)
        self.purpose_layouts[purpose] = fused, places
        moves = np.vstack([self._moves, np.array(moves, np.int64).reshape(-1, 4)])
        step_groups, step_places, n_reverse = reverse_groups(step_code, steps, self.slots, self.iattr, moves)
        run_code, n_stash = self._run_code, 0
        if columns == 1:
            run_code, step_code, n_stash = logsumexp_stashes(run_code, step_code, self.slots)
        scratch = np.empty(max(n_scratch, n_reverse) * BLOCK + n_stash, self.dtype)
        step_scalars = scalar_runs(step_code, self.slots, steps=steps,
                                   flags=np.concatenate([self._step_flags, flags]))
        # a Jacobian's step (K columns) runs its rows one by one: no reverse group's kernel
        kernels = self._group_kernels(device, run_code, step_code, fused, places,
                                      step_groups if columns == 1 else np.zeros_like(step_groups), step_places,
                                      step_scalars)
        self._bindings[purpose] = (device, [run_code, self.slots, self.iattr, self.fattr, self.arena, steps,
                                            step_code, moves, None, self._guards, self._expected, fused, places,
                                            scratch, device.replay_temps(run_code, step_code, self.iattr,
                                                                         columns, self.dtype), step_groups,
                                            step_places, self._scalars, step_scalars, kernels.table,
                                            kernels.args, self._resume])
        # a new buffer no local name holds: _bind counts its references
        self._bind(purpose, np.empty(adjoint_shape, self.dtype), [(row, int(self.slots[s, oc.SIZE]), np.dtype(dtype))
                                                                  for row, s, dtype in zip(rows, sources, dtypes)])

    def _bind(self, purpose, adjoint, rows):
        """Bind `purpose`'s replay (see bind_gradient) to `adjoint`, its gradients' buffer."""
        device, arrays = self._bindings[purpose]
        arrays[_ADJOINT] = adjoint
        self._replayers[device.name, purpose] = device.bind_replay(*arrays)
        arrays[_ADJOINT] = None
        self._gradient_rows[purpose] = (adjoint, rows)
        self._gradient_reads[purpose] = [self._read(row, size, dtype, adjoint.shape[1]) for row, size, dtype in rows]
        del adjoint
        self._unlent[purpose] = self._references(purpose)

    def _read(self, row, size, dtype, columns):
        """How gradients() reads a source's gradient (see there) from the adjoint buffer: a function of it."""
        if row < 0:
            return _unreached
        if columns == 1 and size == 1:
            return operator.itemgetter((row, 0)) if dtype == self.dtype else lambda adjoint: dtype.type(adjoint[row, 0])
        if columns == 1 and size >= VIEWS_FROM and dtype == self.dtype:
            return lambda adjoint: _lent(adjoint[row:row + size, 0])
        return lambda adjoint: adjoint[row:row + size].T.astype(dtype)

    def _references(self, purpose):
        """The references to `purpose`'s adjoint buffer, counted as run() counts them: more than when it was bound
        while a gradient lent from it lives."""
        adjoint = self._gradient_rows[purpose][0]
        return sys.getrefcount(adjoint)

    def gradients(self, purpose):
        """What the last run took as `purpose` (see bind_gradient): per source, a new [columns, size] array of
        its dtype, a numpy scalar for one column of one entry, a read-only [size] view of the adjoint buffer for
        one column of at least VIEWS_FROM entries in the arena's dtype (lent: see run), None where the source is
        unreached."""
        adjoint = self._gradient_rows[purpose][0]
        return [read(adjoint) for read in self._gradient_reads[purpose]]

    def failed_guard(self):
        """The description of the first guard the last run broke."""
        for slot, expected, how in self.slot_guards:
            if not np.array_equal(self.arena[self._span(slot)], expected, equal_nan=True):
                return how
        for v, expected, how in self.variable_guards:
            if not np.array_equal(v._value, expected):
                return how
        return None

    def finish(self):
        """The outputs of the last run, after writing the variables it assigns."""
        arena = self.arena
        self.finished = self.runs       # the deferred values' rows hold this run's values
        versions = self._seen_versions
        if self._deferred_writes:
            Variable._defer(self._deferred_writes, versions)
        for variable, constant, start, stop, shape, dtype, k in self._write_spans:
            if constant is not None:
                variable._value = constant.astype(variable._value.dtype).reshape(variable._value.shape)[()]
            elif not shape:         # 0-d: a numpy scalar, immutable, so never written in place
                variable._value = arena[start] if dtype is None else dtype.type(arena[start])
            elif _overwrite(variable._value, arena, start, stop):
                variable._changed()     # changed in place
            else:
                variable._value = _entries(arena, start, stop, shape, dtype)
            if k >= 0:
                versions[k] = variable._version
        if self._reuses:        # the variables' values are in the arena until the next run writes it
            # (-1, never the count: some variable's new value is not in the rows the replay reads it from)
            self._seen_changes = Variable._changes if self._rows_hold_reads else -1
        if self._single_output:
            constant, start, stop, shape, dtype = self._output_spans[0]
            return constant if start < 0 else Tensor(_entries(arena, start, stop, shape, dtype))
        leaves = [constant if start < 0 else Tensor(_entries(arena, start, stop, shape, dtype))
                  for constant, start, stop, shape, dtype in self._output_spans]
        return nest.pack_like(self.structure, leaves)

    def program(self, targets, sources):
        """The derivative Program of `targets` w.r.t. `sources` (slots) over this variant's arena: planned once
        and kept (its arena is the one every run fills)."""
        return self._derivative(targets, sources)[0]

    def _derivative(self, targets, sources):
        """(program(targets, sources), the rows and flags of a sweep that only runs reverse over it:
        planning.derivative_plan's forwarded ones)."""
        if self._fuses:
            raise ValueError("Concrete.program: this variant replays in its run layout, which keeps only outputs, "
                             "guards and writes; derivatives use the Function's twin() (traced to be differentiated)")
        key = (tuple(targets), tuple(sources))
        planned = self._plans.get(key)
        if planned is None:
            code, adjoint_rows, adjoint_size, _, forwarded, flags = derivative_plan(
                self.code, self.slots, np.array(targets, np.int64), np.array(sources, np.int64))
            program = Program(code, self.slots, self.iattr, self.fattr, self.arena, adjoint_rows, int(adjoint_size),
                              np.array(targets, np.int64), np.array(sources, np.int64),
                              tuple(np.zeros(0, np.int64) for _ in sources))
            planned = self._plans[key] = (program, forwarded, flags)
        return planned


def _shared_values(rows, slot_rows, iattr, fattr, values, inputs, step_views):
    """(per slot, the slot holding its value; which rows to keep) once equal constants of at most
    SHARED_CONSTANT_SIZE entries (values: per slot; inputs: the slots of arguments and variables, never constants;
    nor is a step's source) are one, and every row that recomputes an earlier row's value (the same op of the
    same inputs' values, attribute values and output shape and dtype; not a concat's PLACE row) is dropped, its
    output read from the earlier row's. Rows are pure, so the values are equal; but a step (step_views: per step
    row's output, the slots its inner tape computed) differentiates the rows its tape recorded and takes every
    other value as a constant, so two rows are one only where each step sees them alike: both or neither
    recorded, or the one its tape did not record is not read by its tape's rows, its target or its source (its
    tape took that value as a constant)."""
    n_slots = slot_rows.shape[0]
    step_rows = rows[rows[:, 0] < 0].tolist()
    recorded, read = [], []
    for view in {id(view): view for view in step_views.values()}.values():
        member = np.zeros(n_slots, np.bool_)
        member[view] = True
        reads = np.zeros(n_slots, np.bool_)
        ins = rows[member[rows[:, 1]], 2:5]
        reads[ins[ins >= 0]] = True
        reads[[s for row in step_rows if step_views[row[1]] is view for s in row[2:4]]] = True
        recorded.append(member)
        read.append(reads)
    same = np.arange(n_slots)
    kept = np.ones(rows.shape[0], np.bool_)
    placed = np.zeros(n_slots, np.bool_)
    placed[rows[rows[:, 0] == oc.PLACE, 1]] = True
    first_of = {}
    varying = np.zeros(n_slots, np.bool_)       # not a constant: computed by a row, an input, a step's source
    varying[rows[:, 1]] = True
    varying[inputs] = True
    varying[[row[3] for row in step_rows]] = True
    for s in np.flatnonzero(~varying & (slot_rows[:, 0] <= SHARED_CONSTANT_SIZE)).tolist():
        value = np.asarray(values[s])
        same[s] = first_of.setdefault((value.dtype.str, value.shape, value.tobytes()), s)
    for r, (op, out, in0, in1, in2, attr) in enumerate(rows.tolist()):
        if op < 0 or placed[out]:
            continue
        key = (op, *(int(same[s]) if s >= 0 else -1 for s in (in0, in1, in2)), slot_rows[out].tobytes(),
               _attribute_values(op, attr, iattr, fattr))
        first = first_of.setdefault(key, out)
        if first != out and all(member[first] == member[out] or not reads[first if member[out] else out]
                                for member, reads in zip(recorded, read)):
            same[out] = first
            kept[r] = False
    return same, kept


SHARED_CONSTANT_SIZE = 64      # larger constants are rarely recorded twice: not worth hashing


def _attribute_values(op, attr, iattr, fattr):
    """A recorded row's attribute block (at `attr` of the trace's pools; -1: none) as a hashable value, its
    floats by value."""
    if attr < 0:
        return ()
    length = _FIXED_ATTRIBUTE_LENGTH[op]
    if length < 0:
        length = oc.attribute_length(op, iattr, attr)
    block = iattr[attr:attr + length].tobytes()
    count = _FLOAT_COUNT[op]
    return block if count == 0 else (block[8:], fattr[iattr[attr]:iattr[attr] + count].tobytes())


class _Source:
    """What execute.source_jacobians reads of a source tensor: its size, and the dtype of its Jacobian."""
    __slots__ = ("size", "dtype")

    def __init__(self, size, dtype):
        self.size, self.dtype = size, dtype


def derivative_size(kind, n, size):
    """The entries of a host step's derivative (HOST_STEP_KINDS' `kind`) of an n-entry target w.r.t. a source of
    `size` entries."""
    return size * size if kind == "hessian" else n * size


def _unreached(adjoint):
    return None


def _lent(view):
    """A large gradient as a read-only view of its replay's adjoint buffer, not a copy: while it lives, the
    replay takes a fresh buffer (Concrete.run counts the buffer's references)."""
    view.flags.writeable = False
    return view


_ADJOINT = 8        # the adjoint buffer's place among replay_sweep's arrays


def _entries(arena, start, stop, shape, dtype):
    """A new value of `shape` holding arena[start:stop] (0-d: a numpy scalar), as `dtype` (None: the arena's)."""
    if not shape:
        return arena[start] if dtype is None else dtype.type(arena[start])
    value = recycling.fresh(shape, arena.dtype if dtype is None else dtype)     # a large one: no page faults
    np.copyto(value, arena[start:stop].reshape(shape), casting="unsafe")
    return value


class _Held:
    """An object holding a value by one attribute, as a variable does."""
    def __init__(self):
        self.value = np.zeros(1)


def _references_in_callee(value, arena, start, stop):
    return sys.getrefcount(value)


# the references _overwrite counts to a value that one attribute alone holds, passed as finish() passes it
_held = _Held()
_UNSHARED = _references_in_callee(_held.value, None, 0, 0)
del _held


class _ArenaValue:
    """A variable's value left in a replay's arena rows (Variable._defer), one per such write of a variant: taking
    it writes it into the variable's stored value where nothing else sees that (_overwrite), else into a new array
    (0-d: a numpy scalar). Every run of the variant ends with finish(); a run that did not would have written over
    the value, and taking it then raises rather than give a wrong one."""
    __slots__ = ("concrete", "start", "stop")

    def __init__(self, concrete, start, stop):
        self.concrete, self.start, self.stop = concrete, start, stop

    def __call__(self, variable):
        if self.concrete.runs != self.concrete.finished:
            raise RuntimeError(f"the value of variable {variable.name!r} was left in a replay's arena, and the "
                               "replay ran again without writing its variables: it is lost")
        arena, start, stop = self.concrete.arena, self.start, self.stop
        # the stored value passed as finish() passes it, so that _overwrite counts its references alike
        if _overwrite(_slot_value(variable), arena, start, stop):
            return _slot_value(variable)
        return _entries(arena, start, stop, _slot_value(variable).shape, None)


def _overwrite(value, arena, start, stop):
    """Write arena[start:stop] into a variable's `value` in place when nothing else can see it: an array of the
    arena's dtype that owns its data and that no other object references (a Tensor read from the variable, a
    view, a caller's name all hold references). A training step then allocates no new parameters."""
    if type(value) is not np.ndarray or value.base is not None or value.dtype != arena.dtype \
            or not value.flags.c_contiguous or not value.flags.writeable or sys.getrefcount(value) != _UNSHARED:
        return False
    value.reshape(-1)[:] = arena[start:stop]
    return True


def _compacted_attributes(code, iattr, fattr):
    """The attribute pools holding only the blocks of `code`'s instructions (whose ATTR column is rewritten):
    a trace's pools also hold the blocks of the rows its Program does not keep. Gathered at once, not block by
    block (a thousand blocks of a W1 trace took 2 ms)."""
    rows = np.flatnonzero(code[:, oc.ATTR] >= 0)
    ops, starts = code[rows, oc.OP], code[rows, oc.ATTR]
    lengths = _FIXED_ATTRIBUTE_LENGTH[ops]
    for i in np.flatnonzero(lengths < 0).tolist():
        lengths[i] = oc.attribute_length(int(ops[i]), iattr, int(starts[i]))
    new_starts = np.cumsum(lengths) - lengths
    compacted = iattr[np.repeat(starts - new_starts, lengths) + np.arange(int(lengths.sum()))]
    # a block with floats leads with their fattr index: its floats move along
    counts = _FLOAT_COUNT[ops]
    with_floats = new_starts[counts > 0]
    counts = counts[counts > 0]
    float_starts = np.cumsum(counts) - counts
    floats = fattr[np.repeat(compacted[with_floats] - float_starts, counts) + np.arange(int(counts.sum()))]
    compacted[with_floats] = float_starts
    code[rows, oc.ATTR] = new_starts
    return compacted, floats


_FIXED_ATTRIBUTE_LENGTH = np.array(oc.FIXED_ATTRIBUTE_LENGTH, np.int64)
_FLOAT_COUNT = np.array(oc.FLOAT_COUNT, np.int64)


class Function:
    """A Python function traced per input signature and replayed in compiled code (see jt.function)."""
    has_python = True       # a loaded function (saving.LoadedFunction) has only its Programs

    def __init__(self, python_function, retrace_warning=None, backend=None, differentiated=False):
        functools.update_wrapper(self, python_function)
        self.python_function = python_function
        self.retrace_warning = retrace_warning
        self.backend = backends.check_name(backend)
        # replays that jt.grad and friends differentiate: inner gradients are traced as recorded VJPs
        self.differentiated = differentiated
        self.trace_count = 0
        self._variants = {}         # signature -> [Concrete, ...], the last one to succeed first
        self._last_key = None
        self._warned = False

    def __get__(self, instance, owner):
        # a jt.function used as a method: one Function per bound instance
        if instance is None:
            return self
        bound = instance.__dict__.get(f"_jt_function_{id(self)}")
        if bound is None:
            bound = Function(self.python_function.__get__(instance, owner), self.retrace_warning, self.backend,
                             self.differentiated)
            instance.__dict__[f"_jt_function_{id(self)}"] = bound
        return bound

    def __call__(self, *args, **kwargs):
        if _traces.active:
            return self.python_function(*args, **kwargs)       # inside another trace: inlined there
        if _state.recording:
            return calls.recorded_call(self, args, kwargs)     # one op on the tapes that track its inputs
        key, leaves = signature(args, kwargs)
        variants = self._variants.get(key)
        if variants is not None and variants[0].run(leaves, self.backend, OUTPUTS):
            return variants[0].finish()     # the common call, in short
        concrete, _, traced = self._replay(key, leaves, args, kwargs, OUTPUTS, first=int(variants is not None))
        return concrete.finish() if traced is None else traced[0]

    def twin(self):
        """The Function whose replays tapes differentiate: traced with inner gradients as recorded VJPs, not as
        compiled gradient steps (itself when it is so already, or has no Python to trace). Its traces count in
        this function's trace_count."""
        if self.differentiated or not self.has_python:
            return self
        twin = self.__dict__.get("_twin")
        if twin is None:
            twin = self._twin = self.sibling(self.python_function)
            twin._counted_by = self
        return twin

    def sibling(self, python_function):
        """A differentiable Function of `python_function` with this one's settings."""
        return Function(python_function, self.retrace_warning, self.backend, differentiated=True)

    def replay(self, args, kwargs, purpose=None, sweeps=(), bound_later=False):
        """(the variant that ran, the flat argument leaves, None) with the variant's arena holding every value
        of the call and its variable writes not yet done; when this call traced, the variant traced, its
        arena holding the call's values, and (the outputs,): the call already ran in Python. purpose: a
        gradient the variant may have bound (Concrete.bind_gradient) to take in the same call, or OUTPUTS
        (see Concrete.run). sweeps: those a call that traces runs next (see Backend.cold_start). bound_later: the
        caller binds `purpose` after a call that traced, and later calls replay that: a variant traced then binds
        no plain replay now (its table, groups and scratch: ~1.8 ms of W1's first jt.grad, never run)."""
        key, leaves = signature(args, kwargs)
        return self._replay(key, leaves, args, kwargs, purpose, sweeps=sweeps, bound_later=bound_later)

    def _replay(self, key, leaves, args, kwargs, purpose, first=0, sweeps=(), bound_later=False):
        """replay() of the signature's (key, leaves), trying its variants from the `first`."""
        variants = self._variants.get(key)
        why = None
        if variants is not None:
            for i in range(first, len(variants)):
                concrete = variants[i]
                if concrete.run(leaves, self.backend, purpose):
                    if i:
                        variants.insert(0, variants.pop(i))
                    return concrete, leaves, None
            why = f"the guard on {variants[0].failed_guard()} changed"
        else:
            why = self._new_signature(key)
        concrete, out = self._trace(key, args, kwargs, leaves, why, sweeps, bound_later)
        return concrete, leaves, (out,)

    def _new_signature(self, key):
        previous = self._last_key
        self._last_key = key
        if previous is None:
            return None
        if previous[0] != key[0] or len(previous[1]) != len(key[1]):
            return "the arguments' nest structure changed"
        for i, (a, b) in enumerate(zip(previous[1], key[1])):
            if a != b:
                return f"argument leaf {i} changed ({_describe(a)} -> {_describe(b)})"
        return None

    def _trace(self, key, args, kwargs, leaves, why, sweeps, bound_later=False):
        self.trace_count += 1
        counted_by = self.__dict__.get("_counted_by")
        if counted_by is not None:
            counted_by.trace_count += 1
        limit = config.retrace_warning if self.retrace_warning is None else self.retrace_warning
        if self.trace_count > limit and not self._warned:
            self._warned = True
            warnings.warn(f"jt.function {self.__name__!r} traced {self.trace_count} times"
                          + (f"; last because {why}" if why else "")
                          + ": pass tensors rather than Python numbers, or keep shapes fixed", stacklevel=4)
        trace = _Trace(compiled_gradients=not self.differentiated)
        inputs = [Tensor(np.array(getattr(leaf, "_value", leaf))[()]) if _is_input(leaf) else leaf
                  for leaf in leaves]
        traced_args, traced_kwargs = nest.pack_like((args, kwargs), inputs)
        trace.watch([t for t in inputs if _is_input(t)])
        arg_slots = [(i, trace._slot(t)) for i, t in enumerate(inputs) if _is_input(t)]
        trace._push()
        _traces.active.append(trace)
        try:
            out = self.python_function(*traced_args, **traced_kwargs)
        finally:
            _traces.active.remove(trace)
            trace._pop()
        sweeps = ("replay unfused" if self.differentiated else "replay", *sweeps,
                  *(("steps",) if trace.takes_gradients else ()))
        backends.current(self.backend).cold_start(trace._rows, trace._slot_rows, sweeps)
        # a replay nothing differentiates runs the run layout (its arena then holds only outputs, guards, writes)
        concrete = Concrete(trace, arg_slots, out, nest.flatten(out), fuse=not self.differentiated)
        if not bound_later:
            concrete.replayer(self.backend)     # bound now: a replay does no one-time work
        self._variants.setdefault(key, []).insert(0, concrete)
        return concrete, out

    def concrete(self, *args, **kwargs):
        """The traced variant a call with these arguments runs (traced now if needed; the call runs, its
        variable writes included)."""
        concrete, _, traced = self.replay(args, kwargs)
        if traced is None:
            concrete.finish()
        return concrete


def _describe(leaf_key):
    kind = leaf_key[0]
    if kind == "array":
        return f"shape {leaf_key[1]} dtype {np.dtype(leaf_key[2]).name}"
    if kind == "python":
        return f"Python {leaf_key[1]} {leaf_key[2]!r}"
    if kind == "value":
        return "the value of a non-float array"
    return kind


def function(func=None, *, retrace_warning=None, backend=None):
    """Trace `func` into a Program per input signature and replay it in compiled code afterwards.

    The signature is the nest structure of the arguments, the shapes and dtypes of float tensors and
    arrays (their values are inputs), and the values of everything else. Variables read inside are inputs;
    variables assigned inside are written by every call. Python control flow on tensor values is guarded:
    a call whose guards differ from a traced variant's traces again. A warning names the cause when a
    function traces more than `retrace_warning` (default jt.config.retrace_warning) times. `backend` names
    the backend its replays run on (default jt.config.backend's).

    >>> import jitape as jt
    >>> @jt.function
    ... def f(x):
    ...     return jt.reduce_sum(jt.where(x > 0, x * x, -x))
    >>> float(f(jt.constant([1.0, -2.0]))), float(f(jt.constant([-0.5, 1.5])))
    (3.0, 2.75)
    >>> f.trace_count
    1
    """
    if func is None:
        return lambda f: Function(f, retrace_warning, backend)
    return Function(func, retrace_warning, backend)

