"""Kernels a process needs and the cache lacks, compiled side by side in worker processes.

A cold first gradient compiled its sweep and its row kernels one after another on
one core, although they are independent functions (the sweeps call the row
kernels by address: cpu/row_kernels.py). When more than one is missing from the
cache, `ready` hands them to up to `jobs()` worker processes, the first given
first and each next one to the worker that finishes first; `side_by_side` takes
them in several handfuls while this process goes on (a cold start names the
sweeps first and works out the row kernels' signatures while the workers start:
cpu/compile_ahead.py). A worker compiles and
saves to the shared cache (jitape_kernels._KernelCacheFile), and this process then
loads what it compiled. The workers are Pythons started with `-c`, not
multiprocessing's: its spawn imports the user's __main__ again.

Every kernel is finally compiled or loaded here (numba's Dispatcher.compile): where
a worker failed or could not start, this process compiles what it left, so a
worker costs time at worst, never a result.
"""
import contextlib
import os
import pickle
import queue
import subprocess
import sys
import threading
from pathlib import Path

from . import cache_dir, cache_lacks, compiled_whole

# workers at most: each holds a numba compiler (~0.3-1 GB); the kernels of one sweep are rarely more than a dozen
MAX_JOBS = 4
_PACKAGE_ROOT = str(Path(__file__).resolve().parent.parent)
_SERVE = "from jitape_kernels.parallel_compile import serve; serve()"


def cores():
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


_alone = threading.local()


@contextlib.contextmanager
def alone():
    """Within it, this thread compiles what it needs itself (jobs() is 1): a `jitape warmup` step's, which run side
    by side already."""
    before = getattr(_alone, "depth", 0)
    _alone.depth = before + 1
    try:
        yield
    finally:
        _alone.depth = before


def jobs():
    """How many processes compile side by side: 1 within alone(), else JITAPE_COMPILE_JOBS if set (1: this
    process compiles alone), else this process's cores, at most MAX_JOBS."""
    if getattr(_alone, "depth", 0):
        return 1
    setting = os.environ.get("JITAPE_COMPILE_JOBS")
    return max(1, int(setting)) if setting else min(cores(), MAX_JOBS)


def ready(pairs):
    """Compile or load every (dispatcher, signature) of `pairs` (a signature: the tuple of argument types numba
    dispatches on) in this process; those neither compiled here yet nor in the cache, when more than one and
    jobs() > 1, compiled by worker processes first."""
    with side_by_side() as add:
        add(pairs)


@contextlib.contextmanager
def side_by_side():
    """Within it, `add(pairs)` hands the pairs (as ready() takes them) that are neither compiled here nor in the
    cache to worker processes, started once two are handed (up to jobs()), which compile them in the order
    added while this process goes on (it may work out the signatures of more pairs meanwhile); leaving it waits
    for the workers, then compiles or loads every pair added in this process, as ready() does."""
    tasks, added, threads = queue.SimpleQueue(), [], []
    queued = set()
    parallel = workers_run()

    def add(pairs):
        pairs = [(d, tuple(s)) for d, s in pairs if hasattr(d, "compile")]     # not with NUMBA_DISABLE_JIT
        added.extend(pairs)
        if not parallel:
            return
        for dispatcher, signature in pairs:
            if (dispatcher, signature) not in queued and not compiled_whole(dispatcher, signature) \
                    and cache_lacks(dispatcher, signature) and _importable(dispatcher):
                queued.add((dispatcher, signature))
                tasks.put((dispatcher.py_func.__module__, dispatcher.__name__, signature,
                           dispatcher.py_func.__code__.co_filename))
        if len(queued) > 1:
            for _ in range(min(jobs(), len(queued)) - len(threads)):
                threads.append(threading.Thread(target=_feed, args=(tasks, _worker_environment()), daemon=True))
                threads[-1].start()

    try:
        yield add
    except BaseException:       # an error or an interrupt here: the workers stop after the kernels they compile
        while not tasks.empty():
            tasks.get_nowait()
        raise
    finally:
        tasks.put(None)         # no more: each worker stops at it (and puts it back for the next)
        for thread in threads:
            thread.join()
    for dispatcher, signature in added:
        dispatcher.compile(signature)


def workers_run():
    """Whether kernels compile in worker processes here: jobs() > 1, and a Python to start (a frozen application's
    executable is the application, not a Python that runs `-c`)."""
    return jobs() > 1 and bool(sys.executable) and not getattr(sys, "frozen", False)


def _importable(dispatcher):
    """Whether a worker finds `dispatcher` by its module and name (the generated kernels it does not)."""
    module = sys.modules.get(dispatcher.py_func.__module__)
    return module is not None and module.__name__.startswith("jitape_kernels") and getattr(
        module, dispatcher.__name__, None) is dispatcher


def _worker_environment():
    return dict(os.environ, JITAPE_CACHE_DIR=str(Path(cache_dir()).parent),
                PYTHONPATH=os.pathsep.join([_PACKAGE_ROOT] + [p for p in [os.environ.get("PYTHONPATH")] if p]))


def _feed(tasks, environment):
    """One worker's life: started, handed tasks one at a time until it meets the end (None) or ends itself, then
    stopped; what it leaves, this process compiles (side_by_side)."""
    try:
        # started in the package's root, which `-c` puts first on its path: it imports this process's kernel
        # files, not others its working directory holds (numba caches a kernel under its file's path)
        with subprocess.Popen([sys.executable, "-c", _SERVE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, env=environment, cwd=_PACKAGE_ROOT) as worker:
            while True:
                task = tasks.get()
                if task is None:
                    tasks.put(None)
                    break
                pickle.dump(task, worker.stdin)
                worker.stdin.flush()
                if not worker.stdout.read(1):       # it ended
                    break
            worker.stdin.close()
    except OSError:                                 # no worker
        pass


def serve():
    """A worker process: compile each (module, function name, signature, its file) read from stdin, answering one
    byte when done: b"!" where the compile failed (ready() then compiles it and raises what numba raises) or the
    function this worker imports is not in that file (its compile would be cached where that process does not
    look)."""
    import importlib
    read, answer = sys.stdin.buffer, sys.stdout.buffer
    while True:
        try:
            module, name, signature, filename = pickle.load(read)
        except EOFError:
            return
        try:
            dispatcher = getattr(importlib.import_module(module), name)
            if dispatcher.py_func.__code__.co_filename != filename:
                raise ImportError(f"{module}.{name} is not {filename}'s")
            dispatcher.compile(signature)
            answer.write(b".")
        except Exception:
            answer.write(b"!")
        answer.flush()
