"""Compiled kernels of MATMUL, SOLVE and INV over batched 2-D blocks of the arena (BLAS/LAPACK via scipy).

Adjoints are [rows, K] with K contiguous, so a cotangent block of an (m, n)
matrix is an (m, n*K) matrix and most reverse products are one BLAS-3 call.
"""
import numpy as np
from numba import njit


@njit(cache=True)
def _matmul_operands(iattr, a, x, w, b):
    """Batch item b's (m, k) and (k, n) matrices and their batch indices (a batch of one is shared)."""
    batch_x, batch_w, m, k, n = iattr[a], iattr[a + 1], iattr[a + 2], iattr[a + 3], iattr[a + 4]
    bx = b if batch_x > 1 else 0
    bw = b if batch_w > 1 else 0
    return x[bx * m * k:(bx + 1) * m * k].reshape(m, k), w[bw * k * n:(bw + 1) * k * n].reshape(k, n), bx, bw


@njit(cache=True)
def matmul_forward(iattr, a, x, w, out):
    m, n = iattr[a + 2], iattr[a + 4]
    for b in range(max(iattr[a], iattr[a + 1])):
        X, Wm, _, _ = _matmul_operands(iattr, a, x, w, b)
        out[b * m * n:(b + 1) * m * n] = np.dot(X, Wm).ravel()


@njit(cache=True)
def matmul_reverse(iattr, a, x, w, g_out, g_x, g_w, want_x, want_w):
    m, k, n = iattr[a + 2], iattr[a + 3], iattr[a + 4]
    K = g_out.shape[1]
    for b in range(max(iattr[a], iattr[a + 1])):
        X, Wm, bx, bw = _matmul_operands(iattr, a, x, w, b)
        G = g_out[b * m * n:(b + 1) * m * n]
        if want_w:
            # dW[k, n*K] += X^T [k, m] @ G [m, n*K]
            GW = g_w[bw * k * n:(bw + 1) * k * n].reshape(k, n * K)
            GW += np.dot(X.T, G.reshape(m, n * K))
        if want_x:
            GX = g_x[bx * m * k:(bx + 1) * m * k]
            if K == 1:
                GXm = GX.reshape(m, k)
                GXm += np.dot(G.reshape(m, n), Wm.T)
            elif n <= STACKED_INNER_MAX:
                _rows_times_stacked(Wm, G, GX, m, k, n)
            else:
                _rows_times(Wm, G, GX, m, k, n)


# Below this inner dimension a (k, n) @ (n, K) product per row is mostly BLAS call overhead
# (W5b's 64x16 layer: 275 us per row, 207 us stacked); above it the stacked copies cost more.
STACKED_INNER_MAX = 16


@njit(cache=True)
def _rows_times(Wm, G, GX, m, k, n):
    """dX[i] (k, K) += W (k, n) @ G[i] (n, K) for every row i, one BLAS call each."""
    T = np.empty((k, G.shape[1]), G.dtype)
    for i in range(m):
        np.dot(Wm, G[i * n:(i + 1) * n], T)
        GX[i * k:(i + 1) * k] += T


@njit(cache=True)
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


@njit(cache=True)
def solve_forward(iattr, a, A, B, out):
    batch, n, m = iattr[a], iattr[a + 1], iattr[a + 2]
    for b in range(batch):
        Ab = A[b * n * n:(b + 1) * n * n].reshape(n, n)
        Bb = B[b * n * m:(b + 1) * n * m].reshape(n, m)
        out[b * n * m:(b + 1) * n * m] = np.linalg.solve(Ab, Bb).ravel()


@njit(cache=True)
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


@njit(cache=True)
def inv_forward(iattr, a, A, out):
    batch, n = iattr[a], iattr[a + 1]
    for b in range(batch):
        out[b * n * n:(b + 1) * n * n] = np.linalg.inv(A[b * n * n:(b + 1) * n * n].reshape(n, n)).ravel()


@njit(cache=True)
def inv_reverse(iattr, a, y, g_out, g_A):
    """Y = A^-1: dA = -Y^T dY Y^T, one cotangent column at a time."""
    batch, n = iattr[a], iattr[a + 1]
    K = g_out.shape[1]
    for b in range(batch):
        Yt = np.ascontiguousarray(y[b * n * n:(b + 1) * n * n].reshape(n, n).T)
        for k in range(K):
            G = np.ascontiguousarray(g_out[b * n * n:(b + 1) * n * n, k]).reshape(n, n)
            g_A[b * n * n:(b + 1) * n * n, k] -= np.dot(np.dot(Yt, G), Yt).ravel()
