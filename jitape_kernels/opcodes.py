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
STASH     (IN1_OFF of a LOGSUMEXP row, which has no IN1) in a replay's run and step code: how many entries
          before the end of the replay's scratch its stash starts, where the forward leaves its exponentials
          and their sums' reciprocals for the reverse of a gradient step with one column (-1: none; see
          jitape_kernels.layout.logsumexp_stashes)

Attribute blocks (iattr) per op family (TABLE below holds them as data)
-----------------------------------------------------------------------
compare              none (GREATER..NOT_EQUAL: 0/1 values, no derivative)
elementwise          none, except ELU/SCALE/POWC/POLYGAMMA (fattr index) and CLIP (fattr index of lo, hi);
                     STOP_GRADIENT is a copy with no derivative
SUM/MAX/MIN/PROD/LOGSUMEXP  outer, n, inner   (reduce the middle axis of an [outer, n, inner] view; LOGSUMEXP
                                               shifts by the largest entry where it is finite)
CUMSUM               outer, n, inner, exclusive, reverse   (running sums along the middle axis; linear)
TRANSPOSE            rank, in_dims[rank], perm[rank]
TILE                 rank, in_dims[rank], out_dims[rank]   (out[i] = in[i mod in_dims], out_dims multiples of
                                                        in_dims; also broadcast_to)
SLICE                rank, in_dims[rank], out_dims[rank], starts[rank], steps[rank]
PAD                  rank, in_dims[rank], out_dims[rank], starts[rank], steps[rank]  (out[starts + i*steps] = in[i])
PLACE                outer, n_in, inner, n_out, offset     (one concat operand into its output)
GATHER               outer, n_axis, inner, n_idx, idx[n_idx]
MATMUL               batch_a, batch_b, m, k, n, inner      (batch_a or batch_b is 1 when broadcast; inner > 1:
                                                        A and C are stored [outer, m, inner, k] and
                                                        [outer, m, inner, n], batch = outer * inner items
                                                        whose rows lie inner * k and inner * n apart, as
                                                        BLAS reads strided rows; both batches are whole)
SOLVE                batch, n, m                           (A [batch,n,n], B [batch,n,m])
INV                  batch, n
"""
import numpy as np


W = 14
OP, OUT, IN0, IN1, IN2, ATTR, OUT_OFF, IN0_OFF, IN1_OFF, IN2_OFF, OUT_ADJ, IN0_ADJ, IN1_ADJ, IN2_ADJ = range(W)
STASH = IN1_OFF

MAXRANK = 8
S = 3 + MAXRANK
OFFSET, SIZE, RANK, DIMS = 0, 1, 2, 3

# Opcodes. The listing prints NAMES; numbers are only stable within one FORMAT_VERSION (saved Programs store
# the opcode-name table and are renumbered by name on load).
(
    COPY, NEG, SQUARE, SQRT, EXP, LOG, LOG1P, SIN, COS, TAN, TANH, ABS, SIGN,
    SIGMOID, RELU, ELU, SOFTPLUS, CLIP, SCALE, POWC,
    SINH, COSH, ASINH, ACOSH, ATANH, ASIN, ACOS, ATAN, EXPM1, ERF, ERFC, LGAMMA, DIGAMMA, POLYGAMMA,
    STOP_GRADIENT,
    ADD, SUB, MUL, DIV, POW, MAXIMUM, MINIMUM, ATAN2,
    GREATER, GREATER_EQUAL, LESS, LESS_EQUAL, EQUAL, NOT_EQUAL,
    WHERE,
    SUM, MAX, MIN, PROD, LOGSUMEXP, CUMSUM,
    TRANSPOSE, TILE, SLICE, PAD, PLACE, GATHER,
    MATMUL, SOLVE, INV,
) = range(65)

FORMAT_VERSION = 3      # 2: MATMUL's inner; 3: a function's host steps (Hessians and Jacobians inside it)
READABLE_VERSIONS = (2, 3)      # a version 2 file reads as one with no host steps

# The opcode table: (name, family, arity, attribute layout), one row per opcode in opcode order. An attribute
# layout names the op's iattr block fields; "f" is a fattr index, "name[rank]" repeats rank times.
_F = ("f",)
_REDUCE = ("outer", "n", "inner")
_MAPPED = ("rank", "in_dims[rank]", "out_dims[rank]", "starts[rank]", "steps[rank]")
TABLE = (
    ("copy", "unary", 1, ()), ("neg", "unary", 1, ()), ("square", "unary", 1, ()), ("sqrt", "unary", 1, ()),
    ("exp", "unary", 1, ()), ("log", "unary", 1, ()), ("log1p", "unary", 1, ()), ("sin", "unary", 1, ()),
    ("cos", "unary", 1, ()), ("tan", "unary", 1, ()), ("tanh", "unary", 1, ()), ("abs", "unary", 1, ()),
    ("sign", "unary", 1, ()), ("sigmoid", "unary", 1, ()), ("relu", "unary", 1, ()), ("elu", "unary", 1, _F),
    ("softplus", "unary", 1, ()), ("clip", "unary", 1, _F), ("scale", "unary", 1, _F), ("powc", "unary", 1, _F),
    ("sinh", "unary", 1, ()), ("cosh", "unary", 1, ()), ("asinh", "unary", 1, ()), ("acosh", "unary", 1, ()),
    ("atanh", "unary", 1, ()), ("asin", "unary", 1, ()), ("acos", "unary", 1, ()), ("atan", "unary", 1, ()),
    ("expm1", "unary", 1, ()), ("erf", "unary", 1, ()), ("erfc", "unary", 1, ()), ("lgamma", "unary", 1, ()),
    ("digamma", "unary", 1, ()), ("polygamma", "unary", 1, _F), ("stop_gradient", "unary", 1, ()),
    ("add", "binary", 2, ()), ("sub", "binary", 2, ()), ("mul", "binary", 2, ()), ("div", "binary", 2, ()),
    ("pow", "binary", 2, ()), ("maximum", "binary", 2, ()), ("minimum", "binary", 2, ()),
    ("atan2", "binary", 2, ()),
    ("greater", "compare", 2, ()), ("greater_equal", "compare", 2, ()), ("less", "compare", 2, ()),
    ("less_equal", "compare", 2, ()), ("equal", "compare", 2, ()), ("not_equal", "compare", 2, ()),
    ("where", "where", 3, ()),
    ("sum", "reduce", 1, _REDUCE), ("max", "reduce", 1, _REDUCE), ("min", "reduce", 1, _REDUCE),
    ("prod", "reduce", 1, _REDUCE), ("logsumexp", "reduce", 1, _REDUCE),
    ("cumsum", "cumsum", 1, _REDUCE + ("exclusive", "reverse")),
    ("transpose", "mapped", 1, ("rank", "in_dims[rank]", "perm[rank]")),
    ("tile", "mapped", 1, ("rank", "in_dims[rank]", "out_dims[rank]")),
    ("slice", "mapped", 1, _MAPPED), ("pad", "mapped", 1, _MAPPED),
    ("place", "moved", 1, ("outer", "n_in", "inner", "n_out", "offset")),
    ("gather", "moved", 1, ("outer", "n_axis", "inner", "n_idx", "idx[n_idx]")),
    ("matmul", "matmul", 2, ("batch_a", "batch_b", "m", "k", "n", "inner")),
    ("solve", "solve", 2, ("batch", "n", "m")),
    ("inv", "inv", 1, ("batch", "n")),
)
NAMES = tuple(row[0] for row in TABLE)
FAMILIES = tuple(row[1] for row in TABLE)
ARITY = tuple(row[2] for row in TABLE)
ATTRIBUTES = tuple(row[3] for row in TABLE)
# per opcode, how many fattr entries the "f" index of its block points at (0: none; CLIP's lo and hi: 2)
FLOAT_COUNT = tuple((2 if row[0] == "clip" else 1) if row[3] == _F else 0 for row in TABLE)
# per opcode, the length of its iattr block where no field sets it (-1: a rank or count field does, see
# attribute_length)
FIXED_ATTRIBUTE_LENGTH = tuple(-1 if any("[" in field for field in fields) else len(fields) for fields in ATTRIBUTES)

# What each opcode's first-order derivative rule (the reverse kernels, and forward mode's tangent kernels) reads
# of the recorded values, as bits: READ_IN0/1/2 an input's value, READ_OUT the output's. A derivative of
# first order fills only the values some instruction of its Program reads into the arena (planning.plan):
# the linear ops (shape moves, sums, add) read none. Opcodes not named here read all of them.
READ_IN0, READ_IN1, READ_IN2, READ_OUT = 1, 2, 4, 8
_READ_INPUTS = READ_IN0 | READ_IN1 | READ_IN2
_READS_BY_NAME = {
    **dict.fromkeys(("copy", "stop_gradient", "neg", "scale", "sign", "add", "sub", "greater", "greater_equal",
                     "less", "less_equal", "equal", "not_equal", "sum", "cumsum", "transpose", "tile", "slice", "pad", "place", "gather"),
                    0),
    **dict.fromkeys(("square", "log", "log1p", "sin", "cos", "abs", "relu", "softplus", "clip", "powc", "mul",
                     "matmul"), _READ_INPUTS),
    **dict.fromkeys(("sqrt", "exp", "tan", "tanh", "sigmoid", "inv"), READ_OUT),
    "where": READ_IN0,
}
FIRST_ORDER_READS = tuple(_READS_BY_NAME.get(name, _READ_INPUTS | READ_OUT) for name in NAMES)
# What the rules of every order read (second-order sweeps add the second derivatives'): the first-order reads,
# and the output of sin and cos, whose second derivatives are -y.
DERIVATIVE_READS = tuple(bits | (READ_OUT if name in ("sin", "cos") else 0)
                         for name, bits in zip(NAMES, FIRST_ORDER_READS))

# Which inputs' cotangents equal the output's, entry for entry, as bits (1 << c for input c): the reverse rule
# copies the output's cotangent there. Where the row is such an input's only reader, a reverse-only sweep reads
# that cotangent in the output's rows instead of copying it (planning.cotangent_homes).
COTANGENT_IS_OUTPUTS = tuple({"copy": 1, "add": 3, "sub": 1}.get(name, 0) for name in NAMES)

# The sweeps dispatch on contiguous opcode ranges, in this order of families; _check_table proves the table
# has them (a new opcode in the wrong place fails at import, it can never run as its neighbour's kernel).
UNARY_LAST = STOP_GRADIENT
REDUCE_LAST = LOGSUMEXP
BINARY_LAST = NOT_EQUAL          # the compare family is binary in the kernels: values 0/1, partials zero
COMPARE_FIRST = GREATER          # compare outputs carry no derivative: activity never flows through them
# STOP_GRADIENT and the compare family are recorded so that a replay recomputes their values, but their outputs
# are constants to every derivative: planning.passes_derivatives is False for them, so activity never flows
# through them and no derivative kernel runs them (their derivative rules are zero all the same).
FAMILY_ORDER = ("unary", "binary", "compare", "where", "reduce", "cumsum", "mapped", "moved", "matmul",
                "solve", "inv")
_FAMILY_BOUNDS = {"unary": (COPY, UNARY_LAST), "binary": (ADD, ATAN2), "compare": (COMPARE_FIRST, BINARY_LAST),
                  "where": (WHERE, WHERE), "reduce": (SUM, REDUCE_LAST), "cumsum": (CUMSUM, CUMSUM),
                  "mapped": (TRANSPOSE, PAD), "moved": (PLACE, GATHER), "matmul": (MATMUL, MATMUL),
                  "solve": (SOLVE, SOLVE), "inv": (INV, INV)}


def _check_table():
    if len(TABLE) != INV + 1 or len(set(NAMES)) != len(NAMES):
        raise AssertionError("opcodes.TABLE must have one row per opcode, names unique")
    order = [f for i, f in enumerate(FAMILIES) if i == 0 or FAMILIES[i - 1] != f]
    if order != list(FAMILY_ORDER):
        raise AssertionError(f"opcode families must be contiguous in the order {FAMILY_ORDER}, got {order}")
    for family, (first, last) in _FAMILY_BOUNDS.items():
        if FAMILIES.index(family) != first or len(FAMILIES) - 1 - FAMILIES[::-1].index(family) != last:
            raise AssertionError(f"opcode family {family!r} must span opcodes {first}..{last}")


_check_table()


def fill_offset_columns(code, offsets):
    """Set code's OUT_OFF..IN2_OFF columns to the arena offsets (`offsets`, per slot) of its OUT..IN2 slots, -1
    where a slot is absent."""
    for c in range(4):
        slot = code[:, OUT + c]
        code[:, OUT_OFF + c] = np.where(slot >= 0, offsets[np.maximum(slot, 0)], -1)


def attribute_length(op, iattr, start):
    """The length of instruction `op`'s iattr block starting at `start` (reads the rank or count field it
    depends on; the caller checks that those reads are in bounds)."""
    fields = ATTRIBUTES[op]
    length = 0
    named = {}
    for field in fields:
        if "[" in field:
            length += named[field[field.index("[") + 1:-1]]
        else:
            named[field] = int(iattr[start + length]) if start + length < len(iattr) else 0
            length += 1
    return length
