"""Tensor, Variable, constant and the float dtype policy (floatx).

A Tensor is an immutable numpy value with a unique id that tapes key their
records on. Operators and numpy dispatch are attached by jitape.ops, which
owns every computation on tensors.
"""
import itertools
import numbers

import numpy as np

from .tracing import _traces, assigned, observe, observe_all

_ids = itertools.count(1)
_floatx = np.dtype(np.float32)
_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
# entries from which an eager transpose's or broadcast's value, or a gradient, may be a read-only view rather than
# a copy (below, a copy costs less than np.broadcast_to's ~2 us, and keeps small values contiguous and unshared)
VIEWS_FROM = 1 << 15


def floatx() -> str:
    """The default float dtype name for Python floats and lists ("float32" unless changed)."""
    return _floatx.name


def set_floatx(value) -> None:
    """Set the default float dtype: "float32" or "float64"."""
    global _floatx
    dtype = np.dtype(value)
    if dtype not in _FLOATS:
        raise ValueError(f"set_floatx: expected 'float32' or 'float64', got {value!r}")
    _floatx = dtype


def check_dtype(dtype, what="value"):
    """Refuse dtypes jitape cannot hold (complex, object, strings, datetimes...)."""
    if dtype.kind not in "biuf" or dtype == np.float16:
        raise TypeError(f"{what}: unsupported dtype {dtype}; jitape tensors are float32, float64, "
                        f"integer or bool")
    return dtype


def to_numpy(value, dtype=None):
    """The numpy value of `value` under jitape's conversion rules (TensorFlow's for Python values)."""
    if isinstance(value, Tensor):
        v = value._value
        return v if dtype is None or v.dtype == dtype else np.asarray(v, dtype)
    if dtype is not None:
        dtype = check_dtype(np.dtype(dtype), "dtype")
        return _canonical(np.asarray(_unwrap_nested(value), dtype=dtype))
    if isinstance(value, (np.ndarray, np.generic)):
        check_dtype(value.dtype)
        return _canonical(np.array(value))
    if isinstance(value, bool):
        return np.bool_(value)
    if isinstance(value, numbers.Integral):
        return np.int32(value)
    if isinstance(value, numbers.Real):
        return _floatx.type(value)
    arr = np.asarray(_unwrap_nested(value))
    check_dtype(arr.dtype)
    if arr.dtype.kind == "f":
        arr = arr.astype(_floatx)
    elif arr.dtype.kind in "iu":
        arr = arr.astype(np.int32)
    return _canonical(arr)


def _unwrap_nested(value):
    if isinstance(value, (list, tuple)):
        return [_unwrap_nested(v) for v in value]
    if isinstance(value, Tensor):
        return value._value
    return value


def _canonical(arr):
    """0-d values are numpy scalars, as numpy ufuncs return them."""
    return arr[()] if arr.ndim == 0 else arr


class TensorShape(tuple):
    """A tensor's shape: a tuple of ints with TensorFlow's `as_list()`, `rank` and `num_elements()`.

    >>> import jitape as jt
    >>> jt.zeros((2, 3)).get_shape().as_list()
    [2, 3]
    """
    __slots__ = ()

    def as_list(self):
        return list(self)

    @property
    def rank(self):
        return len(self)

    ndims = rank

    def num_elements(self):
        n = 1
        for d in self:
            n *= d
        return n

    def __repr__(self):
        return f"TensorShape({list(self)})"


class Tensor:
    """An immutable value recorded by tapes. `np.asarray(t)` and numpy ufuncs work on it.

    >>> import jitape as jt
    >>> jt.constant([1.0, 2.0]) * 3
    jitape.Tensor(
    [3. 6.], shape=(2,), dtype=float32)
    """
    __slots__ = ("_value", "_id", "__weakref__")
    __array_priority__ = 100
    _watchable = False
    _is_variable = False

    def __init__(self, value):
        self._value = value
        self._id = next(_ids)

    @property
    def shape(self):
        return self._value.shape

    @property
    def dtype(self):
        return self._value.dtype

    @property
    def ndim(self):
        return self._value.ndim

    @property
    def size(self):
        return self._value.size

    def get_shape(self):
        """The shape as a TensorShape (TensorFlow's spelling of `.shape`)."""
        return TensorShape(self._value.shape)

    # Reading a value into Python: in a jt.function trace, a guard (see jitape.tracing)
    def numpy(self):
        if _traces.active:
            observe(self, "Tensor.numpy()")
        v = self._value
        return v.copy() if isinstance(v, np.ndarray) else v

    def __array__(self, dtype=None, copy=None):
        if _traces.active:
            observe(self, "np.asarray(tensor)")
        v = np.asarray(self._value)
        if dtype is not None and v.dtype != dtype:
            return v.astype(dtype)
        if copy:
            return v.copy()
        # a read-only view: tapes keep this value, writing into it would change recorded results
        view = v.view()
        view.flags.writeable = False
        return view

    def __len__(self):
        if self._value.ndim == 0:
            raise TypeError("len() of a 0-d tensor")
        return self._value.shape[0]

    def __float__(self):
        if _traces.active:
            observe(self, "float(tensor)")
        return float(self._value)

    def __int__(self):
        if _traces.active:
            observe(self, "int(tensor)")
        return int(self._value)

    def __index__(self):
        if self._value.dtype.kind not in "iu":
            raise TypeError(f"only integer tensors can be used as an index, got dtype {self.dtype}")
        if _traces.active:
            observe(self, "a tensor used as an index")
        return int(self._value)

    def __bool__(self):
        if _traces.active:
            observe(self, "bool(tensor), e.g. `if tensor:`")
        return bool(self._value)

    def __hash__(self):
        return self._id

    def __iter__(self):
        if self._value.ndim == 0:
            raise TypeError("iteration over a 0-d tensor")
        return (self[i] for i in range(len(self)))

    # Identity: a tape keys records on _id, so no two objects may share one. A Tensor is immutable, so
    # copies are the tensor itself (as TensorFlow's); unpickling makes a new tensor with a new id.
    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self

    def __reduce__(self):
        return Tensor, (np.array(self._value)[()],)

    def __repr__(self):
        v = self._value
        text = str(v) if v.ndim == 0 else "\n" + np.array2string(v)
        return f"jitape.Tensor({text}, shape={v.shape}, dtype={v.dtype.name})"

    __str__ = __repr__


_slot_value, _set_slot_value = Tensor._value.__get__, Tensor._value.__set__


class Variable(Tensor):
    """A mutable tensor; trainable float variables are watched automatically by recording tapes.

    >>> import jitape as jt
    >>> v = jt.Variable(2.0)
    >>> v.assign_add(1.0).numpy()
    np.float32(3.0)
    """
    __slots__ = ("trainable", "name", "_version", "_pending")
    _is_variable = True
    _changes = 0        # changes of any variable's value: see _changed

    def __init__(self, initial_value, trainable=True, name=None, dtype=None):
        if callable(initial_value) and not isinstance(initial_value, Tensor):
            initial_value = initial_value()
        self._version = 0
        self._pending = None
        super().__init__(to_numpy(initial_value, dtype))
        self.trainable = bool(trainable)
        self.name = name if name is not None else "Variable"

    # Every change of the value counts, in the variable's version and in the count of all variables' changes: a
    # replay finding a variable's version (or that count) unchanged since its last call finds the value still in
    # its arena (jitape.replay.Concrete.run)
    def _changed(self):
        """Count a change of the value (made by whoever calls: a new value or a write in place)."""
        self._version += 1
        Variable._changes += 1

    @property
    def _value(self):
        if self._pending is not None:
            self._take_pending()
        return _slot_value(self)

    @_value.setter
    def _value(self, value):
        self._pending = None
        _set_slot_value(self, value)
        self._changed()

    # A replay that writes a variable's new value over its old one in its arena, and that no guard can stop once
    # its rows ran, leaves the value there (jitape.replay.Concrete.finish): the variable takes it when first read,
    # so a training loop that reads its variables only through the replay copies none of them per step.
    @staticmethod
    def _defer(writes, versions):
        """For each (variable, take, k) of `writes`, the variable's value changed to what `take(variable)` gives
        when first read (see above), and versions[k] set to its new version: one call per replay."""
        for variable, take, k in writes:
            variable._pending = take
            variable._version += 1
            versions[k] = variable._version
        Variable._changes += 1

    def _take_pending(self):
        _set_slot_value(self, self._pending(self))
        self._pending = None        # after: a value that cannot be taken raises at every read, until assigned

    @property
    def _watchable(self):
        return self.trainable and self._value.dtype.kind == "f"

    def _new_value(self, value, op):
        stored = _slot_value(self)      # its dtype and shape, which never change (a value left pending: see _defer)
        new = to_numpy(value, stored.dtype)
        if new.shape != stored.shape:
            raise ValueError(f"Variable.{op}: value has shape {new.shape}, expected the variable's "
                             f"shape {stored.shape}")
        return new

    # Assignment replaces the value object: tapes keep references to values they recorded. In a trace
    # (jt.function) the new value is computed by recorded ops, so a replay writes it.
    def assign(self, value):
        if _traces.active:
            return self._assign_traced(value, None)
        self._value = _canonical(np.array(self._new_value(value, "assign")))
        return self

    def assign_add(self, delta):
        if _traces.active:
            return self._assign_traced(delta, "add")
        self._value = _canonical(np.asarray(self._value + self._new_value(delta, "assign_add")))
        return self

    def assign_sub(self, delta):
        if _traces.active:
            return self._assign_traced(delta, "subtract")
        self._value = _canonical(np.asarray(self._value - self._new_value(delta, "assign_sub")))
        return self

    def _assign_traced(self, value, combine):
        from . import ops
        op = "assign" if combine is None else "assign_" + combine[:3]
        self._new_value(value, op)      # the shape check, before anything changes
        if self._value.dtype.kind != "f":
            observe_all((value,), f"Variable.{op} of the integer variable {self.name!r}")
            new = Tensor(_canonical(np.asarray(getattr(np, combine)(self._value, self._new_value(value, op))
                                               if combine else np.array(self._new_value(value, op)))))
        else:
            value = value if isinstance(value, Tensor) else Tensor(self._new_value(value, op))
            new = ops.cast(value, self.dtype) if combine is None else getattr(ops, combine)(self, value)
            new = ops.identity(new) if new is value else new     # a slot of its own for the variable's value
        self._value = new._value
        assigned(self, new)
        return self

    def _adopt(self, array):
        """Take `array` (already of this variable's shape and dtype, owned by the caller) as the new value."""
        if _traces.active:
            self._assign_traced(array, None)
            return
        self._value = _canonical(array)

    def read_value(self):
        return Tensor(self._value)

    # copy.copy is the variable itself (TensorFlow's rule); a deep copy or an unpickled variable is a new
    # variable (its own id) holding a copy of the value.
    def __deepcopy__(self, memo):
        new = Variable(np.array(self._value), self.trainable, self.name)
        memo[id(self)] = new
        return new

    def __reduce__(self):
        return Variable, (np.array(self._value), self.trainable, self.name)

    def __repr__(self):
        v = self._value
        return (f"<jitape.Variable '{self.name}' shape={v.shape} dtype={v.dtype.name}, "
                f"numpy={np.array2string(np.asarray(v))}>")

    __str__ = __repr__


class VariableRead(Tensor):
    """The value a Variable had when a recorded op read it. It keeps the variable's id, so gradients with
    respect to the variable sum over all its reads, and the VJPs of earlier reads see earlier values."""
    __slots__ = ()
    _is_variable = True

    def __init__(self, variable):
        self._value = variable._value
        self._id = variable._id


def constant(value, dtype=None, shape=None, name=None):
    """A Tensor holding `value`: Python floats and float lists become floatx, ints int32, numpy keeps its dtype.

    >>> import jitape as jt
    >>> jt.constant(3.0)
    jitape.Tensor(3.0, shape=(), dtype=float32)
    """
    if isinstance(value, (list, tuple)) and _holds_tensor(value):
        packed = _pack(value, dtype)
        return packed if shape is None else _reshaped(packed, shape)
    v = to_numpy(value, dtype)
    if shape is not None:
        v = _canonical(np.broadcast_to(v, tuple(shape)).copy() if np.ndim(v) == 0 else np.reshape(v, shape))
    return Tensor(v)


def convert_to_tensor(value, dtype=None, dtype_hint=None, name=None):
    """`value` as a Tensor (returned unchanged when it already is one of the right dtype); a nest holding
    tensors is packed with recorded ops, so gradients flow through it.

    As in TensorFlow, a Tensor of another dtype is refused (use jt.cast), and `dtype_hint` applies only
    to Python values.

    >>> import jitape as jt
    >>> jt.convert_to_tensor([1, 2], dtype=jt.float64).dtype
    dtype('float64')
    """
    if isinstance(value, Tensor):
        if dtype is not None and value._value.dtype != np.dtype(dtype):
            raise ValueError(f"convert_to_tensor: requested dtype {np.dtype(dtype).name} for a Tensor of dtype "
                             f"{value._value.dtype.name}; use jt.cast to convert it")
        return value
    if isinstance(value, (list, tuple)) and _holds_tensor(value):
        return _pack(value, dtype)
    if dtype is None and dtype_hint is not None and not isinstance(value, (np.ndarray, np.generic)):
        return Tensor(to_numpy(value, dtype_hint))
    return Tensor(to_numpy(value, dtype))


def _holds_tensor(nest):
    return any(isinstance(v, Tensor) or isinstance(v, (list, tuple)) and _holds_tensor(v) for v in nest)


def _pack(nest, dtype):
    """A nest of tensors and numbers as one Tensor built by recorded ops (TensorFlow packs with tf.stack):
    numbers take the dtype of the tensors in the nest (weak typing) unless `dtype` is given."""
    from .ops import cast, stack
    if dtype is None:
        dtypes = {t.dtype for t in _leaves(nest) if isinstance(t, Tensor)}
        dtype = np.result_type(*dtypes) if dtypes else None

    def pack(v):
        if isinstance(v, (list, tuple)):
            return stack([pack(e) for e in v])
        t = v if isinstance(v, Tensor) else Tensor(to_numpy(v, dtype))
        return t if dtype is None or t.dtype == dtype else cast(t, dtype)
    return pack(nest)


def _leaves(nest):
    for v in nest:
        if isinstance(v, (list, tuple)):
            yield from _leaves(v)
        else:
            yield v


def _reshaped(t, shape):
    from .ops import reshape
    return reshape(t, tuple(shape))
