"""jt.save and jt.load: traced functions and Programs on disk as .npz files of plain arrays.

A file holds the arrays of each Program, the opcode-name table it was written
with, a JSON description (format version, declared inputs, outputs, guards,
variable writes, gradient and host steps, the variables' values; a version 2
file, written before host steps, reads as one without) and a SHA-256 checksum over all of
it. It is never pickled, and loading executes nothing from it: every number
the compiled kernels will index with is checked first (slot and attribute
ranges, sizes against shapes, every op's attribute block against its operands),
so a corrupt or crafted file raises ProgramFileError and can never make
compiled code read or write out of bounds.
"""
import hashlib
import io
import json
import math
from pathlib import Path

import numpy as np

from jitape_kernels import opcodes as oc
from jitape_kernels.planning import derivative_plan

from . import nest
from .program import Program
from .replay import HOST_STEP_KINDS, Concrete, Function, derivative_size
from .tensor import Tensor, Variable

FORMAT = "jitape-program"


class ProgramFileError(ValueError):
    """A file jt.load refuses: not a jitape file, another format version, corrupt or inconsistent."""


# -- saving ----------------------------------------------------------------------------------------------
def save(path, obj):
    """Write a jt.function (every traced variant, and the variables it reads and writes) or a Program to
    `path` (.npz).

    >>> import jitape as jt, tempfile, os
    >>> f = jt.function(lambda x: jt.reduce_sum(x * x))
    >>> _ = f(jt.constant([1.0, 2.0]))
    >>> path = os.path.join(tempfile.mkdtemp(), "f.npz")
    >>> jt.save(path, f)
    >>> float(jt.load(path)(jt.constant([3.0, 4.0])))
    25.0
    """
    writer = _Writer()
    if isinstance(obj, Function):
        if not obj._variants:
            raise ValueError("jt.save: the function has not been traced yet; call it once first")
        meta = {"kind": "function", "name": obj.__name__, "variants": [
            writer.variant(key, concrete) for key, variants in obj._variants.items() for concrete in variants]}
    elif isinstance(obj, Program):
        meta = {"kind": "program", "program": writer.program(obj)}
    else:
        raise TypeError(f"jt.save: expected a jt.function or a Program, got {type(obj).__name__}")
    meta.update(format=FORMAT, version=oc.FORMAT_VERSION, variables=writer.variables_meta())
    arrays = dict(writer.arrays, meta=np.array(json.dumps(meta)), opcodes=np.array(oc.NAMES))
    arrays["checksum"] = np.array(_checksum(arrays))
    with open(path, "wb") as f:
        np.savez(f, **arrays)


class _Writer:
    def __init__(self):
        self.arrays = {}
        self.variables = []         # in first-seen order

    def array(self, value):
        key = f"a{len(self.arrays)}"
        self.arrays[key] = np.ascontiguousarray(value)
        return key

    def variable(self, v):
        for i, known in enumerate(self.variables):
            if known is v:
                return i
        self.variables.append(v)
        return len(self.variables) - 1

    def variables_meta(self):
        return [{"name": v.name, "trainable": v.trainable, "value": self.array(np.asarray(v._value))}
                for v in self.variables]

    def arrays_of(self, code, slots, iattr, fattr, arena):
        return {"code": self.array(code[:, :oc.ATTR + 1]), "slots": self.array(slots),
                "iattr": self.array(iattr), "fattr": self.array(fattr), "arena": self.array(arena)}

    def program(self, program):
        program.complete()
        meta = self.arrays_of(program.code, program.slots, program.iattr, program.fattr, program.arena)
        meta.update(targets=program.targets.tolist(), sources=program.sources.tolist(),
                    aliases=[a.tolist() for a in program.source_aliases])
        return meta

    def variant(self, key, concrete):
        # a loaded function's key is a string, as it was saved (and checked) first
        for leaf in key[1] if not isinstance(key, str) else ():
            if leaf[0] in ("object", "variable"):
                raise ValueError(f"jt.save: a traced variant takes a {leaf[0]} argument ({leaf}); only tensors, "
                                 f"arrays and Python numbers or strings can be saved as arguments")
        meta = self.arrays_of(concrete.code, concrete.slots, concrete.iattr, concrete.fattr, concrete.arena)
        meta.update(
            key=key if isinstance(key, str) else repr(key),
            arg_slots=[[i, s] for i, s in concrete.arg_slots],
            variable_inputs=[[self.variable(v), s] for v, s in concrete.variable_inputs],
            structure=_encode_structure(concrete.structure),
            outputs=[self.output(entry) for entry in concrete.outputs],
            writes=[[self.variable(v), s if isinstance(s, int) else {"array": self.array(s)}]
                    for v, s in concrete.writes],
            guards=[[s, self.array(expected), how] for s, expected, how in concrete.slot_guards],
            variable_guards=[[self.variable(v), self.array(expected), how]
                             for v, expected, how in concrete.variable_guards],
            gradient_steps=[[position, target, [list(pair) for pair in pairs], self.array(rows)]
                            for position, target, pairs, rows in concrete.gradient_steps],
            host_steps=[[position, kind, target, [list(pair) for pair in pairs], self.array(rows)]
                        for position, kind, target, pairs, rows in concrete.host_steps])
        return meta

    def output(self, entry):
        if entry[0] == "slot":
            _, slot, shape, dtype = entry
            return {"slot": slot, "shape": list(shape), "dtype": np.dtype(dtype).str}
        leaf = entry[1]
        if isinstance(leaf, Variable):
            return {"variable": self.variable(leaf)}
        if isinstance(leaf, (Tensor, np.ndarray)):
            return {"tensor" if isinstance(leaf, Tensor) else "array": self.array(np.asarray(getattr(leaf, "_value",
                                                                                                      leaf)))}
        if leaf is None or isinstance(leaf, (bool, int, float, str)):
            return {"python": leaf}
        raise ValueError(f"jt.save: the function returns a {type(leaf).__name__}, which cannot be saved")


def _encode_structure(s):
    if isinstance(s, list):
        return {"list": [_encode_structure(i) for i in s]}
    if isinstance(s, tuple):
        if hasattr(s, "_fields"):
            raise ValueError("jt.save: named tuples in a function's outputs cannot be saved")
        return {"tuple": [_encode_structure(i) for i in s]}
    if isinstance(s, dict):
        if not all(isinstance(k, (str, int)) and not isinstance(k, bool) for k in s):
            raise ValueError("jt.save: dicts in a function's outputs need str or int keys")
        return {"dict": [[k, _encode_structure(v)] for k, v in s.items()]}
    return None


def _checksum(arrays):
    digest = hashlib.sha256()
    for name in sorted(arrays):
        if name == "checksum":
            continue
        a = np.ascontiguousarray(arrays[name])
        digest.update(f"{name}|{a.dtype.str}|{a.shape}|".encode())
        digest.update(a.tobytes())
    return digest.hexdigest()


# -- loading ---------------------------------------------------------------------------------------------
def load(path):
    """Read a file written by jt.save: a function that replays and differentiates its saved traces (its
    variables in `.variables`), or a Program. Everything is validated before anything runs."""
    arrays = _read(path)
    meta = _field(arrays, "meta", "U", 0)
    try:
        meta = json.loads(str(meta))
    except ValueError:
        raise ProgramFileError(f"{path}: its description is not valid JSON") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ProgramFileError(f"{path}: not a jitape program file")
    if meta.get("version") not in oc.READABLE_VERSIONS:
        raise ProgramFileError(f"{path}: written in format version {meta.get('version')!r}; this jitape reads "
                               f"versions {', '.join(map(str, oc.READABLE_VERSIONS))}")
    checksum = _field(arrays, "checksum", "U", 0)
    if str(checksum) != _checksum(arrays):
        raise ProgramFileError(f"{path}: checksum mismatch: the file is corrupt or was edited")
    opcodes = _opcode_map(_field(arrays, "opcodes", "U", 1), path)
    try:
        return _Reader(arrays, opcodes, path, meta["version"]).build(meta)
    except ProgramFileError:
        raise
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, OverflowError) as e:
        raise ProgramFileError(f"{path}: inconsistent description ({type(e).__name__}: {e})") from None


def _read(path):
    try:
        data = Path(path).read_bytes()
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            return {name: npz[name] for name in npz.files}
    except FileNotFoundError:
        raise
    except Exception as e:     # numpy, zipfile and zlib raise a variety of errors on corrupt members
        raise ProgramFileError(f"{path}: not a readable .npz file ({type(e).__name__}: {e})") from None


def _field(arrays, name, kind, ndim):
    a = arrays.get(name)
    if a is None:
        raise ProgramFileError(f"not a jitape program file: no {name!r} entry")
    if a.dtype.kind != kind or a.ndim != ndim:
        raise ProgramFileError(f"entry {name!r} has dtype {a.dtype} and {a.ndim} dims, expected kind {kind!r} "
                               f"and {ndim} dims")
    return a[()] if ndim == 0 else a


def _opcode_map(names, path):
    table = {name: i for i, name in enumerate(oc.NAMES)}
    unknown = [str(n) for n in names if str(n) not in table]
    if unknown:
        raise ProgramFileError(f"{path}: opcodes unknown to this version of jitape: {unknown}")
    return np.array([table[str(n)] for n in names], np.int64)


class _Reader:
    def __init__(self, arrays, opcodes, path, version):
        self.arrays, self.opcodes, self.path, self.version = arrays, opcodes, path, version

    def error(self, what):
        return ProgramFileError(f"{self.path}: {what}")

    def array(self, key, kind=None, ndim=None):
        if not isinstance(key, str) or key not in self.arrays or key in ("meta", "opcodes", "checksum"):
            raise self.error(f"missing array {key!r}")
        a = self.arrays[key]
        if (kind is not None and a.dtype.kind not in kind) or (ndim is not None and a.ndim != ndim):
            raise self.error(f"array {key!r} has dtype {a.dtype} and shape {a.shape}")
        return a

    def build(self, meta):
        self.variables = [self.variable(v) for v in meta["variables"]]
        if meta["kind"] == "program":
            return self.program(meta["program"])
        if meta["kind"] != "function":
            raise self.error(f"unknown kind {meta['kind']!r}")
        loaded = LoadedFunction(str(meta["name"]), self.variables)
        for variant in meta["variants"]:
            key, concrete = self.variant(variant)
            loaded._variants.setdefault(key, []).append(concrete)
        return loaded

    def variable(self, meta):
        value = self.array(meta["value"], "fiub")
        return Variable(value.copy(), trainable=bool(meta["trainable"]), name=str(meta["name"]))

    def program_arrays(self, meta):
        code = self.array(meta["code"], "i", 2)
        slots = self.array(meta["slots"], "i", 2)
        iattr = self.array(meta["iattr"], "i", 1)
        fattr = self.array(meta["fattr"], "f", 1)
        arena = self.array(meta["arena"], "f", 1)
        if arena.dtype not in (np.float32, np.float64) or fattr.dtype != np.float64:
            raise self.error(f"arena dtype {arena.dtype} / attribute dtype {fattr.dtype} not supported")
        return validated(code.astype(np.int64), slots.astype(np.int64), iattr.astype(np.int64), fattr,
                         arena.copy(), self.opcodes, self.error)

    def slot(self, value, n_slots):
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < n_slots:
            raise self.error(f"slot {value!r} out of range [0, {n_slots})")
        return value

    def program(self, meta):
        code, slots, iattr, fattr, arena = self.program_arrays(meta)
        n = slots.shape[0]
        targets = [t if t == -1 else self.slot(t, n) for t in meta["targets"]]
        sources = [s if s == -1 else self.slot(s, n) for s in meta["sources"]]
        aliases = tuple(np.array([self.slot(s, n) for s in a], np.int64) for a in meta["aliases"])
        if len(aliases) != len(sources):
            raise self.error("one alias list per source expected")
        all_sources = np.array(sources + [s for a in aliases for s in a.tolist()], np.int64)
        planned, adjoint_rows, adjoint_size, *_ = derivative_plan(code, slots, np.array(targets, np.int64),
                                                                 all_sources)
        return Program(planned, slots, iattr, fattr, arena, adjoint_rows, int(adjoint_size),
                       np.array(targets, np.int64), np.array(sources, np.int64), aliases)

    def variant(self, meta):
        code, slots, iattr, fattr, arena = self.program_arrays(meta)
        n = slots.shape[0]
        concrete = Concrete.__new__(Concrete)
        concrete.code, concrete.slots, concrete.iattr, concrete.fattr, concrete.arena = code, slots, iattr, fattr, arena
        concrete.dtype = arena.dtype
        concrete.arg_slots = [(self.index(i), self.slot(s, n)) for i, s in meta["arg_slots"]]
        concrete.variable_inputs = [(self.var(v), self.sized(self.slot(s, n), slots, self.var(v).size))
                                    for v, s in meta["variable_inputs"]]
        concrete.structure = _decode_structure(meta["structure"])
        concrete.outputs = [self.output(entry, slots) for entry in meta["outputs"]]
        if len(concrete.outputs) != len(nest.flatten(concrete.structure)):
            raise self.error("the outputs do not match their structure")
        concrete.writes = [[self.var(v), self.write(s, slots, self.var(v))] for v, s in meta["writes"]]
        concrete.slot_guards = [[self.sized(self.slot(s, n), slots, None, expected := self.array(a, "fiub")),
                                 np.ravel(expected).astype(arena.dtype), str(how)] for s, a, how in meta["guards"]]
        concrete.variable_guards = [(self.var(v), self.array(a), str(how)) for v, a, how in meta["variable_guards"]]
        concrete._plans = {}
        concrete.gradient_steps = [self.gradient_step(step, code.shape[0], slots) for step in meta["gradient_steps"]]
        if [s[0] for s in concrete.gradient_steps] != sorted(s[0] for s in concrete.gradient_steps):
            raise self.error("gradient steps out of order")
        host_steps = meta["host_steps"] if self.version >= 3 else []
        concrete.host_steps = [self.host_step(step, code.shape[0], slots) for step in host_steps]
        if [s[0] for s in concrete.host_steps] != sorted(s[0] for s in concrete.host_steps):
            raise self.error("host steps out of order")
        concrete.prepare()
        return str(meta["key"]), concrete

    def gradient_step(self, step, n_code, slots):
        # a version 2 step differentiates every row before it
        position, target, pairs, rows = step if self.version >= 3 else (*step, None)
        rows = self.step_rows(position, rows, n_code)
        n = slots.shape[0]
        pairs = [(self.slot(s, n), self.sized(self.slot(out, n), slots, int(slots[s, oc.SIZE]))) for s, out in pairs]
        return [position, self.slot(target, n), pairs, rows]

    def step_rows(self, position, key, n_code):
        """A step's rows: the rows before its position it differentiates, ascending (key None: all of them)."""
        if not isinstance(position, int) or isinstance(position, bool) or not 0 <= position <= n_code:
            raise self.error(f"step position {position!r} out of range")
        if key is None:
            return np.arange(position)
        rows = self.array(key, "i", 1).astype(np.int64)
        if rows.size and (rows[0] < 0 or rows[-1] >= position or np.any(np.diff(rows) <= 0)):
            raise self.error(f"a step's rows are not ascending rows before its position {position}")
        return rows

    def host_step(self, step, n_code, slots):
        position, kind, target, pairs, rows = step
        rows = self.step_rows(position, rows, n_code)
        if kind not in HOST_STEP_KINDS.values() or not pairs or kind == "hessian" and len(pairs) != 1:
            raise self.error(f"a host step of kind {kind!r} with {len(pairs)} sources")
        n = slots.shape[0]
        target = self.slot(target, n)
        checked = []
        for source, out in pairs:
            source = self.slot(source, n)
            size = derivative_size(kind, int(slots[target, oc.SIZE]), int(slots[source, oc.SIZE]))
            checked.append((source, self.sized(self.slot(out, n), slots, size)))
        return [position, kind, target, checked, rows]

    def index(self, value):
        if not isinstance(value, int) or value < 0:
            raise self.error(f"argument index {value!r} is not a non-negative int")
        return value

    def var(self, index):
        if not isinstance(index, int) or not 0 <= index < len(self.variables):
            raise self.error(f"variable index {index!r} out of range")
        return self.variables[index]

    def sized(self, slot, slots, size, expected=None):
        size = expected.size if expected is not None else size
        if slots[slot, oc.SIZE] != size:
            raise self.error(f"slot {slot} holds {slots[slot, oc.SIZE]} entries, its declared use {size}")
        return slot

    def write(self, source, slots, variable):
        if isinstance(source, dict):
            value = self.array(source["array"], "fiub")
            if value.size != variable.size:
                raise self.error("a variable write has the wrong size")
            return value
        return self.sized(self.slot(source, slots.shape[0]), slots, variable.size)

    def output(self, entry, slots):
        if "slot" in entry:
            shape = tuple(int(d) for d in entry["shape"])
            if any(d < 0 for d in shape) or np.dtype(entry["dtype"]).kind not in "fiub":
                raise self.error(f"output shape {shape} or dtype {entry['dtype']!r} not valid")
            slot = self.sized(self.slot(entry["slot"], slots.shape[0]), slots, math.prod(shape))
            return ["slot", slot, shape, np.dtype(entry["dtype"])]
        if "variable" in entry:
            return ["value", self.var(entry["variable"])]
        if "tensor" in entry:
            return ["value", Tensor(self.array(entry["tensor"]).copy()[()])]
        if "array" in entry:
            return ["value", self.array(entry["array"]).copy()]
        return ["value", entry["python"]]


def _decode_structure(s):
    if s is None:
        return None
    if "list" in s:
        return [_decode_structure(i) for i in s["list"]]
    if "tuple" in s:
        return tuple(_decode_structure(i) for i in s["tuple"])
    return {k: _decode_structure(v) for k, v in s["dict"]}


class LoadedFunction(Function):
    """A function read by jt.load: it replays and differentiates the traces it was saved with; it has no
    Python code, so a call no saved trace serves (new shapes, a guard that differs) raises."""
    has_python = False

    def __init__(self, name, variables):
        self.__name__ = self.__qualname__ = name
        self.variables = tuple(variables)
        self.python_function = self._no_python
        self.retrace_warning = None
        self.backend = None
        self.differentiated = False
        self.trace_count = 0
        self._variants = {}
        self._last_key = None
        self._warned = False

    def _no_python(self, *args, **kwargs):
        raise ValueError(f"the loaded function {self.__name__!r} cannot run here: it has no Python code, and this "
                         f"call needs it (under a recording tape, or no saved trace serves these arguments)")

    def _replay(self, key, leaves, args, kwargs, purpose, first=0, sweeps=(), bound_later=False):
        key = repr(key)     # as saved (sweeps, bound_later: a trace's, which a loaded function never makes)
        variants = self._variants.get(key)
        if not variants:
            raise ValueError(f"the loaded function {self.__name__!r} has no saved trace for arguments "
                             f"{key[:300]}; saved: {[k[:300] for k in self._variants]}")
        for concrete in variants:
            if concrete.run(leaves, self.backend, purpose):
                return concrete, leaves, None
        raise ValueError(f"the loaded function {self.__name__!r}: no saved trace's guards hold for this call "
                         f"(first guard that differs: {variants[0].failed_guard()})")



# -- validation ------------------------------------------------------------------------------------------
def validated(code6, slots, iattr, fattr, arena, opcodes, error):
    """The full code [n, W] of a Program read from a file, with offsets taken from its slots, after checking
    every number the kernels index with; raises error(...) otherwise."""
    n_slots = slots.shape[0]
    if code6.shape[1] != oc.ATTR + 1 or slots.shape[1] != oc.S:
        raise error(f"code has {code6.shape[1]} columns and slots {slots.shape[1]}, expected {oc.ATTR + 1} "
                    f"and {oc.S}")
    _check_slots(slots, arena.size, error)
    saved_ops = code6[:, oc.OP]
    if np.any((saved_ops < 0) | (saved_ops >= opcodes.size)):
        raise error("an instruction's opcode is out of range")
    ops = opcodes[saved_ops]
    arity = np.array(oc.ARITY)[ops]
    for c in range(3):
        column = code6[:, oc.IN0 + c]
        present = arity > c
        if np.any(present & ((column < 0) | (column >= n_slots))) or np.any(~present & (column != -1)):
            raise error(f"an instruction's input {c} is out of range or present where its op takes none")
    out = code6[:, oc.OUT]
    if np.any((out < 0) | (out >= n_slots)):
        raise error("an instruction's output slot is out of range")
    sizes = slots[:, oc.SIZE]
    elementwise = np.array([f in ("unary", "binary", "compare", "where") for f in oc.FAMILIES])[ops]
    for c in range(3):
        present = elementwise & (arity > c)
        if np.any(sizes[code6[present, oc.IN0 + c]] != sizes[out[present]]):
            raise error("an elementwise instruction's operands differ in size from its output")
    has_attr = np.array([bool(a) for a in oc.ATTRIBUTES])[ops]
    attr = code6[:, oc.ATTR]
    if np.any(~has_attr & (attr != -1)):
        raise error("an instruction without attributes points into the attribute pool")
    # ops whose only attribute is a fattr index (scale, powc, elu, clip, polygamma): checked at once
    need = np.array(oc.FLOAT_COUNT)[ops]
    float_only = has_attr & (need > 0)
    if np.any(float_only & ((attr < 0) | (attr >= iattr.size))):
        raise error("an instruction's attribute block starts outside the pool")
    index = iattr[np.where(float_only, attr, 0)] if iattr.size else np.zeros(len(ops), np.int64)
    if np.any(float_only & ((index < 0) | (index > fattr.size - need))):
        raise error("an instruction's float attribute lies outside the pool")
    for r in np.flatnonzero(has_attr & ~float_only).tolist():
        _check_attributes(int(ops[r]), int(attr[r]), [int(sizes[s]) if s >= 0 else 0 for s in code6[r, 1:5]],
                          iattr, fattr, r, error)
    code = np.full((code6.shape[0], oc.W), -1, np.int64)
    code[:, :oc.ATTR + 1] = code6
    code[:, oc.OP] = ops
    oc.fill_offset_columns(code, slots[:, oc.OFFSET])
    return code, slots, iattr, fattr, arena


def _check_slots(slots, arena_size, error):
    rank = slots[:, oc.RANK]
    if np.any((rank < 0) | (rank > oc.MAXRANK)):
        raise error("a slot's rank is out of range")
    dims = slots[:, oc.DIMS:]
    if np.any(dims < 0) or np.any(dims > max(arena_size, 1)):
        raise error("a slot's dimension is negative or larger than the arena")
    unused = np.arange(oc.MAXRANK)[None, :] >= rank[:, None]
    if np.any(unused & (dims != 1)):
        raise error("a slot's unused dimensions must be 1")
    size = slots[:, oc.SIZE]
    offset = slots[:, oc.OFFSET]
    if np.any(size < 0) or np.any(size > arena_size) or np.any(offset < 0) or np.any(offset > arena_size - size):
        raise error("a slot lies outside the arena")
    # dims are at most the arena's size: the float64 product tells the ones whose int64 product could
    # overflow (beyond the arena, so beyond any valid size), and the int64 product is exact for the others
    if np.any(np.prod(dims.astype(np.float64), axis=1) > arena_size):
        raise error("a slot's dimensions multiply beyond the arena")
    bad = np.flatnonzero(np.prod(dims, axis=1) != size)
    if bad.size:
        raise error(f"slot {int(bad[0])}'s size {int(size[bad[0]])} is not the product of its dimensions")


def _check_attributes(op, a, sizes, iattr, fattr, r, error):
    """Instruction r's attribute block against its operands' sizes (out, in0, in1, in2), in exact integers."""
    def bad(what):
        return error(f"instruction {r} ({oc.NAMES[op]}): {what}")

    if not 0 <= a < iattr.size:
        raise bad("its attribute block starts outside the pool")
    fields = oc.ATTRIBUTES[op]
    # the count fields must be sane before the block's length can be read
    if fields[0] == "rank" and not 0 <= int(iattr[a]) <= oc.MAXRANK:
        raise bad(f"rank {int(iattr[a])} out of range")
    if op == oc.GATHER and a + 3 < iattr.size and iattr[a + 3] < 0:
        raise bad("a negative index count")
    length = oc.attribute_length(op, iattr, a)
    if a + length > iattr.size:
        raise bad("its attribute block runs past the end of the pool")
    block = [int(v) for v in iattr[a:a + length]]
    out, x, w, _ = sizes
    family = oc.FAMILIES[op]
    need = oc.FLOAT_COUNT[op]
    if need:
        if not 0 <= block[0] <= fattr.size - need:
            raise bad("its float attribute lies outside the pool")
        return
    if any(v < 0 for v in block) and op not in (oc.SLICE, oc.PAD):
        raise bad("a negative attribute")
    if family in ("reduce", "cumsum"):
        outer, n, inner = block[:3]
        expected_out = x if family == "cumsum" else outer * inner
        if outer * n * inner != x or out != expected_out or (family == "cumsum" and block[3:] not in
                                                              ([0, 0], [0, 1], [1, 0], [1, 1])):
            raise bad("its [outer, n, inner] view does not match its operands")
    elif family == "mapped":
        rank = block[0]
        in_dims = block[1:1 + rank]
        third = block[1 + rank:1 + 2 * rank]
        if any(d < 0 for d in in_dims + third) or math.prod(in_dims) != x:
            raise bad("its input dimensions do not match its input")
        if op == oc.TRANSPOSE:
            if sorted(third) != list(range(rank)) or out != x:
                raise bad("its permutation is not one")
            return
        if math.prod(third) != out:
            raise bad("its output dimensions do not match its output")
        if op == oc.TILE:
            if any(o > 0 and i < 1 for i, o in zip(in_dims, third)):
                raise bad("it tiles an empty dimension")
            if any(i > 0 and o % i for i, o in zip(in_dims, third)):
                raise bad("its output dimensions are not whole tiles of its input's")
            return
        starts, steps = block[1 + 2 * rank:1 + 3 * rank], block[1 + 3 * rank:1 + 4 * rank]
        large, small = (in_dims, third) if op == oc.SLICE else (third, in_dims)
        for d in range(rank):
            if small[d] > 0:
                last = starts[d] + (small[d] - 1) * steps[d]
                if not (0 <= starts[d] < large[d] and 0 <= last < large[d]):
                    raise bad(f"its window leaves dimension {d}")
    elif op == oc.PLACE:
        outer, n_in, inner, n_out, offset = block
        if outer * n_in * inner != x or outer * n_out * inner != out or offset + n_in > n_out:
            raise bad("its placement does not fit its operands")
    elif op == oc.GATHER:
        outer, n_axis, inner, n_idx = block[:4]
        if outer * n_axis * inner != x or outer * n_idx * inner != out or any(
                not 0 <= i < n_axis for i in block[4:]):
            raise bad("its indices do not fit its operands")
    elif op == oc.MATMUL:
        batch_a, batch_b, m, k, n, inner = block
        batch = 0 if batch_a == 0 or batch_b == 0 else max(batch_a, batch_b)
        if (batch_a * m * k != x or batch_b * k * n != w or batch * m * n != out
                or (batch_a > 1 and batch_b > 1 and batch_a != batch_b)):
            raise bad("its batch and matrix sizes do not match its operands")
        if inner < 1 or (inner > 1 and (batch_a != batch_b or batch % inner)):
            raise bad("its interleaved batch does not divide its operands' batches")
    elif op == oc.SOLVE:
        batch, n, m = block
        if batch * n * n != x or batch * n * m != w or out != w:
            raise bad("its sizes do not match its operands")
    elif op == oc.INV:
        batch, n = block
        if batch * n * n != x or out != x:
            raise bad("its sizes do not match its operands")
