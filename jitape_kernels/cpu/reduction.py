"""Compiled kernels of the reductions SUM, MAX, MIN, PROD and the running sum CUMSUM over the middle axis of an
[outer, n, inner] view: forward, reverse, and the tangent and second-order kernels of forward-over-reverse
Hessians."""
import numpy as np
from numba import njit

from .. import opcodes as oc
from .elementwise import _put


@njit(cache=True, error_model="numpy")
def reduce_forward(op, x, out, outer, n, inner):
    if op == oc.SUM:
        _sum_forward(x, out, outer, n, inner)
        return
    if (op == oc.MAX or op == oc.MIN) and inner == 1:
        for o in range(outer):
            out[o] = _extremum(x, o * n, n, op == oc.MAX)
        return
    for o in range(outer):
        for i in range(inner):
            base = o * n * inner + i
            if op == oc.PROD:
                acc = 1.0
                for a in range(n):
                    acc *= x[base + a * inner]
            else:
                largest = op == oc.MAX
                acc = -np.inf if largest else np.inf
                for a in range(n):
                    acc = _further(x[base + a * inner], acc, largest)
            out[o * inner + i] = acc


@njit(cache=True, error_model="numpy")
def _sum_forward(x, out, outer, n, inner):
    """Sums in the arena's dtype, in numpy's order, so a replayed sum equals numpy's bit for bit: pairwise
    along a contiguous axis, row after row (a vector loop) along an outer one."""
    for o in range(outer):
        base = o * n * inner
        if inner == 1:
            out[o] = pairwise_sum(x, base, n)
            continue
        row = out[o * inner:(o + 1) * inner]
        row[:] = 0
        for a in range(n):
            start = base + a * inner
            for i in range(inner):
                row[i] += x[start + i]


@njit(cache=True, error_model="numpy", inline="always")
def _further(value, best, largest):
    """value if it beats best (or is NaN: NaN propagates, and once best is NaN nothing beats it)."""
    return value if ((value > best if largest else value < best) or value != value) else best


@njit(cache=True, error_model="numpy")
def _extremum(x, start, n, largest):
    """The largest (smallest) of x[start:start + n], NaN if any is; eight independent running extrema."""
    best = -np.inf if largest else np.inf
    if n >= 8:
        b0, b1, b2, b3 = x[start], x[start + 1], x[start + 2], x[start + 3]
        b4, b5, b6, b7 = x[start + 4], x[start + 5], x[start + 6], x[start + 7]
        stop = start + n - n % 8
        for i in range(start + 8, stop, 8):
            b0 = _further(x[i], b0, largest)
            b1 = _further(x[i + 1], b1, largest)
            b2 = _further(x[i + 2], b2, largest)
            b3 = _further(x[i + 3], b3, largest)
            b4 = _further(x[i + 4], b4, largest)
            b5 = _further(x[i + 5], b5, largest)
            b6 = _further(x[i + 6], b6, largest)
            b7 = _further(x[i + 7], b7, largest)
        best = _further(b0, best, largest)
        for b in (b1, b2, b3, b4, b5, b6, b7):
            best = _further(b, best, largest)
        start, n = stop, n % 8
    for i in range(start, start + n):
        best = _further(x[i], best, largest)
    return best


@njit(cache=True, error_model="numpy")
def pairwise_sum(x, start, n):
    """x[start:start + n] summed as numpy sums a contiguous axis (pairwise halves down to blocks of at most
    128, eight running sums in a block; numpy/_core/src/umath/loops_utils.h.src). Recursive, and numba's
    cache of a recursive function's callers is fragile (numba issue 6061: calling it from a kernel of
    another module segfaulted once loaded from the cache), so only _sum_forward calls it; other kernels sum
    with lane_sum."""
    if n <= 128:
        return lane_sum(x, start, n)
    half = n // 2
    half -= half % 8
    return pairwise_sum(x, start, half) + pairwise_sum(x, start + half, n - half)


@njit(cache=True, error_model="numpy", inline="always")
def lane_sum(x, start, n):
    """x[start:start + n] in eight running sums (vectorised), added pairwise at the end: numpy's order for
    n <= 128 (a block of pairwise_sum)."""
    if n < 8:
        total = x.dtype.type(0)
        for i in range(start, start + n):
            total += x[i]
        return total
    r0, r1, r2, r3 = x[start], x[start + 1], x[start + 2], x[start + 3]
    r4, r5, r6, r7 = x[start + 4], x[start + 5], x[start + 6], x[start + 7]
    stop = start + n - n % 8
    for i in range(start + 8, stop, 8):
        r0 += x[i]
        r1 += x[i + 1]
        r2 += x[i + 2]
        r3 += x[i + 3]
        r4 += x[i + 4]
        r5 += x[i + 5]
        r6 += x[i + 6]
        r7 += x[i + 7]
    total = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    for i in range(stop, start + n):
        total += x[i]
    return total


@njit(cache=True, error_model="numpy")
def _partials(op, x, y, base, n, inner, d):
    """d[a] = d y / d x[base + a * inner] for one reduced entry y."""
    if op == oc.SUM:
        d[:] = 1.0
    elif op == oc.PROD:
        # product of all other entries, by suffix then prefix products: exact with zeros
        if n == 0:
            return
        d[n - 1] = 1.0
        for a in range(n - 2, -1, -1):
            d[a] = d[a + 1] * x[base + (a + 1) * inner]
        prefix = 1.0
        for a in range(n):
            d[a] *= prefix
            prefix *= x[base + a * inner]
    else:
        share = 1.0 / _ties(x, y, base, n, inner)
        for a in range(n):
            d[a] = share if x[base + a * inner] == y else 0.0


@njit(cache=True, error_model="numpy", inline="always")
def _ties(x, extremum, base, n, inner):
    """How many of the entries x[base + a * inner] equal their extremum (at least 1, so a NaN extremum, which
    nothing equals, divides by 1): TensorFlow splits a MAX/MIN cotangent evenly between tied extrema."""
    ties = 0
    if inner == 1:          # contiguous: a loop LLVM vectorises
        for e in range(base, base + n):
            ties += x[e] == extremum
    else:
        for a in range(n):
            ties += x[base + a * inner] == extremum
    return max(ties, 1)


@njit(cache=True, error_model="numpy")
def reduce_linear(op, x, y, out_rows, in_rows, outer, n, inner, transpose, assign=False):
    """The reduction's Jacobian over K columns: out += J in (tangents) or, transposed, in += J^T out
    (cotangents). assign (transposed): in's rows are first written here and hold no values yet."""
    K = out_rows.shape[1]
    if op == oc.SUM:
        _sum_linear(out_rows, in_rows, outer, n, inner, transpose, assign)
        return
    if op != oc.PROD and K == 1 and transpose:
        _extremum_transposed(x, y, out_rows.reshape(out_rows.size), in_rows.reshape(in_rows.size), outer, n,
                             inner, assign)
        return
    if assign:
        in_rows[:] = 0
    d = np.empty(n)
    for o in range(outer):
        for i in range(inner):
            base = o * n * inner + i
            r = o * inner + i
            _partials(op, x, y[r], base, n, inner, d)
            for a in range(n):
                e = base + a * inner
                for k in range(K):
                    if transpose:
                        in_rows[e, k] += out_rows[r, k] * d[a]
                    else:
                        out_rows[r, k] += d[a] * in_rows[e, k]


@njit(cache=True, error_model="numpy")
def _extremum_transposed(x, y, g_out, g_in, outer, n, inner, assign):
    """MAX/MIN cotangents, K = 1: each reduced entry's cotangent split evenly between its tied extrema (as
    TensorFlow), in two passes over its entries (count the ties, then write), with no partials array."""
    zero = g_out.dtype.type(0)
    for o in range(outer):
        for i in range(inner):
            base = o * n * inner + i
            r = o * inner + i
            extremum = y[r]
            share = g_out[r] / _ties(x, extremum, base, n, inner)
            if inner == 1:          # contiguous: a loop LLVM vectorises
                for e in range(base, base + n):
                    _put(g_in, e, share if x[e] == extremum else zero, assign)
            else:
                for a in range(n):
                    e = base + a * inner
                    _put(g_in, e, share if x[e] == extremum else zero, assign)


@njit(cache=True, error_model="numpy")
def _sum_linear(out_rows, in_rows, outer, n, inner, transpose, assign):
    """SUM's Jacobian is all ones: out += sum of in (tangents) or, transposed, in += out broadcast
    (cotangents), with no partials computed; K = 1 gets its own loops, so no column loop runs per entry."""
    K = out_rows.shape[1]
    if K == 1 and inner == 1:       # contiguous rows of one column: flat loops (vectorised), eight-lane sums
        out_flat = out_rows.reshape(out_rows.size)
        in_flat = in_rows.reshape(in_rows.size)
        for o in range(outer):
            if transpose:
                g = out_flat[o]
                for e in range(o * n, o * n + n):
                    _put(in_flat, e, g, assign)
            else:
                out_flat[o] += lane_sum(in_flat, o * n, n)
        return
    for o in range(outer):
        for i in range(inner):
            base = o * n * inner + i
            r = o * inner + i
            if K == 1 and transpose:
                g = out_rows[r, 0]
                for a in range(n):
                    _put(in_rows, (base + a * inner, 0), g, assign)
            elif K == 1:
                acc = out_rows[r, 0]
                for a in range(n):
                    acc += in_rows[base + a * inner, 0]
                out_rows[r, 0] = acc
            else:
                for a in range(n):
                    e = base + a * inner
                    for k in range(K):
                        if transpose:
                            _put(in_rows, (e, k), out_rows[r, k], assign)
                        else:
                            out_rows[r, k] += in_rows[e, k]


@njit(cache=True, error_model="numpy")
def prod_second(x, g_out, t_in, gt_in, outer, n, inner):
    """PROD's second-order term: gt_in[a] += g * d/dt (product of the entries other than a).

    The product excluding a is prefix[a] * suffix[a]; their tangents follow the
    same recurrences, so every entry costs O(K) and zeros stay exact.
    """
    K = t_in.shape[1]
    if n == 0:
        return
    suffix = np.empty(n)
    suffix_t = np.empty((n, K))
    prefix_t = np.empty(K)
    for o in range(outer):
        for i in range(inner):
            base = o * n * inner + i
            g = float(g_out[o * inner + i])
            if g == 0:
                continue
            suffix[n - 1] = 1.0
            suffix_t[n - 1] = 0.0
            for a in range(n - 2, -1, -1):
                e = base + (a + 1) * inner
                suffix[a] = suffix[a + 1] * x[e]
                for k in range(K):
                    suffix_t[a, k] = suffix_t[a + 1, k] * x[e] + suffix[a + 1] * t_in[e, k]
            prefix = 1.0
            prefix_t[:] = 0.0
            for a in range(n):
                e = base + a * inner
                for k in range(K):
                    gt_in[e, k] += g * (prefix_t[k] * suffix[a] + prefix * suffix_t[a, k])
                for k in range(K):
                    prefix_t[k] = prefix_t[k] * x[e] + prefix * t_in[e, k]
                prefix *= x[e]


@njit(cache=True, error_model="numpy")
def cumsum_forward(x, out, outer, n, inner, exclusive, reverse):
    """Running sums along the middle axis of an [outer, n, inner] view: from the last entry when reverse,
    each entry left out of its own sum when exclusive (the first sum is then 0)."""
    for o in range(outer):
        for step in range(n):
            e = (o * n + (n - 1 - step if reverse else step)) * inner
            if step == 0:
                for i in range(inner):
                    out[e + i] = 0.0 if exclusive else x[e + i]
                continue
            p = e + inner if reverse else e - inner       # the entry before e in running order
            for i in range(inner):
                out[e + i] = out[p + i] + (x[p + i] if exclusive else x[e + i])


@njit(cache=True, error_model="numpy")
def cumsum_linear(out_rows, in_rows, outer, n, inner, exclusive, reverse, transpose):
    """CUMSUM's map over K columns: out += C in (tangents) or, transposed, in += C^T out (cotangents);
    C^T is the running sum in the other direction with the same exclusivity."""
    K = out_rows.shape[1]
    src = out_rows if transpose else in_rows
    dst = in_rows if transpose else out_rows
    backward = reverse != transpose
    acc = np.empty((inner, K))
    for o in range(outer):
        acc[:] = 0.0
        for step in range(n):
            e = (o * n + (n - 1 - step if backward else step)) * inner
            for i in range(inner):
                for k in range(K):
                    v = src[e + i, k]
                    if exclusive:
                        dst[e + i, k] += acc[i, k]
                        acc[i, k] += v
                    else:
                        acc[i, k] += v
                        dst[e + i, k] += acc[i, k]
