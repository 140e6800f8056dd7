"""Generated kernels of fused groups: one loop per group, each entry's rows evaluated in registers.

A replay runs a fused group (jitape_kernels.layout) block by block through the
elementwise kernels: every row reads and writes a block buffer, so a group of
five rows over 1,000,000 entries takes ~1 ms where one loop computing each
entry's five values in registers takes ~0.25 (W10's distance matrix). The loop
needs the group's rows as code, so it is generated: Python source from the
group's structure (its ops, which values each reads, which reach the arena and
how each broadcast indexes its input), compiled by numba as a C callback and
called from the replay sweep through its address (call_kernel). The source is
written once per structure and dtype into the kernel cache directory, where
numba caches its machine code as the package's own kernels'.

The rows' rules (_ENTRY_RULES) are the block kernels' loop bodies for the
elementwise ops their loops run directly (arithmetic, compares, where and the
commonest unary ops), each value rounded to the arena's dtype as a block
would store it: a replay gives the same bits from either path (exp, log, tanh
and sigmoid within one unit in the last place: LLVM places their fused
multiply-adds per loop).

A group's loops nest at every boundary between the repeated and the copied
axes of its broadcasts, so each reads its input at a sum of loop indices times
strides. A SUM, MIN or MAX of one of its values right after it is computed in
the same loops (its output indexed as a broadcast's input), so the value it
reduces is never read back, and stored only where something else reads it
(W10's distance matrix and its row minimum: one pass). Groups whose
broadcasts do not nest (outputs of one size but other shapes), that hold an
op without an entry rule, or that write a value over its input (a training
step's update) keep the block path.

A gradient step's fused reverse groups (layout.reverse_groups) are generated
the same way (_reverse_source): one loop nest in which each entry's cotangents
pass from row to row in registers, with the rules of the reverse block kernels
(_UNARY_TERMS, _BINARY_TERMS), SUM's cotangent read as a broadcast, a MAX's or
MIN's shares on its extrema (each row's ties counted just before it), and a
broadcast's input's cotangent summed in order (W10's reverse over its distance
matrix: one read of the distances and one write of the product's cotangent,
~1.7 -> ~0.55 ms).
A variant's groups are compiled at its third replay
(jitape.config.fused_kernel_runs): a function called once or twice never waits
for a compile.
"""
import hashlib
import importlib.util
import os
import sys
import tempfile

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core.ccallback import CFunc
from numba.extending import intrinsic

from .. import _CACHE_DIR, _KernelCache, opcodes as oc
from .reduction import SHORT_ROWS

# the kernels' table, per run-code row that starts a generated group: its kernel's address (0: none; the block
# path), where its arguments start in the argument array and how many, and the row after the last it computes
(KERNEL_ADDRESS, KERNEL_ARGS, KERNEL_ARG_COUNT, KERNEL_END) = range(4)
KERNEL_COLUMNS = 4

# The value each op's block kernel stores for one entry (the loop bodies of elementwise.unary_forward,
# binary_forward and where_forward) as source over its operands' values ({0}, {1}, {2}; {p}: SCALE's factor in
# the arrays' dtype): the ops a generated kernel evaluates. A group holding any other op keeps the block path:
# through unary_value's dispatch, inlined per row, a kernel compiled for 1-2 s a row.
_ENTRY_RULES = {
    oc.SCALE: "{0} * {p}", oc.NEG: "-{0}", oc.SQUARE: "{0} * {0}", oc.SQRT: "math.sqrt({0})", oc.ABS: "abs({0})",
    oc.RELU: "({0} if {0} > 0.0 or {0} != {0} else 0.0)",      # elementwise.maximum(x, 0.0)
    oc.EXP: "exp_entry({0})", oc.LOG: "log_entry({0})", oc.TANH: "tanh_entry({0})", oc.SIGMOID: "sigmoid_entry({0})",
    oc.ADD: "{0} + {1}", oc.SUB: "{0} - {1}", oc.MUL: "{0} * {1}", oc.DIV: "{0} / {1}",
    oc.MAXIMUM: "({0} if {0} > {1} or {0} != {0} else {1})", oc.MINIMUM: "({0} if {0} < {1} or {0} != {0} else {1})",
    oc.GREATER: "(1.0 if {0} > {1} else 0.0)", oc.GREATER_EQUAL: "(1.0 if {0} >= {1} else 0.0)",
    oc.LESS: "(1.0 if {0} < {1} else 0.0)", oc.LESS_EQUAL: "(1.0 if {0} <= {1} else 0.0)",
    oc.EQUAL: "(1.0 if {0} == {1} else 0.0)", oc.NOT_EQUAL: "(1.0 if {0} != {1} else 0.0)",
    oc.WHERE: "({1} if {0} != 0 else {2})",
}

_GENERATED_DIR = _CACHE_DIR / "fused"
# what a kernel calls to reduce each row it computed (see _group_source)
_ROW_REDUCERS = {oc.SUM: "sum_of_row", oc.MAX: "max_of_row", oc.MIN: "min_of_row"}
_COMPILED = {}      # source digest -> CFunc, for this process


# the arrays a generated kernel reads, in its arguments' order: a forward group's and a reverse group's
FORWARD_ARRAYS = ("arena", "iattr", "fattr", "args")
REVERSE_ARRAYS = ("arena", "flat", "iattr", "fattr", "args")      # flat: the adjoint rows (one column)


@intrinsic
def call_kernel(typingctx, address, arrays):
    """Call the generated kernel at `address` (a CFunc of kernel_signature) over the memory of `arrays` (a tuple
    of 1-D arrays: FORWARD_ARRAYS' or REVERSE_ARRAYS')."""
    if not (isinstance(address, types.Integer) and isinstance(arrays, types.BaseTuple)
            and all(isinstance(a, types.Array) and a.ndim == 1 for a in arrays)):
        return None

    def codegen(context, builder, signature, llargs):
        array_types = signature.args[1]
        values = []
        for array_type, value in zip(array_types, cgutils.unpack_tuple(builder, llargs[1], len(array_types))):
            view = context.make_array(array_type)(context, builder, value=value)
            values += [view.data, cgutils.unpack_tuple(builder, view.shape, 1)[0]]
        function_type = ir.FunctionType(ir.VoidType(), [v.type for v in values])
        target = builder.inttoptr(context.cast(builder, llargs[0], signature.args[0], types.int64),
                                  function_type.as_pointer())
        builder.call(target, values)
        return context.get_dummy_value()
    return types.none(address, arrays), codegen


def kernel_signature(dtype, arrays):
    """A generated kernel's C signature: a pointer and a size per array of `arrays` (FORWARD_ARRAYS or
    REVERSE_ARRAYS)."""
    element = {"arena": types.float64 if np.dtype(dtype) == np.float64 else types.float32, "iattr": types.int64,
               "fattr": types.float64, "args": types.int64}
    element["flat"] = element["arena"]
    return types.void(*[t for name in arrays for t in (types.CPointer(element[name]), types.int64)])


def _broadcast_runs(iattr, a):
    """TILE a's output axes (a broadcast: every input axis 1 or the output's) merged, outermost first, while all
    repeat the input or none does: [(repeats, entries)]; [] for one entry."""
    rank = int(iattr[a])
    in_dims, out_dims = iattr[a + 1:a + 1 + rank], iattr[a + 1 + rank:a + 1 + 2 * rank]
    runs = []
    for n_in, n_out in zip(in_dims.tolist(), out_dims.tolist()):
        if n_out == 1:
            continue
        repeats = n_in != n_out
        if runs and runs[-1][0] == repeats:
            runs[-1] = (repeats, runs[-1][1] * n_out)
        else:
            runs.append((repeats, n_out))
    return runs


def loop_nest(size, tile_runs):
    """The loop nest over a group's `size` entries in which each broadcast reads its input at a sum of loop
    indices times strides: (spans, repeats), spans the entries one index of each loop spans, innermost first
    (1, then every boundary between a broadcast's runs), repeats per broadcast whether each loop repeats its
    input; None where the runs do not nest (broadcasts into outputs of one size but other shapes)."""
    spans = {1}
    for runs in tile_runs:
        inside = 1
        for _, entries in reversed(runs):
            spans.add(inside)
            inside *= entries
    spans = sorted(spans | {size})[:-1] if size > 1 else [1]
    bounds = spans + [size]
    if any(outer % inner for inner, outer in zip(bounds, bounds[1:])):
        return None
    repeats = []
    for runs in tile_runs:
        per_loop, inside = [], 1
        for repeated, entries in reversed(runs):
            per_loop += [repeated] * sum(1 for span in spans if inside <= span < inside * entries)
            inside *= entries
        if inside != size:
            return None
        repeats.append(per_loop)
    return spans, repeats


def _reduction_runs(outer, n, inner):
    """A reduction's output indexed like a broadcast's input (loop_nest): the reduced axis repeats it."""
    runs = []
    for repeats, entries in ((False, outer), (True, n), (False, inner)):
        if entries > 1:
            runs.append((repeats, entries))
    return runs


def _absorbed_reduction(run, iattr, r0, r1, size):
    """(outer, n, inner) of the row after group r0..r1-1 when the group's kernel computes it too: a SUM, MIN or
    MAX over all the entries of a value the group computes (its output then never read from the arena), else
    None."""
    if r1 >= run.shape[0] or int(run[r1, oc.OP]) not in (oc.SUM, oc.MIN, oc.MAX):
        return None
    if int(run[r1, oc.IN0]) not in run[r0:r1, oc.OUT].tolist():
        return None
    a = int(run[r1, oc.ATTR])
    outer, n, inner = (int(v) for v in iattr[a:a + 3])
    if inner == 1 and n <= SHORT_ROWS:     # a call per short row (sum_of_row ...): slower than the row kernel's pass
        return None
    return (outer, n, inner) if n > 1 and outer * n * inner == size else None


class _Nest:
    """A generated kernel's loop nest over `size` entries (loop_nest's `spans`) as it is written: its arguments
    (each loop's count first, innermost first, then what argument() adds) and its lines by where they run."""

    def __init__(self, size, spans):
        self.levels = levels = len(spans)
        self.args = [(spans[t + 1] if t + 1 < levels else size) // spans[t] for t in range(levels)]
        self.setup = [f"n{t} = args[{t}]" for t in range(levels)]
        self.setup.append("size = " + " * ".join(f"n{t}" for t in range(levels)))
        self.setup += [f"span{t} = span{t - 1} * n{t - 1}" if t else "span0 = 1" for t in range(levels)]
        self.per_index = [[] for _ in range(levels)]        # lines run per index of loop t (t >= 1), inside it
        self.after_index = [[] for _ in range(levels + 1)]  # per index of loop t, after its inner loops
        self.before_inner = []      # lines run before each run of the innermost loop
        self.body = []              # the innermost loop's lines, per entry j

    def argument(self, value):
        self.args.append(int(value))
        return f"args[{len(self.args) - 1}]"

    def view(self, name, array, offset, size):
        """`name` = entries [offset, offset + size) of `array` (both numbers arguments)."""
        at = self.argument(offset)
        self.setup.append(f"{name} = {array}[{at}:{at} + {self.argument(size)}]")

    def entries(self, view, first="first"):
        """The entry j of `view`'s run from `first` that one run of the innermost loop reads or writes."""
        self.before_inner.append(f"{view}_run = {view}[{first}:{first} + n0]")
        return f"{view}_run[j]"

    def position(self, view, repeats):
        """Where `view` (a broadcast's input, a reduction's output) is at the start of a run of the innermost
        loop: its stride per loop that does not repeat it (the entries of the inner ones that do not), then its
        position loop by loop from the outermost."""
        stride = "1"
        for t in range(self.levels):
            if not repeats[t]:
                self.setup.append(f"{view}_s{t} = {stride}")
                stride = f"{view}_s{t} * n{t}"
        at = "0"
        for t in range(self.levels - 1, 0, -1):
            if not repeats[t]:
                self.per_index[t].append(f"{view}_at{t} = {at} + i{t} * {view}_s{t}")
                at = f"{view}_at{t}"
        return at

    def broadcast(self, name, view, repeats):
        """The expression of `view`'s entry (a broadcast's input, a reduction's output: `repeats` per loop) at
        the innermost loop's entry j, read once per run where that loop repeats it (into `name`)."""
        at = self.position(view, repeats)
        if repeats[0]:
            self.before_inner.append(f"{name} = {view}[{at}]")
            return name
        return self.entries(view, at)

    def loops(self):
        """The nest's lines, indented as the kernel's body."""
        lines = [f"    {line}" for line in self.setup]
        indent, first = "    ", "0"
        for t in range(self.levels - 1, 0, -1):
            lines.append(f"{indent}for i{t} in range(n{t}):")
            indent += "    "
            lines.append(f"{indent}first{t} = {first} + i{t} * span{t}")
            first = f"first{t}"
            lines += [f"{indent}{line}" for line in self.per_index[t]]
        lines.append(f"{indent}first = {first}")
        lines += [f"{indent}{line}" for line in self.before_inner]
        lines.append(f"{indent}for j in range(n0):")
        lines += [f"{indent}    {line}" for line in self.body]
        for t in range(1, self.levels + 1):      # after the inner loops, innermost first, each at its loop's body
            lines += ["    " * (1 + self.levels - t) + line for line in self.after_index[t]]
        return lines


def _module(arrays, lines):
    """A generated kernel's module: `kernel` over the memory of `arrays` (KERNEL_ARRAYS' names) running `lines`."""
    return "\n".join([
        '"""A fused group\'s kernel, generated by jitape_kernels.cpu.fusion."""',
        "import math",
        "",
        "import numpy as np",
        "from numba import carray",
        "",
        "from jitape_kernels.cpu.reduction import extremum_shares, max_of_row, min_of_row, sum_of_row",
        "from jitape_kernels.cpu.vectormath import exp_entry, log_entry, sigmoid_entry, tanh_entry",
        "from jitape_kernels.cpu.workspace import new_work",
        "",
        "",
        f"def kernel({', '.join(f'{name}_at, {name}_n' for name in arrays)}):",
        *[f"    {name} = carray({name}_at, ({name}_n,))" for name in arrays],
        *lines,
        "",
    ])


def _group_source(run, slots, iattr, places, r0, r1, dtype, kept):
    """(source, arguments, whether it computes the reduction after the group) of the generated kernel of fused
    group r0..r1-1, or None where a row's op has no entry rule (_ENTRY_RULES), its broadcasts do not nest
    (loop_nest) or it writes a value over its input (below). A SUM, MIN or MAX of one of its values right after
    it (_absorbed_reduction) is computed in its loop, in the reduction kernel's order: row by row with
    reduction.sum_of_row (max_of_row, min_of_row) along the last axis, entry by entry along the others. The value
    it reduces is then stored only where a row outside the two reads it, or `kept` (per slot: read by gradient
    steps, an output, guard or write). Its arguments: each loop's count, innermost first, then an arena offset per
    broadcast input, per input read from the arena and per output stored there, and the attribute row of each
    SCALE."""
    scalar = "float64" if np.dtype(dtype) == np.float64 else "float32"
    size = int(slots[run[r0, oc.OUT], oc.SIZE])
    if any(run[r, oc.OP] != oc.TILE and run[r, oc.OP] not in _ENTRY_RULES for r in range(r0, r1)):
        return None
    tiles = [r for r in range(r0, r1) if run[r, oc.OP] == oc.TILE]
    tile_runs = [_broadcast_runs(iattr, int(run[r, oc.ATTR])) for r in tiles]
    reduction = _absorbed_reduction(run, iattr, r0, r1, size)
    nest = loop_nest(size, tile_runs + [_reduction_runs(*reduction)]) if reduction else None
    if nest is None:        # the group alone
        reduction = None
        nest = loop_nest(size, tile_runs)
    if nest is None:
        return None
    spans, tile_repeats = nest
    levels = len(spans)
    loops = _Nest(size, spans)
    setup, body, before_inner, after_index = loops.setup, loops.body, loops.before_inner, loops.after_index

    # the value the reduction reads is stored only where another row or a later use reads it
    reduced = int(run[r1, oc.IN0]) if reduction else -1
    others = np.concatenate([run[:r0], run[r1 + 1:]])[:, [oc.IN0, oc.IN1, oc.IN2]]
    unstored = reduced if reduction and not kept[reduced] and not (others == reduced).any() else -1

    values = {}         # slot -> the expression of its entry's value in the innermost loop
    read_offsets, stored_offsets = set(), set()     # of the runs read and stored entry by entry
    for k, r in enumerate(range(r0, r1)):
        op = int(run[r, oc.OP])
        name = f"v{k}"
        if op == oc.TILE:
            loops.view(f"x{k}", "arena", run[r, oc.IN0_OFF], slots[run[r, oc.IN0], oc.SIZE])
            value = loops.broadcast(name, f"x{k}", tile_repeats[tiles.index(r)])
            if value != name:
                body.append(f"{name} = {value}")
        else:
            operands = []
            for c, column in ((oc.IN0, oc.IN0_OFF), (oc.IN1, oc.IN1_OFF), (oc.IN2, oc.IN2_OFF)):
                slot = int(run[r, c])
                if slot < 0:
                    break
                if slot not in values:      # read from the arena, entry by entry
                    offset = loops.argument(run[r, column])
                    setup.append(f"a{k}_{c} = arena[{offset}:{offset} + size]")
                    values[slot] = loops.entries(f"a{k}_{c}")
                    read_offsets.add(int(run[r, column]))
                operands.append(values[slot])
            if op == oc.SCALE:      # its factor, as params() reads it, in the arrays' dtype (as _scale)
                setup.append(f"p{k} = np.{scalar}(fattr[iattr[{loops.argument(run[r, oc.ATTR])}]])")
            expression = _ENTRY_RULES[op].format(*operands, p=f"p{k}")
            body.append(f"{name} = np.{scalar}({expression})")
        values[int(run[r, oc.OUT])] = name
        if places[r, 0] < 0 and run[r, oc.OUT] != unstored:        # the arena keeps its value
            offset = loops.argument(run[r, oc.OUT_OFF])
            setup.append(f"o{k} = arena[{offset}:{offset} + size]")
            body.append(f"{loops.entries(f'o{k}')} = {name}")
            stored_offsets.add(int(run[r, oc.OUT_OFF]))
            if run[r, oc.OUT] == reduced:
                reduced_view = f"o{k}"
    if reduction:
        op, (outer, n, inner), repeats = int(run[r1, oc.OP]), reduction, tile_repeats[-1]
        offset = loops.argument(run[r1, oc.OUT_OFF])
        setup.append(f"red = arena[{offset}:{offset} + {loops.argument(outer * inner)}]")
        stored_offsets.add(int(run[r1, oc.OUT_OFF]))
        value = values[reduced]
        if inner == 1:      # each row's entries in the arena's rows or a row buffer, then the row's reduction
            row_level = spans.index(n) if n in spans else levels
            row_first, row_size = (f"first{row_level}", f"span{row_level}") if row_level < levels else ("0", "size")
            if reduced == unstored:
                setup.append(f"row = np.empty({row_size}, np.{scalar})")
                before_inner.append(f"row_run = row[first - {row_first}:first - {row_first} + n0]")
                body.append(f"row_run[j] = {value}")
                reduced_view = "row"
            else:
                reduced_view = f"{reduced_view}[{row_first}:{row_first} + {row_size}]"
            setup.append("work = new_work()")
            after_index[row_level].append(f"red[{row_first} // {row_size}] = {_ROW_REDUCERS[op]}({reduced_view}, work)")
        else:               # entry by entry into the outputs, each reduced axis's entries in order
            setup.append(f"red[:] = {'0' if op == oc.SUM else 'np.inf' if op == oc.MIN else '-np.inf'}")
            at = loops.position("red", repeats)       # the innermost loop runs along the kept inner axis
            before_inner.append(f"red_run = red[{at}:{at} + n0]")
            if op == oc.SUM:
                body.append(f"red_run[j] = red_run[j] + {value}")
            else:           # reduction._further
                beats = f"{value} {'<' if op == oc.MIN else '>'} red_run[j] or {value} != {value}"
                body.append(f"red_run[j] = {value} if {beats} else red_run[j]")
    # LLVM vectorises the innermost loop behind runtime checks that no run it stores overlaps a run it reads. A
    # value written over its input (layout._in_place) fails them at every call and runs the loop unvectorised,
    # where the block kernels name one array for both (W6b's Adam steps 1.25x slower than block by block): such
    # groups keep the block path.
    if stored_offsets & read_offsets:
        return None
    return _module(FORWARD_ARRAYS, loops.loops()), loops.args, reduction is not None


# The term each op's reverse block kernel adds to its inputs' cotangents for one entry (the loop bodies of
# elementwise.unary_reverse_1d and binary_reverse_1d) as source over the entry's output cotangent {g}, input values
# {x} (IN0) and {w} (IN1), output value {y} and SCALE's factor {p}: the ops a reverse group's generated kernel
# runs, besides SUM, MAX and MIN along the last axis and broadcasts summed in order (layout._reverse_fusable).
_UNARY_TERMS = {
    oc.COPY: "{g}", oc.NEG: "-{g}", oc.SCALE: "{g} * {p}", oc.RELU: "{g} * (one if {x} > 0 else zero)",
    oc.SQUARE: "{g} * ({x} + {x})", oc.EXP: "{g} * {y}", oc.TANH: "{g} * (1 - {y} * {y})",
    oc.SIGMOID: "{g} * ({y} * (1 - {y}))", oc.LOG: "{g} * (1 / float({x}))", oc.SQRT: "{g} * (0.5 / float({y}))",
    # unary_derivative's rule (unary_reverse_1d's last loop), in float64 as there. Not SIN's or COS's: LLVM
    # vectorises their cos and sin in a generated loop, whose values differ from libm's in the last place
    oc.LOG1P: "{g} * (1 / (1 + float({x})))",
}
_BINARY_TERMS = {
    oc.ADD: ("{g}", "{g}"), oc.SUB: ("{g}", "-{g}"), oc.MUL: ("{g} * {w}", "{g} * {x}"),
    oc.DIV: ("{g} * (1 / float({w}))", "{g} * (-float({y}) / float({w}))"),
}


class _KeepsBlocks(Exception):
    """A reverse group its generated kernel cannot run (it keeps the block path)."""


def _reverse_source(code, slots, iattr, places, flags, r, count, dtype):
    """(source, arguments) of the generated kernel of the fused reverse group of step-code rows r, r-1, ..,
    r-count+1 (layout.reverse_groups; flags: planning.reverse_flags' per row), or None where a row has no rule here
    (_UNARY_TERMS, _BINARY_TERMS, SUM, MAX, MIN, TILE) or its broadcasts and reductions do not nest (loop_nest).
    It runs what interpreter.fused_reverse runs block by block (its extrema's shares too), entry by entry in one
    loop nest with the same bits: each entry's cotangents in registers, those of the adjoint rows loaded where the
    group does not write them first and stored after the entry's last row; a broadcast's input's cotangent summed
    in order in the adjoint rows (zeroed first where the group writes it first)."""
    scalar = "float64" if np.dtype(dtype) == np.float64 else "float32"
    rows = [q for q in range(r, r - count, -1) if flags[q] != 0]
    size = max(int(slots[code[r, oc.IN0], oc.SIZE]), int(slots[code[r, oc.OUT], oc.SIZE]))
    patterns = {}       # row -> the runs of its broadcast (TILE) or reduction (SUM, MAX, MIN)
    for q in rows:
        op, a = int(code[q, oc.OP]), int(code[q, oc.ATTR])
        if op == oc.TILE:
            patterns[q] = _broadcast_runs(iattr, a)
        elif op in (oc.SUM, oc.MAX, oc.MIN):
            patterns[q] = _reduction_runs(*(int(v) for v in iattr[a:a + 3]))
        elif op not in _UNARY_TERMS and op not in _BINARY_TERMS:
            return None
    nest = loop_nest(size, list(patterns.values())) if rows else None
    if nest is None:
        return None
    spans, repeats = nest
    repeats = dict(zip(patterns, repeats))
    loops = _Nest(size, spans)
    loops.setup += [f"one = np.{scalar}(1)", f"zero = np.{scalar}(0)"]
    runs = {}           # (array, offset) -> the entry expression of a run read or written entry by entry
    cotangents = {}     # slot -> the register holding its cotangent's entry
    stores = {}         # slot -> the entry expression of its adjoint rows, where its register is stored

    def entry(array, offset):
        key = (array, int(offset))
        if key not in runs:
            name = f"{array[0]}{len(runs)}"
            loops.view(name, array, offset, size)
            runs[key] = loops.entries(name)
        return runs[key]

    def add(q, c, term):
        """The term row q adds to the cotangent of its input c (0..2) at the entry."""
        slot, row = int(code[q, oc.IN0 + c]), int(code[q, oc.IN0_ADJ + c])
        name = cotangents.get(slot)
        if name is None:
            name = cotangents[slot] = f"g{slot}"
            if flags[q] & (2 << c):
                loops.body.append(f"{name} = np.{scalar}({term})")
            elif places[q, 1 + c] >= 0:      # a scratch buffer holds only what the group wrote
                raise _KeepsBlocks
            else:
                loops.body.append(f"{name} = np.{scalar}({entry('flat', row)} + {term})")
            if places[q, 1 + c] < 0:
                stores[slot] = entry("flat", row)
        else:
            loops.body.append(f"{name} = np.{scalar}({name} + {term})")

    def summed(q, k):
        """SUM row q's cotangent at the entry: its reduced entry's."""
        loops.view(f"r{k}", "flat", code[q, oc.OUT_ADJ], slots[code[q, oc.OUT], oc.SIZE])
        return loops.broadcast(f"rg{k}", f"r{k}", repeats[q])

    def on_extrema(q, k):
        """MAX/MIN row q's cotangent at the entry: its row's share of the cotangent where the entry is the row's
        extremum, else 0 (_extremum_transposed's). The share divides the reduced entry's cotangent by the row's
        ties (extremum_shares), counted before each run of the innermost loop where that runs along whole rows
        (each row read once more from cache), else by extremum_shares before the loops (over the reduced
        cotangent, which nothing reads after)."""
        n, n_out = int(iattr[code[q, oc.ATTR] + 1]), slots[code[q, oc.OUT], oc.SIZE]
        x = entry("arena", code[q, oc.IN0_OFF])
        loops.view(f"r{k}", "flat", code[q, oc.OUT_ADJ], n_out)
        loops.view(f"e{k}", "arena", code[q, oc.OUT_OFF], n_out)
        extremum = loops.broadcast(f"re{k}", f"e{k}", repeats[q])
        if repeats[q][0] and (spans[1] if len(spans) > 1 else size) == n:
            loops.before_inner += [f"ties{k} = 0", "for t in range(n0):",
                                   f"    ties{k} += {x.replace('[j]', '[t]')} == {extremum}"]
            share = loops.broadcast(f"rg{k}", f"r{k}", repeats[q])
            loops.before_inner.append(f"rs{k} = np.{scalar}({share} / np.{scalar}(max(ties{k}, 1)))")
            share = f"rs{k}"
        else:
            loops.view(f"x{k}", "arena", code[q, oc.IN0_OFF], size)
            loops.setup.append(f"extremum_shares(x{k}, e{k}, r{k}, {loops.argument(n)})")
            share = loops.broadcast(f"rg{k}", f"r{k}", repeats[q])
        return f"{share} * (one if {x} == {extremum} else zero)"

    try:
        for k, q in enumerate(rows):
            op = int(code[q, oc.OP])
            has = [code[q, oc.IN0 + c] >= 0 and code[q, oc.IN0_ADJ + c] >= 0 for c in range(3)]
            if op in (oc.SUM, oc.MAX, oc.MIN):
                if has[0]:
                    add(q, 0, (summed if op == oc.SUM else on_extrema)(q, k))
                continue
            out = int(code[q, oc.OUT])
            if out in cotangents:
                g = cotangents[out]
            elif places[q, 0] >= 0:
                raise _KeepsBlocks
            else:
                g = entry("flat", code[q, oc.OUT_ADJ])
            if op == oc.TILE:       # summed in order into its input's cotangent (shape.broadcast_sum_block)
                if has[0]:
                    if repeats[q][0]:
                        raise _KeepsBlocks
                    loops.view(f"t{k}", "flat", code[q, oc.IN0_ADJ], slots[code[q, oc.IN0], oc.SIZE])
                    if flags[q] & 2:
                        loops.setup.append(f"t{k}[:] = 0")
                    loops.body.append(f"{loops.broadcast('', f't{k}', repeats[q])} += {g}")
                continue
            operands = {"g": g}
            if op == oc.SCALE:
                loops.setup.append(f"p{k} = np.{scalar}(fattr[iattr[{loops.argument(code[q, oc.ATTR])}]])")
                operands["p"] = f"p{k}"
            terms = [_UNARY_TERMS[op]] if op in _UNARY_TERMS else _BINARY_TERMS[op]
            for key, column in (("x", oc.IN0_OFF), ("w", oc.IN1_OFF), ("y", oc.OUT_OFF)):
                if any(f"{{{key}}}" in term for c, term in enumerate(terms) if has[c]):
                    operands[key] = entry("arena", code[q, column])
            for c, term in enumerate(terms):
                if has[c]:
                    add(q, c, term.format(**operands))
    except _KeepsBlocks:
        return None
    loops.body += [f"{where} = {cotangents[slot]}" for slot, where in stores.items()]
    return _module(REVERSE_ARRAYS, loops.loops()), loops.args


def _compiled(source, dtype, arrays):
    """The CFunc of a generated kernel's source over `arrays` (kernel_signature's): this process's, else loaded
    from (or compiled into) the cache."""
    digest = hashlib.sha256(f"{source}{np.dtype(dtype).name}".encode()).hexdigest()[:24]
    kernel = _COMPILED.get(digest)
    if kernel is not None:
        return kernel
    _GENERATED_DIR.mkdir(parents=True, exist_ok=True)
    path = _GENERATED_DIR / f"group_{digest}.py"
    # written once (numba's cache is keyed on the file's time stamp); a file another process is writing, or a
    # damaged one, is replaced
    if not path.exists() or path.read_text() != source:
        with tempfile.NamedTemporaryFile("w", dir=_GENERATED_DIR, suffix=".tmp", delete=False) as file:
            file.write(source)
        os.replace(file.name, path)
    name = f"jitape_kernels.cpu.fusion.group_{digest}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module      # where numba's cached environment of the kernel finds its globals
    spec.loader.exec_module(module)
    signature = kernel_signature(dtype, arrays)
    kernel = CFunc(module.kernel, (signature.args, signature.return_type), {}, {"error_model": "numpy"})
    kernel._cache = _KernelCache(module.kernel)
    kernel.compile()
    _COMPILED[digest] = kernel
    return kernel


class GroupKernels:
    """The generated kernels of a replay's fused groups: the forward's of its run layout (interpreter._forward_rows)
    and the reverse's of its gradient steps (interpreter.fused_reverse), in one table a replay reads (a row per
    run-code row, then a row per step-code row) with their arguments, every address 0 until compile() fills them
    in place. kept: per slot, whether its value is read after the forward rows (by gradient steps, or as an
    output, guard or write); step_groups, step_places, step_flags: layout.reverse_groups' and the steps' planned
    flags (layout.scalar_runs' SC_FLAGS)."""

    def __init__(self, run, slots, iattr, fused, places, dtype, kept, step_code, step_groups, step_places,
                 step_flags):
        self.dtype = np.dtype(dtype)
        n_run = run.shape[0]
        self.table = np.zeros((n_run + step_code.shape[0], KERNEL_COLUMNS), np.int64)
        self._pending = []      # (table row, source, arrays)
        self._kernels = []      # the compiled CFuncs, alive while the table holds their addresses
        args = []

        def add(row, generated, arrays, end):
            source, group_args = generated
            self.table[row, KERNEL_ARGS:] = len(args), len(group_args), end
            args.extend(group_args)
            self._pending.append((row, source, arrays))

        for r0 in np.flatnonzero(fused > np.arange(fused.size)).tolist():
            generated = _group_source(run, slots, iattr, places, r0, int(fused[r0]), self.dtype, kept)
            if generated is not None:
                source, group_args, absorbs = generated
                add(r0, (source, group_args), FORWARD_ARRAYS, int(fused[r0]) + absorbs)
        for r in np.flatnonzero(step_groups > 1).tolist():
            generated = _reverse_source(step_code, slots, iattr, step_places, step_flags, r, int(step_groups[r]),
                                        self.dtype)
            if generated is not None:
                add(n_run + r, generated, REVERSE_ARRAYS, 0)
        self.args = np.array(args, np.int64)

    @property
    def pending(self):
        return bool(self._pending)

    def compile(self):
        """Compile (or load) every group's kernel and put its address in the table."""
        for row, source, arrays in self._pending:
            kernel = _compiled(source, self.dtype, arrays)
            self._kernels.append(kernel)
            self.table[row, KERNEL_ADDRESS] = kernel.address
        self._pending = []
