"""jitape/ops/linalg.py: einsum's contractions whose batch axes lie between an operand's rows and its summed axes
run as one MATMUL over the strided items (interleaved_matmul), with numpy's bits eagerly and when replayed, and
derivatives that agree on every path. (The registry test covers einsum's values and derivatives in general.)"""
import numpy as np
import pytest

import jitape as jt
from jitape_kernels import opcodes as oc


def _ops(program):
    return [oc.NAMES[op] for op in program.code[:, oc.OP]]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_batch_between_rows_and_sums_is_one_matmul_with_numpy_s_bits_on_every_path(dtype):
    rng = np.random.default_rng(0)
    ls_value = rng.standard_normal((25, 6, 6)).astype(dtype)
    xc_value = rng.standard_normal((40, 25, 6)).astype(dtype)
    ls, xc = jt.constant(ls_value), jt.constant(xc_value)
    with jt.GradientTape(persistent=True) as tape:
        tape.watch([ls, xc])
        y = jt.einsum("kij,nkj->nki", ls, xc)
        loss = jt.reduce_sum(y * y)
    # numpy's matmul over the items where they lie, one gemm each: the eager value's bits
    expected = np.empty((40, 25, 6), dtype)
    np.matmul(xc_value.transpose(1, 0, 2), ls_value.transpose(0, 2, 1), out=expected.transpose(1, 0, 2))
    assert np.array_equal(y.numpy(), expected)
    program = tape.program(loss, [ls, xc])
    ops = _ops(program)
    assert ops.count("matmul") == 1
    matmul_row = program.code[ops.index("matmul")]
    assert program.iattr[matmul_row[oc.ATTR] + 5] == 25          # inner: the 25 items interleaved with the rows
    moved = [program.slots[program.code[r, oc.IN0], oc.SIZE] for r, op in enumerate(ops) if op == "transpose"]
    assert moved == [25 * 6 * 6]            # only the small operand moves: neither xc nor the product does,
    assert "copy" not in ops                # and no reshape copies them
    # the replay's forward gives the eager bits; its gradient agrees with the analytic one and the Hessian path
    f = jt.function(lambda ls, xc: jt.einsum("kij,nkj->nki", ls, xc))
    assert np.array_equal(f(ls, xc).numpy(), expected)
    g_ls, g_xc = tape.gradient(loss, [ls, xc])
    yv = expected.astype(np.float64)
    tol = dict(rtol=1e-4, atol=1e-3) if dtype == np.float32 else dict(rtol=1e-12, atol=1e-11)
    np.testing.assert_allclose(g_ls.numpy(), 2 * np.einsum("nki,nkj->kij", yv, xc_value.astype(np.float64)), **tol)
    np.testing.assert_allclose(g_xc.numpy(), 2 * np.einsum("nki,kij->nkj", yv, ls_value.astype(np.float64)), **tol)
    grad = jt.grad(lambda ls, xc: jt.reduce_sum(jt.einsum("kij,nkj->nki", ls, xc) ** 2), argnums=(0, 1))
    for replayed, eager in zip(grad(ls, xc), (g_ls, g_xc)):
        np.testing.assert_allclose(replayed.numpy(), eager.numpy(), rtol=1e-6 if dtype == np.float32 else 1e-13)


def test_hessians_and_forward_mode_through_an_interleaved_matmul_agree_with_numpy():
    """Second order (forward over reverse, both operands active) and forward-mode Jacobians (seeded operands),
    against the closed forms of y = einsum("kij,nkj->nki", L, X) and sum(y**2)."""
    rng = np.random.default_rng(1)
    L = rng.standard_normal((3, 2, 2))
    X = rng.standard_normal((4, 3, 2))
    ls, xc = jt.constant(L), jt.constant(X)
    with jt.GradientTape(persistent=True) as tape:
        tape.watch([ls, xc])
        y = jt.einsum("kij,nkj->nki", ls, xc)
    eye_x = np.eye(X.size).reshape(X.size, *X.shape)
    eye_l = np.eye(L.size).reshape(L.size, *L.shape)
    jac_x = np.einsum("kij,enkj->nkie", L, eye_x).reshape(y.shape + X.shape)
    jac_l = np.einsum("ekij,nkj->nkie", eye_l, X).reshape(y.shape + L.shape)
    np.testing.assert_allclose(tape.jacobian(y, xc).numpy(), jac_x, atol=1e-13)
    np.testing.assert_allclose(tape.jacobian(y, ls).numpy(), jac_l, atol=1e-13)
    np.testing.assert_allclose(tape.jacobian(y, xc, experimental_use_pfor=False).numpy(), jac_x, atol=1e-13)
    # the Hessian of sum(y²) over z = (L, X) flat, both operands active: 2 J^T J plus the product rule's term,
    # 2 y[n, k, i] wherever L[k, i, j] meets X[n, k, j]
    z = jt.constant(np.concatenate([L.ravel(), X.ravel()]))

    def objective(z):
        return jt.reduce_sum(jt.einsum("kij,nkj->nki", jt.reshape(z[:L.size], L.shape),
                                       jt.reshape(z[L.size:], X.shape)) ** 2)

    jz = np.concatenate([jac_l.reshape(-1, L.size), jac_x.reshape(-1, X.size)], axis=1)
    cross = 2 * np.einsum("nki,kK,jJ->kijnKJ", y.numpy(), np.eye(3), np.eye(2)).reshape(L.size, X.size)
    expected = 2 * jz.T @ jz
    expected[:L.size, L.size:] += cross
    expected[L.size:, :L.size] += cross.T
    np.testing.assert_allclose(jt.hessian(objective)(z).numpy(), expected, atol=1e-12)
    with jt.GradientTape() as outer:        # the recorded path: nested tapes over the matmul's VJP
        outer.watch(z)
        with jt.GradientTape() as inner:
            inner.watch(z)
            value = objective(z)
        g = inner.gradient(value, z)
    np.testing.assert_allclose(outer.jacobian(g, z).numpy(), expected, atol=1e-12)


def test_batch_jacobians_keep_their_rows_through_interleaved_items_and_a_per_example_junction_is_refused():
    """An example that owns rows of the left operand owns them with every item's entries, so batch_jacobian runs
    through the interleaved matmul as it did through einsum's transposes; a per-example gradient of its right
    operand (a junction the per-example sweep splits only for items one after another) raises and leaves the
    tape usable."""
    rng = np.random.default_rng(2)
    ls = jt.Variable(rng.standard_normal((4, 3, 3)))
    x = jt.constant(rng.standard_normal((5, 4, 3)))
    with jt.GradientTape(persistent=True) as tape:
        tape.watch(x)
        y = jt.einsum("kij,nkj->nki", ls, x)
    full = tape.jacobian(y, x).numpy()
    np.testing.assert_array_equal(tape.batch_jacobian(y, x).numpy(), np.einsum("bkibKj->bkiKj", full))
    np.testing.assert_array_equal(tape.batch_jacobian(y, x, experimental_use_pfor=False).numpy(),
                                  np.einsum("bkibKj->bkiKj", full))
    with jt.GradientTape(persistent=True) as tape:
        loss = jt.reduce_sum(jt.einsum("kij,nkj->nki", ls, x) ** 2, axis=(1, 2))
    with pytest.raises(ValueError, match="not supported per example"):
        tape.per_example_gradients(loss, [ls])
    per_example = tape.jacobian(loss, ls).numpy()
    np.testing.assert_allclose(per_example.sum(0), tape.gradient(loss, ls).numpy(), rtol=1e-12)
