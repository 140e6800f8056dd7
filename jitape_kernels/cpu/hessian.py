"""Forward-over-reverse second derivatives: the tangent sweep and the second-order reverse sweep.

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
from numba import njit

from .. import opcodes as oc
from .elementwise import binary_second, binary_tangent, unary_reverse, unary_second, where_tangent
from .interpreter import params, reverse_instruction
from .linalg import inv_second, inv_tangent, matmul_second, matmul_tangent, solve_second, solve_tangent
from .reduction import prod_second, reduce_tangent
from .shape import mapped_tangent, moved_tangent


@njit(cache=True)
def tangent_sweep(code, slots, iattr, fattr, arena, tangent):
    """Fill every active output's K tangent columns, y' = sum_i J_i x_i', in program order.

    `tangent` [adjoint_size, K] holds the seeded source rows and zeros elsewhere.
    """
    empty = tangent[0:0]
    for r in range(code.shape[0]):
        op = code[r, oc.OP]
        a = code[r, oc.ATTR]
        size = slots[code[r, oc.OUT], oc.SIZE]
        o = code[r, oc.OUT_OFF]
        y = arena[o:o + size]
        t_out = tangent[code[r, oc.OUT_ADJ]:code[r, oc.OUT_ADJ] + size]
        i0 = code[r, oc.IN0_OFF]
        n0 = slots[code[r, oc.IN0], oc.SIZE]
        x = arena[i0:i0 + n0]
        j0 = code[r, oc.IN0_ADJ]
        t0 = tangent[j0:j0 + n0] if j0 >= 0 else empty
        j1 = code[r, oc.IN1_ADJ]
        n1 = slots[code[r, oc.IN1], oc.SIZE] if code[r, oc.IN1] >= 0 else 0
        t1 = tangent[j1:j1 + n1] if j1 >= 0 else empty
        w = arena[code[r, oc.IN1_OFF]:code[r, oc.IN1_OFF] + n1]
        if op <= oc.UNARY_LAST:
            if j0 >= 0:
                p0, p1 = params(op, iattr, fattr, a)
                # a diagonal Jacobian is its own transpose: the reverse kernel is the tangent kernel
                unary_reverse(op, x, y, t0, t_out, p0, p1)
        elif op <= oc.BINARY_LAST:
            binary_tangent(op, x, w, y, t0, t1, t_out, j0 >= 0, j1 >= 0)
        elif op == oc.WHERE:
            j2 = code[r, oc.IN2_ADJ]
            where_tangent(x, t1, tangent[j2:j2 + size] if j2 >= 0 else empty, t_out, j1 >= 0, j2 >= 0)
        elif op == oc.MATMUL:
            matmul_tangent(iattr, a, x, w, t0, t1, t_out, j0 >= 0, j1 >= 0)
        elif op == oc.SOLVE:
            solve_tangent(iattr, a, x, y, t0, t1, t_out, j0 >= 0, j1 >= 0)
        elif j0 < 0:
            continue
        elif op <= oc.PROD:
            reduce_tangent(op, x, y, t0, t_out, iattr[a], iattr[a + 1], iattr[a + 2])
        elif op <= oc.PAD:
            mapped_tangent(op, iattr, a, t0, t_out)
        elif op <= oc.GATHER:
            moved_tangent(op, iattr, a, t0, t_out)
        else:
            inv_tangent(iattr, a, y, t0, t_out)


@njit(cache=True)
def _second_order_terms(code, r, slots, iattr, fattr, arena, g, tangent, adjoint_tangent):
    """Instruction r's second-order kernel; g is the flat one-column cotangent buffer."""
    op = code[r, oc.OP]
    a = code[r, oc.ATTR]
    size = slots[code[r, oc.OUT], oc.SIZE]
    o = code[r, oc.OUT_OFF]
    go = code[r, oc.OUT_ADJ]
    y = arena[o:o + size]
    g_out = g[go:go + size]
    empty = tangent[0:0]
    i0 = code[r, oc.IN0_OFF]
    n0 = slots[code[r, oc.IN0], oc.SIZE]
    x = arena[i0:i0 + n0]
    j0 = code[r, oc.IN0_ADJ]
    t0 = tangent[j0:j0 + n0] if j0 >= 0 else empty
    gt0 = adjoint_tangent[j0:j0 + n0] if j0 >= 0 else empty
    if op <= oc.UNARY_LAST:
        if j0 >= 0:
            p0, p1 = params(op, iattr, fattr, a)
            unary_second(op, x, y, g_out, t0, gt0, p0, p1)
        return
    if op == oc.PROD:
        if j0 >= 0:
            prod_second(x, g_out, t0, gt0, iattr[a], iattr[a + 1], iattr[a + 2])
        return
    if op == oc.INV:
        if j0 >= 0:
            inv_second(iattr, a, y, g_out, tangent[go:go + size], gt0)
        return
    if op > oc.BINARY_LAST and op != oc.MATMUL and op != oc.SOLVE:
        return
    n1 = slots[code[r, oc.IN1], oc.SIZE]
    j1 = code[r, oc.IN1_ADJ]
    t1 = tangent[j1:j1 + n1] if j1 >= 0 else empty
    gt1 = adjoint_tangent[j1:j1 + n1] if j1 >= 0 else empty
    w = arena[code[r, oc.IN1_OFF]:code[r, oc.IN1_OFF] + n1]
    if op <= oc.BINARY_LAST:
        if j0 >= 0 or j1 >= 0:
            binary_second(op, x, w, y, g_out, t0, t1, gt0, gt1, j0 >= 0, j1 >= 0)
    elif op == oc.MATMUL:
        if j0 >= 0 and j1 >= 0:
            matmul_second(iattr, a, g_out, t0, t1, gt0, gt1)
    elif j0 >= 0:
        solve_second(iattr, a, x, y, g_out, t0, tangent[go:go + size], gt0, gt1, j1 >= 0)


@njit(cache=True)
def second_order_sweep(code, slots, iattr, fattr, arena, adjoint, tangent, adjoint_tangent):
    """Accumulate the tangents of the cotangents, last instruction first.

    adjoint [adjoint_size, 1]: the cotangents of a finished reverse_sweep;
    tangent [adjoint_size, K]: from tangent_sweep; adjoint_tangent [adjoint_size, K]:
    zeros (or the target's seeded tangent). The sources' rows end up holding
    Hessian-times-direction columns.
    """
    g = adjoint.reshape(adjoint.size)
    for r in range(code.shape[0] - 1, -1, -1):
        reverse_instruction(code, r, slots, iattr, fattr, arena, adjoint_tangent)
        _second_order_terms(code, r, slots, iattr, fattr, arena, g, tangent, adjoint_tangent)
