"""Functional derivatives: jt.grad, jt.value_and_grad, jt.jacobian, jt.hessian, jt.hessian_vector_product.

Each wraps f in a jt.function: a call replays f's Program in one compiled
forward sweep and differentiates that replay with one compiled sweep (K
columns for Jacobians and Hessians) planned once per traced variant. Inside a
trace or under a recording tape they run on a GradientTape instead, so their
results are themselves recorded (jt.grad(jt.grad(f)) works).
"""
import functools

import numpy as np

from . import nest
from .backend import HESSIAN_SWEEPS
from .execute import one_reverse_sweep, source_gradients, source_hessian, source_jacobians
from .replay import Function, signature
from .recording import _state
from .tape import GradientTape
from .tensor import Tensor, Variable, floatx
from .tracing import _traces


def _function(f):
    """The jt.function a functional derivative replays: its own, whose traces record inner gradients with the
    VJPs (they are differentiated); a loaded function is replayed as it is."""
    if isinstance(f, Function):
        if f.differentiated or not f.has_python:
            return f
        return f.sibling(f.python_function)
    return Function(f, differentiated=True)


def _argnums_for(argnums, what):
    """_argnums(argnums, n_args, what) as a function of n_args, worked out once per argument count."""
    known = {}

    def of(n_args):
        found = known.get(n_args)
        if found is None:
            found = known[n_args] = _argnums(argnums, n_args, what)
        return found
    return of


def _argnums(argnums, n_args, what):
    many = not isinstance(argnums, int)
    nums = tuple(argnums) if many else (argnums,)
    for i in nums:
        if not isinstance(i, int) or not -n_args <= i < n_args:
            raise ValueError(f"{what}: argnums {argnums!r} out of range for {n_args} positional arguments")
    return tuple(i % n_args for i in nums), many


def _float_tensor(arg):
    return type(arg) is Tensor and arg._value.dtype.kind == "f"


def _differentiable_args(args, nums, what):
    """args with Python floats among the differentiated ones made floatx arrays; ints and other dtypes
    refused, naming the argument."""
    for i in nums:
        if not _float_tensor(args[i]):
            break
    else:
        return args         # the common arguments, float Tensors, as they are
    args = list(args)
    for i in nums:
        if _float_tensor(args[i]):
            continue
        leaves = nest.flatten(args[i])
        fixed = []
        for leaf in leaves:
            if isinstance(leaf, float):
                leaf = np.asarray(leaf, floatx())
            value = getattr(leaf, "_value", leaf)
            if not isinstance(value, np.ndarray | np.generic) or value.dtype.kind != "f":
                got = type(leaf).__name__ if not hasattr(value, "dtype") else f"dtype {value.dtype}"
                raise TypeError(f"{what}: argument {i} must hold float tensors or arrays to differentiate, "
                                f"got {got}")
            fixed.append(leaf)
        args[i] = nest.pack_like(args[i], fixed)
    return tuple(args)


def _source_leaves(args, kwargs, nums):
    """Indices in flatten((args, kwargs)) of the leaves of the differentiated arguments, per argument."""
    starts = [0]
    for a in args:
        starts.append(starts[-1] + (1 if isinstance(a, Tensor) else len(nest.flatten(a))))
    return [list(range(starts[i], starts[i + 1])) for i in nums]


def _as_tensor(leaf):
    return leaf if isinstance(leaf, Tensor) else Tensor(np.asarray(leaf)[()])


class _Leaf:
    """What the results need of a differentiated argument leaf: its shape and dtype (the same for every call
    of one traced variant, so kept with it rather than the leaf's values)."""
    __slots__ = ("shape", "dtype", "size")

    def __init__(self, value):
        self.shape, self.dtype, self.size = value.shape, value.dtype, value.size


class _Call:
    """One call of f through its jt.function: the variant replayed (or traced), its outputs and the slots
    of the differentiated leaves."""

    def __init__(self, fn, args, kwargs, nums, purpose=None, sweeps=(), bound_later=False):
        concrete, leaves, traced = fn.replay(args, kwargs, purpose, sweeps, bound_later)
        if concrete.gradient_steps or concrete.host_steps:
            raise ValueError(f"{fn.__name__!r} takes derivatives inside with the compiled sweeps (a loaded "
                             f"function): its Program cannot be differentiated; differentiate the Python function "
                             f"instead")
        self.concrete = concrete
        self.outputs = concrete.finish() if traced is None else traced[0]
        self._nums = nums
        # the variant fixes the arguments' structure, shapes and dtypes: their layout is worked out once
        layout = concrete.memo.get(("arguments", nums))
        if layout is None:
            groups = self._layout(concrete, leaves, args, kwargs, nums)
            layout = concrete.memo["arguments", nums] = (groups, [s for group in groups for s in group])
        self.groups, self.sources = layout

    @staticmethod
    def _layout(concrete, leaves, args, kwargs, nums):
        """Per differentiated argument, (_Leaf, slot) per leaf."""
        slot_of_leaf = dict(concrete.arg_slots)
        # a Variable argument is read like any variable: its slot is a variable input (-1: f never reads it)
        slot_of_variable = {id(v): s for v, s in concrete.variable_inputs}
        return [[(_Leaf(_as_tensor(leaves[i])), slot_of_variable.get(id(leaves[i]), -1)
                  if isinstance(leaves[i], Variable) else slot_of_leaf[i]) for i in group]
                for group in _source_leaves(args, kwargs, nums)]

    def target(self, value, what):
        """The slot of the output `value` (a Tensor) and whether it was recorded (False: a constant)."""
        if not isinstance(value, Tensor):
            raise TypeError(f"{what}: f must return a Tensor, got {type(value).__name__}")
        entry = self.concrete.outputs[0]
        return entry[1] if entry[0] == "slot" else -1

    def program(self, target):
        return self.concrete.program([target], [slot for _, slot in self.sources])

    def packing(self, many, shape_of):
        """The _Packing of this call's derivatives (see there)."""
        return _Packing(self.groups, self._nums, many, shape_of)


class _Packing:
    """Derivatives as the differentiated arguments hold their leaves: called with found, one array, numpy scalar
    or Tensor per source leaf (None: not connected, zeros), and the arguments; many: a tuple of one result per
    differentiated argument; shape_of(_Leaf): the shape of a leaf's derivative."""

    def __init__(self, groups, nums, many, shape_of):
        self.nums, self.many = nums, many
        self.leaves = [[(leaf.dtype, shape_of(leaf)) for leaf, _ in group] for group in groups]

    def __call__(self, found, args):
        if not self.many and len(found) == 1 and type(args[self.nums[0]]) is Tensor:     # the common call
            return Tensor(_derivative(found[0], *self.leaves[0][0]))
        it = iter(found)
        results = []
        for leaves, i in zip(self.leaves, self.nums):
            arg = args[i]
            derivatives = [Tensor(_derivative(next(it), dtype, shape)) for dtype, shape in leaves]
            results.append(derivatives[0] if type(arg) is Tensor else nest.pack_like(arg, derivatives))
        return tuple(results) if self.many else results[0]


def _derivative(value, dtype, shape):
    """A leaf's derivative `value` (an array, numpy scalar or Tensor; None: zeros of `dtype`) as `shape`."""
    if type(value) is Tensor:
        value = value._value
    if value is None:
        return np.zeros(shape, dtype)[()]
    if isinstance(value, np.generic) and shape == ():
        return value
    return np.asarray(value).reshape(shape)[()]


def _taken_in_replay(fn, args, kwargs, purpose):
    """A call whose traced variant took `purpose`'s derivatives in its own compiled call before (memo[purpose]
    holds the variant's _Packing), made in short: (its outputs, its derivatives packed like the arguments); else
    None, with nothing run that a call the slow way would need undone."""
    key, leaves = signature(args, kwargs)
    variants = fn._variants.get(key)
    if variants is None:
        return None
    concrete = variants[0]
    packing = concrete.memo.get(purpose)
    if packing is None or not concrete.bound(purpose, fn.backend) or not concrete.run(leaves, fn.backend, purpose):
        return None
    outputs = concrete.finish()
    return outputs, packing(concrete.gradients(purpose), args)


def _on_tape(f, args, kwargs, nums):
    """Eager: f recorded on a persistent tape watching the differentiated leaves (results recorded on any
    enclosing tape or trace)."""
    watched = [[_as_tensor(leaf) for leaf in nest.flatten(args[i])] for i in nums]
    args = list(args)
    for i, leaves in zip(nums, watched):
        args[i] = nest.pack_like(args[i], leaves)
    with GradientTape(persistent=True) as tape:
        tape.watch([t for group in watched for t in group])
        out = f(*args, **kwargs)
    return tape, out, [t for group in watched for t in group], args


def _eager():
    """Inside a trace or under a recording tape: the derivative must itself be recorded."""
    return bool(_traces.active or _state.recording)


def value_and_grad(f, argnums=0, has_aux=False):
    """A function returning (f(*args), the gradient of f w.r.t. args[argnums]) (with has_aux, f returns
    (value, aux) and the result is ((value, aux), gradient)), as in JAX.

    >>> import jitape as jt
    >>> vg = jt.value_and_grad(lambda x: jt.reduce_sum(x ** 3))
    >>> value, g = vg(jt.constant([1.0, 2.0]))
    >>> float(value), g.numpy()
    (9.0, array([ 3., 12.], dtype=float32))
    """
    fn = _function(f)
    argnums_of = _argnums_for(argnums, "value_and_grad")

    @functools.wraps(fn.python_function)
    def value_and_grad_f(*args, **kwargs):
        nums, many = argnums_of(len(args))
        args = _differentiable_args(args, nums, "value_and_grad")
        if _eager():
            tape, out, sources, args = _on_tape(fn.python_function, args, kwargs, nums)
            value = _value(out, has_aux, "value_and_grad")
            grads = tape.gradient(value, sources, unconnected_gradients="zero")
            return out, _pack_groups(args, nums, grads, many)
        # after its first call, a variant takes this gradient in the replay's own compiled call
        purpose = ("value_and_grad", nums)
        taken = _taken_in_replay(fn, args, kwargs, purpose)
        if taken is not None:
            return taken
        # a first call's gradient: a reverse sweep over the trace, then a replay with gradient steps bound
        call = _Call(fn, args, kwargs, nums, purpose, ("reverse", "replay", "steps"), bound_later=True)
        value = _value(call.outputs, has_aux, "value_and_grad")
        target = call.target(value, "value_and_grad")
        packing = call.packing(many, lambda t: t.shape)
        if target < 0:
            found = [None] * len(call.sources)
        elif call.concrete.ran == purpose:
            found = call.concrete.gradients(purpose)
        else:
            seed = np.ones((1, 1), call.concrete.dtype)
            found = source_gradients(call.program(target), [seed], [t for t, _ in call.sources])
            call.concrete.bind_gradient(purpose, target, [slot for _, slot in call.sources],
                                        [t.dtype for t, _ in call.sources], fn.backend)
            call.concrete.memo[purpose] = packing       # its outputs checked: later calls take the short way
        return call.outputs, packing(found, args)

    return value_and_grad_f


def _value(out, has_aux, what):
    if has_aux:
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            raise TypeError(f"{what} with has_aux=True: f must return a pair (value, aux)")
        out = out[0]
    if not isinstance(out, Tensor) or out.shape != () or out.dtype.kind != "f":
        raise TypeError(f"{what}: f must return a float scalar Tensor, got "
                        f"{getattr(out, 'shape', type(out).__name__)}")
    return out


def _pack_groups(args, nums, flat, many):
    it = iter(flat)
    results = [nest.pack_like(args[i], [next(it) for _ in nest.flatten(args[i])]) for i in nums]
    return tuple(results) if many else results[0]


def grad(f, argnums=0, has_aux=False):
    """A function returning the gradient of the scalar f w.r.t. args[argnums] (with has_aux, (gradient, aux)).

    >>> import jitape as jt
    >>> df = jt.grad(lambda x: jt.reduce_sum(jt.sin(x)))
    >>> df(jt.constant([0.0])).numpy()
    array([1.], dtype=float32)
    """
    vg = value_and_grad(f, argnums, has_aux)

    @functools.wraps(vg)
    def grad_f(*args, **kwargs):
        out, g = vg(*args, **kwargs)
        return (g, out[1]) if has_aux else g

    return grad_f


def jacobian(f, argnums=0):
    """A function returning d f / d args[argnums], each of shape f's shape + the argument leaf's shape, from
    one compiled sweep with K columns (reverse or forward mode, whichever is fewer).

    >>> import jitape as jt
    >>> jt.jacobian(lambda x: x * x)(jt.constant([1.0, 2.0])).numpy()
    array([[2., 0.],
           [0., 4.]], dtype=float32)
    """
    fn = _function(f)
    argnums_of = _argnums_for(argnums, "jacobian")

    @functools.wraps(fn.python_function)
    def jacobian_f(*args, **kwargs):
        nums, many = argnums_of(len(args))
        args = _differentiable_args(args, nums, "jacobian")
        if _eager():
            tape, out, sources, args = _on_tape(fn.python_function, args, kwargs, nums)
            _check_output(out, "jacobian")
            return _pack_groups(args, nums, tape.jacobian(out, sources, unconnected_gradients="zero"), many)
        # after its first call, a variant whose Jacobian is one reverse sweep takes it in the replay's call
        purpose = ("jacobian", nums)
        taken = _taken_in_replay(fn, args, kwargs, purpose)
        if taken is not None:
            return taken[1]
        call = _Call(fn, args, kwargs, nums, purpose)
        out = call.outputs
        _check_output(out, "jacobian")
        target = call.target(out, "jacobian")
        sources = [t for t, _ in call.sources]
        packing = call.packing(many, lambda t: out.shape + t.shape)
        if target < 0:
            found = [None] * len(sources)
        elif call.concrete.ran == purpose:
            found = call.concrete.gradients(purpose)
        else:
            program = call.program(target)
            found = source_jacobians(program, out.size, sources)
            if one_reverse_sweep(program, out.size, sources):
                call.concrete.bind_gradient(purpose, target, [slot for _, slot in call.sources],
                                            [t.dtype for t in sources], fn.backend, columns=out.size)
                call.concrete.memo[purpose] = packing       # its output checked: later calls take the short way
        return packing(found, args)

    return jacobian_f


def _check_output(out, what):
    if not isinstance(out, Tensor) or out.dtype.kind != "f":
        raise TypeError(f"{what}: f must return one float Tensor, got {type(out).__name__}")


def hessian(f, argnums=0):
    """A function returning the Hessian of the scalar f w.r.t. args[argnums] (one float tensor), shape
    arg.shape + arg.shape: one compiled reverse sweep, then one tangent and one second-order sweep with
    K = arg.size columns.

    >>> import jitape as jt
    >>> jt.hessian(lambda x: jt.reduce_sum(x ** 3))(jt.constant([1.0, 2.0])).numpy()
    array([[ 6.,  0.],
           [ 0., 12.]], dtype=float32)
    """
    return _second_order(f, argnums, "hessian", with_vector=False)


def hessian_vector_product(f, argnums=0):
    """A function `hvp(v, *args, **kwargs)` returning (d² f / d args[argnums]²) · v, shaped like the argument:
    traced once per signature as a tape's Hessian-vector product (the gradient's rows differentiated again,
    recorded), then replayed compiled, its rows fused as any jt.function's (a loaded function, which has no
    Python to trace: one reverse sweep and one tangent sweep along v, K = 1).

    >>> import jitape as jt
    >>> hvp = jt.hessian_vector_product(lambda x: jt.reduce_sum(x ** 3))
    >>> hvp(jt.constant([1.0, 1.0]), jt.constant([1.0, 2.0])).numpy()
    array([ 6., 12.], dtype=float32)
    """
    return _second_order(f, argnums, "hessian_vector_product", with_vector=True)


def _second_order(f, argnums, what, with_vector):
    fn = _function(f)
    if not isinstance(argnums, int):
        raise ValueError(f"{what}: argnums must be one int (the argument to differentiate), got {argnums!r}")
    # an HVP replays its traced tape 2-13x faster than the sweeps below (whose forward keeps every value and
    # whose reverse runs row by row): W10's 7.94 -> 3.21 ms, W1's chain 1.63 -> 0.127, a logistic loss 0.21 -> 0.12
    traced = _traced_hvp(fn, what) if with_vector and fn.has_python else None

    def run(args, kwargs, v):
        nums, _ = _argnums(argnums, len(args), what)
        args = _differentiable_args(args, nums, what)
        if len(nest.flatten(args[nums[0]])) != 1:
            raise TypeError(f"{what}: argument {nums[0]} must be one tensor, not a nest")
        if with_vector:
            v = _vector_tensor(v, _as_tensor(nest.flatten(args[nums[0]])[0]), what)
            if _eager():
                return _tape_hvp(fn.python_function, what, v, nums[0], *args, **kwargs)
            if traced is not None:
                return traced(v, nums[0], *args, **kwargs)
        elif _eager():
            tape, out, (source,), _ = _on_tape(fn.python_function, args, kwargs, nums)
            _value(out, False, what)
            h = tape.hessian(out, source)
            return h if h is not None else Tensor(np.zeros(source.shape + source.shape, source.dtype))
        call = _Call(fn, args, kwargs, nums, sweeps=HESSIAN_SWEEPS)
        out = _value(call.outputs, False, what)
        ((source, slot),) = call.sources
        target = call.target(out, what)
        shape = source.shape if with_vector else source.shape + source.shape
        found = None
        if target >= 0:
            directions = np.reshape(v._value, (-1, 1)).astype(call.concrete.dtype) if with_vector else None
            found = source_hessian(call.program(target), source.size, directions)
        if found is None:
            return Tensor(np.zeros(shape, source.dtype)[()])
        return Tensor(found.astype(source.dtype).reshape(shape)[()])

    if with_vector:
        def hvp_f(v, *args, **kwargs):
            return run(args, kwargs, v)
        return functools.wraps(fn.python_function)(hvp_f)

    def hessian_f(*args, **kwargs):
        return run(args, kwargs, None)
    return functools.wraps(fn.python_function)(hessian_f)


def _tape_hvp(python_function, what, v, num, *args, **kwargs):
    """(d² f / d args[num]²) · v (v: _vector_tensor's) on a persistent tape, zeros where f does not depend on
    the argument: run eagerly, or traced by jt.hessian_vector_product's jt.function, where v is an input."""
    tape, out, (source,), _ = _on_tape(python_function, args, kwargs, (num,))
    _value(out, False, what)
    hv = tape.hessian_vector_product(out, source, v)
    return hv if hv is not None else Tensor(np.zeros(source.shape, source.dtype)[()])


def _traced_hvp(fn, what):
    """The jt.function (with fn's settings) of _tape_hvp over fn's Python function, named after it: not a
    differentiated one (fn.sibling), whose replays keep every value (logsumexp of 40,000: 0.25 ms against 0.145)."""
    python_function = fn.python_function

    def hvp(v, num, *args, **kwargs):
        return _tape_hvp(python_function, what, v, num, *args, **kwargs)
    hvp.__name__ = hvp.__qualname__ = f"{what}({getattr(python_function, '__name__', 'f')})"
    return Function(hvp, fn.retrace_warning, fn.backend)


def _vector_tensor(v, source, what):
    """v checked against `source` (its shape; its dtype, cast to): a Tensor, v itself where it is one already."""
    array = np.asarray(getattr(v, "_value", v), source.dtype)
    if array.shape != source.shape:
        raise ValueError(f"{what}: v has shape {array.shape}, expected the argument's shape {source.shape}")
    return v if isinstance(v, Tensor) and v._value is array else Tensor(array[()])
