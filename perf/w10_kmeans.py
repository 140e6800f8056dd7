"""W10 k-means Newton direction (GradBench's `kmeans`): the cost
sum_i min_j ||x_i - c_j||^2 with k=100 centers, n=10,000 points, d=16,
float64; one timed call computes the gradient w.r.t. the centers AND the
Hessian-vector product with a vector of ones (the Newton direction is then
g / Hv elementwise, as the Hessian is block-diagonal with 2·count_j·I blocks).

The squared distances are expanded, ||x||² - 2 x·cᵀ + ||c||² (one (n,d)×(d,k)
matmul), the same formulation in every library. Rows: jitape eager (a
persistent tape, then `gradient` and `hessian_vector_product` on it), the
forward alone, `jt.grad` + `jt.hessian_vector_product` replays, and the eager
pair as one `jt.function` (one replay sharing the forward, as jax.jit of the
pair); TensorFlow nested tapes (outer `gradient` of the inner gradient with
output_gradients=v); PyTorch double backward; JAX `jax.grad` + `jax.jvp` of it
(forward over reverse); autograd `hessian_vector_product`; the numpy analytic
result as the limit. Every row is checked against the numpy analytic gradient
and Hv.

Run: python perf/w10_kmeans.py [--profile]
"""
import harness
import numpy as np

N, K, D = 10_000, 100, 16


def data():
    """(x, c): points and initial centers (the first K points, as GradBench's
    generator picks centers among the data, slightly perturbed so no distance is 0)."""
    rng = np.random.default_rng(10)
    x = rng.standard_normal((N, D))
    c = x[:K] + 0.01 * rng.standard_normal((K, D))
    return x, c


def cost(x, c, matmul_t, sum_, min_):
    """sum_i min_j ||x_i - c_j||², written once for every library; matmul_t(x, c) = x cᵀ."""
    xx = sum_(x * x, 1)[:, None]
    cc = sum_(c * c, 1)[None, :]
    dist = xx - 2.0 * matmul_t(x, c) + cc
    return sum_(min_(dist, 1))


def _matmul_t(a, b):
    return a @ b.T


def numpy_forward(x, c):
    return cost(x, c, _matmul_t, np.sum, np.min)


def numpy_analytic(x, c):
    """Gradient 2·sum_{i→j}(c_j - x_i) and Hv with v = ones: 2·count_j (per coordinate)."""
    dist = np.sum(x * x, 1)[:, None] - 2.0 * (x @ c.T) + np.sum(c * c, 1)[None, :]
    nearest = np.argmin(dist, 1)
    counts = np.bincount(nearest, minlength=K).astype(np.float64)
    sums = np.stack([np.bincount(nearest, x[:, j], K) for j in range(D)], 1)
    g = 2.0 * (counts[:, None] * c - sums)
    hv = 2.0 * counts[:, None] * np.ones_like(c)
    return [g, hv]


def add_jitape(table, fwd, jt):
    x, c0 = data()
    x, c = jt.constant(x), jt.constant(c0)
    v = jt.constant(np.ones((K, D)))

    def f(c, x):
        return cost(x, c, lambda a, b: jt.matmul(a, b, transpose_b=True), jt.reduce_sum, jt.reduce_min)

    def pair(c, x):
        with jt.GradientTape(persistent=True) as tape:
            tape.watch(c)
            y = f(c, x)
        return [tape.gradient(y, c), tape.hessian_vector_product(y, c, v)]

    table.add("jitape eager", lambda: pair(c, x), note="persistent tape: record, gradient, hessian_vector_product")
    with jt.GradientTape(persistent=True) as tape:
        tape.watch(c)
        y = f(c, x)
    table.add("jitape gradient + hvp only", lambda: [tape.gradient(y, c), tape.hessian_vector_product(y, c, v)],
              note="one persistent tape, both called repeatedly (no recording; cotangents kept after the first call)")
    grad, hvp = jt.grad(f), jt.hessian_vector_product(f)
    table.add("jitape jt.grad + jt.hessian_vector_product (replay)", lambda: [grad(c, x), hvp(v, c, x)],
              note="first call = traces; then replays")
    replayed_pair = jt.function(pair)
    table.add("jitape jt.function(eager's gradient + hvp)", lambda: replayed_pair(c, x),
              note="as jax.jit(grad + jvp(grad)): one replay, the forward shared; first call = trace")
    fwd.add("jitape eager", lambda: f(c, x), note="no tape")
    forward = jt.function(f)  # c and x as arguments: a closed-over constant would fold
    fwd.add("jitape jt.function(forward)", lambda: forward(c, x), note="first call = trace; then replays")


def add_tensorflow(table, fwd, tf):
    x, c0 = data()
    x, c = tf.constant(x), tf.constant(c0)
    v = tf.ones((K, D), tf.float64)

    def f(c):
        return cost(x, c, lambda a, b: tf.matmul(a, b, transpose_b=True), tf.reduce_sum, tf.reduce_min)

    def pair():
        with tf.GradientTape() as outer:
            outer.watch(c)
            with tf.GradientTape() as inner:
                inner.watch(c)
                y = f(c)
            g = inner.gradient(y, c)
        return [g, outer.gradient(g, c, output_gradients=v)]

    table.add("TF eager (nested tapes)", pair)
    table.add("tf.function (nested tapes)", tf.function(pair), note="first call = trace")
    fwd.add("TF eager", lambda: f(c))
    fwd.add("tf.function", tf.function(lambda: f(c)), note="first call = trace")


def add_torch(table, fwd, torch):
    x, c0 = data()
    x = torch.from_numpy(x)
    c = torch.from_numpy(c0).requires_grad_()
    v = torch.ones((K, D), dtype=torch.float64)

    def f(c):
        return cost(x, c, lambda a, b: a @ b.T, torch.sum, lambda a, axis: torch.min(a, axis).values)

    def pair():
        (g,) = torch.autograd.grad(f(c), c, create_graph=True)
        (hv,) = torch.autograd.grad(g, c, grad_outputs=v)
        return [g, hv]

    table.add("torch eager (double backward)", pair)

    def forward():
        with torch.no_grad():
            return f(c)

    fwd.add("torch eager", forward, note="no_grad")


def add_jax(table, fwd, jax):
    jnp = jax.numpy
    with jax.enable_x64(True):
        x, c0 = (jnp.asarray(a) for a in data())
        v = jnp.ones((K, D))

    def f(c):
        return cost(x, c, lambda a, b: a @ b.T, jnp.sum, jnp.min)

    def pair(c):
        g = jax.grad(f)
        return [g(c), jax.jvp(g, (c,), (v,))[1]]

    jitted, jf = jax.jit(pair), jax.jit(f)

    def run(fn):
        with jax.enable_x64(True):  # float64 for these rows only
            return jax.block_until_ready(fn(c0))

    table.add("jax eager (grad + jvp(grad), no jit)", lambda: run(pair))
    table.add("jax.jit(grad + jvp(grad))", lambda: run(jitted), note="first call = compile")
    fwd.add("jax eager", lambda: run(f))
    fwd.add("jax.jit", lambda: run(jf), note="first call = compile")


def add_autograd(table, fwd, autograd):
    x, c = data()
    anp = autograd.numpy
    v = np.ones((K, D))

    def f(c):
        return cost(x, c, lambda a, b: a @ b.T, anp.sum, anp.min)

    g, hvp = autograd.grad(f), autograd.hessian_vector_product(f)
    table.add("autograd (grad + hessian_vector_product)", lambda: [g(c), hvp(c, v)])


def add_numpy(table, fwd):
    x, c = data()
    table.add("numpy analytic (limit)", lambda: numpy_analytic(x, c))
    fwd.add("numpy (limit)", lambda: numpy_forward(x, c))


def tables():
    x, c = data()
    table = harness.Table(f"W10 k-means: gradient + Hessian-vector product (v = ones) w.r.t. the centers, "
                          f"n={N:,}, k={K}, d={D}, float64", numpy_analytic(x, c), tol=1e-9)
    fwd = harness.Table("W10 k-means cost alone (forward)", numpy_forward(x, c), tol=1e-10)
    groups = [("jitape", add_jitape), ("tensorflow", add_tensorflow), ("torch", add_torch),
              ("jax", add_jax), ("autograd", add_autograd), ("numpy", add_numpy)]
    harness.add_all(table, groups, extra=(fwd,))
    table.note_costs(fwd, [("jitape eager", "jitape eager"), ("TF eager (nested tapes)", "TF eager"),
                           ("torch eager (double backward)", "torch eager"),
                           ("jax.jit(grad + jvp(grad))", "jax.jit"), ("numpy analytic (limit)", "numpy (limit)")],
                     what="(gradient + Hv)")
    return [table, fwd]


if __name__ == "__main__":
    harness.main(tables)
