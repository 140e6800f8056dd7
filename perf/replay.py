"""Replays (issue 8): the first call of a jt.function / jt.grad (the trace) and later calls, a repeated
gradient on a persistent tape (planned once), a jt.function called under a tape (one recorded op) against the
same ops recorded one by one, and jt.save / jt.load of a 100,000-instruction Program
(time and file size). jitape only: the peers' rows for the same workloads are in W1, W2, W3, W4 and W6.

Run: python perf/replay.py [--profile]
"""
import os
import tempfile
import time

import harness

import jitape as jt


def _chain(x, n):
    y = x
    for _ in range(n):
        y = jt.sin(y) * x + 0.5 * y
    return y


def _first_and_replay(table, name, make, call, note=""):
    """A fresh function per timed first call (make() -> fn), then the same function called repeatedly."""
    start = time.perf_counter()
    fn = make()
    call(fn)
    first = (time.perf_counter() - start) * 1e3
    table.add(name, lambda: call(fn), note=f"first call (trace) {first:.1f} ms{'; ' + note if note else ''}")


def tables():
    table = harness.Table("Replays: first call (trace) and repeated calls, float32", None, None,
                          baseline="jitape W1 jt.grad replay")
    x = jt.constant(0.3)
    _first_and_replay(table, "jitape W1 jt.grad replay", lambda: jt.grad(lambda x: _chain(x, 1000)),
                      lambda g: g(x), note="4,000 instructions")
    with jt.GradientTape(persistent=True) as tape:
        tape.watch(x)
        y = _chain(x, 1000)
    table.add("jitape W1 gradient on a persistent tape", lambda: tape.gradient(y, x), note="planned once")
    _first_and_replay(table, "jitape W1 jt.function(chain) replay", lambda: jt.function(lambda x: _chain(x, 1000)),
                      lambda f: f(x), note="forward only")
    chain = jt.function(lambda x: _chain(x, 1000))

    def record_and_gradient(fn):
        with jt.GradientTape() as tape:
            tape.watch(x)
            y = fn(x)
        return tape.gradient(y, x)

    table.add("jitape W1 recorded op by op + gradient", lambda: record_and_gradient(chain.python_function),
              note="eager")
    _first_and_replay(table, "jitape W1 jt.function(chain) under a tape + gradient", lambda: chain,
                      record_and_gradient, note="the call is one recorded op")

    io = harness.Table("jt.save / jt.load of a 100,000-instruction Program (float32 scalar chain)", None, None,
                       baseline="jt.save")
    f = jt.function(lambda x: _chain(x, 25_000))
    f(x)
    path = os.path.join(tempfile.mkdtemp(), "chain.npz")
    jt.save(path, f)
    size = os.path.getsize(path)
    io.add("jt.save", lambda: jt.save(path, f), repeat=5, warmup=1, note=f"file {size / 1e6:.2f} MB")
    io.add("jt.load (validates every instruction)", lambda: jt.load(path), repeat=5, warmup=1)
    loaded = jt.load(path)
    io.add("loaded function call", lambda: loaded(x))
    return [table, io]


if __name__ == "__main__":
    harness.main(tables)
