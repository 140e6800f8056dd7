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
from .interpreter import ADDRESSED_KERNELS, REVERSE_KERNEL_OF, call_addressed, params, reverse_instruction, value_of
from .linalg import (inv_second, inv_tangent, matmul_second, matmul_seeded_tangent, matmul_tangent, solve_second,
                     solve_tangent)
from .reduction import cumsum_linear, reduce_linear, reduce_second, sum_linear
from .shape import mapped_linear, moved_linear, tile_linear
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


@njit(cache=True, error_model="numpy", inline="always")
def _rows(tangent, j, n):
    """tangent's rows j..j+n, or none (j -1: no tangent)."""
    return tangent[j:j + n] if j >= 0 else tangent[0:0]


@njit(cache=True, error_model="numpy", inline="always")
def tangent_operands(code, r, slots, iattr, fattr, arena, tangent, live, work, temps, homes, seed_row, seed_start):
    """Row r's operands as every tangent row kernel takes them: (op, its attribute block, iattr, fattr, work,
    temps, tangent, the values of the output and inputs 0 and 1 (input 0's where there is no input 1), the
    tangent rows of the output and of inputs 0-2 (-1: none, or structurally zero: see live_tangents), the sizes
    of the output and inputs 0 and 1, seed_row, seed_start (see tangent_sweep))."""
    size = slots[code[r, oc.OUT], oc.SIZE]
    n0 = slots[code[r, oc.IN0], oc.SIZE]
    x = value_of(arena, homes, code[r, oc.IN0], code[r, oc.IN0_OFF], n0)
    n1 = slots[code[r, oc.IN1], oc.SIZE] if code[r, oc.IN1] >= 0 else 0
    w = value_of(arena, homes, code[r, oc.IN1], code[r, oc.IN1_OFF], n1) if code[r, oc.IN1] >= 0 else x
    return (code[r, oc.OP], code[r, oc.ATTR], iattr, fattr, work, temps, tangent,
            value_of(arena, homes, code[r, oc.OUT], code[r, oc.OUT_OFF], size), x, w, code[r, oc.OUT_ADJ],
            _live_row(code, r, 0, live), _live_row(code, r, 1, live), _live_row(code, r, 2, live), size, n0, n1,
            seed_row, seed_start)


# Each tangent row kernel takes tangent_operands' tuple: op, a (its attribute block), iattr, fattr, work, temps,
# tangent, y, x, w (values), to, j0, j1, j2 (tangent rows), size, n0, n1, seed_row, seed_start. A kernel per
# reverse row kernel's family (interpreter.REVERSE_KINDS): the linear ops' tangent kernels are their reverse
# kernels untransposed (`transpose`: run-time False, so one compiled specialization serves both).


@njit(cache=True, error_model="numpy")
def tangent_unary_row(operands):
    op, a, iattr, fattr, work, temps, tangent, y, x, w, to, j0, j1, j2, size, n0, n1, seed_row, seed_start = operands
    if j0 >= 0:
        p0, p1 = params(op, iattr, fattr, a)
        # a diagonal Jacobian is its own transpose: the reverse kernel is the tangent kernel
        unary_reverse(op, x, y, tangent[j0:j0 + n0], tangent[to:to + size], p0, p1)


@njit(cache=True, error_model="numpy")
def tangent_binary_row(operands):
    op, a, iattr, fattr, work, temps, tangent, y, x, w, to, j0, j1, j2, size, n0, n1, seed_row, seed_start = operands
    binary_tangent(op, x, w, y, _rows(tangent, j0, n0), _rows(tangent, j1, n1), tangent[to:to + size], j0 >= 0,
                   j1 >= 0)


@njit(cache=True, error_model="numpy")
def tangent_where_row(operands):
    op, a, iattr, fattr, work, temps, tangent, y, x, w, to, j0, j1, j2, size, n0, n1, seed_row, seed_start = operands
    where_linear(x, tangent[to:to + size], _rows(tangent, j1, n1), _rows(tangent, j2, size), j1 >= 0, j2 >= 0,
                 tangent.shape[1] < 0)


@njit(cache=True, error_model="numpy")
def tangent_sum_row(operands):
    op, a, iattr, fattr, work, temps, tangent, y, x, w, to, j0, j1, j2, size, n0, n1, seed_row, seed_start = operands
    if j0 >= 0:
        sum_linear(tangent[to:to + size], tangent[j0:j0 + n0], iattr[a], iattr[a + 1], iattr[a + 2],
                   tangent.shape[1] < 0, False)


@njit(cache=True, error_model="numpy")
def tangent_reduce_row(operands):
    op, a, iattr, fattr, work, temps, tangent, y, x, w, to, j0, j1, j2, size, n0, n1, seed_row, seed_start = operands
    if j0 >= 0:
        reduce_linear(op, x, y, tangent[to:to + size], tangent[j0:j0 + n0], iattr[a], iattr[a + 1], iattr[a + 2],
                      tangent.shape[1] < 0, temps)


@njit(cache=True, error_model="numpy")
def tangent_cumsum_row(operands):
    op, a, iattr, fattr, work, temps, tangent, y, x, w, to, j0, j1, j2, size, n0, n1, seed_row, seed_start = operands
    if j0 >= 0:
        cumsum_linear(tangent[to:to + size], tangent[j0:j0 + n0], iattr[a], iattr[a + 1], iattr[a + 2],
                      iattr[a + 3] != 0, iattr[a + 4] != 0, tangent.shape[1] < 0, temps)


@njit(cache=True, error_model="numpy")
def tangent_tile_row(operands):
    op, a, iattr, fattr, work, temps, tangent, y, x, w, to, j0, j1, j2, size, n0, n1, seed_row, seed_start = operands
    if j0 >= 0:
        tile_linear(iattr, a, tangent[to:to + size], tangent[j0:j0 + n0], tangent.shape[1] < 0, work)


@njit(cache=True, error_model="numpy")
def tangent_mapped_row(operands):
    op, a, iattr, fattr, work, temps, tangent, y, x, w, to, j0, j1, j2, size, n0, n1, seed_row, seed_start = operands
    if j0 >= 0:
        mapped_linear(op, iattr, a, tangent[to:to + size], tangent[j0:j0 + n0], tangent.shape[1] < 0, work)


@njit(cache=True, error_model="numpy")
def tangent_moved_row(operands):
    op, a, iattr, fattr, work, temps, tangent, y, x, w, to, j0, j1, j2, size, n0, n1, seed_row, seed_start = operands
    if j0 >= 0:
        moved_linear(op, iattr, a, tangent[to:to + size], tangent[j0:j0 + n0], tangent.shape[1] < 0)


@njit(cache=True, error_model="numpy")
def tangent_matmul_row(operands):
    op, a, iattr, fattr, work, temps, tangent, y, x, w, to, j0, j1, j2, size, n0, n1, seed_row, seed_start = operands
    t_out = tangent[to:to + size]
    seeded_x = j0 >= 0 and j0 == seed_row
    seeded_w = j1 >= 0 and j1 == seed_row
    matmul_tangent(iattr, a, x, w, _rows(tangent, j0, n0), _rows(tangent, j1, n1), t_out, j0 >= 0 and not seeded_x,
                   j1 >= 0 and not seeded_w, temps)
    # run-time flags (not literals): one compiled specialization serves both operands
    if seeded_x:
        matmul_seeded_tangent(iattr, a, x, w, t_out, not seeded_x, seed_start)
    if seeded_w:
        matmul_seeded_tangent(iattr, a, x, w, t_out, seeded_w, seed_start)


@njit(cache=True, error_model="numpy")
def tangent_solve_row(operands):
    op, a, iattr, fattr, work, temps, tangent, y, x, w, to, j0, j1, j2, size, n0, n1, seed_row, seed_start = operands
    solve_tangent(iattr, a, x, y, _rows(tangent, j0, n0), _rows(tangent, j1, n1), tangent[to:to + size], j0 >= 0,
                  j1 >= 0, temps)


@njit(cache=True, error_model="numpy")
def tangent_inv_row(operands):
    op, a, iattr, fattr, work, temps, tangent, y, x, w, to, j0, j1, j2, size, n0, n1, seed_row, seed_start = operands
    if j0 >= 0:
        inv_tangent(iattr, a, y, tangent[j0:j0 + n0], tangent[to:to + size], temps)


# per family of REVERSE_KINDS, its tangent row kernel, called through the table of addressed kernels (rows from
# TANGENT_FIRST: see row_kernels), so a first forward-mode Jacobian or Hessian compiles the kernels its Program uses
TANGENT_ROW_KERNELS = (tangent_unary_row, tangent_binary_row, tangent_where_row, tangent_sum_row, tangent_reduce_row,
                       tangent_cumsum_row, tangent_tile_row, tangent_mapped_row, tangent_moved_row, tangent_matmul_row,
                       tangent_solve_row, tangent_inv_row)
TANGENT_FIRST = len(ADDRESSED_KERNELS)
TANGENT_KERNEL_OF = TANGENT_FIRST + REVERSE_KERNEL_OF


@njit(cache=True, error_model="numpy")
def tangent_sweep(code, slots, iattr, fattr, arena, tangent, seeded, seed_row, seed_start, target, homes, temps,
                  row_kernels):
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
    interpreter.reverse_instruction); temps: the kernels' scratch (see interpreter.planned_temps); row_kernels:
    the table of addressed kernels holding the tangent row kernels of the rows' families
    (row_kernels.tangent_kernels), which run each row.
    """
    code, slots, iattr, fattr, arena, tangent, seeded, homes, temps = (
        unowned(code), unowned(slots), unowned(iattr), unowned(fattr), unowned(arena), unowned(tangent),
        unowned(seeded), unowned(homes), unowned(temps))
    needed = _tangents_needed(code, slots, target)
    live = live_tangents(code, slots, seeded)
    work = new_work()
    # an output's rows are zeroed before the first row that writes them (concat's PLACE rows share one output),
    # not before the sweep: a first-order Program's slots never live at once may share rows (adjoint_layout)
    zeroed = np.zeros(slots.shape[0], np.bool_)
    for s in seeded:
        zeroed[s] = True
    for r in range(code.shape[0]):
        out = code[r, oc.OUT]
        if needed[out]:
            if not zeroed[out]:
                tangent[code[r, oc.OUT_ADJ]:code[r, oc.OUT_ADJ] + slots[out, oc.SIZE]] = 0
                zeroed[out] = True
            call_addressed(row_kernels, TANGENT_KERNEL_OF[code[r, oc.OP]],
                           tangent_operands(code, r, slots, iattr, fattr, arena, tangent, live, work, temps, homes,
                                            seed_row, seed_start))


@njit(cache=True, error_model="numpy", inline="always")
def second_order_operands(code, r, slots, iattr, fattr, arena, adjoint, tangent, adjoint_tangent, live, temps, homes):
    """Row r's operands as every second-order row kernel takes them: (op, its attribute block, iattr, fattr, temps,
    the one-column cotangents `adjoint` and g (its entries, 1-D), tangent, adjoint_tangent, the values of the
    output and inputs 0 and 1 (input 0's where there is no input 1), the adjoint rows of the output and inputs 0
    and 1 (-1: inactive), the sizes of the output and inputs 0 and 1, whether inputs 0 and 1 have tangents that
    can be nonzero (see live_tangents))."""
    size = slots[code[r, oc.OUT], oc.SIZE]
    n0 = slots[code[r, oc.IN0], oc.SIZE]
    x = value_of(arena, homes, code[r, oc.IN0], code[r, oc.IN0_OFF], n0)
    has1 = code[r, oc.IN1] >= 0
    n1 = slots[code[r, oc.IN1], oc.SIZE] if has1 else 0
    w = value_of(arena, homes, code[r, oc.IN1], code[r, oc.IN1_OFF], n1) if has1 else x
    j0, j1 = code[r, oc.IN0_ADJ], code[r, oc.IN1_ADJ]
    return (code[r, oc.OP], code[r, oc.ATTR], iattr, fattr, temps, adjoint, adjoint.reshape(adjoint.size), tangent,
            adjoint_tangent, value_of(arena, homes, code[r, oc.OUT], code[r, oc.OUT_OFF], size), x, w,
            code[r, oc.OUT_ADJ], j0, j1,
            size, n0, n1, j0 >= 0 and live[code[r, oc.IN0]], has1 and j1 >= 0 and live[code[r, oc.IN1]])


# Each second-order row kernel takes second_order_operands' tuple: op, a, iattr, fattr, temps, adjoint, g, tangent,
# adjoint_tangent, y, x, w (values), go, j0, j1 (adjoint rows), size, n0, n1, live0, live1. A kernel per family
# with second-order terms (linear ops have none).


@njit(cache=True, error_model="numpy")
def second_unary_row(operands):
    (op, a, iattr, fattr, temps, adjoint, g, tangent, adjoint_tangent, y, x, w, go, j0, j1, size, n0, n1, live0,
     live1) = operands
    if live0:
        p0, p1 = params(op, iattr, fattr, a)
        unary_second(op, x, y, g[go:go + size], tangent[j0:j0 + n0], adjoint_tangent[j0:j0 + n0], p0, p1)


@njit(cache=True, error_model="numpy")
def second_binary_row(operands):
    (op, a, iattr, fattr, temps, adjoint, g, tangent, adjoint_tangent, y, x, w, go, j0, j1, size, n0, n1, live0,
     live1) = operands
    if j0 >= 0 or j1 >= 0:
        binary_second(op, x, w, y, g[go:go + size], _rows(tangent, j0, n0), _rows(tangent, j1, n1),
                      _rows(adjoint_tangent, j0, n0), _rows(adjoint_tangent, j1, n1), j0 >= 0, j1 >= 0, live0, live1)


@njit(cache=True, error_model="numpy")
def second_reduce_row(operands):
    (op, a, iattr, fattr, temps, adjoint, g, tangent, adjoint_tangent, y, x, w, go, j0, j1, size, n0, n1, live0,
     live1) = operands
    if live0:
        reduce_second(op, x, y, g[go:go + size], tangent[j0:j0 + n0], adjoint_tangent[j0:j0 + n0],
                      iattr[a], iattr[a + 1], iattr[a + 2], temps)


@njit(cache=True, error_model="numpy")
def second_matmul_row(operands):
    (op, a, iattr, fattr, temps, adjoint, g, tangent, adjoint_tangent, y, x, w, go, j0, j1, size, n0, n1, live0,
     live1) = operands
    if j0 >= 0 and j1 >= 0:
        matmul_second(iattr, a, g[go:go + size], tangent[j0:j0 + n0], tangent[j1:j1 + n1],
                      adjoint_tangent[j0:j0 + n0], adjoint_tangent[j1:j1 + n1], temps)


@njit(cache=True, error_model="numpy")
def second_solve_row(operands):
    (op, a, iattr, fattr, temps, adjoint, g, tangent, adjoint_tangent, y, x, w, go, j0, j1, size, n0, n1, live0,
     live1) = operands
    if j0 >= 0:
        solve_second(iattr, a, x, y, adjoint[go:go + size], tangent[j0:j0 + n0], tangent[go:go + size],
                     adjoint_tangent[j0:j0 + n0], _rows(adjoint_tangent, j1, n1), j1 >= 0, temps)


@njit(cache=True, error_model="numpy")
def second_inv_row(operands):
    (op, a, iattr, fattr, temps, adjoint, g, tangent, adjoint_tangent, y, x, w, go, j0, j1, size, n0, n1, live0,
     live1) = operands
    if live0:
        inv_second(iattr, a, y, adjoint[go:go + size], tangent[j0:j0 + n0], adjoint_tangent[j0:j0 + n0], temps)


SECOND_ORDER_KINDS = ("unary", "binary", "reduce", "matmul", "solve", "inv")
SECOND_ORDER_ROW_KERNELS = (second_unary_row, second_binary_row, second_reduce_row, second_matmul_row,
                            second_solve_row, second_inv_row)
SECOND_ORDER_FIRST = TANGENT_FIRST + len(TANGENT_ROW_KERNELS)
# per opcode, its second-order row kernel's row in the table of addressed kernels, -1 for none (a linear op; of the
# reductions PROD and LOGSUMEXP have terms)
SECOND_ORDER_KERNEL_OF = np.array([
    SECOND_ORDER_FIRST + SECOND_ORDER_KINDS.index(kind) if kind in SECOND_ORDER_KINDS else -1
    for kind in ("binary" if family == "compare" else
                 family if family != "reduce" or name in ("prod", "logsumexp") else None
                 for name, family in zip(oc.NAMES, oc.FAMILIES))], np.int64)


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
    every row's family, which run each row's reverse rule, and their second-order row kernels
    (row_kernels.second_order_kernels).
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
        terms = SECOND_ORDER_KERNEL_OF[code[r, oc.OP]]
        if terms >= 0:
            call_addressed(row_kernels, terms, second_order_operands(code, r, slots, iattr, fattr, arena, adjoint,
                                                                     tangent, adjoint_tangent, live, temps, homes))
    return written
