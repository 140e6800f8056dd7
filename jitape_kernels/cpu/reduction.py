"""Compiled kernels of the reductions SUM, MAX, MIN, PROD, LOGSUMEXP and the running sum CUMSUM over the middle
axis of an [outer, n, inner] view: forward, reverse, and the tangent and second-order kernels of
forward-over-reverse Hessians."""
import math

import numpy as np
from numba import types
from numba.extending import intrinsic

from .. import njit, opcodes as oc
from .elementwise import _put
from .vectormath import exp_value
from .workspace import LANES, frames, lanes


@njit(cache=True, error_model="numpy")
def reduce_forward(op, x, out, outer, n, inner, work, temps):
    # arrays reshaped to [outer, n, inner] and indexed from loop counters, never from computed offsets: numba
    # wraps negative indices, and an offset LLVM cannot prove non-negative keeps a loop from vectorising
    if op == oc.SUM:
        sum_forward(x, out, outer, n, inner, work)
    elif op == oc.PROD:
        _prod_across_rows(x.reshape(outer, n, inner), out.reshape(outer, inner))
    elif op == oc.LOGSUMEXP:
        logsumexp_forward(x, out, outer, n, inner, work, temps, temps[:0])
    elif inner == 1:
        _extrema_of_rows(x.reshape(outer, n), out, op == oc.MAX)
    else:
        _extrema_across_rows(x.reshape(outer, n, inner), out.reshape(outer, inner), op == oc.MAX)


SHORT_ROWS = 32


@njit(cache=True, error_model="numpy")
def sum_forward(x, out, outer, n, inner, work):
    """Sums in the arena's dtype, in numpy's order, so a replayed sum equals numpy's bit for bit: pairwise
    along a contiguous axis (over the workspace's frames and lanes), row after row (a vector loop) along an outer
    one."""
    if inner == 1:
        if n <= SHORT_ROWS:
            short_row_sums(x.reshape(outer, n), out)
            return
        pending, lefts = frames(work), lanes(work).view(x.dtype)
        for o in range(outer):
            out[o] = pairwise_sum(x, o * n, n, pending, lefts)
        return
    x3 = x.reshape(outer, n, inner)
    out2 = out.reshape(outer, inner)
    for o in range(outer):
        for i in range(inner):
            out2[o, i] = 0
        for a in range(n):
            for i in range(inner):
                out2[o, i] += x3[o, a, i]


@njit(cache=True, error_model="numpy")
def short_row_sums(x2, out):
    """out[o] = the sum of row o of x2 in numpy's order (row_sum), for rows of at most SHORT_ROWS entries: one loop
    over the rows, no call per row, 5x faster than numpy's pairwise sum called row by row on rows of 10 (W8's),
    slower past 40. Eager sums of such rows (jitape.ops.reduction) run it too, so a replay equals them bit for
    bit."""
    if out.shape[0] != x2.shape[0]:
        raise ValueError("short_row_sums: one output entry per row")
    for o in range(x2.shape[0]):
        out[o] = row_sum(x2, o)


@njit(cache=True, error_model="numpy")
def _prod_across_rows(x3, out2):
    outer, n, inner = x3.shape
    for o in range(outer):
        for i in range(inner):
            out2[o, i] = 1
        for a in range(n):
            for i in range(inner):
                out2[o, i] *= x3[o, a, i]


# inlined by LLVM (forceinline), not by numba, whose inlining runs its passes again at each call site (compile time)
@njit(cache=True, error_model="numpy", forceinline=True)
def _further(value, best, largest):
    """value if it beats best (or is NaN: NaN propagates, and once best is NaN nothing beats it)."""
    return value if ((value > best if largest else value < best) or value != value) else best


@intrinsic
def _beyond(typingctx, value, best, largest):
    """value if it beats best, else best, as a compare and a select that promise LLVM no NaN and no signed zero
    (its flags nnan and nsz): a loop of them then vectorises as a max (min) reduction in vector registers, which
    LLVM does not make of _further's NaN test or of running values in memory (_row_extremum). A NaN value makes
    the result poison, which the caller must not return (it notes NaNs apart)."""
    if not isinstance(value, types.Float) or value != best or not isinstance(largest, types.Boolean):
        return None

    def codegen(context, builder, signature, args):
        value, best, largest = args
        flags = ("nnan", "nsz")
        beats = builder.select(largest, builder.fcmp_ordered(">", value, best, flags=flags),
                               builder.fcmp_ordered("<", value, best, flags=flags))
        return builder.select(beats, value, best, flags=flags)
    return value(value, best, largest), codegen


@njit(cache=True, error_model="numpy")
def _extrema_of_rows(x2, out, largest):
    """out[o] = the largest (smallest) of row o, NaN if any entry is. `largest` is a constant in each loop, so
    LLVM sees one compare in _row_extremum's."""
    if largest:
        for o in range(x2.shape[0]):
            out[o] = _row_extremum(x2, o, True)
    else:
        for o in range(x2.shape[0]):
            out[o] = _row_extremum(x2, o, False)


@njit(cache=True, error_model="numpy", forceinline=True)
def _row_extremum(x2, o, largest):
    """The largest (smallest) entry of row o, NaN if any entry is: one loop that LLVM runs as a vector max (min)
    reduction (_beyond) beside an OR of the entries' NaN tests. Which of two tied zeros it gives is not defined
    (as numpy's, which depends on their order). A 640,000-entry row: 0.058 ms, numpy's 0.060; 10,000 rows of 100:
    0.13 ms, numpy's 0.58 (running values in memory, masked stores that stalled the next loads: 0.07-0.13 and
    0.32 ms)."""
    best = x2.dtype.type(-np.inf if largest else np.inf)
    nan = False
    for a in range(x2.shape[1]):
        value = x2[o, a]
        best = _beyond(value, best, largest)
        nan |= value != value
    return x2.dtype.type(np.nan) if nan else best


@njit(cache=True, error_model="numpy")
def _extrema_across_rows(x3, out2, largest):
    """out2[o, i] = the largest (smallest) of x3[o, :, i], row after row (a vector loop over i)."""
    if largest:     # a constant in each loop (see _extrema_of_rows)
        _extrema_along(x3, out2, True, -np.inf)
    else:
        _extrema_along(x3, out2, False, np.inf)


@njit(cache=True, error_model="numpy", inline="always")
def _extrema_along(x3, out2, largest, init):
    """_extrema_across_rows for one value of `largest`."""
    outer, n, inner = x3.shape
    for o in range(outer):
        for i in range(inner):
            out2[o, i] = init
        for a in range(n):
            for i in range(inner):
                out2[o, i] = _further(x3[o, a, i], out2[o, i], largest)


@njit(cache=True, error_model="numpy", inline="always")
def _shift(peak):
    """logsumexp's shift: the largest entry where it is finite, else 0 (an inf or NaN largest entry, or an empty
    axis's -inf, then gives inf, NaN or log(0) = -inf unshifted, as numpy's)."""
    return peak if peak - peak == 0 else 0.0


@njit(cache=True, error_model="numpy", inline="always", fastmath={"contract"})
def _row_exp_sum(x2, o, shift, running, exps):
    """The sum of exp(x2[o, a] - shift) along row o: its first multiple of LANES entries in LANES float64 running
    sums (one vector loop that reads the row once), then the rest in order. Each exponential is left in exps[a] (a
    replay's stash, or scratch: written always, as a run-time choice inside the loop keeps it from vectorising;
    the writes cost ~3%)."""
    n = x2.shape[1]
    stop = n - n % LANES
    total = 0.0
    if stop:        # (a row shorter than LANES is all tail: its lanes' zeros and their fold cost more than it)
        for j in range(LANES):
            running[j] = 0
        for b in range(0, stop, LANES):
            for j in range(LANES):
                value = exp_value(x2[o, b + j] - shift)
                exps[b + j] = value
                running[j] += value
        for j in range(LANES):
            total += running[j]
    # the tail's exponentials in a vector loop of their own, then their sum in order (W8's rows of 25 took 5.1 ns
    # an entry with the sum in the same loop)
    for a in range(stop, n):
        exps[a] = exp_value(x2[o, a] - shift)
    for a in range(stop, n):
        total += exps[a]
    return total


@njit(cache=True, error_model="numpy", fastmath={"contract"})
def logsumexp_forward(x, out, outer, n, inner, work, temps, stash):
    """out[o, i] = log(sum over a of exp(x[o, a, i] - s)) + s over [outer, n, inner] views, s the _shift of the
    largest x[o, :, i]: along a contiguous axis two passes over each row in running lanes (its maximum, then its
    exponentials' sum, each exponential left in temps[:n]); across rows each column's sum runs in temps[:inner]
    (vector loops over inner).

    stash (empty: none): x.size + out.size entries where the exponentials exp(x - s) and then the reciprocals of
    their sums are left for the reverse (logsumexp_from_stash), so a replay's gradient takes no second pass of
    exponentials."""
    x3, out2 = x.reshape(outer, n, inner), out.reshape(outer, inner)
    kept = stash.size != 0
    # without a stash, x and out stand in for its parts (so the views below exist); nothing writes them then
    exps = (stash[:x.size] if kept else x).reshape(outer, n, inner)
    inverse = (stash[x.size:x.size + out.size] if kept else out).reshape(outer, inner)
    if inner == 1:
        x2, e2 = x3.reshape(outer, n), exps.reshape(outer, n)
        sums = lanes(work).view(np.float64)
        for o in range(outer):
            shift = _shift(_row_extremum(x2, o, True))
            total = _row_exp_sum(x2, o, shift, sums, e2[o] if kept else temps[:n])
            if kept:
                inverse[o, 0] = 1.0 / total
            out2[o, 0] = math.log(total) + shift
        return
    sums = temps[:inner]
    for o in range(outer):
        for i in range(inner):
            out2[o, i] = -np.inf
        for a in range(n):
            for i in range(inner):
                out2[o, i] = _further(x3[o, a, i], out2[o, i], True)
        for i in range(inner):
            out2[o, i] = _shift(out2[o, i])
            sums[i] = 0
        if kept:
            for a in range(n):
                for i in range(inner):
                    exps[o, a, i] = exp_value(x3[o, a, i] - out2[o, i])
                    sums[i] += exps[o, a, i]
            for i in range(inner):
                inverse[o, i] = 1.0 / sums[i]
        else:
            for a in range(n):
                for i in range(inner):
                    sums[i] += exp_value(x3[o, a, i] - out2[o, i])
        for i in range(inner):
            out2[o, i] = math.log(sums[i]) + out2[o, i]


PAIRWISE_BLOCK = 128     # numpy's pairwise sum adds blocks of at most this many entries in eight running sums


@njit(cache=True, error_model="numpy")
def pairwise_sum(x, start, n, pending, lefts):
    """x[start:start + n] summed as numpy sums a contiguous axis: halves (the first a multiple of 8 entries) down
    to blocks of at most 128, eight running sums in a block (numpy/_core/src/umath/loops_utils.h.src), each half's
    sum added to its sibling's. numpy recurses; this walks the same tree with an explicit stack, `pending`
    ([levels, 3]: a half's start, size, and whether its first half is summed) and `lefts` (that first half's sum),
    1.5x faster than a recursive call per half, which numba's cache also handles badly (numba issue 6061)."""
    if n <= PAIRWISE_BLOCK:
        return lane_sum(x, start, n)
    level = 0
    pending[0, 0] = start
    pending[0, 1] = n
    while True:
        size = pending[level, 1]
        if size > PAIRWISE_BLOCK:      # descend into the first half
            half = size // 2
            half -= half % 8
            pending[level, 2] = 0
            pending[level + 1, 0] = pending[level, 0]
            pending[level + 1, 1] = half
            level += 1
            continue
        value = lane_sum(x, pending[level, 0], size)
        while True:         # return value to the levels above: a first half's sum waits for its sibling's
            if level == 0:
                return value
            level -= 1
            if pending[level, 2] == 0:
                lefts[level] = value
                pending[level, 2] = 1
                half = pending[level, 1] // 2
                half -= half % 8
                pending[level + 1, 0] = pending[level, 0] + half
                pending[level + 1, 1] = pending[level, 1] - half
                level += 1
                break
            value = lefts[level] + value


@njit(cache=True, error_model="numpy", inline="always")
def lane_sum(x, start, n):
    """x[start:start + n] in eight running sums, added pairwise at the end: numpy's order for n <= 128 (a block
    of pairwise_sum). The block is sliced first and indexed from loop counters: indices computed from `start`
    carry numba's negative-index wrapping (1.35x slower on 40,000 entries)."""
    y = x[start:start + n]
    if n < 8:
        total = x.dtype.type(0)
        for i in range(n):
            total += y[i]
        return total
    r0, r1, r2, r3 = y[0], y[1], y[2], y[3]
    r4, r5, r6, r7 = y[4], y[5], y[6], y[7]
    blocks = n // 8
    for b in range(1, blocks):
        r0 += y[b * 8]
        r1 += y[b * 8 + 1]
        r2 += y[b * 8 + 2]
        r3 += y[b * 8 + 3]
        r4 += y[b * 8 + 4]
        r5 += y[b * 8 + 5]
        r6 += y[b * 8 + 6]
        r7 += y[b * 8 + 7]
    total = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    for i in range(blocks * 8, n):
        total += y[i]
    return total


@njit(cache=True, error_model="numpy", inline="always")
def row_sum(x2, o):
    """Row o of x2 summed as lane_sum sums a contiguous block (its order, so the same number), indexed from
    loop counters (see reduce_forward), the eight running sums in registers."""
    n = x2.shape[1]
    if n < 8:
        total = x2.dtype.type(0)
        for a in range(n):
            total += x2[o, a]
        return total
    r0, r1, r2, r3 = x2[o, 0], x2[o, 1], x2[o, 2], x2[o, 3]
    r4, r5, r6, r7 = x2[o, 4], x2[o, 5], x2[o, 6], x2[o, 7]
    stop = n - n % 8
    for b in range(8, stop, 8):
        r0 += x2[o, b]
        r1 += x2[o, b + 1]
        r2 += x2[o, b + 2]
        r3 += x2[o, b + 3]
        r4 += x2[o, b + 4]
        r5 += x2[o, b + 5]
        r6 += x2[o, b + 6]
        r7 += x2[o, b + 7]
    total = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    for a in range(stop, n):
        total += x2[o, a]
    return total


@njit(cache=True, error_model="numpy", inline="always")
def _reduce_row(op, row, work):
    """The SUM, MIN or MAX of `row` (more than SHORT_ROWS entries) as reduce_forward reduces one row of a reduction
    over the last axis (its order, so the same bits). Shorter rows are left to reduce_forward's pass
    (cpu.fusion._absorbed_reduction)."""
    n = row.size
    if op != oc.SUM:
        # the row as a 2-D view by basic indexing: a reshape called numba's runtime helper, 11 ns of a row of 100
        return _row_extremum(row[None, :], 0, op == oc.MAX)
    if n <= PAIRWISE_BLOCK:     # one block: no stack of halves, so no frames(), a reshape (numba's runtime helper)
        return lane_sum(row, 0, n)
    return pairwise_sum(row, 0, n, frames(work), lanes(work).view(row.dtype))


# _reduce_row for one op each (its other ops' branches dropped: with `op` an argument a call per row of 100 took
# 1.4x as long), for the generated kernels of fused groups (cpu.fusion), which reduce each row they computed with
# them. Not inlined by numba, whose inlining copies the helpers' IR into every kernel (7-8 s of compile a kernel
# against ~0.5), but by LLVM (forceinline: called, a row of 100 took 20 ns more).
@njit(cache=True, error_model="numpy", forceinline=True)
def sum_of_row(row, work):
    return _reduce_row(oc.SUM, row, work)


@njit(cache=True, error_model="numpy", forceinline=True)
def max_of_row(row, work):
    return _reduce_row(oc.MAX, row, work)


@njit(cache=True, error_model="numpy", forceinline=True)
def min_of_row(row, work):
    return _reduce_row(oc.MIN, row, work)


@njit(cache=True, error_model="numpy")
def _prod_partials(x, base, n, inner, d):
    """d[a] = the product of the entries x[base + b * inner] other than a (PROD's partials), by suffix then prefix
    products: exact with zeros."""
    if n == 0:
        return
    d[n - 1] = 1.0
    for a in range(n - 2, -1, -1):
        d[a] = d[a + 1] * x[base + (a + 1) * inner]
    prefix = 1.0
    for a in range(n):
        d[a] *= prefix
        prefix *= x[base + a * inner]


@njit(cache=True, error_model="numpy", inline="always")
def _partials(op, x, y, base, n, inner, d):
    """d[a] = the partial derivative of the reduced entry y by its input x[base + a * inner]: PROD's product of
    the other entries, LOGSUMEXP's softmax exp(x - y)."""
    if op == oc.PROD:
        _prod_partials(x, base, n, inner, d)
    else:
        for a in range(n):
            d[a] = exp_value(x[base + a * inner] - y)


@njit(cache=True, error_model="numpy", fastmath={"contract"})
def _logsumexp_transposed(x, y, g_out, g_in, outer, n, inner, assign):
    """LOGSUMEXP's cotangents, K = 1: g_in (+)= g_out times the softmax exp(x - y) of its reduced entry y, in
    vector loops over [outer, n, inner] views (see reduce_forward)."""
    if inner == 1:
        x2 = x.reshape(outer, n)
        g2 = g_in.reshape(outer, n)
        for o in range(outer):
            g = g_out[o]
            peak = y[o]
            row = g2[o]
            for a in range(n):
                _put(row, a, g * exp_value(x2[o, a] - peak), assign)
        return
    x3 = x.reshape(outer, n, inner)
    g3 = g_in.reshape(outer, n, inner)
    y2 = y.reshape(outer, inner)
    go2 = g_out.reshape(outer, inner)
    for o in range(outer):
        for a in range(n):
            row = g3[o, a]
            for i in range(inner):
                _put(row, i, go2[o, i] * exp_value(x3[o, a, i] - y2[o, i]), assign)


@njit(cache=True, error_model="numpy", fastmath={"contract"})
def logsumexp_from_stash(stash, g_out, g_in, outer, n, inner, assign):
    """_logsumexp_transposed from the exponentials and reciprocal sums that logsumexp_forward left in `stash`: the
    softmax exp(x - y) is exps / sum, so the cotangents take one multiply per entry, no exponential."""
    exps = stash[:g_in.size].reshape(outer, n, inner)
    inverse = stash[g_in.size:g_in.size + g_out.size].reshape(outer, inner)
    go2 = g_out.reshape(outer, inner)
    if inner == 1:
        e2, g2 = exps.reshape(outer, n), g_in.reshape(outer, n)
        for o in range(outer):
            scale = go2[o, 0] * inverse[o, 0]
            row = g2[o]
            for a in range(n):
                _put(row, a, scale * e2[o, a], assign)
        return
    g3 = g_in.reshape(outer, n, inner)
    for o in range(outer):
        for a in range(n):
            row = g3[o, a]
            for i in range(inner):
                _put(row, i, go2[o, i] * inverse[o, i] * exps[o, a, i], assign)


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
def reduce_linear(op, x, y, out_rows, in_rows, outer, n, inner, transpose, temps, assign=False):
    """The reduction's Jacobian over K columns: out += J in (tangents) or, transposed, in += J^T out
    (cotangents). assign (transposed): in's rows are first written here and hold no values yet. temps: see
    temps_entries."""
    K = out_rows.shape[1]
    if op == oc.SUM:
        sum_linear(out_rows, in_rows, outer, n, inner, transpose, assign)
        return
    extremum = op == oc.MAX or op == oc.MIN
    if K == 1 and transpose and op == oc.LOGSUMEXP:
        _logsumexp_transposed(x, y, out_rows.reshape(out_rows.size), in_rows.reshape(in_rows.size), outer, n,
                              inner, assign)
        return
    if K == 1 and transpose and extremum:
        _extremum_transposed(x, y, out_rows.reshape(out_rows.size), in_rows.reshape(in_rows.size), outer, n,
                             inner, assign, temps)
        return
    if assign:
        in_rows[:] = 0
    if extremum:
        _extremum_linear(x, y, out_rows, in_rows, outer, n, inner, transpose)
        return
    d = temps[:n]
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
def _extremum_linear(x, y, out_rows, in_rows, outer, n, inner, transpose):
    """MAX/MIN's Jacobian over K columns (each reduced entry split evenly between its tied extrema) with no
    partials array, in the arrays' dtype: transposed, in += J^T out, each cotangent divided by the tie count
    (as _extremum_transposed, the recorded VJP, JAX's and PyTorch's rules: every reverse path one number), or
    out += J in, each tied tangent times 1 / count. Every entry is visited, times 0 off the extrema, so a NaN
    or infinite value propagates."""
    K = out_rows.shape[1]
    one, zero = out_rows.dtype.type(1), out_rows.dtype.type(0)
    for o in range(outer):
        for i in range(inner):
            base = o * n * inner + i
            r = o * inner + i
            ties = out_rows.dtype.type(_ties(x, y[r], base, n, inner))
            share = one / ties
            for a in range(n):
                e = base + a * inner
                tied = x[e] == y[r]
                for k in range(K):
                    if transpose:       # off the extrema out * 0: NaN exactly where out / ties * 0 would be
                        in_rows[e, k] += out_rows[r, k] / ties if tied else out_rows[r, k] * zero
                    else:
                        out_rows[r, k] += in_rows[e, k] * (share if tied else zero)


@njit(cache=True, error_model="numpy")
def _extremum_transposed(x, y, g_out, g_in, outer, n, inner, assign, temps):
    """MAX/MIN cotangents, K = 1: each reduced entry's cotangent split evenly between its tied extrema (as
    TensorFlow, JAX and PyTorch split it; divided by the count, then masked, as JAX's and PyTorch's rules), in
    two passes over its entries (count the ties, then write), with no partials array; loops over
    [outer, n, inner] views (see reduce_forward)."""
    one, zero = g_out.dtype.type(1), g_out.dtype.type(0)      # shares times 0/1 masks: a NaN cotangent stays NaN
    if inner == 1:
        x2 = x.reshape(outer, n)
        g2 = g_in.reshape(outer, n)
        for o in range(outer):
            extremum = y[o]
            ties = 0
            for a in range(n):
                ties += x2[o, a] == extremum
            share = g_out[o] / g_out.dtype.type(max(ties, 1))      # in the dtype, as the recorded VJP's
            if assign:
                for a in range(n):
                    g2[o, a] = share * (one if x2[o, a] == extremum else zero)
            else:
                for a in range(n):
                    g2[o, a] += share * (one if x2[o, a] == extremum else zero)
        return
    x3 = x.reshape(outer, n, inner)
    g3 = g_in.reshape(outer, n, inner)
    y2 = y.reshape(outer, inner)
    shares = temps[:inner]       # tie counts, then each column's share
    for o in range(outer):
        for i in range(inner):
            shares[i] = 0
        for a in range(n):
            for i in range(inner):
                shares[i] += 1 if x3[o, a, i] == y2[o, i] else 0
        for i in range(inner):
            shares[i] = g_out[o * inner + i] / max(shares[i], one)
        for a in range(n):
            if assign:
                for i in range(inner):
                    g3[o, a, i] = shares[i] * (one if x3[o, a, i] == y2[o, i] else zero)
            else:
                for i in range(inner):
                    g3[o, a, i] += shares[i] * (one if x3[o, a, i] == y2[o, i] else zero)


@njit(cache=True, error_model="numpy")
def sum_transposed_block(g_out, g_in, n, inner, start, assign):
    """Entries [start, start + g_in.size) of SUM's cotangent to its [outer, n, inner] input, each its reduced
    entry's in g_out (flat, K = 1), set (assign) or added to g_in: a block of a fused reverse group, run by run of
    entries that read one reduced entry (inner 1) or consecutive ones."""
    stop = start + g_in.size
    e = start
    while e < stop:
        # each run sliced first and indexed from 0: indices LLVM cannot prove non-negative carry numba's
        # wrapping, and its loop does not vectorise (a 640,000-entry fill 3x slower)
        if inner == 1:
            run_stop = min((e // n + 1) * n, stop)
            g = g_out[e // n]
            run = g_in[e - start:run_stop - start]
            for i in range(run.size):
                _put(run, i, g, assign)
        else:
            pos = e % inner
            run_stop = min(e - pos + inner, stop)
            run = g_in[e - start:run_stop - start]
            reduced = g_out[(e // (n * inner)) * inner + pos:]
            for i in range(run.size):
                _put(run, i, reduced[i], assign)
        e = run_stop


@njit(cache=True, error_model="numpy")
def extremum_shares(x, y, g_out, n):
    """A MAX/MIN over rows of n entries in a fused reverse group, before its blocks: each reduced entry's
    cotangent in g_out replaced by its tied extrema's share, as _extremum_transposed divides it (the same bits;
    nothing reads that cotangent after its reduction's reverse)."""
    for o in range(g_out.size):
        row = x[o * n:(o + 1) * n]
        ties = 0
        for a in range(n):
            ties += row[a] == y[o]
        g_out[o] = g_out[o] / g_out.dtype.type(max(ties, 1))


@njit(cache=True, error_model="numpy")
def extremum_transposed_block(x, y, shares, g_in, n, start, assign):
    """Entries [start, start + g_in.size) of a MAX/MIN's cotangent to its input (rows of n entries, x their
    values from `start`): its row's share (extremum_shares) on the extrema, 0 elsewhere, set (assign) or added to
    g_in, as _extremum_transposed writes them; run by run of one row's entries (see sum_transposed_block)."""
    one, zero = shares.dtype.type(1), shares.dtype.type(0)
    stop = start + g_in.size
    e = start
    while e < stop:
        o = e // n
        run_stop = min((o + 1) * n, stop)
        share, extremum = shares[o], y[o]
        run = g_in[e - start:run_stop - start]
        values = x[e - start:run_stop - start]
        for i in range(run.size):
            _put(run, i, share * (one if values[i] == extremum else zero), assign)
        e = run_stop


@njit(cache=True, error_model="numpy")
def sum_linear(out_rows, in_rows, outer, n, inner, transpose, assign):
    """SUM's Jacobian is all ones: out += sum of in (tangents) or, transposed, in += out broadcast
    (cotangents), with no partials computed; K = 1 gets its own loops, so no column loop runs per entry."""
    K = out_rows.shape[1]
    if K == 1 and inner == 1:
        out_flat = out_rows.reshape(outer)
        in2 = in_rows.reshape(outer, n)
        if transpose:
            _sum_transposed_rows(out_flat, in2, assign)
        else:
            for o in range(outer):
                out_flat[o] += row_sum(in2, o)
        return
    if K == 1:
        _sum_across_rows(out_rows.reshape(outer, inner), in_rows.reshape(outer, n, inner), transpose, assign)
        return
    for o in range(outer):
        for i in range(inner):
            base = o * n * inner + i
            r = o * inner + i
            for a in range(n):
                e = base + a * inner
                for k in range(K):
                    if transpose:
                        _put(in_rows, (e, k), out_rows[r, k], assign)
                    else:
                        out_rows[r, k] += in_rows[e, k]


@njit(cache=True, error_model="numpy")
def _sum_transposed_rows(g_out, g_in2, assign):
    """g_in2[o, :] (+)= g_out[o]: a contiguous axis's cotangent."""
    outer, n = g_in2.shape
    for o in range(outer):
        g = g_out[o]
        if assign:
            for a in range(n):
                g_in2[o, a] = g
        else:
            for a in range(n):
                g_in2[o, a] += g


@njit(cache=True, error_model="numpy")
def _sum_across_rows(out2, in3, transpose, assign):
    """Over an outer axis, row after row (vector loops over inner): in3[o, a, :] (+)= out2[o, :] (transposed),
    else out2[o, :] += in3[o, a, :] for every a, in order."""
    outer, n, inner = in3.shape
    for o in range(outer):
        for a in range(n):
            if not transpose:
                for i in range(inner):
                    out2[o, i] += in3[o, a, i]
            elif assign:
                for i in range(inner):
                    in3[o, a, i] = out2[o, i]
            else:
                for i in range(inner):
                    in3[o, a, i] += out2[o, i]


@njit(cache=True, error_model="numpy")
def reduce_second(op, x, y, g_out, t_in, gt_in, outer, n, inner, temps):
    """The second-order term of the reductions whose Jacobian depends on x (PROD, LOGSUMEXP): gt_in += g_out times
    the tangent of the partials along t_in; the others' partials are locally constant (no term)."""
    if op == oc.PROD:
        _prod_second(x, g_out, t_in, gt_in, outer, n, inner, temps)
    elif op == oc.LOGSUMEXP:
        _logsumexp_second(x, y, g_out, t_in, gt_in, outer, n, inner, temps)


@njit(cache=True, error_model="numpy")
def _logsumexp_second(x, y, g_out, t_in, gt_in, outer, n, inner, temps):
    """LOGSUMEXP's second-order term: the softmax p's tangent is p (t - p . t), so gt_in[a] += g p_a (t_a - p . t)
    (the Hessian diag(p) - p p^T times t). temps: the n partials, then the K dot products p . t."""
    K = t_in.shape[1]
    p = temps[:n]
    dots = temps[n:n + K]
    for o in range(outer):
        for i in range(inner):
            base = o * n * inner + i
            r = o * inner + i
            g = g_out[r]
            if g == 0:
                continue
            _partials(oc.LOGSUMEXP, x, y[r], base, n, inner, p)
            dots[:] = 0
            for a in range(n):
                e = base + a * inner
                for k in range(K):
                    dots[k] += p[a] * t_in[e, k]
            for a in range(n):
                e = base + a * inner
                c = g * p[a]
                for k in range(K):
                    gt_in[e, k] += c * (t_in[e, k] - dots[k])


@njit(cache=True, error_model="numpy")
def _prod_second(x, g_out, t_in, gt_in, outer, n, inner, temps):
    """PROD's second-order term: gt_in[a] += g * d/dt (product of the entries other than a).

    The product excluding a is prefix[a] * suffix[a]; their tangents follow the
    same recurrences, so every entry costs O(K) and zeros stay exact.
    """
    K = t_in.shape[1]
    if n == 0:
        return
    suffix = temps[:n]
    suffix_t = temps[n:n + n * K].reshape(n, K)
    prefix_t = temps[n + n * K:n + (n + 1) * K]
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
def cumsum_forward(x, out, outer, n, inner, exclusive, reverse, temps):
    """Running sums along the middle axis of an [outer, n, inner] view: from the last entry when reverse,
    each entry left out of its own sum when exclusive (the first sum is then 0); numpy's order."""
    _running_sums(x.reshape(outer, n, inner), out.reshape(outer, n, inner), exclusive, reverse, False, temps)


@njit(cache=True, error_model="numpy")
def cumsum_linear(out_rows, in_rows, outer, n, inner, exclusive, reverse, transpose, temps):
    """CUMSUM's map over K columns: out += C in (tangents) or, transposed, in += C^T out (cotangents);
    C^T is the running sum in the other direction with the same exclusivity."""
    K = out_rows.shape[1]
    src = out_rows if transpose else in_rows
    dst = in_rows if transpose else out_rows
    backward = reverse != transpose
    if K == 1:
        _running_sums(src.reshape(outer, n, inner), dst.reshape(outer, n, inner), exclusive, backward, True, temps)
        return
    acc = temps[:inner * K].reshape(inner, K)
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


@njit(cache=True, error_model="numpy")
def _running_sums(src3, dst3, exclusive, backward, add, temps):
    """dst3[o, a, :] (+)= the running sums of src3[o, :, :] along a (from the last a when backward), in order
    (numpy's), indexed from loop counters (see reduce_forward); along a contiguous axis the running sum stays in
    a register. CUMSUM's forward, and its map over one column."""
    outer, n, inner = src3.shape
    if inner == 1:
        for o in range(outer):
            acc = src3.dtype.type(0)
            for step in range(n):
                a = n - 1 - step if backward else step
                v = src3[o, a, 0]
                if exclusive:
                    _put(dst3, (o, a, 0), acc, not add)
                    acc += v
                else:
                    acc = acc + v if step else v
                    _put(dst3, (o, a, 0), acc, not add)
        return
    acc = temps[:inner]
    for o in range(outer):
        acc[:] = 0
        for step in range(n):
            a = n - 1 - step if backward else step
            for i in range(inner):
                v = src3[o, a, i]
                if exclusive:
                    _put(dst3, (o, a, i), acc[i], not add)
                    acc[i] += v
                else:
                    acc[i] = acc[i] + v if step else v
                    _put(dst3, (o, a, i), acc[i], not add)


@njit(cache=True, error_model="numpy")
def temps_entries(op, iattr, a):
    """(fixed, per column): the kernels above need at most fixed + K * per column entries of `temps` for op in a
    sweep of K columns (jitape_kernels.cpu.interpreter.planned_temps plans one buffer for a whole Program)."""
    n, inner = iattr[a + 1], iattr[a + 2]
    if op == oc.CUMSUM:
        return inner, inner         # running sums across inner (one column, the forward), or K columns each
    if op == oc.PROD:
        return n, n + 1             # the partials; second order: suffix products and their K tangents
    if op == oc.LOGSUMEXP:
        return max(n, inner), 1     # the partials or the sums across inner; second order: K dot products
    if op == oc.MAX or op == oc.MIN:
        return inner, 0             # tie counts across inner
    return 0, 0
