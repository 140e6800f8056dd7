"""BLAS and LAPACK on memory the caller owns: a matrix product that accumulates in place (gemm with beta) and a
linear solve in a planned scratch buffer (gesv), so linalg kernels allocate nothing per instruction.

np.dot(a, b) returns a new array, np.dot(a, b, out) cannot add to out, and numba's np.linalg.solve/inv copy
their operands into new arrays. numba compiles those on the BLAS/LAPACK entry points of its helper library
(numba_xxgemm, numba_xgesv: scipy.linalg.cython_blas/cython_lapack underneath, loaded on first use); the
intrinsics here call the same entry points with the caller's pointers, as numba.np.linalg does, so the
library and its threading are numba's own. Matrices are row-major here and column-major there: a row-major X
is the column-major X^T. strided_gemm takes matrices whose rows lie any distance apart, as BLAS does (the items
of MATMUL's interleaved batches), and checks that every row lies inside its array.
"""
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .. import njit


_CHAR = ir.IntType(8)
_POINTER = _CHAR.as_pointer()
_KINDS = {types.float32: "s", types.float64: "d"}


def _pointer(context, builder, array_type, array):
    return builder.bitcast(context.make_array(array_type)(context, builder, array).data, _POINTER)


def _float_arrays(*arrays):
    """Whether every argument is a C-contiguous float32/float64 array of one dtype (the layouts the pointers
    assume: a view of another layout would be read as if contiguous)."""
    return all(isinstance(a, types.Array) and a.layout == "C" and a.dtype in _KINDS for a in arrays) \
        and len({a.dtype for a in arrays}) == 1


@intrinsic
def _xxgemm(typingctx, transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
    """numba_xxgemm (column-major): c = alpha op(a) op(b) + beta c; transa/transb nonzero: op transposes."""
    if not _float_arrays(a, b, c):
        return None

    def codegen(context, builder, signature, args):
        transa_, transb_, m_, n_, k_, alpha_, a_, lda_, b_, ldb_, beta_, c_, ldc_ = args
        intp = context.get_value_type(types.intp)
        fnty = ir.FunctionType(ir.IntType(32), [_CHAR, _CHAR, _CHAR, intp, intp, intp, _POINTER, _POINTER, intp,
                                                _POINTER, intp, _POINTER, _POINTER, intp])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "numba_xxgemm")
        sig = signature.args

        def size(value, ty):
            return context.cast(builder, value, ty, types.intp)

        def trans(value, ty):
            flag = builder.icmp_signed("!=", value, ir.Constant(value.type, 0))
            return builder.select(flag, ir.Constant(_CHAR, ord("t")), ir.Constant(_CHAR, ord("n")))

        def scalar(value, ty):
            slot = cgutils.alloca_once_value(builder, context.cast(builder, value, ty, c.dtype))
            return builder.bitcast(slot, _POINTER)
        return builder.call(fn, (ir.Constant(_CHAR, ord(_KINDS[c.dtype])), trans(transa_, sig[0]),
                                 trans(transb_, sig[1]), size(m_, sig[2]), size(n_, sig[3]), size(k_, sig[4]),
                                 scalar(alpha_, sig[5]), _pointer(context, builder, a, a_), size(lda_, sig[7]),
                                 _pointer(context, builder, b, b_), size(ldb_, sig[9]), scalar(beta_, sig[10]),
                                 _pointer(context, builder, c, c_), size(ldc_, sig[12])))
    return types.int32(transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc), codegen


@intrinsic
def _xgesv(typingctx, n, nrhs, a, pivots, b):
    """numba_xgesv (column-major): b = a^-1 b for an n x n `a` (overwritten by its LU factors) and n x nrhs `b`;
    `pivots` is memory for n LAPACK integers (any array: only its address is used). LAPACK's info: > 0 when a
    is singular."""
    if not (_float_arrays(a, b) and isinstance(pivots, types.Array)):
        return None

    def codegen(context, builder, signature, args):
        n_, nrhs_, a_, pivots_, b_ = args
        intp = context.get_value_type(types.intp)
        fnty = ir.FunctionType(ir.IntType(32), [_CHAR, intp, intp, _POINTER, intp, _POINTER, _POINTER, intp])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "numba_xgesv")
        rows = context.cast(builder, n_, signature.args[0], types.intp)
        return builder.call(fn, (ir.Constant(_CHAR, ord(_KINDS[a.dtype])), rows,
                                 context.cast(builder, nrhs_, signature.args[1], types.intp),
                                 _pointer(context, builder, a, a_), rows, _pointer(context, builder, pivots, pivots_),
                                 _pointer(context, builder, b, b_), rows))
    return types.int32(n, nrhs, a, pivots, b), codegen


@njit(cache=True, error_model="numpy")
def gemm(alpha, A, trans_a, B, trans_b, beta, C):
    """C = alpha op(A) op(B) + beta C for row-major A, B, C (op(X) = X^T when trans_x): beta = 1 adds the
    product to C with no temporary. C must not overlap A or B."""
    m, n = C.shape
    k = A.shape[0] if trans_a else A.shape[1]
    if ((A.shape[1] if trans_a else A.shape[0]) != m or (B.shape[1] if trans_b else B.shape[0]) != k
            or (B.shape[0] if trans_b else B.shape[1]) != n):
        raise ValueError("gemm: operand shapes do not match")
    strided_gemm(alpha, A.reshape(A.size), A.shape[1], trans_a, B.reshape(B.size), B.shape[1], trans_b, beta,
                 C.reshape(C.size), n, m, n, k)


@njit(cache=True, error_model="numpy", inline="always")
def _fits(flat, rows, cols, ld):
    """Whether a row-major rows x cols matrix whose rows lie ld entries apart fits in flat from its start."""
    return ld >= cols and (rows == 0 or cols == 0 or (rows - 1) * ld + cols <= flat.size)


@njit(cache=True, error_model="numpy")
def strided_gemm(alpha, a, lda, trans_a, b, ldb, trans_b, beta, c, ldc, m, n, k):
    """C = alpha op(A) op(B) + beta C for row-major matrices whose rows lie ld entries apart (as BLAS takes
    them): C is m x n, op(A) m x k, op(B) k x n, and a, b, c are flat arrays that start at their matrix's first
    entry. Raises unless every row of every matrix lies inside its array; c must not overlap a or b."""
    if not (_fits(a, k if trans_a else m, m if trans_a else k, lda)
            and _fits(b, n if trans_b else k, k if trans_b else n, ldb) and _fits(c, m, n, ldc)):
        raise ValueError("gemm: a matrix does not fit its array")
    if m == 0 or n == 0:
        return
    if k == 0:      # an empty sum: C = beta C
        for i in range(m):
            for j in range(n):
                c[i * ldc + j] = beta * c[i * ldc + j] if beta != 0 else 0
        return
    # row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T, with B and A as stored
    status = _xxgemm(trans_b, trans_a, n, m, k, alpha, b, ldb, a, lda, beta, c, ldc)
    if status != 0:
        raise RuntimeError("BLAS gemm is unavailable (scipy.linalg.cython_blas)")


@njit(cache=True, error_model="numpy")
def solve_columns(A, transposed, B, temps):
    """B (n, m, column-major: B's column c is B[c * n:(c + 1) * n]) = op(A)^-1 B in place, for a row-major n x n
    A (op(A) = A^T when transposed); A itself is left as it was. temps: at least n * n + 2 * n entries (a copy of
    A to factor, then the pivots). np.linalg.LinAlgError when A is singular, as np.linalg.solve."""
    n = A.shape[0]
    if n == 0 or B.size == 0:
        return
    lu = temps[:n * n]
    # entry by entry: an array assigned to a slice compiles numba's shape-mismatch message (2 s of a cold solve)
    for i in range(n):
        for j in range(n):
            if transposed:      # the row-major A is the column-major A^T
                lu[i * n + j] = A[i, j]
            else:
                lu[j * n + i] = A[i, j]
    status = _xgesv(n, B.size // n, lu, temps[n * n:n * n + 2 * n], B)
    if status > 0:
        raise np.linalg.LinAlgError("Matrix is singular to machine precision.")
    if status < 0:
        raise RuntimeError("LAPACK gesv is unavailable (scipy.linalg.cython_lapack)")

