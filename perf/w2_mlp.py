"""W2 MLP gradient: float32, 784-256-256-10 relu, MSE, batch 256; gradient
w.r.t. all six weight/bias arrays; also forward alone — jitape against
TensorFlow, PyTorch, JAX, autograd and hand-written numpy, plus each one's
gradient/forward cost ratio.

Run: python perf/w2_mlp.py [--profile]
"""
import harness
import numpy as np

SIZES = (784, 256, 256, 10)
BATCH = 256
NAMES = ("W1", "b1", "W2", "b2", "W3", "b3")


def data():
    """(x, y, params): float32 inputs, targets and Glorot-scaled parameters
    in the order of NAMES."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((BATCH, SIZES[0])).astype(np.float32)
    y = rng.standard_normal((BATCH, SIZES[-1])).astype(np.float32)
    params = []
    for n_in, n_out in zip(SIZES[:-1], SIZES[1:]):
        params.append((rng.standard_normal((n_in, n_out)) * np.sqrt(2.0 / (n_in + n_out))).astype(np.float32))
        params.append((0.1 * rng.standard_normal(n_out)).astype(np.float32))
    return x, y, params


def numpy_forward(x, y, p):
    h1 = np.maximum(x @ p[0] + p[1], 0)
    h2 = np.maximum(h1 @ p[2] + p[3], 0)
    d = h2 @ p[4] + p[5] - y
    return np.mean(d * d)


def numpy_gradient(x, y, p):
    """Hand-written forward + backward: the six gradients."""
    h1 = np.maximum(x @ p[0] + p[1], 0)
    h2 = np.maximum(h1 @ p[2] + p[3], 0)
    d = h2 @ p[4] + p[5] - y
    dout = d * np.asarray(2.0 / d.size, d.dtype)
    dh2 = (dout @ p[4].T) * (h2 > 0)
    dh1 = (dh2 @ p[2].T) * (h1 > 0)
    return [x.T @ dh1, dh1.sum(0), h1.T @ dh2, dh2.sum(0), h2.T @ dout, dout.sum(0)]


def mlp(x, y, p, relu, mean):
    """The W2 loss written once for every library with operator overloading."""
    h1 = relu(x @ p[0] + p[1])
    h2 = relu(h1 @ p[2] + p[3])
    d = h2 @ p[4] + p[5] - y
    return mean(d * d)


def add_jitape(grad, fwd, jt):
    x, y, params = data()
    x, y = jt.constant(x), jt.constant(y)
    variables = [jt.Variable(p, name=n) for p, n in zip(params, NAMES)]

    def gradient():
        with jt.GradientTape() as tape:
            loss = mlp(x, y, variables, jt.nn.relu, jt.reduce_mean)
        return tape.gradient(loss, variables)

    grad.add("jitape eager", gradient, note="record + gradient")
    with jt.GradientTape(persistent=True) as tape:
        loss = mlp(x, y, variables, jt.nn.relu, jt.reduce_mean)
    grad.add("jitape gradient only", lambda: tape.gradient(loss, variables),
             note="persistent tape, gradient called repeatedly (its cotangents are kept after the first call)")
    fwd.add("jitape eager", lambda: mlp(x, y, variables, jt.nn.relu, jt.reduce_mean), note="no tape")
    grad.add("jitape jt.function(gradient)", jt.function(gradient), note="first call = trace; then replays")
    fwd.add("jitape jt.function(forward)", jt.function(lambda: mlp(x, y, variables, jt.nn.relu, jt.reduce_mean)),
            note="first call = trace; then replays")


def add_tensorflow(grad, fwd, tf):
    x, y, params = data()
    x, y = tf.constant(x), tf.constant(y)
    variables = [tf.Variable(p, name=n) for p, n in zip(params, NAMES)]

    def loss():
        return mlp(x, y, variables, tf.nn.relu, tf.reduce_mean)

    def gradient():
        with tf.GradientTape() as tape:
            value = loss()
        return tape.gradient(value, variables)

    harness.add_tensorflow_rows(grad, fwd, tf, gradient, loss)


def add_torch(grad, fwd, torch):
    x, y, params = data()
    x, y = torch.from_numpy(x), torch.from_numpy(y)
    tensors = [torch.from_numpy(p).requires_grad_() for p in params]

    def loss(p):
        return mlp(x, y, p, torch.relu, torch.mean)

    grad.add("torch eager", lambda: torch.autograd.grad(loss(tensors), tensors))
    plain = [t.detach() for t in tensors]
    g = torch.func.grad(loss)
    grad.add("torch.func.grad", lambda: g(plain))

    def forward():
        with torch.no_grad():
            return loss(tensors)

    fwd.add("torch eager", forward, note="no_grad")


def add_jax(grad, fwd, jax):
    x, y, params = data()
    x, y = jax.numpy.asarray(x), jax.numpy.asarray(y)
    arrays = [jax.numpy.asarray(p) for p in params]

    def loss(p):
        return mlp(x, y, p, jax.nn.relu, jax.numpy.mean)

    g, jg, jl = jax.grad(loss), jax.jit(jax.grad(loss)), jax.jit(loss)
    grad.add("jax eager (grad, no jit)", lambda: jax.block_until_ready(g(arrays)))
    grad.add("jax.jit(jax.grad)", lambda: jax.block_until_ready(jg(arrays)), note="first call = compile")
    fwd.add("jax eager", lambda: jax.block_until_ready(loss(arrays)))
    fwd.add("jax.jit", lambda: jax.block_until_ready(jl(arrays)), note="first call = compile")


def add_autograd(grad, fwd, autograd):
    x, y, params = data()
    anp = autograd.numpy
    g = autograd.grad(lambda p: mlp(x, y, p, lambda a: anp.maximum(a, 0), anp.mean))
    grad.add("autograd", lambda: g(params))


def add_numpy(grad, fwd):
    x, y, params = data()
    grad.add("numpy hand-written fwd+bwd (limit)", lambda: numpy_gradient(x, y, params))
    fwd.add("numpy (limit)", lambda: numpy_forward(x, y, params))


def tables():
    x, y, params = data()
    x64, y64, p64 = x.astype(np.float64), y.astype(np.float64), [p.astype(np.float64) for p in params]
    grad = harness.Table("W2 MLP gradient: 784-256-256-10 relu, MSE, batch 256, float32",
                         numpy_gradient(x64, y64, p64), tol=1e-3)
    fwd = harness.Table("W2 MLP forward alone (loss value)", numpy_forward(x64, y64, p64), tol=1e-4)
    groups = [("jitape", add_jitape), ("tensorflow", add_tensorflow), ("torch", add_torch),
              ("jax", add_jax), ("autograd", add_autograd), ("numpy", add_numpy)]
    harness.add_all(grad, groups, extra=(fwd,))
    grad.note_costs(fwd, harness.GRADIENT_COST_ROWS)
    return [grad, fwd]


if __name__ == "__main__":
    harness.main(tables)
