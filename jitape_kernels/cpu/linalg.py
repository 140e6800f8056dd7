"""Compiled kernels of MATMUL, SOLVE and INV over batched 2-D blocks of the arena (BLAS/LAPACK via scipy):
forward, reverse, and the tangent and second-order kernels of forward-over-reverse Hessians.

Adjoints are [rows, K] with K contiguous, so a cotangent block of an (m, n)
matrix is an (m, n*K) matrix and most reverse products are one BLAS-3 call.
"""
import numpy as np
from numba import njit


@njit(cache=True, error_model="numpy")
def matmul_batch(batch_x, batch_w):
    """The product's batch: a batch of one broadcasts, so an empty batch on either side gives none."""
    return 0 if batch_x == 0 or batch_w == 0 else max(batch_x, batch_w)


@njit(cache=True, error_model="numpy")
def _matmul_operands(iattr, a, x, w, b):
    """Batch item b's (m, k) and (k, n) matrices and their batch indices (a batch of one is shared)."""
    batch_x, batch_w, m, k, n = iattr[a], iattr[a + 1], iattr[a + 2], iattr[a + 3], iattr[a + 4]
    bx = b if batch_x > 1 else 0
    bw = b if batch_w > 1 else 0
    return x[bx * m * k:(bx + 1) * m * k].reshape(m, k), w[bw * k * n:(bw + 1) * k * n].reshape(k, n), bx, bw


@njit(cache=True, error_model="numpy")
def matmul_forward(iattr, a, x, w, out):
    m, n = iattr[a + 2], iattr[a + 4]
    for b in range(matmul_batch(iattr[a], iattr[a + 1])):
        X, Wm, _, _ = _matmul_operands(iattr, a, x, w, b)
        np.dot(X, Wm, out[b * m * n:(b + 1) * m * n].reshape(m, n))


@njit(cache=True, error_model="numpy")
def matmul_reverse(iattr, a, x, w, g_out, g_x, g_w, want_x, want_w, assign_x=False, assign_w=False):
    """g_x += G W^T and g_w += X^T G per batch item (K columns). assign_x / assign_w: those rows are first
    written here and hold no values yet, so the first product into them is written in place (no zero pass,
    no temporary); a batch of one shared by the others' items accumulates after that."""
    batch_x, batch_w, m, k, n = iattr[a], iattr[a + 1], iattr[a + 2], iattr[a + 3], iattr[a + 4]
    K = g_out.shape[1]
    batch = matmul_batch(batch_x, batch_w)
    if batch == 0:          # no product: rows to be set are zeros
        if want_x and assign_x:
            g_x[:] = 0
        if want_w and assign_w:
            g_w[:] = 0
        return
    for b in range(batch):
        X, Wm, bx, bw = _matmul_operands(iattr, a, x, w, b)
        G = g_out[b * m * n:(b + 1) * m * n]
        if want_w:
            # dW[k, n*K] += X^T [k, m] @ G [m, n*K]
            GW = g_w[bw * k * n:(bw + 1) * k * n].reshape(k, n * K)
            if assign_w and (b == 0 or batch_w > 1):
                np.dot(X.T, G.reshape(m, n * K), GW)
            else:
                GW += np.dot(X.T, G.reshape(m, n * K))
        if want_x:
            GX = g_x[bx * m * k:(bx + 1) * m * k]
            first = assign_x and (b == 0 or batch_x > 1)
            if K == 1:
                GXm = GX.reshape(m, k)
                if first:
                    np.dot(G.reshape(m, n), Wm.T, GXm)
                else:
                    GXm += np.dot(G.reshape(m, n), Wm.T)
            else:
                if first:
                    GX[:] = 0
                _rows_times(Wm, G, GX, m, k, n)


# Below this inner dimension a (k, n) @ (n, K) product per row is mostly BLAS call overhead
# (W5b's 64x16 layer: 275 us per row, 207 us stacked); above it the stacked copies cost more.
STACKED_INNER_MAX = 16


@njit(cache=True, error_model="numpy")
def _rows_times(Wm, G, GX, m, k, n):
    """GX[i] (k, K) += W (k, n) @ G[i] (n, K) for every row i (the K-column products of matmul's rows)."""
    if n <= STACKED_INNER_MAX:
        _rows_times_stacked(Wm, G, GX, m, k, n)
    else:
        _rows_times_each(Wm, G, GX, m, k, n)


@njit(cache=True, error_model="numpy")
def _rows_times_each(Wm, G, GX, m, k, n):
    """As _rows_times, one BLAS call per row."""
    T = np.empty((k, G.shape[1]), G.dtype)
    for i in range(m):
        np.dot(Wm, G[i * n:(i + 1) * n], T)
        GX[i * k:(i + 1) * k] += T


@njit(cache=True, error_model="numpy")
def _rows_times_stacked(Wm, G, GX, m, k, n):
    """As _rows_times in one BLAS call: the rows' G blocks side by side as (n, m*K), W @ that, added back."""
    K = G.shape[1]
    g = G.reshape(G.size)
    gx = GX.reshape(GX.size)
    stacked = np.empty((n, m * K), G.dtype)
    s = stacked.reshape(stacked.size)
    for i in range(m):
        for q in range(n):
            src = (i * n + q) * K
            dst = q * m * K + i * K
            for c in range(K):
                s[dst + c] = g[src + c]
    t = np.dot(Wm, stacked).reshape(k * m * K)
    for i in range(m):
        for p in range(k):
            dst = (i * k + p) * K
            src = (p * m + i) * K
            for c in range(K):
                gx[dst + c] += t[src + c]


@njit(cache=True, error_model="numpy")
def _swap_leading(block, p, q, K):
    """A [p, q, K] block as a contiguous [q, p * K] matrix (its first two axes swapped)."""
    return np.ascontiguousarray(block.reshape(p, q, K).transpose(1, 0, 2)).reshape(q, p * K)


@njit(cache=True, error_model="numpy")
def matmul_tangent(iattr, a, x, w, t_x, t_w, t_out, has_x, has_w):
    """C' += X' W + X W' over K tangent columns."""
    m, k, n = iattr[a + 2], iattr[a + 3], iattr[a + 4]
    K = t_out.shape[1]
    for b in range(matmul_batch(iattr[a], iattr[a + 1])):
        X, Wm, bx, bw = _matmul_operands(iattr, a, x, w, b)
        T = t_out[b * m * n:(b + 1) * m * n]
        if has_w:
            Tm = T.reshape(m, n * K)
            Tm += np.dot(X, t_w[bw * k * n:(bw + 1) * k * n].reshape(k, n * K))
        if has_x:
            # C'[i] (n, K) += W^T (n, k) @ X'[i] (k, K) for every row i
            _rows_times(np.ascontiguousarray(Wm.T), t_x[bx * m * k:(bx + 1) * m * k], T, m, n, k)


@njit(cache=True, error_model="numpy")
def matmul_seeded_tangent(iattr, a, x, w, t_out, seeded_w, start):
    """C' += X W' (seeded_w) or X' W where that operand's tangent is the identity's columns
    start..start+K: one entry of the operand per column, so a copy instead of a product."""
    batch_x, batch_w, m, k, n = iattr[a], iattr[a + 1], iattr[a + 2], iattr[a + 3], iattr[a + 4]
    K = t_out.shape[1]
    per_item = k * n if seeded_w else m * k
    shared = (batch_w if seeded_w else batch_x) == 1
    # column c is the seeded operand's entry (item, row, col) = start + c
    item = np.empty(K, np.int64)
    row = np.empty(K, np.int64)
    col = np.empty(K, np.int64)
    for c in range(K):
        item[c], entry = divmod(start + c, per_item)
        row[c], col[c] = divmod(entry, n if seeded_w else k)
    for b in range(matmul_batch(batch_x, batch_w)):
        X, Wm, _, _ = _matmul_operands(iattr, a, x, w, b)
        for i in range(m):
            for c in range(K):
                if shared or item[c] == b:
                    if seeded_w:
                        # W' entry (row, col) = 1: C'[i, col] += X[i, row]
                        t_out[(b * m + i) * n + col[c], c] += X[i, row[c]]
                    elif row[c] == i:
                        # X' entry (i, col) = 1: C'[i, j] += W[col, j]
                        for j in range(n):
                            t_out[(b * m + i) * n + j, c] += Wm[col[c], j]


@njit(cache=True, error_model="numpy")
def matmul_second(iattr, a, g_out, t_x, t_w, gt_x, gt_w):
    """With both operands active: dX's tangent += G W'^T and dW's tangent += X'^T G (G the one-column cotangent)."""
    m, k, n = iattr[a + 2], iattr[a + 3], iattr[a + 4]
    batch_x, batch_w = iattr[a], iattr[a + 1]
    K = gt_x.shape[1]
    for b in range(matmul_batch(batch_x, batch_w)):
        bx = b if batch_x > 1 else 0
        bw = b if batch_w > 1 else 0
        G = np.ascontiguousarray(g_out[b * m * n:(b + 1) * m * n]).reshape(m, n)
        # dX'[i, l, :] += sum_j G[i, j] W'[l, j, :]
        GX = gt_x[bx * m * k:(bx + 1) * m * k].reshape(m, k * K)
        GX += np.dot(G, _swap_leading(t_w[bw * k * n:(bw + 1) * k * n], k, n, K))
        # dW'[l, j, :] += sum_i X'[i, l, :] G[i, j]
        P = np.dot(np.ascontiguousarray(G.T), t_x[bx * m * k:(bx + 1) * m * k].reshape(m, k * K))
        GW = gt_w[bw * k * n:(bw + 1) * k * n]
        GW += _swap_leading(P, n, k, K).reshape(k * n, K)


@njit(cache=True, error_model="numpy")
def solve_forward(iattr, a, A, B, out):
    batch, n, m = iattr[a], iattr[a + 1], iattr[a + 2]
    for b in range(batch):
        Ab = A[b * n * n:(b + 1) * n * n].reshape(n, n)
        Bb = B[b * n * m:(b + 1) * n * m].reshape(n, m)
        out[b * n * m:(b + 1) * n * m] = np.linalg.solve(Ab, Bb).ravel()


@njit(cache=True, error_model="numpy")
def solve_reverse(iattr, a, A, y, g_out, g_A, g_B, want_A, want_B):
    """y = A^-1 B: dB = A^-T dY (all K columns in one solve); dA = -dB y^T."""
    batch, n, m = iattr[a], iattr[a + 1], iattr[a + 2]
    K = g_out.shape[1]
    for b in range(batch):
        Ab = A[b * n * n:(b + 1) * n * n].reshape(n, n)
        Y = y[b * n * m:(b + 1) * n * m].reshape(n, m)
        G = g_out[b * n * m:(b + 1) * n * m].reshape(n, m * K)
        GB = np.ascontiguousarray(np.linalg.solve(np.ascontiguousarray(Ab.T), np.ascontiguousarray(G)))
        if want_B:
            GBm = g_B[b * n * m:(b + 1) * n * m].reshape(n, m * K)
            GBm += GB
        if want_A:
            GA = g_A[b * n * n:(b + 1) * n * n]
            for i in range(n):
                # dA[i, j, :] -= sum_c Y[j, c] dB[i, c, :]
                GA[i * n:(i + 1) * n] -= np.dot(Y, GB[i].reshape(m, K))


# The tangent and second-order kernels of SOLVE and INV call the forward and reverse kernels above
# with the argument types the interpreters use (so those are compiled once) and do the remaining
# contractions in loops: systems here are small, and every new np.linalg/np.dot signature or
# literal-argument specialization adds seconds of compile time.

@njit(cache=True, error_model="numpy")
def solve_tangent(iattr, a, A, y, t_A, t_B, t_out, has_A, has_B):
    """Y = A^-1 B: Y' += A^-1 (B' - A' Y), all K columns in one solve."""
    batch, n, m = iattr[a], iattr[a + 1], iattr[a + 2]
    K = t_out.shape[1]
    R = np.zeros((batch * n * m, K), t_out.dtype)
    if has_B:
        R += t_B
    if has_A:
        for b in range(batch):
            for i in range(n):
                for j in range(n):
                    for c in range(m):
                        yj = y[(b * n + j) * m + c]
                        for k in range(K):
                            R[(b * n + i) * m + c, k] -= t_A[(b * n + i) * n + j, k] * yj
    solved = np.empty(R.size, t_out.dtype)
    # each batch item of R is an [n, m*K] right-hand side
    solve_forward(np.array([batch, n, m * K]), a - a, A, R.reshape(R.size), solved)   # a - a: not a literal
    t_out += solved.reshape(t_out.shape)


@njit(cache=True, error_model="numpy")
def solve_second(iattr, a, A, y, g_out, t_A, t_out, gt_A, gt_B, want_B):
    """With A active, differentiate dB = A^-T G and dA = -dB Y^T along A' and Y' (G the one-column
    cotangent): dB' = A^-T M with M = -A'^T dB (solve_reverse applied to M), and dA' gains -dB Y'^T."""
    batch, n, m = iattr[a], iattr[a + 1], iattr[a + 2]
    K = gt_A.shape[1]
    dB = np.zeros((batch * n * m, 1), gt_A.dtype)
    # flags computed at run time: literal True/False would compile new specializations of solve_reverse
    no = K < 0
    solve_reverse(iattr, a, A, y, g_out, gt_A[0:0], dB, no, not no)
    M = np.zeros((batch * n * m, K), gt_A.dtype)
    for b in range(batch):
        for j in range(n):
            for c in range(m):
                d = dB[(b * n + j) * m + c, 0]
                for i in range(n):
                    for k in range(K):
                        M[(b * n + i) * m + c, k] -= t_A[(b * n + j) * n + i, k] * d
    solve_reverse(iattr, a, A, y, M, gt_A, gt_B, not no, want_B)
    for b in range(batch):
        for i in range(n):
            for c in range(m):
                d = dB[(b * n + i) * m + c, 0]
                for j in range(n):
                    for k in range(K):
                        gt_A[(b * n + i) * n + j, k] -= d * t_out[(b * n + j) * m + c, k]


@njit(cache=True, error_model="numpy")
def inv_forward(iattr, a, A, out):
    batch, n = iattr[a], iattr[a + 1]
    for b in range(batch):
        out[b * n * n:(b + 1) * n * n] = np.linalg.inv(A[b * n * n:(b + 1) * n * n].reshape(n, n)).ravel()


@njit(cache=True, error_model="numpy")
def inv_reverse(iattr, a, y, g_out, g_A):
    """Y = A^-1: dA = -Y^T dY Y^T, one cotangent column at a time."""
    batch, n = iattr[a], iattr[a + 1]
    K = g_out.shape[1]
    for b in range(batch):
        Yt = np.ascontiguousarray(y[b * n * n:(b + 1) * n * n].reshape(n, n).T)
        for k in range(K):
            G = np.ascontiguousarray(g_out[b * n * n:(b + 1) * n * n, k]).reshape(n, n)
            g_A[b * n * n:(b + 1) * n * n, k] -= np.dot(np.dot(Yt, G), Yt).ravel()


@njit(cache=True, error_model="numpy")
def _transposed(y, batch, n):
    """The batch of n x n matrices in y, each transposed, flat."""
    out = np.empty(y.size, y.dtype)
    for b in range(batch):
        for i in range(n):
            for j in range(n):
                out[(b * n + j) * n + i] = y[(b * n + i) * n + j]
    return out


@njit(cache=True, error_model="numpy")
def inv_tangent(iattr, a, y, t_A, t_out):
    """Y = A^-1: Y' += -Y A' Y, which is inv_reverse's -Z^T A' Z^T with Z = Y^T."""
    inv_reverse(iattr, a, _transposed(y, iattr[a], iattr[a + 1]), t_A, t_out)


@njit(cache=True, error_model="numpy")
def inv_second(iattr, a, y, g_out, t_A, gt_A):
    """Differentiate dA = -Y^T G Y^T along A' (G the one-column cotangent, Y' = -Y A' Y):
    dA' += Y^T (A'^T Y^T G + G Y^T A'^T) Y^T, which is inv_reverse applied to -(A'^T P + Q A'^T)."""
    batch, n = iattr[a], iattr[a + 1]
    K = gt_A.shape[1]
    M = np.zeros((batch * n * n, K), gt_A.dtype)
    for b in range(batch):
        o = b * n * n
        P = np.zeros((n, n))     # Y^T G
        Q = np.zeros((n, n))     # G Y^T
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
    inv_reverse(iattr, a, y, M, gt_A)
