"""The thread-local stack of active traces (jt.function) and the hooks through which values leave a trace.

A trace records a function as a Program that later calls replay without
Python. Whatever the function computes from a traced value outside the
recorded instructions would be a stale constant on replay, so every such
place reports here: `observe` turns the value into a guard (replay checks it
and retraces when it differs), `assigned` tells the trace a variable's new
value. This module imports nothing from jitape, so `tensor` and `ops` can use it.
"""
import threading


class _Traces(threading.local):
    def __init__(self):
        self.active = []        # the traces recording in this thread, innermost last


_traces = _Traces()


def active():
    """The traces recording in this thread (empty outside jt.function's tracing)."""
    return _traces.active


def observe(tensor, how):
    """`tensor`'s value is read into Python (`how` says where, for the retrace warning): in a trace that
    tracks it, the value becomes a guard of the Program."""
    for trace in _traces.active:
        trace.guard(tensor, how)


def observe_all(values, how):
    """observe every Tensor among `values` (an op's arguments, one level of lists and tuples)."""
    if not _traces.active:
        return
    for v in values:
        if isinstance(v, (list, tuple)):
            observe_all(v, how)
        elif hasattr(v, "_id") and hasattr(v, "_value"):
            observe(v, how)


def broadcast_constant(tensor):
    """A constant `tensor` (no trace's input or instruction) is broadcast or tiled: traces keep it its own size,
    so the TILE stays an instruction rather than folding into a constant of the full size that every replay
    reads."""
    for trace in _traces.active:
        trace.keep_constant(tensor)


def assigned(variable, value_tensor):
    """`variable` now holds the value of `value_tensor` (a recorded tensor or a constant)."""
    for trace in _traces.active:
        trace.assign(variable, value_tensor)
