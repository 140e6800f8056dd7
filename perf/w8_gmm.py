"""W8 Gaussian mixture model objective with a Wishart prior (ADBench /
GradBench `gmm`), float64: gradient w.r.t. (alphas [k], means [k,d], icf
[k, d + d(d-1)/2]) for x [n,d], n=1000, at d=10, k=25 and d=64, k=25 —
jitape eager, its forward alone and `jt.grad` replay against TensorFlow,
PyTorch, JAX, autograd and the hand-written numpy gradient.

The objective is the vectorised one PyTorch and JAX users write (GradBench's
PyTorch module): Q_k = diag(exp(icf[k,:d])) + L_k, with the strictly lower
triangle of L_k packed column by column in icf[k,d:];
  sum_i logsumexp_k(alpha_k + sum(icf[k,:d]) - ½‖Q_k (x_i - mu_k)‖²)
  - n logsumexp(alpha) - n d ½ log 2π + log Wishart prior(gamma=1, m=0).
L is built the same way in every library: icf with a zero column appended,
gathered along axis 1 by one constant index array (d·d entries: the packed
position of L[r,c] for r > c, else the zero column), reshaped to (k,d,d);
Q_k (x_i - mu_k) is an einsum over (n,k,d) centred points. Every row is
checked against the hand-written numpy gradient (and the forward rows
against the numpy objective).

Run: python perf/w8_gmm.py [--profile]
"""
import functools
import math
import types

import harness
import numpy as np

N = 1000
CONFIGS = ((10, 25), (64, 25))  # (d, k)
GAMMA, M = 1.0, 0


def data(d, k):
    """(alphas, means, icf, x) as ADBench's generator makes them (uniform / normal draws)."""
    rng = np.random.default_rng(8 + d)
    alphas = rng.standard_normal(k)
    means = rng.uniform(0, 1, (k, d))
    icf = 0.5 * rng.standard_normal((k, d + d * (d - 1) // 2))
    x = rng.standard_normal((N, d))
    return alphas, means, icf, x


def l_index(d):
    """Indices into icf padded with one zero column (position d + d(d-1)/2) for L (d·d, row-major):
    ADBench's column-major packing of the strictly lower triangle."""
    zero = d + d * (d - 1) // 2
    idx = np.full((d, d), zero, np.int64)
    pos = d
    for c in range(d):
        for r in range(c + 1, d):
            idx[r, c] = pos
            pos += 1
    return idx.reshape(-1)


def constant_terms(n, d, k):
    """-n d ½ log 2π and the Wishart normaliser -k (n_w p log(gamma/√2) - multigammaln(½ n_w, p))."""
    n_w = d + M + 1
    multigammaln = d * (d - 1) / 4 * math.log(math.pi) + sum(math.lgamma(0.5 * n_w + (1 - j) / 2)
                                                               for j in range(1, d + 1))
    return -n * d * 0.5 * math.log(2 * math.pi) - k * (n_w * d * math.log(GAMMA / math.sqrt(2)) - multigammaln)


def gmm(alphas, means, icf, x, idx, lib):
    """The objective written once; lib: exp, sum(a, axis), lse(a, axis), pad (append a zero column),
    gather(a, idx) along axis 1, reshape, einsum."""
    n, d = x.shape
    k = alphas.shape[0]
    qs = icf[:, :d]
    q_diag = lib.exp(qs)
    sum_qs = lib.sum(qs, 1)
    ls = lib.reshape(lib.gather(lib.pad(icf), idx), (k, d, d))
    xc = x[:, None, :] - means[None, :, :]                       # (n, k, d)
    qxc = q_diag[None, :, :] * xc + lib.einsum("kij,nkj->nki", ls, xc)
    inner = alphas[None, :] + sum_qs[None, :] - 0.5 * lib.sum(qxc * qxc, 2)
    prior = lib.sum(0.5 * GAMMA * GAMMA * (lib.sum(q_diag * q_diag, 1) + lib.sum(icf[:, d:] * icf[:, d:], 1))
                    - M * sum_qs, 0)
    return lib.sum(lib.lse(inner, 1), 0) - n * lib.lse(alphas, 0) + prior + constant_terms(n, d, k)


def _numpy_lse(a, axis):
    peak = np.max(a, axis, keepdims=True)
    return np.squeeze(np.log(np.sum(np.exp(a - peak), axis, keepdims=True)) + peak, axis)


def numpy_lib():
    return types.SimpleNamespace(
        exp=np.exp, sum=np.sum, lse=_numpy_lse, reshape=np.reshape, 
        einsum=functools.partial(np.einsum, optimize=True),
        pad=lambda a: np.concatenate([a, np.zeros((a.shape[0], 1))], 1), gather=lambda a, i: a[:, i])


def numpy_forward(alphas, means, icf, x):
    return gmm(alphas, means, icf, x, l_index(x.shape[1]), numpy_lib())


def numpy_gradient(alphas, means, icf, x):
    """Hand-written forward + backward: [d alphas, d means, d icf]."""
    n, d = x.shape
    k = alphas.shape[0]
    idx = l_index(d)
    qs = icf[:, :d]
    q_diag = np.exp(qs)
    ls = np.concatenate([icf, np.zeros((k, 1))], 1)[:, idx].reshape(k, d, d)
    q = ls + q_diag[:, :, None] * np.eye(d)                    # Q_k = diag + strictly lower
    xc = x[:, None, :] - means[None, :, :]
    y = np.einsum("kij,nkj->nki", q, xc, optimize=True)
    inner = alphas + qs.sum(1) - 0.5 * np.sum(y * y, 2)
    w = np.exp(inner - inner.max(1, keepdims=True))
    w /= w.sum(1, keepdims=True)                                # d objective / d inner
    a = np.exp(alphas - alphas.max())
    d_alphas = w.sum(0) - n * a / a.sum()
    wy = w[:, :, None] * y                                      # (n, k, d)
    d_means = np.einsum("nki,kij->kj", wy, q, optimize=True)
    g = -np.einsum("nki,nkj->kij", wy, xc, optimize=True)  # d objective / d Q_k
    d_icf = np.empty_like(icf)
    d_icf[:, :d] = w.sum(0)[:, None] + np.diagonal(g, 0, 1, 2) * q_diag + GAMMA ** 2 * q_diag ** 2 - M
    rows, cols = np.tril_indices(d, -1)
    flat = idx.reshape(d, d)[rows, cols]                         # packed positions of L[r, c]
    d_icf[:, flat] = g[:, rows, cols]
    d_icf[:, d:] += GAMMA ** 2 * icf[:, d:]
    return [d_alphas, d_means, d_icf]


def add_jitape(grad, fwd, d, k, jt):
    alphas, means, icf, x = (jt.constant(a) for a in data(d, k))
    idx = l_index(d)
    zeros = jt.constant(np.zeros((k, 1)))
    lib = types.SimpleNamespace(
        exp=jt.exp, sum=jt.reduce_sum, lse=jt.reduce_logsumexp, reshape=jt.reshape, einsum=jt.einsum,
        pad=lambda a: jt.concat([a, zeros], 1), gather=lambda a, i: jt.gather(a, i, axis=1))
    params = [alphas, means, icf]

    def f(alphas, means, icf, x):
        return gmm(alphas, means, icf, x, idx, lib)

    def gradient():
        with jt.GradientTape() as tape:
            tape.watch(params)
            y = f(alphas, means, icf, x)
        return tape.gradient(y, params)

    grad.add("jitape eager", gradient, note="record + gradient")
    with jt.GradientTape(persistent=True) as tape:
        tape.watch(params)
        y = f(alphas, means, icf, x)
    grad.add("jitape gradient only", lambda: tape.gradient(y, params),
             note="persistent tape, gradient called repeatedly (its cotangents are kept after the first call)")
    g = jt.grad(f, argnums=(0, 1, 2))
    grad.add("jitape jt.grad (replay)", lambda: g(alphas, means, icf, x), note="first call = trace; then replays")
    fwd.add("jitape eager", lambda: f(alphas, means, icf, x), note="no tape")
    jf = jt.function(f)
    fwd.add("jitape jt.function(forward)", lambda: jf(alphas, means, icf, x), note="first call = trace; then replays")


def add_tensorflow(grad, fwd, d, k, tf):
    alphas, means, icf, x = (tf.constant(a) for a in data(d, k))
    idx = tf.constant(l_index(d))
    zeros = tf.zeros((k, 1), tf.float64)
    lib = types.SimpleNamespace(
        exp=tf.exp, sum=tf.reduce_sum, lse=tf.reduce_logsumexp, reshape=tf.reshape, einsum=tf.einsum,
        pad=lambda a: tf.concat([a, zeros], 1), gather=lambda a, i: tf.gather(a, i, axis=1))
    params = [alphas, means, icf]

    def f():
        return gmm(alphas, means, icf, x, idx, lib)

    def gradient():
        with tf.GradientTape() as tape:
            tape.watch(params)
            y = f()
        return tape.gradient(y, params)

    harness.add_tensorflow_rows(grad, fwd, tf, gradient, f)


def add_torch(grad, fwd, d, k, torch):
    alphas, means, icf, x = (torch.from_numpy(a) for a in data(d, k))
    params = [t.requires_grad_() for t in (alphas, means, icf)]
    idx = torch.from_numpy(l_index(d))
    zeros = torch.zeros((k, 1), dtype=torch.float64)
    lib = types.SimpleNamespace(
        exp=torch.exp, sum=torch.sum, lse=torch.logsumexp, reshape=torch.reshape, einsum=torch.einsum,
        pad=lambda a: torch.cat([a, zeros], 1), gather=lambda a, i: a[:, i])

    def f():
        return gmm(*params, x, idx, lib)

    grad.add("torch eager", lambda: torch.autograd.grad(f(), params))

    def forward():
        with torch.no_grad():
            return f()

    fwd.add("torch eager", forward, note="no_grad")


def add_jax(grad, fwd, d, k, jax):
    jnp = jax.numpy
    from jax.scipy.special import logsumexp
    with jax.enable_x64(True):
        alphas, means, icf, x = (jnp.asarray(a) for a in data(d, k))
        zeros = jnp.zeros((k, 1))
    idx = l_index(d)
    lib = types.SimpleNamespace(
        exp=jnp.exp, sum=jnp.sum, lse=logsumexp, reshape=jnp.reshape, einsum=jnp.einsum,
        pad=lambda a: jnp.concatenate([a, zeros], 1), gather=lambda a, i: a[:, i])

    def f(alphas, means, icf):
        return gmm(alphas, means, icf, x, idx, lib)

    g = jax.grad(f, argnums=(0, 1, 2))
    jg, jf = jax.jit(g), jax.jit(f)

    def run(fn):
        with jax.enable_x64(True):  # float64 for these rows only
            return jax.block_until_ready(fn(alphas, means, icf))

    grad.add("jax eager (grad, no jit)", lambda: run(g))
    grad.add("jax.jit(jax.grad)", lambda: run(jg), note="first call = compile")
    fwd.add("jax eager", lambda: run(f))
    fwd.add("jax.jit", lambda: run(jf), note="first call = compile")


def add_autograd(grad, fwd, d, k, autograd):
    anp = autograd.numpy
    from autograd.scipy.special import logsumexp
    alphas, means, icf, x = data(d, k)
    idx = l_index(d)
    lib = types.SimpleNamespace(
        exp=anp.exp, sum=anp.sum, lse=logsumexp, reshape=anp.reshape, einsum=anp.einsum,
        pad=lambda a: anp.concatenate([a, np.zeros((k, 1))], 1), gather=lambda a, i: a[:, i])
    g = autograd.grad(lambda p: gmm(p[0], p[1], p[2], x, idx, lib))
    grad.add("autograd", lambda: g([alphas, means, icf]))


def add_numpy(grad, fwd, d, k):
    alphas, means, icf, x = data(d, k)
    grad.add("numpy hand-written fwd+bwd (limit)", lambda: numpy_gradient(alphas, means, icf, x))
    fwd.add("numpy (limit)", lambda: numpy_forward(alphas, means, icf, x))


def tables():
    out = []
    for d, k in CONFIGS:
        args = data(d, k)
        grad = harness.Table(f"W8 GMM gradient w.r.t. alphas, means, icf: d={d}, k={k}, n={N:,}, float64",
                             numpy_gradient(*args), tol=1e-8)
        fwd = harness.Table(f"W8 GMM objective alone (forward): d={d}, k={k}", numpy_forward(*args), tol=1e-10)
        groups = [("jitape", add_jitape), ("tensorflow", add_tensorflow), ("torch", add_torch),
                  ("jax", add_jax), ("autograd", add_autograd), ("numpy", add_numpy)]
        harness.add_all(grad, groups, extra=(fwd, d, k))
        grad.note_costs(fwd, harness.GRADIENT_COST_ROWS)
        out += [grad, fwd]
    return out


if __name__ == "__main__":
    harness.main(tables)
