"""W4 Hessians: (a) logistic regression n=1000, d=100, float64, mean BCE +
1e-3‖w‖²: gradient + Hessian + Newton step `solve(H + 1e-3 I, g)`; (b) the
seed's x(7,5) → Dense(8, relu) → Dense(6, relu), float32, loss mean(y²),
Hessian w.r.t. the first kernel → (5,8,5,8) — jitape against TensorFlow
(nested tapes + jacobian, eager and tf.function), PyTorch (torch.func,
torch.autograd.functional), JAX (eager and jit), autograd and the numpy
analytic Hessian.

Run: python perf/w4_hessians.py [--profile]
"""
import harness
import numpy as np

N, D = 1000, 100  # W4a
L2, EPS = 1e-3, 1e-3
BATCH, IN, HIDDEN, OUT = 7, 5, 8, 6  # W4b


def data_a():
    """(X, y, w): float64 features, 0/1 labels drawn from a logistic model, and the current point."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((N, D)) / np.sqrt(D)
    w_true = 3.0 * rng.standard_normal(D)
    y = (rng.random(N) < 1.0 / (1.0 + np.exp(-x @ w_true))).astype(np.float64)
    w = rng.standard_normal(D)
    return x, y, w


def data_b():
    """(x, k1, b1, k2, b2), float32, Glorot-scaled kernels and small biases."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((BATCH, IN)).astype(np.float32)
    k1 = (rng.standard_normal((IN, HIDDEN)) * np.sqrt(2.0 / (IN + HIDDEN))).astype(np.float32)
    b1 = (0.1 * rng.standard_normal(HIDDEN)).astype(np.float32)
    k2 = (rng.standard_normal((HIDDEN, OUT)) * np.sqrt(2.0 / (HIDDEN + OUT))).astype(np.float32)
    b2 = (0.1 * rng.standard_normal(OUT)).astype(np.float32)
    return x, k1, b1, k2, b2


# ---------------------------------------------------------------- the functions, once for every library

def logistic_loss(x, y, w, softplus, mean, total, matvec=lambda a, v: a @ v):
    """mean binary cross-entropy of sigmoid(x w) against y (written on the logits) + 1e-3 ‖w‖²."""
    z = matvec(x, w)
    return mean(softplus(z) - y * z) + L2 * total(w * w)


def two_dense(x, k1, b1, k2, b2, relu, mean):
    y = relu(relu(x @ k1 + b1) @ k2 + b2)
    return mean(y * y)


# ---------------------------------------------------------------- numpy analytic (also the references)

def numpy_a(x, y, w):
    """[g, H, Newton step]: X^T (p - y) / n + 2e-3 w, X^T diag(p(1-p)) X / n + 2e-3 I, solve(H + 1e-3 I, g)."""
    p = 1.0 / (1.0 + np.exp(-(x @ w)))
    g = x.T @ (p - y) / N + 2 * L2 * w
    h = (x.T * (p * (1 - p) / N)) @ x
    h[np.diag_indices(D)] += 2 * L2
    step = np.linalg.solve(h + EPS * np.eye(D), g)
    return [g, h, step]


def numpy_b(x, k1, b1, k2, b2):
    """H[c,i,a,j] = 2/(B·OUT) Σ_n x[n,c] m1[n,i] x[n,a] m1[n,j] Σ_o k2[i,o] m2[n,o] k2[j,o] (relu'' = 0)."""
    h1 = np.maximum(x @ k1 + b1, 0)
    m1 = (h1 > 0).astype(x.dtype)
    m2 = (h1 @ k2 + b2 > 0).astype(x.dtype)
    inner = np.einsum("io,no,jo->nij", k2, m2, k2)
    u = x[:, :, None] * m1[:, None, :]
    return 2.0 / (BATCH * OUT) * np.einsum("nci,nij,naj->ciaj", u, inner, u)


# ---------------------------------------------------------------- W4a logistic regression: g + H + Newton step

def jitape_a(table, jt):
    x, y, w0 = data_a()
    x, y, w = jt.constant(x), jt.constant(y), jt.Variable(w0)
    shift = jt.constant(EPS * np.eye(D))

    def loss():
        return logistic_loss(x, y, w, jt.nn.softplus, jt.reduce_mean, jt.reduce_sum)

    def derivatives(tape, value):
        g = tape.gradient(value, w)
        h = tape.hessian(value, w)
        step = jt.linalg.solve(h + shift, jt.reshape(g, (D, 1)))
        return [g, h, jt.reshape(step, (D,))]

    def newton():
        with jt.GradientTape(persistent=True) as tape:
            value = loss()
        return derivatives(tape, value)

    table.add("jitape eager", newton, note="one persistent tape: gradient + hessian + jt.linalg.solve")
    with jt.GradientTape(persistent=True) as tape:
        value = loss()
    table.add("jitape without recording", lambda: derivatives(tape, value),
              note="the same from one recorded tape, called repeatedly")
    if hasattr(jt, "hessian") and hasattr(jt, "grad"):
        def f(w):
            return logistic_loss(x, y, w, jt.nn.softplus, jt.reduce_mean, jt.reduce_sum)

        grad, hess = jt.grad(f), jt.hessian(f)

        def compiled():
            g, h = grad(w), hess(w)
            return [g, h, jt.reshape(jt.linalg.solve(h + shift, jt.reshape(g, (D, 1))), (D,))]

        table.add("jitape jt.grad + jt.hessian", compiled, note="first call = trace")
        table.add("jitape jt.function(jt.grad + jt.hessian + solve)", jt.function(compiled),
                  note="as jax.jit(newton): f's rows shared, the Hessian a host step; first call = trace")
    else:
        table.skip("jitape jt.grad + jt.hessian", "jt.hessian missing")
    table.add("jitape jt.function(newton)", jt.function(newton),
              note="the eager step in one replay (the Hessian a host step), as tf.function(newton); first call = trace")


def tensorflow_a(table, tf):
    x, y, w0 = data_a()
    x, y, w = tf.constant(x), tf.constant(y), tf.Variable(w0)
    shift = tf.constant(EPS * np.eye(D))

    def newton():
        with tf.GradientTape() as outer:
            with tf.GradientTape() as inner:
                value = logistic_loss(x, y, w, tf.nn.softplus, tf.reduce_mean, tf.reduce_sum, tf.linalg.matvec)
            g = inner.gradient(value, w)
        h = outer.jacobian(g, w)
        step = tf.linalg.solve(h + shift, g[:, None])[:, 0]
        return [g, h, step]

    table.add("TF eager", newton, note="nested tapes, outer jacobian (pfor)")
    table.add("tf.function", tf.function(newton), note="first call = trace")


def torch_a(table, torch):
    x, y, w = (torch.from_numpy(a) for a in data_a())
    shift = torch.from_numpy(EPS * np.eye(D))

    def f(w):
        return logistic_loss(x, y, w, torch.nn.functional.softplus, torch.mean, torch.sum)

    grad, hess = torch.func.grad(f), torch.func.hessian(f)

    def func_rows():
        g, h = grad(w), hess(w)
        return [g, h, torch.linalg.solve(h + shift, g)]

    table.add("torch.func (grad + hessian)", func_rows, note="hessian = jacfwd(jacrev)")

    def functional():
        wg = w.detach().requires_grad_()
        (g,) = torch.autograd.grad(f(wg), wg)
        h = torch.autograd.functional.hessian(f, w, vectorize=True)
        return [g, h, torch.linalg.solve(h + shift, g)]

    table.add("torch.autograd (grad + functional.hessian)", functional, note="vectorize=True")


def jax_a(table, jax):
    jnp = jax.numpy
    with jax.enable_x64(True):
        x, y, w = (jnp.asarray(a) for a in data_a())
        shift = jnp.asarray(EPS * np.eye(D))

    def f(w):
        return logistic_loss(x, y, w, jax.nn.softplus, jnp.mean, jnp.sum)

    def newton(w):
        g, h = jax.grad(f)(w), jax.hessian(f)(w)
        return [g, h, jnp.linalg.solve(h + shift, g)]

    jitted = jax.jit(newton)

    def run(fn):
        with jax.enable_x64(True):  # float64 for these rows only
            return jax.block_until_ready(fn(w))

    table.add("jax eager (grad + hessian, no jit)", lambda: run(newton))
    table.add("jax.jit(grad + hessian + solve)", lambda: run(jitted), note="first call = compile")


def autograd_a(table, autograd):
    x, y, w = data_a()
    anp = autograd.numpy

    def f(w):
        return logistic_loss(x, y, w, lambda z: anp.logaddexp(0.0, z), anp.mean, anp.sum)

    grad, hess = autograd.grad(f), autograd.hessian(f)

    def newton():
        g, h = grad(w), hess(w)
        return [g, h, np.linalg.solve(h + EPS * np.eye(D), g)]

    table.add("autograd", newton)


def numpy_rows_a(table):
    x, y, w = data_a()
    table.add("numpy analytic (limit)", lambda: numpy_a(x, y, w))


# ---------------------------------------------------------------- W4b seed Dense-Dense Hessian, first kernel

def jitape_b(table, jt):
    x, k1, b1, k2, b2 = data_b()
    x = jt.constant(x)
    k1, b1, k2, b2 = (jt.Variable(a) for a in (k1, b1, k2, b2))

    def hessian():
        with jt.GradientTape() as tape:
            loss = two_dense(x, k1, b1, k2, b2, jt.nn.relu, jt.reduce_mean)
        return tape.hessian(loss, k1)

    table.add("jitape eager", hessian, note="record + tape.hessian")
    with jt.GradientTape(persistent=True) as tape:
        loss = two_dense(x, k1, b1, k2, b2, jt.nn.relu, jt.reduce_mean)
    table.add("jitape hessian only", lambda: tape.hessian(loss, k1),
              note="persistent tape, hessian called repeatedly")

    def nested():
        with jt.GradientTape() as outer:
            with jt.GradientTape() as inner:
                loss = two_dense(x, k1, b1, k2, b2, jt.nn.relu, jt.reduce_mean)
            g = inner.gradient(loss, k1)
        return outer.jacobian(g, k1)

    table.add("jitape eager, nested tapes", nested, note="the seed's code: inner gradient, outer jacobian")


def tensorflow_b(table, tf):
    x, k1, b1, k2, b2 = data_b()
    x = tf.constant(x)
    k1, b1, k2, b2 = (tf.Variable(a) for a in (k1, b1, k2, b2))

    def hessian():
        with tf.GradientTape() as outer:
            with tf.GradientTape() as inner:
                loss = two_dense(x, k1, b1, k2, b2, tf.nn.relu, tf.reduce_mean)
            g = inner.gradient(loss, k1)
        return outer.jacobian(g, k1)

    table.add("TF eager", hessian, note="nested tapes, outer jacobian (pfor)")
    table.add("tf.function", tf.function(hessian), note="first call = trace")


def torch_b(table, torch):
    x, k1, b1, k2, b2 = (torch.from_numpy(a) for a in data_b())

    def f(k1):
        return two_dense(x, k1, b1, k2, b2, torch.relu, torch.mean)

    hess = torch.func.hessian(f)
    table.add("torch.func.hessian", lambda: hess(k1))
    table.add("torch.autograd.functional.hessian", lambda: torch.autograd.functional.hessian(f, k1),
              note="vectorize=False")


def jax_b(table, jax):
    x, k1, b1, k2, b2 = (jax.numpy.asarray(a) for a in data_b())
    hess = jax.hessian(lambda k1: two_dense(x, k1, b1, k2, b2, jax.nn.relu, jax.numpy.mean))
    jhess = jax.jit(hess)
    table.add("jax eager (hessian, no jit)", lambda: hess(k1).block_until_ready())
    table.add("jax.jit(jax.hessian)", lambda: jhess(k1).block_until_ready(), note="first call = compile")


def autograd_b(table, autograd):
    x, k1, b1, k2, b2 = data_b()
    anp = autograd.numpy
    hess = autograd.hessian(lambda k1: two_dense(x, k1, b1, k2, b2, lambda z: anp.maximum(z, 0), anp.mean))
    table.add("autograd", lambda: hess(k1))


def numpy_rows_b(table):
    x, k1, b1, k2, b2 = data_b()
    table.add("numpy analytic (limit)", lambda: numpy_b(x, k1, b1, k2, b2))


def tables():
    a = harness.Table("W4a logistic regression n=1000, d=100, float64: gradient + Hessian + Newton step",
                      numpy_a(*data_a()), tol=1e-6)
    b = harness.Table("W4b seed Dense(8, relu) → Dense(6, relu), mean(y²): Hessian w.r.t. the first kernel "
                      "→ (5,8,5,8), float32", numpy_b(*(v.astype(np.float64) for v in data_b())), tol=1e-4)
    libraries = ["jitape", "tensorflow", "torch", "jax", "autograd", "numpy"]
    harness.add_all(a, list(zip(libraries, [jitape_a, tensorflow_a, torch_a, jax_a, autograd_a, numpy_rows_a])))
    harness.add_all(b, list(zip(libraries, [jitape_b, tensorflow_b, torch_b, jax_b, autograd_b, numpy_rows_b])))
    return [a, b]


if __name__ == "__main__":
    harness.main(tables)
