"""Batch rows: the row analysis of batch Jacobians, and the split sweep of per-example gradients.

Does any instruction let batch row b depend on another row?

A slot that depends on the source is "aligned" when its leading axis is the
batch (size B) and row b depends only on source row b. Each opcode keeps
alignment under the conditions below; the first instruction that breaks it
(a reduction over the batch, a matmul contracting it, a transpose or reshape
moving it, a slice or gather picking rows ...) is reported.
"""
import numpy as np
from numba import njit

from .. import opcodes as oc
from .interpreter import reverse_instruction
from .linalg import matmul_reverse
from .shape import leading_broadcast_block


@njit(cache=True, error_model="numpy")
def _leading(slots, s):
    return slots[s, oc.DIMS] if slots[s, oc.RANK] > 0 else -1


@njit(cache=True, error_model="numpy")
def _keeps_rows(op, code, r, slots, iattr, batch, x_rows, w_rows):
    """Whether instruction r keeps batch rows apart; x_rows / w_rows: its first / second input carries rows."""
    a = code[r, oc.ATTR]
    out = code[r, oc.OUT]
    if _leading(slots, out) != batch:
        return False
    if op <= oc.BINARY_LAST or op == oc.WHERE:
        return True
    if op <= oc.PROD or op == oc.CUMSUM or op == oc.PLACE or op == oc.GATHER:
        return iattr[a] % batch == 0            # outer block: reductions, cumsum, concat, gather stay inside rows
    if op == oc.TRANSPOSE:
        rank = iattr[a]
        return iattr[a + 1 + rank] == 0          # perm[0] == 0
    if op == oc.TILE or op == oc.SLICE or op == oc.PAD:
        rank = iattr[a]
        if iattr[a + 1] != batch or iattr[a + 1 + rank] != batch:
            return False
        if op == oc.TILE:
            return True
        return iattr[a + 1 + 3 * rank] == 0 and iattr[a + 1 + 4 * rank] == 1
    if op == oc.MATMUL:
        batch_x, batch_w, m = iattr[a], iattr[a + 1], iattr[a + 2]
        if batch_x == 1 and batch_w == 1:
            return x_rows and not w_rows and m == batch   # rows of x are rows of the product
        return (not x_rows or batch_x % batch == 0) and (not w_rows or batch_w % batch == 0)
    # SOLVE, INV: batched matrices, one system per row
    return iattr[a] % batch == 0


@njit(cache=True, error_model="numpy")
def first_row_mixing(code, slots, iattr, batch):
    """Index of the first instruction whose output rows mix batch rows, or -1 if none does."""
    for r in range(code.shape[0]):
        if not _keeps_rows(code[r, oc.OP], code, r, slots, iattr, batch,
                           code[r, oc.IN0_ADJ] >= 0, code[r, oc.IN1_ADJ] >= 0):
            return r
    return -1


ROW, PARAM, JUNCTION = 0, 1, 2


@njit(cache=True, error_model="numpy")
def per_example_plan(code, slots, iattr, adjoint_rows, batch):
    """Split a Program for per-example gradients of shared parameters.

    Row slots depend on batch data (non-source leaves with leading dim `batch`)
    and keep one adjoint column: row b's cotangent is example b's. Parameter
    slots depend on the sources only and get `batch` columns, one per example.
    Junctions, where rows meet parameters, write each example's contribution
    into its own column: a broadcast of a parameter over the batch (TILE) and a
    matmul whose second operand is a parameter. Returns (first unsupported or
    row-mixing instruction or -1, code with class-local adjoint rows, modes,
    row-buffer size, parameter-buffer size, each slot's row in its buffer, row flags).
    """
    n_slots = slots.shape[0]
    produced = np.zeros(n_slots, np.bool_)
    for r in range(code.shape[0]):
        produced[code[r, oc.OUT]] = True
    rows = np.zeros(n_slots, np.bool_)
    for s in range(n_slots):
        rows[s] = (not produced[s] and adjoint_rows[s] < 0 and slots[s, oc.OFFSET] >= 0
                   and _leading(slots, s) == batch)
    modes = np.zeros(code.shape[0], np.int64)
    for r in range(code.shape[0]):
        op = code[r, oc.OP]
        row_in = False
        param_in = False
        for c in range(3):
            s = code[r, oc.IN0 + c]
            if s >= 0:
                row_in = row_in or rows[s]
                param_in = param_in or (code[r, oc.IN0_ADJ + c] >= 0 and not rows[s])
        out = code[r, oc.OUT]
        if not row_in:
            a = code[r, oc.ATTR]
            replicate = (op == oc.TILE and _leading(slots, out) == batch and iattr[a + 1] == 1
                         and leading_broadcast_block(op, iattr, a) > 0)
            if not replicate:
                modes[r] = PARAM
                continue
            rows[out] = True
            modes[r] = JUNCTION
            continue
        rows[out] = True
        in1 = code[r, oc.IN1]
        if not _keeps_rows(op, code, r, slots, iattr, batch, rows[code[r, oc.IN0]], in1 >= 0 and rows[in1]):
            return r, code, modes, 0, 0, adjoint_rows, rows
        if param_in:
            # a parameter as matmul's right operand is the only other junction supported
            if op != oc.MATMUL or code[r, oc.IN0_ADJ] >= 0 and not rows[code[r, oc.IN0]] \
                    or rows[code[r, oc.IN1]]:
                return r, code, modes, 0, 0, adjoint_rows, rows
            modes[r] = JUNCTION
        else:
            modes[r] = ROW
    local = np.full(n_slots, -1, np.int64)
    n_row = 0
    n_param = 0
    for s in range(n_slots):
        if adjoint_rows[s] >= 0:
            if rows[s]:
                local[s] = n_row
                n_row += slots[s, oc.SIZE]
            else:
                local[s] = n_param
                n_param += slots[s, oc.SIZE]
    recoded = code.copy()
    for r in range(code.shape[0]):
        for c in range(4):
            s = code[r, oc.OUT + c]
            if s >= 0:
                recoded[r, oc.OUT_ADJ + c] = local[s]
    return -1, recoded, modes, n_row, n_param, local, rows


@njit(cache=True, error_model="numpy")
def per_example_sweep(code, modes, slots, iattr, fattr, arena, row_adjoint, param_adjoint):
    """Reverse sweep of a per_example_plan: row instructions on the one-column buffer, parameter
    instructions on the `batch`-column buffer, junctions splitting contributions by example."""
    batch = param_adjoint.shape[1]
    for r in range(code.shape[0] - 1, -1, -1):
        if modes[r] == ROW:
            reverse_instruction(code, r, slots, iattr, fattr, arena, row_adjoint)
            continue
        if modes[r] == PARAM:
            reverse_instruction(code, r, slots, iattr, fattr, arena, param_adjoint)
            continue
        op = code[r, oc.OP]
        a = code[r, oc.ATTR]
        size = slots[code[r, oc.OUT], oc.SIZE]
        go = code[r, oc.OUT_ADJ]
        per_row = size // batch
        if op == oc.TILE:
            # a parameter broadcast over the batch: row b's copies belong to example b
            block = leading_broadcast_block(op, iattr, a)
            gp = code[r, oc.IN0_ADJ]
            for b in range(batch):
                for e in range(per_row):
                    param_adjoint[gp + e % block, b] += row_adjoint[go + b * per_row + e, 0]
            continue
        # MATMUL with a parameter on the right: dW[:, :, b] = sum over example b's rows of x_q^T g_q
        m, k, n = iattr[a + 2], iattr[a + 3], iattr[a + 4]
        i0 = code[r, oc.IN0_OFF]
        x = arena[i0:i0 + slots[code[r, oc.IN0], oc.SIZE]]
        j0 = code[r, oc.IN0_ADJ]
        if j0 >= 0:
            i1 = code[r, oc.IN1_OFF]
            w = arena[i1:i1 + k * n]
            g_out = row_adjoint[go:go + size]
            matmul_reverse(iattr, a, x, w, g_out, row_adjoint[j0:j0 + x.size], g_out[0:0], True, False)
        gw = code[r, oc.IN1_ADJ]
        n_rows = size // n
        rows_per_example = n_rows // batch
        # example-major copies, so the innermost loop runs over examples in all three arrays
        xt = np.ascontiguousarray(x.reshape(n_rows, k).T)
        gt = np.ascontiguousarray(row_adjoint[go:go + size].reshape(n_rows, n).T)
        for kk in range(k):
            for nn in range(n):
                target = param_adjoint[gw + kk * n + nn]
                if rows_per_example == 1:
                    for q in range(n_rows):
                        target[q] += xt[kk, q] * gt[nn, q]
                else:
                    for q in range(n_rows):
                        target[q // rows_per_example] += xt[kk, q] * gt[nn, q]
