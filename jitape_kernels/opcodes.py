"""Opcode numbers and the Program encoding shared by jitape (which writes it) and the kernels.

Program arrays
--------------
code   int64 [n_instr, W]   one row per instruction, columns below
slots  int64 [n_slots, S]   OFFSET, SIZE, RANK, then MAXRANK dims (unused dims are 1)
iattr  int64 [*]            integer attribute pool; an instruction's block starts at code[i, ATTR]
fattr  float64 [*]          float attribute pool; ops with float attributes keep the pool
                            index as the first entry of their iattr block
arena  float [*]            every recorded value, flat, one dtype per Program
adjoint float [n_adj, K]    K cotangent columns (K contiguous) for active slots only

Instruction row columns (W = 14)
--------------------------------
OP        opcode
OUT       output slot        IN0, IN1, IN2   input slots (-1 when absent)
ATTR      start of the op's block in iattr (-1 when the op has none)
OUT_OFF   arena offset of the output    IN0_OFF..IN2_OFF   arena offsets of the inputs
OUT_ADJ   adjoint row of the output     IN0_ADJ..IN2_ADJ   adjoint rows of the inputs
          (-1 when the slot is inactive: not between the sources and the target)

Attribute blocks (iattr) per op family
--------------------------------------
elementwise          none, except ELU/SCALE/POWC/POLYGAMMA (fattr index) and CLIP (fattr index of lo, hi)
SUM/MAX/MIN/PROD     outer, n, inner          (reduce the middle axis of an [outer, n, inner] view)
CUMSUM               outer, n, inner, exclusive, reverse   (running sums along the middle axis; linear)
TRANSPOSE            rank, in_dims[rank], perm[rank]
TILE                 rank, in_dims[rank], out_dims[rank]   (out[i] = in[i mod in_dims]; also broadcast_to)
SLICE                rank, in_dims[rank], out_dims[rank], starts[rank], steps[rank]
PAD                  rank, in_dims[rank], out_dims[rank], starts[rank], steps[rank]  (out[starts + i*steps] = in[i])
PLACE                outer, n_in, inner, n_out, offset     (one concat operand into its output)
GATHER               outer, n_axis, inner, n_idx, idx[n_idx]
MATMUL               batch_a, batch_b, m, k, n             (batch_a or batch_b is 1 when broadcast)
SOLVE                batch, n, m                           (A [batch,n,n], B [batch,n,m])
INV                  batch, n
"""

W = 14
OP, OUT, IN0, IN1, IN2, ATTR, OUT_OFF, IN0_OFF, IN1_OFF, IN2_OFF, OUT_ADJ, IN0_ADJ, IN1_ADJ, IN2_ADJ = range(W)

MAXRANK = 8
S = 3 + MAXRANK
OFFSET, SIZE, RANK, DIMS = 0, 1, 2, 3

# Opcodes. The listing prints NAMES; numbers are only stable within one version.
(
    COPY, NEG, SQUARE, SQRT, EXP, LOG, LOG1P, SIN, COS, TAN, TANH, ABS, SIGN,
    SIGMOID, RELU, ELU, SOFTPLUS, CLIP, SCALE, POWC,
    SINH, COSH, ASINH, ACOSH, ATANH, ASIN, ACOS, ATAN, EXPM1, ERF, ERFC, LGAMMA, DIGAMMA, POLYGAMMA,
    ADD, SUB, MUL, DIV, POW, MAXIMUM, MINIMUM, ATAN2,
    WHERE,
    SUM, MAX, MIN, PROD, CUMSUM,
    TRANSPOSE, TILE, SLICE, PAD, PLACE, GATHER,
    MATMUL, SOLVE, INV,
) = range(57)

NAMES = (
    "copy", "neg", "square", "sqrt", "exp", "log", "log1p", "sin", "cos", "tan", "tanh", "abs", "sign",
    "sigmoid", "relu", "elu", "softplus", "clip", "scale", "powc",
    "sinh", "cosh", "asinh", "acosh", "atanh", "asin", "acos", "atan", "expm1", "erf", "erfc", "lgamma", "digamma",
    "polygamma",
    "add", "sub", "mul", "div", "pow", "maximum", "minimum", "atan2",
    "where",
    "sum", "max", "min", "prod", "cumsum",
    "transpose", "tile", "slice", "pad", "place", "gather",
    "matmul", "solve", "inv",
)
# families are contiguous ranges: unary opcodes end at UNARY_LAST, binary ones at BINARY_LAST
UNARY_LAST = POLYGAMMA
BINARY_LAST = ATAN2
