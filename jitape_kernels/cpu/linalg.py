"""Compiled kernels of MATMUL, SOLVE and INV over batched 2-D blocks of the arena: forward, reverse, and the
tangent and second-order kernels of forward-over-reverse Hessians, with their scratch rules (temps_entries).

Adjoints are [rows, K] with K contiguous, so a cotangent block of an (m, n)
matrix is an (m, n*K) matrix and most reverse products are one BLAS-3 call,
added in place (blas.strided_gemm); solves and inverses factor copies in the
sweep's scratch (blas.solve_columns), as numpy does, so nothing is allocated here.
A MATMUL with inner > 1 keeps its items interleaved with the rows of its left
operand and of its result (item_start): each item is still one BLAS call, whose
rows lie inner times further apart.
"""
import numpy as np

from .. import njit, opcodes as oc
from .blas import gemm, solve_columns, strided_gemm
from .elementwise import _put


@njit(cache=True, error_model="numpy")
def matmul_batch(batch_x, batch_w):
    """The product's batch: a batch of one broadcasts, so an empty batch on either side gives none."""
    return 0 if batch_x == 0 or batch_w == 0 else max(batch_x, batch_w)


@njit(cache=True, error_model="numpy", inline="always")
def item_start(b, inner, rows, cols):
    """Where batch item b's rows x cols matrix starts in an operand stored as [outer, rows, inner, cols] (MATMUL's
    `inner`: 1 stores the items one after another); the matrix's rows lie inner * cols entries apart."""
    return (b // inner) * rows * inner * cols + (b % inner) * cols


@njit(cache=True, error_model="numpy")
def _matmul_operands(iattr, a, x, w, b):
    """Batch item b's (m, k) and (k, n) matrices (inner = 1) and their batch indices (a batch of one is shared)."""
    batch_x, batch_w, m, k, n = iattr[a], iattr[a + 1], iattr[a + 2], iattr[a + 3], iattr[a + 4]
    bx = b if batch_x > 1 else 0
    bw = b if batch_w > 1 else 0
    return x[bx * m * k:(bx + 1) * m * k].reshape(m, k), w[bw * k * n:(bw + 1) * k * n].reshape(k, n), bx, bw


@njit(cache=True, error_model="numpy")
def matmul_forward(iattr, a, x, w, out):
    m, k, n, inner = iattr[a + 2], iattr[a + 3], iattr[a + 4], iattr[a + 5]
    for b in range(matmul_batch(iattr[a], iattr[a + 1])):
        if inner > 1:
            # numpy's matmul over the strided views (jitape.ops.linalg) is one gemm per item, rows ld apart
            strided_gemm(1.0, x[item_start(b, inner, m, k):], inner * k, False, w[b * k * n:(b + 1) * k * n], n, False,
                         0.0, out[item_start(b, inner, m, n):], inner * n, m, n, k)
            continue
        X, Wm, _, _ = _matmul_operands(iattr, a, x, w, b)
        # numba's np.dot calls BLAS as numpy's matmul does (gemv for a vector operand), so a replayed product
        # equals the eager one bit for bit
        np.dot(X, Wm, out[b * m * n:(b + 1) * m * n].reshape(m, n))


@njit(cache=True, error_model="numpy")
def matmul_reverse(iattr, a, x, w, g_out, g_x, g_w, want_x, want_w, temps, assign_x=False, assign_w=False):
    """g_x += G W^T and g_w += X^T G per batch item (K columns), each product added in place (gemm). assign_x /
    assign_w: those rows are first written here and hold no values yet, so the first product into them is
    written, not added; a batch of one shared by the others' items accumulates after that. temps: see temps_entries."""
    batch_x, batch_w, m, k, n, inner = iattr[a], iattr[a + 1], iattr[a + 2], iattr[a + 3], iattr[a + 4], iattr[a + 5]
    K = g_out.shape[1]
    batch = matmul_batch(batch_x, batch_w)
    if batch == 0:          # no product: rows to be set are zeros
        if want_x and assign_x:
            g_x[:] = 0
        if want_w and assign_w:
            g_w[:] = 0
        return
    g, gx, gw = g_out.reshape(g_out.size), g_x.reshape(g_x.size), g_w.reshape(g_w.size)
    for b in range(batch):
        bx = b if batch_x > 1 else 0
        bw = b if batch_w > 1 else 0
        xs, gs = item_start(bx, inner, m, k), item_start(b, inner, m, n) * K
        if want_w:
            # dW[k, n*K] += X^T [k, m] @ G [m, n*K]
            first = assign_w and (b == 0 or batch_w > 1)
            strided_gemm(1.0, x[xs:], inner * k, True, g[gs:], inner * n * K, False, 0.0 if first else 1.0,
                         gw[bw * k * n * K:], n * K, k, n * K, m)
        if want_x:
            first = assign_x and (b == 0 or batch_x > 1)
            if K == 1 and inner > 1:
                # G W^T with W^T copied (n k entries of temps): OpenBLAS serves a product with a transposed right
                # operand and a wide result by its general path, which first zeroes a result it sets, row by
                # strided row; the plain product goes to its small-matrix kernel, which writes each entry once
                wt = temps[:n * k]
                for p in range(k):
                    for q in range(n):
                        wt[q * k + p] = w[(bw * k + p) * n + q]
                strided_gemm(1.0, g[gs:], inner * n, False, wt, k, False, 0.0 if first else 1.0, gx[xs:], inner * k,
                             m, k, n)
            elif K == 1:
                strided_gemm(1.0, g[gs:], inner * n, False, w[bw * k * n:], n, True, 0.0 if first else 1.0,
                             gx[xs:], inner * k, m, k, n)
            else:
                _rows_times(w[bw * k * n:(bw + 1) * k * n].reshape(k, n), False, g, gs, inner * n * K, gx, xs * K,
                            inner * k * K, m, k, n, K, temps, first)


# A (k, n) @ (n, K) product per row of fewer multiply-adds than STACKED_WORK_MAX, with n at most
# STACKED_INNER_MAX, is mostly BLAS call overhead: the rows are stacked into one product (float32, 10,000 rows
# of 16x16 @ 16x2: 1.03 ms stacked, 1.44 per row; 1,000 of 3x3 @ 3x3: 0.026 / 0.070). Larger rows run faster
# one BLAS call each than through the stacked copies (W5b's 64x16 @ 16x16 layer, 256 rows: 0.38 ms stacked,
# 0.097 per row; 256 of 16x4 @ 4x16: 0.060 / 0.023).
STACKED_INNER_MAX = 16
STACKED_WORK_MAX = 1000


@njit(cache=True, error_model="numpy")
def _rows_times(Wm, transposed, g, g_start, g_ld, gx, gx_start, gx_ld, m, k, n, K, temps, assign):
    """GX[i] (k, K) += op(W) (k, n) @ G[i] (n, K) for every row i < m (the K-column products of matmul's rows),
    where G[i] starts at g[g_start + i * g_ld] and GX[i] at gx[gx_start + i * gx_ld]; op(W) = Wm^T when
    transposed; assign: GX's first write (set, not added to). temps: (n + k) m K entries when the rows are
    stacked (see STACKED_WORK_MAX)."""
    if n <= STACKED_INNER_MAX and k * n * K < STACKED_WORK_MAX:
        _rows_times_stacked(Wm, transposed, g, g_start, g_ld, gx, gx_start, gx_ld, m, k, n, K, temps, assign)
        return
    for i in range(m):
        strided_gemm(1.0, Wm.reshape(Wm.size), Wm.shape[1], transposed, g[g_start + i * g_ld:], K, False,
                     0.0 if assign else 1.0, gx[gx_start + i * gx_ld:], K, k, K, n)


@njit(cache=True, error_model="numpy")
def _rows_times_stacked(Wm, transposed, g, g_start, g_ld, gx, gx_start, gx_ld, m, k, n, K, temps, assign):
    """As _rows_times in one BLAS call: the rows' G blocks side by side as (n, m*K), W @ that, added back."""
    s = temps[:n * m * K]
    for i in range(m):
        for q in range(n):
            src = g_start + i * g_ld + q * K
            dst = q * m * K + i * K
            for c in range(K):
                s[dst + c] = g[src + c]
    t = temps[n * m * K:(n + k) * m * K]
    gemm(1.0, Wm, transposed, s.reshape(n, m * K), False, 0.0, t.reshape(k, m * K))
    for i in range(m):
        for p in range(k):
            dst = gx_start + i * gx_ld + p * K
            src = (p * m + i) * K
            for c in range(K):
                _put(gx, dst + c, t[src + c], assign)


@njit(cache=True, error_model="numpy")
def matmul_tangent(iattr, a, x, w, t_x, t_w, t_out, has_x, has_w, temps):
    """C' += X' W + X W' over K tangent columns."""
    batch_x, batch_w, m, k, n, inner = iattr[a], iattr[a + 1], iattr[a + 2], iattr[a + 3], iattr[a + 4], iattr[a + 5]
    K = t_out.shape[1]
    to, tx, tw = t_out.reshape(t_out.size), t_x.reshape(t_x.size), t_w.reshape(t_w.size)
    for b in range(matmul_batch(batch_x, batch_w)):
        bx = b if batch_x > 1 else 0
        bw = b if batch_w > 1 else 0
        xs, cs = item_start(bx, inner, m, k), item_start(b, inner, m, n)
        if has_w:
            strided_gemm(1.0, x[xs:], inner * k, False, tw[bw * k * n * K:], n * K, False, 1.0, to[cs * K:],
                         inner * n * K, m, n * K, k)
        if has_x:
            # C'[i] (n, K) += W^T (n, k) @ X'[i] (k, K) for every row i
            _rows_times(w[bw * k * n:(bw + 1) * k * n].reshape(k, n), True, tx, xs * K, inner * k * K, to, cs * K,
                        inner * n * K, m, n, k, K, temps, K < 0)      # K < 0: False


@njit(cache=True, error_model="numpy")
def matmul_seeded_tangent(iattr, a, x, w, t_out, seeded_w, start):
    """C' += X W' (seeded_w) or X' W where that operand's tangent is the identity's columns
    start..start+K: one entry of the operand per column, so a copy instead of a product. Column c is the
    operand's entry start + c (item, row, col in row-major order); the loops write C' ([entries, K]) row after
    row, its columns innermost."""
    batch_x, batch_w, m, k, n, inner = iattr[a], iattr[a + 1], iattr[a + 2], iattr[a + 3], iattr[a + 4], iattr[a + 5]
    K = t_out.shape[1]
    if inner > 1:
        _strided_seeded_tangent(matmul_batch(batch_x, batch_w), m, k, n, inner, x, w, t_out, seeded_w, start)
        return
    cols = n if seeded_w else k
    per_item = (k if seeded_w else m) * cols
    shared = (batch_w if seeded_w else batch_x) == 1
    for b in range(matmul_batch(batch_x, batch_w)):
        # the columns whose entries lie in batch item b's matrix (a shared operand's item 0 serves every b)
        first = 0 if shared else min(max(b * per_item - start, 0), K)
        stop = K if shared else min(max((b + 1) * per_item - start, 0), K)
        if first == stop:
            continue
        X, Wm, _, _ = _matmul_operands(iattr, a, x, w, b)
        row0, col0 = divmod((start + first) % per_item, cols)
        if seeded_w and n == 1:
            # a matrix-vector product: column c is W's row row0 + c - first
            for i in range(m):
                target = t_out[b * m + i, first:stop]
                source = X[i, row0:row0 + stop - first]
                for c in range(target.size):
                    target[c] += source[c]
        elif seeded_w:
            # W' entry (row, col) = 1: C'[i, col] += X[i, row]
            for i in range(m):
                row, col = row0, col0
                for c in range(first, stop):
                    t_out[(b * m + i) * n + col, c] += X[i, row]
                    col += 1
                    if col == n:
                        col = 0
                        row += 1
        else:
            # X' entry (row, col) = 1: C'[row, j] += W[col, j], for the run of columns sharing a row
            row, col, c = row0, col0, first
            while c < stop:
                run = min(stop - c, k - col)
                for j in range(n):
                    target = t_out[(b * m + row) * n + j]
                    for q in range(run):
                        target[c + q] += Wm[col + q, j]
                c += run
                col = 0
                row += 1


@njit(cache=True, error_model="numpy")
def _strided_seeded_tangent(batch, m, k, n, inner, x, w, t_out, seeded_w, start):
    """matmul_seeded_tangent for inner > 1 (X and C stored [outer, m, inner, k] and [outer, m, inner, n]): column
    c is the seeded operand's entry start + c in that storage order, one product row or column per entry."""
    for c in range(t_out.shape[1]):
        e = start + c
        if seeded_w and e < batch * k * n:
            # W' entry (b, row, col) = 1: C'[b, i, col] += X[b, i, row]
            b, row, col = e // (k * n), e // n % k, e % n
            for i in range(m):
                t_out[item_start(b, inner, m, n) + i * inner * n + col, c] += x[item_start(b, inner, m, k)
                                                                                + i * inner * k + row]
        elif not seeded_w and e < batch * m * k:
            # X' entry (outer, i, item, col) = 1: C'[b, i, j] += W[b, col, j]
            i, col = e // (inner * k) % m, e % k
            b = e // (m * inner * k) * inner + e // k % inner
            for j in range(n):
                t_out[item_start(b, inner, m, n) + i * inner * n + j, c] += w[(b * k + col) * n + j]


@njit(cache=True, error_model="numpy")
def matmul_second(iattr, a, g_out, t_x, t_w, gt_x, gt_w, temps):
    """With both operands active: dX's tangent += G W'^T and dW's tangent += X'^T G (G the one-column cotangent).
    temps: n k K entries."""
    batch_x, batch_w, m, k, n, inner = iattr[a], iattr[a + 1], iattr[a + 2], iattr[a + 3], iattr[a + 4], iattr[a + 5]
    K = gt_x.shape[1]
    swapped = temps[:n * k * K]
    g, tx, gtx = g_out.reshape(g_out.size), t_x.reshape(t_x.size), gt_x.reshape(gt_x.size)
    for b in range(matmul_batch(batch_x, batch_w)):
        bx = b if batch_x > 1 else 0
        bw = b if batch_w > 1 else 0
        gs, xs = item_start(b, inner, m, n), item_start(bx, inner, m, k) * K
        # dX'[i, l, :] += sum_j G[i, j] W'[l, j, :]: G (m, n) @ W' with its first two axes swapped (n, k*K)
        tw = t_w[bw * k * n:(bw + 1) * k * n]
        for l in range(k):
            for j in range(n):
                for c in range(K):
                    swapped[(j * k + l) * K + c] = tw[l * n + j, c]
        strided_gemm(1.0, g[gs:], inner * n, False, swapped, k * K, False, 1.0, gtx[xs:], inner * k * K, m, k * K, n)
        # dW'[l, j, :] += sum_i X'[i, l, :] G[i, j]: P = G^T (n, m) @ X' (m, k*K), its first two axes swapped
        strided_gemm(1.0, g[gs:], inner * n, True, tx[xs:], inner * k * K, False, 0.0, swapped, k * K, n, k * K, m)
        GW = gt_w[bw * k * n:(bw + 1) * k * n]
        for l in range(k):
            for j in range(n):
                for c in range(K):
                    GW[l * n + j, c] += swapped[(j * k + l) * K + c]


@njit(cache=True, error_model="numpy")
def _rows_to_columns(rows, n, q, columns):
    """columns (column-major n x q) = rows (row-major [n, q], flat)."""
    for i in range(n):
        for c in range(q):
            columns[c * n + i] = rows[i * q + c]


@njit(cache=True, error_model="numpy")
def solve_forward(iattr, a, A, B, out, temps):
    """Y = A^-1 B per batch item, as numpy (gesv of column-major copies). temps: see temps_entries."""
    batch, n, m = iattr[a], iattr[a + 1], iattr[a + 2]
    columns = temps[:n * m]
    for b in range(batch):
        _rows_to_columns(B[b * n * m:(b + 1) * n * m], n, m, columns)
        solve_columns(A[b * n * n:(b + 1) * n * n].reshape(n, n), False, columns, temps[n * m:])
        Y = out[b * n * m:(b + 1) * n * m]
        for i in range(n):
            for c in range(m):
                Y[i * m + c] = columns[c * n + i]


@njit(cache=True, error_model="numpy")
def solve_reverse(iattr, a, A, y, g_out, g_A, g_B, want_A, want_B, temps):
    """y = A^-1 B: dB = A^-T dY (all K columns in one solve); dA = -dB y^T. temps: see temps_entries."""
    batch, n, m = iattr[a], iattr[a + 1], iattr[a + 2]
    K = g_out.shape[1]
    q = m * K
    columns = temps[:n * q]             # dB, column-major (n, m*K)
    row = temps[n * q:n * q + q]        # one row of dB
    for b in range(batch):
        _rows_to_columns(g_out[b * n * m:(b + 1) * n * m].reshape(n * q), n, q, columns)
        solve_columns(A[b * n * n:(b + 1) * n * n].reshape(n, n), True, columns, temps[n * q + q:])
        if want_B:
            GB = g_B[b * n * m:(b + 1) * n * m].reshape(n * q)
            for i in range(n):
                for c in range(q):
                    GB[i * q + c] += columns[c * n + i]
        if want_A:
            Y = y[b * n * m:(b + 1) * n * m].reshape(n, m)
            for i in range(n):
                for c in range(q):
                    row[c] = columns[c * n + i]
                # dA[i, j, :] -= sum_c Y[j, c] dB[i, c, :]
                gemm(-1.0, Y, False, row.reshape(m, K), False, 1.0, g_A[(b * n + i) * n:(b * n + i + 1) * n])


# The tangent and second-order kernels of SOLVE and INV call the forward and reverse kernels above
# with the argument types the interpreters use (so those are compiled once) and do the remaining
# contractions in loops: systems here are small, and every new signature or literal-argument
# specialization adds seconds of compile time.

@njit(cache=True, error_model="numpy")
def solve_tangent(iattr, a, A, y, t_A, t_B, t_out, has_A, has_B, temps):
    """Y = A^-1 B: Y' += A^-1 (B' - A' Y), all K columns of a batch item in one solve. temps: see temps_entries."""
    batch, n, m = iattr[a], iattr[a + 1], iattr[a + 2]
    K = t_out.shape[1]
    q = m * K
    columns = temps[:n * q]             # B' - A' Y, column-major (n, m*K)
    for b in range(batch):
        for i in range(n):
            for c in range(m):
                for k in range(K):
                    r = t_B[(b * n + i) * m + c, k] if has_B else 0.0
                    if has_A:
                        for j in range(n):
                            r -= t_A[(b * n + i) * n + j, k] * y[(b * n + j) * m + c]
                    columns[(c * K + k) * n + i] = r
        solve_columns(A[b * n * n:(b + 1) * n * n].reshape(n, n), False, columns, temps[n * q:])
        for i in range(n):
            for c in range(m):
                for k in range(K):
                    t_out[(b * n + i) * m + c, k] += columns[(c * K + k) * n + i]


@njit(cache=True, error_model="numpy")
def solve_second(iattr, a, A, y, g_out, t_A, t_out, gt_A, gt_B, want_B, temps):
    """With A active, differentiate dB = A^-T G and dA = -dB Y^T along A' and Y' (G the one-column
    cotangent): dB' = A^-T M with M = -A'^T dB (solve_reverse applied to M), and dA' gains -dB Y'^T.
    temps: see temps_entries."""
    batch, n, m = iattr[a], iattr[a + 1], iattr[a + 2]
    K = gt_A.shape[1]
    size = batch * n * m
    dB = temps[:size].reshape(size, 1)
    M = temps[size:size + size * K].reshape(size, K)
    rest = temps[size + size * K:]
    dB[:] = 0
    # flags computed at run time: literal True/False would compile new specializations of solve_reverse
    no = K < 0
    solve_reverse(iattr, a, A, y, g_out, gt_A[0:0], dB, no, not no, rest)
    M[:] = 0
    for b in range(batch):
        for j in range(n):
            for c in range(m):
                d = dB[(b * n + j) * m + c, 0]
                for i in range(n):
                    for k in range(K):
                        M[(b * n + i) * m + c, k] -= t_A[(b * n + j) * n + i, k] * d
    solve_reverse(iattr, a, A, y, M, gt_A, gt_B, not no, want_B, rest)
    for b in range(batch):
        for i in range(n):
            for c in range(m):
                d = dB[(b * n + i) * m + c, 0]
                for j in range(n):
                    for k in range(K):
                        gt_A[(b * n + i) * n + j, k] -= d * t_out[(b * n + j) * m + c, k]


@njit(cache=True, error_model="numpy")
def inv_forward(iattr, a, A, out, temps):
    """Y = A^-1 per batch item, as numpy (gesv of a column-major copy with the identity). temps: see temps_entries."""
    batch, n = iattr[a], iattr[a + 1]
    columns = temps[:n * n]
    for b in range(batch):
        columns[:] = 0
        for i in range(n):
            columns[i * n + i] = 1
        solve_columns(A[b * n * n:(b + 1) * n * n].reshape(n, n), False, columns, temps[n * n:])
        _rows_to_columns(columns, n, n, out[b * n * n:(b + 1) * n * n])


@njit(cache=True, error_model="numpy")
def inv_reverse(iattr, a, y, g_out, g_A, temps):
    """Y = A^-1: dA = -Y^T dY Y^T, one cotangent column at a time. temps: 3 n^2 entries."""
    batch, n = iattr[a], iattr[a + 1]
    K = g_out.shape[1]
    G = temps[:n * n]
    T = temps[n * n:2 * n * n].reshape(n, n)
    U = temps[2 * n * n:3 * n * n]
    for b in range(batch):
        Y = y[b * n * n:(b + 1) * n * n].reshape(n, n)
        for k in range(K):
            for e in range(n * n):
                G[e] = g_out[b * n * n + e, k]
            gemm(1.0, Y, True, G.reshape(n, n), False, 0.0, T)        # Y^T dY
            gemm(1.0, T, False, Y, True, 0.0, U.reshape(n, n))      # Y^T dY Y^T
            for e in range(n * n):
                g_A[b * n * n + e, k] -= U[e]


@njit(cache=True, error_model="numpy")
def inv_tangent(iattr, a, y, t_A, t_out, temps):
    """Y = A^-1: Y' += -Y A' Y, which is inv_reverse's -Z^T A' Z^T with Z = Y^T. temps: see temps_entries."""
    batch, n = iattr[a], iattr[a + 1]
    transposed = temps[:batch * n * n]
    for b in range(batch):
        for i in range(n):
            for j in range(n):
                transposed[(b * n + j) * n + i] = y[(b * n + i) * n + j]
    inv_reverse(iattr, a, transposed, t_A, t_out, temps[batch * n * n:])


@njit(cache=True, error_model="numpy")
def inv_second(iattr, a, y, g_out, t_A, gt_A, temps):
    """Differentiate dA = -Y^T G Y^T along A' (G the one-column cotangent, Y' = -Y A' Y):
    dA' += Y^T (A'^T Y^T G + G Y^T A'^T) Y^T, which is inv_reverse applied to -(A'^T P + Q A'^T).
    temps: see temps_entries."""
    batch, n = iattr[a], iattr[a + 1]
    K = gt_A.shape[1]
    size = batch * n * n
    M = temps[:size * K].reshape(size, K)
    P = temps[size * K:size * K + n * n].reshape(n, n)      # Y^T G
    Q = temps[size * K + n * n:size * K + 2 * n * n].reshape(n, n)      # G Y^T
    M[:] = 0
    for b in range(batch):
        o = b * n * n
        P[:] = 0
        Q[:] = 0
        for i in range(n):
            for j in range(n):
                for l in range(n):
                    P[i, j] += y[o + l * n + i] * g_out[o + l * n + j, 0]
                    Q[i, j] += g_out[o + i * n + l, 0] * y[o + j * n + l]
        for i in range(n):
            for j in range(n):
                for l in range(n):
                    for k in range(K):
                        # (A'^T P)[i, j] = sum_l A'[l, i] P[l, j];  (Q A'^T)[i, j] = sum_l Q[i, l] A'[j, l]
                        M[o + i * n + j, k] -= t_A[o + l * n + i, k] * P[l, j] + Q[i, l] * t_A[o + j * n + l, k]
    inv_reverse(iattr, a, y, M, gt_A, temps[size * K + 2 * n * n:])


@njit(cache=True, error_model="numpy")
def temps_entries(op, iattr, a):
    """(fixed, per column): the kernels above need at most fixed + K * per column entries of `temps` for op in a
    sweep of K columns (jitape_kernels.cpu.interpreter.planned_temps plans one buffer for a whole Program)."""
    if op == oc.MATMUL:
        m, k, n = iattr[a + 2], iattr[a + 3], iattr[a + 4]
        stacked = (n + k) * m if min(n, k) <= STACKED_INNER_MAX else 0     # reverse: inner n; tangent: k
        return 0, max(stacked, n * k)
    if op == oc.SOLVE:
        batch, n, m = iattr[a], iattr[a + 1], iattr[a + 2]
        # second order: dB, M and then the reverse kernel's columns, row and factors (which cover the others')
        return batch * n * m + n * n + 2 * n, batch * n * m + n * m + m
    if op == oc.INV:
        batch, n = iattr[a], iattr[a + 1]
        return batch * n * n + 5 * n * n + 2 * n, batch * n * n
    return 0, 0
