"""The arguments of the sweeps and planners for an empty Program of a dtype: arrays of the types the executor and
replays pass (numba compiles a kernel per argument types), from which the warmup compiles every entry point and a
cold start (compile_ahead.py) names the signatures a first derivative will call."""
import numpy as np

from .. import opcodes as oc
from ..layout import SC_FLAGS
from ..planning import READS_ALL
from .fusion import KERNEL_COLUMNS


def read_only(array):
    """`array`, made read-only: as the operands strided_arithmetic takes and the recorded rows plan() takes (views
    of a tape's bytes); numba types a read-only array apart."""
    array.flags.writeable = False
    return array


def empty_program(dtype):
    """A Program's code, slots, iattr, fattr and arena, empty."""
    code = np.zeros((0, oc.W), np.int64)
    slots = np.zeros((0, oc.S), np.int64)
    return code, slots, np.zeros(0, np.int64), np.zeros(0, np.float64), np.zeros(0, dtype)


def reverse_arrays(dtype):
    """reverse_sweep's arguments but its kernel table: one cotangent column."""
    return (*empty_program(dtype), np.zeros((0, 1), dtype), np.zeros(0, np.bool_), np.zeros(0, np.int64),
            np.zeros(0, dtype))


def tangent_arrays(dtype):
    """tangent_sweep's arguments but its kernel table: one tangent column, no seed."""
    return (*empty_program(dtype), np.zeros((0, 1), dtype), np.zeros(0, np.int64), -1, 0, -1, np.zeros(0, np.int64),
            np.zeros(0, dtype))


def second_order_arrays(dtype):
    """second_order_sweep's arguments but its kernel table: one column."""
    column = np.zeros((0, 1), dtype)
    return (*empty_program(dtype), column, column, column, np.zeros(0, np.int64), np.zeros(0, np.int64),
            np.zeros(0, dtype))


def replay_arrays(dtype):
    """replay_sweep's arguments but its kernel table (the types jitape.replay passes)."""
    d = dtype
    return (*empty_program(d), np.zeros((0, 8), np.int64), np.zeros((0, oc.W), np.int64), np.zeros((0, 4), np.int64),
            np.zeros((0, 1), d), np.zeros((0, 3), np.int64), np.zeros(0, d), np.zeros(0, np.int64),
            np.zeros((0, 4), np.int64), np.zeros(0, d), np.zeros(0, d), np.zeros(0, np.int64),
            np.zeros((0, 4), np.int64), np.zeros((0, SC_FLAGS + 1), np.int64), np.zeros((0, SC_FLAGS + 1), np.int64),
            np.zeros((0, KERNEL_COLUMNS), np.int64), np.zeros(0, np.int64), np.full(1, -1, np.int64))


def plan_arguments():
    """plan()'s arguments as a tape's derivatives and a trace pass them: the recorded rows and slot rows read-only."""
    return (read_only(np.zeros((0, 6), np.int64)), read_only(np.zeros((0, 3 + oc.MAXRANK), np.int64)),
            np.zeros(0, np.int64), np.zeros(0, np.int64), False, READS_ALL, 0)


def derivative_plan_arguments():
    return np.zeros((0, oc.W), np.int64), np.zeros((0, oc.S), np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64)


def planned_temps_arguments():
    return np.zeros((0, oc.W), np.int64), np.zeros(0, np.int64)
