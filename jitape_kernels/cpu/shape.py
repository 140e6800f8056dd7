"""Compiled kernels of the data-movement opcodes: TRANSPOSE, TILE, SLICE, PAD, PLACE, GATHER.

All are linear, so their tangent kernels apply the forward map to K tangent
columns and they have no second-order terms.

SLICE and PAD are each other's adjoint: SLICE reads in[starts + i * steps], PAD
writes out[starts + i * steps] = in[i] into zeros.

Rank-generic ops walk their output (PAD: its input) row by row, the other
array's offsets computed from the attribute block (a divmod per row, a step
along the last axis): no index map or table is allocated per instruction; nor
do PLACE and GATHER, whose runs are in closed form. Attribute blocks are laid
out as documented in opcodes.py.
"""
import numpy as np
from numba import njit

from .. import opcodes as oc


@njit(cache=True, error_model="numpy", inline="always")
def _space_dim(op, iattr, a, d):
    """Length of axis d of the space walked: the output's (PAD: the input's, the window)."""
    rank = iattr[a]
    if op == oc.TRANSPOSE:
        return iattr[a + 1 + iattr[a + 1 + rank + d]]
    if op == oc.PAD:
        return iattr[a + 1 + d]
    return iattr[a + 1 + rank + d]


@njit(cache=True, error_model="numpy", inline="always")
def _large_stride(op, iattr, a, j):
    """Row-major stride of axis j of the other array (TRANSPOSE/TILE/SLICE: the input; PAD: the output)."""
    rank = iattr[a]
    first = a + 1 + (rank if op == oc.PAD else 0)
    stride = 1
    for t in range(j + 1, rank):
        stride *= iattr[first + t]
    return stride


@njit(cache=True, error_model="numpy", inline="always")
def _axis_offset(op, iattr, a, d, i):
    """Offset in the other array of index i along axis d of the space."""
    rank = iattr[a]
    if op == oc.TRANSPOSE:
        return i * _large_stride(op, iattr, a, iattr[a + 1 + rank + d])
    if op == oc.TILE:
        return (i % iattr[a + 1 + d]) * _large_stride(op, iattr, a, d)
    return (iattr[a + 1 + 2 * rank + d] + i * iattr[a + 1 + 3 * rank + d]) * _large_stride(op, iattr, a, d)


@njit(cache=True, error_model="numpy")
def _walk(op, iattr, a, space, large, into_large, add):
    """For every entry e of the space (rows of K columns) and its offset m in the other array:
    large[m] = or += space[e] (into_large), else space[e] = or += large[m]. The offsets come from the attribute
    block row by row (a divmod walk over the leading axes, then a step, or TILE's wrap, along the last): no
    index map is built."""
    rank = iattr[a]
    K = space.shape[1]
    n_last = _space_dim(op, iattr, a, rank - 1) if rank else 1
    rows = 1
    for d in range(rank - 1):
        rows *= _space_dim(op, iattr, a, d)
    if n_last == 0:
        rows = 0
    wrap = iattr[a + rank] if op == oc.TILE and rank else 0    # TILE's last input axis: its index wraps
    for q in range(rows):
        base = 0
        rest = q
        for d in range(rank - 2, -1, -1):
            n = _space_dim(op, iattr, a, d)
            base += _axis_offset(op, iattr, a, d, rest % n)
            rest //= n
        step = 0
        if rank and op != oc.TILE:
            first = _axis_offset(op, iattr, a, rank - 1, 0)
            base += first
            step = _axis_offset(op, iattr, a, rank - 1, 1) - first
        j = 0
        for i in range(n_last):
            e = q * n_last + i
            m = base + (j if wrap else i * step)
            for k in range(K):
                if into_large:
                    if add:
                        large[m, k] += space[e, k]
                    else:
                        large[m, k] = space[e, k]
                elif add:
                    space[e, k] += large[m, k]
                else:
                    space[e, k] = large[m, k]
            j += 1
            if j == wrap:
                j = 0


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
def mapped_forward(op, iattr, a, x, out):
    block = leading_broadcast_block(op, iattr, a)
    if block == 1:                                  # a scalar broadcast: a fill
        value = x[0]
        for e in range(out.size):
            out[e] = value
        return
    if block:
        for start in range(0, out.size, block):     # element loops: no view per repeat
            for e in range(block):
                out[start + e] = x[e]
        return
    rows_in, rows_out = x.reshape(x.size, 1), out.reshape(out.size, 1)
    if op == oc.PAD:
        out[:] = 0
        _walk(op, iattr, a, rows_in, rows_out, True, False)
    else:
        _walk(op, iattr, a, rows_out, rows_in, False, False)


@njit(cache=True, error_model="numpy")
def _repeat_add(repeated, single, into_repeated):
    """Between a flat buffer and its repeats (a leading broadcast): repeated[j*n + e] += single[e]
    (into_repeated), else single[e] += repeated[j*n + e]; element loops, no views per repeat."""
    n = single.size
    for start in range(0, repeated.size, n):
        if into_repeated:
            for e in range(n):
                repeated[start + e] += single[e]
        else:
            for e in range(n):
                single[e] += repeated[start + e]


@njit(cache=True, error_model="numpy")
def mapped_linear(op, iattr, a, out_rows, in_rows, transpose):
    """The op's map over K columns: out += map(in) (tangents; these ops are linear) or, transposed,
    in += map^T(out) (cotangents)."""
    if leading_broadcast_block(op, iattr, a):
        _repeat_add(out_rows.reshape(out_rows.size), in_rows.reshape(in_rows.size), not transpose)
        return
    # the space walked is the output (PAD: the input); data flows into the other array when it is the
    # destination: PAD forward, the others transposed
    if op == oc.PAD:
        _walk(op, iattr, a, in_rows, out_rows, not transpose, True)
    else:
        _walk(op, iattr, a, out_rows, in_rows, transpose, True)


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
def moved_linear(op, iattr, a, out_rows, in_rows, transpose):
    """The runs' copy over K columns: out += moved(in) (tangents) or, transposed, in += the runs of out
    (cotangents)."""
    runs, length = block_runs(op, iattr, a)
    K = out_rows.shape[1]
    if transpose:
        for p in range(runs):
            s, d = run_starts(op, iattr, a, p)
            for e in range(length):
                for k in range(K):
                    in_rows[s + e, k] += out_rows[d + e, k]
    else:
        for p in range(runs):
            s, d = run_starts(op, iattr, a, p)
            for e in range(length):
                for k in range(K):
                    out_rows[d + e, k] += in_rows[s + e, k]
