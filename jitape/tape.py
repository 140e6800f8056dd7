"""GradientTape and the thread-local recording stack.

A tape records each op whose inputs it tracks twice over: as a Python record
(primitive, inputs, output, params) for the Python VJP path that nested tapes
need, and as flat integer rows plus the recorded values, which lower to a
Program without any Python per op (see program.py).
"""
import enum
import functools
import math
import threading
import warnings
from array import array
from contextlib import contextmanager

import numpy as np

from jitape_kernels import opcodes as oc

from . import nest
from .tensor import Tensor, Variable, VariableRead

_PAD = tuple((1,) * (oc.MAXRANK - r) for r in range(oc.MAXRANK + 1))


@functools.lru_cache(maxsize=1024)
def _slot_row(shape, is_float64):
    """The recorded slot row of a value: size, rank, is_float64, dims padded with ones."""
    rank = len(shape)
    if rank > oc.MAXRANK:
        raise ValueError(f"jitape records tensors of rank at most {oc.MAXRANK}, got shape {shape}")
    return (math.prod(shape), rank, is_float64) + shape + _PAD[rank]


_SCALAR_ROWS = (_slot_row((), False), _slot_row((), True))   # 0-d values (scalar chains) skip the cache lookup


class UnconnectedGradients(enum.Enum):
    """What `gradient` returns for a source the target does not depend on."""
    NONE = "none"
    ZERO = "zero"


class _State(threading.local):
    def __init__(self):
        self.recording = []


_state = _State()


def recording_tapes():
    """The tapes recording in this thread, innermost last."""
    return _state.recording


class GradientTape:
    """Records operations on watched tensors so that gradients can be taken afterwards.

    >>> import jitape as jt
    >>> x = jt.constant(3.0)
    >>> with jt.GradientTape() as tape:
    ...     tape.watch(x)
    ...     y = x * x
    >>> tape.gradient(y, x)
    jitape.Tensor(6.0, shape=(), dtype=float32)
    """

    def __init__(self, persistent=False, watch_accessed_variables=True):
        self._persistent = bool(persistent)
        self._watch_accessed_variables = bool(watch_accessed_variables)
        self._recording = False
        self._used = False
        self._clear()

    def _clear(self):
        self._records = []              # (primitive, inputs, output, params) for Python VJPs
        self._rows = array("q")         # 6 ints per instruction: op, out, in0, in1, in2, attr
        self._slot_rows = array("q")    # 3 + MAXRANK ints per slot: size, rank, is_float64, dims
        self._iattr = array("q")
        self._fattr = array("d")
        self._values = []               # recorded value of each slot
        self._slot_of = {}              # tensor id -> slot
        self._tracked = set()           # ids of watched tensors and of recorded outputs
        self._variables = {}            # id -> watched Variable, in watch order
        self._aliases = {}              # variable id -> its earlier slots (values before an assignment)
        self._programs = {}             # lowered Programs of a persistent tape (program.lower)

    # -- context ---------------------------------------------------------------------------
    def __enter__(self):
        self._push()
        return self

    def __exit__(self, *exc):
        self._pop()
        return False

    def _push(self):
        if self._recording:
            raise ValueError("GradientTape is already recording: a tape cannot be entered twice")
        _state.recording.append(self)
        self._recording = True

    def _pop(self):
        stack = _state.recording
        for i in range(len(stack) - 1, -1, -1):
            if stack[i] is self:
                del stack[i]
                break
        self._recording = False

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

    def reset(self):
        """Forget everything recorded so far; the tape keeps recording if it was."""
        self._clear()
        self._used = False

    # -- watching --------------------------------------------------------------------------
    def watch(self, tensor):
        """Track `tensor` (a float Tensor/Variable, or a nested list/tuple/dict of them)."""
        for t in nest.flatten(tensor):
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

    def watched_variables(self):
        """The variables this tape watches, in the order they were first watched."""
        return tuple(self._variables.values())

    # -- recording (called by jitape.ops.core.emit) ----------------------------------------
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
        is_float64 = v.dtype.itemsize == 8
        row = _SCALAR_ROWS[is_float64] if shape == () else _slot_row(shape, is_float64)   # may raise: before any change
        slot = len(self._values)
        self._values.append(v)
        self._slot_rows.extend(row)
        self._slot_of[t._id] = slot
        return slot

    def _attr(self, iblock, fblock):
        if fblock:
            iblock = (len(self._fattr),) + iblock
            self._fattr.extend(fblock)
        if not iblock:
            return -1
        start = len(self._iattr)
        self._iattr.extend(iblock)
        return start

    def _record(self, prim, inputs, out, params, opcode, iblock, fblock):
        # the hot path of eager recording: known slots looked up inline, outputs always get a new slot
        if not self._connected(inputs):
            return
        get = self._slot_of.get
        ins = [-1, -1, -1]
        reads_variable = False
        for i, t in enumerate(inputs):
            if t._is_variable:
                reads_variable = True
                ins[i] = self._slot(t)
            else:
                slot = get(t._id)
                ins[i] = self._new_slot(t) if slot is None else slot
        attr = self._attr(iblock, fblock) if iblock or fblock else -1
        self._rows.extend((opcode, self._new_slot(out), ins[0], ins[1], ins[2], attr))
        self._records.append((prim, _snapshots(inputs) if reads_variable else inputs, out, params))
        self._tracked.add(out._id)

    def _record_rows(self, prim, inputs, out, params, rows):
        """Record one op lowered to several rows: `rows` is ((opcode, input positions, iblock), ...)."""
        if not self._connected(inputs):
            return
        slots = [self._slot(t) for t in inputs]
        out_slot = self._slot(out)
        for opcode, positions, iblock in rows:
            ins = [slots[p] for p in positions] + [-1] * (3 - len(positions))
            self._rows.extend((opcode, out_slot, ins[0], ins[1], ins[2], self._attr(iblock, ())))
        self._records.append((prim, _snapshots(inputs), out, params))
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

    def gradient(self, target, sources, output_gradients=None,
                 unconnected_gradients=UnconnectedGradients.NONE):
        """d(sum of target)/d(sources), shaped like `sources`.

        The compiled reverse sweep runs unless a tape is recording, in which case
        the Python VJP rules run so the gradient is itself recorded (higher order).
        """
        if self._used:
            raise RuntimeError("GradientTape.gradient can only be called once on non-persistent tapes.")
        unconnected = _unconnected_mode(unconnected_gradients)
        targets = _target_list(target)
        seeds = _seed_list(targets, output_gradients)
        flat_sources = _source_list(sources, "gradient")
        float_sources = []
        for s in flat_sources:
            if s.dtype.kind == "f":
                float_sources.append(s)
            else:
                warnings.warn(f"GradientTape.gradient: the dtype of the source tensor must be floating "
                              f"(float32 or float64), got {s.dtype}; its gradient is None", stacklevel=2)
        if self._must_record(seeds):
            found = self._gradient_recorded(targets, seeds, float_sources)
        else:
            from .execute import lowered, source_gradients
            found = source_gradients(lowered(self, targets, float_sources), seeds, float_sources)
        by_id = dict(zip((s._id for s in float_sources), found))
        results = []
        for s in flat_sources:
            g = by_id.get(s._id)
            if g is None and unconnected is UnconnectedGradients.ZERO and s.dtype.kind == "f":
                g = Tensor(np.zeros_like(s._value)[()])
            results.append(g)
        self._release_if_used_up()
        return nest.pack_like(sources, results)

    def _gradient_recorded(self, targets, seeds, sources):
        """Reverse accumulation in Python over the records, with VJPs written in jitape ops."""
        from .ops import add
        records = self._records[:]
        active = {s._id for s in sources}
        for prim, inputs, out, _ in records:
            if prim.differentiable:         # comparisons pass no derivative on
                for t in inputs:
                    if t._id in active:
                        active.add(out._id)
                        break
        grads = {}
        for t, seed in zip(targets, seeds):
            if t._id in active:
                seed = seed if isinstance(seed, Tensor) else Tensor(seed)
                grads[t._id] = add(grads[t._id], seed) if t._id in grads else seed
        for prim, inputs, out, params in reversed(records):
            g = grads.get(out._id)
            if g is None:
                continue
            wants = tuple(t._id in active for t in inputs)
            for t, gi in zip(inputs, prim.vjp(g, out, inputs, params, wants)):
                if gi is not None and t._id in active:
                    grads[t._id] = add(grads[t._id], gi) if t._id in grads else gi
        return [grads.get(s._id) for s in sources]

    def jacobian(self, target, sources, unconnected_gradients=UnconnectedGradients.NONE,
                 parallel_iterations=None, experimental_use_pfor=True):
        """d target / d sources, each of shape target.shape + source.shape, from one compiled sweep: reverse
        mode with K = target.size cotangent columns, or forward mode with K = the sources' total size when
        that is smaller.

        >>> import jitape as jt
        >>> x = jt.constant([1.0, 2.0])
        >>> with jt.GradientTape() as tape:
        ...     tape.watch(x)
        ...     y = x * x
        >>> tape.jacobian(y, x).numpy()
        array([[2., 0.],
               [0., 4.]], dtype=float32)
        """
        if self._used:
            raise RuntimeError("GradientTape.jacobian can only be called once on non-persistent tapes.")
        unconnected = _unconnected_mode(unconnected_gradients)
        if not isinstance(target, Tensor):
            raise TypeError(f"GradientTape.jacobian: target must be a single Tensor, got {type(target).__name__}")
        if target.dtype.kind != "f":
            raise TypeError(f"GradientTape.jacobian: target must be float32 or float64, got {target.dtype}")
        flat_sources = _source_list(sources, "jacobian")
        if self._must_record():
            found = self._jacobian_recorded(target, flat_sources)
        else:
            from .execute import lowered, source_jacobians
            program = lowered(self, [target], flat_sources)
            found = [None if j is None else Tensor(j.reshape(target.shape + s.shape)[()])
                     for s, j in zip(flat_sources, source_jacobians(program, target.size, flat_sources))]
        results = []
        for s, j in zip(flat_sources, found):
            if j is None and unconnected is UnconnectedGradients.ZERO:
                j = Tensor(np.zeros(target.shape + s.shape, s.dtype)[()])
            results.append(j)
        self._release_if_used_up()
        return nest.pack_like(sources, results)

    def _jacobian_recorded(self, target, sources):
        """One recorded VJP per target entry, stacked: the Jacobian is itself differentiable."""
        from .ops import reshape, stack
        if target.size == 0:        # no rows to stack: a zero seed says which sources are connected
            found = self._gradient_recorded([target], [np.zeros(target.shape, target.dtype)], sources)
            return [None if g is None else Tensor(np.zeros(target.shape + s.shape, s.dtype))
                    for s, g in zip(sources, found)]
        rows = []
        for i in range(target.size):
            seed = np.zeros(target.size, target.dtype)
            seed[i] = 1
            rows.append(self._gradient_recorded([target], [seed.reshape(target.shape)], sources))
        results = []
        for k, s in enumerate(sources):
            column = [r[k] for r in rows]
            if all(g is None for g in column):
                results.append(None)
                continue
            column = [Tensor(np.zeros_like(s._value)[()]) if g is None else g for g in column]
            results.append(reshape(stack(column), target.shape + s.shape))
        return results

    def batch_jacobian(self, target, source, unconnected_gradients=UnconnectedGradients.NONE,
                       parallel_iterations=None, experimental_use_pfor=True):
        """d target[b] / d source[b] for every batch row b: shape (B,) + target.shape[1:] + source.shape[1:].

        One sweep whose seeds are shared by the rows: reverse with K = target features, or
        forward with K = source features when fewer; raises ValueError when the recorded
        program makes rows depend on each other.
        """
        if self._used:
            raise RuntimeError("GradientTape.batch_jacobian can only be called once on non-persistent tapes.")
        unconnected = _unconnected_mode(unconnected_gradients)
        for what, t in (("target", target), ("source", source)):
            if not isinstance(t, Tensor) or t.dtype.kind != "f":
                raise TypeError(f"GradientTape.batch_jacobian: {what} must be a float Tensor, got {t!r}")
            if t.ndim < 1:
                raise ValueError(f"GradientTape.batch_jacobian: {what} must have rank >= 1 (a leading batch "
                                 f"axis), got shape {t.shape}")
        if target.shape[0] != source.shape[0]:
            raise ValueError(f"GradientTape.batch_jacobian: the first dimensions of target {target.shape} and "
                             f"source {source.shape} must match")
        shape = target.shape + source.shape[1:]
        if target.shape[0] == 0:
            full = Tensor(np.zeros(shape, source.dtype))
        elif self._must_record():
            from .execute import check_rows
            from .program import lower
            check_rows(lower(self, [target], [source]), target.shape[0], "batch_jacobian")
            full = self._batch_jacobian_recorded(target, source, shape)
        else:
            from .execute import source_batch_jacobian
            value = source_batch_jacobian(self, target, source)
            full = None if value is None else Tensor(value.reshape(shape))
        if full is None and unconnected is UnconnectedGradients.ZERO:
            full = Tensor(np.zeros(shape, source.dtype))
        self._release_if_used_up()
        return full

    def _batch_jacobian_recorded(self, target, source, shape):
        """One recorded VJP per target feature, its seed shared by the rows (rows are independent: checked),
        so B rows cost no more passes than one."""
        from .ops import concat, reshape
        batch = target.shape[0]
        features = target.size // batch
        columns = []
        for f in range(features):
            seed = np.zeros((batch, features), target.dtype)
            seed[:, f] = 1
            (g,) = self._gradient_recorded([target], [seed.reshape(target.shape)], [source])
            if g is None:
                return None
            columns.append(reshape(g, (batch, 1, -1)))
        if not columns:
            return Tensor(np.zeros(shape, source.dtype))
        return reshape(concat(columns, axis=1), shape)

    def per_example_gradients(self, target, sources, unconnected_gradients=UnconnectedGradients.NONE):
        """Gradients of each example's loss: target has a leading batch axis (B,) or (B, ...), summed over
        the rest; each result has shape (B,) + source.shape.

        One compiled sweep, about the cost of one gradient: activations keep one
        cotangent column, parameters one per example. Raises ValueError when the
        program mixes batch rows (batch statistics).

        >>> import jitape as jt
        >>> w = jt.Variable([1.0, 2.0])
        >>> x = jt.constant([[1.0, 0.0], [0.0, 3.0]])
        >>> with jt.GradientTape() as tape:
        ...     losses = jt.square(jt.matmul(x, jt.reshape(w, (2, 1))))[:, 0]
        >>> tape.per_example_gradients(losses, w).numpy()
        array([[ 2.,  0.],
               [ 0., 36.]], dtype=float32)
        """
        if self._used:
            raise RuntimeError("GradientTape.per_example_gradients can only be called once on non-persistent "
                               "tapes.")
        unconnected = _unconnected_mode(unconnected_gradients)
        if not isinstance(target, Tensor) or target.dtype.kind != "f" or target.ndim < 1:
            raise TypeError(f"GradientTape.per_example_gradients: target must be a float Tensor with a leading "
                            f"batch axis, got {target!r}")
        flat_sources = _source_list(sources, "per_example_gradients")
        batch = target.shape[0]
        if batch == 0:
            found = [Tensor(np.zeros((0,) + s.shape, s.dtype)) for s in flat_sources]
        elif self._must_record():
            found = self._per_example_recorded(target, flat_sources)
        else:
            from .execute import source_per_example_gradients
            found = [None if g is None else Tensor(g.reshape((batch,) + s.shape))
                     for s, g in zip(flat_sources, source_per_example_gradients(self, target, flat_sources))]
        results = []
        for s, g in zip(flat_sources, found):
            if g is None and unconnected is UnconnectedGradients.ZERO:
                g = Tensor(np.zeros((batch,) + s.shape, s.dtype))
            results.append(g)
        self._release_if_used_up()
        return nest.pack_like(sources, results)

    def _per_example_recorded(self, target, sources):
        """Per-example gradients with recorded VJPs, in passes that do not grow with B: one pass gives the
        row cotangents at the junctions where rows meet parameters (rows are independent, so row b's cotangent
        is example b's); each example's share there is a batched op; a parameter computed from a source by
        parameter-only ops adds the recorded Jacobian of that computation (its size in passes)."""
        from jitape_kernels.cpu.batch import JUNCTION
        from .execute import per_example_program
        from .ops import add, matmul, reshape
        planned = per_example_program(self, target, sources)       # the compiled path's checks and plan
        if planned is None:
            return [None] * len(sources)
        program, (_, _, modes, _, _, _, layouts) = planned
        batch = target.shape[0]
        tensors = {self._slot_of[t._id]: t for _, inputs, out, _ in self._records for t in (*inputs, out)
                   if not t._is_variable}
        junctions = [r for r in range(len(program)) if modes[r] == JUNCTION]
        outs = [tensors[program.code[r, oc.OUT]] for r in junctions]
        cotangents = self._gradient_recorded([target], [np.ones(target.shape, target.dtype)], outs)
        owner = {int(s): i for i, src in enumerate(program.sources)
                 for s in (src, *program.source_aliases[i].tolist()) if s >= 0}
        results = [None] * len(sources)
        for r, g in zip(junctions, cotangents):
            if g is None:
                continue
            param = int(program.code[r, oc.IN0 if program.code[r, oc.OP] == oc.TILE else oc.IN1])
            shares = self._junction_shares(program, r, g, tensors, layouts, batch)
            if param in owner:
                i = owner[param]
                share = reshape(shares, (batch,) + sources[i].shape)
                results[i] = share if results[i] is None else add(results[i], share)
                continue
            computed = tensors[param]
            for i, s in enumerate(sources):
                (jac,) = self._jacobian_recorded(computed, [s])
                if jac is not None:
                    share = reshape(matmul(shares, reshape(jac, (computed.size, s.size))), (batch,) + s.shape)
                    results[i] = share if results[i] is None else add(results[i], share)
        return results

    def _junction_shares(self, program, r, g, tensors, layouts, batch):
        """[B, parameter size]: each example's share of the parameter cotangent at junction r, whose output
        cotangent is g; recorded ops."""
        from jitape_kernels.cpu.shape import leading_broadcast_block
        from .ops import matmul, reduce_sum, reshape
        code, iattr = program.code, program.iattr
        a = code[r, oc.ATTR]
        if code[r, oc.OP] == oc.TILE:
            block = leading_broadcast_block(oc.TILE, iattr, a)
            return reduce_sum(reshape(g, (batch, -1, block)), axis=1)
        batch_a, batch_b, m, k, n = (int(v) for v in iattr[a:a + 5])
        x = tensors[code[r, oc.IN0]]
        if layouts[code[r, oc.IN0]] * batch != x.size or batch_b not in (1, batch_a):
            raise ValueError(f"per_example_gradients under a recording tape: instruction {r} of the program "
                             f"meets a parameter in a layout not supported on the recorded path:\n"
                             f"{program.instruction(r)}")
        if batch_b == 1:
            rows = batch_a * m // batch
            shares = matmul(reshape(x, (batch, rows, k)), reshape(g, (batch, rows, n)), transpose_a=True)
            return reshape(shares, (batch, k * n))
        blocks = matmul(reshape(x, (batch_a, m, k)), reshape(g, (batch_a, m, n)), transpose_a=True)
        example = np.arange(batch_a) // (batch_a // batch)
        mask = (example[None, :] == np.arange(batch)[:, None]).astype(g.dtype)[:, :, None]
        return reshape(reshape(blocks, (1, batch_a, k * n)) * mask, (batch, batch_a * k * n))

    def _check_hessian(self, target, source):
        if self._used:
            raise RuntimeError("GradientTape.hessian can only be called once on non-persistent tapes.")
        if not isinstance(target, Tensor) or target.shape != ():
            shape = getattr(target, "shape", type(target).__name__)
            raise ValueError(f"GradientTape.hessian: target must be a scalar Tensor, got shape {shape}")
        if not isinstance(source, Tensor) or source.dtype.kind != "f":
            raise TypeError(f"GradientTape.hessian: source must be a float Tensor, got {source!r}")

    def _recording_of_gradient(self, target, source):
        """A persistent tape holding this tape's records plus the recorded gradient of target w.r.t. source.

        The forward values are unchanged, so the copy needs no replay: the VJP ops
        recorded on it connect to the forward tensors it already tracks.
        """
        copy = GradientTape(persistent=True, watch_accessed_variables=False)
        copy._records = self._records[:]
        copy._rows = array("q", self._rows)
        copy._slot_rows = array("q", self._slot_rows)
        copy._iattr = array("q", self._iattr)
        copy._fattr = array("d", self._fattr)
        copy._values = self._values[:]
        copy._slot_of = dict(self._slot_of)
        copy._tracked = set(self._tracked)
        copy._variables = dict(self._variables)
        copy._aliases = {k: v[:] for k, v in self._aliases.items()}
        copy._push()
        try:
            (grad,) = self._gradient_recorded([target], [np.ones((), target.dtype)], [source])
        finally:
            copy._pop()
        return copy, grad

    def hessian(self, target, source):
        """d² target / d source², shape source.shape + source.shape, from this one tape.

        Compiled forward over reverse: one reverse sweep, then one tangent sweep and one
        second-order sweep with K = source.size directions. Under an enclosing recording
        tape the gradient is recorded with the VJP rules and differentiated again, so the
        Hessian itself can be differentiated.

        >>> import jitape as jt
        >>> x = jt.constant([1.0, 2.0])
        >>> with jt.GradientTape() as tape:
        ...     tape.watch(x)
        ...     y = jt.reduce_sum(x ** 3)
        >>> tape.hessian(y, x).numpy()
        array([[ 6.,  0.],
               [ 0., 12.]], dtype=float32)
        """
        self._check_hessian(target, source)
        if self._must_record():
            copy, grad = self._recording_of_gradient(target, source)
            result = None if grad is None else copy.jacobian(grad, source, UnconnectedGradients.ZERO)
        else:
            from .execute import lowered, source_hessian
            h = source_hessian(lowered(self, [target], [source]), source)
            result = None if h is None else Tensor(h.astype(source.dtype).reshape(source.shape + source.shape))
        self._release_if_used_up()
        return result

    def hessian_vector_product(self, target, source, v):
        """(d² target / d source²) · v, shape source.shape: one tangent sweep along v (K = 1)."""
        self._check_hessian(target, source)
        v = _checked_seed(v, source, "GradientTape.hessian_vector_product: v", "the source's")
        v = v if isinstance(v, Tensor) else Tensor(v[()])
        if self._must_record([v]):
            copy, grad = self._recording_of_gradient(target, source)
            result = None if grad is None else copy.gradient(grad, source, output_gradients=v,
                                                             unconnected_gradients=UnconnectedGradients.ZERO)
        else:
            from .execute import lowered, source_hessian
            hv = source_hessian(lowered(self, [target], [source]), source, np.asarray(v._value).reshape(-1, 1))
            result = None if hv is None else Tensor(hv.astype(source.dtype).reshape(source.shape)[()])
        self._release_if_used_up()
        return result

    def _release_if_used_up(self):
        if not self._persistent:
            # release what was recorded; watched_variables() still answers, as in TensorFlow
            variables = self._variables
            self._used = True
            self._clear()
            self._variables = variables

    def program(self, target, sources):
        """The Program that `gradient(target, sources)` runs: print it for a listing."""
        from .program import lower
        targets = _target_list(target)
        flat = nest.flatten(sources)
        return lower(self, targets, flat)


def _unconnected_mode(value):
    try:
        return UnconnectedGradients(value.value if isinstance(value, UnconnectedGradients) else value)
    except ValueError:
        raise ValueError(f"unconnected_gradients: expected 'none' or 'zero', got {value!r}") from None


def _snapshots(inputs):
    """Inputs as recorded for the Python VJPs: each Variable replaced by the value it had at this read."""
    return tuple(VariableRead(t) if type(t) is Variable else t for t in inputs)


def _source_list(sources, method):
    flat = nest.flatten(sources)
    for i, s in enumerate(flat):
        if not isinstance(s, Tensor):
            raise TypeError(f"GradientTape.{method}: sources[{i}] must be a Tensor or Variable, "
                            f"got {type(s).__name__}: {s!r}")
    return flat


def _target_list(target):
    targets = nest.flatten(target)
    if not targets:
        raise ValueError("GradientTape.gradient: target is empty")
    for i, t in enumerate(targets):
        if not isinstance(t, Tensor):
            raise TypeError(f"GradientTape.gradient: target must be a Tensor (or a list of them), "
                            f"got {type(t).__name__} at position {i}: {t!r}")
    return targets


def _seed_list(targets, output_gradients):
    """One seed per target: ones, or the checked output_gradients (Tensors kept for the recorded path)."""
    if output_gradients is None:
        return [np.ones(t.shape, t.dtype) if t.dtype.kind == "f" else None for t in targets]
    given = nest.flatten(output_gradients)
    if len(given) != len(targets):
        raise ValueError(f"output_gradients: expected {len(targets)} gradient(s), one per target, "
                         f"got {len(given)}")
    seeds = []
    for t, g in zip(targets, given):
        if g is None:
            seeds.append(np.ones(t.shape, t.dtype))
            continue
        seeds.append(_checked_seed(g, t, "output_gradients", "the target's"))
    return seeds


def _checked_seed(value, like, what, whose):
    """`value` (a Tensor, kept for the recorded path, or array-like, cast to like's dtype) checked to be a
    finite float block of like's shape; the errors name `what` and `whose` shape was expected."""
    array = np.asarray(value._value if isinstance(value, Tensor) else value)
    if array.dtype.kind not in "fiu":
        raise TypeError(f"{what} must be a float array, got dtype {array.dtype}")
    if array.shape != like.shape:
        raise ValueError(f"{what} has shape {array.shape}, expected {whose} shape {like.shape}")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{what} contains NaN or Inf")
    return value if isinstance(value, Tensor) else array.astype(like.dtype)
