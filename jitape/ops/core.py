"""The op registry: Primitive (forward, shape rule, Python VJP, opcode), and `emit` and `record`
(jitape.recording's), which record an op on tapes.

Every primitive is defined next to its public function in a family module;
composite ops (softmax, einsum, norm ...) are written in primitives and so
inherit their derivatives on every path.
"""
import functools

import numpy as np

from jitape_kernels import opcodes as oc
from jitape_kernels.opcodes import MAXRANK

from ..recording import emit, record, recording_tapes
from ..tensor import Tensor, to_numpy
from ..tracing import _traces, observe, observe_all

PRIMITIVES = {}     # name -> Primitive
COMPOSITES = {}     # name -> public function built from primitives
NON_DIFFERENTIABLE = {}   # name -> public function whose output no tape records


class Primitive:
    """One differentiable op.

    forward(*arrays, **params) -> array     the eager numpy forward
    shape(input_shapes, params) -> shape     raises ValueError naming the shapes
    vjp(g, out, inputs, params, wants)       input cotangents as jitape Tensors (None where not wanted)
    opcode                                   its instruction (jitape_kernels.opcodes.TABLE: name, family, arity,
                                             attribute layout); `kernels` names the CPU kernels that run it
    differentiable                           False for comparisons and stop_gradient: they are
                                             recorded so a replay recomputes them, but pass no derivative on;
                                             their public functions are in NON_DIFFERENTIABLE, not PRIMITIVES
    """
    __slots__ = ("name", "opcode", "forward", "shape", "vjp", "differentiable")

    def __init__(self, name, opcode, forward, shape, vjp, differentiable=True):
        if name in PRIMITIVES:
            raise ValueError(f"primitive {name!r} is defined twice")
        self.name, self.opcode, self.forward, self.shape, self.vjp = name, opcode, forward, shape, vjp
        self.differentiable = differentiable
        if differentiable:
            PRIMITIVES[name] = self

    @property
    def kernels(self):
        """The CPU kernels (module.function in jitape_kernels.cpu) of this op's forward, reverse, tangent and
        second-order rules; None where the family has none (linear ops have no second-order terms)."""
        from ..backend import CPU
        return dict(zip(("forward", "reverse", "tangent", "second_order"), CPU.kernels[oc.FAMILIES[self.opcode]]))

    def __repr__(self):
        return f"Primitive({self.name}, opcode {oc.NAMES[self.opcode]})"


def composite(fn):
    """Register a public op written in other ops (tested like a primitive, end to end)."""
    COMPOSITES[fn.__name__] = fn
    return fn


def non_differentiable(fn):
    """Register a public op whose gradient is None, as in TensorFlow. Comparisons and stop_gradient are
    recorded (a replayed function recomputes them); the others compute on values, so they are `reads_values`."""
    NON_DIFFERENTIABLE[fn.__name__] = fn if fn.__name__ in _RECORDED_NON_DIFFERENTIABLE else reads_values(fn)
    return NON_DIFFERENTIABLE[fn.__name__]


_RECORDED_NON_DIFFERENTIABLE = {"equal", "not_equal", "less", "less_equal", "greater", "greater_equal",
                                "stop_gradient"}


def reads_values(fn):
    """Mark an op computed from its tensor arguments' values outside any instruction: in a jt.function trace
    those arguments become guards (jitape.tracing), so a replay never returns a stale result."""
    how = f"jt.{fn.__name__}"

    @functools.wraps(fn)
    def op(*args, **kwargs):
        if _traces.active:
            observe_all(args, how)
            observe_all(tuple(kwargs.values()), how)
        return fn(*args, **kwargs)
    return op


def emit_rows(prim, inputs, value, params, rows):
    """As emit, for an op that lowers to several instructions (concat)."""
    out = Tensor(value)
    tapes = recording_tapes()
    if tapes:
        _check_recordable(prim, inputs, value)
        for tape in tapes:
            tape._record_rows(prim, inputs, out, params, rows)
    return out


def _check_recordable(prim, inputs, value):
    """Refuse, before any tape records anything, values a Program cannot hold: an op that raises leaves
    every tape as it was."""
    rank = value.ndim
    for t in inputs:        # a loop, not max() or any(generator): this runs for every recorded op
        if t._value.ndim > rank:
            rank = t._value.ndim
    if rank > MAXRANK:
        shapes = [t.shape for t in inputs]
        raise ValueError(f"{prim.name}: jitape records tensors of rank at most {MAXRANK}; inputs have shapes "
                         f"{shapes} and the result has shape {value.shape}")


# -- conversions ----------------------------------------------------------------------------
def as_tensor(x, like=None):
    """`x` as a Tensor; Python numbers take the float dtype of `like` (weak typing, like TensorFlow)."""
    if isinstance(x, Tensor):
        return x
    if like is not None and isinstance(x, (int, float)) and not isinstance(x, bool) \
            and like.dtype.kind == "f":
        return Tensor(like.dtype.type(x))
    return Tensor(to_numpy(x))


def constant_value(x, how):
    """x (a Tensor or array-like) as a numpy array for a parameter an op computes with (indices, masks,
    shapes, paddings): in a jt.function trace, a tensor read this way is a guard."""
    if isinstance(x, Tensor):
        if _traces.active:
            observe(x, how)
        return np.asarray(x._value)
    return np.asarray(x)


def float_tensor(x, what):
    """`x` as a float Tensor; ints and bools are cast to floatx (they are never differentiated)."""
    t = as_tensor(x)
    if t.dtype.kind != "f":
        from ..tensor import floatx
        t = cast_float(t, np.dtype(floatx()))
    return t


def promote(a, b):
    """Two float tensors of one dtype: Python numbers adopt the other's dtype; int tensors are cast."""
    a_t = isinstance(a, Tensor)
    b_t = isinstance(b, Tensor)
    if a_t and b_t and a._value.dtype is b._value.dtype and a._value.dtype.kind == "f":
        return a, b
    if a_t and not b_t:
        b = as_tensor(b, a)
    elif b_t and not a_t:
        a = as_tensor(a, b)
    else:
        a, b = as_tensor(a), as_tensor(b)
    ka, kb = a.dtype.kind, b.dtype.kind
    if ka != "f" or kb != "f" or a.dtype != b.dtype:
        if ka == "f" and kb == "f":
            dtype = np.promote_types(a.dtype, b.dtype)
        elif ka == "f":
            dtype = a.dtype
        elif kb == "f":
            dtype = b.dtype
        else:
            dtype = np.dtype(_floatx())
        a, b = cast_float(a, dtype), cast_float(b, dtype)
    return a, b


def _floatx():
    from ..tensor import floatx
    return floatx()


def cast_float(t, dtype):
    """`t` in float `dtype`; a float-to-float cast is recorded (it is differentiable)."""
    if t.dtype == dtype:
        return t
    if t.dtype.kind in "fb":      # bool: perhaps a recorded comparison, cast as an instruction
        from .elementwise import cast
        return cast(t, dtype)
    if _traces.active:
        observe(t, f"an integer tensor used as {dtype}")
    return Tensor(np.asarray(t._value, dtype)[()])


def broadcast_shapes(sa, sb, what):
    """numpy's broadcast of two shape tuples (a plain loop: np.broadcast_shapes costs five times more)."""
    longer, shorter = (sa, sb) if len(sa) >= len(sb) else (sb, sa)
    shape = list(longer)
    for i, d in enumerate(shorter, len(longer) - len(shorter)):
        if d != shape[i]:
            if shape[i] == 1:
                shape[i] = d
            elif d != 1:
                raise ValueError(f"{what}: shapes {sa} and {sb} are not broadcast-compatible")
    return tuple(shape)


def normalize_axis(axis, ndim, what):
    if not -ndim <= axis < max(ndim, 1):
        raise ValueError(f"{what}: axis {axis} is out of range for a tensor of rank {ndim}")
    return axis % ndim if ndim else 0
