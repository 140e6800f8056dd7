"""A new user's first uses, run by tests/test_cli.py in a process of its own after `jitape warmup`: the demo,
then gradients, Jacobians, Hessians, batch Jacobians, replays and optimizer steps in both dtypes. Prints every
jitape kernel signature that missed numba's cache (compiled here, which the warmup should have done), and every
signature the first uses call that the warmup's steps do not compile (whatever the cache holds: a signature
some earlier run compiled would hide a miss from a new user's empty cache)."""
import gc
import tempfile

import numpy as np
from numba.core.registry import CPUDispatcher

import jitape as jt
from jitape import cli
from jitape_kernels import cpu


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
    jt.hessian_vector_product(objective)(x, x)
    jt.jacobian(lambda v: jt.reshape(v, (1, 6)) @ w)(x)
    with jt.GradientTape() as tape:
        tape.watch(batch)
        loss = jt.reduce_sum(jt.tanh(jt.matmul(batch, w)) ** 2, axis=1)
    tape.per_example_gradients(loss, [w])
    with tempfile.TemporaryDirectory() as folder:
        jt.save(f"{folder}/step.npz", step)
        loaded = jt.load(f"{folder}/step.npz")
    loaded(x)
    for optimizer in (jt.optimizers.SGD(0.1, momentum=0.9), jt.optimizers.Adam(0.01)):
        with jt.GradientTape() as tape:
            loss = jt.reduce_sum(jt.matmul(batch, w) ** 2)
        optimizer.apply_gradients([(tape.gradient(loss, w), w)])

        @jt.function
        def train(rows):
            with jt.GradientTape() as tape:
                loss = jt.reduce_sum(jt.nn.relu(jt.matmul(rows, w)) ** 2)
            optimizer.apply_gradients([(tape.gradient(loss, w), w)])
            return loss

        train(batch)
        train(batch)


def jitape_kernels():
    return [d for d in gc.get_objects()
            if isinstance(d, CPUDispatcher) and d.py_func.__module__.startswith("jitape_kernels.")]


print("jitape:", jt.__file__)
for _, step in cpu.warmup_steps():
    step()
warmed = {(d, signature) for d in jitape_kernels() for signature in d.signatures}
cli.main(["demo"])
for dtype in ("float32", "float64"):
    first_uses(dtype)
for dispatcher in jitape_kernels():
    for signature in dispatcher.stats.cache_misses:
        print("missed:", dispatcher.py_func.__module__, dispatcher.py_func.__name__, signature)
    for signature in dispatcher.signatures:
        if (dispatcher, signature) not in warmed:
            print("not warmed:", dispatcher.py_func.__module__, dispatcher.py_func.__name__, signature)
