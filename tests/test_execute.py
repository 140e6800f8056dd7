"""The edges of every derivative path (jitape/execute.py and the sweeps it runs): intermediate and repeated
sources on the tangent paths, singular points, empty tensors, the batch row analysis, per-example gradients
of batched parameters, and when an enclosing tape makes a derivative take the recorded path."""
import weakref

import numpy as np
import pytest

import jitape as jt
from tests.test_tape import _count_python_calls

PATHS = ("compiled", "recorded")


def _on(path, tape, fn, watched=()):
    """fn() on the compiled path, or under an enclosing tape that watches `watched` (the recorded path)."""
    if path == "compiled":
        return fn()
    with jt.GradientTape() as enclosing:
        enclosing.watch(list(watched) or [out for _, _, out, _ in tape.records()])
        return fn()


def _central_jacobian(f, x0, h=1e-6):
    cols = []
    for i in range(x0.size):
        e = np.zeros_like(x0)
        e.flat[i] = h
        cols.append((np.asarray(f(x0 + e)) - np.asarray(f(x0 - e))).ravel() / (2 * h))
    return np.stack(cols, axis=-1)


# -- sources that are intermediate tensors, or listed twice -------------------------------------------
def _intermediate_tape():
    x = jt.constant(np.array([1.0, 2.0]))
    with jt.GradientTape(persistent=True) as tape:
        tape.watch(x)
        h = jt.sin(x)
        tape.watch(h)
        y = jt.reduce_sum(h * h * x)
        z = jt.tanh(h)[:, None] * jt.ones((2, 5), np.float64)      # 10 outputs from 2 inputs: forward mode
    return tape, x, h, y, z


@pytest.mark.parametrize("chunked", [False, True])
@pytest.mark.parametrize("path", PATHS)
def test_intermediate_source_on_every_path(path, chunked, jacobian_budget):
    if chunked:
        jacobian_budget(1)          # one column per sweep: the seeds are zeroed and set again in every chunk
    tape, x, h, y, z = _intermediate_tape()
    xv, hv = x.numpy(), h.numpy()
    hessian = np.diag(2 * xv)                                     # d²(sum h² x)/dh² with x held
    np.testing.assert_allclose(_on(path, tape, lambda: tape.hessian(y, h), [h]).numpy(), hessian, rtol=1e-12)
    v = jt.constant(np.array([1.0, -3.0]))
    np.testing.assert_allclose(_on(path, tape, lambda: tape.hessian_vector_product(y, h, v), [h]).numpy(),
                               hessian @ v.numpy(), rtol=1e-12)
    expected = np.zeros((2, 5, 2))
    for i in range(2):
        expected[i, :, i] = 1 - np.tanh(hv[i]) ** 2
    np.testing.assert_allclose(_on(path, tape, lambda: tape.jacobian(z, h), [h]).numpy(), expected, rtol=1e-12)
    # with the upstream source too: x's Jacobian is the total derivative, through h
    jx, jh = _on(path, tape, lambda: tape.jacobian(z, [x, h]), [x, h])
    np.testing.assert_allclose(jh.numpy(), expected, rtol=1e-12)
    np.testing.assert_allclose(jx.numpy(), expected * np.cos(xv), rtol=1e-12)
    gx, gh = _on(path, tape, lambda: tape.gradient(y, [x, h]), [x, h])
    np.testing.assert_allclose(gh.numpy(), 2 * hv * xv, rtol=1e-12)
    np.testing.assert_allclose(gx.numpy(), hv * hv + 2 * hv * xv * np.cos(xv), rtol=1e-12)


def test_intermediate_source_of_a_batch_jacobian_in_forward_mode():
    x = jt.constant(np.arange(6.0).reshape(3, 2) / 7)
    with jt.GradientTape(persistent=True) as tape:
        tape.watch(x)
        h = jt.exp(x)
        tape.watch(h)
        y = jt.tanh(jt.matmul(h, jt.constant(np.ones((2, 4)))))      # 4 features > 2: forward mode
    expected = np.einsum("bi,j->bij", 1 - np.tanh(h.numpy() @ np.ones((2, 4))) ** 2, np.ones(2))
    np.testing.assert_allclose(tape.batch_jacobian(y, h).numpy(), expected, rtol=1e-12)


@pytest.mark.parametrize("chunked", [False, True])
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("width", [1, 5])          # 5 outputs > 3 inputs: forward mode; 1: reverse
def test_a_source_listed_twice_gets_its_jacobian_twice(path, width, chunked, jacobian_budget):
    if chunked:
        jacobian_budget(1)
    x = jt.constant(np.array([1.0, 2.0, 3.0]))
    with jt.GradientTape(persistent=True) as tape:
        tape.watch(x)
        y = jt.reduce_sum(x * x)[None] * jt.ones((width,), np.float64)
    first, second = _on(path, tape, lambda: tape.jacobian(y, [x, x]), [x])
    expected = np.tile(2 * x.numpy(), (width, 1))
    np.testing.assert_array_equal(first.numpy(), expected)
    np.testing.assert_array_equal(second.numpy(), expected)
    g1, g2 = _on(path, tape, lambda: tape.gradient(y, [x, x]), [x])
    np.testing.assert_array_equal(g1.numpy(), width * 2 * x.numpy())
    np.testing.assert_array_equal(g2.numpy(), g1.numpy())


# -- singular points: IEEE inf/nan on every path, never an exception ------------------------------------
SINGULAR = {     # (function, the singular point, a regular point)
    "log at 0": (jt.log, 0.0, 0.5),
    "1/x at 0": (lambda x: 1 / x, 0.0, 0.5),
    "sqrt at 0": (jt.sqrt, 0.0, 0.5),
    "log1p at -1": (jt.log1p, -1.0, 0.5),
    "x/x at 0": (lambda x: x / x, 0.0, 0.5),
    "norm of zero": (lambda x: jt.norm(x * jt.constant(np.array([1.0, 0.0]))), 0.0, 0.5),
    "x ** 0.5 at 0": (lambda x: x ** 0.5, 0.0, 0.5),
    "pow(x, 2.0) at 0": (lambda x: jt.pow(x, jt.constant(2.0, np.float64)), 0.0, 0.5),
    "pow(0, x) at 0": (lambda x: jt.pow(jt.constant(0.0, np.float64), x), 0.0, 0.5),
    "log10 at 0": (jt.log10, 0.0, 0.5),
    "log2 at 0": (jt.log2, 0.0, 0.5),
    "acosh at 1": (jt.acosh, 1.0, 1.5),
    "atanh at 1": (jt.atanh, 1.0, 0.5),
    "asin at -1": (jt.asin, -1.0, 0.5),
    "acos at 1": (jt.acos, 1.0, 0.5),
    "lgamma at 0": (jt.lgamma, 0.0, 0.5),
    "digamma at -1": (jt.digamma, -1.0, 0.5),
    "atan2 at the origin": (lambda x: jt.atan2(x, x * 0.5), 0.0, 0.5),
    "mean of an empty axis": (lambda x: jt.reduce_mean(x[:0]) + x, 0.0, 0.5),
}


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("name", sorted(SINGULAR))
def test_singular_points_give_the_same_ieee_values_on_every_path(name):
    fn, at, regular = SINGULAR[name]
    x = jt.constant(np.array([at, regular]))
    with jt.GradientTape(persistent=True) as tape:
        tape.watch(x)
        y = fn(x)
        total = jt.reduce_sum(y)
    results = {}
    for path in PATHS:
        results[path] = [
            _on(path, tape, lambda: tape.gradient(total, x), [x]).numpy(),
            _on(path, tape, lambda: tape.jacobian(y, x), [x]).numpy().reshape(-1, 2),
            _on(path, tape, lambda: tape.hessian(total, x), [x]).numpy(),
        ]
    compiled = results["compiled"]
    for got, want in zip(results["recorded"][:2], compiled[:2]):     # gradients, Jacobians: entry for entry
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=name)
        np.testing.assert_allclose(got, want, rtol=1e-12, err_msg=name)
    # By columns (forward mode, forward over reverse) a zero tangent meets an infinite partial (0 * inf = nan)
    # in the transposed places of where a zero cotangent meets it by rows, as with jax.jacfwd and jax.jacrev;
    # the diagonal and every finite entry agree. At the singular point itself the second derivative is
    # infinite, and the recorded VJPs, differentiated again, may meet inf - inf there (nan where the
    # compiled rule gives -inf): both are non-finite
    forward = jt.execute.source_jacobians(jt.execute.lowered(tape, [y], [x]), y.size, [x], "forward")[0].reshape(-1, 2)
    for got, want, exact in ((forward, compiled[1], True), (results["recorded"][2], compiled[2], False)):
        if exact:
            np.testing.assert_allclose(np.diag(got), np.diag(want), rtol=1e-12, err_msg=f"{name}: diagonal")
        np.testing.assert_array_equal(np.isfinite(np.diag(got)), np.isfinite(np.diag(want)), err_msg=name)
        both = np.isfinite(got) & np.isfinite(want)
        np.testing.assert_allclose(got[both], want[both], rtol=1e-12, err_msg=name)
        off = ~np.eye(*got.shape, dtype=bool) & ~both
        assert np.all(np.isnan(got[off]) | (got[off] == 0)) and np.all(np.isnan(want[off]) | (want[off] == 0))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_an_infinite_hessian_is_inf_not_nan():
    x = jt.constant(np.array([800.0]))
    with jt.GradientTape(persistent=True) as tape:
        tape.watch(x)
        y = jt.reduce_sum(jt.exp(x) * x)
    assert tape.hessian(y, x).numpy()[0, 0] == np.inf
    assert _on("recorded", tape, lambda: tape.hessian(y, x), [x]).numpy()[0, 0] == np.inf


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_mean_of_an_empty_tensor_and_a_zero_initialised_l2_penalty():
    x = jt.constant(np.zeros((0,)))
    with jt.GradientTape() as tape:
        tape.watch(x)
        y = jt.reduce_mean(x)
    assert np.isnan(y.numpy()) and tape.gradient(y, x).shape == (0,)
    w = jt.Variable(np.zeros(3))
    with jt.GradientTape() as tape:
        loss = jt.reduce_sum(w) + 1e-3 * jt.norm(w)
    assert np.all(np.isnan(tape.gradient(loss, w).numpy()))     # TensorFlow and JAX: nan too


# -- empty tensors ------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", PATHS)
def test_jacobians_of_empty_tensors_are_empty_not_none(path):
    x = jt.constant(np.zeros((0, 2)))
    w = jt.constant(np.ones(3))
    with jt.GradientTape(persistent=True) as tape:
        tape.watch([x, w])
        y = x * 2.0
        z = jt.reduce_sum(x) + w
    assert _on(path, tape, lambda: tape.jacobian(y, x), [x]).shape == (0, 2, 0, 2)
    jx, jw = _on(path, tape, lambda: tape.jacobian(z, [x, w]), [x, w])
    assert jx.shape == (3, 0, 2) and jw.shape == (3, 3)
    np.testing.assert_array_equal(jw.numpy(), np.eye(3))


@pytest.mark.parametrize("path", PATHS)
def test_reduce_prod_over_an_empty_axis(path):
    x = jt.constant(np.zeros((3, 0)))
    with jt.GradientTape(persistent=True) as tape:
        tape.watch(x)
        y = jt.reduce_sum(jt.reduce_prod(x, axis=1))
    np.testing.assert_array_equal(y.numpy(), 3.0)
    assert _on(path, tape, lambda: tape.gradient(y, x), [x]).shape == (3, 0)
    assert _on(path, tape, lambda: tape.hessian(y, x), [x]).shape == (3, 0, 3, 0)


def test_einsum_with_a_0d_operand():
    x, s = jt.constant(np.array([1.0, 2.0])), jt.constant(np.float64(3.0))
    with jt.GradientTape() as tape:
        tape.watch([x, s])
        y = jt.einsum("a,->", x, s)
    assert float(y) == 9.0
    gx, gs = tape.gradient(y, [x, s])
    np.testing.assert_array_equal(gx.numpy(), [3.0, 3.0])
    assert float(gs) == 3.0


def test_zero_row_batches():
    x = jt.constant(np.zeros((0, 3)))
    w = jt.Variable(np.ones((3, 2)))
    with jt.GradientTape(persistent=True) as tape:
        tape.watch(x)
        y = jt.tanh(jt.matmul(x, w))
        losses = jt.reduce_sum(y, axis=1)
    assert tape.batch_jacobian(y, x).shape == (0, 2, 3)
    assert tape.per_example_gradients(losses, w).shape == (0, 3, 2)


def test_batch_jacobian_of_a_scalar_is_a_value_error():
    x = jt.constant(np.ones(3))
    with jt.GradientTape() as tape:
        tape.watch(x)
        y = jt.reduce_sum(x)
    with pytest.raises(ValueError, match="target must have rank >= 1"):
        tape.batch_jacobian(y, x)


# -- the row analysis: every program that keeps rows apart is accepted, whatever B is -----------------
KEEP_ROWS = {
    "slice features": lambda x: x[:, 1:],
    "reversed features": lambda x: x[:, ::-1],
    "strided features": lambda x: x[:, ::2],
    "pad features": lambda x: jt.pad(x, [[0, 0], [1, 2]]),
    "unstack features": lambda x: jt.stack(jt.unstack(x, axis=1), axis=1),
    "concat features": lambda x: jt.concat([x, jt.square(x)], axis=1),
    "gather features": lambda x: jt.gather(x, [3, 0, 0], axis=1),
    "transpose there and back": lambda x: jt.transpose(jt.transpose(x) * 2.0),
    "batch moved to the middle and back": lambda x: jt.transpose(
        jt.transpose(jt.reshape(x, (-1, 2, 2)), (1, 0, 2)) + 1.0, (1, 0, 2)),
    "reduce over features": lambda x: jt.reduce_sum(x, axis=1, keepdims=True) * x,
    "row times a constant": lambda x: x * jt.constant(np.arange(4.0)),
    "matmul by a constant": lambda x: jt.matmul(x, jt.constant(np.ones((4, 3)))),
    "batched matmul": lambda x: jt.matmul(jt.reshape(x, (-1, 2, 2)), jt.reshape(x, (-1, 2, 2))),
    "broadcast over features": lambda x: jt.broadcast_to(x[:, None, :], (x.shape[0], 3, 4)),
    "tile features": lambda x: jt.tile(x, [1, 2]),
    "features as columns of a matmul": lambda x: jt.transpose(jt.matmul(jt.constant(np.ones((2, 4))),
                                                                        jt.transpose(x))),
    "solve per row": lambda x: jt.linalg.solve(
        jt.reshape(x, (-1, 2, 2)) + jt.constant(3 * np.eye(2)), jt.constant(np.ones((x.shape[0], 2, 1)))),
}
MIX_ROWS = {
    "reduce over the batch": lambda x: x - jt.reduce_mean(x, axis=0),
    "reversed rows": lambda x: x[::-1],
    "transpose left in place": lambda x: jt.reshape(jt.transpose(x), x.shape),
    "matmul over the batch": lambda x: jt.matmul(jt.constant(np.ones((x.shape[0], x.shape[0]))), x),
}


@pytest.mark.parametrize("batch", [1, 2, 3, 4])
@pytest.mark.parametrize("name", sorted(KEEP_ROWS))
def test_row_analysis_accepts_programs_that_keep_rows_apart(name, batch):
    rng = np.random.default_rng(batch)
    x0 = rng.uniform(-1, 1, (batch, 4))
    fn = KEEP_ROWS[name]
    x = jt.constant(x0)
    with jt.GradientTape(persistent=True) as tape:
        tape.watch(x)
        y = jt.tanh(fn(x))
        losses = jt.reduce_sum(y * y, axis=tuple(range(1, y.ndim)))
    full = tape.jacobian(y, x).numpy().reshape(batch, -1, batch, 4)
    diagonal = np.stack([full[b, :, b] for b in range(batch)])
    for path in PATHS:
        got = _on(path, tape, lambda: tape.batch_jacobian(y, x), [x]).numpy().reshape(batch, -1, 4)
        np.testing.assert_allclose(got, diagonal, rtol=1e-12, atol=1e-14, err_msg=path)
    np.testing.assert_allclose(
        tape.batch_jacobian(losses, x).numpy().reshape(batch, 4),
        np.stack([_central_jacobian(lambda v: np.asarray(jt.reduce_sum(jt.square(jt.tanh(fn(jt.constant(v)))))),
                                    x0[b:b + 1]).reshape(4) for b in range(batch)]), rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("batch", [2, 3])
@pytest.mark.parametrize("name", sorted(MIX_ROWS))
def test_row_analysis_refuses_programs_that_mix_rows(name, batch):
    x = jt.constant(np.ones((batch, batch)))
    with jt.GradientTape(persistent=True) as tape:
        tape.watch(x)
        y = MIX_ROWS[name](x)
    for path in PATHS:
        with pytest.raises(ValueError, match="mixes rows of the batch"):
            _on(path, tape, lambda: tape.batch_jacobian(y, x), [x])


@pytest.mark.parametrize("batch", [1, 2, 3])
def test_per_example_gradients_with_constants_of_length_b(batch):
    """A constant whose leading dim happens to equal B, used as a shared weight, is not batch data."""
    rng = np.random.default_rng(batch)
    data = rng.uniform(-1, 1, (batch, batch))
    mixing = jt.constant(rng.uniform(-1, 1, (batch, 3)))       # (B, 3): leading dim B, but a weight
    w = jt.Variable(rng.uniform(-1, 1, (3, 2)))
    with jt.GradientTape(persistent=True) as tape:
        losses = jt.reduce_sum(jt.square(jt.matmul(jt.matmul(jt.constant(data), mixing), w)), axis=1)
    got = tape.per_example_gradients(losses, w).numpy()
    for b in range(batch):
        with jt.GradientTape() as single:
            loss = jt.reduce_sum(jt.square(jt.matmul(jt.matmul(jt.constant(data[b:b + 1]), mixing), w)))
        np.testing.assert_allclose(got[b], single.gradient(loss, w).numpy(), rtol=1e-12)


@pytest.mark.parametrize("batch", [1, 2, 3])
def test_per_example_gradients_of_a_batched_parameter(batch):
    rng = np.random.default_rng(batch)
    x = jt.constant(rng.uniform(-1, 1, (batch, 2, 4)))
    w = jt.Variable(rng.uniform(-1, 1, (batch, 4, 3)))
    with jt.GradientTape(persistent=True) as tape:
        losses = jt.reduce_sum(jt.square(jt.matmul(x, w)), axis=(1, 2))
    full = tape.jacobian(losses, w).numpy()
    np.testing.assert_allclose(tape.per_example_gradients(losses, w).numpy(), full, rtol=1e-12, atol=1e-14)
    with jt.GradientTape() as enclosing:
        enclosing.watch(w)
        recorded = tape.per_example_gradients(losses, w).numpy()
    np.testing.assert_allclose(recorded, full, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("batch", [1, 3])
def test_recorded_masks_on_the_batch_paths(batch):
    """Comparisons are recorded instructions now: where / relu / maximum masks pass no derivative on the
    per-example and batch-Jacobian paths, compiled and recorded, and agree with the full Jacobian."""
    rng = np.random.default_rng(batch)
    x = jt.constant(rng.uniform(-1, 1, (batch, 4)))
    w = jt.Variable(rng.uniform(-1, 1, (4, 3)))

    def losses():
        h = jt.matmul(x, w)
        h = jt.where(h > 0.1, h * h, jt.maximum(jt.nn.relu(h), -h))
        return h, jt.reduce_sum(h, axis=1)

    with jt.GradientTape(persistent=True) as tape:
        tape.watch(x)
        h, per_example = losses()
    full_w = tape.jacobian(per_example, w).numpy()
    full_x = tape.jacobian(h, x).numpy()
    rows = full_x[np.arange(batch), :, np.arange(batch), :]
    np.testing.assert_allclose(tape.per_example_gradients(per_example, w).numpy(), full_w, rtol=1e-12)
    np.testing.assert_allclose(tape.batch_jacobian(h, x).numpy(), rows, rtol=1e-12)
    with jt.GradientTape() as enclosing:
        enclosing.watch([x, w])
        recorded_w = tape.per_example_gradients(per_example, w).numpy()
        recorded_x = tape.batch_jacobian(h, x).numpy()
    np.testing.assert_allclose(recorded_w, full_w, rtol=1e-12)
    np.testing.assert_allclose(recorded_x, rows, rtol=1e-12)


# -- which path: the recorded one only when an enclosing tape tracks what the derivative reads ---------
def _chain(tape, x, n):
    y = x
    for _ in range(n):
        y = jt.sin(y) * x + 0.5 * y
    return y


@pytest.mark.parametrize("method", ["gradient", "jacobian", "hessian"])
def test_an_unrelated_recording_tape_keeps_the_compiled_path(method):
    counts = []
    for n in (100, 1000):
        x = jt.constant(0.3)
        with jt.GradientTape(persistent=True) as tape:
            tape.watch(x)
            y = _chain(tape, x, n)
        getattr(tape, method)(y, x)        # compile and warm
        with jt.GradientTape() as unrelated:
            unrelated.watch(jt.constant(1.0))
            counts.append(_count_python_calls(lambda: getattr(tape, method)(y, x))[0])
            assert not unrelated._records
    assert counts[0] == counts[1]


def test_a_tape_tracking_what_the_gradient_reads_gets_it_recorded():
    x = jt.constant(0.3)
    c = jt.constant(2.0)
    with jt.GradientTape(persistent=True) as tape:
        tape.watch(x)
        y = x * x * c
    with jt.GradientTape() as outer:
        outer.watch(c)                               # only the constant: d/dc of dy/dx = 2x
        g = tape.gradient(y, x)
    assert float(g) == pytest.approx(1.2)
    assert float(outer.gradient(g, c)) == pytest.approx(0.6)


@pytest.mark.parametrize("method", ["batch_jacobian", "per_example_gradients"])
def test_recorded_batch_derivatives_take_passes_independent_of_b(method, monkeypatch):
    passes = []
    original = jt.recorded.gradient

    def counting(*args):
        passes.append(1)
        return original(*args)
    monkeypatch.setattr(jt.recorded, "gradient", counting)
    counts = []
    for batch in (4, 64):
        x = jt.constant(np.random.default_rng(0).uniform(-1, 1, (batch, 3)))
        w = jt.Variable(np.ones((3, 2)))
        with jt.GradientTape(persistent=True) as tape:
            tape.watch(x)
            y = jt.tanh(jt.matmul(x, w))
            losses = jt.reduce_sum(y, axis=1)
        passes.clear()
        with jt.GradientTape() as enclosing:
            enclosing.watch([x, w])
            result = tape.batch_jacobian(y, x) if method == "batch_jacobian" else tape.per_example_gradients(losses, w)
        counts.append(len(passes))
        expected = tape.batch_jacobian(y, x) if method == "batch_jacobian" else tape.per_example_gradients(losses, w)
        np.testing.assert_allclose(result.numpy(), expected.numpy(), rtol=1e-12)
    assert counts[0] == counts[1]


@pytest.mark.parametrize("batch", [1, 3])
def test_recorded_per_example_gradients_of_parameters_computed_from_the_sources(batch):
    """Parameters reach the rows through parameter-only ops (a scale, a square, a transpose): the recorded
    path adds their recorded Jacobians; it agrees with the compiled sweep and stays differentiable."""
    rng = np.random.default_rng(batch)
    x = jt.constant(rng.uniform(-1, 1, (batch, 4)))
    w = jt.Variable(rng.uniform(-1, 1, (3, 4)))
    b = jt.Variable(rng.uniform(-1, 1, (3,)))
    with jt.GradientTape() as outer:
        with jt.GradientTape(persistent=True) as tape:
            h = jt.tanh(jt.matmul(x, jt.transpose(w * 2.0)) + b * b)
            losses = jt.reduce_sum(jt.square(h), axis=1)
        with outer.stop_recording():
            compiled = tape.per_example_gradients(losses, [w, b])
        recorded = tape.per_example_gradients(losses, [w, b])
        total = jt.reduce_sum(recorded[0]) + jt.reduce_sum(recorded[1])
    for c, r in zip(compiled, recorded):
        np.testing.assert_allclose(r.numpy(), c.numpy(), rtol=1e-12, atol=1e-14)
    gw, gb = outer.gradient(total, [w, b])      # the recorded per-example gradients are differentiable again

    def total_at(wv, bv):
        w2, b2 = jt.Variable(wv), jt.Variable(bv)
        with jt.GradientTape() as t:
            out = jt.reduce_sum(jt.square(jt.tanh(jt.matmul(x, jt.transpose(w2 * 2.0)) + b2 * b2)), axis=1)
        return sum(float(jt.reduce_sum(g)) for g in t.per_example_gradients(out, [w2, b2]))
    w0, b0 = w.numpy(), b.numpy()
    e = np.zeros_like(w0)
    e[1, 2] = 1e-6
    assert float(gw.numpy()[1, 2]) == pytest.approx((total_at(w0 + e, b0) - total_at(w0 - e, b0)) / 2e-6, rel=1e-5)
    e = np.zeros_like(b0)
    e[0] = 1e-6
    assert float(gb.numpy()[0]) == pytest.approx((total_at(w0, b0 + e) - total_at(w0, b0 - e)) / 2e-6, rel=1e-5)


def test_a_gradient_then_hvps_and_a_hessian_share_one_reverse_sweep(monkeypatch):
    """On a persistent tape the cotangents of the loss are computed once: the gradient, every HVP and the
    Hessian after it reuse them (and give the numbers a fresh tape gives)."""
    from jitape import backend
    sweeps = []
    reverse = backend.CPU.reverse
    monkeypatch.setattr(backend.CPU, "reverse", lambda self, *a: (sweeps.append(1), reverse(self, *a))[1])
    rng = np.random.default_rng(0)
    points, centers = jt.constant(rng.normal(size=(50, 3))), jt.constant(rng.normal(size=(4, 3)))

    def kmeans(tape):
        with tape:
            tape.watch(centers)
            distances = jt.reduce_sum(jt.square(points[:, None, :] - centers[None]), axis=2)
            return jt.reduce_sum(jt.reduce_min(distances, axis=1))

    tape = jt.GradientTape(persistent=True)
    cost = kmeans(tape)
    g = tape.gradient(cost, centers)
    hvps = [tape.hessian_vector_product(cost, centers, v) for v in (jt.ones((4, 3), "float64"), centers)]
    h = tape.hessian(cost, centers)
    assert len(sweeps) == 1
    for i, v in enumerate((jt.ones((4, 3), "float64"), centers)):
        fresh = jt.GradientTape(persistent=True)
        c = kmeans(fresh)
        np.testing.assert_array_equal(hvps[i].numpy(), fresh.hessian_vector_product(c, centers, v).numpy())
    fresh = jt.GradientTape(persistent=True)
    c = kmeans(fresh)
    np.testing.assert_array_equal(g.numpy(), fresh.gradient(c, centers).numpy())
    np.testing.assert_array_equal(h.numpy(), fresh.hessian(c, centers).numpy())
    np.testing.assert_allclose(h.numpy().reshape(12, 12) @ np.ones(12), hvps[0].numpy().reshape(-1), rtol=1e-12)


@pytest.mark.parametrize("n", [100, 1 << 16])
def test_a_gradient_lent_from_the_workspace_survives_later_sweeps(n):
    """A large gradient is a read-only view of the workspace adjoint, not a copy: later gradients must take
    another buffer while it lives, and give the same numbers as copies do."""
    rng = np.random.default_rng(n)
    xs = [jt.constant(rng.standard_normal(n)) for _ in range(3)]

    def gradient(x):
        with jt.GradientTape() as tape:
            tape.watch(x)
            y = jt.reduce_logsumexp(x * 2.0)
        return tape.gradient(y, x)

    held = [gradient(x) for x in xs]        # each sweep while the earlier gradients live
    for x, g in zip(xs, held):
        v = 2.0 * x.numpy()
        expected = 2.0 * np.exp(v - v.max()) / np.exp(v - v.max()).sum()
        np.testing.assert_allclose(g.numpy(), expected, rtol=1e-12, atol=1e-300)
        assert g.numpy().flags.writeable       # .numpy() copies
    if n >= jt.tensor.VIEWS_FROM:
        assert not held[0]._value.flags.writeable and held[0]._value.base is not None
    else:       # views of an adjoint each sweep allocated for itself: writable, as a copy is
        assert held[0]._value.flags.writeable and held[0]._value.base is not None
        assert not np.shares_memory(held[0]._value, held[1]._value)
    assert np.array_equal(gradient(xs[0]).numpy(), held[0].numpy())


def test_small_gradients_of_one_sweep_are_views_that_do_not_overlap():
    a, b = jt.constant(np.arange(3.0)), jt.constant(np.arange(4.0))
    with jt.GradientTape() as tape:
        tape.watch([a, b])
        y = jt.reduce_sum(a * a) + jt.reduce_sum(b * 3.0)
    ga, gb = tape.gradient(y, [a, b])
    assert ga._value.base is not None and ga._value.base is gb._value.base      # one adjoint, lent
    ga._value[:] = -1.0         # theirs alone: writing one changes neither the other nor a later gradient
    np.testing.assert_array_equal(gb.numpy(), [3.0] * 4)
    with jt.GradientTape() as tape:
        tape.watch(a)
        y = jt.reduce_sum(a * a)
    np.testing.assert_array_equal(tape.gradient(y, a).numpy(), [0.0, 2.0, 4.0])


def test_workspace_buffers_are_reused_once_no_gradient_views_them():
    x = jt.constant(np.random.default_rng(0).standard_normal(1 << 16))

    def gradient():
        with jt.GradientTape() as tape:
            tape.watch(x)
            y = jt.reduce_sum(jt.exp(x))
        return tape.gradient(y, x)

    from jitape.recycling import workspace
    gradient()
    first = weakref.ref(workspace.buffers[("adjoint", np.dtype(np.float64))])     # a reference would hold it
    gradient()
    assert workspace.buffers[("adjoint", np.dtype(np.float64))] is first()     # the gradient died: reused
    held = gradient()
    gradient()
    assert workspace.buffers[("adjoint", np.dtype(np.float64))] is not first()  # held views the old one
    np.testing.assert_array_equal(held.numpy(), np.exp(x.numpy()))
