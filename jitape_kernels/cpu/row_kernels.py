"""The kernels the forward, reverse, replay, tangent, second-order and per-example sweeps call through their addresses,
compiled when a Program first needs them: the table of addresses those sweeps take (`row_kernels`), filled per
Program.

numba compiles a function together with everything it calls: a callee's
machine code is linked into the caller's module, optimised and compiled again
there. A cold reverse sweep compiled every op family's kernels (38 s of a new
user's 42 s first `jitape demo`) whatever its Program held, and a cold replay
sweep every family's forward and reverse kernels (70 s), a cold tangent sweep
every family's tangent kernels (27 s). These sweeps instead call each row's
kernel (KERNELS: a forward, a reverse and a tangent row kernel per op family,
a second-order one per family with second-order terms, the fused groups' block
kernels, and the loops called once per stretch of scalar or small rows) through
a table of addresses that the caller fills for the kernels its Program uses
(kernel_table): compiled or loaded once per signature, and only those, each
once for every sweep. The call goes through addressed.call_at, which checks
the key of the signature each address was compiled for.

The kernels come in groups (AddressedGroup), each of one signature: the type of
the tuple of operands a sweep passes them (interpreter.row_operands',
forward_operands', tangents.tangent_operands' and second_order_operands' for
the row kernels, worked out by compiling them for the arrays the sweep passes).
"""
import threading
from typing import Callable, NamedTuple

import numpy as np
from numba import typeof, types

from .. import opcodes as oc, return_type
from ..layout import SC_FLAGS, SC_RUN
from ..parallel_compile import ready
from .addressed import plain, signature_key
from .interpreter import (ADDRESSED_KERNELS, FORWARD_FIRST, FORWARD_KERNEL_OF, FORWARD_ROW_KERNELS, FUSED_FORWARD,
                          FUSED_REVERSE, LOGSUMEXP_FROM_STASH, REVERSE_KERNEL_OF, REVERSE_ROW_KERNELS,
                          SCALAR_ROWS_FORWARD, SCALAR_ROWS_REVERSE, SCALAR_RUN_FORWARD, SCALAR_RUN_REVERSE, SMALL,
                          SMALL_ROWS_REVERSE, SMALL_ROWS_REVERSE_COLUMNS, forward_operands, replay_sweep,
                          row_operands, small_rows)
from .tangents import (SECOND_ORDER_FIRST, SECOND_ORDER_KERNEL_OF, SECOND_ORDER_ROW_KERNELS, TANGENT_FIRST,
                       TANGENT_ROW_KERNELS, second_order_operands, tangent_operands)
from .workspace import new_work

try:        # numba's C function typing an argument for its dispatch (~0.2 us), else numba's typeof (~5 us)
    from numba._dispatcher import compute_fingerprint as type_key
except ImportError:
    type_key = typeof

_types = {}         # type_key -> numba type


def typeof_array(array):
    """numba's typeof of `array`, found by its type_key after the first (the kernel tables type the same arrays
    again and again)."""
    key = type_key(array)
    found = _types.get(key)
    if found is None:
        found = _types[key] = typeof(array)
    return found


# every addressed kernel, a row each in a table: the interpreter's, then the tangent and second-order sweeps'
KERNELS = ADDRESSED_KERNELS + TANGENT_ROW_KERNELS + SECOND_ORDER_ROW_KERNELS
_WORK = typeof(new_work.py_func())
_WRITTEN = typeof(np.zeros(0, np.bool_))
_ROW = types.int64


class AddressedGroup(NamedTuple):
    """Kernels of one signature: their first row in the table, the kernels, `outer`: for the arrays a sweep passes
    (the arguments its `arrays` name), the types from which the kernels' operand tuple is made, `operands`: the
    njit function making that tuple from them (None: the tuple of them), and the kernels' return type."""
    first: int
    kernels: tuple
    outer: Callable
    operands: object = None
    returns: object = types.none

    def signature(self, arrays):
        """The kernels' argument types for `arrays`: the type of their operand tuple."""
        outer = self.outer(*map(typeof_array, arrays))
        if self.operands is None:
            return plain((types.Tuple(outer),))
        return plain((return_type(self.operands, outer),))


def _single(first, outer, returns=types.none):
    """The group of the one kernel in row `first`, its operands the tuple of `outer`'s types."""
    return AddressedGroup(first, ADDRESSED_KERNELS[first:first + 1], outer, returns=returns)


# each group's arrays: its `outer`'s arguments
REVERSE = AddressedGroup(
    0, REVERSE_ROW_KERNELS, lambda code, slots, iattr, fattr, arena, adjoint, temps, homes: (
        code, _ROW, slots, iattr, fattr, arena, adjoint, _WORK, temps, homes, types.boolean, types.boolean),
    row_operands)
FORWARD = AddressedGroup(   # the stash: a view of temps' type
    FORWARD_FIRST, FORWARD_ROW_KERNELS, lambda code, slots, iattr, fattr, arena, temps: (
        code, _ROW, slots, iattr, fattr, arena, _WORK, temps, temps), forward_operands)
FUSED_FORWARD_GROUP = _single(FUSED_FORWARD, lambda code, slots, iattr, fattr, arena, places, scratch: (
    code, _ROW, _ROW, slots, iattr, fattr, arena, places, scratch, _WORK))
FUSED_REVERSE_GROUP = _single(
    FUSED_REVERSE, lambda code, slots, iattr, fattr, arena, flat, places, scratch, scalars, kernels, kernel_args: (
        code, _ROW, _ROW, slots, iattr, fattr, arena, flat, _WRITTEN, places, scratch, scalars, _WORK, kernels,
        kernel_args))
SCALAR_ROWS_FORWARD_GROUP = _single(SCALAR_ROWS_FORWARD, lambda code, slots, iattr, fattr, arena: (
    code, _ROW, _ROW, slots, iattr, fattr, arena), _ROW)
SCALAR_RUN_FORWARD_GROUP = _single(SCALAR_RUN_FORWARD, lambda scalars, iattr, fattr, arena: (
    scalars, _ROW, _ROW, iattr, fattr, arena))
SCALAR_ROWS_REVERSE_GROUP = _single(SCALAR_ROWS_REVERSE, lambda code, slots, iattr, fattr, arena, flat: (
    code, _ROW, slots, iattr, fattr, arena, flat, _WRITTEN), _ROW)
SMALL_ROWS_REVERSE_GROUP = _single(   # scalars: a replay's scalar runs, none (_NO_RUNS) in reverse_sweep
    SMALL_ROWS_REVERSE, lambda code, slots, iattr, fattr, arena, flat, scalars: (
        code, _ROW, slots, iattr, fattr, arena, flat, _WRITTEN, scalars), _ROW)
SCALAR_RUN_REVERSE_GROUP = _single(SCALAR_RUN_REVERSE, lambda scalars, iattr, fattr, arena, flat: (
    scalars, _ROW, _ROW, iattr, fattr, arena, flat, _WRITTEN))
TANGENT = AddressedGroup(
    TANGENT_FIRST, TANGENT_ROW_KERNELS, lambda code, slots, iattr, fattr, arena, tangent, temps, homes: (
        code, _ROW, slots, iattr, fattr, arena, tangent, _WRITTEN, _WORK, temps, homes, _ROW, _ROW), tangent_operands)
SECOND_ORDER = AddressedGroup(
    SECOND_ORDER_FIRST, SECOND_ORDER_ROW_KERNELS,
    lambda code, slots, iattr, fattr, arena, adjoint, tangent, adjoint_tangent, temps, homes: (
        code, _ROW, slots, iattr, fattr, arena, adjoint, tangent, adjoint_tangent, _WRITTEN, temps, homes),
    second_order_operands)
SMALL_ROWS_REVERSE_COLUMNS_GROUP = _single(
    SMALL_ROWS_REVERSE_COLUMNS, lambda code, slots, iattr, fattr, arena, adjoint: (
        code, _ROW, slots, iattr, fattr, arena, adjoint, _WRITTEN), _ROW)
LOGSUMEXP_FROM_STASH_GROUP = _single(LOGSUMEXP_FROM_STASH, lambda code, slots, iattr, flat, scratch: (
    code, _ROW, slots, iattr, flat, _WRITTEN, scratch))


def forward_kernels(code, slots, iattr, fattr, arena, temps, sweep=None):
    """forward_sweep's `row_kernels` for these arrays: its scalar loop and the forward row kernels of the families
    `code` holds (sweep: see kernel_table)."""
    return kernel_table([(FORWARD, (code, slots, iattr, fattr, arena, temps), needed_forward_kernels(code, slots)),
                         (SCALAR_ROWS_FORWARD_GROUP, (code, slots, iattr, fattr, arena), [0])], sweep)


def reverse_kernels(code, slots, iattr, fattr, arena, adjoint, temps, homes, every_row=False, sweep=None):
    """reverse_sweep's `row_kernels` for these arrays: its scalar loops and the reverse row kernels of the
    families `code` holds; every_row: those of every row (the second-order and per-example sweeps', which run
    no row inline); sweep: see kernel_table."""
    return kernel_table(reverse_needs(code, slots, iattr, fattr, arena, adjoint, temps, homes, every_row), sweep)


def reverse_needs(code, slots, iattr, fattr, arena, adjoint, temps, homes, every_row=False, every_kernel=False):
    """kernel_table's needs for reverse_kernels (every_kernel: every kernel of each group, as the warmup takes)."""
    flat = adjoint.reshape(adjoint.size)
    return [(REVERSE, (code, slots, iattr, fattr, arena, adjoint, temps, homes),
             _wanted(REVERSE, needed_reverse_kernels(code, slots, every_row), every_kernel)),
            (SCALAR_ROWS_REVERSE_GROUP, (code, slots, iattr, fattr, arena, flat), [0]),
            (SMALL_ROWS_REVERSE_GROUP, (code, slots, iattr, fattr, arena, flat, _NO_RUNS), [0]),
            _columns_need(code, slots, iattr, fattr, arena, adjoint, not every_row, every_kernel)]


def _columns_need(code, slots, iattr, fattr, arena, adjoint, runs_small_rows, every_kernel):
    """The need of small_rows_reverse_columns, which reverse_sweep and the replay's gradient steps run with K > 1
    columns (runs_small_rows: the table is theirs, not the second-order or per-example sweep's, which run every
    row's kernel; every_kernel: as the warmup takes)."""
    return (SMALL_ROWS_REVERSE_COLUMNS_GROUP, (code, slots, iattr, fattr, arena, adjoint),
            [0] if runs_small_rows and adjoint.shape[1] > 1 or every_kernel else [])


def tangent_kernels(code, slots, iattr, fattr, arena, tangent, temps, homes, sweep=None):
    """tangent_sweep's `row_kernels` for these arrays: the tangent row kernels of the families `code` holds
    (sweep: see kernel_table)."""
    return kernel_table(tangent_needs(code, slots, iattr, fattr, arena, tangent, temps, homes), sweep)


def tangent_needs(code, slots, iattr, fattr, arena, tangent, temps, homes, every_kernel=False):
    """kernel_table's needs for tangent_kernels (every_kernel: every kernel of the group, as the warmup takes)."""
    kinds = _called_kinds(code, np.ones(code.shape[0], np.bool_), REVERSE_KERNEL_OF, len(TANGENT_ROW_KERNELS))
    return [(TANGENT, (code, slots, iattr, fattr, arena, tangent, temps, homes), _wanted(TANGENT, kinds, every_kernel))]


def second_order_kernels(code, slots, iattr, fattr, arena, adjoint, tangent, adjoint_tangent, temps, homes,
                         sweep=None):
    """second_order_sweep's `row_kernels` for these arrays: the reverse row kernels of every row's family (run
    over adjoint_tangent) and the second-order row kernels of the families `code` holds (sweep: see
    kernel_table)."""
    return kernel_table(reverse_needs(code, slots, iattr, fattr, arena, adjoint_tangent, temps, homes, True)
                        + second_order_needs(code, slots, iattr, fattr, arena, adjoint, tangent, adjoint_tangent,
                                             temps, homes), sweep)


def second_order_needs(code, slots, iattr, fattr, arena, adjoint, tangent, adjoint_tangent, temps, homes,
                       every_kernel=False):
    """kernel_table's needs for second_order_kernels' second-order row kernels (every_kernel: every kernel of the
    group, as the warmup takes)."""
    kinds = _called_kinds(code, SECOND_ORDER_KERNEL_OF[code[:, oc.OP]] >= 0,
                          SECOND_ORDER_KERNEL_OF - SECOND_ORDER_FIRST, len(SECOND_ORDER_ROW_KERNELS))
    return [(SECOND_ORDER, (code, slots, iattr, fattr, arena, adjoint, tangent, adjoint_tangent, temps, homes),
             _wanted(SECOND_ORDER, kinds, every_kernel))]


_NO_HOMES = np.zeros(0, np.int64)     # a replay reads every value in its arena
_NO_RUNS = np.zeros((0, SC_FLAGS + 1), np.int64)      # reverse_sweep's scalar runs (interpreter._run_rows)


def replay_kernels(*arrays):
    """replay_sweep's `row_kernels` for its other arguments (replay_needs'), compiled side by side with
    replay_sweep itself where the cache lacks them."""
    return kernel_table(replay_needs(*arrays), (replay_sweep, arrays))


def replay_needs(code, slots, iattr, fattr, arena, steps, step_code, moves, adjoint, guards, expected, fused, places,
                 scratch, temps, step_groups, step_places, scalars, step_scalars, kernels, kernel_args, resume,
                 every_kernel=False):
    """kernel_table's needs for replay_sweep's other arguments: the scalar loops it calls (a scalar run's where
    there is one; the loops of small rows where a row is outside every run), the forward row kernels of the rows
    of `code` that no fused group holds, fused_forward if there is a group, the reverse row kernels of
    step_code's rows and fused_reverse if a gradient step has a fused group (every_kernel: every kernel of each
    group, as the warmup takes). A scalar chain's replay loads no loop of small rows."""
    outside = np.ones(code.shape[0], np.bool_)
    for r in np.flatnonzero(fused > np.arange(fused.size)):
        outside[r:fused[r]] = False
    flat = adjoint.reshape(adjoint.size)
    stashed = _stashing(step_code).any()
    # interpreter._forward_rows runs a run from its first row (SC_RUN: its stop), a stashing row alone, and the
    # other rows outside fused groups from scalar_rows_forward; _reverse_rows (one column) a run from its last
    # row (SC_RUN: its length), and every other row from scalar_rows_reverse, then small_rows_reverse
    forward_runs = np.flatnonzero(scalars[:, SC_RUN] > np.arange(code.shape[0]))
    forward_loose = (outside & _outside_runs(forward_runs, scalars[forward_runs, SC_RUN], code.shape[0])
                     & ~_stashing(code)).any()
    one_column = adjoint.shape[1] == 1
    reverse_runs = np.flatnonzero(step_scalars[:, SC_RUN] > 0)
    reverse_loose = one_column and _outside_runs(reverse_runs - step_scalars[reverse_runs, SC_RUN] + 1,
                                                 reverse_runs + 1, step_code.shape[0]).any()
    needs = [
        (FORWARD, (code, slots, iattr, fattr, arena, temps),
         needed_forward_kernels(code if outside.all() else code[outside], slots)),
        (REVERSE, (step_code, slots, iattr, fattr, arena, adjoint, temps, _NO_HOMES),
         needed_reverse_kernels(step_code, slots)),
        _columns_need(step_code, slots, iattr, fattr, arena, adjoint, True, every_kernel),
        (FUSED_FORWARD_GROUP, (code, slots, iattr, fattr, arena, places, scratch), [0] if not outside.all() else []),
        (FUSED_REVERSE_GROUP, (step_code, slots, iattr, fattr, arena, flat, step_places, scratch, step_scalars, kernels,
                               kernel_args), [0] if (step_groups > 1).any() else []),
        (SCALAR_ROWS_FORWARD_GROUP, (code, slots, iattr, fattr, arena), [0] if forward_loose else []),
        (SCALAR_RUN_FORWARD_GROUP, (scalars, iattr, fattr, arena), [0] if forward_runs.size else []),
        (SCALAR_ROWS_REVERSE_GROUP, (step_code, slots, iattr, fattr, arena, flat), [0] if reverse_loose else []),
        (SMALL_ROWS_REVERSE_GROUP, (step_code, slots, iattr, fattr, arena, flat, step_scalars),
         [0] if reverse_loose else []),
        (SCALAR_RUN_REVERSE_GROUP, (step_scalars, iattr, fattr, arena, flat),
         [0] if one_column and reverse_runs.size else []),
        (LOGSUMEXP_FROM_STASH_GROUP, (step_code, slots, iattr, flat, scratch), [0] if stashed else [])]
    return [(group, arrays, _wanted(group, indices, every_kernel)) for group, arrays, indices in needs]


def _stashing(code):
    """Per row of `code`, whether it is a LOGSUMEXP with a stash (interpreter._stashes)."""
    return (code[:, oc.OP] == oc.LOGSUMEXP) & (code[:, oc.STASH] >= 0)


def _outside_runs(starts, stops, n):
    """Per row of n, whether no run [starts[i], stops[i]) holds it (the runs disjoint)."""
    depth = np.zeros(n + 1, np.int64)
    depth[starts] += 1
    depth[stops] -= 1
    return np.cumsum(depth[:n]) == 0


def _wanted(group, indices, every_kernel):
    """`indices`, or every kernel of `group` (every_kernel)."""
    return range(len(group.kernels)) if every_kernel else indices


def _called_kinds(code, called, kernel_of, count):
    """The kernel indices (kernel_of[op] - its group's first row) of the rows of `code` that `called` marks."""
    return np.flatnonzero(np.bincount(kernel_of[code[called, oc.OP]], minlength=count)).tolist()


def needed_reverse_kernels(code, slots, every_row=False):
    """The REVERSE_ROW_KERNELS indices whose kernels reverse_sweep may call for `code`: every row's but the
    elementwise rows of at most SMALL entries (the scalar loops run them, and small_rows_reverse_columns with K > 1
    columns); every_row: every row's (the second-order and per-example sweeps')."""
    called = (code[:, oc.OP] > oc.BINARY_LAST) | (slots[code[:, oc.OUT], oc.SIZE] > SMALL) | every_row
    return _called_kinds(code, called, REVERSE_KERNEL_OF, len(REVERSE_ROW_KERNELS))


def needed_forward_kernels(code, slots):
    """The FORWARD_ROW_KERNELS indices whose kernels forward_sweep may call for `code`: every row's but those
    interpreter.small_row calls small, which its scalar loop runs."""
    return _called_kinds(code, ~small_rows(code, slots), FORWARD_KERNEL_OF - FORWARD_FIRST,
                         len(FORWARD_ROW_KERNELS))


_by_kind = {}           # the groups' first rows and their arrays' type keys -> ((group, signature), ...), table
_by_group = {}          # a group's first row and its arrays' type keys -> (signature, signature key)
_lock = threading.Lock()


def _signed(group, keys, arrays):
    """(group.signature(arrays), its signature_key), worked out once per group and type keys of `arrays`
    (replays' tables share most groups' arrays: numba's types of twenty-odd arrays were ~1 ms of a first one)."""
    found = _by_group.get((group.first, keys))
    if found is None:
        signature = group.signature(arrays)
        found = _by_group[group.first, keys] = (signature, signature_key(signature, group.returns))
    return found


def kernel_table(needs, sweep=None):
    """The table of addressed kernels (KERNELS' rows: address, signature key) of a sweep,
    with the kernels `needs` names compiled (or loaded from the cache) for its arrays' types: needs, (group, the
    arrays its `outer` takes, kernel indices within the group) per group the sweep calls. A table per kind of
    arrays, its addresses filled as Programs need them; the rows of other groups keep key 0 (a call raises).
    sweep: (the sweep's dispatcher, its arguments but the table), compiled with the kernels, side by side where
    the cache lacks them (parallel_compile), when it has no compiled signature yet."""
    kind = tuple((group.first, tuple(map(type_key, arrays))) for group, arrays, _ in needs)
    found = _by_kind.get(kind)
    if found is None:
        table = np.zeros((len(KERNELS), 2), np.int64)
        signed = []
        for (group, arrays, _), (_, keys) in zip(needs, kind):
            signature, table[group.first:group.first + len(group.kernels), 1] = _signed(group, keys, arrays)
            signed.append((group, signature))
        found = _by_kind.setdefault(kind, (tuple(signed), table))
    signed, table = found
    wanted = [(group, signature, k) for (group, signature), (_, _, indices) in zip(signed, needs) for k in indices]
    cold_sweep = sweep is not None and not getattr(sweep[0], "overloads", True)      # never compiled or loaded
    if cold_sweep or not all([table[group.first + k, 0] for group, _, k in wanted]):
        with _lock:
            pairs = [(group.kernels[k], signature) for group, signature, k in wanted if not table[group.first + k, 0]]
            if cold_sweep:       # first: the longest compile
                dispatcher, arguments = sweep
                pairs.insert(0, (dispatcher, tuple(map(typeof_array, (*arguments, table)))))
            ready(pairs)
            for group, signature, k in wanted:
                if not table[group.first + k, 0]:
                    table[group.first + k, 0] = _address(group.kernels[k], signature, group.returns)
    return table


def needed_pairs(needs):
    """The (kernel, signature) pairs kernel_table's `needs` name, as parallel_compile takes them (working out a
    group's signature compiles or loads its operand builder's)."""
    return [(group.kernels[k], _signed(group, tuple(map(type_key, arrays)), arrays)[0])
            for group, arrays, indices in needs for k in indices]


def empty_table():
    """A table with no kernel (the type the sweeps take; any call through it raises)."""
    return np.zeros((len(KERNELS), 2), np.int64)


def _address(dispatcher, signature, returns):
    """The address of the native function numba compiled (or loads) for `signature`, which must return `returns`;
    the dispatcher keeps it."""
    dispatcher.compile(signature)
    compiled = dispatcher.overloads[tuple(signature)]
    if compiled.signature.return_type != returns:
        raise TypeError(f"addressed kernel {dispatcher.__name__} must return {returns}, got "
                        f"{compiled.signature.return_type}")
    return compiled.library.get_pointer_to_function(compiled.fndesc.llvm_func_name)
