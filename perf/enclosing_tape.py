"""Derivatives taken while another tape records (issue 7, items 11-12): an unrelated recording tape must not
move a derivative off the compiled sweep, and a recorded batch Jacobian or per-example gradient (an
enclosing tape that does track the computation) must take a number of recorded passes that does not grow
with the batch. Rows: W1's gradient on a persistent tape, alone and with an unrelated tape open; W5-style
batch Jacobians (32 -> 64 elu -> 16 elu) and per-example gradients (MLP 32-64(tanh)-1) at B = 8 and 64,
compiled and recorded, float32.

Run: python perf/enclosing_tape.py [--profile]
"""
import harness
import numpy as np

import jitape as jt


def _w1_tape():
    x = jt.constant(0.3)
    with jt.GradientTape(persistent=True) as tape:
        tape.watch(x)
        y = x
        for _ in range(1000):
            y = jt.sin(y) * x + 0.5 * y
    return tape, x, y


def _unrelated(fn):
    def call():
        with jt.GradientTape() as other:
            other.watch(jt.constant(1.0))
            return fn()
    return call


def _tracking(watched, fn):
    def call():
        with jt.GradientTape() as outer:
            outer.watch(watched)
            return fn()
    return call


def _mlp_tape(batch):
    rng = np.random.default_rng(batch)
    x = jt.constant(rng.standard_normal((batch, 32)).astype(np.float32))
    w1 = jt.Variable((rng.standard_normal((32, 64)) * 0.2).astype(np.float32))
    w2 = jt.Variable((rng.standard_normal((64, 16)) * 0.2).astype(np.float32))
    with jt.GradientTape(persistent=True) as tape:
        tape.watch(x)
        y = jt.nn.elu(jt.matmul(jt.nn.elu(jt.matmul(x, w1)), w2))
        losses = jt.reduce_sum(jt.square(y), axis=1)
    return tape, x, [w1, w2], y, losses


def tables():
    table = harness.Table("Derivatives while another tape records (float32; W1 float32 scalars)", None, None,
                          baseline="jitape W1 gradient, no other tape")
    tape, x, y = _w1_tape()
    table.add("jitape W1 gradient, no other tape", lambda: tape.gradient(y, x))
    table.add("jitape W1 gradient, an unrelated tape recording", _unrelated(lambda: tape.gradient(y, x)))
    for batch in (8, 64):
        tape, x, params, y, losses = _mlp_tape(batch)
        table.add(f"jitape batch_jacobian B={batch}, compiled", lambda: tape.batch_jacobian(y, x))
        table.add(f"jitape batch_jacobian B={batch}, under a tape tracking x (recorded)",
                  _tracking(x, lambda: tape.batch_jacobian(y, x)), repeat=5, warmup=1)
        table.add(f"jitape per_example_gradients B={batch}, compiled", lambda: tape.per_example_gradients(losses, params))
        table.add(f"jitape per_example_gradients B={batch}, under a tape tracking the weights (recorded)",
                  _tracking(params, lambda: tape.per_example_gradients(losses, params)), repeat=5, warmup=1)
    table.notes.append("The recorded rows run the Python VJPs so the result is itself differentiable; their cost "
                       "should not grow with B (batch_jacobian: one pass per target feature; per-example "
                       "gradients: one pass plus a batched product per junction).")
    return [table]


if __name__ == "__main__":
    harness.main(tables)
