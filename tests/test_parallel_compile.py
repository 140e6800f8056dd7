"""jitape_kernels/parallel_compile.py: kernels the cache lacks compile in worker processes, side by side, and load
here; a worker that fails or cannot start costs time, never a result; a warmup step compiles alone."""
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from numba import types

import jitape_kernels
from jitape_kernels import parallel_compile
from jitape_kernels.cpu import optimizers

_TWO_KERNELS = """
import sys, numpy as np
import jitape_kernels
from jitape_kernels import parallel_compile
from jitape_kernels.cpu import optimizers
from jitape_kernels.cpu.optimizers import adam_step, sgd_momentum_step
parallel_compile._SERVE = sys.argv[1]
v = np.zeros(3)
sgd = (sgd_momentum_step, tuple(map(sgd_momentum_step.typeof_pyval, (v, v, v, 0.5, 0.0, False, v))))
adam = (adam_step, tuple(map(adam_step.typeof_pyval, (v, v, v, v, v, 0.1, 0.9, 0.999, 1e-7, v))))
if "linked first" in sys.argv:       # both compiled for a caller first: linked only, which ready() must compile whole
    import numba
    numba.njit(lambda v: (sgd_momentum_step(v, v, v, 0.5, 0.0, False, v),
                          adam_step(v, v, v, v, v, 0.1, 0.9, 0.999, 1e-7, v)))(np.zeros(3))
if "one at a time" in sys.argv:     # one pair handed: no worker yet; a second: the workers start and take both
    with parallel_compile.side_by_side() as add:
        add([sgd])
        add([adam])
else:
    parallel_compile.ready([sgd, adam])
w, g, m = np.ones(3), np.full(3, 2.0), np.zeros(3)
sgd_momentum_step(w, g, m, 0.5, 0.0, False, w)
# a kernel loaded from the cache holds a library of jitape's lazily linked kind; one compiled here numba's own
kinds = [type(next(iter(k.overloads.values())).library).__name__ for k in (sgd_momentum_step, adam_step)]
print(w[0], *kinds)
"""


def _run(tmp_path, serve=parallel_compile._SERVE, linked_first=False, one_at_a_time=False, **env):
    environment = dict(os.environ, JITAPE_CACHE_DIR=str(tmp_path), **env)
    result = subprocess.run([sys.executable, "-c", _TWO_KERNELS, serve, *["linked first"] * linked_first,
                             *["one at a time"] * one_at_a_time],
                            env=environment, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    value, *kinds = result.stdout.split()
    assert float(value) == 0.0          # 1 - 0.5 * 2: the kernel runs, whoever compiled it
    return kinds


def test_kernels_the_cache_lacks_compile_in_workers_and_load_here(tmp_path):
    assert _run(tmp_path, JITAPE_COMPILE_JOBS="2") == ["_LazilyLinked", "_LazilyLinked"]
    # a second process finds both in the cache: nothing to compile, no worker
    assert _run(tmp_path, serve="raise SystemExit(3)", JITAPE_COMPILE_JOBS="2") == ["_LazilyLinked"] * 2


def test_kernels_compiled_only_for_a_caller_compile_whole_in_workers(tmp_path):
    assert _run(tmp_path, linked_first=True, JITAPE_COMPILE_JOBS="2") == ["_LazilyLinked", "_LazilyLinked"]


def test_pairs_handed_one_at_a_time_compile_in_workers_started_once_two_are_handed(tmp_path):
    assert _run(tmp_path, one_at_a_time=True, JITAPE_COMPILE_JOBS="2") == ["_LazilyLinked", "_LazilyLinked"]
    # with one job, this process compiles both
    assert _run(tmp_path / "alone", one_at_a_time=True, JITAPE_COMPILE_JOBS="1") == ["JITCodeLibrary"] * 2


def test_an_error_while_pairs_are_handed_stops_the_workers_after_their_kernels(tmp_path, monkeypatch):
    # three pairs queued, an error: the workers compile at most what they took (two), nothing is compiled here
    monkeypatch.setenv("JITAPE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("JITAPE_COMPILE_JOBS", "2")
    took = []
    monkeypatch.setattr(parallel_compile, "_feed", lambda tasks, environment: took.append(tasks))
    monkeypatch.setattr(parallel_compile, "cache_lacks", lambda dispatcher, signature: True)
    v = types.float64[::1]
    step = optimizers.sgd_momentum_step
    pairs = [(step, (v, v, v, t, t, types.boolean, v)) for t in (types.float64, types.int64, types.float32)]
    with pytest.raises(KeyError):
        with parallel_compile.side_by_side() as add:
            add(pairs)
            raise KeyError("while working out more pairs")
    (tasks,) = set(took)
    assert tasks.get_nowait() is None and tasks.empty()      # only the end was left for the workers


def test_one_process_compiles_alone_with_one_job(tmp_path):
    assert _run(tmp_path, JITAPE_COMPILE_JOBS="1") == ["JITCodeLibrary", "JITCodeLibrary"]


def test_a_worker_that_ends_leaves_its_kernels_to_this_process(tmp_path):
    assert _run(tmp_path, serve="raise SystemExit(3)", JITAPE_COMPILE_JOBS="2") == ["JITCodeLibrary"] * 2


def test_workers_compile_this_process_s_kernel_files_whatever_their_working_directory_holds(tmp_path):
    # a checkout beside an installed jitape: `python -c` puts the working directory first on a worker's path, where
    # its copy of the kernels would be compiled and cached under its own files' paths, never loaded here
    shadow = tmp_path / "checkout"
    shutil.copytree(Path(jitape_kernels.__file__).parent, shadow / "jitape_kernels")
    script = tmp_path / "two_kernels.py"
    script.write_text(_TWO_KERNELS)
    environment = dict(os.environ, JITAPE_CACHE_DIR=str(tmp_path / "cache"), JITAPE_COMPILE_JOBS="2",
                       PYTHONPATH=parallel_compile._PACKAGE_ROOT)
    result = subprocess.run([sys.executable, str(script), parallel_compile._SERVE], cwd=shadow, env=environment,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[1:] == ["_LazilyLinked", "_LazilyLinked"]

def test_a_worker_whose_compile_fails_answers_and_goes_on(tmp_path):
    # a signature numba cannot compile, a function of another file, then one it can: "!", "!" and "."
    v = types.float64[::1]
    step = optimizers.sgd_momentum_step
    here, sgd = step.py_func.__code__.co_filename, (v, v, v, types.float64, types.float64, types.boolean, v)
    tasks = b"".join(pickle.dumps(("jitape_kernels.cpu.optimizers", "sgd_momentum_step", signature, filename))
                     for signature, filename in [((types.unicode_type,), here), (sgd, "elsewhere/optimizers.py"),
                                                 (sgd, here)])
    result = subprocess.run([sys.executable, "-c", parallel_compile._SERVE], input=tasks, capture_output=True,
                            timeout=600, env=dict(os.environ, JITAPE_CACHE_DIR=str(tmp_path)))
    assert result.returncode == 0, result.stderr
    assert result.stdout == b"!!."


def test_jobs_follow_the_setting_and_a_warmup_step_compiles_alone(monkeypatch):
    monkeypatch.setenv("JITAPE_COMPILE_JOBS", "3")
    assert parallel_compile.jobs() == 3
    with parallel_compile.alone():
        assert parallel_compile.jobs() == 1
        with parallel_compile.alone():
            assert parallel_compile.jobs() == 1
        assert parallel_compile.jobs() == 1
    assert parallel_compile.jobs() == 3
    monkeypatch.delenv("JITAPE_COMPILE_JOBS")
    assert parallel_compile.jobs() == min(parallel_compile.cores(), parallel_compile.MAX_JOBS)


def test_workers_run_with_two_jobs_or_more_and_a_python_to_start(monkeypatch):
    monkeypatch.setenv("JITAPE_COMPILE_JOBS", "2")
    assert parallel_compile.workers_run()
    monkeypatch.setattr(sys, "frozen", True, raising=False)      # a frozen application: its executable is itself
    assert not parallel_compile.workers_run()
    monkeypatch.delattr(sys, "frozen")
    monkeypatch.setenv("JITAPE_COMPILE_JOBS", "1")
    assert not parallel_compile.workers_run()
