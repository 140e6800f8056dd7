"""The `jitape` command line: `demo`, `info`, `warmup` and `bench`.

`main(argv)` parses the arguments, runs one subcommand and returns its exit code.
"""

import argparse
import importlib.metadata
import multiprocessing
import multiprocessing.connection
import os
import platform
import subprocess
import sys
import threading
import time
from pathlib import Path

import jitape as jt
import jitape_kernels
from jitape import demo as examples
from jitape_kernels import cpu, parallel_compile

_PERF_RUNNER = Path(__file__).resolve().parent.parent / "perf" / "run.py"


def _version(distribution):
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def demo(args):
    total = time.perf_counter()
    for example in examples.EXAMPLES:
        start = time.perf_counter()
        printed = example()
        elapsed = time.perf_counter() - start
        print(f"== {examples.title(example)}")
        print(printed)
        print(f"   ({elapsed * 1e3:.2f} ms)\n")
    total = time.perf_counter() - total
    print(f"{len(examples.EXAMPLES)} examples in {total * 1e3:.1f} ms")
    return 0


def _cuda_backend():
    try:
        from numba import cuda
    except ImportError:
        return "not installed"
    simulator = os.environ.get("NUMBA_ENABLE_CUDASIM", "0") == "1"
    available = "available" if cuda.is_available() else "no device found"
    package = _version("numba-cuda")
    source = "numba's own numba.cuda" if package == "not installed" else f"numba-cuda {package}"
    return f"{available} (simulator {'enabled' if simulator else 'disabled'}, {source})"


def info(args):
    rows = [
        ("jitape", jt.__version__),
        ("python", f"{platform.python_version()} ({sys.executable})"),
        ("numpy", _version("numpy")),
        ("numba", _version("numba")),
        ("scipy", _version("scipy")),
        ("floatx", jt.floatx()),
        ("numba cache", jitape_kernels.cache_dir()),
        ("backend cpu", "available"),
        ("backend cuda", _cuda_backend()),
    ]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    return 0


def _progress(done, total, label, stream, width=30):
    filled = width * done // total
    line = f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {label}"
    if stream.isatty():
        # Redrawn in place; the padding wipes out a longer label drawn before.
        stream.write(f"\r{line:<79}" + ("\n" if done == total else ""))
    else:
        stream.write(line + "\n")
    stream.flush()


# The default number of warmup processes: its longest steps (each dtype's forward and reverse row kernels, ~30 s
# each on one core) bound it, so more than four processes would mostly compile the same shared callees side by
# side, ~1 GB of memory each
WARMUP_JOBS = 4


def warmup(args):
    # numba compiles on one thread, so the steps run in worker processes; each saves what it compiles to the
    # shared disk cache (jitape_kernels._KernelCacheFile), where the others find it
    steps = cpu.warmup_steps()
    jobs = min(args.jobs or min(parallel_compile.cores(), WARMUP_JOBS), len(steps))
    start = time.perf_counter()
    _progress(0, len(steps), f"compiling on {jobs} {'core' if jobs == 1 else 'cores'}", sys.stderr)
    if jobs == 1:
        for index, (name, _) in enumerate(steps):
            _warmup_step(index)
            _progress(index + 1, len(steps), f"compiled {name}", sys.stderr)
    else:
        # leaving the pool (done, Ctrl-C, a failed step) terminates its workers: no wait for compiles under way
        with _worker_pool(jobs) as pool:
            for done, index in enumerate(pool.imap_unordered(_warmup_step, range(len(steps))), 1):
                _progress(done, len(steps), f"compiled {steps[index][0]}", sys.stderr)
    elapsed = time.perf_counter() - start
    print(f"compiled and cached {len(steps)} kernels in {elapsed:.1f} s on {jobs} "
          f"{'core' if jobs == 1 else 'cores'} (cache: {jitape_kernels.cache_dir()})")
    return 0


def _worker_pool(jobs):
    # spawned, not forked: a forked child would inherit this process's numba and LLVM state mid-use
    return multiprocessing.get_context("spawn").Pool(jobs, initializer=_end_with_parent)


def _warmup_step(index):
    # the steps run side by side already: none hands its kernels to compile workers of its own
    with parallel_compile.alone():
        cpu.run_warmup_step(index)
    return index


def _end_with_parent():
    """A warmup worker's start: a thread that ends the worker when the `jitape warmup` that spawned it ends
    (killed, or interrupted), where it would compile on for minutes."""
    parent = multiprocessing.parent_process()
    threading.Thread(target=lambda: (multiprocessing.connection.wait([parent.sentinel]), os._exit(1)),
                     daemon=True).start()


def _positive(text):
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a number of processes >= 1, got {text}")
    return value


def bench(args):
    # pyproject.toml beside perf/ tells a source checkout from a site-packages
    # that happens to hold some other top-level "perf".
    in_checkout = (_PERF_RUNNER.parent.parent / "pyproject.toml").is_file()
    if not (in_checkout and _PERF_RUNNER.is_file()):
        print("The perf suite (perf/) ships with jitape's source checkout, not with the installed\n"
              "package. In a checkout, perf/README.md says how to install the peer libraries;\n"
              "then run `jitape bench [W1 ...]` there (or `python perf/run.py`).")
        return 0
    # A child process, because the suite pins BLAS threads through environment
    # variables that only take effect before numpy is first imported.
    return subprocess.call([sys.executable, str(_PERF_RUNNER), *args.perf_args])


def _parser():
    parser = argparse.ArgumentParser(
        prog="jitape",
        description="Reverse-mode autodiff with TensorFlow's GradientTape model and a Numba-compiled core.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="command")
    commands.add_parser("demo", help="run the seed tutorials' examples with timings").set_defaults(run=demo)
    commands.add_parser("info", help="versions, numba cache directory, backends").set_defaults(run=info)
    warmup_parser = commands.add_parser("warmup", help="compile and cache every kernel for float32 and float64")
    warmup_parser.add_argument("--jobs", "-j", type=_positive, default=None,
                               help=f"processes compiling at once (default: one per core, at most {WARMUP_JOBS})")
    warmup_parser.set_defaults(run=warmup)
    commands.add_parser("bench", help="run the perf suite (perf/run.py) against the peers installed; "
                        "further arguments are passed on to it").set_defaults(run=bench)
    return parser


def main(argv=None):
    parser = _parser()
    # argparse cannot hand a subcommand the options it does not know (REMAINDER
    # drops a leading "--option"), so bench takes whatever is left over.
    args, extra = parser.parse_known_args(argv)
    if extra and args.run is not bench:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.perf_args = extra
    return args.run(args)
