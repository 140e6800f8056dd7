"""The row kernels reverse_sweep and replay_sweep's gradient steps call through their addresses, compiled when a
Program first needs them.

numba compiles a function together with everything it calls: a callee's
machine code is linked into the caller's module, optimised and compiled again
there. A cold reverse sweep compiled every op family's kernels (38 s of a new
user's 42 s first `jitape demo`) whatever its Program held. These sweeps
instead call each row's kernel (interpreter.REVERSE_ROW_KERNELS, one per op
family, all of one signature) through a table of addresses (their
`row_kernels`) that the caller fills for the kernels its Program uses
(reverse_row_kernels): compiled or loaded once per signature, and only those.
The call goes through addressed.call_at, which checks the table's signature
key; scalar and small elementwise rows never take it (the sweeps run them
inline).
"""
import threading

import numpy as np
from numba import typeof, types

from .. import opcodes as oc
from .addressed import plain, signature_key
from .interpreter import REVERSE_KERNEL_OF, REVERSE_ROW_KERNELS, SMALL, row_operands
from .workspace import new_work

try:        # numba's C function typing an argument for its dispatch (~0.2 us), else numba's typeof (~5 us)
    from numba._dispatcher import compute_fingerprint as _type_key
except ImportError:
    _type_key = typeof

_WORK = typeof(new_work.py_func())


def reverse_row_kernels(code, slots, iattr, fattr, arena, adjoint, temps, homes):
    """reverse_sweep's `row_kernels` for these arrays: a table with the row kernels of the families `code` holds,
    compiled (or loaded) for the arrays' types (reverse_signature, worked out once per kind of arrays)."""
    arrays = (code, slots, iattr, fattr, arena, adjoint, temps, homes)
    kind = tuple(map(_type_key, arrays))
    found = _by_kind.get(kind)
    if found is None:
        signature = reverse_signature(*arrays)
        found = _by_kind[kind] = (signature, reverse_table(signature, ()))
    signature, table = found
    missing = [k for k in needed_reverse_kernels(code, slots) if not table[k]]
    return reverse_table(signature, missing) if missing else table


_by_kind = {}           # the arrays' type keys -> (their reverse_signature, its table)


def reverse_signature(code, slots, iattr, fattr, arena, adjoint, temps, homes):
    """The argument types reverse_sweep passes its row kernels for these arrays: the type of the tuple
    interpreter.row_operands makes of them (its compile for them tells it)."""
    outer = (typeof(code), types.int64, typeof(slots), typeof(iattr), typeof(fattr), typeof(arena), typeof(adjoint),
             _WORK, typeof(temps), typeof(homes), types.boolean, types.boolean)
    row_operands.compile(outer)
    return plain((row_operands.overloads[outer].signature.return_type,))


def needed_reverse_kernels(code, slots):
    """The REVERSE_ROW_KERNELS indices whose kernels reverse_sweep may call for `code`: every row's but the
    elementwise rows of at most SMALL entries, which it runs inline."""
    ops = code[:, oc.OP]
    called = (ops > oc.BINARY_LAST) | (slots[code[:, oc.OUT], oc.SIZE] > SMALL)
    return np.flatnonzero(np.bincount(REVERSE_KERNEL_OF[ops[called]], minlength=len(REVERSE_ROW_KERNELS))).tolist()


_tables = {}            # signature -> its table
_lock = threading.Lock()


def reverse_table(signature, kernels=None):
    """The row kernel table of reverse_sweep for argument types `signature` (reverse_signature's), with the
    addresses of `kernels` (REVERSE_ROW_KERNELS indices; None: all) compiled or loaded from the cache: a table
    per signature, its addresses filled as Programs need them; its last entry, the signature's key."""
    table = _tables.get(signature)
    wanted = range(len(REVERSE_ROW_KERNELS)) if kernels is None else kernels
    if table is not None and all([table[k] for k in wanted]):
        return table
    with _lock:
        table = _tables.get(signature)
        if table is None:
            table = np.zeros(len(REVERSE_ROW_KERNELS) + 1, np.int64)
            table[-1] = signature_key(signature)
        for k in wanted:
            if not table[k]:
                table[k] = _address(REVERSE_ROW_KERNELS[k], signature)
        _tables[signature] = table
    return table


def _address(dispatcher, signature):
    """The address of the native function numba compiled (or loads) for `signature`; the dispatcher keeps it."""
    dispatcher.compile(signature)
    compiled = dispatcher.overloads[tuple(signature)]
    if compiled.signature.return_type != types.none:
        raise TypeError(f"row kernel {dispatcher.__name__} must return None, got {compiled.signature.return_type}")
    return compiled.library.get_pointer_to_function(compiled.fndesc.llvm_func_name)
