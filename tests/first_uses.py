"""A new user's first uses, run by tests/test_cli.py in a process of its own after `jitape warmup`: the demo,
then gradients, Jacobians, Hessians, batch Jacobians, replays and optimizer steps in both dtypes. Prints every
jitape kernel signature that missed numba's cache (compiled here, which the warmup should have done)."""
import gc

import numpy as np
from numba.core.registry import CPUDispatcher

import jitape as jt
from jitape import cli


def objective(v):
    return jt.reduce_sum(jt.sin(v) * v) + jt.reduce_sum(v * v)


def first_uses(dtype):
    x = jt.constant(np.linspace(0.1, 1.0, 6).astype(dtype))
    jt.grad(objective)(x)
    jt.value_and_grad(objective)(x)
    jt.hessian(objective)(x)
    jt.jacobian(lambda v: jt.tanh(v) * 2.0)(x)
    w = jt.Variable(np.ones((6, 3), dtype))
    with jt.GradientTape(persistent=True) as tape:
        tape.watch(x)
        y = jt.matmul(jt.reshape(x, (1, 6)), w)
        z = jt.reduce_sum(y * y)
    tape.gradient(z, [x, w])
    tape.jacobian(y, w)
    batch = jt.constant(np.ones((4, 6), dtype))
    with jt.GradientTape() as tape:
        tape.watch(batch)
        rows = jt.tanh(jt.matmul(batch, w))
    tape.batch_jacobian(rows, batch)
    step = jt.function(lambda v: jt.reduce_sum(jt.exp(v) - v))
    step(x)
    step(x)
    for optimizer in (jt.optimizers.SGD(0.1, momentum=0.9), jt.optimizers.Adam(0.01)):
        with jt.GradientTape() as tape:
            loss = jt.reduce_sum(jt.matmul(batch, w) ** 2)
        optimizer.apply_gradients([(tape.gradient(loss, w), w)])


print("jitape:", jt.__file__)
cli.main(["demo"])
for dtype in ("float32", "float64"):
    first_uses(dtype)
for dispatcher in gc.get_objects():
    if isinstance(dispatcher, CPUDispatcher) and dispatcher.py_func.__module__.startswith("jitape"):
        for signature in dispatcher.stats.cache_misses:
            print("missed:", dispatcher.py_func.__module__, dispatcher.py_func.__name__, signature)
