"""Record costs (issue 9, item 5): one recorded elementwise op and basic indexing (`t[0]`, `t[a:b]`,
`t[:, j]`) on small tensors, recorded on a tape that watches the input and with no tape, against PyTorch
eager (requires_grad) and TensorFlow eager (GradientTape). Each timed call records 100 ops on a fresh tape;
the median is reported per op. float32, x of shape (8, 4).

Run: python perf/records.py [--profile]
     python perf/records.py --interleaved [ROUNDS]   best of ROUNDS per row, the rows run round robin (jitape
                                                     recorded, torch): on a noisy machine, ratios of one phase
"""
import sys
import time

import harness
import numpy as np

OPS = 100
X = np.arange(32, dtype=np.float32).reshape(8, 4) / 32
Y = np.ones((8, 4), np.float32)
# name -> the op on a tensor x (and y of x's shape)
CASES = {"x + y": lambda x, y: x + y, "x[0]": lambda x, y: x[0], "x[2:6]": lambda x, y: x[2:6],
         "x[:, 1]": lambda x, y: x[:, 1]}


def _repeated(op, x, y):
    def run():
        for _ in range(OPS):
            out = op(x, y)
        return out
    return run


def _add_recorded(table, library, tape, watch, x, y):
    """Rows of ops recorded on a fresh `tape()` watching x (`watch`: the tape's method)."""
    for name, op in CASES.items():
        run = _repeated(op, x, y)

        def recorded(run=run):
            with tape() as t:
                watch(t, x)
                return run()
        table.add(f"{library} {name}, recorded", recorded, per=("op", OPS))


def add_jitape(table, jt):
    x, y = jt.constant(X), jt.constant(Y)
    _add_recorded(table, "jitape", jt.GradientTape, jt.GradientTape.watch, x, y)
    for name, op in CASES.items():
        table.add(f"jitape {name}, no tape", _repeated(op, x, y), per=("op", OPS))


def add_torch(table, torch):
    x, y = torch.tensor(X, requires_grad=True), torch.tensor(Y)
    for name, op in CASES.items():
        table.add(f"torch {name}, recorded (requires_grad)", _repeated(op, x, y), per=("op", OPS))


def add_tensorflow(table, tf):
    _add_recorded(table, "tensorflow", tf.GradientTape, tf.GradientTape.watch, tf.constant(X), tf.constant(Y))


def tables():
    table = harness.Table(f"Record costs: {OPS} ops per timed call, small float32 tensors", None, None,
                          baseline="jitape x + y, recorded")
    harness.add_all(table, [("jitape", add_jitape), ("torch", add_torch), ("tensorflow", add_tensorflow)])
    return [table]


def interleaved(rounds):
    """Best time per op of each recorded row, jitape and torch taking turns in every round."""
    import jitape as jt
    import torch
    x, y = jt.constant(X), jt.constant(Y)
    tx, ty = torch.tensor(X, requires_grad=True), torch.tensor(Y)
    rows = {}
    for name, op in CASES.items():
        run = _repeated(op, x, y)

        def recorded(run=run):
            with jt.GradientTape() as tape:
                tape.watch(x)
                return run()
        rows[f"jitape {name}"] = recorded
        rows[f"torch {name}"] = _repeated(op, tx, ty)
    best = dict.fromkeys(rows, float("inf"))
    for _ in range(rounds):
        for row, fn in rows.items():
            start = time.perf_counter()
            fn()
            best[row] = min(best[row], time.perf_counter() - start)
    print(f"| recorded op | jitape ns | torch ns | jitape / torch |  (best of {rounds} interleaved rounds)")
    print("|---|---:|---:|---:|")
    for name in CASES:
        j, t = best[f"jitape {name}"] / OPS * 1e9, best[f"torch {name}"] / OPS * 1e9
        print(f"| {name} | {j:.0f} | {t:.0f} | {j / t:.2f} |")


if __name__ == "__main__":
    if "--interleaved" in sys.argv:
        position = sys.argv.index("--interleaved")
        interleaved(int(sys.argv[position + 1]) if len(sys.argv) > position + 1 else 300)
    else:
        harness.main(tables)
