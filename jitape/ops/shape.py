"""Shape ops: reshape, transpose, squeeze, expand_dims, broadcast_to, tile, concat, stack, pad, gather, slicing.

reshape is a flat copy (kernels index flat buffers); broadcast_to is tile over
size-1 dims; slicing and pad are one strided-window pair, each the other's VJP;
gather's VJP is a one-hot matmul, so it too is differentiable to any order.
"""
import builtins
import math
import operator

import numpy as np

from jitape_kernels import opcodes as oc

from ..recording import _state, packed_attributes
from ..tensor import VIEWS_FROM, Tensor
from ..tracing import _traces, broadcast_constant
from . import linalg as _linalg
from . import reduction as _reduction
from .core import Primitive, as_tensor, constant_value, emit_rows, float_tensor, normalize_axis, record


def _recordable(x, what):
    return x if isinstance(x, Tensor) and x._value.dtype.kind == "f" else float_tensor(x, what)


# -- reshape ---------------------------------------------------------------------------------
def _reshape_shape(shape, new_shape):
    if math.prod(shape) != math.prod(new_shape):
        raise ValueError(f"reshape: cannot reshape a tensor of shape {shape} ({math.prod(shape)} elements) "
                         f"into shape {new_shape}")
    return new_shape


_reshape = Primitive("reshape", oc.COPY, lambda x, new_shape: np.reshape(x, new_shape)[()],
                     lambda shapes, new_shape: _reshape_shape(shapes[0], new_shape),
                     lambda g, out, ins, new_shape, w: (reshape(g, ins[0].shape),))


def _resolve_shape(shape, size, what):
    shape = [int(d) for d in (constant_value(shape, "the shape of jt.reshape").reshape(-1))]
    unknown = [i for i, d in enumerate(shape) if d == -1]
    if len(unknown) > 1 or any(d < -1 for d in shape):
        raise ValueError(f"{what}: invalid target shape {tuple(shape)}")
    if unknown:
        known = math.prod(d for d in shape if d != -1)
        if known == 0 or size % known:
            raise ValueError(f"{what}: cannot reshape {size} elements into shape {tuple(shape)}")
        shape[unknown[0]] = size // known
    return tuple(shape)


def reshape(tensor, shape, name=None):
    """`tensor` with a new shape of the same size (one -1 entry is inferred)."""
    x = as_tensor(tensor)
    new_shape = _resolve_shape(shape, x.size, "reshape")
    if new_shape == x.shape:
        return x
    _reshape_shape(x.shape, new_shape)
    if x.dtype.kind != "f":
        return Tensor(np.reshape(x._value, new_shape)[()])
    return record(_reshape, x, None, np.reshape(x._value, new_shape)[()], new_shape)


def squeeze(input, axis=None, name=None):
    """Remove size-1 dimensions (all, or those in `axis`)."""
    x = as_tensor(input)
    if axis is None:
        return reshape(x, tuple(d for d in x.shape if d != 1))
    axes = {normalize_axis(a, x.ndim, "squeeze") for a in np.atleast_1d(axis).tolist()}
    for a in axes:
        if x.shape[a] != 1:
            raise ValueError(f"squeeze: cannot squeeze axis {a} of size {x.shape[a]} (shape {x.shape})")
    return reshape(x, tuple(d for i, d in enumerate(x.shape) if i not in axes))


def expand_dims(input, axis, name=None):
    """Insert a size-1 dimension at `axis`."""
    x = as_tensor(input)
    a = normalize_axis(axis, x.ndim + 1, "expand_dims")
    return reshape(x, x.shape[:a] + (1,) + x.shape[a:])


# -- transpose -------------------------------------------------------------------------------
def _transpose_shape(shape, perm):
    if sorted(perm) != list(range(len(shape))):
        raise ValueError(f"transpose: perm {tuple(perm)} is not a permutation of the axes of shape {shape}")
    return tuple(shape[p] for p in perm)


_transpose = Primitive("transpose", oc.TRANSPOSE, lambda x, perm: np.transpose(x, perm).copy()[()],
                       lambda shapes, perm: _transpose_shape(shapes[0], perm),
                       lambda g, out, ins, perm, w: (transpose(g, tuple(np.argsort(perm).tolist())),))


def transpose(a, perm=None, conjugate=False, name=None):
    """Permute the axes (reverse them when perm is None)."""
    x = as_tensor(a)
    perm = tuple(range(x.ndim))[::-1] if perm is None else tuple(int(p) % max(x.ndim, 1) for p in perm)
    _transpose_shape(x.shape, perm)
    if perm == tuple(range(x.ndim)):
        return x
    if x.dtype.kind != "f":
        return Tensor(np.transpose(x._value, perm).copy())
    value = np.transpose(x._value, perm)
    # large: the view (as a broadcast's; matmul and the elementwise ops read strided operands in place)
    return record(_transpose, x, None, value if value.size >= VIEWS_FROM else value.copy(), perm,
                  (x.ndim,) + x.shape + perm)


# -- tile / broadcast_to ---------------------------------------------------------------------
def _tile_np(x, in_dims, reps):
    if max(map(min, in_dims, reps), default=1) <= 1:
        return _broadcast_np(x, tuple(map(operator.mul, in_dims, reps)))
    return np.tile(np.reshape(x, in_dims), reps)



def _broadcast_np(x, shape):
    # large: a read-only view (no pass over memory; the ops reading it broadcast as numpy does, and an arena
    # copies it only where a derivative reads it); small: a fresh contiguous array, a fifth of the view's cost
    if math.prod(shape) >= VIEWS_FROM:
        return np.broadcast_to(x, shape)
    out = np.empty(shape, x.dtype)
    out[...] = x
    return out


def _tile_shape(shape, in_dims, reps):
    if math.prod(shape) != math.prod(in_dims):
        raise ValueError(f"tile: input shape {shape} does not match {in_dims}")
    return tuple(d * r for d, r in zip(in_dims, reps))


def _tile_vjp(g, out, ins, params, w):
    in_dims, reps = params
    split, axes = [], []
    for d, r in zip(in_dims, reps):
        if r != 1:          # repeated, or broadcast to size 0 (a sum over no copies)
            axes.append(len(split))
            split.append(r)
        split.append(d)
    return (reshape(_reduction.reduce_sum(reshape(g, split), axis=tuple(axes)), ins[0].shape),)


_tile = Primitive("tile", oc.TILE, _tile_np, lambda shapes, p: _tile_shape(shapes[0], *p), _tile_vjp)


def _emit_tile(x, in_dims, reps, value):
    if _traces.active and not x._is_variable and x.dtype.kind == "f":
        broadcast_constant(x)       # a trace keeps a repeated constant its own size (tracing.broadcast_constant)
    return record(_tile, x, None, value, (in_dims, reps), (len(in_dims),) + in_dims + value.shape)


def tile(input, multiples, name=None):
    """Repeat the tensor `multiples[d]` times along each dimension d."""
    x = _recordable(input, "tile")
    reps = tuple(int(m) for m in np.asarray(multiples).reshape(-1))
    if len(reps) != x.ndim:
        raise ValueError(f"tile: multiples {reps} must have one entry per dimension of shape {x.shape}")
    if all(r == 1 for r in reps):
        return x
    return _emit_tile(x, x.shape, reps, _tile_np(x._value, x.shape, reps))


def broadcast_to(input, shape, name=None):
    """`input` broadcast to `shape` by numpy's rules (recorded as a tile over its size-1 dims)."""
    x = input if isinstance(input, Tensor) else as_tensor(input)
    shape = shape if type(shape) is tuple else tuple(int(d) for d in shape)
    if x._value.shape == shape:
        return x
    if len(shape) < x.ndim or any(d not in (1, s) for d, s in zip(x.shape[::-1], shape[::-1])):
        raise ValueError(f"broadcast_to: cannot broadcast shape {x.shape} to {shape}")
    if x.dtype.kind not in "fb":       # bool: a recorded comparison broadcast as an instruction
        return Tensor(np.broadcast_to(x._value, shape))
    in_dims = (1,) * (len(shape) - x.ndim) + x.shape
    return _emit_tile(x, in_dims, tuple(s if d == 1 else 1 for d, s in zip(in_dims, shape)),
                      _broadcast_np(x._value, shape))


# -- strided windows: slicing and pad --------------------------------------------------------
def _window(starts, steps, counts):
    return tuple(builtins.slice(s, s + n * st if s + n * st >= 0 else None, st)
                 for s, st, n in zip(starts, steps, counts))


def _slice_np(x, starts, steps, window, out_shape):
    return np.ascontiguousarray(x[_window(starts, steps, window)]).reshape(out_shape)[()]


def _pad_np(x, starts, steps, window, out_shape):
    out = np.zeros(out_shape, x.dtype)
    out[_window(starts, steps, window)] = np.reshape(x, window)
    return out[()]


def _window_shape(shape, starts, steps, window):
    for d, (s, st, n) in enumerate(zip(starts, steps, window)):
        last = s + (n - 1) * st
        if n and not (0 <= s < shape[d] and 0 <= last < shape[d]):
            raise ValueError(f"strided_slice: window start {s} step {st} count {n} leaves axis {d} of "
                             f"shape {shape}")


def _slice_shape(shape, starts, steps, window, out_shape):
    """A window of `shape`, its output shaped `out_shape` (the window's shape, less the axes an int indexed)."""
    _window_shape(shape, starts, steps, window)
    if math.prod(out_shape) != math.prod(window):
        raise ValueError(f"strided_slice: output shape {out_shape} does not hold the window {window}")
    return tuple(out_shape)


# params of both: (starts, steps, the window's counts per axis, the output shape); SLICE's output and PAD's input
# may drop the window's int-indexed axes (size 1): the instruction reads the same entries
_strided_slice = Primitive("strided_slice", oc.SLICE, _slice_np, lambda shapes, p: _slice_shape(shapes[0], *p),
                           lambda g, out, ins, p, w: (_emit_pad(g, p[0], p[1], p[2], ins[0].shape),))


def _pad_shape(shape, starts, steps, window, out_shape):
    _slice_shape(out_shape, starts, steps, window, shape)
    return tuple(out_shape)


_pad = Primitive("pad", oc.PAD, _pad_np, lambda shapes, p: _pad_shape(shapes[0], *p),
                 lambda g, out, ins, p, w: (_emit_slice(g, p[0], p[1], p[2], ins[0].shape),))


def _window_attributes(in_dims, out_dims, starts, steps):
    return (len(in_dims),) + tuple(in_dims) + tuple(out_dims) + tuple(starts) + tuple(steps)


def _emit_slice(x, starts, steps, window, out_shape, value=None):
    """x's window as one SLICE instruction (`value`: the result, when the caller computed it already)."""
    value = _slice_np(x._value, starts, steps, window, out_shape) if value is None else value
    return record(_strided_slice, x, None, value, (starts, steps, window, out_shape),
                  _window_attributes(x.shape, window, starts, steps))


def _emit_pad(x, starts, steps, window, out_shape):
    return record(_pad, x, None, _pad_np(x._value, starts, steps, window, out_shape),
                  (starts, steps, window, out_shape), _window_attributes(window, out_shape, starts, steps))


def strided_slice(x, starts, steps, counts):
    """x[starts[d] + i * steps[d] for i < counts[d]] along every axis d."""
    x = as_tensor(x)
    starts, steps, counts = tuple(starts), tuple(steps), tuple(counts)
    _window_shape(x.shape, starts, steps, counts)
    if counts == x.shape and all(s == 0 for s in starts) and all(st == 1 for st in steps):
        return x
    if x.dtype.kind != "f":
        return Tensor(_slice_np(x._value, starts, steps, counts, counts))
    return _emit_slice(x, starts, steps, counts, counts)


def slice(input_, begin, size, name=None):
    """TensorFlow's tf.slice: the block starting at `begin` of `size` (-1: to the end)."""
    x = as_tensor(input_)
    begin = [int(b) for b in np.asarray(begin).reshape(-1)]
    size = [x.shape[d] - b if int(s) == -1 else int(s) for d, (b, s) in enumerate(zip(begin, np.asarray(size).reshape(-1)))]
    return strided_slice(x, begin, [1] * x.ndim, size)


def pad(tensor, paddings, mode="CONSTANT", constant_values=0, name=None):
    """Pad with `paddings[d] = (before, after)` per axis; modes CONSTANT, REFLECT and SYMMETRIC."""
    x = _recordable(tensor, "pad")
    p = constant_value(paddings, "the paddings of jt.pad").astype(np.int64)
    if p.shape != (x.ndim, 2) or (p < 0).any():
        raise ValueError(f"pad: paddings must be non-negative with shape {(x.ndim, 2)}, got {p.tolist()}")
    mode = mode.upper()
    if mode == "CONSTANT":
        out_shape = tuple(int(d + b + a) for d, (b, a) in zip(x.shape, p))
        if out_shape == x.shape:
            return x
        out = _emit_pad(x, tuple(int(b) for b in p[:, 0]), (1,) * x.ndim, x.shape, out_shape)
        if isinstance(constant_values, Tensor) or constant_values:
            border = np.ones(out_shape, x.dtype)
            border[_window(p[:, 0], (1,) * x.ndim, x.shape)] = 0
            out = out + Tensor(border) * constant_values       # recorded: a tensor fill value gets its gradient
        return out
    if mode not in ("REFLECT", "SYMMETRIC"):
        raise ValueError(f"pad: mode must be 'CONSTANT', 'REFLECT' or 'SYMMETRIC', got {mode!r}")
    skip = 1 if mode == "REFLECT" else 0
    for axis, (before, after) in enumerate(p.tolist()):
        n = x.shape[axis]
        if before > n - skip or after > n - skip:
            raise ValueError(f"pad: {mode} paddings {(before, after)} too large for axis {axis} of size {n}")
        parts = []
        if before:
            parts.append(_axis_window(x, axis, before - 1 + skip, -1, before))
        parts.append(x)
        if after:
            parts.append(_axis_window(x, axis, n - 1 - skip, -1, after))
        x = concat(parts, axis) if len(parts) > 1 else x
    return x


def _axis_window(x, axis, start, step, count):
    starts = [0] * x.ndim
    steps = [1] * x.ndim
    counts = list(x.shape)
    starts[axis], steps[axis], counts[axis] = start, step, count
    return strided_slice(x, starts, steps, counts)


# -- concat / stack --------------------------------------------------------------------------
def _concat_vjp(g, out, ins, axis, w):
    grads, offset = [], 0
    for t, want in zip(ins, w):
        n = t.shape[axis]
        grads.append(_axis_window(g, axis, offset, 1, n) if want else None)
        offset += n
    return grads


def _concat_shape(*shapes, axis):
    first = shapes[0]
    for s in shapes[1:]:
        if len(s) != len(first) or any(a != b for i, (a, b) in enumerate(zip(s, first)) if i != axis):
            raise ValueError(f"concat: shapes {shapes} differ outside axis {axis}")
    return first[:axis] + (sum(s[axis] for s in shapes),) + first[axis + 1:]


_concat = Primitive("concat", oc.PLACE, lambda *xs, axis: np.concatenate(xs, axis)[()],
                    lambda shapes, axis: _concat_shape(*shapes, axis=axis),
                    _concat_vjp)


def concat(values, axis, name=None):
    """Join tensors along an existing axis."""
    from .core import promote
    tensors = [as_tensor(v) for v in values]
    if not tensors:
        raise ValueError("concat: expected at least one tensor")
    axis = normalize_axis(axis, tensors[0].ndim, "concat")
    shape = _concat_shape(*(t.shape for t in tensors), axis=axis)
    if len(tensors) == 1:
        return tensors[0]
    if any(t.dtype.kind == "f" for t in tensors):
        dtype = np.result_type(*(t.dtype for t in tensors if t.dtype.kind == "f"))
        tensors = [promote(t, Tensor(np.zeros((), dtype)))[0] for t in tensors]
    else:
        return Tensor(np.concatenate([t._value for t in tensors], axis))
    value = np.concatenate([t._value for t in tensors], axis)
    outer, inner, n_out = math.prod(shape[:axis]), math.prod(shape[axis + 1:]), shape[axis]
    rows, offset = [], 0
    for i, t in enumerate(tensors):
        rows.append((oc.PLACE, (i,), (outer, t.shape[axis], inner, n_out, offset)))
        offset += t.shape[axis]
    return emit_rows(_concat, tuple(tensors), value, axis, rows)


def stack(values, axis=0, name=None):
    """Join tensors of one shape along a new axis."""
    tensors = [as_tensor(v) for v in values]
    if not tensors:
        raise ValueError("stack: expected at least one tensor")
    if len({t.shape for t in tensors}) > 1:
        raise ValueError(f"stack: all tensors must have one shape, got {[t.shape for t in tensors]}")
    a = normalize_axis(axis, tensors[0].ndim + 1, "stack")
    return concat([expand_dims(t, a) for t in tensors], a)


def unstack(value, num=None, axis=0, name=None):
    """The slices of `value` along `axis`, as a list."""
    x = as_tensor(value)
    a = normalize_axis(axis, x.ndim, "unstack")
    return [squeeze(_axis_window(x, a, i, 1, 1), a) for i in range(x.shape[a])]


# -- gather ----------------------------------------------------------------------------------
def _gather_np(x, outer, n_axis, inner, idx, out_shape):
    return np.take(np.reshape(x, (outer, n_axis, inner)), idx, axis=1).reshape(out_shape)[()]


def _gather_shape(shape, outer, n_axis, inner, idx, out_shape):
    if math.prod(shape) != outer * n_axis * inner:
        raise ValueError(f"gather: params shape {shape} does not match {(outer, n_axis, inner)}")
    return out_shape


def _gather_vjp(g, out, ins, p, w):
    outer, n_axis, inner, idx, _ = p
    one_hot = np.zeros((n_axis, idx.size), g.dtype)
    one_hot[idx, np.arange(idx.size)] = 1
    g3 = reshape(g, (outer, idx.size, inner))
    return (reshape(_linalg.matmul(Tensor(one_hot), g3), ins[0].shape),)


_gather = Primitive("gather", oc.GATHER, _gather_np, lambda shapes, p: _gather_shape(shapes[0], *p), _gather_vjp)


def gather(params, indices, validate_indices=None, axis=None, batch_dims=0, name=None):
    """Slices of `params` along `axis` at integer `indices` (any shape), as tf.gather."""
    x = as_tensor(params)
    idx = constant_value(indices, "the indices of jt.gather")
    if idx.dtype.kind not in "iu":
        raise TypeError(f"gather: indices must be integers, got dtype {idx.dtype}")
    axis = batch_dims if axis is None else axis
    axis = normalize_axis(axis, x.ndim, "gather")
    if batch_dims:
        return _batched_gather(x, idx, axis, batch_dims)
    n_axis = x.shape[axis]
    if idx.size and (idx.min() < 0 or idx.max() >= n_axis):
        bad = idx[(idx < 0) | (idx >= n_axis)].reshape(-1)[0]
        raise IndexError(f"gather: index {bad} is out of range [0, {n_axis}) for axis {axis} of shape {x.shape}")
    outer, inner = math.prod(x.shape[:axis]), math.prod(x.shape[axis + 1:])
    out_shape = x.shape[:axis] + idx.shape + x.shape[axis + 1:]
    flat = idx.reshape(-1).astype(np.int64)
    value = _gather_np(x._value, outer, n_axis, inner, flat, out_shape)
    if x.dtype.kind != "f":
        return Tensor(value)
    return record(_gather, x, None, value, (outer, n_axis, inner, flat, out_shape),
                  (outer, n_axis, inner, flat.size) + tuple(flat.tolist()))


def _batched_gather(x, idx, axis, batch_dims):
    if axis != batch_dims or idx.shape[:batch_dims] != x.shape[:batch_dims]:
        raise ValueError(f"gather: batch_dims={batch_dims} needs axis == batch_dims and indices whose "
                         f"leading dims match params; got axis {axis}, params {x.shape}, indices {idx.shape}")
    batch = math.prod(x.shape[:batch_dims])
    n = x.shape[axis]
    flat_idx = idx.reshape(batch, -1) + (np.arange(batch) * n)[:, None]
    flat = reshape(x, (batch * n,) + x.shape[axis + 1:])
    out = gather(flat, flat_idx.reshape(-1))
    return reshape(out, idx.shape + x.shape[axis + 1:])


# -- indexing (Tensor.__getitem__) -----------------------------------------------------------
_SLICE = builtins.slice     # one global read in the hot path (this module's `slice` is tf.slice)


def getitem(x, key):
    """numpy indexing: ints, slices, Ellipsis, None, and one integer or boolean array index."""
    kind = type(key)
    if kind is int or kind is _SLICE or kind is tuple and _ints_and_slices(key) \
            or isinstance(key, np.integer):
        # ints and slices (the common subscript): numpy's result (numpy raises its IndexError), recorded as
        # one SLICE
        v = x._value
        value = v[key]          # an array, or a numpy scalar when every axis took an int
        if type(value) is np.ndarray:
            value = np.ascontiguousarray(value)
        if not _state.recording or v.dtype.kind != "f":
            return Tensor(value)
        # the commonest subscripts' cached windows looked up inline (a function call is a twentieth of the op)
        shape = v.shape
        if kind is _SLICE:      # keyed by its bounds as written (see _sliced_window)
            window = (_sliced_windows.get((shape, key.start, key.stop, key.step)) or _sliced_window(shape, key))[0]
        else:
            cached = _recorded_windows.get((shape, key)) if kind is int else None     # _recorded_window's key
            window = cached[0] if cached is not None else _recorded_window(shape, key)
        if window is None:      # the whole of x
            return x
        params, iblock = window
        return record(_strided_slice, x, None, value, params, iblock)
    key = key if isinstance(key, tuple) else (key,)
    key = tuple(constant_value(k, "a tensor index") if isinstance(k, Tensor) else k for k in key)
    probe = np.broadcast_to(np.empty((), np.bool_), x.shape)
    out_shape = probe[key].shape                          # numpy validates the key here
    n_consumed = sum(1 for k in key if k is not None and k is not Ellipsis and not _is_bool_array(k)) \
        + sum(np.ndim(k) for k in key if _is_bool_array(k))
    expanded = []
    for k in key:
        if k is Ellipsis:
            expanded.extend([builtins.slice(None)] * (x.ndim - n_consumed))
        else:
            expanded.append(k)
    starts, steps, counts = [], [], []
    advanced = []
    dim = 0
    for k in expanded:
        if k is None:
            continue
        if isinstance(k, (int, np.integer)):
            starts.append(int(k) % x.shape[dim]), steps.append(1), counts.append(1)
            dim += 1
        elif isinstance(k, builtins.slice):
            start, stop, step = k.indices(x.shape[dim])
            starts.append(start), steps.append(step), counts.append(len(range(start, stop, step)))
            dim += 1
        else:
            arr = np.asarray(k)
            span = arr.ndim if arr.dtype == np.bool_ else 1
            advanced.append((dim, arr))
            for d in range(dim, dim + span):
                starts.append(0), steps.append(1), counts.append(x.shape[d])
            dim += span
    while dim < x.ndim:
        starts.append(0), steps.append(1), counts.append(x.shape[dim])
        dim += 1
    if len(advanced) > 1:
        raise IndexError("jitape supports one array (advanced) index per subscript; index in steps instead")
    y = strided_slice(x, starts, steps, counts)
    if advanced:
        d, arr = advanced[0]
        if arr.dtype == np.bool_:
            y = reshape(y, y.shape[:d] + (math.prod(y.shape[d:d + arr.ndim]),) + y.shape[d + arr.ndim:])
            arr = np.flatnonzero(arr)
        arr = np.where(arr < 0, arr + y.shape[d], arr)
        y = gather(y, arr, axis=d)
    return reshape(y, out_shape)


def _ints_and_slices(key):
    for k in key:
        if type(k) is not int and type(k) is not builtins.slice and not isinstance(k, np.integer):
            return False
    return True


_recorded_windows = {}     # (shape, subscript of ints and slices of ints) -> its SLICE's params and attributes


def _recorded_window(shape, key):
    """The SLICE params and attribute block of x[key] (key: ints and slices, in range; numpy checked it), or
    None when the window is the whole of x; cached where the key's parts are plain ints (a slice bound may be
    a Tensor, whose `__index__` a trace must see)."""
    parts = key if type(key) is int else _plain_parts(key) if type(key) is tuple else _plain_part(key)
    cached = _recorded_windows.get((shape, parts)) if parts is not None else None
    if cached is not None:
        return cached[0]
    starts, steps, window, out_shape = _basic_window_of(shape, key)
    if out_shape == shape and not any(starts) and all(step == 1 for step in steps):
        found = None
    else:
        found = ((starts, steps, window, out_shape),
                 packed_attributes(_window_attributes(shape, window, starts, steps)))
    if parts is not None and len(_recorded_windows) < 4096:
        _recorded_windows[(shape, parts)] = (found,)
    return found


# (_recorded_window's result,) of x[key], key a slice: by (x's shape, key.start, key.stop, key.step) where the
# bounds are ints or None (a flat key: ~40 ns less than one of key.indices, ~30 less than _recorded_windows' nested
# one), else by (x's shape, key.indices(shape[0]))
_sliced_windows = {}
_resolved_windows = {}


def _sliced_window(shape, key):
    """(_recorded_window,) of x[key] for a slice `key`, cached by x's shape and the key's bounds as written where
    they are ints or None: a lookup with other bounds equals none of those entries but where its bounds equal
    the ints (np.int64(2) == 2), which then give the same window. Other bounds are cached by their resolved
    ints (a Tensor bound's `__index__` ran, as numpy's indexing ran it)."""
    part = _plain_part(key)
    if part is not None:
        cached = (_recorded_window(shape, key),)
        if len(_sliced_windows) < 4096:
            _sliced_windows[(shape, *part)] = cached
        return cached
    bounds = (shape, key.indices(shape[0]))
    cached = _resolved_windows.get(bounds)
    if cached is None:
        cached = (_recorded_window(shape, key),)
        if len(_resolved_windows) < 4096:
            _resolved_windows[bounds] = cached
    return cached


def _plain_part(k):
    if type(k) is not builtins.slice:
        return int(k)
    start, stop, step = k.start, k.stop, k.step
    if (start is None or type(start) is int) and (stop is None or type(stop) is int) \
            and (step is None or type(step) is int):
        return (start, stop, step)
    return None


def _plain_parts(key):
    parts = []
    for k in key:
        part = _plain_part(k)
        if part is None:
            return None
        parts.append(part)
    return tuple(parts)


def _basic_window_of(shape, key):
    """(starts, steps, window, output shape) of a subscript of in-range ints and slices, at most one per axis
    (numpy checked it)."""
    key = key if type(key) is tuple else (key,)
    starts, steps, window, out_shape = [], [], [], []
    for k, n in zip(key, shape):
        if type(k) is builtins.slice:
            start, stop, step = k.indices(n)
            count = len(range(start, stop, step))
            starts.append(start), steps.append(step), window.append(count), out_shape.append(count)
        else:
            starts.append(int(k) % n), steps.append(1), window.append(1)
    rest = shape[len(key):]
    return (tuple(starts) + (0,) * len(rest), tuple(steps) + (1,) * len(rest), tuple(window) + rest,
            tuple(out_shape) + rest)


def _is_bool_array(k):
    return isinstance(k, (np.ndarray, list)) and np.asarray(k).dtype == np.bool_
