"""Shared benchmark machinery for perf/: single-thread setup, peer detection,
timing (warm-up, then the median of repeats) and the result tables.

Import this module before numpy or any peer library: it pins the process to
one core and sets every BLAS/OpenMP/TensorFlow/XLA thread count to 1 at import
time, which only works before those libraries load.
"""
import os

_SINGLE_THREAD_ENV = {
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "NUMBA_NUM_THREADS": "1",
    "TF_NUM_INTRAOP_THREADS": "1",
    "TF_NUM_INTEROP_THREADS": "1",
    "TF_CPP_MIN_LOG_LEVEL": "2",
    "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1",
    "JAX_PLATFORMS": "cpu",
}
os.environ.update(_SINGLE_THREAD_ENV)
if hasattr(os, "sched_setaffinity") and len(os.sched_getaffinity(0)) > 1:
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})

import cProfile  # noqa: E402
import gc  # noqa: E402
import importlib  # noqa: E402
import importlib.metadata as metadata  # noqa: E402
import io  # noqa: E402
import itertools  # noqa: E402
import platform  # noqa: E402
import pstats  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

PROFILE = False  # set by main(): cProfile the jitape rows after timing them
REPEAT = 21
BUDGET_S = 3.0  # stop repeating a row once its samples took this long (>= 3 samples)
MIN_SAMPLE_S = 2e-4  # fast calls are looped so one sample lasts at least this long
WARMUP_S = 0.05     # and warmed up this long (at least `warmup` calls): a fast call's first few hundred ran ~10%
                    # slower (W7 n=2,500's eager gradient 38 us for 130 calls, then 33.5)


# ---------------------------------------------------------------- peers

def _configure_tensorflow(tf):
    try:
        tf.config.threading.set_intra_op_parallelism_threads(1)
        tf.config.threading.set_inter_op_parallelism_threads(1)
    except RuntimeError:  # already initialised by an earlier benchmark: the env vars hold
        pass


def _configure_torch(torch):
    torch.set_num_threads(1)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # may only be set once per process
        pass


_CONFIGURE = {"tensorflow": _configure_tensorflow, "torch": _configure_torch}
_peers = {}


def peer(name):
    """The module `name` (jitape or a peer) configured for one thread, or
    None when it is not installed or fails to import (its rows are skipped)."""
    if name not in _peers:
        try:
            module = importlib.import_module(name)
        except Exception:  # a broken install must not stop the other rows
            module = None
        if module is not None and name in _CONFIGURE:
            _CONFIGURE[name](module)
        _peers[name] = module
    return _peers[name]


def environment():
    """One markdown line per library version and the thread setup."""
    lines = [f"- python {platform.python_version()}, {platform.machine()}, "
             f"cores allowed: {sorted(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else '?'}",
             "- " + ", ".join(f"{k}={v}" for k, v in _SINGLE_THREAD_ENV.items() if k != "TF_CPP_MIN_LOG_LEVEL")]
    versions = []
    for dist in ["jitape", "numpy", "numba", "scipy", "tensorflow-cpu", "tensorflow", "torch",
                 "jax", "jaxlib", "autograd"]:
        try:
            versions.append(f"{dist} {metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            pass
    lines.append("- " + ", ".join(versions))
    return "\n".join(lines)


# ---------------------------------------------------------------- results

def to_numpy(value):
    """Nested lists/tuples/dicts of tensors from any library → list of float64 arrays."""
    if isinstance(value, dict):
        return [a for k in sorted(value) for a in to_numpy(value[k])]
    if isinstance(value, (list, tuple)):
        return [a for v in value for a in to_numpy(v)]
    if hasattr(value, "detach"):  # torch
        value = value.detach().cpu().numpy()
    return [np.asarray(value, dtype=np.float64)]


def check(got, reference, tol):
    """'ok', or what is wrong: each array must match in shape and be within
    tol * max|reference| of it."""
    got, reference = to_numpy(got), to_numpy(reference)
    if len(got) != len(reference):
        return f"WRONG: {len(got)} arrays, expected {len(reference)}"
    worst = 0.0
    for g, r in zip(got, reference):
        if g.shape != r.shape:
            return f"WRONG: shape {g.shape}, expected {r.shape}"
        scale = max(float(np.max(np.abs(r))), 1e-30) if r.size else 1.0
        err = float(np.max(np.abs(g - r))) / scale if r.size else 0.0
        if not np.isfinite(err):
            return "WRONG: non-finite"
        worst = max(worst, err)
    return "ok" if worst <= tol else f"WRONG: rel err {worst:.1e}"


def measure(fn, repeat=None, warmup=2):
    """(first call ms, median ms, first result). The first call is timed on
    its own (trace/compile/cache load), then `warmup` calls (and more until
    WARMUP_S passed), then the median of up to `repeat` samples, each the mean
    over enough calls to last MIN_SAMPLE_S."""
    repeat = repeat or REPEAT
    gc.collect()
    t = time.perf_counter()
    result = fn()
    first = time.perf_counter() - t
    warm_until = time.perf_counter() + WARMUP_S
    for i in itertools.count():
        if i >= warmup and time.perf_counter() >= warm_until:
            break
        fn()
    t = time.perf_counter()
    fn()
    one = time.perf_counter() - t
    number = max(1, int(MIN_SAMPLE_S / max(one, 1e-9)))
    samples = []
    start = time.perf_counter()
    while len(samples) < repeat:
        t = time.perf_counter()
        for _ in range(number):
            fn()
        samples.append((time.perf_counter() - t) / number)
        if len(samples) >= 3 and time.perf_counter() - start > BUDGET_S:
            break
    return first * 1e3, statistics.median(samples) * 1e3, result


def _profile(fn, calls=20):
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        fn()
    profiler.disable()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(15)
    return out.getvalue()


# (gradient row, forward row) of the rows most workloads have, for Table.note_costs
GRADIENT_COST_ROWS = (("jitape eager", "jitape eager"), ("TF eager", "TF eager"), ("tf.function", "tf.function"),
                      ("torch eager", "torch eager"), ("jax.jit(jax.grad)", "jax.jit"),
                      ("numpy hand-written fwd+bwd (limit)", "numpy (limit)"))


class Table:
    """Rows of one workload, timed as they are added; `baseline` names the
    jitape row the ratios are taken against."""

    def __init__(self, title, reference, tol, baseline="jitape eager"):
        self.title, self.reference, self.tol, self.baseline = title, reference, tol, baseline
        self.rows = []  # (name, first ms, median ms, status, note)
        self.notes = []
        self.profiles = []

    def add(self, name, fn, note="", repeat=None, warmup=2, per=None, answer=None):
        """Time fn (a zero-argument callable returning the result) and check
        its result. A library error becomes the row's status, never an exception.
        per: (unit, count), e.g. ("instruction", 4000): adds ns per unit to the note.
        answer: maps fn's return value to the result to check, outside the timing."""
        try:
            first, median, result = measure(fn, repeat, warmup)
        except Exception as exc:  # a broken row is reported, the run goes on
            self.rows.append((name, None, None, f"error: {type(exc).__name__}: {exc}"[:160], note))
            return None
        if answer is not None:
            result = answer(result)
        status = check(result, self.reference, self.tol) if self.reference is not None else "-"
        if per:
            note = (note + "; " if note else "") + f"**{median * 1e6 / per[1]:.1f} ns per {per[0]}** ({per[1]})"
        self.rows.append((name, first, median, status, note))
        if PROFILE and name.startswith("jitape"):
            self.profiles.append((name, _profile(fn)))
        return median

    def add_group(self, label, add, *args):
        """Call add(self, *args), which adds a library's rows; an error in
        its setup becomes a row named after the library instead of a crash."""
        try:
            add(self, *args)
        except Exception as exc:  # e.g. an API the library does not have yet
            self.rows.append((label, None, None, f"error: {type(exc).__name__}: {exc}"[:160], ""))

    def skip(self, name, why):
        self.rows.append((name, None, None, f"skipped: {why}", ""))

    def median(self, name):
        return next((r[2] for r in self.rows if r[0] == name), None)

    def note_costs(self, forward, pairs, what="gradient"):
        """Notes `- what/forward cost, F: ratio` for each (row of this table, row F of the `forward` table)
        pair where both rows were timed."""
        for row, forward_row in pairs:
            timed, base = self.median(row), forward.median(forward_row)
            if timed and base:
                self.notes.append(f"- {what}/forward cost, {forward_row}: {timed / base:.2f}")

    def render(self):
        base = self.median(self.baseline)
        lines = [f"### {self.title}", "",
                 "| row | median ms | × jitape | first call ms | check | note |",
                 "|---|---:|---:|---:|---|---|"]
        for name, first, median, status, note in self.rows:
            ratio = f"{median / base:.3g}" if median is not None and base else "—"
            lines.append(f"| {name} | {_fmt(median)} | {ratio} | {_fmt(first)} | {status} | {note} |")
        lines += [""] + [f"{n}" for n in self.notes]
        for name, text in self.profiles:
            lines += ["", f"cProfile of `{name}` (20 calls, by tottime):", "```", text.strip(), "```"]
        return "\n".join(lines)


def _fmt(ms):
    if ms is None:
        return "—"
    return f"{ms:.4f}" if ms < 0.1 else f"{ms:.3f}" if ms < 10 else f"{ms:.1f}"


def add_all(table, groups, extra=()):
    """groups: (library, add) pairs; add(table, *extra, module) adds that
    library's rows (extra: further tables it fills). "jitape" and the peers
    are imported here, a missing one is skipped; "njit"/"numpy" groups get no
    module and always run. Setup errors become rows of `table`."""
    for library, add in groups:
        if library in ("njit", "numpy"):
            table.add_group(library, add, *extra)
            continue
        module = peer(library)
        if module is None:
            table.skip(library, "not installed or fails to import")
        else:
            table.add_group(library, add, *extra, module)


def add_tensorflow_rows(grad, fwd, tf, gradient, forward, **options):
    """The four TensorFlow rows of a gradient table and its forward table: eager and under tf.function."""
    grad.add("TF eager", gradient, **options)
    grad.add("tf.function", tf.function(gradient), note="first call = trace", **options)
    fwd.add("TF eager", forward, **options)
    fwd.add("tf.function", tf.function(forward), note="first call = trace", **options)


def main(build_tables, argv=None):
    """Entry point of a single benchmark script: `--profile` adds cProfile
    listings of the jitape rows."""
    global PROFILE
    argv = sys.argv[1:] if argv is None else argv
    PROFILE = "--profile" in argv
    print(environment() + "\n")
    for table in build_tables():
        print(table.render() + "\n", flush=True)
