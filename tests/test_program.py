"""Random programs: chains of mixed ops over shared inputs, differentiated by the compiled sweep, by the
recorded Python VJPs and by central differences (float64). Integration bugs that per-op tests miss
(pruning, slot sharing, multi-row concat, broadcasting, tensors read many times) show up here."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import jitape as jt

STEPS = st.lists(st.tuples(st.integers(0, 11), st.integers(0, 10**6)), min_size=1, max_size=12)


def _apply(step, seed, pool):
    """One op on tensors of the pool (all of shape (3, 4) or (4,) or ()); returns a tensor of shape (3, 4)."""
    rng = np.random.default_rng(seed)
    a = pool[rng.integers(len(pool))]
    b = pool[rng.integers(len(pool))]
    c = float(rng.uniform(0.5, 1.5))
    if step == 0:
        return jt.sin(a) * b
    if step == 1:
        return a + b * c
    if step == 2:
        return jt.tanh(a - b)
    if step == 3:
        return a * jt.reduce_mean(b, axis=1, keepdims=True)
    if step == 4:
        return jt.reshape(jt.transpose(a * b, (1, 0)), (3, 4))
    if step == 5:
        return jt.concat([a[:, :2], jt.exp(-jt.square(b[:, 2:]))], axis=1)
    if step == 6:
        return jt.matmul(a, jt.transpose(b)) @ jt.ones((3, 4), dtype="float64") * 0.1
    if step == 7:
        return jt.where(a > 0, a * b, b)
    if step == 8:
        return jt.nn.softplus(a) * jt.reduce_max(b, axis=0)
    if step == 9:
        return jt.stack([a[0], b[1], a[2] * b[2]])
    if step == 10:
        return a / (1.0 + jt.square(b))
    return jt.nn.sigmoid(a) + jt.gather(b, [2, 0, 1], axis=0)


def _program(values, steps, ct):
    inputs = [jt.constant(v) for v in values]
    pool = list(inputs)
    for step, seed in steps:
        pool.append(_apply(step, seed, pool))
    return inputs, jt.reduce_sum(pool[-1] * ct)


@settings(max_examples=40, deadline=None)
@given(STEPS, st.integers(0, 10**6))
def test_random_programs_agree_on_both_paths_and_with_finite_differences(steps, seed):
    rng = np.random.default_rng(seed)
    values = [rng.uniform(-1.5, 1.5, (3, 4)) for _ in range(3)]
    ct = rng.uniform(0.5, 1.5, (3, 4))
    inputs = [jt.constant(v) for v in values]
    with jt.GradientTape(persistent=True) as tape:
        tape.watch(inputs)
        pool = list(inputs)
        for step, s in steps:
            pool.append(_apply(step, s, pool))
        loss = jt.reduce_sum(pool[-1] * ct)
    compiled = tape.gradient(loss, inputs, unconnected_gradients="zero")
    with jt.GradientTape() as enclosing:      # watching the inputs selects the recorded path
        enclosing.watch(inputs)
        recorded = tape.gradient(loss, inputs, unconnected_gradients="zero")
    h = 1e-6
    for k, v in enumerate(values):
        numeric = np.zeros_like(v)
        for idx in np.ndindex(v.shape):
            shifted = []
            for sign in (1, -1):
                vs = [x.copy() for x in values]
                vs[k][idx] += sign * h
                shifted.append(float(_program(vs, steps, ct)[1]))
            numeric[idx] = (shifted[0] - shifted[1]) / (2 * h)
        np.testing.assert_allclose(compiled[k].numpy(), recorded[k].numpy(), rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(compiled[k].numpy(), numeric, rtol=1e-5, atol=1e-6)
