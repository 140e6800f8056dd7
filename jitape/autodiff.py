"""Forward mode: jt.autodiff.ForwardAccumulator, TensorFlow's tf.autodiff.ForwardAccumulator.

The accumulator records on a tape like GradientTape; `jvp` lowers what it recorded
and runs one compiled tangent sweep (K = 1) seeded with the given tangents. Under
an enclosing recording tape the JVP is recorded instead (as the transpose of the
recorded VJPs), so it can itself be differentiated; as GradientTape's derivatives, only when
that tape tracks something the JVP reads.
"""
import numpy as np

from . import nest, recorded
from .execute import source_jvps
from .ops import multiply, reduce_sum
from .recording import recording_tapes
from .tape import GradientTape, _unconnected_mode, UnconnectedGradients
from .tensor import Tensor

__all__ = ["ForwardAccumulator"]


def _flatten_up_to(primals, tangents):
    """The tangents matching nest.flatten(primals): the nests must agree down to the primals' leaves (a
    tangent there may be any array-like, a list of numbers included); None where they do not."""
    if isinstance(primals, (list, tuple)):
        if not isinstance(tangents, (list, tuple)) or len(tangents) != len(primals):
            return None
        parts = [_flatten_up_to(p, t) for p, t in zip(primals, tangents)]
        return None if any(p is None for p in parts) else [t for part in parts for t in part]
    if isinstance(primals, dict):
        if not isinstance(tangents, dict) or set(tangents) != set(primals):
            return None
        keys = nest.flatten({k: k for k in primals})       # nest's key order
        parts = [_flatten_up_to(primals[k], tangents[k]) for k in keys]
        return None if any(p is None for p in parts) else [t for part in parts for t in part]
    return [tangents]


def _checked_tangent(primal, tangent, i):
    if isinstance(tangent, Tensor):
        if tangent.dtype.kind == "f" and tangent.dtype != primal.dtype:
            raise TypeError(f"ForwardAccumulator: tangents[{i}] has dtype {tangent.dtype}, expected the primal's "
                            f"dtype {primal.dtype}")
        tangent = tangent._value
    array = np.asarray(tangent)
    if array.dtype.kind not in "fiub":
        raise TypeError(f"ForwardAccumulator: tangents[{i}] must be a float array, got dtype {array.dtype}")
    if array.shape != primal.shape:
        raise ValueError(f"ForwardAccumulator: tangents[{i}] has shape {array.shape}, expected the primal's "
                         f"shape {primal.shape}")
    return array.astype(primal.dtype).reshape(-1)


class ForwardAccumulator:
    """Computes Jacobian-vector products of what is computed from `primals` inside its `with` block.

    primals and tangents are Tensors (or Variables), or nests of them of one structure; each tangent
    has its primal's shape.

    >>> import jitape as jt
    >>> x = jt.constant([1.0, 2.0])
    >>> with jt.autodiff.ForwardAccumulator(x, jt.constant([1.0, 0.0])) as acc:
    ...     y = jt.reduce_sum(x * x * x)
    >>> acc.jvp(y)
    jitape.Tensor(3.0, shape=(), dtype=float32)
    """

    def __init__(self, primals, tangents):
        flat_primals = nest.flatten(primals)
        flat_tangents = _flatten_up_to(primals, tangents)
        if flat_tangents is None:
            raise ValueError(f"ForwardAccumulator: primals and tangents must have the same nested structure, "
                             f"got {len(flat_primals)} primal(s) in a {type(primals).__name__} and tangents "
                             f"{tangents!r}")
        for i, p in enumerate(flat_primals):
            if not isinstance(p, Tensor):
                raise TypeError(f"ForwardAccumulator: primals[{i}] must be a Tensor or Variable, got "
                                f"{type(p).__name__}: {p!r}")
            if p.dtype.kind != "f":
                raise TypeError(f"ForwardAccumulator: primals[{i}] must be float32 or float64, got {p.dtype}")
        self._primals = flat_primals
        self._tangents = [_checked_tangent(p, t, i) for i, (p, t) in enumerate(zip(flat_primals, flat_tangents))]
        self._tape = GradientTape(persistent=True, watch_accessed_variables=False)
        self._tape.watch(flat_primals)

    def __enter__(self):
        self._tape.__enter__()
        return self

    def __exit__(self, *exc):
        return self._tape.__exit__(*exc)

    def jvp(self, primals, unconnected_gradients=UnconnectedGradients.NONE):
        """The directional derivative of each tensor in `primals` (a Tensor or a nest of them, computed
        inside the accumulator's block) along the tangents: a nest of the same structure, each entry of
        its tensor's shape; None (or zeros with unconnected_gradients="zero") where it does not depend
        on the accumulator's primals."""
        unconnected = _unconnected_mode(unconnected_gradients)
        targets = nest.flatten(primals)
        for i, t in enumerate(targets):
            if not isinstance(t, Tensor):
                raise TypeError(f"ForwardAccumulator.jvp: expected a Tensor (or a nest of them), got "
                                f"{type(t).__name__} at position {i}: {t!r}")
        floats = [t for t in targets if t.dtype.kind == "f"]
        enclosing = [tape for tape in recording_tapes() if tape is not self._tape]
        if floats and self._tape._must_record(tapes=enclosing):
            found = self._jvp_recorded(floats)
        elif floats:
            found = [None if v is None else Tensor(v[()])
                     for v in source_jvps(self._tape, floats, self._primals, self._tangents)]
        else:
            found = []
        by_id = dict(zip((t._id for t in floats), found))
        results = []
        for t in targets:
            v = by_id.get(t._id)
            if v is None and unconnected is UnconnectedGradients.ZERO:
                v = Tensor(np.zeros_like(t._value)[()])
            results.append(v)
        return nest.pack_like(primals, results)

    def _jvp_recorded(self, targets):
        """J v = d/du <J^T u, v>: the recorded VJPs (linear in the cotangents u) differentiated in u,
        all recorded on the enclosing tapes, so the JVP is itself differentiable."""
        with self._paused():
            cotangents = [Tensor(np.zeros_like(t._value)[()]) for t in targets]
            with GradientTape() as transpose:
                transpose.watch(cotangents)
                grads = recorded.gradient(self._tape, targets, cotangents, self._primals)
                terms = [reduce_sum(multiply(g, Tensor(v.reshape(p.shape)[()])))
                         for g, v, p in zip(grads, self._tangents, self._primals) if g is not None]
                total = sum(terms[1:], terms[0]) if terms else None
            if total is None:
                return [None] * len(targets)
            return transpose.gradient(total, cotangents)

    def _paused(self):
        if self._tape._recording:
            return self._tape.stop_recording()
        from contextlib import nullcontext
        return nullcontext()

    def __repr__(self):
        return f"ForwardAccumulator({len(self._primals)} primal(s))"
