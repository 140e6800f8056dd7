"""W6 training loops, (b): an MLP 784-256-10, relu on the hidden layer,
float32, MSE against one-hot targets, batch 128 (one fixed seeded batch
reused by every step), Adam 1e-3 (epsilon 1e-7, Keras's update), 50
training steps; the total time of the 50 steps — jitape eager and
`jt.function(step)` against TensorFlow eager and `tf.function(step)`,
PyTorch eager, `jax.jit(step)` (a hand-written Adam, one jitted step called
50 times from Python) and hand-written numpy.

Each timed call resets the parameters and the optimizer's state (step
count, first and second moments) to their initial values and runs the 50
steps, so every call does the same work; the final parameters are checked
against a float64 numpy run of the same training.

Run: python perf/w6b_mlp_adam.py [--profile]
"""
import harness
import numpy as np

SIZES = (784, 256, 10)
BATCH = 128
NAMES = ("W1", "b1", "W2", "b2")
LR, BETA_1, BETA_2, EPSILON = 1e-3, 0.9, 0.999, 1e-7
STEPS = 50


def data():
    """(x, y, params): float32 inputs, one-hot targets and Glorot-scaled
    parameters in the order of NAMES."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((BATCH, SIZES[0])).astype(np.float32)
    y = np.eye(SIZES[-1], dtype=np.float32)[rng.integers(0, SIZES[-1], BATCH)]
    params = []
    for n_in, n_out in zip(SIZES[:-1], SIZES[1:]):
        params.append((rng.standard_normal((n_in, n_out)) * np.sqrt(2.0 / (n_in + n_out))).astype(np.float32))
        params.append((0.1 * rng.standard_normal(n_out)).astype(np.float32))
    return x, y, params


def mlp(x, y, p, relu, mean):
    """The W6b loss written once for every library with operator overloading."""
    d = relu(x @ p[0] + p[1]) @ p[2] + p[3] - y
    return mean(d * d)


def numpy_gradient(x, y, p):
    """Hand-written forward + backward: the four gradients."""
    h = np.maximum(x @ p[0] + p[1], 0)
    d = h @ p[2] + p[3] - y
    dout = d * np.asarray(2.0 / d.size, d.dtype)
    dh = (dout @ p[2].T) * (h > 0)
    return [x.T @ dh, dh.sum(0), h.T @ dout, dout.sum(0)]


def numpy_train(dtype=np.float32):
    """Hand-written training loop with Keras's Adam: the final parameters."""
    x, y, params = data()
    x, y, p = x.astype(dtype), y.astype(dtype), [a.astype(dtype) for a in params]
    m, v = [np.zeros_like(a) for a in p], [np.zeros_like(a) for a in p]
    one, b1, b2 = dtype(1), dtype(BETA_1), dtype(BETA_2)
    for t in range(1, STEPS + 1):
        alpha = dtype(LR) * np.sqrt(one - b2 ** t) / (one - b1 ** t)
        for w, g, m_i, v_i in zip(p, numpy_gradient(x, y, p), m, v):
            m_i += (g - m_i) * (one - b1)
            v_i += (g * g - v_i) * (one - b2)
            w -= m_i * alpha / (np.sqrt(v_i) + dtype(EPSILON))
    return p


def add_jitape(table, jt):
    x, y, params = data()
    x, y = jt.constant(x), jt.constant(y)
    variables = [jt.Variable(p, name=n) for p, n in zip(params, NAMES)]
    optimizer = jt.optimizers.Adam(LR)

    def train_step():
        with jt.GradientTape() as tape:
            loss = mlp(x, y, variables, jt.nn.relu, jt.reduce_mean)
        gradients = tape.gradient(loss, variables)
        optimizer.apply_gradients(zip(gradients, variables))

    def train(step):
        """Reset the parameters and Adam's state Variables by assign (outside
        any trace: a fresh optimizer would make jt.function trace again),
        then run the steps."""
        for var, p in zip(variables, params):
            var.assign(p)
            for slot in optimizer._slots_for(var):  # [m, v]
                slot.assign(np.zeros(slot.shape, slot.dtype))
        if optimizer._step is not None:     # made by the first update, in the variables' dtype
            optimizer._step.assign(0.0)
        for _ in range(STEPS):
            step()
        return variables

    table.add("jitape eager", lambda: train(train_step), note="jt.optimizers.Adam")
    if hasattr(jt, "function"):
        compiled_step = jt.function(train_step)
        table.add("jitape jt.function(step)", lambda: train(compiled_step), note="first call = trace")
        table.notes.append(f"- jitape jt.function(step): traced {compiled_step.trace_count} time(s) "
                           "over all its calls")
    else:
        table.skip("jitape jt.function(step)", "jt.function missing")


def add_tensorflow(table, tf):
    x, y, params = data()
    x, y = tf.constant(x), tf.constant(y)
    variables = [tf.Variable(p, name=n) for p, n in zip(params, NAMES)]
    optimizer = tf.keras.optimizers.Adam(LR, epsilon=EPSILON)
    optimizer.build(variables)
    initial_state = [s.numpy() for s in optimizer.variables]

    def train_step():
        with tf.GradientTape() as tape:
            loss = mlp(x, y, variables, tf.nn.relu, tf.reduce_mean)
        gradients = tape.gradient(loss, variables)
        optimizer.apply_gradients(zip(gradients, variables))

    def train(step):
        """Reset the parameters and the optimizer's variables (iterations,
        moments) by assign, then run the steps."""
        for var, p in zip(variables, params):
            var.assign(p)
        for state, value in zip(optimizer.variables, initial_state):
            state.assign(value)
        for _ in range(STEPS):
            step()
        return variables

    table.add("TF eager", lambda: train(train_step), note="keras Adam")
    compiled_step = tf.function(train_step)
    table.add("tf.function(step)", lambda: train(compiled_step), note="first call = trace")


def add_torch(table, torch):
    x, y, params = data()
    x, y = torch.from_numpy(x), torch.from_numpy(y)
    tensors = [torch.tensor(p, requires_grad=True) for p in params]  # copies: Adam updates in place

    def train():
        with torch.no_grad():
            for t, p in zip(tensors, params):
                t.copy_(torch.from_numpy(p))
        optimizer = torch.optim.Adam(tensors, lr=LR)
        for t in range(1, STEPS + 1):
            # torch adds eps to sqrt(v / (1 - beta_2**t)), Keras to sqrt(v): this eps is Keras's update
            optimizer.param_groups[0]["eps"] = EPSILON / np.sqrt(1 - BETA_2 ** t)
            optimizer.zero_grad()
            mlp(x, y, tensors, torch.relu, torch.mean).backward()
            optimizer.step()
        return tensors

    table.add("torch eager", train, note="torch.optim.Adam, eps rescaled per step to Keras's")


def add_jax(table, jax):
    jnp = jax.numpy
    x, y, params = data()
    x, y = jnp.asarray(x), jnp.asarray(y)
    grad = jax.grad(lambda p: mlp(x, y, p, jax.nn.relu, jnp.mean))

    def step(p, m, v, t):
        """One step of Keras's Adam, hand-written (t: the step number, from 1)."""
        alpha = LR * jnp.sqrt(1 - BETA_2 ** t) / (1 - BETA_1 ** t)
        g = grad(p)
        m = [m_i + (g_i - m_i) * (1 - BETA_1) for m_i, g_i in zip(m, g)]
        v = [v_i + (g_i * g_i - v_i) * (1 - BETA_2) for v_i, g_i in zip(v, g)]
        p = [w - m_i * alpha / (jnp.sqrt(v_i) + EPSILON) for w, m_i, v_i in zip(p, m, v)]
        return p, m, v

    jitted = jax.jit(step)

    def train():
        p = [jnp.asarray(a) for a in params]
        m, v = [jnp.zeros_like(a) for a in p], [jnp.zeros_like(a) for a in p]
        for t in range(1, STEPS + 1):
            p, m, v = jitted(p, m, v, jnp.float32(t))
        return jax.block_until_ready(p)

    table.add("jax.jit(step)", train, note="hand-written Adam; first call = compile")


def add_numpy(table):
    table.add("numpy hand-written fwd+bwd+Adam (limit)", numpy_train)


def tables():
    table = harness.Table("W6b MLP training: 784-256-10 relu, MSE, batch 128, float32, "
                          "Adam 1e-3, 50 steps (total)", numpy_train(np.float64), tol=1e-4)
    harness.add_all(table, [("jitape", add_jitape), ("tensorflow", add_tensorflow),
                            ("torch", add_torch), ("jax", add_jax), ("numpy", add_numpy)])
    for name, _, median, _, _ in table.rows:
        if median is not None:
            table.notes.append(f"- per step, {name}: {median / STEPS:.3f} ms")
    return [table]


if __name__ == "__main__":
    harness.main(tables)
