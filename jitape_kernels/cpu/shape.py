"""Compiled kernels of the data-movement opcodes: TRANSPOSE, TILE, SLICE, PAD, PLACE, GATHER.

All are linear, so their tangent kernels apply the forward map to K tangent
columns and they have no second-order terms.

SLICE and PAD are each other's adjoint: SLICE reads in[starts + i * steps], PAD
writes out[starts + i * steps] = in[i] into zeros.

A TRANSPOSE that is a (batched) matrix transpose, of entries or of runs along
a last axis it keeps, copies square tiles (cache-friendly); a TILE that
broadcasts walks runs of its merged axes (copies, fills, and row sums in
reverse); every other TRANSPOSE, TILE, SLICE and PAD is an affine map
(affine_spec) walked run by run along its last axis, an odometer over the
others: a vector loop where the run is contiguous, a strided one where not.
No map and no scratch is allocated: rank-sized metadata lives in the sweep's
workspace (workspace.py). PLACE and GATHER compute their runs in closed form. Attribute
blocks are laid out as documented in opcodes.py.

Loops index arrays from loop counters (views, or reshaped arrays), not from
computed offsets: numba wraps negative indices, and an offset LLVM cannot prove
non-negative keeps a loop from vectorising (3-8x slower here).
"""

from .. import njit, opcodes as oc
from .reduction import row_sum
from .workspace import region


@njit(cache=True, error_model="numpy")
def _strides(dims, s):
    """The row-major strides of dims, written into s (dims.size entries)."""
    rank = dims.size
    if rank:
        s[rank - 1] = 1
    for d in range(rank - 2, -1, -1):
        s[d] = s[d + 1] * dims[d + 1]
    return s


@njit(cache=True, error_model="numpy", inline="always")
def _odometer_step(index, dims, steps, position, last):
    """Advance the row-major `index` over dims[:last + 1] by one and return `position` moved by `steps` with
    it (a wrapped axis steps back)."""
    d = last
    while d >= 0:
        index[d] += 1
        position += steps[d]
        if index[d] < dims[d]:
            break
        position -= steps[d] * dims[d]
        index[d] = 0
        d -= 1
    return position


@njit(cache=True, error_model="numpy")
def affine_spec(op, iattr, a, work):
    """TRANSPOSE, TILE, SLICE and PAD as an affine map (dims, base, steps): index i of dims (row-major) goes to
    offset base + sum(i[d] * steps[d]); output -> input, PAD's input -> output. A TILE's output axis of
    reps * n entries is two, (reps, n) with steps (0, the input's stride). Regions 0-2 of `work`."""
    rank = iattr[a]
    in_dims = iattr[a + 1:a + 1 + rank]
    third = iattr[a + 1 + rank:a + 1 + 2 * rank]
    if op == oc.TILE:
        in_strides = _strides(in_dims, region(work, 2, rank))
        steps = region(work, 0, 2 * rank)
        dims = region(work, 1, 2 * rank)
        m = 0
        for d in range(rank):       # axes of one entry dropped (the walk's innermost axis is then a long one)
            reps = third[d] // in_dims[d] if in_dims[d] else 0
            if reps != 1:
                dims[m], steps[m] = reps, 0
                m += 1
            if in_dims[d] != 1:
                dims[m], steps[m] = in_dims[d], in_strides[d]
                m += 1
        return dims[:m], 0, steps[:m]
    steps = region(work, 0, rank)
    dims = region(work, 1, rank)
    if op == oc.TRANSPOSE:
        in_strides = _strides(in_dims, region(work, 2, rank))
        for d in range(rank):
            dims[d] = in_dims[third[d]]
            steps[d] = in_strides[third[d]]
        return dims, 0, steps
    starts = iattr[a + 1 + 2 * rank:a + 1 + 3 * rank]
    window_steps = iattr[a + 1 + 3 * rank:a + 1 + 4 * rank]
    # the window starts + i * window_steps of the larger shape, for every index i of the smaller
    large, small = (in_dims, third) if op == oc.SLICE else (third, in_dims)
    large_strides = _strides(large, region(work, 2, rank))
    base = 0
    for d in range(rank):
        base += starts[d] * large_strides[d]
        steps[d] = window_steps[d] * large_strides[d]
        dims[d] = small[d]
    return dims, base, steps


@njit(cache=True, error_model="numpy")
def affine_walk(op, iattr, a, mapped, plain, into_mapped, add, K, work):
    """Plain rows in order against mapped rows where affine_spec sends them, on flat views of [size, K] buffers
    (nothing allocated: an odometer over all axes but the last, then that axis as one run, a vector loop
    over views where its step is 1). into_mapped: mapped (+)= plain, else plain (+)= mapped; add: accumulate
    rather than set."""
    dims, base, steps = affine_spec(op, iattr, a, work)
    rank = dims.size
    length = dims[rank - 1] if rank else 1
    step = steps[rank - 1] if rank else 0
    runs = plain.size // (length * K) if length * K else 0
    index = region(work, 3, rank)
    index[:] = 0
    position = base
    for p in range(runs):
        plain_run = plain[p * length * K:(p + 1) * length * K]
        if step == 1:       # views of the run, indexed from the loop counter (see reduction.py)
            mapped_run = mapped[position * K:(position + length) * K]
            if into_mapped and add:
                for j in range(length * K):
                    mapped_run[j] += plain_run[j]
            elif into_mapped:
                for j in range(length * K):
                    mapped_run[j] = plain_run[j]
            elif add:
                for j in range(length * K):
                    plain_run[j] += mapped_run[j]
            else:
                for j in range(length * K):
                    plain_run[j] = mapped_run[j]
        else:
            for j in range(length):
                at = (position + j * step) * K
                for k in range(K):
                    if into_mapped and add:
                        mapped[at + k] += plain_run[j * K + k]
                    elif into_mapped:
                        mapped[at + k] = plain_run[j * K + k]
                    elif add:
                        plain_run[j * K + k] += mapped[at + k]
                    else:
                        plain_run[j * K + k] = mapped[at + k]
        position = _odometer_step(index, dims, steps, position, rank - 2)      # the next run


@njit(cache=True, error_model="numpy")
def leading_broadcast_block(op, iattr, a):
    """For a TILE that only repeats the whole input along leading axes (a bias over a batch): the
    input size; otherwise 0."""
    if op != oc.TILE:
        return 0
    rank = iattr[a]
    block = 1
    leading = True
    for d in range(rank):
        n_in = iattr[a + 1 + d]
        n_out = iattr[a + 1 + rank + d]
        if leading and n_in == 1:
            continue
        leading = False
        if n_in != n_out:
            return 0
        block *= n_in
    return block


@njit(cache=True, error_model="numpy")
def broadcast_axes(iattr, a, K, work):
    """A TILE that broadcasts (every input axis 1 or the output's), over rows of K columns, as collapsed axes:
    (dims, steps), neighbouring output axes merged while all repeat the input or none does, the K columns a
    last axis that does not; steps[d] is the input's stride along axis d, 0 where it repeats. Empty arrays for
    a TILE that repeats more than single entries. Regions 0-2 of `work`."""
    rank = iattr[a]
    dims = region(work, 0, rank + 1)
    repeats = region(work, 1, rank + 1)        # 1 where the axis repeats the input
    m = 0
    for d in range(rank + 1):
        n_in = iattr[a + 1 + d] if d < rank else K
        n_out = iattr[a + 1 + rank + d] if d < rank else K
        if n_in != 1 and n_in != n_out:
            return dims[:0], dims[:0]
        if n_out == 1:
            continue
        if m and (repeats[m - 1] != 0) == (n_in != n_out):
            dims[m - 1] *= n_out
        else:
            dims[m] = n_out
            repeats[m] = n_in != n_out
            m += 1
    if m == 0:                                      # a single entry
        dims[0], repeats[0], m = 1, False, 1
    steps = region(work, 2, m)
    stride = 1
    for d in range(m - 1, -1, -1):
        steps[d] = 0 if repeats[d] else stride
        stride *= 1 if repeats[d] else dims[d]
    return dims[:m], steps


@njit(cache=True, error_model="numpy")
def broadcast_block(iattr, a, x, out, start, work):
    """Entries [start, start + out.size) of TILE a's broadcast of x (every input axis 1 or the output's:
    broadcast_axes is not empty), a block of a fused group (jitape_kernels.layout): run by run along the last
    collapsed axis, each a copy or a fill. Regions 0-3 of `work`."""
    dims, steps = broadcast_axes(iattr, a, 1, work)
    m = dims.size
    if m == 2:      # a column or a row broadcast (most are): two counters, no index arrays (2x faster)
        _broadcast_block_2d(x, out, start, dims[1], steps[0], steps[1])
        return
    index = region(work, 3, m)
    rest = start
    at = 0      # x's entry at `index`
    for d in range(m - 1, -1, -1):
        index[d] = rest % dims[d]
        rest //= dims[d]
        at += index[d] * steps[d]
    run, step = dims[m - 1], steps[m - 1]
    e = 0
    while e < out.size:
        count = min(run - index[m - 1], out.size - e)
        run_out = out[e:e + count]
        if step == 0:
            run_out[:] = x[at]
        else:
            run_in = x[at:at + count]
            for j in range(count):      # numba's slice copy costs 3-4x this loop (runs of 100: 0.40 -> 0.11 ms per 1M)
                run_out[j] = run_in[j]
        e += count
        index[m - 1] += count
        at += count * step
        d = m - 1
        while d > 0 and index[d] == dims[d]:     # carry into the next run's index
            at += steps[d - 1] - dims[d] * steps[d]
            index[d] = 0
            d -= 1
            index[d] += 1


@njit(cache=True, error_model="numpy", inline="always")
def _broadcast_block_2d(x, out, start, run, step0, step1):
    """broadcast_block over two collapsed axes: a column broadcast (step1 0: each run fills one entry of x) or a
    row broadcast (step0 0: each run copies x)."""
    i0 = start // run
    i1 = start - i0 * run
    e = 0
    n = out.size
    while e < n:
        count = min(run - i1, n - e)
        run_out = out[e:e + count]      # loops over slices from 0: indices numba knows are not negative vectorise
        if step1 == 0:
            value = x[i0 * step0]
            for j in range(count):
                run_out[j] = value
        else:
            run_in = x[i1:i1 + count]
            for j in range(count):
                run_out[j] = run_in[j]
        e += count
        i1 = 0
        i0 += 1


@njit(cache=True, error_model="numpy")
def _broadcast_walk(dims, steps, single, repeated, into_repeated, add, work):
    """Between a flat buffer and its broadcast over `dims` (broadcast_axes): repeated (+)= the broadcast of
    single (into_repeated; add: accumulate), else single += the sums over its repeats. Run by run along the last
    axis (a copy or a fill; a row sum in reverse), arrays indexed from loop counters (see reduce_forward).
    Regions 3-4 of `work`."""
    m = dims.size
    run = dims[m - 1]
    if repeated.size == 0:
        return
    runs = repeated.size // run
    repeated2 = repeated.reshape(runs, run)
    width = 1 if steps[m - 1] == 0 else run         # single as rows: each run reads one row of it
    single2 = single.reshape(single.size // width, width)
    row_steps = region(work, 3, m)
    index = region(work, 4, m)
    for d in range(m):
        row_steps[d] = steps[d] // width
        index[d] = 0
    row = 0
    for p in range(runs):
        if width == 1 and not into_repeated:
            single2[row, 0] += row_sum(repeated2, p)
        elif width == 1:
            value = single2[row, 0]
            if add:
                for j in range(run):
                    repeated2[p, j] += value
            else:
                for j in range(run):
                    repeated2[p, j] = value
        elif not into_repeated:
            for j in range(run):
                single2[row, j] += repeated2[p, j]
        elif add:
            for j in range(run):
                repeated2[p, j] += single2[row, j]
        else:
            for j in range(run):
                repeated2[p, j] = single2[row, j]
        row = _odometer_step(index, dims, row_steps, row, m - 2)


@njit(cache=True, error_model="numpy")
def swapped_axes(iattr, a, work):
    """A TRANSPOSE that, its axes of one entry dropped and neighbouring input axes it keeps together merged,
    swaps the middle two axes of [B, M, N, R] (a matrix transpose, batched, of runs of R entries that stay
    last): (B, M, N, R); else (0, 0, 0, 0). Regions 0-2 of `work`."""
    rank = iattr[a]
    in_dims = iattr[a + 1:a + 1 + rank]
    perm = iattr[a + 1 + rank:a + 1 + 2 * rank]
    position = region(work, 0, rank)           # an input axis's place among the axes of more than one entry
    count = 0
    for d in range(rank):
        position[d] = count
        count += in_dims[d] != 1
    sizes = region(work, 1, rank)
    firsts = region(work, 2, rank)
    m = 0
    last = -2
    for d in range(rank):                       # output axes, merged while they are input axes in order
        axis = perm[d]
        if in_dims[axis] == 1:
            continue
        if m and position[axis] == last + 1:
            sizes[m - 1] *= in_dims[axis]
        else:
            sizes[m] = in_dims[axis]
            firsts[m] = position[axis]
            m += 1
        last = position[axis]
    run = 1
    if m >= 2 and firsts[m - 1] == firsts[:m].max():      # the input's last group stays last
        m -= 1
        run = sizes[m]
    if m == 2 and firsts[0] > firsts[1]:
        return 1, sizes[1], sizes[0], run
    if m == 3 and firsts[0] < firsts[2] < firsts[1]:
        return sizes[0], sizes[2], sizes[1], run
    return 0, 0, 0, 0


_SHORT = 8      # a broadcast's rows shorter than this sum per entry (_short_rows_sum)
_EDGE = 64      # a transpose's square tiles: both sides of one stay in cache


@njit(cache=True, error_model="numpy")
def _swap_middle_two(src, dst, add):
    """dst[b, j, i, :] (+)= src[b, i, j, :] for [B, M, N, R] src and [B, N, M, R] dst, tile by tile (runs of
    one entry: _EDGE x _EDGE entries; longer runs: fewer, each run a vector loop)."""
    B, M, N, R = src.shape
    if R == 1:      # three-axis loops: with a run loop of one entry inside, 1.8x slower here
        _swap_last_two(src.reshape(B, M, N), dst.reshape(B, N, M), add)
        return
    edge = max(8, _EDGE // R)
    for b in range(B):
        for i0 in range(0, M, edge):
            i1 = min(i0 + edge, M)
            for j0 in range(0, N, edge):
                j1 = min(j0 + edge, N)
                for j in range(j0, j1):
                    for i in range(i0, i1):
                        if add:
                            for r in range(R):
                                dst[b, j, i, r] += src[b, i, j, r]
                        else:
                            for r in range(R):
                                dst[b, j, i, r] = src[b, i, j, r]


@njit(cache=True, error_model="numpy")
def _swap_last_two(src, dst, add):
    """dst[b, j, i] (+)= src[b, i, j] for [B, M, N] src and [B, N, M] dst, tile by tile."""
    B, M, N = src.shape
    for b in range(B):
        for i0 in range(0, M, _EDGE):
            i1 = min(i0 + _EDGE, M)
            for j0 in range(0, N, _EDGE):
                j1 = min(j0 + _EDGE, N)
                for j in range(j0, j1):
                    if add:
                        for i in range(i0, i1):
                            dst[b, j, i] += src[b, i, j]
                    else:
                        for i in range(i0, i1):
                            dst[b, j, i] = src[b, i, j]


@njit(cache=True, error_model="numpy")
def mapped_forward(op, iattr, a, x, out, work):
    if op == oc.TILE and x.size == 1:       # a scalar broadcast: a fill
        out[:] = x[0]
        return
    if op == oc.TILE:
        dims, steps = broadcast_axes(iattr, a, 1, work)
        if dims.size:
            _broadcast_walk(dims, steps, x, out, True, False, work)
            return
    if op == oc.TRANSPOSE:
        B, M, N, R = swapped_axes(iattr, a, work)
        if B:
            _swap_middle_two(x.reshape(B, M, N, R), out.reshape(B, N, M, R), False)
            return
    if op == oc.PAD:
        out[:] = 0
    # PAD writes the mapped side (its output), the others read it (their input)
    affine_walk(op, iattr, a, out if op == oc.PAD else x, x if op == oc.PAD else out, op == oc.PAD, False, 1, work)


@njit(cache=True, error_model="numpy")
def broadcast_sum_block(iattr, a, g_out, g_in, start, work):
    """g_in += TILE a's transposed map of its cotangent's entries [start, start + g_out.size) (a fused reverse
    group's block): each entry added to its input entry's in order, as _broadcast_walk adds them for a broadcast
    whose innermost axis copies the input, the only ones layout._sums_in_order lets join a group (the same
    bits). Run by run along that axis; regions 0-2 of `work`."""
    dims, steps = broadcast_axes(iattr, a, 1, work)
    m = dims.size
    run = dims[m - 1]
    stop = start + g_out.size
    e = start
    while e < stop:
        p, j = e // run, e % run
        row, rest = 0, p        # the input row that run p reads: its outer axes' indices times their steps
        for d in range(m - 2, -1, -1):
            row += (rest % dims[d]) * steps[d]
            rest //= dims[d]
        n = min(run - j, stop - e)
        into = g_in[row + j:row + j + n]
        block = g_out[e - start:e - start + n]
        for t in range(n):
            into[t] += block[t]
        e += n


@njit(cache=True, error_model="numpy")
def _short_rows_sum(repeated, single):
    """single[e] += the sum of repeated[j*n + e] over j, for rows of n < _SHORT entries: each entry's repeats
    summed in a register (in memory, the loop would be a chain of loads and stores)."""
    n = single.size
    for e in range(n):
        total = single.dtype.type(0)
        for j in range(e, repeated.size, n):
            total += repeated[j]
        single[e] += total


@njit(cache=True, error_model="numpy")
def _one_entry_tiled(out_rows, in_rows, transpose):
    """A TILE of one entry (a scalar broadcast) over K columns: out += in in every row or, transposed, in += the
    sum of out's rows (K = 1: in register lanes, as the reductions sum). No walk is planned for it."""
    n, K = out_rows.shape
    if transpose and K == 1:
        in_rows[0, 0] += row_sum(out_rows.reshape(1, n), 0)
        return
    for i in range(n):
        for k in range(K):
            if transpose:
                in_rows[0, k] += out_rows[i, k]
            else:
                out_rows[i, k] += in_rows[0, k]


@njit(cache=True, error_model="numpy")
def mapped_linear(op, iattr, a, out_rows, in_rows, transpose, work, assign=False):
    """The op's map over K columns: out += map(in) (tangents; these ops are linear) or, transposed,
    in += map^T(out) (cotangents). assign: in's first write, set rather than added to (TRANSPOSE and PAD only,
    whose transposed map writes each input entry once)."""
    K = out_rows.shape[1]
    if op == oc.TILE:
        tile_linear(iattr, a, out_rows, in_rows, transpose, work, assign)
        return
    if op == oc.TRANSPOSE:
        B, M, N, R = swapped_axes(iattr, a, work)
        if B and transpose:
            _swap_middle_two(out_rows.reshape(B, N, M, R * K), in_rows.reshape(B, M, N, R * K), not assign)
            return
        if B:
            _swap_middle_two(in_rows.reshape(B, M, N, R * K), out_rows.reshape(B, N, M, R * K), True)
            return
    # PAD's map runs input -> output, the others' output -> input
    mapped, plain = (out_rows, in_rows) if op == oc.PAD else (in_rows, out_rows)
    affine_walk(op, iattr, a, mapped.reshape(mapped.size), plain.reshape(plain.size), (op == oc.PAD) != transpose,
                not assign, K, work)


@njit(cache=True, error_model="numpy", inline="always")
def tile_linear(iattr, a, out_rows, in_rows, transpose, work, assign=False):
    """mapped_linear of a TILE (the reverse sweep's row kernel of TILE rows calls it alone: see
    interpreter.reverse_tile_row)."""
    K = out_rows.shape[1]
    if in_rows.shape[0] == 1:
        _one_entry_tiled(out_rows, in_rows, transpose)
        return
    if transpose and 1 < leading_broadcast_block(oc.TILE, iattr, a) * K < _SHORT:
        _short_rows_sum(out_rows.reshape(out_rows.size), in_rows.reshape(in_rows.size))
        return
    dims, steps = broadcast_axes(iattr, a, K, work)
    if dims.size:
        _broadcast_walk(dims, steps, in_rows.reshape(in_rows.size), out_rows.reshape(out_rows.size),
                        not transpose, True, work)
        return
    affine_walk(oc.TILE, iattr, a, in_rows.reshape(in_rows.size), out_rows.reshape(out_rows.size), transpose,
                not assign, K, work)


@njit(cache=True, error_model="numpy")
def contiguous_run(op, iattr, a):
    """(input start, output start, length) when a SLICE or PLACE moves one contiguous run of entries (a window
    of leading size-1 axes, one partial axis of step 1, then whole axes; a concat operand with outer 1), else
    length -1. Not inlined: the scalar loops that call it stay small."""
    if op == oc.PLACE:
        if iattr[a] != 1:
            return 0, 0, -1
        return 0, iattr[a + 4] * iattr[a + 2], iattr[a + 1] * iattr[a + 2]
    if op != oc.SLICE:
        return 0, 0, -1
    rank = iattr[a]
    start, stride, length, partial = 0, 1, 1, False
    for d in range(rank - 1, -1, -1):
        n_in, n_out = iattr[a + 1 + d], iattr[a + 1 + rank + d]
        first, step = iattr[a + 1 + 2 * rank + d], iattr[a + 1 + 3 * rank + d]
        if partial:
            if n_out != 1:
                return 0, 0, -1
        elif n_out != n_in or (n_in > 1 and (first != 0 or step != 1)):
            if n_out > 1 and step != 1:
                return 0, 0, -1
            partial = True
        length *= n_out
        start += first * stride
        stride *= n_in
    return start, 0, length


@njit(cache=True, error_model="numpy", inline="always")
def block_runs(op, iattr, a):
    """PLACE and GATHER as contiguous runs of `length` entries: (number of runs, length); run_starts gives
    each run's input and output start, in closed form (no table is built)."""
    if op == oc.PLACE:
        return iattr[a], iattr[a + 1] * iattr[a + 2]
    return iattr[a] * iattr[a + 3], iattr[a + 2]


@njit(cache=True, error_model="numpy", inline="always")
def run_starts(op, iattr, a, p):
    """Run p's (input start, output start)."""
    if op == oc.PLACE:
        n_in, inner, n_out, offset = iattr[a + 1], iattr[a + 2], iattr[a + 3], iattr[a + 4]
        return p * n_in * inner, (p * n_out + offset) * inner
    n_axis, inner, n_idx = iattr[a + 1], iattr[a + 2], iattr[a + 3]
    o, j = p // n_idx, p % n_idx
    return (o * n_axis + iattr[a + 4 + j]) * inner, p * inner


@njit(cache=True, error_model="numpy")
def moved_forward(op, iattr, a, x, out):
    runs, length = block_runs(op, iattr, a)
    for p in range(runs):
        src, dst = run_starts(op, iattr, a, p)
        for e in range(length):
            out[dst + e] = x[src + e]


@njit(cache=True, error_model="numpy")
def moved_linear(op, iattr, a, out_rows, in_rows, transpose, assign=False):
    """The runs' copy over K columns: out += moved(in) (tangents) or, transposed, in += the runs of out
    (cotangents). assign: in's first write, set rather than added to (PLACE only, whose runs cover its input
    once)."""
    runs, length = block_runs(op, iattr, a)
    K = out_rows.shape[1]
    if transpose:
        for p in range(runs):
            s, d = run_starts(op, iattr, a, p)
            for e in range(length):
                for k in range(K):
                    if assign:
                        in_rows[s + e, k] = out_rows[d + e, k]
                    else:
                        in_rows[s + e, k] += out_rows[d + e, k]
    else:
        for p in range(runs):
            s, d = run_starts(op, iattr, a, p)
            for e in range(length):
                for k in range(K):
                    out_rows[d + e, k] += in_rows[s + e, k]
