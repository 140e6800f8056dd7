"""Control flow with TensorFlow's spellings and eager semantics: cond, while_loop and scan.

They run their Python callables directly, so every op inside is recorded like any other and gradients
(of any order, through nested tapes) flow through the iterations actually taken.
"""
import numpy as np

from . import nest
from .ops.core import constant_value
from .tensor import Tensor


def _predicate(value, what):
    """A Python bool from a bool Tensor, Python bool or scalar; anything else raises."""
    v = constant_value(value, f"the predicate of {what}")
    if np.ndim(v) != 0:
        raise ValueError(f"{what}: the predicate must be a scalar, got shape {np.shape(v)}")
    if np.asarray(v).dtype.kind not in "biuf":
        raise TypeError(f"{what}: the predicate must be a bool or a number, got {type(value).__name__}")
    return bool(v)


def _callable(fn, argument, what):
    if not callable(fn):
        raise TypeError(f"{what}: {argument} must be callable, got {type(fn).__name__}")


def cond(pred, true_fn=None, false_fn=None, name=None):
    """true_fn() if pred else false_fn(): only the branch taken runs (and is recorded).

    >>> import jitape as jt
    >>> x = jt.constant(2.0)
    >>> float(jt.cond(x > 1.0, lambda: x * 10.0, lambda: x))
    20.0
    """
    _callable(true_fn, "true_fn", "cond")
    _callable(false_fn, "false_fn", "cond")
    return true_fn() if _predicate(pred, "cond") else false_fn()


def _structure(s):
    """The nesting of `s` with its leaves blanked out: what must not change between iterations."""
    if isinstance(s, (list, tuple)):
        return (type(s).__name__, tuple(_structure(v) for v in s))
    if isinstance(s, dict):
        return ("dict", tuple((k, _structure(s[k])) for k in sorted(s, key=nest._sort_key)))
    return None


def while_loop(cond, body, loop_vars, shape_invariants=None, parallel_iterations=10, back_prop=True,
               swap_memory=False, maximum_iterations=None, name=None):
    """Repeat `loop_vars = body(*loop_vars)` while `cond(*loop_vars)` holds (at most maximum_iterations
    times); returns the final loop_vars. body must return loop_vars' structure (a nest of lists, tuples and
    dicts). shape_invariants, parallel_iterations and swap_memory change nothing in eager execution.

    >>> import jitape as jt
    >>> i, total = jt.while_loop(lambda i, t: i < 3, lambda i, t: (i + 1, t * 2.0), (0, jt.constant(1.0)))
    >>> i, float(total)
    (3, 8.0)
    """
    _callable(cond, "cond", "while_loop")
    _callable(body, "body", "while_loop")
    if maximum_iterations is not None and int(maximum_iterations) < 0:
        raise ValueError(f"while_loop: maximum_iterations must be >= 0, got {maximum_iterations}")
    single = not isinstance(loop_vars, (list, tuple))      # one loop variable, not in a sequence
    current = [loop_vars] if single else list(loop_vars)
    expected = _structure(current)
    iterations = 0
    while (maximum_iterations is None or iterations < int(maximum_iterations)) \
            and _predicate(cond(*current), "while_loop cond"):
        result = body(*current)
        if single and not isinstance(result, (list, tuple)):
            result = [result]
        if not isinstance(result, (list, tuple)) or _structure(list(result)) != expected:
            raise ValueError(f"while_loop: body must return the structure of loop_vars, "
                             f"{_describe(current)}; iteration {iterations} returned {_describe(result)}")
        current = list(result)
        iterations += 1
    if single:
        return current[0]
    return type(loop_vars)(*current) if hasattr(loop_vars, "_fields") else type(loop_vars)(current)


def _describe(s):
    """A short rendering of a structure, with its leaves as '.'."""
    if isinstance(s, (list, tuple)):
        inner = ", ".join(_describe(v) for v in s)
        return f"[{inner}]" if isinstance(s, list) else f"({inner}{',' if len(s) == 1 else ''})"
    if isinstance(s, dict):
        return "{" + ", ".join(f"{k!r}: {_describe(v)}" for k, v in s.items()) + "}"
    return "."


def scan(fn, elems, initializer=None, parallel_iterations=10, back_prop=True, swap_memory=False,
         infer_shape=True, reverse=False, name=None):
    """TensorFlow's scan: acc = fn(acc, x) over the slices x of `elems` along axis 0 (a nest of tensors
    of one length); returns every acc stacked along a new axis 0, in the structure of `initializer`
    (elems[0] when None, which is then the first output). With reverse=True it runs from the last slice
    to the first, and output i still belongs to slice i.

    >>> import jitape as jt
    >>> jt.scan(lambda acc, x: acc + x, jt.constant([1.0, 2.0, 3.0])).numpy()
    array([1., 3., 6.], dtype=float32)
    """
    from .ops import stack, unstack
    from .ops.core import as_tensor
    _callable(fn, "fn", "scan")
    leaves = [as_tensor(e) for e in nest.flatten(elems)]
    if not leaves:
        raise ValueError("scan: elems must hold at least one tensor")
    if any(t.ndim == 0 for t in leaves) or len({t.shape[0] for t in leaves}) != 1:
        raise ValueError(f"scan: every tensor in elems needs the same leading dimension, got shapes "
                         f"{[t.shape for t in leaves]}")
    n = leaves[0].shape[0]
    slices = [unstack(t) for t in leaves]
    order = list(range(n))[::-1] if reverse else list(range(n))

    def element(i):
        return nest.pack_like(elems, [s[i] for s in slices])

    outputs = {}
    if initializer is None:
        if n == 0:
            raise ValueError("scan: elems are empty and no initializer is given")
        acc = element(order[0])
        outputs[order[0]] = acc
        order = order[1:]
    else:
        acc = initializer
    first = acc
    for i in order:
        result = fn(acc, element(i))
        if _structure(result) != _structure(first):
            raise ValueError(f"scan: fn must return the structure of the accumulator, {_describe(first)}; "
                             f"step {i} returned {_describe(result)}")
        acc = outputs[i] = result
    if n == 0:
        stacked = [Tensor(np.zeros((0,) + np.shape(as_tensor(leaf)._value), as_tensor(leaf).dtype))
                   for leaf in nest.flatten(first)]
    else:
        flat = [nest.flatten(outputs[i]) for i in range(n)]
        stacked = [stack([f[k] for f in flat]) for k in range(len(flat[0]))]
    return nest.pack_like(first, stacked)
