"""W9 ADBench's LSTM objective, float64: l=2 layers, c=1024 characters of
sequence (1,023 steps), b=14 (ADBench's `lstm_l2_c1024` configuration: its
data files all have b = 14; l ∈ {2, 4} and c ∈ {1024, 4096} are its four
standard sizes, this is the smallest); gradient w.r.t. main_params [2l, 4b]
and extra_params [3, b] — jitape eager, its forward alone and `jt.grad`
replay against TensorFlow eager, PyTorch eager, `jax.jit(jax.grad)` of the
same step under `lax.scan`, autograd and a hand-written numpy forward+backward.

The objective is ADBench's (GradBench's PyTorch module) with its quirks:
diagonal weights, `gates = concat(x, h, x, h) * weight + bias`, and the
normaliser log(2 + sum(exp(ypred))) (ADBench adds 2, issue 143). The layer
weights and the sequence's rows are split once per call, outside the time
loop, in every library; each step records ~40 small ops (≈ 41,000 in all).

Rows left out: `tf.function` (tracing the unrolled 1,023 steps and their
gradient takes minutes) and JAX eager (tens of seconds per call; W1 shows
its per-op cost). Every row is checked against the numpy gradient.

Run: python perf/w9_lstm.py [--profile]
"""
import harness
import numpy as np

L, C, B = 2, 1024, 14
REPEAT, WARMUP = 5, 1  # calls of 0.1-5 s on a shared 2-core VM


def data():
    """(main_params [2L, 4B], extra_params [3, B], state [2L, B], sequence [C, B]), uniform draws."""
    rng = np.random.default_rng(9)
    main = rng.uniform(-1, 1, (2 * L, 4 * B))
    extra = rng.uniform(-1, 1, (3, B))
    state = rng.uniform(-1, 1, (2 * L, B))
    sequence = rng.uniform(0, 1, (C, B))
    return main, extra, state, sequence


def lstm_step(weights, extra, hs, cs, inp, gold, concat, sigmoid, tanh, log, exp, sum_):
    """One character: the L-layer prediction from inp and sum(gold * log-normalised prediction).
    weights: [weight_0, bias_0, weight_1, ...] (rows of main_params); hs, cs: per-layer state."""
    hs, cs = list(hs), list(cs)
    x = inp * extra[0]
    for i in range(L):
        gates = concat([x, hs[i], x, hs[i]], 0) * weights[2 * i] + weights[2 * i + 1]
        forget = sigmoid(gates[0:B])
        ingate = sigmoid(gates[B:2 * B])
        outgate = sigmoid(gates[2 * B:3 * B])
        change = tanh(gates[3 * B:])
        cs[i] = cs[i] * forget + ingate * change
        hs[i] = outgate * tanh(cs[i])
        x = hs[i]
    ypred = x * extra[1] + extra[2]
    ynorm = ypred - log(2.0 + sum_(exp(ypred)))
    return hs, cs, sum_(gold * ynorm)


def lstm_objective(main, extra, state, sequence, concat, sigmoid, tanh, log, exp, sum_):
    """ADBench's lstm_objective, written once for every library with operator overloading."""
    weights = [main[j] for j in range(2 * L)]
    extra = [extra[j] for j in range(3)]
    rows = [sequence[t] for t in range(C)]
    hs = [state[2 * i + 1] for i in range(L)]
    cs = [state[2 * i] for i in range(L)]
    total = 0.0
    for t in range(C - 1):
        hs, cs, term = lstm_step(weights, extra, hs, cs, rows[t], rows[t + 1],
                                 concat, sigmoid, tanh, log, exp, sum_)
        total = total + term
    return -total / ((C - 1) * B)


def _np_sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


def numpy_forward(main, extra, state, sequence):
    return lstm_objective(main, extra, state, sequence, np.concatenate, _np_sigmoid, np.tanh, np.log, np.exp,
                          np.sum)


def numpy_gradient(main, extra, state, sequence):
    """Hand-written forward + backward (through time): [d main_params, d extra_params]."""
    w = main.reshape(2 * L, 4, B)   # per layer: weight [f, i, o, c] then bias [f, i, o, c]
    hs = [state[2 * i + 1].copy() for i in range(L)]
    cs = [state[2 * i].copy() for i in range(L)]
    tape = []
    for t in range(C - 1):
        x = sequence[t] * extra[0]
        layers = []
        for i in range(L):
            wt, bs = w[2 * i], w[2 * i + 1]
            f = _np_sigmoid(x * wt[0] + bs[0])
            ig = _np_sigmoid(hs[i] * wt[1] + bs[1])
            o = _np_sigmoid(x * wt[2] + bs[2])
            ch = np.tanh(hs[i] * wt[3] + bs[3])
            c_new = cs[i] * f + ig * ch
            tc = np.tanh(c_new)
            layers.append((x, hs[i], cs[i], f, ig, o, ch, tc))
            cs[i], hs[i] = c_new, o * tc
            x = hs[i]
        tape.append((layers, x))
    scale = 1.0 / ((C - 1) * B)
    dw = np.zeros_like(w)
    dextra = np.zeros_like(extra)
    dh_carry = [np.zeros(B) for _ in range(L)]
    dc_carry = [np.zeros(B) for _ in range(L)]
    for t in range(C - 2, -1, -1):
        layers, x_top = tape[t]
        ypred = x_top * extra[1] + extra[2]
        e = np.exp(ypred)
        dynorm = -sequence[t + 1] * scale
        dypred = dynorm - e / (2.0 + e.sum()) * dynorm.sum()
        dextra[1] += dypred * x_top
        dextra[2] += dypred
        dx = dypred * extra[1]
        for i in range(L - 1, -1, -1):
            x, h, c, f, ig, o, ch, tc = layers[i]
            wt = w[2 * i]
            dh = dx + dh_carry[i]
            dc = dc_carry[i] + dh * o * (1 - tc * tc)
            zf = dc * c * f * (1 - f)
            zi = dc * ch * ig * (1 - ig)
            zo = dh * tc * o * (1 - o)
            zc = dc * ig * (1 - ch * ch)
            dw[2 * i] += np.stack([zf * x, zi * h, zo * x, zc * h])
            dw[2 * i + 1] += np.stack([zf, zi, zo, zc])
            dx = zf * wt[0] + zo * wt[2]
            dh_carry[i] = zi * wt[1] + zc * wt[3]
            dc_carry[i] = dc * f
        dextra[0] += dx * sequence[t]
    return [dw.reshape(main.shape), dextra]


def add_jitape(grad, fwd, jt):
    main, extra, state, sequence = (jt.constant(a) for a in data())
    params = [main, extra]

    def f(main, extra, state, sequence):
        return lstm_objective(main, extra, state, sequence, jt.concat, jt.sigmoid, jt.tanh, jt.math.log, jt.exp,
                              jt.reduce_sum)

    def gradient():
        with jt.GradientTape() as tape:
            tape.watch(params)
            y = f(main, extra, state, sequence)
        return tape.gradient(y, params)

    grad.add("jitape eager", gradient, note="record + gradient", repeat=REPEAT, warmup=WARMUP)
    with jt.GradientTape(persistent=True) as tape:
        tape.watch(params)
        y = f(main, extra, state, sequence)
    grad.add("jitape gradient only", lambda: tape.gradient(y, params),
             note="persistent tape, gradient called repeatedly (cotangents kept)", repeat=REPEAT, warmup=WARMUP)
    g = jt.grad(f, argnums=(0, 1))
    grad.add("jitape jt.grad (replay)", lambda: g(main, extra, state, sequence),
             note="first call = trace; then replays", repeat=REPEAT, warmup=WARMUP)
    fwd.add("jitape eager", lambda: f(main, extra, state, sequence), note="no tape", repeat=REPEAT, warmup=WARMUP)
    jf = jt.function(f)
    fwd.add("jitape jt.function(forward)", lambda: jf(main, extra, state, sequence),
            note="first call = trace; then replays", repeat=REPEAT, warmup=WARMUP)


def add_tensorflow(grad, fwd, tf):
    main, extra, state, sequence = (tf.constant(a) for a in data())
    params = [main, extra]

    def f():
        return lstm_objective(main, extra, state, sequence, tf.concat, tf.sigmoid, tf.tanh, tf.math.log, tf.exp,
                              tf.reduce_sum)

    def gradient():
        with tf.GradientTape() as tape:
            tape.watch(params)
            y = f()
        return tape.gradient(y, params)

    grad.add("TF eager", gradient, repeat=3, warmup=WARMUP)
    fwd.add("TF eager", f, repeat=3, warmup=WARMUP)


def add_torch(grad, fwd, torch):
    main, extra, state, sequence = (torch.from_numpy(a) for a in data())
    params = [t.requires_grad_() for t in (main, extra)]

    def f():
        return lstm_objective(main, extra, state, sequence, torch.cat, torch.sigmoid, torch.tanh, torch.log,
                              torch.exp, torch.sum)

    grad.add("torch eager", lambda: torch.autograd.grad(f(), params), repeat=REPEAT, warmup=WARMUP)

    def forward():
        with torch.no_grad():
            return f()

    fwd.add("torch eager", forward, note="no_grad", repeat=REPEAT, warmup=WARMUP)


def add_jax(grad, fwd, jax):
    jnp = jax.numpy
    with jax.enable_x64(True):
        main, extra, state, sequence = (jnp.asarray(a) for a in data())

    def f(main, extra):
        """The same step, iterated by lax.scan over the sequence (an unrolled loop compiles for minutes)."""
        weights = [main[j] for j in range(2 * L)]
        ex = [extra[j] for j in range(3)]

        def body(carry, pair):
            hs, cs, total = carry
            hs, cs, term = lstm_step(weights, ex, hs, cs, pair[0], pair[1], jnp.concatenate, jax.nn.sigmoid,
                                     jnp.tanh, jnp.log, jnp.exp, jnp.sum)
            return (hs, cs, total + term), None

        hs = [state[2 * i + 1] for i in range(L)]
        cs = [state[2 * i] for i in range(L)]
        (_, _, total), _ = jax.lax.scan(body, (hs, cs, jnp.zeros((), main.dtype)),
                                        (sequence[:-1], sequence[1:]))
        return -total / ((C - 1) * B)

    jg, jf = jax.jit(jax.grad(f, argnums=(0, 1))), jax.jit(f)

    def run(fn):
        with jax.enable_x64(True):  # float64 for these rows only
            return jax.block_until_ready(fn(main, extra))

    grad.add("jax.jit(jax.grad), lax.scan", lambda: run(jg), note="first call = compile",
             repeat=REPEAT, warmup=WARMUP)
    fwd.add("jax.jit, lax.scan", lambda: run(jf), note="first call = compile", repeat=REPEAT, warmup=WARMUP)


def add_autograd(grad, fwd, autograd):
    anp = autograd.numpy
    main, extra, state, sequence = data()

    def f(p):
        return lstm_objective(p[0], p[1], state, sequence, anp.concatenate, lambda z: 1.0 / (1.0 + anp.exp(-z)),
                              anp.tanh, anp.log, anp.exp, anp.sum)

    g = autograd.grad(f)
    grad.add("autograd", lambda: g([main, extra]), repeat=REPEAT, warmup=WARMUP)


def add_numpy(grad, fwd):
    args = data()
    grad.add("numpy hand-written fwd+bwd", lambda: numpy_gradient(*args), repeat=REPEAT, warmup=WARMUP)
    fwd.add("numpy", lambda: numpy_forward(*args), repeat=REPEAT, warmup=WARMUP)


def tables():
    args = data()
    grad = harness.Table(f"W9 ADBench LSTM gradient w.r.t. main and extra params: l={L}, c={C:,}, b={B}, float64",
                         numpy_gradient(*args), tol=1e-8)
    fwd = harness.Table("W9 ADBench LSTM objective alone (forward)", numpy_forward(*args), tol=1e-10)
    groups = [("jitape", add_jitape), ("tensorflow", add_tensorflow), ("torch", add_torch),
              ("jax", add_jax), ("autograd", add_autograd), ("numpy", add_numpy)]
    harness.add_all(grad, groups, extra=(fwd,))
    grad.note_costs(fwd, [("jitape eager", "jitape eager"), ("TF eager", "TF eager"),
                          ("torch eager", "torch eager"), ("jax.jit(jax.grad), lax.scan", "jax.jit, lax.scan"),
                          ("numpy hand-written fwd+bwd", "numpy")])
    return [grad, fwd]


if __name__ == "__main__":
    harness.main(tables)
