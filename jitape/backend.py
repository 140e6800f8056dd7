"""The backend interface: the compiled entry points the executor (execute.py) and replays (replay.py) call.

Planning is backend-neutral host code (jitape_kernels.planning); a backend runs
planned Programs. `cpu` runs them with the numba kernels of jitape_kernels.cpu;
a `cuda` backend implements the same methods over device arrays.
jt.config.backend names the one in use.
"""
import abc
import functools

import numpy as np

from . import config
from .recycling import workspace


# the sweeps of a Hessian or HVP (forward-over-reverse), as Backend.cold_start names them
HESSIAN_SWEEPS = ("reverse", "tangent", "second order")


class Backend(abc.ABC):
    """What a device must provide to run Programs: each method takes the Program's arrays and buffers planned
    by the executor and fills them in place."""
    name = None

    @abc.abstractmethod
    def replay(self, code, slots, iattr, fattr, arena, steps, step_code, moves, adjoint, guards, expected, fused,
               places, scratch, temps, step_groups, step_places, scalars, step_scalars, kernels, kernel_args, resume):
        """A replay's forward sweep (fused groups by their generated kernels, else block by block) and gradient
        steps in program order, then its guards; from after the host step resume[0] names (-1: the start), up to
        the next host step: layout.REPLAY_HELD, GUARD_BROKEN, or that step's index (see
        jitape_kernels.cpu.interpreter.replay_sweep)."""

    @abc.abstractmethod
    def group_kernels(self, code, slots, iattr, fused, places, dtype, kept, step_code, step_groups, step_places,
                      step_flags):
        """The kernels of a replay's fused groups, its run layout's and its gradient steps' reverse groups, as
        replay() takes them (its last two arrays: `table` and `args`), each compiled when `compile()` is called
        (see jitape_kernels.cpu.fusion.GroupKernels; kept: per slot, whether a value is read after the forward
        rows; step_flags: the steps' planned flags)."""

    @abc.abstractmethod
    def replay_temps(self, code, step_code, iattr, columns, dtype):
        """The kernels' scratch buffer for replay() of `code` and `step_code` with `columns` adjoint columns."""

    def bind_replay(self, *arrays):
        """replay() bound to its arrays (which must stay the same objects): a callable of no arguments. A backend
        overrides it where binding saves work per call."""
        return functools.partial(self.replay, *arrays)

    def cold_start(self, rows, slot_rows, sweeps):
        """Before a process's first derivative of a recording (its rows and slot rows as jitape.recording keeps
        them) runs `sweeps` ("reverse": the reverse sweep, one column; "reverse columns": K > 1 columns, a
        reverse-mode Jacobian; "replay": a trace's replay, large elementwise rows in fused groups; "replay
        unfused": every row by its kernel; "steps": a replay's gradient steps; "tangent": a tangent sweep;
        "second order": a Hessian's second-order sweep), compile what they will call ahead, side by side, where
        the compile cache lacks it. A backend that compiles nothing ahead does nothing."""

    @abc.abstractmethod
    def reverse(self, program, adjoint, written):
        """One reverse sweep with K = adjoint.shape[1] cotangent columns from the seeded slots marked in
        `written`, which marks the slots whose rows it wrote on return (see
        jitape_kernels.cpu.interpreter.reverse_sweep)."""

    @abc.abstractmethod
    def tangent(self, program, tangent, seeded, seed_row, seed_start, target):
        """One tangent sweep with K columns (see jitape_kernels.cpu.tangents.tangent_sweep)."""

    @abc.abstractmethod
    def second_order(self, program, adjoint, tangent, adjoint_tangent, seeded):
        """The second-order sweep of forward-over-reverse Hessians; per slot, whether it was written."""

    @abc.abstractmethod
    def row_mixing(self, program, batch, seeded):
        """The first instruction that makes a batch row depend on another row, or -1."""

    @abc.abstractmethod
    def per_example_plan(self, program, batch):
        """The per-example gradient plan (see jitape_kernels.cpu.batch.per_example_plan)."""

    @abc.abstractmethod
    def per_example(self, program, code, modes, layouts, row_adjoint, param_adjoint):
        """The per-example gradient sweep over the planned code."""


class CPU(Backend):
    name = "cpu"
    # the jitape_kernels.cpu kernels each opcode family runs: forward, reverse, tangent, second order
    kernels = {
        "unary": ("elementwise.unary_forward", "elementwise.unary_reverse", "elementwise.unary_reverse",
                  "elementwise.unary_second"),
        "binary": ("elementwise.binary_forward", "elementwise.binary_reverse", "elementwise.binary_tangent",
                   "elementwise.binary_second"),
        "compare": ("elementwise.binary_forward", None, None, None),
        "where": ("elementwise.where_forward", "elementwise.where_linear", "elementwise.where_linear", None),
        "reduce": ("reduction.reduce_forward", "reduction.reduce_linear", "reduction.reduce_linear",
                   "reduction.reduce_second"),
        "cumsum": ("reduction.cumsum_forward", "reduction.cumsum_linear", "reduction.cumsum_linear", None),
        "mapped": ("shape.mapped_forward", "shape.mapped_linear", "shape.mapped_linear", None),
        "moved": ("shape.moved_forward", "shape.moved_linear", "shape.moved_linear", None),
        "matmul": ("linalg.matmul_forward", "linalg.matmul_reverse", "linalg.matmul_tangent", "linalg.matmul_second"),
        "solve": ("linalg.solve_forward", "linalg.solve_reverse", "linalg.solve_tangent", "linalg.solve_second"),
        "inv": ("linalg.inv_forward", "linalg.inv_reverse", "linalg.inv_tangent", "linalg.inv_second"),
    }

    def __init__(self):
        from jitape_kernels import cpu
        self._kernels = cpu
        self.cold_start = cpu.cold_start        # called by every eager derivative: no method of its own between

    def replay(self, *arrays):
        return self._kernels.replay_sweep(*arrays, self._kernels.replay_kernels(*arrays))

    def bind_replay(self, *arrays):
        # the compiled code for exactly these arrays' types, bound to them: a call skips the dispatcher's
        # typing of fourteen arguments (~2 us of a ~6 us small replay)
        arrays = (*arrays, self._kernels.replay_kernels(*arrays))
        return functools.partial(self._kernels.compiled_for(self._kernels.replay_sweep, arrays), *arrays)

    def group_kernels(self, code, slots, iattr, fused, places, dtype, kept, step_code, step_groups, step_places,
                      step_flags):
        return self._kernels.GroupKernels(code, slots, iattr, fused, places, dtype, kept, step_code, step_groups,
                                          step_places, step_flags)

    def replay_temps(self, code, step_code, iattr, columns, dtype):
        return self._kernels.new_temps(code, iattr, columns, dtype, step_code)

    def _temps(self, program, columns):
        """The kernels' scratch for a sweep of `columns` columns over `program` (planned once per Program)."""
        planned = program.memo.get("temps")
        if planned is None:
            planned = program.memo["temps"] = self._kernels.planned_temps(program.code, program.iattr)
        return workspace.scratch(planned[0] + planned[1] * columns, program.arena.dtype)

    def reverse(self, program, adjoint, written):
        temps = self._temps(program, adjoint.shape[1])
        k = self._kernels
        # a table for one column and one for K > 1 (their small rows run in different loop kernels)
        return _with_table(program, _REVERSE_TABLES[adjoint.shape[1] > 1], k.reverse_sweep, (
            program.code, program.slots, program.iattr, program.fattr, program.arena, adjoint, written, program.homes,
            temps), k.reverse_kernels, (program.code, program.slots, program.iattr, program.fattr, program.arena,
                                        adjoint, temps, program.homes, False))

    def tangent(self, program, tangent, seeded, seed_row, seed_start, target):
        temps = self._temps(program, tangent.shape[1])
        k = self._kernels
        return _with_table(program, "tangent kernels", k.tangent_sweep, (
            program.code, program.slots, program.iattr, program.fattr, program.arena, tangent, seeded, seed_row,
            seed_start, target, program.homes, temps), k.tangent_kernels, (
                program.code, program.slots, program.iattr, program.fattr, program.arena, tangent, temps,
                program.homes))

    def second_order(self, program, adjoint, tangent, adjoint_tangent, seeded):
        temps = self._temps(program, tangent.shape[1])
        k = self._kernels
        return _with_table(program, "second-order kernels", k.second_order_sweep, (
            program.code, program.slots, program.iattr, program.fattr, program.arena, adjoint, tangent,
            adjoint_tangent, seeded, program.homes, temps), k.second_order_kernels, (
                program.code, program.slots, program.iattr, program.fattr, program.arena, adjoint, tangent,
                adjoint_tangent, temps, program.homes))

    def row_mixing(self, program, batch, seeded):
        return self._kernels.first_row_mixing(program.code, program.slots, program.iattr, batch, seeded,
                                              program.targets[0])

    def per_example_plan(self, program, batch):
        return self._kernels.per_example_plan(program.code, program.slots, program.iattr, program.adjoint_rows,
                                              batch)

    def per_example(self, program, code, modes, layouts, row_adjoint, param_adjoint):
        temps = workspace.scratch(self._kernels.per_example_temps(code, modes, program.slots, program.iattr,
                                                                  param_adjoint.shape[1]), program.arena.dtype)
        # the per-example plan is one per (Program, batch): so is its table
        k = self._kernels
        _with_table(program, ("per-example row kernels", param_adjoint.shape[1]), k.per_example_sweep, (
            code, modes, layouts, program.slots, program.iattr, program.fattr, program.arena, row_adjoint,
            param_adjoint, program.homes, temps), k.reverse_kernels, (
                code, program.slots, program.iattr, program.fattr, program.arena, row_adjoint, temps, program.homes,
                True))


_REVERSE_TABLES = (("row kernels", False), ("row kernels", True))


def _with_table(program, key, sweep, arrays, table_of, table_args):
    """sweep(*arrays, its table of addressed kernels): the table made once per Program (its memo, under `key`; the
    sweep's arrays have one type per dtype, and the sweep checks it) by table_of(*table_args, (sweep, arrays)),
    which compiles the sweep with the table's kernels, side by side where the cache lacks them (its arguments, not
    a closure made per call: every eager gradient comes here)."""
    table = program.memo.get(key)
    if table is None:
        table = program.memo[key] = table_of(*table_args, (sweep, arrays))
    return sweep(*arrays, table)


_BACKENDS = {"cpu": CPU}
_instances = {}


def check_name(name):
    """`name` itself when it names a backend (None: the configured one), else a ValueError listing them."""
    if name is not None and name not in _BACKENDS:
        raise ValueError(f"backend: unknown backend {name!r}; available: {sorted(_BACKENDS)}")
    return name


def current(name=None):
    """The backend `name` names, by default jt.config.backend's (an instance is made on first use)."""
    name = config.backend if name is None else name
    backend = _instances.get(name)
    if backend is None:
        backend = _instances[name] = _BACKENDS[check_name(name)]()
    return backend
