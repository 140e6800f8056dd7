"""Kernels at memory speed (issue 9, item 3): one instruction's compiled forward and K = 1 reverse sweep on
large float64 arrays, against the numpy expression computing the same thing (into fresh arrays, as numpy
users write it). Each row records the op on a tape, lowers it to a Program, and times the sweeps of that one
instruction on the Program's arena and a seeded adjoint buffer; jitape and numpy take turns in each round and
the best of ROUNDS is reported. The goal: every ratio within 1.5.

A second table gives the fixed cost of a row on small arrays: a chain of CHAIN instructions (y = y * x, or
y = y * w with w a scalar, a broadcast of one entry each time) swept forward and in reverse, in ns per
instruction, beside one numpy call on the same arrays.

Run: python perf/kernels.py [ROUNDS]
"""
import sys
import time

import numpy as np

import jitape as jt
from jitape import program as programs
from jitape_kernels import opcodes as oc
from jitape_kernels.cpu import forward_sweep, new_temps, reverse_sweep

RNG = np.random.default_rng(9)
TALL = RNG.standard_normal((10_000, 100))       # W10's distance matrix
WIDE = RNG.standard_normal((100, 10_000))
SQUARE = RNG.standard_normal((1_000, 1_000))
FLAT = RNG.standard_normal(1_000_000)
POSITIVE = np.abs(FLAT) + 0.1
COLUMN, ROW = TALL[:, :1].copy(), TALL[:1].copy()


def _sum_to(g, shape):
    """numpy's cotangent of a broadcast to g.shape from `shape`: g summed over the broadcast axes."""
    axes = tuple(d for d, n in enumerate(shape) if n == 1)
    return g.sum(axis=axes, keepdims=True)


def _extremum_cotangent(x, g, axis):
    """numpy's MAX/MIN cotangent, ties split evenly: g at the extrema."""
    hits = x == x.max(axis=axis, keepdims=True)
    return np.expand_dims(g, axis) * hits / hits.sum(axis=axis, keepdims=True)


# label, input, the jitape op, numpy forward, numpy reverse (x, g) -> cotangent of x
CASES = [
    ("exp", FLAT, jt.exp, np.exp, lambda x, g: g * np.exp(x)),
    ("log", POSITIVE, jt.math.log, np.log, lambda x, g: g / x),
    ("tanh", FLAT, jt.tanh, np.tanh, lambda x, g: g * (1 - np.tanh(x) ** 2)),
    ("x * x", FLAT, lambda x: x * x, lambda x: x * x, lambda x, g: 2 * g * x),
    ("x / 3", FLAT, lambda x: x / 3.0, lambda x: x / 3.0, lambda x, g: g / 3.0),
    ("reduce_sum axis 1 (10000, 100)", TALL, lambda x: jt.reduce_sum(x, 1), lambda x: x.sum(1),
     lambda x, g: np.repeat(g[:, None], x.shape[1], 1)),
    ("reduce_sum axis 0 (10000, 100)", TALL, lambda x: jt.reduce_sum(x, 0), lambda x: x.sum(0),
     lambda x, g: np.repeat(g[None], x.shape[0], 0)),
    ("reduce_sum axis 1 (100, 10000)", WIDE, lambda x: jt.reduce_sum(x, 1), lambda x: x.sum(1),
     lambda x, g: np.repeat(g[:, None], x.shape[1], 1)),
    ("reduce_max axis 1 (10000, 100)", TALL, lambda x: jt.reduce_max(x, 1), lambda x: x.max(1),
     lambda x, g: _extremum_cotangent(x, g, 1)),
    ("reduce_max axis 0 (10000, 100)", TALL, lambda x: jt.reduce_max(x, 0), lambda x: x.max(0),
     lambda x, g: _extremum_cotangent(x, g, 0)),
    ("reduce_min axis 1 (100, 10000)", WIDE, lambda x: jt.reduce_min(x, 1), lambda x: x.min(1),
     lambda x, g: _extremum_cotangent(-x, g, 1)),
    ("broadcast (10000, 1) -> (10000, 100)", COLUMN, lambda x: jt.broadcast_to(x, TALL.shape),
     lambda x: np.broadcast_to(x, TALL.shape).copy(), lambda x, g: _sum_to(g, x.shape)),
    ("broadcast (1, 100) -> (10000, 100)", ROW, lambda x: jt.broadcast_to(x, TALL.shape),
     lambda x: np.broadcast_to(x, TALL.shape).copy(), lambda x, g: _sum_to(g, x.shape)),
    ("transpose (1000, 1000)", SQUARE, jt.transpose, lambda x: x.T.copy(), lambda x, g: g.T.copy()),
    ("transpose (1000, 25, 10) -> (25, 1000, 10)", SQUARE.reshape(-1)[:250_000].reshape(1000, 25, 10),
     lambda x: jt.transpose(x, (1, 0, 2)), lambda x: np.transpose(x, (1, 0, 2)).copy(),
     lambda x, g: np.transpose(g, (1, 0, 2)).copy()),
    ("transpose (1000, 25, 10) -> (10, 25, 1000)", SQUARE.reshape(-1)[:250_000].reshape(1000, 25, 10),
     lambda x: jt.transpose(x, (2, 1, 0)), lambda x: np.transpose(x, (2, 1, 0)).copy(),
     lambda x, g: np.transpose(g, (2, 1, 0)).copy()),
    ("tile (1000, 100) x (1, 10)", TALL.reshape(-1)[:100_000].reshape(1000, 100), lambda x: jt.tile(x, [1, 10]),
     lambda x: np.tile(x, (1, 10)), lambda x, g: g.reshape(1000, 10, 100).sum(1)),
    ("x[:, ::2] (1000, 1000)", SQUARE, lambda x: x[:, ::2], lambda x: x[:, ::2].copy(),
     lambda x, g: _strided_pad(g, x.shape)),
    ("x[:, 1:] (1000, 1000)", SQUARE, lambda x: x[:, 1:], lambda x: x[:, 1:].copy(),
     lambda x, g: np.pad(g, ((0, 0), (1, 0)))),
    ("cumsum axis 1 (10000, 100)", TALL, lambda x: jt.math.cumsum(x, 1), lambda x: np.cumsum(x, 1),
     lambda x, g: np.cumsum(g[:, ::-1], 1)[:, ::-1]),
]


def _strided_pad(g, shape):
    out = np.zeros(shape)
    out[:, ::2] = g
    return out


def _one_instruction(op, value):
    """The Program of op(x) (its last instruction is op's), its row, and a seeded K = 1 adjoint buffer."""
    x = jt.constant(value)
    with jt.GradientTape(persistent=True) as tape:
        tape.watch(x)
        y = op(x)
    program = programs.lower(tape, [y], [x]).complete()
    row = np.ascontiguousarray(program.code[-1:])
    adjoint = RNG.standard_normal((program.adjoint_size, 1))
    return program, row, adjoint, np.asarray(y.numpy())


def _best_of(rounds, *fns):
    best = [np.inf] * len(fns)
    for _ in range(rounds):
        for i, fn in enumerate(fns):
            t = time.perf_counter()
            fn()
            best[i] = min(best[i], time.perf_counter() - t)
    return [b * 1e3 for b in best]


def row_times(op, value, np_forward, np_reverse, rounds):
    program, row, adjoint, y = _one_instruction(op, value)
    p = program
    written = np.zeros(p.slots.shape[0], np.bool_)
    g = RNG.standard_normal(y.shape)
    temps = new_temps(row, p.iattr, 1, p.dtype)

    def forward():
        forward_sweep(row, p.slots, p.iattr, p.fattr, p.arena, temps)

    def reverse():
        written[:] = False
        written[row[0, oc.OUT]] = True
        reverse_sweep(row, p.slots, p.iattr, p.fattr, p.arena, adjoint, written, p.homes, temps)

    forward(), reverse()
    return _best_of(rounds, forward, lambda: np_forward(value), reverse, lambda: np_reverse(value, g))


CHAIN = 1000


def _chain_program(size, scalar_factor):
    """The Program of CHAIN multiplications of a `size`-entry y by x (or by a scalar w: a broadcast each time)."""
    x = jt.constant(np.linspace(0.5, 1.5, size))
    w = jt.constant(0.999)
    with jt.GradientTape(persistent=True) as tape:
        tape.watch([x, w])
        y = x
        for _ in range(CHAIN):
            y = y * (w if scalar_factor else x)
        total = jt.reduce_sum(y)
    return programs.lower(tape, [total], [x, w]).complete()


def small_row_times(size, scalar_factor, rounds):
    """ns per instruction: forward sweep, K = 1 reverse sweep, one numpy multiply of the same arrays."""
    p = _chain_program(size, scalar_factor)
    arena = p.arena.copy()
    adjoint = np.zeros((p.adjoint_size, 1))
    written = np.zeros(p.slots.shape[0], np.bool_)
    temps = new_temps(p.code, p.iattr, 1, p.dtype)
    target = p.targets[0]
    adjoint[p.adjoint_rows[target], 0] = 1.0
    a, b = np.linspace(0.5, 1.5, size), (0.999 if scalar_factor else np.linspace(0.5, 1.5, size))

    def reverse():
        written[:] = False
        written[target] = True
        reverse_sweep(p.code, p.slots, p.iattr, p.fattr, arena, adjoint, written, p.homes, temps)

    def numpy_calls():
        for _ in range(CHAIN):
            np.multiply(a, b)

    forward = lambda: forward_sweep(p.code, p.slots, p.iattr, p.fattr, arena, temps)     # noqa: E731
    forward(), reverse()
    f, r, n = _best_of(rounds, forward, reverse, numpy_calls)
    return [t * 1e6 / len(p) for t in (f, r)] + [n * 1e6 / CHAIN]


def main(argv):
    rounds = int(argv[0]) if argv else 15
    print(f"best of {rounds} rounds, ns per instruction over a chain of {CHAIN}\n")
    print("| chain | entries | forward | K = 1 reverse | one numpy multiply |")
    print("|---|---:|---:|---:|---:|")
    for scalar_factor in (False, True):
        for size in (1, 3, 100, 1000):
            f, r, n = small_row_times(size, scalar_factor, rounds)
            label = "y * w, w a scalar (a broadcast)" if scalar_factor else "y * x"
            print(f"| {label} | {size} | {f:.0f} | {r:.0f} | {n:.0f} |", flush=True)
    print()
    print(f"best of {rounds} rounds, ms; ratio = jitape / numpy\n")
    print("| instruction | forward | numpy | ratio | K = 1 reverse | numpy | ratio |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for label, value, op, np_forward, np_reverse in CASES:
        f, nf, r, nr = row_times(op, value, np_forward, np_reverse, rounds)
        print(f"| {label} | {f:.3f} | {nf:.3f} | {f / nf:.2f} | {r:.3f} | {nr:.3f} | {r / nr:.2f} |", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
