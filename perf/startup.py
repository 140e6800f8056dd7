"""Startup costs: `import jitape` + first gradient in a fresh process with a
warm numba cache (target ≤ 0.5 s), and a cold `jitape warmup` (target ≤ 30 s)
when the CLI exists. Both use a private, initially empty NUMBA_CACHE_DIR so
the user's cache is neither used nor touched.

Run: python perf/startup.py
"""
import harness  # first: the single-thread environment the subprocesses inherit
import importlib.util
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

FIRST_GRADIENT = """
import time
t = time.perf_counter()
import jitape as jt
imported = time.perf_counter() - t
x = jt.constant(3.0)
with jt.GradientTape() as tape:
    tape.watch(x)
    y = jt.sin(x) * x
g = float(tape.gradient(y, x))
print(time.perf_counter() - t, imported, g)
"""
RUNS = 7


def _run(args, env):
    """(wall seconds, stdout) of a subprocess; raises with its stderr on failure."""
    t = time.perf_counter()
    done = subprocess.run(args, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t
    if done.returncode:
        lines = done.stderr.strip().splitlines() or [f"exit {done.returncode}"]
        errors = [line for line in lines if re.match(r"^[\w.]+(Error|Exception)\b", line)]
        raise RuntimeError((errors or lines)[-1])
    return wall, done.stdout


def tables():
    with tempfile.TemporaryDirectory(prefix="jitape-perf-numba-") as cache:
        env = dict(os.environ, NUMBA_CACHE_DIR=cache)
        # a user's installed package has its bytecode (pip compiles it; an editable install writes it at the
        # first import): a sandbox's PYTHONDONTWRITEBYTECODE=1 compiled every jitape module at every import
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        return [_measure(env)]


def _measure(env):
    table = harness.Table("Startup (fresh processes; medians in ms)", None, tol=0, baseline="")
    first_gradient = [sys.executable, "-c", FIRST_GRADIENT]
    if importlib.util.find_spec("jitape.cli") is None:
        table.skip("cold `jitape warmup`", "jitape.cli missing")
    else:
        try:
            wall, _ = _run([sys.executable, "-m", "jitape", "warmup"], env)
            table.rows.append(("cold `jitape warmup`", None, wall * 1e3, "-",
                               "empty NUMBA_CACHE_DIR; target ≤ 30 s"))
        except (RuntimeError, OSError) as exc:
            table.rows.append(("cold `jitape warmup`", None, None, f"error: {exc}"[:200], ""))
    try:
        wall, _ = _run(first_gradient, env)
        table.notes.append(f"- first import + gradient after the warmup step: {wall:.2f} s "
                           "(compiles whatever the warmup left cold)")
        inside, imports, outside = [], [], []
        for _ in range(RUNS):
            wall, out = _run(first_gradient, env)
            outside.append(wall)
            inside.append(float(out.split()[0]))
            imports.append(float(out.split()[1]))
        table.rows.append(("import jitape + first gradient", None, statistics.median(inside) * 1e3, "-",
                           f"warm cache, in-process, median of {RUNS}; target ≤ 0.5 s"))
        table.rows.append(("  of which `import jitape`", None, statistics.median(imports) * 1e3, "-",
                           "numpy, numba and jitape modules"))
        table.rows.append(("whole `python -c` process", None, statistics.median(outside) * 1e3, "-",
                           "same runs, including interpreter start"))
    except (RuntimeError, OSError) as exc:
        table.rows.append(("import jitape + first gradient", None, None, f"error: {exc}"[:200], ""))
    return table


if __name__ == "__main__":
    harness.main(tables)
