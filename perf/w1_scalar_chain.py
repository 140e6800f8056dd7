"""W1 scalar chain: x=0.3, y=x, 1,000 times `y = sin(y)*x + 0.5*y` (~4,000
recorded ops); dy/dx — jitape against TensorFlow, PyTorch, JAX, autograd and a
hand-written njit forward+backward.

Run: python perf/w1_scalar_chain.py [--profile]
"""
import math

import harness
import numpy as np

X0 = 0.3
STEPS = 1000


def reference():
    """dy/dx in float64 by a hand-written forward and reverse pass."""
    ys = [X0]
    for _ in range(STEPS):
        ys.append(math.sin(ys[-1]) * X0 + 0.5 * ys[-1])
    ybar, xbar = 1.0, 0.0
    for y in reversed(ys[:-1]):
        xbar += ybar * math.sin(y)
        ybar *= math.cos(y) * X0 + 0.5
    return np.float64(xbar + ybar)


def chain(x, sin):
    y = x
    for _ in range(STEPS):
        y = sin(y) * x + 0.5 * y
    return y


def add_jitape(table, jt):
    x = jt.constant(X0)

    def record_and_gradient():
        with jt.GradientTape() as tape:
            tape.watch(x)
            y = chain(x, jt.sin)
        return tape.gradient(y, x)

    table.add("jitape eager", record_and_gradient, note="record + gradient, float32")


def add_jitape_sweep(table, jt):
    """Gradient alone from a persistent tape (lowering + sweep + unpacking),
    and the compiled reverse sweep over tape.program(y, x) alone through
    jitape's internal executor."""
    from jitape import execute

    x = jt.constant(X0)
    with jt.GradientTape(persistent=True) as tape:
        tape.watch(x)
        y = chain(x, jt.sin)
    program = tape.program(y, x)
    per = ("instruction", len(program))
    table.add("jitape gradient only", lambda: tape.gradient(y, x), per=per,
              note="persistent tape, gradient called repeatedly (its cotangents are kept after the first call)")
    seed = [np.ones((1, 1), program.dtype)]
    table.add("jitape sweep alone (internal)", lambda: execute.reverse(program, seed), per=per,
              note="jitape.execute.reverse(program)",
              answer=lambda adjoint: execute.source_blocks(program, adjoint)[0][0, 0])


def add_jitape_grad(table, jt):
    x = jt.constant(X0)
    grad = jt.grad(lambda x: chain(x, jt.sin))
    table.add("jitape jt.grad (replay)", lambda: grad(x), note="first call = trace")


def add_tensorflow(table, tf):
    x = tf.constant(X0)

    def eager():
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = chain(x, tf.sin)
        return tape.gradient(y, x)

    table.add("TF eager", eager)
    table.add("tf.function", tf.function(eager), note="first call = trace + graph build")


def add_torch(table, torch):
    x = torch.tensor(X0, requires_grad=True)
    table.add("torch eager", lambda: torch.autograd.grad(chain(x, torch.sin), x)[0])
    xf = torch.tensor(X0)
    g = torch.func.grad(lambda x: chain(x, torch.sin))
    table.add("torch.func.grad", lambda: g(xf))


def add_jax(table, jax):
    x = jax.numpy.float32(X0)
    g = jax.grad(lambda x: chain(x, jax.numpy.sin))
    table.add("jax eager (grad, no jit)", lambda: g(x).block_until_ready(), warmup=1)
    jg = jax.jit(g)
    table.add("jax.jit(jax.grad)", lambda: jg(x).block_until_ready(), note="first call = trace + XLA compile")


def add_autograd(table, autograd):
    g = autograd.grad(lambda x: chain(x, autograd.numpy.sin))
    table.add("autograd", lambda: g(X0), note="float64")


def add_njit(table):
    from numba import njit

    @njit(cache=True)
    def forward_backward(x, steps):
        ys = np.empty(steps + 1)
        ys[0] = x
        for i in range(steps):
            ys[i + 1] = math.sin(ys[i]) * x + 0.5 * ys[i]
        ybar, xbar = 1.0, 0.0
        for i in range(steps - 1, -1, -1):
            xbar += ybar * math.sin(ys[i])
            ybar *= math.cos(ys[i]) * x + 0.5
        return xbar + ybar

    table.add("njit hand-written fwd+bwd (limit)", lambda: forward_backward(X0, STEPS), note="float64")


def tables():
    table = harness.Table("W1 scalar chain: dy/dx of 1,000 × `y = sin(y)*x + 0.5*y`",
                          reference(), tol=1e-4)
    harness.add_all(table, [("jitape", add_jitape), ("jitape", add_jitape_sweep),
                            ("jitape", add_jitape_grad), ("tensorflow", add_tensorflow),
                            ("torch", add_torch), ("jax", add_jax), ("autograd", add_autograd),
                            ("njit", add_njit)])
    return [table]


if __name__ == "__main__":
    harness.main(tables)
