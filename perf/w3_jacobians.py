"""W3 Jacobians, float32: (a) `sigmoid(linspace(-10,10,201) + delta)` w.r.t.
the scalar delta → (201,); (b) `Dense(10, relu)` on x (7,5) w.r.t. the kernel
→ (7,10,5,10); (c) `W3 tanh(W2 tanh(W1 x))`, 100×100 matrices, x (100,), w.r.t.
x → (100,100) — jitape against TensorFlow (tape.jacobian with and without
pfor, tf.function), PyTorch (torch.autograd.functional.jacobian,
torch.func.jacrev), JAX (jacrev eager and jit), autograd and the numpy
analytic Jacobian.

Run: python perf/w3_jacobians.py [--profile]
"""
import harness
import numpy as np

POINTS = 201
BATCH, IN, UNITS = 7, 5, 10  # W3b
WIDTH = 100  # W3c


def data_a():
    return np.linspace(-10.0, 10.0, POINTS).astype(np.float32), np.float32(0.0)


def data_b():
    """(x, kernel, bias), float32, drawn so that about half the relus are active."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((BATCH, IN)).astype(np.float32)
    kernel = (rng.standard_normal((IN, UNITS)) * np.sqrt(2.0 / (IN + UNITS))).astype(np.float32)
    bias = (0.1 * rng.standard_normal(UNITS)).astype(np.float32)
    return x, kernel, bias


def data_c():
    """(x, [W1, W2, W3]), float32, scaled so that the tanh layers are not saturated."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal(WIDTH).astype(np.float32)
    ws = [(rng.standard_normal((WIDTH, WIDTH)) / np.sqrt(WIDTH)).astype(np.float32) for _ in range(3)]
    return x, ws


# ---------------------------------------------------------------- the functions, once for every library

def sigmoid_shift(x, delta, sigmoid):
    return sigmoid(x + delta)


def dense(x, kernel, bias, relu):
    return relu(x @ kernel + bias)


def tanh_mlp(x, ws, tanh, matvec=lambda w, v: w @ v):
    return matvec(ws[2], tanh(matvec(ws[1], tanh(matvec(ws[0], x)))))


# ---------------------------------------------------------------- numpy analytic Jacobians (the references)

def numpy_a(x, delta):
    s = 1.0 / (1.0 + np.exp(-(x + delta)))
    return s * (1.0 - s)


def numpy_b(x, kernel, bias):
    """J[n, o, i, j] = x[n, i] relu'(z[n, o]) δ(o, j)."""
    active = (x @ kernel + bias > 0).astype(x.dtype)
    jac = np.zeros((BATCH, UNITS, IN, UNITS), x.dtype)
    o = np.arange(UNITS)
    jac[:, o, :, o] = (active.T[:, :, None] * x[None, :, :])
    return jac


def numpy_c(x, ws):
    """W3 diag(1 - h2²) W2 diag(1 - h1²) W1."""
    h1 = np.tanh(ws[0] @ x)
    h2 = np.tanh(ws[1] @ h1)
    return (ws[2] * (1 - h2 * h2)) @ ((ws[1] * (1 - h1 * h1)) @ ws[0])


# ---------------------------------------------------------------- W3a sigmoid, scalar source

def jitape_a(table, jt):
    x, d = data_a()
    x, delta = jt.constant(x), jt.Variable(d)

    def jacobian():
        with jt.GradientTape() as tape:
            y = sigmoid_shift(x, delta, jt.nn.sigmoid)
        return tape.jacobian(y, delta)

    table.add("jitape eager", jacobian, note="record + tape.jacobian")
    with jt.GradientTape(persistent=True) as tape:
        y = sigmoid_shift(x, delta, jt.nn.sigmoid)
    table.add("jitape jacobian only", lambda: tape.jacobian(y, delta),
              note="persistent tape, jacobian called repeatedly (lowering + sweep)")


def _add_tensorflow_rows(table, tf, jacobian):
    """TensorFlow's three ways to run `jacobian(use_pfor)`: eager with and without pfor, tf.function."""
    table.add("TF eager", jacobian, note="tape.jacobian, pfor")
    table.add("TF eager, no pfor", lambda: jacobian(False),
              note="experimental_use_pfor=False (needs a persistent tape)")
    table.add("tf.function", tf.function(jacobian), note="pfor; first call = trace")


def tensorflow_a(table, tf):
    x, d = data_a()
    x, delta = tf.constant(x), tf.Variable(d)

    def jacobian(use_pfor=True):
        with tf.GradientTape(persistent=not use_pfor) as tape:  # eager without pfor requires persistent
            y = sigmoid_shift(x, delta, tf.nn.sigmoid)
        return tape.jacobian(y, delta, experimental_use_pfor=use_pfor)

    _add_tensorflow_rows(table, tf, jacobian)


def torch_a(table, torch):
    x, d = data_a()
    x, delta = torch.from_numpy(x), torch.tensor(d)

    def f(delta):
        return sigmoid_shift(x, delta, torch.sigmoid)

    table.add("torch.autograd.functional.jacobian", lambda: torch.autograd.functional.jacobian(f, delta))
    jac = torch.func.jacrev(f)
    table.add("torch.func.jacrev", lambda: jac(delta))


def jax_a(table, jax):
    x, d = data_a()
    x, delta = jax.numpy.asarray(x), jax.numpy.float32(d)
    jac = jax.jacrev(lambda delta: sigmoid_shift(x, delta, jax.nn.sigmoid))
    jjac = jax.jit(jac)
    table.add("jax eager (jacrev, no jit)", lambda: jac(delta).block_until_ready())
    table.add("jax.jit(jax.jacrev)", lambda: jjac(delta).block_until_ready(), note="first call = compile")


def autograd_a(table, autograd):
    x, d = data_a()
    jac = autograd.jacobian(lambda delta: sigmoid_shift(x, delta, lambda z: 1 / (1 + autograd.numpy.exp(-z))))
    table.add("autograd", lambda: jac(d))


def numpy_rows_a(table):
    x, d = data_a()
    table.add("numpy analytic (limit)", lambda: numpy_a(x, d))


# ---------------------------------------------------------------- W3b Dense(10, relu), w.r.t. the kernel

def jitape_b(table, jt):
    x, k0, b0 = data_b()
    x, kernel, bias = jt.constant(x), jt.Variable(k0), jt.Variable(b0)

    def jacobian():
        with jt.GradientTape() as tape:
            y = dense(x, kernel, bias, jt.nn.relu)
        return tape.jacobian(y, kernel)

    table.add("jitape eager", jacobian, note="record + tape.jacobian")
    with jt.GradientTape(persistent=True) as tape:
        y = dense(x, kernel, bias, jt.nn.relu)
    table.add("jitape jacobian only", lambda: tape.jacobian(y, kernel),
              note="persistent tape, jacobian called repeatedly (lowering + sweep)")

    layer = jt.layers.Dense(UNITS, activation="relu", kernel_initializer=lambda shape, dtype: k0,
                            bias_initializer=lambda shape, dtype: b0)

    def seed_idiom():
        with jt.GradientTape() as tape:
            y = layer(x)
        return tape.jacobian(y, layer.kernel)

    table.add("jitape eager, jt.layers.Dense", seed_idiom, note="the seed's code: layer call + tape.jacobian")


def tensorflow_b(table, tf):
    x, kernel, bias = data_b()
    x, kernel, bias = tf.constant(x), tf.Variable(kernel), tf.Variable(bias)

    def jacobian(use_pfor=True):
        with tf.GradientTape(persistent=not use_pfor) as tape:  # eager without pfor requires persistent
            y = dense(x, kernel, bias, tf.nn.relu)
        return tape.jacobian(y, kernel, experimental_use_pfor=use_pfor)

    _add_tensorflow_rows(table, tf, jacobian)


def torch_b(table, torch):
    x, kernel, bias = (torch.from_numpy(a) for a in data_b())

    def f(kernel):
        return dense(x, kernel, bias, torch.relu)

    table.add("torch.autograd.functional.jacobian", lambda: torch.autograd.functional.jacobian(f, kernel))
    jac = torch.func.jacrev(f)
    table.add("torch.func.jacrev", lambda: jac(kernel))


def jax_b(table, jax):
    x, kernel, bias = (jax.numpy.asarray(a) for a in data_b())
    jac = jax.jacrev(lambda kernel: dense(x, kernel, bias, jax.nn.relu))
    jjac = jax.jit(jac)
    table.add("jax eager (jacrev, no jit)", lambda: jac(kernel).block_until_ready())
    table.add("jax.jit(jax.jacrev)", lambda: jjac(kernel).block_until_ready(), note="first call = compile")


def autograd_b(table, autograd):
    x, kernel, bias = data_b()
    jac = autograd.jacobian(lambda kernel: dense(x, kernel, bias, lambda z: autograd.numpy.maximum(z, 0)))
    table.add("autograd", lambda: jac(kernel))


def numpy_rows_b(table):
    x, kernel, bias = data_b()
    table.add("numpy analytic (limit)", lambda: numpy_b(x, kernel, bias))


# ---------------------------------------------------------------- W3c 100 → 100 tanh MLP, w.r.t. x

def jitape_c(table, jt):
    x, ws = data_c()
    x, ws = jt.constant(x), [jt.constant(w) for w in ws]

    def jacobian():
        with jt.GradientTape() as tape:
            tape.watch(x)
            y = tanh_mlp(x, ws, jt.tanh)
        return tape.jacobian(y, x)

    table.add("jitape eager", jacobian, note="record + tape.jacobian")
    with jt.GradientTape(persistent=True) as tape:
        tape.watch(x)
        y = tanh_mlp(x, ws, jt.tanh)
    table.add("jitape jacobian only", lambda: tape.jacobian(y, x),
              note="persistent tape, jacobian called repeatedly (lowering + sweep)")
    if hasattr(jt, "jacobian"):
        compiled = jt.jacobian(lambda x: tanh_mlp(x, ws, jt.tanh))
        table.add("jitape jt.jacobian", lambda: compiled(x), note="first call = trace")
    else:
        table.skip("jitape jt.jacobian", "jt.jacobian missing")

    def jacobian_of(x):
        with jt.GradientTape() as tape:
            tape.watch(x)
            y = tanh_mlp(x, ws, jt.tanh)
        return tape.jacobian(y, x)

    # x an argument: a closed-over constant's Jacobian would fold into a constant
    table.add("jitape jt.function(tape.jacobian)", lambda f=jt.function(jacobian_of): f(x),
              note="the eager code in one replay (the Jacobian a host step), as tf.function; first call = trace")


def tensorflow_c(table, tf):
    x, ws = data_c()
    x, ws = tf.constant(x), [tf.constant(w) for w in ws]

    def jacobian(use_pfor=True):
        with tf.GradientTape(persistent=not use_pfor) as tape:  # eager without pfor requires persistent
            tape.watch(x)
            y = tanh_mlp(x, ws, tf.tanh, tf.linalg.matvec)
        return tape.jacobian(y, x, experimental_use_pfor=use_pfor)

    _add_tensorflow_rows(table, tf, jacobian)


def torch_c(table, torch):
    x, ws = data_c()
    x, ws = torch.from_numpy(x), [torch.from_numpy(w) for w in ws]

    def f(x):
        return tanh_mlp(x, ws, torch.tanh)

    table.add("torch.autograd.functional.jacobian", lambda: torch.autograd.functional.jacobian(f, x),
              note="vectorize=False: a loop of 100 VJPs")
    table.add("torch.autograd.functional.jacobian, vectorize", lambda: torch.autograd.functional.jacobian(
        f, x, vectorize=True))
    jac = torch.func.jacrev(f)
    table.add("torch.func.jacrev", lambda: jac(x))


def jax_c(table, jax):
    x, ws = data_c()
    x, ws = jax.numpy.asarray(x), [jax.numpy.asarray(w) for w in ws]
    jac = jax.jacrev(lambda x: tanh_mlp(x, ws, jax.numpy.tanh))
    jjac = jax.jit(jac)
    table.add("jax eager (jacrev, no jit)", lambda: jac(x).block_until_ready())
    table.add("jax.jit(jax.jacrev)", lambda: jjac(x).block_until_ready(), note="first call = compile")


def autograd_c(table, autograd):
    x, ws = data_c()
    jac = autograd.jacobian(lambda x: tanh_mlp(x, ws, autograd.numpy.tanh))
    table.add("autograd", lambda: jac(x))


def numpy_rows_c(table):
    x, ws = data_c()
    table.add("numpy analytic (limit)", lambda: numpy_c(x, ws))


def tables():
    x, d = data_a()
    a = harness.Table("W3a Jacobian of `sigmoid(linspace(-10,10,201) + delta)` w.r.t. scalar delta → (201,), "
                      "float32", numpy_a(x.astype(np.float64), 0.0), tol=1e-4)
    x, kernel, bias = data_b()
    b = harness.Table("W3b Jacobian of `Dense(10, relu)` on x (7,5) w.r.t. the kernel → (7,10,5,10), float32",
                      numpy_b(x.astype(np.float64), kernel.astype(np.float64), bias.astype(np.float64)),
                      tol=1e-4)
    x, ws = data_c()
    c = harness.Table("W3c Jacobian of `W3 tanh(W2 tanh(W1 x))`, 100×100, w.r.t. x → (100,100), float32",
                      numpy_c(x.astype(np.float64), [w.astype(np.float64) for w in ws]), tol=1e-4)
    for table, rows in [(a, [jitape_a, tensorflow_a, torch_a, jax_a, autograd_a, numpy_rows_a]),
                        (b, [jitape_b, tensorflow_b, torch_b, jax_b, autograd_b, numpy_rows_b]),
                        (c, [jitape_c, tensorflow_c, torch_c, jax_c, autograd_c, numpy_rows_c])]:
        libraries = ["jitape", "tensorflow", "torch", "jax", "autograd", "numpy"]
        harness.add_all(table, list(zip(libraries, rows)))
    return [a, b, c]


if __name__ == "__main__":
    harness.main(tables)
