"""A process's first derivative on a cold cache: the planners, the sweep and the kernels it will call, named from
what was recorded and compiled side by side before the planner runs.

A cold first gradient compiled its planners (plan, planned_temps) in its own process, one after another, and
only then, knowing the planned code, its sweep and row kernels side by side (row_kernels.kernel_table): ~3 s of a
~9 s first gradient with one core at work. The recorded rows already tell which kernels a sweep will call: each
row's opcode and the sizes of its output and input. `cold_start` reads the rows as recorded (before planning
prunes them) as a code of their own, asks the tables' own rules (row_kernels.reverse_needs; the replay's loops by
replay_needs' rules) which kernels that code calls, and hands them with the sweep and the planners to
parallel_compile's workers, once per sweep and process, where the cache lacks the sweep. A kernel named that the
Program then does not call is compiled and cached for a later one; one it calls that was not named is compiled
when its table is made, as without a cold start.
"""
import threading

import numpy as np
from numba import typeof

from .. import cache_empty, opcodes as oc
from ..layout import FUSE_MIN_SIZE
from ..parallel_compile import side_by_side, workers_run
from ..planning import derivative_plan, plan
from . import row_kernels
from .interpreter import planned_temps, replay_sweep, reverse_sweep
from .samples import (derivative_plan_arguments, plan_arguments, planned_temps_arguments, replay_arrays, reverse_arrays,
                      second_order_arrays, tangent_arrays)
from .tangents import second_order_sweep, tangent_sweep

REVERSE = "reverse"     # reverse_sweep over a tape's Program, one cotangent column (a gradient)
COLUMNS = "reverse columns"     # ... K > 1 columns (a reverse-mode Jacobian)
REPLAY = "replay"       # replay_sweep of a trace, its large elementwise rows in fused groups (jt.function)
UNFUSED = "replay unfused"      # ... every row by its kernel (the plain replay of a function differentiated)
STEPS = "steps"         # a replay's gradient steps (a jt.grad's bound gradient, a tape inside a jt.function)
TANGENT = "tangent"     # tangent_sweep (a Hessian's directions, a JVP, a forward-mode Jacobian)
SECOND_ORDER = "second order"   # second_order_sweep (a Hessian)

_ENTRY_POINTS = {REVERSE: (reverse_sweep, reverse_arrays), COLUMNS: (reverse_sweep, reverse_arrays),
                 REPLAY: (replay_sweep, replay_arrays), UNFUSED: (replay_sweep, replay_arrays),
                 TANGENT: (tangent_sweep, tangent_arrays), SECOND_ORDER: (second_order_sweep, second_order_arrays)}
_started = set()        # the sweeps a cold start was asked for in this process (of either dtype)
_lock = threading.Lock()


def cold_start(rows, slot_rows, sweeps):
    """Where the cache lacks them, compile the planners and the `sweeps` (names above) of a Program of the recorded
    `rows` and `slot_rows` (as a recording keeps them: lists of packed int64 rows) with the row kernels they will
    call, side by side; nothing where this process or the cache holds any compile of each sweep, after the first
    call per sweep, or where no worker process compiles (one compile job, a frozen application: over-named kernels
    would then cost time)."""
    if _started.issuperset(sweeps):
        return
    if not workers_run():       # asked once: a process's cores do not change
        _started.update(sweeps)
        return
    with _lock:
        # one cold sweep names every sweep of the derivative (what the cache holds of them is not compiled again)
        cold = any(s not in _started and _lacks(s) for s in sweeps)
        _started.update(sweeps)
        if not cold:
            return
        slot_rows = np.frombuffer(b"".join(slot_rows), np.int64).reshape(-1, 3 + oc.MAXRANK)
        dtype = np.float64 if slot_rows[:, 2].any() else np.float32
        code, slots = _recorded_code(np.frombuffer(b"".join(rows), np.int64).reshape(-1, 6), slot_rows)
        with side_by_side() as compile_side_by_side:
            # first the sweeps, the planners and the loops (signatures of types alone): the workers start on them
            # while this process works out the row kernels' signatures (compiling their operand builders)
            needs = [need for sweep in sweeps for need in _needs(sweep, code, slots, dtype)]
            direct = [need for need in needs if need[0].operands is None]
            sweep_pairs = dict.fromkeys(_sweep_pair(s, dtype) for s in sweeps if s in _ENTRY_POINTS)    # once each
            compile_side_by_side([*sweep_pairs, *_planner_pairs(sweeps), *row_kernels.needed_pairs(direct)])
            compile_side_by_side(row_kernels.needed_pairs([need for need in needs if need[0].operands is not None]))


def _lacks(sweep):
    """Whether neither this process nor the cache holds any compile of `sweep` (of a replay's gradient steps: of
    derivative_plan, which plans them): a new cache (a stat, where a signature's lookup read the index: ~0.5 ms of
    a warm process's first gradient)."""
    dispatcher = _ENTRY_POINTS[sweep][0] if sweep in _ENTRY_POINTS else derivative_plan
    return not dispatcher.overloads and cache_empty(dispatcher)


def _sweep_pair(sweep, dtype):
    dispatcher, arrays = _ENTRY_POINTS[sweep]
    return dispatcher, (*map(typeof, arrays(dtype)), typeof(row_kernels.empty_table()))


def _planner_pairs(sweeps):
    """The planners' pairs: every Program's, and derivative_plan where gradient steps are planned."""
    planners = [(plan, plan_arguments()), (planned_temps, planned_temps_arguments())]
    if STEPS in sweeps:
        planners.append((derivative_plan, derivative_plan_arguments()))
    return [(planner, tuple(map(planner.typeof_pyval, arguments))) for planner, arguments in planners]


def _recorded_code(rows, slot_rows):
    """The recorded rows as a code (their columns are a code row's first six: op, out, in0, in1, in2, attr; a
    trace's gradient steps, of negative opcodes, left out) over slots of the recorded sizes: the columns the tables'
    rules read."""
    rows = rows[rows[:, oc.OP] >= 0]
    code = np.zeros((rows.shape[0], oc.W), np.int64)
    code[:, :6] = rows
    slots = np.zeros((slot_rows.shape[0], oc.S), np.int64)
    slots[:, oc.SIZE] = slot_rows[:, 0]
    return code, slots


def _needs(sweep, code, slots, dtype):
    """kernel_table's needs of `sweep` over the recorded `code`."""
    if sweep in (REVERSE, COLUMNS):
        _, _, iattr, fattr, arena, adjoint, _, homes, temps = reverse_arrays(dtype)
        if sweep == COLUMNS:
            adjoint = np.zeros((0, 2), dtype)       # of the same type: K > 1 columns run small rows in a loop apart
        return row_kernels.reverse_needs(code, slots, iattr, fattr, arena, adjoint, temps, homes)
    if sweep == TANGENT:
        _, _, iattr, fattr, arena, tangent, _, _, _, _, homes, temps = tangent_arrays(dtype)
        return row_kernels.tangent_needs(code, slots, iattr, fattr, arena, tangent, temps, homes)
    if sweep == SECOND_ORDER:       # the reverse rules of every row over adjoint tangents, and second-order terms
        _, _, iattr, fattr, arena, adjoint, tangent, adjoint_tangent, _, homes, temps = second_order_arrays(dtype)
        return (row_kernels.reverse_needs(code, slots, iattr, fattr, arena, adjoint_tangent, temps, homes, True)
                + row_kernels.second_order_needs(code, slots, iattr, fattr, arena, adjoint, tangent, adjoint_tangent,
                                                 temps, homes))
    # a replay: rows of FUSE_MIN_SIZE elementwise entries run in fused groups (layout.fused_groups), scalar
    # elementwise rows in scalar runs (layout.scalar_runs), the others from the loops of rows, calling their kernels
    op, size = code[:, oc.OP], slots[code[:, oc.OUT], oc.SIZE]
    fused = (op <= oc.WHERE) & (size >= FUSE_MIN_SIZE) & (sweep != UNFUSED)
    scalar = (op <= oc.BINARY_LAST) & (size == 1)
    loose = (~fused & ~scalar).any()
    if sweep != STEPS:
        wanted = {row_kernels.FORWARD: row_kernels.needed_forward_kernels(code[~fused], slots),
                  row_kernels.FUSED_FORWARD_GROUP: [0] if fused.any() else [],
                  row_kernels.SCALAR_RUN_FORWARD_GROUP: [0] if scalar.any() else [],
                  row_kernels.SCALAR_ROWS_FORWARD_GROUP: [0] if loose else []}
    else:
        wanted = {row_kernels.REVERSE: row_kernels.needed_reverse_kernels(code[~fused], slots),
                  row_kernels.FUSED_REVERSE_GROUP: [0] if fused.any() else [],
                  row_kernels.SCALAR_RUN_REVERSE_GROUP: [0] if scalar.any() else [],
                  row_kernels.SCALAR_ROWS_REVERSE_GROUP: [0] if loose else [],
                  row_kernels.SMALL_ROWS_REVERSE_GROUP: [0] if loose else []}
    return [(group, arrays, wanted.get(group, [])) for group, arrays, _ in
            row_kernels.replay_needs(*replay_arrays(dtype), every_kernel=True)]
