"""GradientTape: TensorFlow's tape over the recording (recording.py). Derivatives run the compiled sweeps
of the executor (execute.py), or the recorded path (recorded.py) when a recording tape tracks what they read.
"""
import enum
import warnings

import numpy as np

from jitape_kernels.planning import READS_FIRST_ORDER, READS_REVERSE

from . import nest, recorded
from .backend import HESSIAN_SWEEPS
from .execute import (check_rows, jacobian_sweeps, lowered, source_batch_jacobian, source_gradients, source_hessian,
                      source_jacobians, source_per_example_gradients)
from .program import lower
from .recording import Recording, _state
from .tensor import Tensor


class UnconnectedGradients(enum.Enum):
    """What `gradient` returns for a source the target does not depend on."""
    NONE = "none"
    ZERO = "zero"


class GradientTape(Recording):
    """Records operations on watched tensors so that gradients can be taken afterwards.

    >>> import jitape as jt
    >>> x = jt.constant(3.0)
    >>> with jt.GradientTape() as tape:
    ...     tape.watch(x)
    ...     y = x * x
    >>> tape.gradient(y, x)
    jitape.Tensor(6.0, shape=(), dtype=float32)
    """

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
        seeds = None if output_gradients is None else _seed_list(targets, output_gradients)   # None: ones
        flat_sources = _source_list(sources, "gradient")
        float_sources = []
        for s in flat_sources:
            if s.dtype.kind == "f":
                float_sources.append(s)
            else:
                warnings.warn(f"GradientTape.gradient: the dtype of the source tensor must be floating "
                              f"(float32 or float64), got {s.dtype}; its gradient is None", stacklevel=2)
        traces = None
        if not _state.recording:            # outside every tape (the common case): nothing tracks the derivative
            must_record = False
        else:
            if len(targets) == 1 and output_gradients is None:
                traces = self._compiled_in_traces(float_sources)
            must_record = self._must_record(seeds or (), self._tapes_to_record_for(traces))
        if must_record:
            found = recorded.gradient(self, targets, seeds or _seed_list(targets, None), float_sources)
        else:
            program = lowered(self, targets, float_sources, READS_REVERSE, sweeps=("reverse",))
            found = source_gradients(program, seeds, float_sources)
            for trace, view in traces or ():
                trace.record_gradient(targets[0], found, view)
        if len(found) == len(flat_sources):        # every source float: found lines up with them
            results = found
        else:
            by_id = dict(zip((s._id for s in float_sources), found))
            results = [by_id.get(s._id) for s in flat_sources]
        if unconnected is UnconnectedGradients.ZERO:
            results = [Tensor(np.zeros_like(s._value)[()]) if g is None and s.dtype.kind == "f" else g
                       for s, g in zip(flat_sources, results)]
        self._release_if_used_up()
        return nest.pack_like(sources, results)

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
        traces = self._compiled_in_traces(flat_sources)     # see hessian
        if self._must_record((), self._tapes_to_record_for(traces)):
            found = recorded.jacobian(self, target, flat_sources)
        else:
            program = lowered(self, [target], flat_sources, READS_FIRST_ORDER,
                              sweeps=jacobian_sweeps(target.size, flat_sources))
            found = [None if j is None else Tensor(j.reshape(target.shape + s.shape)[()])
                     for s, j in zip(flat_sources, source_jacobians(program, target.size, flat_sources))]
            for trace, view in traces or ():
                trace.record_jacobian(target, found, view)
        results = []
        for s, j in zip(flat_sources, found):
            if j is None and unconnected is UnconnectedGradients.ZERO:
                j = Tensor(np.zeros(target.shape + s.shape, s.dtype)[()])
            results.append(j)
        self._release_if_used_up()
        return nest.pack_like(sources, results)

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
            check_rows(lower(self, [target], [source], reads=READS_FIRST_ORDER), target.shape[0],
                       "batch_jacobian")
            full = recorded.batch_jacobian(self, target, source, shape)
        else:
            value = source_batch_jacobian(self, target, source)
            full = None if value is None else Tensor(value.reshape(shape))
        if full is None and unconnected is UnconnectedGradients.ZERO:
            full = Tensor(np.zeros(shape, source.dtype))
        self._release_if_used_up()
        return full

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
            found = recorded.per_example_gradients(self, target, flat_sources)
        else:
            found = [None if g is None else Tensor(g.reshape((batch,) + s.shape))
                     for s, g in zip(flat_sources, source_per_example_gradients(self, target, flat_sources))]
        results = []
        for s, g in zip(flat_sources, found):
            if g is None and unconnected is UnconnectedGradients.ZERO:
                g = Tensor(np.zeros((batch,) + s.shape, s.dtype))
            results.append(g)
        self._release_if_used_up()
        return nest.pack_like(sources, results)

    def _check_hessian(self, target, source):
        if self._used:
            raise RuntimeError("GradientTape.hessian can only be called once on non-persistent tapes.")
        if not isinstance(target, Tensor) or target.shape != ():
            shape = getattr(target, "shape", type(target).__name__)
            raise ValueError(f"GradientTape.hessian: target must be a scalar Tensor, got shape {shape}")
        if not isinstance(source, Tensor) or source.dtype.kind != "f":
            raise TypeError(f"GradientTape.hessian: source must be a float Tensor, got {source!r}")

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
        # inside jt.function traces the compiled sweeps may still run, as for a gradient: a trace records them as
        # one Hessian step of its Program (see replay.Concrete)
        traces = self._compiled_in_traces([source])
        if self._must_record((), self._tapes_to_record_for(traces)):
            copy, grad = recorded.recording_of_gradient(self, target, source)
            result = None if grad is None else copy.jacobian(grad, source, UnconnectedGradients.ZERO)
        else:
            h = source_hessian(lowered(self, [target], [source], sweeps=HESSIAN_SWEEPS), source.size)
            result = None if h is None else Tensor(h.astype(source.dtype).reshape(source.shape + source.shape))
            for trace, view in traces or ():
                trace.record_hessian(target, result, view)
        self._release_if_used_up()
        return result

    def hessian_vector_product(self, target, source, v):
        """(d² target / d source²) · v, shape source.shape: one tangent sweep along v (K = 1)."""
        self._check_hessian(target, source)
        v = _checked_seed(v, source, "GradientTape.hessian_vector_product: v", "the source's")
        v = v if isinstance(v, Tensor) else Tensor(v[()])
        if self._must_record([v]):
            copy, grad = recorded.recording_of_gradient(self, target, source)
            result = None if grad is None else copy.gradient(grad, source, output_gradients=v,
                                                             unconnected_gradients=UnconnectedGradients.ZERO)
        else:
            hv = source_hessian(lowered(self, [target], [source], sweeps=HESSIAN_SWEEPS), source.size,
                                np.asarray(v._value).reshape(-1, 1))
            result = None if hv is None else Tensor(hv.astype(source.dtype).reshape(source.shape)[()])
        self._release_if_used_up()
        return result

    def _compiled_in_traces(self, sources):
        """The jt.function traces recording now with what a derivative of this tape w.r.t. `sources`
        differentiates of each ((trace, its step_view) pairs; maybe none), when the derivative may run the compiled
        sweeps inside them, each trace recording it as one step of its Program (see replay.Concrete); None when it
        may not: a trace is to be differentiated itself (it needs the recorded VJPs), this tape is a trace, a source
        is a variable read, assigned and read again, or a trace cannot tell which value of a source the tape
        read."""
        traces = [t for t in _state.recording if t._is_trace]
        if not traces:
            return traces
        if self._is_trace or not all(t.compiled_gradients for t in traces) \
                or any(s._id in self._aliases for s in sources):
            return None
        views = [trace.step_view(self, sources) for trace in traces]
        return None if any(view is None for view in views) else list(zip(traces, views))

    @staticmethod
    def _tapes_to_record_for(traces):
        """The recording tapes whose tracking makes a derivative recorded (see _must_record): all of them where
        the traces may not take the compiled sweeps (`traces` None), else those that are not traces."""
        return None if traces is None else [t for t in _state.recording if not t._is_trace]

    def _release_if_used_up(self):
        if not self._persistent:
            # release what was recorded; watched_variables() still answers, as in TensorFlow
            variables = self._variables
            self._used = True
            self._clear()
            self._variables = variables

    def program(self, target, sources):
        """The Program that `gradient(target, sources)` runs: print it for a listing."""
        targets = _target_list(target)
        flat = nest.flatten(sources)
        return lower(self, targets, flat)


def _unconnected_mode(value):
    if value is UnconnectedGradients.NONE:     # the default: no enum lookup
        return value
    try:
        return UnconnectedGradients(value.value if isinstance(value, UnconnectedGradients) else value)
    except ValueError:
        raise ValueError(f"unconnected_gradients: expected 'none' or 'zero', got {value!r}") from None


def _source_list(sources, method):
    if isinstance(sources, Tensor):     # one source (the commonest), at once
        return [sources]
    flat = nest.flatten(sources)
    for i, s in enumerate(flat):
        if not isinstance(s, Tensor):
            raise TypeError(f"GradientTape.{method}: sources[{i}] must be a Tensor or Variable, "
                            f"got {type(s).__name__}: {s!r}")
    return flat


def _target_list(target):
    if isinstance(target, Tensor):      # one target (the commonest), at once
        return [target]
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
