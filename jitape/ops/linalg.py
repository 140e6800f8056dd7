"""Linear algebra: matmul (batched, broadcast), solve and inv as primitives; einsum, tensordot, norm and
clip_by_norm composed from transpose, reshape, reduce and matmul."""
import math
import string

import numpy as np

from jitape_kernels import opcodes as oc

from ..recycling import LARGE_BYTES, fresh
from . import elementwise as _ew
from . import reduction as _red
from . import shape as _shape
from .core import Primitive, as_tensor, broadcast_shapes, composite, float_tensor, promote, record


# -- matmul ----------------------------------------------------------------------------------
def _matmul_np(a, b, batch_a, batch_b, m, k, n, inner, out_shape):
    batch = max(batch_a, batch_b) if batch_a and batch_b else 0
    large = a.dtype == b.dtype and batch * m * n * a.itemsize >= LARGE_BYTES
    out = fresh(out_shape, a.dtype) if large else None        # the result's own array (recycling.fresh)
    if inner > 1:
        # items interleaved with the rows: numpy multiplies the strided views with one gemm per item
        out = np.empty(out_shape, np.result_type(a, b)) if out is None else out
        outer = batch // inner
        np.matmul(a.reshape(outer, m, inner, k).transpose(0, 2, 1, 3), b.reshape(outer, inner, k, n),
                  out=out.reshape(outer, m, inner, n).transpose(0, 2, 1, 3))
        return out
    if batch_a == 1 and batch_b == 1:
        product = np.dot(a.reshape(m, k), b.reshape(k, n), None if out is None else out.reshape(m, n))
    else:
        product = np.matmul(a.reshape(batch_a, m, k), b.reshape(batch_b, k, n),
                            out=None if out is None else out.reshape(batch, m, n))
    return out if large else product.reshape(out_shape)[()]


def _matmul_shape(sa, sb, batch_a, batch_b, m, k, n, inner, out_shape):
    if math.prod(sa) != batch_a * m * k or math.prod(sb) != batch_b * k * n:
        raise ValueError(f"matmul: shapes {sa} and {sb} do not match {(batch_a, m, k)} @ {(batch_b, k, n)}")
    return out_shape


def _matmul_vjp(g, out, ins, p, w):
    batch_a, batch_b, m, k, n, inner, _ = p
    if inner > 1:
        return _interleaved_matmul_vjp(g, ins, batch_a // inner, m, k, n, inner, w)
    if batch_a == 1 and batch_b == 1:
        # plain matrices: two products with one transpose each, no batch axis to add and sum away
        g2 = _shape.reshape(g, (m, n))
        ga = _shape.reshape(matmul(g2, _shape.transpose(_shape.reshape(ins[1], (k, n)))), ins[0].shape) \
            if w[0] else None
        gb = _shape.reshape(matmul(_shape.transpose(_shape.reshape(ins[0], (m, k))), g2), ins[1].shape) \
            if w[1] else None
        return ga, gb
    batch = max(batch_a, batch_b) if batch_a and batch_b else 0      # a batch of one broadcasts, none does not
    g3 = _shape.reshape(g, (batch, m, n))
    ga = gb = None
    if w[0]:
        ga = matmul(g3, _shape.transpose(_shape.reshape(ins[1], (batch_b, k, n)), (0, 2, 1)))
        if batch_a == 1:
            ga = _red.reduce_sum(ga, 0)
        ga = _shape.reshape(ga, ins[0].shape)
    if w[1]:
        gb = matmul(_shape.transpose(_shape.reshape(ins[0], (batch_a, m, k)), (0, 2, 1)), g3)
        if batch_b == 1:
            gb = _red.reduce_sum(gb, 0)
        gb = _shape.reshape(gb, ins[1].shape)
    return ga, gb


def _interleaved_matmul_vjp(g, ins, outer, m, k, n, inner, w):
    """dA_b = G_b W_b^T, stored as A (interleaved again); dW_b = A_b^T G_b, each item's rows gathered first."""
    batch = outer * inner
    ga = gb = None
    if w[0]:
        ga = interleaved_matmul(g, _shape.transpose(_shape.reshape(ins[1], (batch, k, n)), (0, 2, 1)), m, inner, n, k,
                                ins[0].shape)
    if w[1]:
        a_t = _shape.transpose(_shape.reshape(ins[0], (outer, m, inner, k)), (0, 2, 3, 1))      # [outer, inner, k, m]
        g_t = _shape.transpose(_shape.reshape(g, (outer, m, inner, n)), (0, 2, 1, 3))          # [outer, inner, m, n]
        gb = _shape.reshape(matmul(_shape.reshape(a_t, (batch, k, m)), _shape.reshape(g_t, (batch, m, n))),
                            ins[1].shape)
    return ga, gb


_matmul = Primitive("matmul", oc.MATMUL, _matmul_np, lambda shapes, p: _matmul_shape(*shapes, *p), _matmul_vjp)


def interleaved_matmul(a, b, m, inner, k, n, out_shape):
    """a[o, :, i, :] @ b[o * inner + i] for a stored [outer, m, inner, k] and b [outer * inner, k, n] (any shapes
    of those sizes), as out_shape ([outer, m, inner, n] entries): one MATMUL that reads and writes the items where
    they lie (numpy and BLAS take rows ld entries apart), where a batched matmul would first move each item's rows
    together and its result's back. m, inner, k and n are at least 2, where numpy's matmul multiplies these views
    with gemm (below, gemv or its own loops), so the replay's gemm gives numpy's bits (einsum's _contract keeps
    the transposes otherwise, and the VJP's products have the same sizes)."""
    a, b = promote(a, b)
    outer = a.size // (m * inner * k)
    params = (outer * inner, outer * inner, m, k, n, inner, out_shape)
    return record(_matmul, a, b, _matmul_np(a._value, b._value, *params), params, params[:6])


def matmul(a, b, transpose_a=False, transpose_b=False, name=None):
    """Matrix product with numpy's rules: 1-D operands, broadcast batch dimensions."""
    a, b = promote(a, b)
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError(f"matmul: operands must have rank >= 1, got shapes {a.shape} and {b.shape}")
    if transpose_a:
        a = _shape.transpose(a, tuple(range(a.ndim - 2)) + (a.ndim - 1, a.ndim - 2))
    if transpose_b:
        b = _shape.transpose(b, tuple(range(b.ndim - 2)) + (b.ndim - 1, b.ndim - 2))
    sa = (1,) + a.shape if a.ndim == 1 else a.shape
    sb = b.shape + (1,) if b.ndim == 1 else b.shape
    if sa[-1] != sb[-2]:
        raise ValueError(f"matmul: inner dimensions differ: shapes {a.shape} and {b.shape}")
    try:
        batch_shape = broadcast_shapes(sa[:-2], sb[:-2], "matmul") if len(sa) > 2 or len(sb) > 2 else ()
    except ValueError:
        raise ValueError(f"matmul: batch dimensions of shapes {a.shape} and {b.shape} do not broadcast") from None
    m, k, n = sa[-2], sa[-1], sb[-1]
    batch_a, batch_b = math.prod(sa[:-2]), math.prod(sb[:-2])
    # the kernel broadcasts a batch of one; other partial broadcasts are made explicit
    if batch_a != 1 and sa[:-2] != batch_shape:
        a = _shape.broadcast_to(_shape.reshape(a, sa), batch_shape + sa[-2:])
        batch_a = math.prod(batch_shape)
    if batch_b != 1 and sb[:-2] != batch_shape:
        b = _shape.broadcast_to(_shape.reshape(b, sb), batch_shape + sb[-2:])
        batch_b = math.prod(batch_shape)
    out_shape = batch_shape + ((m,) if a.ndim > 1 else ()) + ((n,) if b.ndim > 1 else ())
    params = (batch_a, batch_b, m, k, n, 1, out_shape)
    return record(_matmul, a, b, _matmul_np(a._value, b._value, *params), params, params[:6])


# -- solve / inv -----------------------------------------------------------------------------
def _square_batch(shape, what):
    if len(shape) < 2 or shape[-1] != shape[-2]:
        raise ValueError(f"{what}: expected square matrices (..., n, n), got shape {shape}")
    return math.prod(shape[:-2]), shape[-1]


def _solve_np(a, b, batch, n, m):
    x = np.linalg.solve(np.reshape(a, (batch, n, n)), np.reshape(b, (batch, n, m)))
    return x.reshape(np.shape(b))


def _solve_vjp(g, out, ins, p, w):
    a = ins[0]
    perm = tuple(range(a.ndim - 2)) + (a.ndim - 1, a.ndim - 2)
    gb = solve(_shape.transpose(a, perm), g)
    ga = _ew.negative(matmul(gb, _shape.transpose(out, perm))) if w[0] else None
    return ga, gb if w[1] else None


_solve = Primitive("solve", oc.SOLVE, _solve_np, lambda shapes, p: shapes[1], _solve_vjp)


def solve(matrix, rhs, adjoint=False, name=None):
    """X with matrix @ X = rhs, for batches of square matrices (..., n, n) and rhs (..., n, m)."""
    a, b = promote(matrix, rhs)
    batch, n = _square_batch(a.shape, "linalg.solve")
    if adjoint:
        a = _shape.transpose(a, tuple(range(a.ndim - 2)) + (a.ndim - 1, a.ndim - 2))
    if b.ndim != a.ndim or b.shape[:-1] != a.shape[:-1]:
        raise ValueError(f"linalg.solve: rhs shape {b.shape} does not match matrix shape {a.shape} "
                         f"(expected {a.shape[:-1] + ('m',)})")
    m = b.shape[-1]
    try:
        value = _solve_np(a._value, b._value, batch, n, m)
    except np.linalg.LinAlgError as e:
        raise ValueError(f"linalg.solve: the matrix is singular ({e})") from None
    return record(_solve, a, b, value, (batch, n, m), (batch, n, m))


def _inv_np(a, batch, n):
    return np.linalg.inv(np.reshape(a, (batch, n, n))).reshape(np.shape(a))


def _inv_vjp(g, out, ins, p, w):
    perm = tuple(range(out.ndim - 2)) + (out.ndim - 1, out.ndim - 2)
    yt = _shape.transpose(out, perm)
    return (_ew.negative(matmul(matmul(yt, g), yt)),)


_inv = Primitive("inv", oc.INV, _inv_np, lambda shapes, p: shapes[0], _inv_vjp)


def inv(input, adjoint=False, name=None):
    """The inverse of each square matrix in a batch (..., n, n)."""
    a = float_tensor(input, "linalg.inv")
    batch, n = _square_batch(a.shape, "linalg.inv")
    if adjoint:
        a = _shape.transpose(a, tuple(range(a.ndim - 2)) + (a.ndim - 1, a.ndim - 2))
    try:
        value = _inv_np(a._value, batch, n)
    except np.linalg.LinAlgError as e:
        raise ValueError(f"linalg.inv: the matrix is singular ({e})") from None
    return record(_inv, a, None, value, (batch, n), (batch, n))


# -- einsum / tensordot ----------------------------------------------------------------------
@composite
def tensordot(a, b, axes):
    """Sum over the given axes of a and b (an int N means a's last N with b's first N)."""
    a, b = promote(a, b)
    if isinstance(axes, (int, np.integer)):
        if axes < 0 or axes > min(a.ndim, b.ndim):
            raise ValueError(f"tensordot: axes={axes} is invalid for shapes {a.shape} and {b.shape}")
        axes_a, axes_b = list(range(a.ndim - axes, a.ndim)), list(range(axes))
    else:
        axes_a, axes_b = ([int(i) for i in np.atleast_1d(ax)] for ax in axes)
        axes_a = [i % a.ndim for i in axes_a]
        axes_b = [i % b.ndim for i in axes_b]
    if [a.shape[i] for i in axes_a] != [b.shape[i] for i in axes_b]:
        raise ValueError(f"tensordot: contracted dimensions differ: shapes {a.shape} axes {axes_a} and "
                         f"{b.shape} axes {axes_b}")
    free_a = [i for i in range(a.ndim) if i not in axes_a]
    free_b = [i for i in range(b.ndim) if i not in axes_b]
    k = math.prod(a.shape[i] for i in axes_a)
    # explicit sizes, not -1: with k = 0 a -1 would be ambiguous
    a2 = _shape.reshape(_shape.transpose(a, free_a + axes_a), (math.prod(a.shape[i] for i in free_a), k))
    b2 = _shape.reshape(_shape.transpose(b, axes_b + free_b), (k, math.prod(b.shape[i] for i in free_b)))
    return _shape.reshape(matmul(a2, b2), tuple(a.shape[i] for i in free_a) + tuple(b.shape[i] for i in free_b))


def _parse_einsum(equation, shapes):
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(shapes):
        raise ValueError(f"einsum: equation {equation!r} has {len(terms)} operand(s), got {len(shapes)}")
    spare = [c for c in string.ascii_letters if c not in eq]
    ell_rank = max((len(s) - len(t.replace("...", "")) for t, s in zip(terms, shapes) if "..." in t), default=0)
    ell = "".join(spare[:ell_rank])
    subs = []
    for t, s in zip(terms, shapes):
        if "..." in t:
            k = len(s) - len(t.replace("...", ""))
            t = t.replace("...", ell[ell_rank - k:])
        if len(t) != len(s) or t and not t.isalpha():     # "" is a 0-d operand's subscripts
            raise ValueError(f"einsum: subscripts {t!r} do not match operand shape {s}")
        subs.append(t)
    if arrow:
        out = rhs.replace("...", ell)
    else:
        counts = {c: "".join(subs).count(c) for c in "".join(subs)}
        out = ell + "".join(sorted(c for c in counts if counts[c] == 1 and c not in ell))
    return subs, out


def _diagonal(x, subs):
    """Collapse repeated subscripts of one operand to their diagonal."""
    while len(set(subs)) < len(subs):
        c = next(c for c in subs if subs.count(c) > 1)
        i, j = subs.index(c), subs.index(c, subs.index(c) + 1)
        rest = [d for d in range(x.ndim) if d not in (i, j)]
        n = x.shape[i]
        x = _shape.transpose(x, rest + [i, j])
        x = _shape.reshape(x, x.shape[:-2] + (n * n,))
        x = _shape.gather(x, np.arange(n) * (n + 1), axis=x.ndim - 1)
        subs = "".join(subs[d] for d in rest) + c
    return x, subs


def _sum_out(x, subs, keep):
    axes = tuple(i for i, c in enumerate(subs) if c not in keep)
    if axes:
        x = _red.reduce_sum(x, axes)
        subs = "".join(c for c in subs if c in keep)
    return x, subs


def _contract(a, sa, b, sb, keep, out):
    """a (subscripts sa) contracted with b over the subscripts they share that `keep` lacks: one batched matmul
    between transposes, in the arrangement that moves fewest entries (`out`: the result's final order, for the
    last contraction): either operand on the left, and the batch either leading or inside the left operand's
    rows (interleaved_matmul: no transpose where the batch axes already lie between its rows and its sums)."""
    a, sa = _sum_out(a, sa, keep + sb)
    b, sb = _sum_out(b, sb, keep + sa)
    batch = [c for c in sa if c in sb and c in keep]
    summed = [c for c in sa if c in sb and c not in keep]
    size = {}
    for x, s in ((a, sa), (b, sb)):
        for c, d in zip(s, x.shape):
            size[c] = d if size.get(c, 1) == 1 else size[c]      # a size-1 dim broadcasts, a 0 does not
    nb, k = (math.prod(size[c] for c in group) for group in (batch, summed))
    arrangements = []
    for left, sl, right, sr in ((a, sa, b, sb), (b, sb, a, sa)):
        free_l = [c for c in sl if c not in sr]
        free_r = [c for c in sr if c not in sl]
        m, n = (math.prod(size[c] for c in group) for group in (free_l, free_r))
        interleave = (False, True) if nb > 1 and min(m, k, n) > 1 else (False,)
        for inside in interleave:
            order_l = free_l + batch + summed if inside else batch + free_l + summed
            result = free_l + batch + free_r if inside else batch + free_l + free_r
            moved = _transposes_moved(((sl, order_l, left.size), (sr, batch + summed + free_r, right.size)),
                                      result, out, size)
            arrangements.append((moved, inside, left, sl, order_l, right, sr, free_r, result, m, n))
    _, inside, left, sl, order_l, right, sr, free_r, result, m, n = min(arrangements, key=lambda x: x[0])
    left = _shape.broadcast_to(_shape.transpose(left, [sl.index(c) for c in order_l]),
                               tuple(size[c] for c in order_l))
    right = _shape.broadcast_to(_shape.transpose(right, [sr.index(c) for c in batch + summed + free_r]),
                                tuple(size[c] for c in batch + summed + free_r))
    if inside:      # the operands as they are: a reshape would record a copy
        return interleaved_matmul(left, right, m, nb, k, n, tuple(size[c] for c in result)), "".join(result)
    nbs = tuple(size[c] for c in batch)
    y = matmul(_shape.reshape(left, nbs + (m, k)), _shape.reshape(right, nbs + (k, n)))
    return _shape.reshape(y, tuple(size[c] for c in result)), "".join(result)


def _transposes_moved(moves, result, out, size):
    """What an arrangement's transposes cost, in entries moved: moves holds each operand's (subscripts, order
    the matmul reads, entries); a permutation that keeps the last axis moves rows (one unit per entry), one
    that moves it gathers entry by entry (four units); the identity is free. The result's transpose into `out`
    counts when out names it."""
    moves = [(list(before), after, entries) for before, after, entries in moves]
    if sorted(out) == sorted(result):
        moves.append((result, list(out), math.prod(size[c] for c in result)))
    return sum(entries if before[-1] == after[-1] else 4 * entries
               for before, after, entries in moves if before != after)


@composite
def einsum(equation, *inputs, **kwargs):
    """Einstein summation over any number of operands (pairwise transpose/reshape/matmul contractions)."""
    tensors = [float_tensor(t, "einsum") for t in inputs]
    subs, out = _parse_einsum(equation, [t.shape for t in tensors])
    operands = [_diagonal(t, s) for t, s in zip(tensors, subs)]
    x, sx = operands[0]
    for i, (y, sy) in enumerate(operands[1:], start=1):
        later = out + "".join(s for _, s in operands[i + 1:])
        x, sx = _contract(x, sx, y, sy, later, out)
    x, sx = _sum_out(x, sx, out)
    if sorted(sx) != sorted(out):
        raise ValueError(f"einsum: output subscripts {out!r} are not all in the inputs of {equation!r}")
    return _shape.transpose(x, [sx.index(c) for c in out])


# -- norms -----------------------------------------------------------------------------------
@composite
def norm(tensor, ord="euclidean", axis=None, keepdims=None, name=None):
    """Vector norms (ord euclidean/2, 1, inf, p > 0) and matrix norms (fro/euclidean, 1, inf) over `axis`."""
    x = float_tensor(tensor, "norm")
    keepdims = bool(keepdims)
    matrix = axis is not None and np.ndim(axis) == 1 and len(axis) == 2
    if axis is None:
        x, axis = _shape.reshape(x, (-1,)), 0
        if keepdims:
            raise ValueError("norm: keepdims needs an explicit axis")
    if ord in ("euclidean", "fro") or (ord == 2 and not matrix):
        return _ew.sqrt(_red.reduce_sum(_ew.square(x), axis, keepdims))
    if matrix and ord in (1, np.inf):
        rows, cols = (a % x.ndim for a in axis)
        inner, outer = (rows, cols) if ord == 1 else (cols, rows)
        sums = _red.reduce_sum(_ew.abs(x), inner, keepdims=True)
        return _red.reduce_max(sums, (rows, cols), keepdims)
    if matrix:
        raise ValueError(f"norm: matrix ord must be 'fro', 'euclidean', 1 or inf, got {ord!r}")
    if ord == np.inf:
        return _red.reduce_max(_ew.abs(x), axis, keepdims)
    if ord == 1:
        return _red.reduce_sum(_ew.abs(x), axis, keepdims)
    if isinstance(ord, (int, float)) and ord > 0:
        return _ew.pow(_red.reduce_sum(_ew.pow(_ew.abs(x), float(ord)), axis, keepdims), 1.0 / ord)
    raise ValueError(f"norm: ord must be 'euclidean', 'fro', inf or a number > 0, got {ord!r}")


@composite
def clip_by_norm(t, clip_norm, axes=None, name=None):
    """t scaled so its L2 norm over `axes` is at most clip_norm (TensorFlow's formula and gradient)."""
    t = float_tensor(t, "clip_by_norm")
    l2sum = _red.reduce_sum(_ew.square(t), axes, keepdims=True)
    positive = _ew.greater(l2sum, 0.0)      # recorded: a replay recomputes the branch
    l2norm = _ew.where(positive, _ew.sqrt(_ew.where(positive, l2sum, 1.0)), l2sum)
    clip = as_tensor(clip_norm, t)
    return _ew.divide(t * clip, _ew.maximum(l2norm, clip))
