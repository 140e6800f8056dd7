"""jitape_kernels/__init__.py: kernels cache in jitape's own directory, importing jitape changes no other
library's settings (numba.config.CACHE_DIR stays what numba read from the environment), and processes
compiling at once share the cache safely."""
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from numba import typeof

import jitape_kernels


def _run(code, **env):
    environment = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CACHE_DIR",)}
    environment.update(env)
    return subprocess.run([sys.executable, "-c", code], env=environment, capture_output=True, text=True,
                          check=True).stdout.strip()


def test_importing_jitape_leaves_numbas_cache_dir_alone(tmp_path):
    code = ("import numba; before = numba.config.CACHE_DIR; import jitape; "
            "print(repr(before), repr(numba.config.CACHE_DIR))")
    before, after = _run(code, JITAPE_CACHE_DIR=str(tmp_path)).split()
    assert before == after
    before, after = _run(code, NUMBA_CACHE_DIR=str(tmp_path / "numba-users")).split()
    assert before == after == repr(str(tmp_path / "numba-users"))


def test_kernels_cache_in_jitapes_directory_and_other_functions_do_not(tmp_path):
    code = """
import numpy as np, jitape_kernels
from jitape_kernels.cpu.optimizers import sgd_momentum_step   # a small kernel: compiles in a second
w, g, v = np.ones(3), np.full(3, 2.0), np.zeros(3)
sgd_momentum_step(w, g, v, 0.5, 0.0, False, w)
print(w[0], jitape_kernels.cache_dir())
"""
    value, cache = _run(code, JITAPE_CACHE_DIR=str(tmp_path)).split()
    assert float(value) == 0.0
    assert Path(cache).is_relative_to(tmp_path)
    assert any(p.suffix == ".nbi" for p in Path(cache).rglob("*")), "no kernel index written to jitape's cache"
    elsewhere = tmp_path / "user"
    elsewhere.mkdir()
    (elsewhere / "mod.py").write_text("from numba import njit\n@njit(cache=True)\ndef f(a):\n    return a + 1\n")
    _run("import sys; sys.path.insert(0, %r); import jitape, mod; print(mod.f(1))" % str(elsewhere),
         JITAPE_CACHE_DIR=str(tmp_path))
    assert not any("mod.f" in p.name for p in Path(cache).rglob("*")), "another library's function cached in jitape's dir"
    assert any("mod.f" in p.name for p in (elsewhere / "__pycache__").iterdir())


def test_the_cache_directory_is_stamped_with_the_kernel_sources():
    assert Path(jitape_kernels.cache_dir()).name.startswith("numba-")


def _compile_and_cache(cache):
    """Compile a small kernel in a process of its own, with `cache` as jitape's cache directory."""
    code = """
import numpy as np
from jitape_kernels.cpu.optimizers import sgd_momentum_step
w, g, v = np.ones(3), np.full(3, 2.0), np.zeros(3)
sgd_momentum_step(w, g, v, 0.5, 0.0, False, w)
print(w[0])
"""
    assert float(_run(code, JITAPE_CACHE_DIR=str(cache))) == 0.0

def test_a_loaded_kernel_parses_its_bitcode_only_when_a_compile_links_it(tmp_path):
    _compile_and_cache(tmp_path)
    load_then_link = """
import numba, numpy as np
from jitape_kernels.cpu.optimizers import sgd_momentum_step
w, g, v = np.ones(3), np.full(3, 2.0), np.zeros(3)
sgd_momentum_step(w, g, v, 0.5, 0.0, False, w)                  # loaded from jitape's cache
(library,) = [c.library for c in sgd_momentum_step.overloads.values()]
loaded = type(library).__name__, library._bitcode is not None and library._shared_module is None

@numba.njit
def user_step(w, g, v, rate, momentum, nesterov):               # a new compile linking the loaded kernel
    sgd_momentum_step(w, g, v, rate, momentum, nesterov, w)
    return w[0]

print(*loaded, user_step(np.ones(3), np.full(3, 2.0), np.zeros(3), 0.25, 0.0, False),
      library._shared_module is not None, type(user_step._cache).__name__)
"""
    kind, unparsed, value, parsed, user_cache = _run(load_then_link, JITAPE_CACHE_DIR=str(tmp_path)).split()
    assert (kind, unparsed) == ("_LazilyLinked", "True")
    assert float(value) == 0.5 and parsed == "True"
    assert user_cache == "NullCache"        # another function keeps numba's own (here: none)
    numbas_own_load = """
import numpy as np, jitape_kernels
jitape_kernels._LAZY_LOADS = False       # as where numba's internals differ from those the lazy load uses
from jitape_kernels.cpu.optimizers import sgd_momentum_step
w, g, v = np.ones(3), np.full(3, 2.0), np.zeros(3)
sgd_momentum_step(w, g, v, 0.5, 0.0, False, w)
(library,) = [c.library for c in sgd_momentum_step.overloads.values()]
print(w[0], type(library).__name__, library._shared_module is not None)
"""
    assert _run(numbas_own_load, JITAPE_CACHE_DIR=str(tmp_path)).split() == ["0.0", "JITCodeLibrary", "True"]


def test_a_kernel_is_keyed_in_its_index_as_numba_keys_it():
    # jitape asks the codegen's magic tuple once per process; the key must stay numba's (a cache numba's own
    # key wrote loads, and a probe finds what a load finds)
    from numba.core import caching, types
    from jitape_kernels.cpu.optimizers import sgd_momentum_step
    cache = jitape_kernels._KernelCache(sgd_momentum_step.py_func)
    codegen = sgd_momentum_step.targetctx.codegen()
    array = types.Array(types.float64, 1, "C")
    signature = (array, array, array, types.float64, types.float64, types.boolean, array)
    assert cache._index_key(signature, codegen) == caching.Cache._index_key(cache, signature, codegen)
    assert cache._index_key(signature, codegen) != cache._index_key(signature[:-1], codegen)


def test_a_kernel_s_return_type_is_read_from_the_cache_without_loading_its_code(tmp_path):
    """The kernel tables need only the types of the operand builders the sweeps inline: from the cache, nothing
    is loaded; where the cache lacks the signature, it compiles."""
    code = """
import numpy as np, jitape_kernels
from numba import typeof
from jitape_kernels.cpu import interpreter, row_kernels
arrays = (np.zeros((0, 14), np.int64), np.zeros((0, 6), np.int64), np.zeros(0, np.int64), np.zeros(0), np.zeros(0),
          np.zeros(0))
signature = row_kernels.FORWARD.outer(*map(typeof, arrays))    # code, slots, iattr, fattr, arena, temps
found = jitape_kernels.return_type(interpreter.forward_operands, signature)
loaded = len(interpreter.forward_operands.overloads)
interpreter.forward_operands.compile(signature)
print(loaded, found == interpreter.forward_operands.overloads[signature].signature.return_type, len(found.types))
"""
    assert _run(code, JITAPE_CACHE_DIR=str(tmp_path)).split() == ["1", "True", "11"]     # compiled
    assert _run(code, JITAPE_CACHE_DIR=str(tmp_path)).split() == ["0", "True", "11"]     # read: nothing loaded


_RUNTIME_THEN_A_USER_COMPILE = """
import numba, numpy as np
from numba.core.runtime import nrtdynmod, rtsys
compile_nrt_functions = nrtdynmod.compile_nrt_functions
from jitape_kernels.cpu.optimizers import sgd_momentum_step
w, g, v = np.ones(3), np.full(3, 2.0), np.zeros(3)
sgd_momentum_step(w, g, v, 0.5, 0.0, False, w)                  # loaded: starts the runtime
allocate = numba.njit(lambda n: np.ones(n).sum())               # a user's compile, linking the runtime's functions
print(w[0], allocate(4), type(rtsys.library).__name__, nrtdynmod.compile_nrt_functions is compile_nrt_functions)
"""


def test_the_runtime_s_functions_load_from_the_cache_after_one_process_compiled_them(tmp_path):
    # numba compiles its runtime's LLVM functions in every process (~18 ms of a first gradient)
    _compile_and_cache(tmp_path)        # its process compiled them (and the kernel) and saved them
    (saved,) = Path(tmp_path).rglob("runtime-*.pkl")
    assert _run(_RUNTIME_THEN_A_USER_COMPILE, JITAPE_CACHE_DIR=str(tmp_path)).split() == [
        "0.0", "4.0", "_LazilyLinked", "True"]
    saved.write_bytes(b"not a runtime")         # unreadable: compiled again and saved over
    assert _run(_RUNTIME_THEN_A_USER_COMPILE, JITAPE_CACHE_DIR=str(tmp_path)).split() == [
        "0.0", "4.0", "JITCodeLibrary", "True"]
    assert _run(_RUNTIME_THEN_A_USER_COMPILE, JITAPE_CACHE_DIR=str(tmp_path)).split()[2] == "_LazilyLinked"


def test_a_kernel_loads_from_the_cache_without_numbas_compile_registries(tmp_path):
    """numba refreshes its whole target context before a cache load (0.1 s of a first gradient): jitape's
    loads start only the runtime, and a compile afterwards (which refreshes for itself) still works."""
    _compile_and_cache(tmp_path)
    load = """
import numba, numpy as np, jitape_kernels
jitape_kernels._LIGHT_LOADS = %s
from numba.core.registry import cpu_target
from jitape_kernels.cpu.optimizers import sgd_momentum_step
w, g, v = np.ones(3), np.full(3, 2.0), np.zeros(3)
sgd_momentum_step(w, g, v, 0.5, 0.0, False, w)                  # loaded from jitape's cache
installed = len(cpu_target.target_context._registries)
compiled = numba.njit(lambda a: a.sum() * 2.0)(np.ones(2))     # a compile after the load
print(w[0], installed, len(sgd_momentum_step.overloads), compiled)
"""
    value, installed, loaded, compiled = _run(load % True, JITAPE_CACHE_DIR=str(tmp_path)).split()
    assert (float(value), int(installed), int(loaded), float(compiled)) == (0.0, 0, 1, 4.0)
    value, installed, _, _ = _run(load % False, JITAPE_CACHE_DIR=str(tmp_path)).split()     # numba's own load
    assert float(value) == 0.0 and int(installed) > 0


def _at_once(code, workers, cache):
    """Run `code` in `workers` processes (argv[1]: the worker's number) that start its work at one moment
    (argv[2]: the time.time() to wait for, past their imports); their outputs."""
    environment = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CACHE_DIR",)}
    environment["JITAPE_CACHE_DIR"] = str(cache)
    start = time.time() + 3
    processes = [subprocess.Popen([sys.executable, "-c", code, str(w), str(start)], env=environment,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for w in range(workers)]
    outputs = [p.communicate() for p in processes]
    for p, (out, err) in zip(processes, outputs):
        assert p.returncode == 0, err
    return [out.strip() for out, _ in outputs]


def test_processes_saving_a_kernel_s_compiles_at_once_keep_every_entry_with_its_own_code(tmp_path):
    # numba's own cache file numbers a kernel's data files from the index it read, so two processes saving at
    # once took one number for two signatures (one entry then loaded the other's machine code) or dropped an
    # entry; four processes saving 40 entries each at one moment collide within a few saves
    save = """
import sys, time
from jitape_kernels import _KernelCache
from jitape_kernels.cpu.optimizers import sgd_momentum_step
cache = _KernelCache(sgd_momentum_step.py_func)
cache._impl.locator.ensure_cache_path()
worker, start = int(sys.argv[1]), float(sys.argv[2])
while time.time() < start:
    pass
for i in range(40):
    cache._cache_file.save(("signature", worker, i), ("machine code", worker, i))
"""
    _at_once(save, 4, tmp_path)
    load = """
from jitape_kernels import _KernelCache
from jitape_kernels.cpu.optimizers import sgd_momentum_step
cache = _KernelCache(sgd_momentum_step.py_func)
loaded = [cache._cache_file.load(("signature", w, i)) for w in range(4) for i in range(40)]
print(sum(data == ("machine code", w, i) for data, (w, i) in zip(loaded, [(w, i) for w in range(4) for i in range(40)])))
"""
    assert _run(load, JITAPE_CACHE_DIR=str(tmp_path)) == "160"


def test_kernels_compiled_by_processes_at_once_load_in_a_new_process_without_compiling(tmp_path):
    compile_one_dtype = """
import sys, time
import numpy as np
from jitape_kernels.cpu.optimizers import sgd_momentum_step
worker, start = int(sys.argv[1]), float(sys.argv[2])
while time.time() < start:
    pass
dtype = (np.float32, np.float64)[worker]
w = np.ones(3, dtype)
sgd_momentum_step(w, np.full(3, 2, dtype), np.zeros(3, dtype), dtype(0.5), dtype(0), False, w)
print(w[0])
"""
    assert _at_once(compile_one_dtype, 2, tmp_path) == ["0.0", "0.0"]
    load_both = """
import numpy as np
from jitape_kernels.cpu.optimizers import sgd_momentum_step
for dtype in (np.float32, np.float64):
    w = np.ones(3, dtype)
    sgd_momentum_step(w, np.full(3, 2, dtype), np.zeros(3, dtype), dtype(0.25), dtype(0), False, w)
    print(w.dtype, w[0])
print(sum(sgd_momentum_step.stats.cache_hits.values()), sum(sgd_momentum_step.stats.cache_misses.values()))
"""
    assert _run(load_both, JITAPE_CACHE_DIR=str(tmp_path)).splitlines() == ["float32 0.5", "float64 0.5", "2 0"]


def test_a_kernel_called_with_constants_from_compiled_code_compiles_once_for_their_types():
    # numba compiled a callee once per literal a call site passed (93 of a warmup's 330 signatures), and once
    # more for a call that left an argument to its default
    @jitape_kernels.njit()
    def scaled(x, twice, offset=2):
        return x * 2.0 + offset if twice else x + offset

    @jitape_kernels.njit()
    def caller(x):
        return scaled(x, True, 1) + scaled(x, False) + scaled(x, True, 3) + scaled(x, twice=True)

    assert caller(1.0) == 3.0 + 3.0 + 5.0 + 4.0
    assert [str(s) for s in scaled.signatures] == ["(float64, bool, int64)"]


def test_a_kernel_compiled_for_a_caller_is_linked_into_it_and_compiled_whole_when_python_or_an_address_asks():
    # numba optimised every callee alone and made machine code of it, which no one ran: its callers link its IR
    @jitape_kernels.njit()
    def total(a):
        s = 0.0
        for x in a:
            s += x
        return s

    @jitape_kernels.njit()
    def doubled_total(a):
        return 2.0 * total(a)

    x = np.arange(4.0)
    signature = (typeof(x),)
    assert doubled_total(x) == 12.0
    assert isinstance(total.overloads[signature].library, jitape_kernels._Linked)
    assert not jitape_kernels.compiled_whole(total, signature)
    assert total(x) == 6.0                  # a Python call compiles it whole
    assert jitape_kernels.compiled_whole(total, signature)
    assert doubled_total(x + 1) == 20.0

    y = np.arange(3, dtype=np.float32)
    assert doubled_total(y) == 6.0
    single = (typeof(y),)
    assert not jitape_kernels.compiled_whole(total, single)
    total.compile(single)                   # as row_kernels.kernel_table asks for an address
    compiled = total.overloads[single]
    assert jitape_kernels.compiled_whole(total, single)
    assert compiled.library.get_pointer_to_function(compiled.fndesc.llvm_func_name) != 0


def test_a_kernel_compiled_for_a_caller_is_cached_as_ir_a_new_process_links_without_compiling_it(tmp_path):
    code = """
import numba, numpy as np, jitape_kernels
from jitape_kernels.cpu.optimizers import sgd_momentum_step

@numba.njit
def user_step(w, g, v, rate):                   # a caller jitape's cache does not hold (numba's own: none)
    sgd_momentum_step(w, g, v, rate, 0.0, False, w)
    return w[0]

value = user_step(np.ones(3), np.full(3, 2.0), np.zeros(3), 0.25)
((signature, compiled),) = sgd_momentum_step.overloads.items()
linked = type(compiled.library).__name__
hits = sum(sgd_momentum_step.stats.cache_hits.values())
w = np.ones(3)
sgd_momentum_step(w, np.full(3, 2.0), np.zeros(3), 0.5, 0.0, False, w)    # a Python call: compiled whole
print(value, linked, hits, w[0], type(sgd_momentum_step.overloads[signature].library).__name__)
"""
    assert _run(code, JITAPE_CACHE_DIR=str(tmp_path)).split() == ["0.5", "_Linked", "0", "0.0", "JITCodeLibrary"]
    # the next process loads the linked IR (a cache hit, no compile) and the whole compile; a fresh cache entry of
    # each kind
    assert _run(code, JITAPE_CACHE_DIR=str(tmp_path)).split() == ["0.5", "_Linked", "1", "0.0", "_LazilyLinked"]
