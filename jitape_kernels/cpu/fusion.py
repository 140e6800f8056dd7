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

The rows' rules are elementwise.unary_entry / binary_entry / where_entry, the
per-entry values the block kernels store, each rounded to the arena's dtype
as a block would be: a replay gives the same bits from either path.

Groups whose broadcasts do not fit one (outer, inner) loop nest (an input
repeated along more than one run of axes) keep the block path. A variant's
groups are compiled after a few runs (jitape.config.fused_kernel_runs): a
function called once never waits for a compile.
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

# the kernels' table, per run-code row that starts a generated group: its kernel's address (0: none; the block
# path), where its arguments start in the argument array and how many, and its loop nest's outer and inner counts
(KERNEL_ADDRESS, KERNEL_ARGS, KERNEL_ARG_COUNT, KERNEL_OUTER, KERNEL_INNER) = range(5)
KERNEL_COLUMNS = 5

_GENERATED_DIR = _CACHE_DIR / "fused"
_COMPILED = {}      # source digest -> CFunc, for this process


@intrinsic
def call_kernel(typingctx, address, arena, iattr, fattr, args, outer, inner):
    """Call the generated kernel at `address` (a CFunc of kernel_signature) over these arrays' memory."""
    arrays = (arena, iattr, fattr, args)
    if not (isinstance(address, types.Integer) and all(isinstance(a, types.Array) and a.ndim == 1 for a in arrays)
            and isinstance(outer, types.Integer) and isinstance(inner, types.Integer)):
        return None

    def codegen(context, builder, signature, llargs):
        values = []
        for array_type, value in zip(signature.args[1:5], llargs[1:5]):
            view = context.make_array(array_type)(context, builder, value=value)
            values += [view.data, cgutils.unpack_tuple(builder, view.shape, 1)[0]]
        values += [context.cast(builder, llargs[5], signature.args[5], types.int64),
                   context.cast(builder, llargs[6], signature.args[6], types.int64)]
        function_type = ir.FunctionType(ir.VoidType(), [v.type for v in values])
        target = builder.inttoptr(context.cast(builder, llargs[0], signature.args[0], types.int64),
                                  function_type.as_pointer())
        builder.call(target, values)
        return context.get_dummy_value()
    return types.none(address, arena, iattr, fattr, args, outer, inner), codegen


def kernel_signature(dtype):
    """A generated kernel's C signature: (arena, its size, iattr, size, fattr, size, args, size, outer, inner)."""
    element = types.float64 if np.dtype(dtype) == np.float64 else types.float32
    return types.void(types.CPointer(element), types.int64, types.CPointer(types.int64), types.int64,
                      types.CPointer(types.float64), types.int64, types.CPointer(types.int64), types.int64,
                      types.int64, types.int64)


def _broadcast_pattern(iattr, a):
    """How TILE a (a broadcast) indexes its input over the entries of its output as an (outer, inner) nest:
    ("fill", 1) for one entry; ("e", 0) for a copy; ("i", inner) where each outer index repeats one entry (a
    column), ("j", inner) where each outer index repeats the input (a row); None for anything else."""
    rank = int(iattr[a])
    in_dims, out_dims = iattr[a + 1:a + 1 + rank], iattr[a + 1 + rank:a + 1 + 2 * rank]
    runs = []       # [repeats, entries] of the output's axes merged while all repeat the input or none does
    for n_in, n_out in zip(in_dims.tolist(), out_dims.tolist()):
        if n_out == 1:
            continue
        repeats = n_in != n_out
        if runs and runs[-1][0] == repeats:
            runs[-1][1] *= n_out
        else:
            runs.append([repeats, n_out])
    if not runs or all(r for r, _ in runs):
        return "fill", 1
    if len(runs) == 1:
        return "e", 0
    if len(runs) == 2:
        return ("i" if runs[1][0] else "j"), runs[1][1]
    return None


def _group_source(run, slots, iattr, places, r0, r1, dtype):
    """(source, arguments, inner count) of the generated kernel of fused group r0..r1-1, or None where its
    broadcasts do not fit one loop nest. Its arguments: an arena offset per input read from the arena and per
    output stored there, and an attribute row per row with parameters."""
    scalar = "float64" if np.dtype(dtype) == np.float64 else "float32"
    size = int(slots[run[r0, oc.OUT], oc.SIZE])
    inner = None
    values = {}         # slot -> the name of its entry's value in the loop
    setup, outer_body, body, args = [], [], [], []

    def argument(value):
        args.append(int(value))
        return f"args[{len(args) - 1}]"

    for k, r in enumerate(range(r0, r1)):
        op = int(run[r, oc.OP])
        name = f"v{k}"
        if op == oc.TILE:
            pattern = _broadcast_pattern(iattr, int(run[r, oc.ATTR]))
            if pattern is None:
                return None
            kind, count = pattern
            if kind in ("i", "j"):
                if inner is not None and inner != count:
                    return None
                inner = count
            offset = argument(run[r, oc.IN0_OFF])
            n_in = int(slots[run[r, oc.IN0], oc.SIZE])
            if kind == "fill":
                setup.append(f"{name} = arena[{offset}]")
            elif kind == "i":
                setup.append(f"x{k} = arena[{offset}:{offset} + {n_in}]")
                outer_body.append(f"{name} = x{k}[i]")
            else:
                setup.append(f"x{k} = arena[{offset}:{offset} + {n_in}]")
                outer_body.append(f"x{k}_row = x{k}[base:base + inner]" if kind == "e" else f"x{k}_row = x{k}")
                body.append(f"{name} = x{k}_row[j]")
        else:
            operands = []
            for c, column in ((oc.IN0, oc.IN0_OFF), (oc.IN1, oc.IN1_OFF), (oc.IN2, oc.IN2_OFF)):
                slot = int(run[r, c])
                if slot < 0:
                    break
                if slot not in values:      # read from the arena, entry by entry
                    values[slot] = f"a{len(values)}_{k}"
                    offset = argument(run[r, column])
                    setup.append(f"{values[slot]}_all = arena[{offset}:{offset} + size]")
                    outer_body.append(f"{values[slot]}_row = {values[slot]}_all[base:base + inner]")
                    values[slot] = f"{values[slot]}_row[j]"
                operands.append(values[slot])
            if op <= oc.UNARY_LAST:
                setup.append(f"p{k}, q{k} = params({op}, iattr, fattr, {argument(run[r, oc.ATTR])})")
                p = f"np.{scalar}(p{k})" if op == oc.SCALE else f"p{k}"
                expression = f"unary_entry({op}, {operands[0]}, {p}, q{k})"
            elif op <= oc.BINARY_LAST:
                expression = f"binary_entry({op}, {operands[0]}, {operands[1]})"
            else:
                expression = f"where_entry({operands[0]}, {operands[1]}, {operands[2]})"
            body.append(f"{name} = np.{scalar}({expression})")
        values[int(run[r, oc.OUT])] = name
        if places[r, 0] < 0:        # the arena keeps its value
            offset = argument(run[r, oc.OUT_OFF])
            setup.append(f"o{k}_all = arena[{offset}:{offset} + size]")
            outer_body.append(f"o{k}_row = o{k}_all[base:base + inner]")
            body.append(f"o{k}_row[j] = {name}")
    inner = size if inner is None else inner
    lines = [
        '"""A fused group\'s kernel, generated by jitape_kernels.cpu.fusion."""',
        "import numpy as np",
        "from numba import carray",
        "from jitape_kernels.cpu.elementwise import binary_entry, unary_entry, where_entry",
        "from jitape_kernels.cpu.interpreter import params",
        "",
        "",
        "def kernel(arena_at, arena_n, iattr_at, iattr_n, fattr_at, fattr_n, args_at, args_n, outer, inner):",
        "    arena = carray(arena_at, (arena_n,))",
        "    iattr = carray(iattr_at, (iattr_n,))",
        "    fattr = carray(fattr_at, (fattr_n,))",
        "    args = carray(args_at, (args_n,))",
        "    size = outer * inner",
        *(f"    {line}" for line in setup),
        "    for i in range(outer):",
        "        base = i * inner",
        *(f"        {line}" for line in outer_body),
        "        for j in range(inner):",
        *(f"            {line}" for line in body),
        "",
    ]
    return "\n".join(lines), args, inner


def _compiled(source, dtype):
    """The CFunc of a generated kernel's source: this process's, else loaded from (or compiled into) the cache."""
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
    signature = kernel_signature(dtype)
    kernel = CFunc(module.kernel, (signature.args, signature.return_type), {}, {"error_model": "numpy"})
    kernel._cache = _KernelCache(module.kernel)
    kernel.compile()
    _COMPILED[digest] = kernel
    return kernel


class GroupKernels:
    """The generated kernels of a run layout's fused groups: the table and arguments a replay reads
    (interpreter._forward_rows), with every address 0 until compile() fills them in place."""

    def __init__(self, run, slots, iattr, fused, places, dtype):
        self.dtype = np.dtype(dtype)
        self.table = np.zeros((run.shape[0], KERNEL_COLUMNS), np.int64)
        self._pending = []      # (row, source)
        self._kernels = []      # the compiled CFuncs, alive while the table holds their addresses
        args = []
        for r0 in np.flatnonzero(fused > np.arange(fused.size)).tolist():
            generated = _group_source(run, slots, iattr, places, r0, int(fused[r0]), self.dtype)
            if generated is None:
                continue
            source, group_args, inner = generated
            size = int(slots[run[r0, oc.OUT], oc.SIZE])
            self.table[r0, KERNEL_ARGS:] = len(args), len(group_args), size // inner, inner
            args += group_args
            self._pending.append((r0, source))
        self.args = np.array(args, np.int64)

    @property
    def pending(self):
        return bool(self._pending)

    def compile(self):
        """Compile (or load) every group's kernel and put its address in the table."""
        for r0, source in self._pending:
            kernel = _compiled(source, self.dtype)
            self._kernels.append(kernel)
            self.table[r0, KERNEL_ADDRESS] = kernel.address
        self._pending = []
