"""W7 logsumexp gradient: d logsumexp(x) / dx (= softmax(x)), float64, for
n = 2,500, 40,000 and 640,000 — jitape eager, its forward alone and `jt.grad`
replay against TensorFlow, PyTorch, JAX, autograd and hand-written numpy, plus
each one's gradient/forward cost ratio.

One gradient table and one forward table per n; every row is checked against
numpy's softmax (gradient) and numpy's shifted logsumexp (forward).

Run: python perf/w7_logsumexp.py [--profile]
"""
import harness
import numpy as np

SIZES = (2_500, 40_000, 640_000)


def data(n):
    """x: float64, standard normal scaled by 3 (so the maximum shift matters)."""
    return 3.0 * np.random.default_rng(7).standard_normal(n)


def numpy_forward(x):
    peak = np.max(x)
    return np.log(np.sum(np.exp(x - peak))) + peak


def numpy_gradient(x):
    """Hand-written forward + backward: softmax(x)."""
    e = np.exp(x - np.max(x))
    return e / np.sum(e)


def _repeat(n):
    """Fewer samples for the largest size (2-core VM shared with others)."""
    return 7 if n >= 640_000 else None


def _tape_gradient(lib, x):
    """The eager gradient of lib.reduce_logsumexp(x) on a GradientTape (jitape and TensorFlow spell it alike)."""
    def gradient():
        with lib.GradientTape() as tape:
            tape.watch(x)
            y = lib.reduce_logsumexp(x)
        return tape.gradient(y, x)
    return gradient


def add_jitape(grad, fwd, n, jt):
    x = jt.constant(data(n))
    grad.add("jitape eager", _tape_gradient(jt, x), note="record + gradient", repeat=_repeat(n))
    with jt.GradientTape(persistent=True) as tape:
        tape.watch(x)
        y = jt.reduce_logsumexp(x)
    grad.add("jitape gradient only", lambda: tape.gradient(y, x),
             note="persistent tape, gradient called repeatedly (cotangents kept)", repeat=_repeat(n))
    grad.add("jitape jt.grad (replay)", lambda g=jt.grad(lambda v: jt.reduce_logsumexp(v)): g(x),
             note="first call = trace; then replays", repeat=_repeat(n))
    fwd.add("jitape eager", lambda: jt.reduce_logsumexp(x), note="no tape", repeat=_repeat(n))
    forward = jt.function(lambda v: jt.reduce_logsumexp(v))  # x as an argument: a closed-over constant folds
    fwd.add("jitape jt.function(forward)", lambda: forward(x),
            note="first call = trace; then replays", repeat=_repeat(n))


def add_tensorflow(grad, fwd, n, tf):
    x = tf.constant(data(n))
    harness.add_tensorflow_rows(grad, fwd, tf, _tape_gradient(tf, x), lambda: tf.reduce_logsumexp(x),
                                repeat=_repeat(n))


def add_torch(grad, fwd, n, torch):
    x = torch.from_numpy(data(n)).requires_grad_()

    grad.add("torch eager", lambda: torch.autograd.grad(torch.logsumexp(x, 0), x), repeat=_repeat(n))

    def forward():
        with torch.no_grad():
            return torch.logsumexp(x, 0)

    fwd.add("torch eager", forward, note="no_grad", repeat=_repeat(n))


def add_jax(grad, fwd, n, jax):
    from jax.scipy.special import logsumexp
    with jax.enable_x64(True):
        x = jax.numpy.asarray(data(n))
    g, jg, jl = jax.grad(logsumexp), jax.jit(jax.grad(logsumexp)), jax.jit(logsumexp)

    def run(fn):
        with jax.enable_x64(True):  # float64 for these rows only
            return jax.block_until_ready(fn(x))

    grad.add("jax eager (grad, no jit)", lambda: run(g), repeat=_repeat(n))
    grad.add("jax.jit(jax.grad)", lambda: run(jg), note="first call = compile", repeat=_repeat(n))
    fwd.add("jax eager", lambda: run(logsumexp), repeat=_repeat(n))
    fwd.add("jax.jit", lambda: run(jl), note="first call = compile", repeat=_repeat(n))


def add_autograd(grad, fwd, n, autograd):
    from autograd.scipy.special import logsumexp
    x = data(n)
    g = autograd.grad(logsumexp)
    grad.add("autograd", lambda: g(x), repeat=_repeat(n))


def add_numpy(grad, fwd, n):
    x = data(n)
    grad.add("numpy hand-written fwd+bwd (limit)", lambda: numpy_gradient(x), repeat=_repeat(n))
    fwd.add("numpy (limit)", lambda: numpy_forward(x), repeat=_repeat(n))


def tables():
    out = []
    for n in SIZES:
        x = data(n)
        grad = harness.Table(f"W7 logsumexp gradient, n={n:,}, float64", numpy_gradient(x), tol=1e-10)
        fwd = harness.Table(f"W7 logsumexp forward alone, n={n:,}", numpy_forward(x), tol=1e-12)
        groups = [("jitape", add_jitape), ("tensorflow", add_tensorflow), ("torch", add_torch),
                  ("jax", add_jax), ("autograd", add_autograd), ("numpy", add_numpy)]
        harness.add_all(grad, groups, extra=(fwd, n))
        grad.note_costs(fwd, harness.GRADIENT_COST_ROWS)
        out += [grad, fwd]
    return out


if __name__ == "__main__":
    harness.main(tables)
