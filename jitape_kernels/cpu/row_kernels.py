"""The kernels forward_sweep, reverse_sweep and replay_sweep call through their addresses, compiled when a Program
first needs them: the table of addresses those sweeps take (`row_kernels`), filled per Program.

numba compiles a function together with everything it calls: a callee's
machine code is linked into the caller's module, optimised and compiled again
there. A cold reverse sweep compiled every op family's kernels (38 s of a new
user's 42 s first `jitape demo`) whatever its Program held, and a cold replay
sweep every family's forward and reverse kernels (70 s). These sweeps instead
call each row's kernel (interpreter.ADDRESSED_KERNELS: a forward and a reverse
row kernel per op family, and the fused groups' block kernels) through a table
of addresses that the caller fills for the kernels its Program uses
(kernel_table): compiled or loaded once per signature, and only those. The
call goes through addressed.call_at, which checks the key of the signature
each address was compiled for; scalar and small elementwise rows never take it
(the sweeps run them inline).

The kernels come in groups (AddressedGroup), each of one signature: the type of
the tuple its operand function makes of a row (interpreter.row_operands,
forward_operands, fused_forward_operands, fused_reverse_operands), worked out
by compiling that function for the arrays the sweep passes.
"""
import threading
from typing import Callable, NamedTuple

import numpy as np
from numba import typeof, types

from .. import opcodes as oc
from .addressed import plain, signature_key
from .interpreter import (ADDRESSED_KERNELS, FORWARD_FIRST, FORWARD_KERNEL_OF, FORWARD_ROW_KERNELS, FUSED_FORWARD,
                          FUSED_REVERSE, REVERSE_KERNEL_OF, REVERSE_ROW_KERNELS, SMALL, forward_operands,
                          fused_forward_operands, fused_reverse_operands, row_operands)
from .workspace import new_work

try:        # numba's C function typing an argument for its dispatch (~0.2 us), else numba's typeof (~5 us)
    from numba._dispatcher import compute_fingerprint as _type_key
except ImportError:
    _type_key = typeof

_WORK = typeof(new_work.py_func())
_WRITTEN = typeof(np.zeros(0, np.bool_))
_ROW = types.int64


class AddressedGroup(NamedTuple):
    """Kernels of one signature: their first row in the table, the kernels, the njit function making their
    operands' tuple, and `outer`: the argument types of that function for the arrays a sweep passes (the
    arguments its `arrays` name)."""
    first: int
    kernels: tuple
    operands: object
    outer: Callable

    def signature(self, arrays):
        """The kernels' argument types for `arrays` (the types of the tuple the operand function makes)."""
        outer = self.outer(*map(typeof, arrays))
        self.operands.compile(outer)
        return plain((self.operands.overloads[outer].signature.return_type,))


REVERSE = AddressedGroup(  # arrays: code, slots, iattr, fattr, arena, adjoint, temps, homes
    0, REVERSE_ROW_KERNELS, row_operands,
    lambda code, slots, iattr, fattr, arena, adjoint, temps, homes: (
        code, _ROW, slots, iattr, fattr, arena, adjoint, _WORK, temps, homes, types.boolean, types.boolean))
FORWARD = AddressedGroup(  # arrays: code, slots, iattr, fattr, arena, temps (the stash: a view of temps' type)
    FORWARD_FIRST, FORWARD_ROW_KERNELS, forward_operands,
    lambda code, slots, iattr, fattr, arena, temps: (code, _ROW, slots, iattr, fattr, arena, _WORK, temps, temps))
FUSED_FORWARD_GROUP = AddressedGroup(  # arrays: code, slots, iattr, fattr, arena, places, scratch
    FUSED_FORWARD, ADDRESSED_KERNELS[FUSED_FORWARD:FUSED_FORWARD + 1], fused_forward_operands,
    lambda code, slots, iattr, fattr, arena, places, scratch: (
        code, _ROW, _ROW, slots, iattr, fattr, arena, places, scratch, _WORK))
FUSED_REVERSE_GROUP = AddressedGroup(  # arrays: code, slots, iattr, fattr, arena, flat, places, scratch, scalars,
    FUSED_REVERSE, ADDRESSED_KERNELS[FUSED_REVERSE:FUSED_REVERSE + 1], fused_reverse_operands,   # kernels, args
    lambda code, slots, iattr, fattr, arena, flat, places, scratch, scalars, kernels, kernel_args: (
        code, _ROW, _ROW, slots, iattr, fattr, arena, flat, _WRITTEN, places, scratch, scalars, _WORK, kernels,
        kernel_args))


def forward_kernels(code, slots, iattr, fattr, arena, temps):
    """forward_sweep's `row_kernels` for these arrays: the forward row kernels of the families `code` holds."""
    arrays = (code, slots, iattr, fattr, arena, temps)
    return kernel_table([(FORWARD, arrays, needed_forward_kernels(code, slots))])


def reverse_kernels(code, slots, iattr, fattr, arena, adjoint, temps, homes):
    """reverse_sweep's `row_kernels` for these arrays: the reverse row kernels of the families `code` holds."""
    arrays = (code, slots, iattr, fattr, arena, adjoint, temps, homes)
    return kernel_table([(REVERSE, arrays, needed_reverse_kernels(code, slots))])


_NO_HOMES = np.zeros(0, np.int64)     # a replay reads every value in its arena


def replay_kernels(code, slots, iattr, fattr, arena, steps, step_code, moves, adjoint, guards, expected, fused, places,
                   scratch, temps, step_groups, step_places, scalars, step_scalars, kernels, kernel_args):
    """replay_sweep's `row_kernels` for its other arguments: the forward row kernels of the rows of `code` that
    no fused group holds, fused_forward if there is a group, the reverse row kernels of step_code's rows and
    fused_reverse if a gradient step has a fused group."""
    outside = np.ones(code.shape[0], np.bool_)
    for r in np.flatnonzero(fused > np.arange(fused.size)):
        outside[r:fused[r]] = False
    flat = adjoint.reshape(adjoint.size)
    return kernel_table([
        (FORWARD, (code, slots, iattr, fattr, arena, temps), needed_forward_kernels(code[outside], slots)),
        (REVERSE, (step_code, slots, iattr, fattr, arena, adjoint, temps, _NO_HOMES),
         needed_reverse_kernels(step_code, slots)),
        (FUSED_FORWARD_GROUP, (code, slots, iattr, fattr, arena, places, scratch), [0] if not outside.all() else []),
        (FUSED_REVERSE_GROUP, (step_code, slots, iattr, fattr, arena, flat, step_places, scratch, step_scalars, kernels,
                               kernel_args), [0] if (step_groups > 1).any() else [])])


def _called_kinds(code, slots, kernel_of, count):
    """The kernel indices (kernel_of[op] - its group's first row) of the rows of `code` that a sweep does not run
    inline: every row but the elementwise rows of at most SMALL entries."""
    ops = code[:, oc.OP]
    called = (ops > oc.BINARY_LAST) | (slots[code[:, oc.OUT], oc.SIZE] > SMALL)
    return np.flatnonzero(np.bincount(kernel_of[ops[called]], minlength=count)).tolist()


def needed_reverse_kernels(code, slots):
    """The REVERSE_ROW_KERNELS indices whose kernels reverse_sweep may call for `code`."""
    return _called_kinds(code, slots, REVERSE_KERNEL_OF, len(REVERSE_ROW_KERNELS))


def needed_forward_kernels(code, slots):
    """The FORWARD_ROW_KERNELS indices whose kernels forward_sweep may call for `code`."""
    return _called_kinds(code, slots, FORWARD_KERNEL_OF - FORWARD_FIRST, len(FORWARD_ROW_KERNELS))


_by_kind = {}           # the groups' first rows and their arrays' type keys -> ((group, signature), ...), table
_lock = threading.Lock()


def kernel_table(needs):
    """The table of addressed kernels (interpreter.ADDRESSED_KERNELS' rows: address, signature key) of a sweep,
    with the kernels `needs` names compiled (or loaded from the cache) for its arrays' types: needs, (group, the
    arrays its `outer` takes, kernel indices within the group) per group the sweep calls. A table per kind of
    arrays, its addresses filled as Programs need them; the rows of other groups keep key 0 (a call raises)."""
    kind = tuple((group.first, tuple(map(_type_key, arrays))) for group, arrays, _ in needs)
    found = _by_kind.get(kind)
    if found is None:
        signed = tuple((group, group.signature(arrays)) for group, arrays, _ in needs)
        table = np.zeros((len(ADDRESSED_KERNELS), 2), np.int64)
        for group, signature in signed:
            table[group.first:group.first + len(group.kernels), 1] = signature_key(signature)
        found = _by_kind.setdefault(kind, (signed, table))
    signed, table = found
    wanted = [(group, signature, k) for (group, signature), (_, _, indices) in zip(signed, needs) for k in indices]
    if not all([table[group.first + k, 0] for group, _, k in wanted]):
        with _lock:
            for group, signature, k in wanted:
                if not table[group.first + k, 0]:
                    table[group.first + k, 0] = _address(group.kernels[k], signature)
    return table


def empty_table():
    """A table with no kernel (the type the sweeps take; any call through it raises)."""
    return np.zeros((len(ADDRESSED_KERNELS), 2), np.int64)


def _address(dispatcher, signature):
    """The address of the native function numba compiled (or loads) for `signature`; the dispatcher keeps it."""
    dispatcher.compile(signature)
    compiled = dispatcher.overloads[tuple(signature)]
    if compiled.signature.return_type != types.none:
        raise TypeError(f"row kernel {dispatcher.__name__} must return None, got {compiled.signature.return_type}")
    return compiled.library.get_pointer_to_function(compiled.fndesc.llvm_func_name)
