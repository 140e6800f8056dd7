"""CPU backend: numba-compiled kernels per op family and the interpreters that run a Program over them
(planning, shared by every backend, is jitape_kernels.planning; re-exported here for the warmup)."""
import numpy as np

from .. import opcodes as oc
from .batch import first_row_mixing, per_example_plan, per_example_sweep, per_example_temps
from .tangents import second_order_sweep, tangent_sweep
from ..planning import derivative_plan, plan
from .interpreter import forward_sweep, planned_temps, replay_sweep, reverse_sweep
from .elementwise import strided_arithmetic
from .fusion import GroupKernels
from .optimizers import adam_step, sgd_momentum_step
from .reduction import short_row_sums
from .samples import (derivative_plan_arguments, empty_program, plan_arguments, planned_temps_arguments, read_only,
                      replay_arrays, reverse_arrays, second_order_arrays, tangent_arrays)
from .compile_ahead import cold_start
from . import row_kernels
from .row_kernels import (empty_table, forward_kernels, replay_kernels, reverse_kernels, second_order_kernels,
                          tangent_kernels)

__all__ = ["GroupKernels", "cold_start", "compiled_for", "derivative_plan", "first_row_mixing", "forward_kernels",
           "forward_sweep", "new_temps", "per_example_plan", "per_example_sweep", "per_example_temps", "plan",
           "planned_temps", "replay_kernels", "replay_sweep", "reverse_kernels", "reverse_sweep", "run_warmup_step",
           "second_order_kernels", "second_order_sweep", "tangent_kernels", "tangent_sweep", "warmup_steps"]


_entry_points = {}      # (dispatcher, its arguments' type keys) -> compiled entry point


def compiled_for(dispatcher, arrays):
    """The entry point numba's `dispatcher` compiled (or loads from its cache) for the types of `arrays`, found by
    their type keys (row_kernels.type_key: numba's typeof of a replay's 22 arrays was ~0.5 ms of a trace); the
    dispatcher itself where numba's JIT is disabled."""
    if not hasattr(dispatcher, "compile"):
        return dispatcher
    key = (dispatcher, *map(row_kernels.type_key, arrays))
    entry = _entry_points.get(key)
    if entry is None:
        entry = _entry_points[key] = dispatcher.compile(tuple(map(row_kernels.typeof_array, arrays)))
    return entry


def new_temps(code, iattr, columns, dtype, *more_code):
    """A scratch buffer (`temps`) for the sweeps of `code` (and of `more_code`'s codes: a replay's gradient
    steps', planned apart, not copied together) with `columns` columns: planned_temps' entries, the larger of
    each code's (it plans a maximum over rows)."""
    fixed, per_column = np.max([planned_temps(c, iattr) for c in (code, *more_code)], axis=0)
    return np.empty(fixed + per_column * columns, dtype)


def _every_kernel(dtype, groups):
    """The tables of every kernel of `groups` (row_kernels' groups) for the arrays replay_sweep takes, and
    reverse_sweep's, tangent_sweep's and second_order_sweep's (forward_sweep's and per_example_sweep's are of the
    same types)."""
    arrays = replay_arrays(dtype)
    code, slots, iattr, fattr, arena, adjoint, temps = (arrays[i] for i in (0, 1, 2, 3, 4, 8, 14))
    homes = np.zeros(0, np.int64)
    needs = (row_kernels.replay_needs(*arrays, every_kernel=True)
             + row_kernels.reverse_needs(code, slots, iattr, fattr, arena, adjoint, temps, homes, every_kernel=True)
             + row_kernels.tangent_needs(code, slots, iattr, fattr, arena, adjoint, temps, homes, every_kernel=True)
             + row_kernels.second_order_needs(code, slots, iattr, fattr, arena, adjoint, adjoint, adjoint, temps, homes,
                                              every_kernel=True))
    # a table per need: reverse_sweep's small rows (no scalar runs) and the replay's share a table row
    return [row_kernels.kernel_table([need]) for need in needs if need[0] in groups]


def _optimizer_steps(dtype):
    z = np.zeros(0, dtype)
    scalar = np.dtype(dtype).type(0)
    sgd_momentum_step(z, z, z, scalar, scalar, False, z)
    adam_step(z, z, z, z, z, scalar, scalar, scalar, scalar, z)


def _eager_steps(dtype):
    """The loops eager ops run (jitape.ops): strided_arithmetic over read-only operands of every pair of layouts
    its callers pass (numba types an array C-contiguous, F-contiguous or neither; a transposed matrix is F; two
    C-contiguous operands never take it, numpy runs them in one run), and short_row_sums."""
    out = np.zeros((1, 2, 2), dtype)
    layouts = [read_only(np.zeros(out.shape, dtype)), read_only(np.zeros(out.shape, dtype, order="F")),
               np.broadcast_to(np.zeros(1, dtype), out.shape)]     # a broadcast view is read-only
    for a in layouts:
        for b in layouts:
            if not (a.flags.c_contiguous and b.flags.c_contiguous):
                strided_arithmetic(oc.ADD, a, b, out)
    short_row_sums(np.zeros((0, 2), dtype), np.zeros(0, dtype))


def warmup_steps():
    """(name, callable) pairs that compile and cache every CPU entry point for float32 and float64.

    numba compiles a whole function per argument-type signature: an empty
    Program of each dtype compiles each sweep, and every kernel of the tables
    the sweeps take (row_kernels' groups) is compiled for the arrays they pass.
    The two dtypes' steps come side by side, so that a parallel warmup starts
    them at once; the planning steps, the shortest, last.
    """
    per_dtype = [_dtype_steps(dtype) for dtype in (np.float32, np.float64)]
    return [step for pair in zip(*per_dtype) for step in pair] + _planning_steps()


def _dtype_steps(dtype):
    """The steps compiling the sweeps, optimizer updates and eager loops of one dtype, longest first."""
    name = np.dtype(dtype).name
    d = dtype
    return [
        (f"replay_sweep[{name}]", lambda: replay_sweep(*replay_arrays(d), empty_table())),
        (f"forward_sweep[{name}]", lambda: forward_sweep(*empty_program(d), np.zeros(0, d), empty_table())),
        (f"reverse_sweep[{name}]", lambda: reverse_sweep(*reverse_arrays(d), empty_table())),
        (f"forward row kernels[{name}]", lambda: _every_kernel(d, (
            row_kernels.FORWARD, row_kernels.FUSED_FORWARD_GROUP, row_kernels.SCALAR_ROWS_FORWARD_GROUP,
            row_kernels.SCALAR_RUN_FORWARD_GROUP))),
        (f"reverse row kernels[{name}]", lambda: _every_kernel(d, (
            row_kernels.REVERSE, row_kernels.FUSED_REVERSE_GROUP, row_kernels.SCALAR_ROWS_REVERSE_GROUP,
            row_kernels.SMALL_ROWS_REVERSE_GROUP, row_kernels.SCALAR_RUN_REVERSE_GROUP,
            row_kernels.LOGSUMEXP_FROM_STASH_GROUP, row_kernels.SMALL_ROWS_REVERSE_COLUMNS_GROUP))),
        (f"tangent and second-order row kernels[{name}]", lambda: _every_kernel(d, (row_kernels.TANGENT,
                                                                                     row_kernels.SECOND_ORDER))),
        (f"tangent_sweep[{name}]", lambda: tangent_sweep(*tangent_arrays(d), empty_table())),
        (f"second_order_sweep[{name}]", lambda: second_order_sweep(*second_order_arrays(d), empty_table())),
        (f"per_example_sweep[{name}]", lambda: per_example_sweep(
            np.zeros((0, oc.W), np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64), *empty_program(d)[1:],
            np.zeros((0, 1), d), np.zeros((0, 1), d), np.zeros(0, np.int64), np.zeros(0, d), empty_table())),
        (f"eager[{name}]", lambda: _eager_steps(d)),
        (f"optimizers[{name}]", lambda: _optimizer_steps(d)),
    ]


def _planning_steps():
    """The steps compiling the planners, which take no dtype."""
    return [("plan", lambda: plan(*plan_arguments())),
            ("derivative_plan", lambda: derivative_plan(*derivative_plan_arguments())),
            ("first_row_mixing", lambda: first_row_mixing(np.zeros((0, oc.W), np.int64),
                                                          np.zeros((0, oc.S), np.int64), np.zeros(0, np.int64), 2,
                                                          np.zeros(0, np.int64), -1)),
            ("per_example_plan", lambda: per_example_plan(np.zeros((0, oc.W), np.int64), np.zeros((0, oc.S), np.int64),
                                                          np.zeros(0, np.int64), np.zeros(0, np.int64), 1)),
            ("planned_temps", lambda: planned_temps(*planned_temps_arguments())),
            ("per_example_temps", lambda: per_example_temps(np.zeros((0, oc.W), np.int64), np.zeros(0, np.int64),
                                                            np.zeros((0, oc.S), np.int64), np.zeros(0, np.int64), 1))]


def run_warmup_step(index):
    """Compile warmup_steps()[index]: a worker process's task in a parallel `jitape warmup`."""
    warmup_steps()[index][1]()
