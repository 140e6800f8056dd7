"""Batch rows: the row analysis of batch Jacobians, and the split sweep of per-example gradients.

Does any instruction let batch row b depend on another row?

Each slot that carries batch rows has a layout: its flat entry i belongs to
row (i // post) % B, where post is the size of everything after the batch
digit (post = size / B when the batch is the leading axis, as for sources and
targets). Layouts flow through the program: elementwise ops, reshapes and
casts keep them; a reduction, cumsum, concat or gather keeps them when its
reduced axis lies before or after the batch digit; a transpose, tile, slice or
pad when the batch axes are moved whole or left alone; a matmul when the batch
is in its batch block, in the rows of its left operand or in the columns of
its right one; solve and inv when it is in their batch block. The first
instruction whose output gets no layout mixes rows (a reduction over the
batch, a matmul contracting it, a slice picking rows ...) and is reported.
With B = 1 nothing can mix.
"""
import numpy as np

from .. import njit, opcodes as oc
from .interpreter import planned_temps, reverse_instruction, value_of
from .linalg import matmul_batch, matmul_reverse
from .shape import leading_broadcast_block
from .unowned import unowned
from .workspace import new_work

NO_ROWS = -1
FREE = -3       # a slot that depends on no entry of the batch (empty tensors): compatible with any layout


@njit(cache=True, error_model="numpy")
def _leading(slots, s):
    return slots[s, oc.DIMS] if slots[s, oc.RANK] > 0 else -1


@njit(cache=True, error_model="numpy")
def leading_layout(slots, s, batch):
    """The layout of a slot whose leading axis is the batch (NO_ROWS if its leading dim is not `batch`)."""
    if _leading(slots, s) != batch:
        return NO_ROWS
    return slots[s, oc.SIZE] // batch if batch > 0 else 0


@njit(cache=True, error_model="numpy")
def _blocked(post, batch, n_in, inner, n_out):
    """Layout after an op mapping an [outer, n_in, inner] view to [outer, n_out, inner] along its middle
    axis: kept when the batch digit lies in outer or inside inner, else NO_ROWS."""
    block = n_in * inner
    if block == 0:
        return NO_ROWS
    if post % block == 0:
        return post // n_in * n_out
    if inner % (batch * post) == 0:
        return post
    return NO_ROWS


@njit(cache=True, error_model="numpy")
def _batch_axes(iattr, dims_at, rank, post, batch):
    """(p, q): the axes p..q-1 (of the dims stored at iattr[dims_at:dims_at + rank]) that make up the
    batch digit of layout `post`, size-1 axes trimmed; (-1, -1) when the digit is not whole axes."""
    tail = 1
    q = rank
    while q > 0 and tail < post:
        q -= 1
        tail *= iattr[dims_at + q]
    block = 1
    p = q
    while p > 0 and block < batch:
        p -= 1
        block *= iattr[dims_at + p]
    if tail != post or block != batch:
        return -1, -1
    while q > p and iattr[dims_at + q - 1] == 1:
        q -= 1
    while p < q and iattr[dims_at + p] == 1:
        p += 1
    return p, q


@njit(cache=True, error_model="numpy")
def _suffix_size(iattr, dims_at, rank, q):
    size = 1
    for d in range(q, rank):
        size *= iattr[dims_at + d]
    return size


@njit(cache=True, error_model="numpy")
def _merge(out, post):
    """The output layout from one more input's layout: inputs without rows add nothing; two that disagree
    mix rows (-2)."""
    if post == NO_ROWS or out == -2:
        return out
    if out == NO_ROWS or out == post:
        return post
    return -2


@njit(cache=True, error_model="numpy")
def _interleaved_layout(batch, m, k, n, inner, p0, p1):
    """output_layout of a MATMUL whose items are interleaved with the rows ([outer, m, inner, k] @ [batch, k, n]):
    an example owns whole outer blocks of both operands, or (the left operand alone) rows of m, each with every
    item's entries; anything else mixes rows."""
    out = NO_ROWS
    if p0 != NO_ROWS:
        if m * inner * k > 0 and p0 % (m * inner * k) == 0:
            out = _merge(out, p0 // (m * inner * k) * (m * inner * n))
        elif inner * k > 0 and p0 % (inner * k) == 0 and (m * inner * k) % (batch * p0) == 0:
            out = _merge(out, p0 // (inner * k) * (inner * n))
        else:
            return NO_ROWS
    if p1 != NO_ROWS:
        if inner * k * n > 0 and p1 % (inner * k * n) == 0:
            out = _merge(out, p1 // (inner * k * n) * (m * inner * n))
        else:
            return NO_ROWS
    return NO_ROWS if out == -2 else out


@njit(cache=True, error_model="numpy")
def output_layout(code, r, slots, iattr, batch, p0, p1, p2):
    """The layout of instruction r's output given its inputs' layouts (NO_ROWS for an input without
    rows); NO_ROWS when the instruction mixes rows. At least one input has rows."""
    op = code[r, oc.OP]
    a = code[r, oc.ATTR]
    if batch == 1:
        return slots[code[r, oc.OUT], oc.SIZE]
    if op <= oc.BINARY_LAST or op == oc.WHERE:
        out = _merge(_merge(_merge(NO_ROWS, p0), p1), p2)
        return NO_ROWS if out == -2 else out
    if op <= oc.REDUCE_LAST:
        return _blocked(p0, batch, iattr[a + 1], iattr[a + 2], 1)
    if op == oc.CUMSUM:
        return _blocked(p0, batch, iattr[a + 1], iattr[a + 2], iattr[a + 1])
    if op == oc.PLACE:
        return _blocked(p0, batch, iattr[a + 1], iattr[a + 2], iattr[a + 3])
    if op == oc.GATHER:
        return _blocked(p0, batch, iattr[a + 1], iattr[a + 2], iattr[a + 3])
    if op == oc.TRANSPOSE:
        rank = iattr[a]
        p, q = _batch_axes(iattr, a + 1, rank, p0, batch)
        if p < 0:
            return NO_ROWS
        perm = a + 1 + rank
        j0 = 0
        while iattr[perm + j0] != p:
            j0 += 1
        if j0 + q - p > rank:
            return NO_ROWS
        for t in range(q - p):
            if iattr[perm + j0 + t] != p + t:
                return NO_ROWS
        out = 1
        for j in range(j0 + q - p, rank):
            out *= iattr[a + 1 + iattr[perm + j]]
        return out
    if op == oc.TILE or op == oc.SLICE or op == oc.PAD:
        rank = iattr[a]
        p, q = _batch_axes(iattr, a + 1, rank, p0, batch)
        if p < 0:
            return NO_ROWS
        for d in range(p, q):
            if iattr[a + 1 + d] != iattr[a + 1 + rank + d]:
                return NO_ROWS
            if op != oc.TILE and (iattr[a + 1 + 2 * rank + d] != 0 or iattr[a + 1 + 3 * rank + d] != 1):
                return NO_ROWS
        return _suffix_size(iattr, a + 1 + rank, rank, q)
    if op == oc.MATMUL:
        batch_a, batch_b, m, k, n = iattr[a], iattr[a + 1], iattr[a + 2], iattr[a + 3], iattr[a + 4]
        batch_out = matmul_batch(batch_a, batch_b)
        inner = iattr[a + 5]
        if inner > 1:
            return _interleaved_layout(batch, m, k, n, inner, p0, p1)
        out = NO_ROWS
        if p0 != NO_ROWS:
            if m * k > 0 and p0 % (m * k) == 0 and batch_a == batch_out:
                out = _merge(out, p0 // (m * k) * (m * n))       # the batch block
            elif k > 0 and p0 % k == 0 and (m * k) % (batch * p0) == 0:
                out = _merge(out, p0 // k * n)                   # the left operand's rows
            else:
                return NO_ROWS
        if p1 != NO_ROWS:
            if k * n > 0 and p1 % (k * n) == 0 and batch_b == batch_out:
                out = _merge(out, p1 // (k * n) * (m * n))
            elif n % (batch * p1) == 0:
                out = _merge(out, p1)                            # the right operand's columns
            else:
                return NO_ROWS
        return NO_ROWS if out == -2 else out
    if op == oc.SOLVE:
        n, m = iattr[a + 1], iattr[a + 2]
        out = NO_ROWS
        if p0 != NO_ROWS:
            if n == 0 or p0 % (n * n) != 0:
                return NO_ROWS
            out = p0 // (n * n) * (n * m)
        if p1 != NO_ROWS:
            if not (n * m > 0 and p1 % (n * m) == 0) and not (p0 == NO_ROWS and m % (batch * p1) == 0):
                return NO_ROWS
            out = _merge(out, p1)
        return NO_ROWS if out == -2 else out
    # INV: one matrix per batch entry
    n = iattr[a + 1]
    return p0 if n > 0 and p0 % (n * n) == 0 else NO_ROWS


@njit(cache=True, error_model="numpy")
def row_layouts(code, slots, iattr, batch, sources):
    """Propagate the sources' leading-batch layout through the active instructions: (index of the first
    instruction that mixes rows or -1, each slot's layout)."""
    post = np.full(slots.shape[0], NO_ROWS, np.int64)
    for s in sources:
        if s >= 0:
            post[s] = leading_layout(slots, s, batch)
    ins = np.empty(3, np.int64)       # per instruction: its inputs' layouts
    for r in range(code.shape[0]):
        ins[:] = NO_ROWS
        for c in range(3):
            s = code[r, oc.IN0 + c]
            if s >= 0 and code[r, oc.IN0_ADJ + c] >= 0 and slots[s, oc.SIZE] > 0 and post[s] != FREE:
                ins[c] = post[s]
                if ins[c] == NO_ROWS:
                    return r, post      # an active input without rows (a source whose leading dim is not B)
        o = code[r, oc.OUT]
        if (ins[0] == NO_ROWS and ins[1] == NO_ROWS and ins[2] == NO_ROWS) or slots[o, oc.SIZE] == 0:
            post[o] = FREE              # depends on no entry of the sources (empty tensors)
            continue
        out = output_layout(code, r, slots, iattr, batch, ins[0], ins[1], ins[2])
        if out == NO_ROWS or (post[o] != NO_ROWS and post[o] != out):
            return r, post
        post[o] = out
    return -1, post


@njit(cache=True, error_model="numpy")
def first_row_mixing(code, slots, iattr, batch, sources, target):
    """Index of the first instruction that makes a row of the target depend on another row of the
    sources: one that mixes rows, or the last one when the target's rows are not its leading axis; -1
    if none does."""
    if batch <= 1 or code.shape[0] == 0:
        return -1
    bad, post = row_layouts(code, slots, iattr, batch, sources)
    if bad >= 0:
        return bad
    if target >= 0 and post[target] >= 0 and post[target] != leading_layout(slots, target, batch):
        return code.shape[0] - 1
    return -1


ROW, PARAM, JUNCTION = 0, 1, 2


@njit(cache=True, error_model="numpy")
def _row_inputs(code, r, post, candidate, use_candidates, ins):
    """ins = instruction r's input layouts: slots with rows, and batch-shaped constants when use_candidates."""
    for c in range(3):
        s = code[r, oc.IN0 + c]
        ins[c] = post[s] if s >= 0 and post[s] >= 0 and (use_candidates or not candidate[s]) else NO_ROWS


@njit(cache=True, error_model="numpy")
def per_example_plan(code, slots, iattr, adjoint_rows, batch):
    """Split a Program for per-example gradients of shared parameters.

    Row slots depend on batch data (non-source leaves with leading dim `batch`)
    and keep one adjoint column: a row slot's entry belongs to the example its
    layout says (see row_layouts). Parameter slots depend on the sources only
    and get `batch` columns, one per example. Junctions, where rows meet
    parameters, write each example's contribution into its own column: a
    broadcast of a parameter over the batch (TILE) and a matmul whose second
    operand is a parameter (shared, or one matrix per matmul batch entry). A
    constant whose leading dim happens to be `batch` counts as batch data only
    where that keeps rows apart. Returns (first unsupported or row-mixing
    instruction or -1, code with class-local adjoint rows, modes, row-buffer
    size, parameter-buffer size, each slot's row in its buffer, each slot's
    layout (NO_ROWS for parameter slots)).
    """
    n_slots = slots.shape[0]
    produced = np.zeros(n_slots, np.bool_)
    for r in range(code.shape[0]):
        produced[code[r, oc.OUT]] = True
    post = np.full(n_slots, NO_ROWS, np.int64)
    candidate = np.zeros(n_slots, np.bool_)
    for s in range(n_slots):
        if not produced[s] and adjoint_rows[s] < 0 and slots[s, oc.OFFSET] >= 0:
            post[s] = leading_layout(slots, s, batch)
            candidate[s] = post[s] >= 0
    modes = np.zeros(code.shape[0], np.int64)
    ins = np.empty(3, np.int64)       # per instruction: its inputs' layouts
    for r in range(code.shape[0]):
        op = code[r, oc.OP]
        out = code[r, oc.OUT]
        param_in = False
        for c in range(3):
            s = code[r, oc.IN0 + c]
            if s >= 0 and code[r, oc.IN0_ADJ + c] >= 0 and post[s] < 0:
                param_in = True
        _row_inputs(code, r, post, candidate, True, ins)
        layout = NO_ROWS
        if ins[0] != NO_ROWS or ins[1] != NO_ROWS or ins[2] != NO_ROWS:
            layout = output_layout(code, r, slots, iattr, batch, ins[0], ins[1], ins[2])
            if layout == NO_ROWS:
                _row_inputs(code, r, post, candidate, False, ins)
                if ins[0] != NO_ROWS or ins[1] != NO_ROWS or ins[2] != NO_ROWS:
                    layout = output_layout(code, r, slots, iattr, batch, ins[0], ins[1], ins[2])
                    if layout == NO_ROWS:
                        return r, code, modes, 0, 0, adjoint_rows, post
        if layout == NO_ROWS:
            a = code[r, oc.ATTR]
            replicate = (op == oc.TILE and _leading(slots, out) == batch and iattr[a + 1] == 1
                         and leading_broadcast_block(op, iattr, a) > 0)
            if not replicate:
                modes[r] = PARAM
                continue
            post[out] = leading_layout(slots, out, batch)
            modes[r] = JUNCTION
            continue
        if post[out] >= 0 and post[out] != layout:
            return r, code, modes, 0, 0, adjoint_rows, post
        post[out] = layout
        if param_in:
            # a parameter as matmul's right operand is the only other junction supported
            if op != oc.MATMUL or iattr[code[r, oc.ATTR] + 5] > 1 or ins[0] == NO_ROWS or ins[1] != NO_ROWS \
                    or (code[r, oc.IN0_ADJ] >= 0 and post[code[r, oc.IN0]] < 0):
                return r, code, modes, 0, 0, adjoint_rows, post
            modes[r] = JUNCTION
        else:
            modes[r] = ROW
    local = np.full(n_slots, -1, np.int64)
    n_row = 0
    n_param = 0
    for s in range(n_slots):
        if adjoint_rows[s] >= 0:
            if post[s] >= 0:
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
    return -1, recoded, modes, n_row, n_param, local, post


@njit(cache=True, error_model="numpy")
def per_example_temps(code, modes, slots, iattr, batch):
    """The scratch entries per_example_sweep needs for a per_example_plan's code: its kernels' (planned_temps, at
    most `batch` columns) and a junction matmul's example-major copies of its operand and cotangent."""
    fixed, per_column = planned_temps(code, iattr)
    need = fixed + per_column * batch
    for r in range(code.shape[0]):
        if modes[r] == JUNCTION and code[r, oc.OP] == oc.MATMUL:
            need = max(need, slots[code[r, oc.IN0], oc.SIZE] + slots[code[r, oc.OUT], oc.SIZE])
    return need


@njit(cache=True, error_model="numpy")
def per_example_sweep(code, modes, post, slots, iattr, fattr, arena, row_adjoint, param_adjoint, homes, temps,
                      row_kernels):
    """Reverse sweep of a per_example_plan: row instructions on the one-column buffer, parameter
    instructions on the `batch`-column buffer, junctions splitting contributions by example. homes: values read
    where they live (see interpreter.reverse_instruction); temps: the kernels' scratch, at least
    per_example_temps' entries; row_kernels: the reverse row kernels of every row of `code` (row_kernels.
    reverse_kernels with every_row, for the adjoint buffers' type)."""
    code, modes, post, slots, iattr, fattr, arena, row_adjoint, param_adjoint, homes, temps = (
        unowned(code), unowned(modes), unowned(post), unowned(slots), unowned(iattr), unowned(fattr), unowned(arena),
        unowned(row_adjoint), unowned(param_adjoint), unowned(homes), unowned(temps))
    batch = param_adjoint.shape[1]
    work = new_work()
    for r in range(code.shape[0] - 1, -1, -1):
        if modes[r] == ROW:
            reverse_instruction(code, r, slots, iattr, fattr, arena, row_adjoint, work, temps, homes, row_kernels)
            continue
        if modes[r] == PARAM:
            reverse_instruction(code, r, slots, iattr, fattr, arena, param_adjoint, work, temps, homes, row_kernels)
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
        # MATMUL with a parameter on the right: dW[bw, :, :, b] = sum over example b's rows of x_q^T g_q
        batch_a, batch_b, m, k, n = iattr[a], iattr[a + 1], iattr[a + 2], iattr[a + 3], iattr[a + 4]
        i0 = code[r, oc.IN0_OFF]
        x = value_of(arena, homes, code[r, oc.IN0], i0, slots[code[r, oc.IN0], oc.SIZE])
        i1 = code[r, oc.IN1_OFF]
        w = value_of(arena, homes, code[r, oc.IN1], i1, slots[code[r, oc.IN1], oc.SIZE])
        g_out = row_adjoint[go:go + size]
        j0 = code[r, oc.IN0_ADJ]
        if j0 >= 0:
            matmul_reverse(iattr, a, x, w, g_out, row_adjoint[j0:j0 + x.size], g_out[0:0], True, False, temps)
        gw = code[r, oc.IN1_ADJ]
        x_post = post[code[r, oc.IN0]]
        n_rows = size // n if n > 0 else 0
        if batch_b == 1 and batch_a * m == n_rows and x_post * batch == x.size:
            # the batch leads x: example-major copies, so the innermost loop runs over examples
            rows_per_example = n_rows // batch
            xt = temps[:k * n_rows].reshape(k, n_rows)
            gt = temps[k * n_rows:(k + n) * n_rows].reshape(n, n_rows)
            rows_x, rows_g = x.reshape(n_rows, k), g_out.reshape(n_rows, n)
            for q in range(n_rows):     # entry by entry: an array assigned to a slice compiles numba's shape message
                for kk in range(k):
                    xt[kk, q] = rows_x[q, kk]
                for nn in range(n):
                    gt[nn, q] = rows_g[q, nn]
            for kk in range(k):
                for nn in range(n):
                    target = param_adjoint[gw + kk * n + nn]
                    if rows_per_example == 1:
                        for q in range(n_rows):
                            target[q] += xt[kk, q] * gt[nn, q]
                    else:
                        for q in range(n_rows):
                            target[q // rows_per_example] += xt[kk, q] * gt[nn, q]
            continue
        for q in range(n_rows):
            bi = q // m
            qx = (bi if batch_a > 1 else 0) * m + q % m
            example = (qx * k // x_post) % batch if x_post > 0 else 0
            wblock = gw + (bi if batch_b > 1 else 0) * k * n
            for kk in range(k):
                xv = x[qx * k + kk]
                for nn in range(n):
                    param_adjoint[wblock + kk * n + nn, example] += xv * g_out[q * n + nn, 0]
