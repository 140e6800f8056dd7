"""Compiled kernels of jitape: opcode table and the compiled CPU interpreters (cpu/).

Imports numpy, scipy and numba only, never `jitape`. The kernels defined in this
package are cached on disk in a per-user directory stamped with a hash of the
kernel sources, so an installed read-only package still caches and an edit to any
kernel file can never be served stale machine code (numba keys its cache on the
defining file alone, not on the modules it calls into). That directory is given
to numba through a cache locator that answers for this package's files only:
numba.config.CACHE_DIR, every other numba user's setting, is left as it was.

The kernels are declared with this package's `njit`, numba's with a cache of its own
(_KernelCache) that loads a kernel faster: numba parses a cached function's whole LLVM
bitcode at every load (~70% of the load: 30-90 ms for the largest sweeps), although it
needs it only to link the function into one compiled later; here the bitcode is parsed
when such a compile asks for it, and the symbols the execution engine must know are
stored by name. Processes may compile the same kernels at once (a parallel `jitape warmup`,
a user's process pool on a cold cache): _KernelCacheFile stores every compile result under a
name of its own and merges the index entries that name them. numba's runtime (NRT), whose LLVM functions numba
compiles in every process, is loaded from this cache too (_start_runtime).

A kernel compiled for a caller's compile (its call typed there) is compiled only as far as linking needs
(_Linked): numba optimised every callee on its own and made machine code of it, although each caller links the
callee's IR, optimises it with its own and makes machine code of the whole (a third of the row kernels'
compile was their callees' own). Its IR is cached for the callers that other processes compile; a Python call
or an address asked of it compiles it whole.
"""
import contextlib
import functools
import hashlib
import os
import pickle
import tempfile
import threading
from pathlib import Path

import llvmlite.binding as ll
import numba
from numba import typeof
from numba.core import caching, codegen, compiler, sigutils, types
from numba.core.compiler_lock import global_compiler_lock
from numba.core.runtime import nrtdynmod, rtsys

from . import scipy_blas

# before numba's first compile or cache load asks for BLAS: scipy.linalg's import was ~110 ms of a first gradient
scipy_blas.load()

_HERE = Path(__file__).resolve().parent


def _source_stamp() -> str:
    digest = hashlib.sha256(numba.__version__.encode())
    for path in sorted(_HERE.rglob("*.py")):
        digest.update(path.relative_to(_HERE).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _default_cache_base() -> Path:
    explicit = os.environ.get("JITAPE_CACHE_DIR") or os.environ.get("NUMBA_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "jitape"


def _writable_dir(candidate: Path) -> Path:
    try:
        candidate.mkdir(parents=True, exist_ok=True)
        # a probe of this process's own: processes importing at once removed each other's shared one, and
        # one of them fell back to the temp dir's cache
        tempfile.TemporaryFile(dir=candidate).close()
        return candidate
    except OSError:
        fallback = Path(tempfile.gettempdir()) / f"jitape-{os.getuid()}" / candidate.name
        fallback.mkdir(parents=True, exist_ok=True)
        return fallback


_CACHE_DIR = _writable_dir(_default_cache_base() / f"numba-{_source_stamp()}")


class _KernelCacheLocator(caching.UserProvidedCacheLocator):
    """numba's locator for a user-given cache directory, pointed at jitape's and consulted for the files of
    this package only (numba tries its locators in order; other functions fall through to the next)."""

    def __init__(self, py_func, py_file):
        self._py_file = py_file
        self._lineno = py_func.__code__.co_firstlineno
        self._cache_path = os.path.join(_CACHE_DIR, self.get_suitable_cache_subpath(py_file))

    # directories found writable; numba probes with a file of its own for every kernel (~190 at import)
    _writable_paths = set()

    @classmethod
    def from_function(cls, py_func, py_file):
        if not _is_kernel_file(py_file):
            return None
        return super(caching.UserProvidedCacheLocator, cls).from_function(py_func, py_file)

    def ensure_cache_path(self):
        path = self.get_cache_path()
        if path not in self._writable_paths:
            super().ensure_cache_path()
            self._writable_paths.add(path)


@functools.lru_cache(maxsize=None)
def _is_kernel_file(py_file: str) -> bool:
    """The package's files, and the generated kernels' (jitape_kernels.cpu.fusion) in the cache directory."""
    return any(Path(py_file).resolve().is_relative_to(d) for d in (_HERE, _CACHE_DIR.resolve()))


if _KernelCacheLocator not in caching.CacheImpl._locator_classes:
    caching.CacheImpl._locator_classes.insert(0, _KernelCacheLocator)


def cache_dir() -> str:
    """The directory numba caches jitape's compiled kernels in."""
    return str(_CACHE_DIR)


class _LazilyLinked(codegen.JITCodeLibrary):
    """A kernel's code library loaded from the cache: its machine code is loaded at once, its bitcode parsed
    only when a compile links it into another library."""
    _bitcode = None

    def _get_module_for_linking(self):
        if self._shared_module is None and self._bitcode is not None:
            self._shared_module = ll.parse_bitcode(self._bitcode)
            self._bitcode = None
        return super()._get_module_for_linking()


class _Linked(_LazilyLinked):
    """The code library of a kernel compiled for a caller's compile: only ever linked into its callers' libraries,
    which optimise it with their own code and make machine code of it; neither optimised alone nor made machine
    code of (finalized, it is its functions' IR with its own callees linked in, as numba links it)."""

    def _optimize_final_module(self):
        pass

    def _finalize_final_module(self):
        self._finalize_dynamic_globals()
        self._finalized = True

    def serialize_using_object_code(self):
        """What _KernelCacheImpl saves of it: its IR for linking, no object code."""
        return self.name, _LINKED, (None, self._get_module_for_linking().as_bitcode())


_LINKED = "linked"      # a cache entry's kind: a _Linked library's


class _Compiler(compiler.Compiler):
    """numba's compiler, making a _Linked library of a compile for a caller (_compiling.linked): no Python or C
    wrapper, no machine code, an entry point that only stands for it in the target context."""

    def compile_extra(self, func):
        if not _compiling.linked:
            return super().compile_extra(func)
        self.state.library = _Linked(self.state.targetctx.codegen(), func.__qualname__)
        self.state.flags.no_compile = self.state.flags.no_cpython_wrapper = self.state.flags.no_cfunc_wrapper = True
        compiled = super().compile_extra(func)
        compiled = compiled._replace(entry_point=_LinkedEntry())
        self.state.targetctx.insert_user_function(compiled.entry_point, compiled.fndesc, [compiled.library])
        return compiled


class _LinkedEntry:
    """The entry point of a _Linked compile: the key its callers' compiles find its code by (none runs it)."""
    __slots__ = ()


class _Compiling(threading.local):
    """Per thread: for_caller, whether the next compile a kernel is asked for is a caller's (asked by the typing
    of its call); linked, whether the compile under way is such a compile."""
    for_caller = False
    linked = False


_compiling = _Compiling()


class _KernelCacheImpl(caching.CompileResultCacheImpl):
    """numba's cache of compile results, with the library stored as (object code, bitcode, the names of the
    symbols it defines) and loaded as _LazilyLinked."""

    def reduce(self, cres):
        libdata, *rest = cres._reduce()
        name, kind, (object_code, bitcode) = libdata
        return ((name, kind, (object_code, bitcode, _defined_symbols(cres.library))), *rest)

    def rebuild(self, target_context, payload):
        (name, kind, (object_code, bitcode, symbols)), *rest = payload
        if not _LAZY_LOADS:         # a numba whose internals differ: its own load, bitcode parsed
            return compiler.CompileResult._rebuild(target_context, (name, kind, (object_code, bitcode)), *rest)
        fndesc, env, signature, objectmode, lifted, typeann, reload_init, referenced_envs = rest
        for initialise in reload_init or ():
            initialise()
        if kind == _LINKED:
            library = _Linked(target_context.codegen(), name)
            library._bitcode = bitcode
            library._finalize_final_module()
            entry_point = _LinkedEntry()
        else:
            library = _loaded_library(target_context.codegen(), name, object_code, bitcode, symbols)
            entry_point = target_context.get_executable(library, fndesc, env)
            for referenced in referenced_envs:
                library.codegen.set_env(referenced.env_name, referenced)
        # and what numba's CompileResult._rebuild does with it
        fields = dict.fromkeys(compiler.CR_FIELDS)
        fields.update(target_context=target_context, typing_context=target_context.typing_context, library=library,
                      environment=env, entry_point=entry_point, fndesc=fndesc, type_annotation=typeann,
                      signature=signature, objectmode=objectmode, lifted=lifted, reload_init=reload_init,
                      referenced_envs=referenced_envs)
        return compiler.CompileResult(**fields)


def _defined_symbols(library):
    """The names of the functions and globals a finalized library defines (which its loaded copy must declare to
    the execution engine: numba reads them from the module, which a lazy load does not parse; none for a _Linked
    library, which the engine never holds)."""
    if isinstance(library, _Linked):
        return []
    module = library._get_module_for_linking()
    return [g.name for g in (*module.functions, *module.global_variables) if not g.is_declaration]


def _loaded_library(codegen, name, object_code, bitcode, symbols):
    """A library of `codegen` from its saved object code, bitcode and defined symbols: numba's
    CodeLibrary._unserialize for object code, but the bitcode's parse (see _LazilyLinked)."""
    library = _LazilyLinked(codegen, name)
    library.enable_object_caching()
    library._set_compiled_object(object_code)
    library._bitcode = bitcode
    library._finalize_final_module()
    library.codegen._engine._defined_symbols.update(symbols)
    return library


# the numba internals rebuild() uses instead of numba's CodeLibrary._unserialize and CompileResult._rebuild
_LAZY_LOADS = (all(hasattr(codegen.JITCodeLibrary, name)
                   for name in ("enable_object_caching", "_set_compiled_object", "_finalize_final_module",
                                "_get_module_for_linking"))
               and hasattr(codegen.JitEngine, "_load_defined_symbols") and "referenced_envs" in compiler.CR_FIELDS)


try:
    import fcntl
except ImportError:         # Windows: index entries are merged unlocked (see _KernelCacheFile)
    fcntl = None


@contextlib.contextmanager
def _index_lock():
    """Held while a kernel's index is read, updated and written: one lock file for the cache directory."""
    if fcntl is None:
        yield
        return
    with open(_CACHE_DIR / ".index.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


class _KernelCacheFile(caching.IndexDataCacheFile):
    """numba's index and data files of one kernel, safe when several processes save compiles of it at once.

    numba numbers a kernel's data files and writes the index it read with one entry added. Two processes saving
    different signatures at once (float32 and float64 of a shared kernel) could both take number 1, so the index
    named one signature's machine code for the other's (a wrong load: a crash or wrong numbers), and the index
    written last dropped the other's entry. Here each compile result's file is named by a hash of its index key
    (a second process compiling the same signature writes the same name, atomically), it is written before the
    index entry that names it, and the entry is added to the index as it is on disk, under a lock (without fcntl,
    unlocked: an entry may then be lost, which costs a recompile, never a wrong load)."""

    _seen = None            # the index file's (mtime, size, inode) when _index was read

    def save(self, key, data):
        digest = hashlib.sha256(repr((key, self._source_stamp)).encode()).hexdigest()[:24]
        name = f"{self._index_name[:-len('.nbi')]}.{digest}.nbc"
        self._save_data(name, data)
        with _index_lock():
            overloads = dict(self._load_index())
            overloads[key] = name
            self._save_index(overloads)

    def _load_index(self):
        """numba's, read again only when the file changed: a probe (cache_lacks) and the load after it read it
        once (~0.1 ms each)."""
        try:
            status = os.stat(self._index_path)
        except FileNotFoundError:
            return {}
        seen = (status.st_mtime_ns, status.st_size, status.st_ino)
        if seen != self._seen:
            self._index, self._seen = super()._load_index(), seen
        return self._index


class _KernelCache(caching.FunctionCache):
    _impl_class = _KernelCacheImpl

    def __init__(self, py_func):
        super().__init__(py_func)
        if _MERGED_SAVES:
            self._cache_file = _KernelCacheFile(self._cache_path, self._impl.filename_base,
                                                self._impl.locator.get_source_stamp())

    def load_overload(self, sig, target_context):
        """numba's load, but its refresh of the whole target context: that imports and installs every typing and
        lowering registry numba has (0.1 s of a process's first gradient), which only a compile uses (numba's
        compiles refresh it themselves). A load needs the runtime (NRT) that machine code calls, started here
        (_start_runtime)."""
        if not _LIGHT_LOADS:
            return super().load_overload(sig, target_context)
        _start_runtime(target_context)
        with self._guard_against_spurious_io_errors():
            loaded = self._load_overload(sig, target_context)
            if loaded is None and _compiling.linked:     # a caller links a whole compile's IR as well
                with _linking(False):
                    loaded = self._load_overload(sig, target_context)
            return loaded

    def _index_key(self, sig, codegen):
        """numba's, with the codegen's magic tuple (its target triple, CPU name and features) asked of LLVM once
        per process, not at every load and probe (three calls into LLVM: ~0.1 ms of a ~1 ms load); a _Linked
        compile's (one for a caller) marked as such."""
        key = super()._index_key(sig, _MagicOnce.of(codegen))
        return (*key, _LINKED) if _compiling.linked else key

    def cached_return_type(self, signature, codegen):
        """The return type of the compile for `signature` (a tuple of argument types) by `codegen` that the cache
        holds, read without loading its machine code (None: it holds none)."""
        payload = self._cache_file.load(self._index_key(signature, codegen))
        # the payload as reduce() stores it: (library, fndesc, environment, signature, ...)
        return None if payload is None else payload[3].return_type

    def holds(self, signature, codegen):
        """Whether a compile for `signature` (a tuple of argument types) by `codegen` (this machine's) is saved
        (read from the index: nothing loaded)."""
        return self._index_key(signature, codegen) in self._cache_file._load_index()


class _MagicOnce:
    """What numba's _index_key asks of a codegen, its magic tuple, asked of that codegen once (it describes the
    machine and the compiler's target: fixed for the codegen's life)."""
    __slots__ = ("_magic",)
    _of = {}        # codegen -> its _MagicOnce

    def __init__(self, magic):
        self._magic = magic

    def magic_tuple(self):
        return self._magic

    @classmethod
    def of(cls, codegen):
        found = cls._of.get(codegen)
        if found is None:
            found = cls._of[codegen] = cls(codegen.magic_tuple())
        return found


def cache_lacks(dispatcher, signature):
    """Whether `dispatcher` (a kernel of this package's njit) saves its compiles to this package's cache and the
    cache holds none for `signature` (a tuple of argument types) on this machine."""
    cache = getattr(dispatcher, "_cache", None)
    return isinstance(cache, _KernelCache) and _PROBES and not cache.holds(signature, dispatcher.targetctx.codegen())


def cache_empty(dispatcher):
    """Whether `dispatcher` (a kernel of this package's njit) saves its compiles to this package's cache and the
    cache holds none of it, of any signature (no index: one stat, nothing read)."""
    cache = getattr(dispatcher, "_cache", None)
    return isinstance(cache, _KernelCache) and not os.path.exists(cache._cache_file._index_path)


def compiled_whole(dispatcher, signature):
    """Whether `dispatcher` holds machine code for `signature` (a tuple of argument types) in this process (not
    only a _Linked compile for callers)."""
    compiled = dispatcher.overloads.get(signature)
    return compiled is not None and not isinstance(compiled.library, _Linked)


def return_type(dispatcher, signature):
    """The return type of `dispatcher` (a kernel of this package's njit) for `signature` (a tuple of argument
    types): its compile in this process, else the cache's without loading it (a caller wanting only the type, as
    the kernel tables do of the operand builders the sweeps inline, saves a load: ~1 ms), else compiled now."""
    compiled = dispatcher.overloads.get(signature)
    if compiled is None:
        cache = getattr(dispatcher, "_cache", None)
        if isinstance(cache, _KernelCache) and _PROBES:
            found = cache.cached_return_type(signature, dispatcher.targetctx.codegen())
            if found is not None:
                return found
        dispatcher.compile(signature)
        compiled = dispatcher.overloads[signature]
    return compiled.signature.return_type


def _start_runtime(context):
    """numba's rtsys.initialize(context), its functions (numba compiles the runtime's LLVM functions in every
    process: ~18 ms of a process's first gradient) loaded from jitape's cache after one process compiled them
    (_runtime_functions)."""
    if getattr(rtsys, "_init", False):
        return
    if not _CACHED_RUNTIME:
        rtsys.initialize(context)
        return
    with global_compiler_lock:      # no other thread compiles while numba's compile of them is replaced
        nrtdynmod.compile_nrt_functions = _runtime_functions
        try:
            rtsys.initialize(context)
        finally:
            nrtdynmod.compile_nrt_functions = _compile_runtime_functions


def _runtime_functions(context):
    """numba's nrtdynmod.compile_nrt_functions(context), loaded from the cache where it holds their compile for
    the same LLVM IR by this machine's codegen (else compiled, as numba does, and saved)."""
    ir_module, library = nrtdynmod.create_nrt_module(context)
    codegen = context.codegen()
    key = repr((str(ir_module), _MagicOnce.of(codegen).magic_tuple(), numba.config.OPT))
    path = _CACHE_DIR / f"runtime-{hashlib.sha256(key.encode()).hexdigest()[:24]}.pkl"
    try:
        with open(path, "rb") as saved:
            object_code, bitcode, symbols = pickle.load(saved)
    except Exception:       # missing or unreadable (truncated, foreign): compiled, and saved over it
        pass
    else:
        return _loaded_library(codegen, library.name, object_code, bitcode, symbols)
    library.enable_object_caching()
    library.add_ir_module(ir_module)
    library.finalize()
    try:        # written whole, then renamed: a process loading at once reads the old file or the new one
        with tempfile.NamedTemporaryFile("wb", dir=_CACHE_DIR, delete=False) as saving:
            pickle.dump((library._get_compiled_object(), library._get_module_for_linking().as_bitcode(),
                         _defined_symbols(library)), saving)
        os.replace(saving.name, path)
    except OSError:         # a read-only cache: compiled in every process, as numba does
        pass
    return library


# the numba internals _start_runtime uses (a numba without them starts its runtime itself)
_compile_runtime_functions = getattr(nrtdynmod, "compile_nrt_functions", None)
_CACHED_RUNTIME = (_compile_runtime_functions is not None and hasattr(nrtdynmod, "create_nrt_module")
                   and hasattr(rtsys, "_init") and _LAZY_LOADS)


# the numba internals _KernelCache.load_overload uses (a numba without them keeps its own load)
_LIGHT_LOADS = all(hasattr(caching.Cache, name) for name in ("_guard_against_spurious_io_errors", "_load_overload"))
# and those _KernelCache.holds uses (a numba without them: cache_lacks answers False, kernels compile where needed)
_PROBES = hasattr(caching.Cache, "_index_key") and hasattr(caching.IndexDataCacheFile, "_load_index")


# the numba internals _KernelCacheFile.save uses (a numba without them keeps its own cache file)
_MERGED_SAVES = all(hasattr(caching.IndexDataCacheFile, name) for name in ("_save_data", "_load_index", "_save_index"))


def _without_literals(dispatcher):
    """Make a kernel called from another compile for its arguments' types, never their constant values: numba
    compiles a callee once per literal a call site passes (gemm(..., True, ..., False, ...) and gemm(..., False,
    ..., True, ...) were two compiles of one kernel; 93 of the 330 signatures a warmup cached), and once more
    for a call that leaves an argument to its default (typed `omitted`; the call passes the default's value)."""
    template = dispatcher.get_call_template

    def get_call_template(args, kws):
        _, args = dispatcher._compiler.fold_argument_types(args, kws)
        return template(tuple(types.unliteral(typeof(a.value) if isinstance(a, types.Omitted) else a) for a in args),
                        {})
    dispatcher.get_call_template = get_call_template


@contextlib.contextmanager
def _linking(linked):
    """Within it, this thread's compile is a _Linked one (or not)."""
    before, _compiling.linked = _compiling.linked, linked
    try:
        yield
    finally:
        _compiling.linked = before


def _linked_for_callers(dispatcher):
    """Make the compiles of `dispatcher` that a caller's typing asks for _Linked ones, and those asked from
    Python (a call, an address: row_kernels.kernel_table) whole, in place of a _Linked one; numba's dispatch from
    Python never holds a _Linked compile (a call of its types asks for a whole one)."""
    call_template, compile, add_overload = dispatcher.get_call_template, dispatcher.compile, dispatcher.add_overload

    def get_call_template(args, kws):
        _compiling.for_caller = True        # read by the compile it asks for
        try:
            return call_template(args, kws)
        finally:
            _compiling.for_caller = False

    def linked_or_whole(sig):
        for_caller, _compiling.for_caller = _compiling.for_caller, False
        # under numba's lock: a caller compiling in another thread finds the overload its typing found
        with global_compiler_lock, _linking(for_caller):
            if not for_caller:
                args = tuple(sigutils.normalize_signature(sig)[0])
                if args in dispatcher.overloads and not compiled_whole(dispatcher, args):
                    del dispatcher.overloads[args]
            return compile(sig)

    def add_linked_or_whole(compiled):
        if isinstance(compiled.library, _Linked):
            dispatcher.overloads[tuple(compiled.signature.args)] = compiled
        else:
            add_overload(compiled)

    dispatcher.get_call_template, dispatcher.compile, dispatcher.add_overload = (
        get_call_template, linked_or_whole, add_linked_or_whole)


# the numba internals _Linked compiles use (a numba without them compiles every kernel whole)
_LINKED_COMPILES = (_LAZY_LOADS and hasattr(compiler.CompileResult, "_replace")
                    and all(hasattr(compiler.Flags, flag) for flag in ("no_compile", "no_cpython_wrapper",
                                                                      "no_cfunc_wrapper")))


def njit(**options):
    """numba.njit for this package's kernels: with cache=True, cached through _KernelCache; compiled for the
    types of the arguments a compiled caller passes, not their values (_without_literals), and for a caller only
    as far as linking needs (_linked_for_callers)."""
    def decorate(py_func):
        # numba's own cache is never made: its locators and write probe were half of the decorators' import time
        dispatcher = numba.njit(**dict(options, cache=False),
                                **({"pipeline_class": _Compiler} if _LINKED_COMPILES else {}))(py_func)
        # not with NUMBA_DISABLE_JIT, nor with a numba whose dispatchers fold arguments otherwise
        if hasattr(getattr(dispatcher, "_compiler", None), "fold_argument_types"):
            _without_literals(dispatcher)
            if _LINKED_COMPILES:
                _linked_for_callers(dispatcher)
        if options.get("cache") and hasattr(dispatcher, "_cache"):
            dispatcher._cache = _KernelCache(py_func)
        return dispatcher
    return decorate
