"""Keras 3 optimizers (SGD, Adam): per-variable slots and fused update steps in
each variable's dtype, applied with `Variable.assign`.

The optimizer's state (slots and the step count) lives in Variables, so inside
a jt.function the update is recorded with jitape ops (the same operations in
the same order as the fused kernels) and a replayed training step updates the
variables and the state in compiled code.
"""

import numbers
import warnings

import numpy as np

from jitape_kernels.cpu.optimizers import adam_step, sgd_momentum_step

from .tensor import Tensor, Variable
from .tracing import _traces


class Optimizer:
    """Base class: validates `(gradient, variable)` pairs, keeps per-variable
    slots keyed by variable identity, and counts `iterations`.

    Subclasses set `_slot_count` (flat arrays kept per variable) and implement
    `_update(value, grad, lr, slots, out)`: all arrays 1-D and contiguous, in
    the variable's dtype; the new value goes to `out`.
    """

    _slot_count = 0

    def __init__(self, learning_rate):
        if not callable(learning_rate):
            _check_number("learning_rate", learning_rate)
        self.learning_rate = learning_rate
        self._step = None       # the update count, a Variable in the first updated variable's dtype
        self._slots = {}

    @property
    def iterations(self):
        """The number of updates applied so far (counted in the variables' float dtype, as Keras's
        bias correction sees it: exact to 2**24 updates in float32)."""
        return 0 if self._step is None else int(self._step._value)

    def _update_scalar(self, value, grad, lr):
        """_update's new value of a 0-d variable from numpy scalars of its dtype, with the same operations in
        the same order; None where a subclass has no such update (it then runs _update)."""
        return None

    def _step_variable(self, dtype):
        if self._step is None:
            # the variables' dtype: a float64 count would make a float32 training step's Program float64
            self._step = Variable(np.zeros((), dtype), trainable=False, name="iterations")
        return self._step

    def apply_gradients(self, grads_and_vars):
        """Update each variable from its gradient; returns `iterations`.

        `grads_and_vars` is any iterable of `(gradient, variable)` pairs, such
        as `zip(grads, model.trainable_variables)`. Gradients may be Tensors,
        numpy arrays or numbers; `None` gradients are skipped with a warning.
        Every pair is checked before any variable changes, so a bad pair
        leaves all variables and slots as they were.
        """
        pairs, missing = _validate(grads_and_vars)
        if missing:
            warnings.warn(
                f"Gradients do not exist for variables {missing} when "
                "minimizing the loss; they were left unchanged.", stacklevel=2)
        step = self._step_variable(pairs[0][2].dtype)
        if _traces.active:
            return self._apply_traced(pairs, step)
        lr = self.learning_rate
        if callable(lr):
            lr = lr(self.iterations)
        for _, grad, var in pairs:
            value = var._value
            if type(value) is not np.ndarray:       # 0-d: numpy scalars (an array costs ~0.5 us per numpy call)
                new = self._update_scalar(value, value.dtype.type(grad), value.dtype.type(lr))
                if new is not None:
                    var._value = new
                    continue
            grad = np.ascontiguousarray(grad, dtype=var.dtype).reshape(-1)
            # A fresh output array: the old value may still be referenced by
            # tapes, so it is never written in place.
            out = np.empty(var.shape, var.dtype)
            value = np.ascontiguousarray(value).reshape(-1)
            slots = self._slots_for(var)
            self._update(value, grad, var.dtype.type(lr), [s._value for s in slots], out.reshape(-1))
            for s in slots:     # written in place (nothing else holds them): replays reading them copy them again
                s._changed()
            var._adopt(out)
        step._value = step._value + 1
        return self.iterations

    def _apply_traced(self, pairs, count):
        """The update in a jt.function trace: recorded ops on the variables and the optimizer's state
        variables, in the fused kernels' order of operations."""
        from . import ops
        lr = self.learning_rate(count) if callable(self.learning_rate) else self.learning_rate
        step = ops.add(count, 1.0)
        for grad, _, var in pairs:
            g = ops.reshape(ops.cast(grad, var.dtype), (-1,))
            lr_t = ops.cast(lr, var.dtype) if isinstance(lr, Tensor) else var.dtype.type(lr)
            new = self._update_traced(ops.reshape(var, (-1,)), g, lr_t, self._slots_for(var),
                                      ops.cast(step, var.dtype))
            var.assign(ops.reshape(new, var.shape))
        count.assign(step)
        return step

    def _slots_for(self, var):
        entry = self._slots.get(id(var))
        if entry is None or entry[0] is not var:
            # The entry keeps `var` alive, so its id cannot be reused by
            # another variable while the optimizer holds slots for it.
            size = int(np.prod(var.shape))
            state = [Variable(np.zeros(size, var.dtype), trainable=False, name=f"{var.name}/slot{i}")
                     for i in range(self._slot_count)]
            entry = self._slots[id(var)] = (var, state)
        return entry[1]


class SGD(Optimizer):
    """Stochastic gradient descent with optional (Nesterov) momentum, with
    Keras 3's update: `m = momentum*m - lr*g; var += m` (Nesterov:
    `var += momentum*m - lr*g`); without momentum `var -= lr*g`.

    >>> import jitape as jt
    >>> w = jt.Variable(2.0)
    >>> opt = jt.optimizers.SGD(learning_rate=0.1)
    >>> with jt.GradientTape() as tape:
    ...     loss = w * w
    >>> opt.apply_gradients(zip([tape.gradient(loss, w)], [w]))
    1
    >>> round(float(w), 6)  # 2 - 0.1 * 4
    1.6
    """

    def __init__(self, learning_rate=0.01, momentum=0.0, nesterov=False):
        super().__init__(learning_rate)
        _check_number("momentum", momentum)
        if not 0.0 <= momentum <= 1.0:
            raise ValueError(f"momentum must be a float in [0, 1], got {momentum!r}")
        self.momentum = float(momentum)
        self.nesterov = bool(nesterov)
        self._slot_count = 1 if self.momentum else 0

    def _update(self, value, grad, lr, slots, out):
        if self.momentum:
            sgd_momentum_step(value, grad, slots[0], lr, value.dtype.type(self.momentum),
                               self.nesterov, out)
        else:
            np.subtract(value, grad * lr, out=out)

    def _update_scalar(self, value, grad, lr):
        return None if self.momentum else value - grad * lr

    def _update_traced(self, value, grad, lr, slots, step):
        scaled = grad * lr
        if not self.momentum:
            return value - scaled
        (m,) = slots
        m.assign(m * self.momentum - scaled)
        return value + (m * self.momentum - scaled) if self.nesterov else value + m


class Adam(Optimizer):
    """Adam with Keras 3's update, computed in the variable's dtype:
    `lr_t = lr*sqrt(1-beta_2**t)/(1-beta_1**t)`, `m += (g-m)*(1-beta_1)`,
    `v += (g*g-v)*(1-beta_2)`, `var -= m*lr_t/(sqrt(v)+epsilon)` (AMSGrad:
    `v` replaced by its running maximum).

    >>> import jitape as jt
    >>> w = jt.Variable([1.0, -1.0])
    >>> opt = jt.optimizers.Adam(learning_rate=0.1)
    >>> with jt.GradientTape() as tape:
    ...     loss = jt.reduce_sum(w * w)
    >>> opt.apply_gradients(zip([tape.gradient(loss, w)], [w]))
    1
    >>> w.numpy().round(4)  # the first Adam step moves each weight by ~lr
    array([ 0.9, -0.9], dtype=float32)
    """

    def __init__(self, learning_rate=0.001, beta_1=0.9, beta_2=0.999,
                 epsilon=1e-7, amsgrad=False):
        super().__init__(learning_rate)
        for name, value in (("beta_1", beta_1), ("beta_2", beta_2), ("epsilon", epsilon)):
            _check_number(name, value)
        self.beta_1 = float(beta_1)
        self.beta_2 = float(beta_2)
        self.epsilon = float(epsilon)
        self.amsgrad = bool(amsgrad)
        self._slot_count = 3 if self.amsgrad else 2  # m, v (, v_hat)

    def _update(self, value, grad, lr, slots, out):
        d = value.dtype.type
        step = d(self.iterations + 1)
        alpha = lr * np.sqrt(d(1) - d(self.beta_2) ** step) / (d(1) - d(self.beta_1) ** step)
        v_hat = slots[2] if self.amsgrad else slots[1][:0]
        adam_step(value, grad, slots[0], slots[1], v_hat, d(1.0 - self.beta_1),
                   d(1.0 - self.beta_2), alpha, d(self.epsilon), out)

    def _update_traced(self, value, grad, lr, slots, step):
        from . import ops
        d = value.dtype.type
        alpha = lr * ops.sqrt(1.0 - ops.pow(d(self.beta_2), step)) / (1.0 - ops.pow(d(self.beta_1), step))
        m, v = slots[0], slots[1]
        m.assign(m + (grad - m) * (1.0 - self.beta_1))
        second = v + (grad * grad - v) * (1.0 - self.beta_2)
        v.assign(second)
        if self.amsgrad:
            slots[2].assign(ops.maximum(slots[2], second))
            second = slots[2]
        return value - m * alpha / (ops.sqrt(second) + d(self.epsilon))


def _check_number(name, value):
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {value!r}")


def _validate(grads_and_vars):
    """Return ([(grad as given, grad as a numpy array, var), ...],
    names of variables whose gradient is None), raising on any bad pair."""
    pairs, missing = [], []
    for index, pair in enumerate(grads_and_vars):
        try:
            grad, var = pair
        except (TypeError, ValueError):
            raise TypeError(
                "apply_gradients expects (gradient, variable) pairs, e.g. "
                f"zip(grads, model.trainable_variables); item {index} is {pair!r}"
            ) from None
        if not isinstance(var, Variable):
            raise TypeError(
                f"apply_gradients: item {index} pairs its gradient with a "
                f"{type(var).__name__}, expected a jitape Variable")
        if grad is None:
            missing.append(var.name)
            continue
        array = np.asarray(grad._value if isinstance(grad, Tensor) else grad)   # shape and dtype checks only
        if array.dtype.kind not in "fiub":
            raise TypeError(
                f"Gradient for variable '{var.name}' has dtype {array.dtype}; "
                "expected a real number type")
        shape = var.shape
        if array.shape != shape:
            raise ValueError(
                f"Gradient for variable '{var.name}' has shape {array.shape}, "
                f"but the variable has shape {shape}; pair each gradient "
                "with its own variable, e.g. zip(tape.gradient(loss, vars), vars)")
        pairs.append((grad, array, var))
    if not pairs:
        raise ValueError(
            "No gradients provided for any variable"
            + (f": {missing}" if missing else " (grads_and_vars was empty)"))
    return pairs, missing
