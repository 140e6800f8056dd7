"""Forward mode: the tangent sweep (forward-mode Jacobians, the directions of Hessians) and the
second-order reverse sweep of forward-over-reverse Hessians.

An instruction y = f(x_1..x_m) has the reverse rule dx_i += J_i^T dy. Along a
direction (tangents x' of the forward values) that rule's tangent is

    dx_i' += J_i^T dy'  +  sum_j d²f/dx_i dx_j [dy, x_j']

The first term is the ordinary reverse rule run over K tangent columns
(reverse_instruction); the second is the op's second-order kernel, fed by the
one-column cotangents dy of a finished reverse sweep and the tangents of the
tangent sweep. Linear ops (shape moves, sums, add, where, max/min) have none.
Tangents and cotangent tangents use the Program's adjoint rows: exactly the
slots between the sources and the target need them.
"""
import numpy as np

from .. import njit, opcodes as oc
from .elementwise import binary_second, binary_tangent, unary_reverse, unary_second, where_linear
from .interpreter import params, reverse_instruction, value_of
from .linalg import (inv_second, inv_tangent, matmul_second, matmul_seeded_tangent, matmul_tangent, solve_second,
                     solve_tangent)
from .reduction import cumsum_linear, reduce_linear, reduce_second
from .shape import mapped_linear, moved_linear
from .unowned import unowned
from .workspace import new_work


@njit(cache=True, error_model="numpy")
def _reads_tangents(op, code, r):
    """Which of instruction r's slots (input 0, input 1, output) its second-order kernel reads tangents of."""
    has0 = code[r, oc.IN0_ADJ] >= 0
    has1 = code[r, oc.IN1_ADJ] >= 0
    if op <= oc.UNARY_LAST:
        linear = (op == oc.COPY or op == oc.NEG or op == oc.ABS or op == oc.SIGN or op == oc.RELU
                  or op == oc.CLIP or op == oc.SCALE)
        return not linear, False, False
    if op == oc.MUL or op == oc.MATMUL:
        return has0 and has1, has0 and has1, False
    if op == oc.DIV:
        return has1, has1, False
    if op == oc.POW or op == oc.ATAN2:
        return True, True, False
    if op == oc.PROD or op == oc.LOGSUMEXP:
        return True, False, False
    if op == oc.SOLVE:
        return has0, False, has0
    if op == oc.INV:
        return True, False, False
    return False, False, False


@njit(cache=True, error_model="numpy")
def _tangents_needed(code, slots, target):
    """Per slot: whether its tangent is needed, by the target (target >= 0: a forward-mode Jacobian)
    or by the second-order kernels (target -1), directly or through a later tangent; with target -2, every
    instruction's output (a Program lowered for several targets: it holds only rows toward them)."""
    needed = np.zeros(slots.shape[0], np.bool_)
    if target == -2:
        needed[:] = True
        return needed
    if target >= 0:
        needed[target] = True
    for r in range(code.shape[0] - 1, -1, -1):
        t0, t1, t_out = _reads_tangents(code[r, oc.OP], code, r) if target < 0 else (False, False, False)
        if t_out or needed[code[r, oc.OUT]]:
            needed[code[r, oc.OUT]] = True
            for c in range(oc.IN0, oc.IN2 + 1):
                if code[r, c] >= 0:
                    needed[code[r, c]] = True
        if t0:
            needed[code[r, oc.IN0]] = True
        if t1:
            needed[code[r, oc.IN1]] = True
    return needed


@njit(cache=True, error_model="numpy")
def live_tangents(code, slots, seeded):
    """Per slot: whether its tangent can be nonzero: a seeded slot with entries, or an output computed from
    one. A slot computed from empty tensors only (a sum over an empty axis) has a structurally zero tangent,
    and kernels skip it rather than multiply it: 0 * inf (that sum divided by its zero count) would be nan
    where the reverse sweep, whose cotangents never reach an empty tensor, is exact."""
    live = np.zeros(slots.shape[0], np.bool_)
    for s in seeded:
        live[s] = slots[s, oc.SIZE] > 0
    for r in range(code.shape[0]):
        out = code[r, oc.OUT]
        for c in range(3):
            s = code[r, oc.IN0 + c]
            if s >= 0 and code[r, oc.IN0_ADJ + c] >= 0 and live[s] and slots[out, oc.SIZE] > 0:
                live[out] = True
    return live


@njit(cache=True, error_model="numpy")
def _live_row(code, r, c, live):
    """Instruction r's adjoint row of input c, or -1 when it has none or its tangent is structurally zero."""
    s = code[r, oc.IN0 + c]
    return code[r, oc.IN0_ADJ + c] if s >= 0 and live[s] else -1


@njit(cache=True, error_model="numpy")
def tangent_sweep(code, slots, iattr, fattr, arena, tangent, seeded, seed_row, seed_start, target, homes, temps):
    """Fill the K tangent columns y' = sum_i J_i x_i' of the outputs whose tangents are needed, in
    program order: toward `target` (a slot: forward-mode Jacobians), with target -1 those the
    second-order sweep reads, with -2 all of them. Other rows are left as they are (never read).

    `tangent` [adjoint_size, K] holds the seeded rows of the slots listed in
    `seeded` (the sources): they are kept, and an instruction that computes a
    source from earlier active slots (an intermediate source) adds its tangent
    to the seed, so upstream sources still see total derivatives. Other rows
    are zeroed before they are accumulated into. seed_row >= 0 says the rows from seed_row hold
    the identity's columns seed_start.. : a matmul with that operand copies
    instead of multiplying by the identity. -1 for other seeds. homes: values read where they live (see
    interpreter.reverse_instruction); temps: the kernels' scratch (see interpreter.planned_temps).
    """
    code, slots, iattr, fattr, arena, tangent, seeded, homes, temps = (
        unowned(code), unowned(slots), unowned(iattr), unowned(fattr), unowned(arena), unowned(tangent),
        unowned(seeded), unowned(homes), unowned(temps))
    empty = tangent[0:0]
    transpose = tangent.shape[1] < 0      # run-time False: the reverse sweep's linear kernels serve as they are
    needed = _tangents_needed(code, slots, target)
    live = live_tangents(code, slots, seeded)
    work = new_work()
    keep = np.zeros(slots.shape[0], np.bool_)
    for s in seeded:
        keep[s] = True
    for r in range(code.shape[0]):
        # zeroed before any instruction runs: concat's PLACE rows share one output
        if needed[code[r, oc.OUT]] and not keep[code[r, oc.OUT]]:
            tangent[code[r, oc.OUT_ADJ]:code[r, oc.OUT_ADJ] + slots[code[r, oc.OUT], oc.SIZE]] = 0
    for r in range(code.shape[0]):
        if not needed[code[r, oc.OUT]]:
            continue
        op = code[r, oc.OP]
        a = code[r, oc.ATTR]
        size = slots[code[r, oc.OUT], oc.SIZE]
        o = code[r, oc.OUT_OFF]
        y = value_of(arena, homes, code[r, oc.OUT], o, size)
        t_out = tangent[code[r, oc.OUT_ADJ]:code[r, oc.OUT_ADJ] + size]
        i0 = code[r, oc.IN0_OFF]
        n0 = slots[code[r, oc.IN0], oc.SIZE]
        x = value_of(arena, homes, code[r, oc.IN0], i0, n0)
        j0 = _live_row(code, r, 0, live)
        t0 = tangent[j0:j0 + n0] if j0 >= 0 else empty
        j1 = _live_row(code, r, 1, live)
        n1 = slots[code[r, oc.IN1], oc.SIZE] if code[r, oc.IN1] >= 0 else 0
        t1 = tangent[j1:j1 + n1] if j1 >= 0 else empty
        w = value_of(arena, homes, code[r, oc.IN1], code[r, oc.IN1_OFF], n1)
        if op <= oc.UNARY_LAST:
            if j0 >= 0:
                p0, p1 = params(op, iattr, fattr, a)
                # a diagonal Jacobian is its own transpose: the reverse kernel is the tangent kernel
                unary_reverse(op, x, y, t0, t_out, p0, p1)
        elif op <= oc.BINARY_LAST:
            binary_tangent(op, x, w, y, t0, t1, t_out, j0 >= 0, j1 >= 0)
        elif op == oc.WHERE:
            j2 = _live_row(code, r, 2, live)
            where_linear(x, t_out, t1, tangent[j2:j2 + size] if j2 >= 0 else empty, j1 >= 0, j2 >= 0, transpose)
        elif op == oc.MATMUL:
            seeded_x = j0 >= 0 and j0 == seed_row
            seeded_w = j1 >= 0 and j1 == seed_row
            matmul_tangent(iattr, a, x, w, t0, t1, t_out, j0 >= 0 and not seeded_x, j1 >= 0 and not seeded_w, temps)
            # run-time flags (not literals): one compiled specialization serves both operands
            if seeded_x:
                matmul_seeded_tangent(iattr, a, x, w, t_out, not seeded_x, seed_start)
            if seeded_w:
                matmul_seeded_tangent(iattr, a, x, w, t_out, seeded_w, seed_start)
        elif op == oc.SOLVE:
            solve_tangent(iattr, a, x, y, t0, t1, t_out, j0 >= 0, j1 >= 0, temps)
        elif j0 < 0:
            continue
        elif op <= oc.REDUCE_LAST:
            reduce_linear(op, x, y, t_out, t0, iattr[a], iattr[a + 1], iattr[a + 2], transpose, temps)
        elif op == oc.CUMSUM:
            cumsum_linear(t_out, t0, iattr[a], iattr[a + 1], iattr[a + 2], iattr[a + 3] != 0, iattr[a + 4] != 0,
                          transpose, temps)
        elif op <= oc.PAD:
            mapped_linear(op, iattr, a, t_out, t0, transpose, work)
        elif op <= oc.GATHER:
            moved_linear(op, iattr, a, t_out, t0, transpose)
        else:
            inv_tangent(iattr, a, y, t0, t_out, temps)


@njit(cache=True, error_model="numpy")
def _second_order_terms(code, r, slots, iattr, fattr, arena, adjoint, tangent, adjoint_tangent, live, homes,
                        temps):
    """Instruction r's second-order kernel; adjoint is the one-column cotangent buffer, live says which
    tangents can be nonzero (see live_tangents)."""
    g = adjoint.reshape(adjoint.size)
    op = code[r, oc.OP]
    a = code[r, oc.ATTR]
    size = slots[code[r, oc.OUT], oc.SIZE]
    o = code[r, oc.OUT_OFF]
    go = code[r, oc.OUT_ADJ]
    y = value_of(arena, homes, code[r, oc.OUT], o, size)
    g_out = g[go:go + size]
    empty = tangent[0:0]
    i0 = code[r, oc.IN0_OFF]
    n0 = slots[code[r, oc.IN0], oc.SIZE]
    x = value_of(arena, homes, code[r, oc.IN0], i0, n0)
    j0 = code[r, oc.IN0_ADJ]
    t0 = tangent[j0:j0 + n0] if j0 >= 0 else empty
    gt0 = adjoint_tangent[j0:j0 + n0] if j0 >= 0 else empty
    live0 = j0 >= 0 and live[code[r, oc.IN0]]
    if op <= oc.UNARY_LAST:
        if live0:
            p0, p1 = params(op, iattr, fattr, a)
            unary_second(op, x, y, g_out, t0, gt0, p0, p1)
        return
    if op == oc.PROD or op == oc.LOGSUMEXP:
        if live0:
            reduce_second(op, x, y, g_out, t0, gt0, iattr[a], iattr[a + 1], iattr[a + 2], temps)
        return
    if op == oc.INV:
        if live0:
            inv_second(iattr, a, y, adjoint[go:go + size], t0, gt0, temps)
        return
    if op > oc.BINARY_LAST and op != oc.MATMUL and op != oc.SOLVE:
        return
    n1 = slots[code[r, oc.IN1], oc.SIZE]
    j1 = code[r, oc.IN1_ADJ]
    t1 = tangent[j1:j1 + n1] if j1 >= 0 else empty
    gt1 = adjoint_tangent[j1:j1 + n1] if j1 >= 0 else empty
    w = value_of(arena, homes, code[r, oc.IN1], code[r, oc.IN1_OFF], n1)
    if op <= oc.BINARY_LAST:
        if j0 >= 0 or j1 >= 0:
            binary_second(op, x, w, y, g_out, t0, t1, gt0, gt1, j0 >= 0, j1 >= 0, live0,
                          j1 >= 0 and live[code[r, oc.IN1]])
    elif op == oc.MATMUL:
        if j0 >= 0 and j1 >= 0:
            matmul_second(iattr, a, g_out, t0, t1, gt0, gt1, temps)
    elif j0 >= 0:
        solve_second(iattr, a, x, y, adjoint[go:go + size], t0, tangent[go:go + size], gt0, gt1, j1 >= 0, temps)


@njit(cache=True, error_model="numpy")
def _second_order_inputs(op, code, r):
    """Which inputs (0, 1) instruction r's second-order kernel adds to: those whose tangents it reads,
    and B of a SOLVE whose A is active."""
    t0, t1, _ = _reads_tangents(op, code, r)
    if op == oc.SOLVE:
        return t0, t0
    return t0, t1


@njit(cache=True, error_model="numpy")
def _first_write(code, r, c, slots, written, adjoint_tangent):
    """Zero the rows of instruction r's input in column c before anything is first added to them."""
    s = code[r, c]
    j = code[r, c + oc.IN0_ADJ - oc.IN0]
    if s >= 0 and j >= 0 and not written[s]:
        adjoint_tangent[j:j + slots[s, oc.SIZE]] = 0
        written[s] = True


@njit(cache=True, error_model="numpy")
def second_order_sweep(code, slots, iattr, fattr, arena, adjoint, tangent, adjoint_tangent, seeded, homes, temps,
                       row_kernels):
    """Accumulate the tangents of the cotangents, last instruction first; returns, per slot, whether
    its rows of adjoint_tangent were written (rows never written hold no values: read them as zeros).

    adjoint [adjoint_size, 1]: the cotangents of a finished reverse_sweep;
    tangent [adjoint_size, K]: from tangent_sweep (seeded at the slots `seeded`); adjoint_tangent [adjoint_size, K]:
    any contents (the target's cotangent does not vary, so its tangent is zero). The
    sources' rows end up holding Hessian-times-direction columns. An instruction whose
    output was never written (no second-order term reached it: a loss's linear tail)
    skips its reverse rule, and rows are zeroed only when first written. temps: the kernels' scratch (see
    interpreter.planned_temps); row_kernels: the table of addressed kernels holding the reverse row kernels of
    every row's family (row_kernels.reverse_kernels with every_row), which run each row's reverse rule.
    """
    code, slots, iattr, fattr, arena, adjoint, tangent, adjoint_tangent, seeded, homes, temps = (
        unowned(code), unowned(slots), unowned(iattr), unowned(fattr), unowned(arena), unowned(adjoint),
        unowned(tangent), unowned(adjoint_tangent), unowned(seeded), unowned(homes), unowned(temps))
    written = np.zeros(slots.shape[0], np.bool_)
    live = live_tangents(code, slots, seeded)
    work = new_work()
    for r in range(code.shape[0] - 1, -1, -1):
        if written[code[r, oc.OUT]]:
            for c in range(oc.IN0, oc.IN2 + 1):
                _first_write(code, r, c, slots, written, adjoint_tangent)
            reverse_instruction(code, r, slots, iattr, fattr, arena, adjoint_tangent, work, temps, homes, row_kernels)
        to0, to1 = _second_order_inputs(code[r, oc.OP], code, r)
        if to0:
            _first_write(code, r, oc.IN0, slots, written, adjoint_tangent)
        if to1:
            _first_write(code, r, oc.IN1, slots, written, adjoint_tangent)
        _second_order_terms(code, r, slots, iattr, fattr, arena, adjoint, tangent, adjoint_tangent, live, homes,
                            temps)
    return written
