"""Jacobians, batch Jacobians and Hessians against their definitions: stacked gradients, diagonal blocks,
finite differences of the gradient, and the recorded (nested) path against the compiled one."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import jitape as jt
import jitape.program
import jitape.recycling
from jitape_kernels import opcodes as oc

BATCH_FEATURES = st.tuples(st.integers(1, 4), st.integers(1, 3), st.integers(1, 3))


def _mlp(x, w1, w2):
    return jt.tanh(jt.matmul(jt.nn.elu(jt.matmul(x, w1)), w2))


def _mlp_inputs(dims, seed):
    """x (batch, features) and the two weight matrices of _mlp, float64."""
    b, f, h = dims
    rng = np.random.default_rng(seed)
    return (jt.constant(rng.normal(size=(b, f))), jt.constant(rng.normal(size=(f, h))),
            jt.constant(rng.normal(size=(h, 2))))


@settings(max_examples=15, deadline=None)
@given(BATCH_FEATURES, st.integers(0, 2**16))
def test_jacobian_equals_stacked_gradients(dims, seed):
    x, w1, w2 = _mlp_inputs(dims, seed)
    with jt.GradientTape(persistent=True) as tape:
        tape.watch([x, w1])
        y = _mlp(x, w1, w2)
    jx, jw = tape.jacobian(y, [x, w1])
    assert jx.shape == y.shape + x.shape and jw.shape == y.shape + w1.shape
    for idx in np.ndindex(y.shape):
        seed_ct = np.zeros(y.shape)
        seed_ct[idx] = 1
        gx, gw = tape.gradient(y, [x, w1], output_gradients=seed_ct)
        np.testing.assert_allclose(jx.numpy()[idx], gx.numpy(), rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(jw.numpy()[idx], gw.numpy(), rtol=1e-12, atol=1e-14)


@settings(max_examples=15, deadline=None)
@given(BATCH_FEATURES, st.integers(0, 2**16))
def test_batch_jacobian_is_the_diagonal_of_the_jacobian_on_both_paths(dims, seed):
    x, w1, w2 = _mlp_inputs(dims, seed)
    with jt.GradientTape(persistent=True) as tape:
        tape.watch(x)
        y = _mlp(x, w1, w2)
    compiled = tape.batch_jacobian(y, x).numpy()
    full = tape.jacobian(y, x).numpy()
    np.testing.assert_allclose(compiled, np.einsum("bibj->bij", full), rtol=1e-12, atol=1e-14)
    with jt.GradientTape() as enclosing:
        enclosing.watch(x)
        recorded = tape.batch_jacobian(y, x).numpy()
    np.testing.assert_allclose(recorded, compiled, rtol=1e-12, atol=1e-14)


def test_batch_jacobian_names_the_instruction_that_mixes_rows():
    x = jt.constant(np.arange(6.0).reshape(3, 2))
    with jt.GradientTape(persistent=True) as tape:
        tape.watch(x)
        y = x - jt.reduce_mean(x, axis=0)
    with pytest.raises(ValueError, match=r"mixes rows of the batch \(op sum\)"):
        tape.batch_jacobian(y, x)
    assert tape.jacobian(y, x).shape == (3, 2, 3, 2)     # the tape is still usable


@settings(max_examples=15, deadline=None)
@given(hnp.arrays(np.float64, st.integers(1, 4), elements=st.floats(-1.5, 1.5)), st.integers(0, 2**16))
def test_hessian_matches_finite_differences_of_the_gradient(xv, seed):
    a = np.random.default_rng(seed).normal(size=(xv.size, xv.size))

    def f(x):
        return jt.reduce_sum(jt.sin(jt.matmul(a, x)) * x) + jt.reduce_sum(x ** 3)

    def grad(v):
        x = jt.constant(v)
        with jt.GradientTape() as t:
            t.watch(x)
            y = f(x)
        return t.gradient(y, x).numpy()

    x = jt.constant(xv)
    with jt.GradientTape(persistent=True) as tape:
        tape.watch(x)
        y = f(x)
    h = tape.hessian(y, x).numpy()
    step = 1e-6
    numeric = np.stack([(grad(xv + step * e) - grad(xv - step * e)) / (2 * step) for e in np.eye(xv.size)], 1)
    np.testing.assert_allclose(h, numeric, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(h, h.T, rtol=1e-12, atol=1e-12)
    v = np.random.default_rng(seed + 1).normal(size=xv.size)
    np.testing.assert_allclose(tape.hessian_vector_product(y, x, v).numpy(), h @ v, rtol=1e-10, atol=1e-12)


def test_hessian_rejects_non_scalar_targets_and_wrong_v_shapes():
    x = jt.constant([1.0, 2.0])
    with jt.GradientTape(persistent=True) as tape:
        tape.watch(x)
        y = x * x
        s = jt.reduce_sum(y)
    with pytest.raises(ValueError, match=r"scalar Tensor, got shape \(2,\)"):
        tape.hessian(y, x)
    with pytest.raises(ValueError, match=r"v has shape \(3,\), expected the source's shape \(2,\)"):
        tape.hessian_vector_product(s, x, jt.constant([1.0, 2.0, 3.0]))
    with pytest.raises(ValueError, match="v contains NaN or Inf"):
        tape.hessian_vector_product(s, x, [np.nan, 1.0])
    with pytest.raises(TypeError, match="v must be a float array, got dtype <U1"):
        tape.hessian_vector_product(s, x, ["a", "b"])
    with pytest.raises(TypeError, match="source must be a float Tensor"):
        tape.hessian(s, jt.constant([1, 2]))
    np.testing.assert_allclose(tape.hessian(s, x).numpy(), 2 * np.eye(2))
    np.testing.assert_allclose(tape.hessian_vector_product(s, x, [1.0, -1.0]).numpy(), [2.0, -2.0])


def test_jacobian_chunks_give_the_same_result(monkeypatch):
    x = jt.constant(np.linspace(-2, 2, 11))
    with jt.GradientTape(persistent=True) as tape:
        tape.watch(x)
        y = jt.sigmoid(jt.reshape(x, (11, 1)) * jt.constant(np.linspace(0, 1, 5)))
        total = jt.reduce_sum(y * y)
    whole = tape.jacobian(y, x).numpy()
    hessian = tape.hessian(total, x).numpy()
    monkeypatch.setattr(jt.config, "jacobian_memory_bytes", 64)
    np.testing.assert_array_equal(tape.jacobian(y, x).numpy(), whole)
    np.testing.assert_array_equal(tape.hessian(total, x).numpy(), hessian)


def _recorded(tape, fn):
    """fn() under an enclosing tape that watches what `tape` recorded: the Python VJP path, independent of the
    compiled sweeps."""
    with jt.GradientTape() as enclosing:
        enclosing.watch([out for _, _, out, _ in tape.records()])
        return fn()


@settings(max_examples=10, deadline=None)
@given(st.integers(0, 2**16), st.sampled_from([None, 64, 200]))
def test_forward_mode_jacobian_of_several_sources_in_chunks(seed, budget):
    """Sources narrower than the target take forward mode; chunks may split a source's columns."""
    rng = np.random.default_rng(seed)
    a, b = jt.constant(rng.normal(size=3)), jt.constant(rng.normal(size=(2, 2)))
    m = rng.normal(size=(6, 3))
    with jt.GradientTape(persistent=True) as tape:
        tape.watch([a, b])
        y = jt.tanh(jt.reshape(jt.matmul(m, a[:, None]), (2, 3)) * jt.reduce_sum(b * b))
        y = jt.concat([y, jt.exp(y)], axis=1) + jt.reshape(b, (4,))[0]       # y: (2, 6), 12 > 7 columns
    from jitape.execute import lowered, source_jacobians
    ja, jb = source_jacobians(lowered(tape, [y], [a, b]), y.size, [a, b], "reverse")
    old = jt.config.jacobian_memory_bytes
    try:
        if budget:
            jt.config.jacobian_memory_bytes = budget
        fa, fb = tape.jacobian(y, [a, b])
    finally:
        jt.config.jacobian_memory_bytes = old
    ra, rb = _recorded(tape, lambda: tape.jacobian(y, [a, b]))
    np.testing.assert_allclose(fa.numpy(), ja.reshape(2, 6, 3), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(fb.numpy(), jb.reshape(2, 6, 2, 2), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(fa.numpy(), ra.numpy(), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(fb.numpy(), rb.numpy(), rtol=1e-12, atol=1e-14)


def test_forward_mode_batch_jacobian_matches_the_recorded_path(monkeypatch):
    """Fewer source features (2) than target features (5): one tangent sweep, chunked or not."""
    rng = np.random.default_rng(3)
    x = jt.constant(rng.normal(size=(4, 2)))
    w = jt.constant(rng.normal(size=(2, 5)))
    with jt.GradientTape(persistent=True) as tape:
        tape.watch(x)
        y = jt.nn.elu(jt.matmul(x, w)) * jt.reduce_sum(x * x, axis=1, keepdims=True)
    whole = tape.batch_jacobian(y, x).numpy()
    np.testing.assert_allclose(whole, _recorded(tape, lambda: tape.batch_jacobian(y, x)).numpy(), rtol=1e-12, atol=1e-14)
    monkeypatch.setattr(jt.config, "jacobian_memory_bytes", 64)
    np.testing.assert_array_equal(tape.batch_jacobian(y, x).numpy(), whole)


def test_derivatives_of_a_variable_assigned_mid_tape_agree_on_both_paths():
    """Each read of the variable is seeded as the source: gradients, forward-mode Jacobians and
    Hessians all sum over the reads, compiled and recorded alike."""
    v = jt.Variable(np.array([0.5, -1.0]))
    with jt.GradientTape(persistent=True) as tape:
        first = jt.reduce_sum(v ** 3)
        v.assign(v * 2.0)
        second = jt.sin(v) * first
        loss = jt.reduce_sum(second * second)
        wide = jt.concat([second, jt.exp(second), second * v], axis=0)       # 6 > 2: forward mode
    for method, args in (("hessian", (loss, v)), ("jacobian", (wide, v)),
                         ("hessian_vector_product", (loss, v, np.array([1.0, -2.0])))):
        compiled = getattr(tape, method)(*args).numpy()
        recorded = _recorded(tape, lambda: getattr(tape, method)(*args)).numpy()
        np.testing.assert_allclose(compiled, recorded, rtol=1e-10, atol=1e-12, err_msg=method)


def test_float32_hessian_matches_float64():
    values = np.array([0.3, -0.7, 1.1])
    results = []
    for dtype in (np.float32, np.float64):
        x = jt.constant(values.astype(dtype))
        with jt.GradientTape() as tape:
            tape.watch(x)
            y = jt.reduce_sum(jt.nn.softplus(x) * jt.tanh(x)) * jt.reduce_prod(x)
        h = tape.hessian(y, x)
        assert h.dtype == dtype and h.shape == (3, 3)
        results.append(h.numpy())
    np.testing.assert_allclose(results[0], results[1], rtol=1e-5, atol=1e-6)


@settings(max_examples=15, deadline=None)
@given(st.tuples(st.integers(1, 5), st.integers(1, 3), st.integers(1, 4)), st.integers(0, 2**16), st.booleans())
def test_per_example_gradients_equal_one_gradient_per_example(dims, seed, two_d_target):
    b, f, h = dims
    rng = np.random.default_rng(seed)
    xs, ys = rng.normal(size=(b, f)), rng.normal(size=(b, 2))
    params = [jt.Variable(rng.normal(size=s)) for s in [(f, h), (h,), (h, 2), ()]]

    def losses(x, y):
        w1, b1, w2, b2 = params
        err = jt.matmul(jt.nn.elu(jt.matmul(x, w1) + b1), w2) + b2 - y
        return jt.square(err) if two_d_target else jt.reduce_sum(jt.square(err), axis=1)

    with jt.GradientTape(persistent=True) as tape:
        per_row = losses(jt.constant(xs), jt.constant(ys))
    compiled = tape.per_example_gradients(per_row, params)
    with jt.GradientTape() as enclosing:
        enclosing.watch(params)
        recorded = tape.per_example_gradients(per_row, params)
    for i in range(b):
        with jt.GradientTape() as single:
            total = jt.reduce_sum(losses(jt.constant(xs[i:i + 1]), jt.constant(ys[i:i + 1])))
        for c, r, g, p in zip(compiled, recorded, single.gradient(total, params), params):
            assert c.shape == (b,) + p.shape
            np.testing.assert_allclose(c.numpy()[i], g.numpy(), rtol=1e-10, atol=1e-12)
            np.testing.assert_allclose(r.numpy()[i], g.numpy(), rtol=1e-10, atol=1e-12)


def test_per_example_gradients_refuse_unsupported_junctions_and_rowless_targets():
    w = jt.Variable(np.ones((3, 2)))
    x = jt.constant(np.arange(6.0).reshape(3, 2))
    with jt.GradientTape(persistent=True) as tape:
        elementwise = x * w                     # a parameter shaped like the batch, used row by row
        rowless = jt.reduce_sum(w, axis=1)      # depends on no batch data
    with pytest.raises(ValueError, match=r"instruction 0 of the program \(op mul\)"):
        tape.per_example_gradients(elementwise, w)
    with pytest.raises(ValueError, match="does not depend on batch data"):
        tape.per_example_gradients(rowless, w)
    np.testing.assert_array_equal(tape.gradient(elementwise, w).numpy(), x.numpy())


def _row_chain(n_ops):
    """n_ops elementwise ops on batch rows: data rows times a shared parameter, chained; and their sum."""
    data = jt.constant(np.linspace(0.1, 0.9, 12).reshape(4, 3))
    w = jt.Variable(np.array([0.3, -0.2, 0.5]))
    with jt.GradientTape(persistent=True) as tape:
        tape.watch(data)
        y = data
        for _ in range(n_ops // 4):      # sin, *, *, + : four ops a step
            y = jt.sin(y) * w + 0.5 * y
        total = jt.reduce_sum(y)
    return tape, y, total, data, w


@pytest.mark.parametrize("method", ["jacobian", "batch_jacobian", "per_example_gradients", "hessian",
                                    "hessian_vector_product"])
def test_python_calls_independent_of_tape_length(method, monkeypatch):
    from tests.test_tape import _count_python_calls
    monkeypatch.setattr(jitape.program, "_PLANNED_ROWS", 0)     # every tape planned anew
    monkeypatch.setattr(jitape.recycling, "_MALLOC_BYTES", 0)   # both tapes' buffers from the workspace

    def call(tape, y, total, data, w):
        if method == "jacobian":
            return tape.jacobian(y, data)
        if method == "batch_jacobian":
            return tape.batch_jacobian(y, data)
        if method == "hessian":
            return tape.hessian(total, data)
        if method == "hessian_vector_product":
            return tape.hessian_vector_product(total, data, np.ones(data.shape))
        return tape.per_example_gradients(y, w)

    call(*_row_chain(2_000))                 # compile, and size the reused buffers
    counts = {}
    for n in (400, 2_000):
        tape, y, total, data, w = _row_chain(n)
        counts[n], _ = _count_python_calls(lambda: call(tape, y, total, data, w))
    assert counts[400] == counts[2_000], counts


@pytest.mark.parametrize("budget", [None, 200])
@pytest.mark.parametrize("case", ["left", "right", "right vector", "left batched", "right batched",
                                  "right batched source", "right batched vectors", "both", "left interleaved",
                                  "right interleaved"])
def test_matmul_with_the_seeded_source_as_an_operand(case, budget, monkeypatch):
    """A matmul whose operand is the seeded source copies the identity's columns instead of multiplying
    (forward-mode Jacobians and Hessians, possibly in chunks that start mid-source): either operand, a vector
    source (one column: a matrix-vector product), a batch of one shared by the other's items or a batched
    source whose columns each reach one item."""
    rng = np.random.default_rng(5)
    shapes = {"left": ((3, 2), (2, 5)), "right": ((4, 3), (3, 2)), "right vector": ((4, 3), (3, 1)),
              "left batched": ((2, 3, 2), (2, 4)), "right batched": ((2, 3, 4), (4, 2)),
              "right batched source": ((2, 3, 4), (2, 4, 2)), "right batched vectors": ((3, 4, 3), (3, 3, 1)),
              "both": ((3, 3), (3, 3)), "left interleaved": ((2, 3, 2), (3, 2, 2)),
              "right interleaved": ((2, 3, 2), (3, 2, 2))}
    x_shape, other_shape = shapes[case]
    source = jt.constant(rng.normal(size=other_shape if case.startswith("right") else x_shape))
    other = jt.constant(rng.normal(size=x_shape if case.startswith("right") else other_shape))
    if budget:
        monkeypatch.setattr(jt.config, "jacobian_memory_bytes", budget)
    with jt.GradientTape(persistent=True) as tape:
        tape.watch(source)
        if case == "both":
            y = jt.matmul(source, source)
        elif case == "left interleaved":      # einsum's batch k inside the rows: items interleaved (inner)
            y = jt.einsum("kij,nkj->nki", other, source)
        elif case == "right interleaved":
            y = jt.einsum("nkj,kjl->nkl", other, source)
        elif case.startswith("right"):
            y = jt.matmul(other, source)
        else:
            y = jt.matmul(source, other)
        wide = jt.concat([jt.reshape(y, (-1,)), jt.reshape(jt.sin(y), (-1,))], axis=0)   # wider than the source
        loss = jt.reduce_sum(jt.tanh(y) * y)
    if case.endswith("interleaved"):
        program = tape.program(y, source)
        (r,) = np.flatnonzero(program.code[:, oc.OP] == oc.MATMUL)
        operand = program.code[r, oc.IN1 if case.startswith("right") else oc.IN0]
        # the seeded source is the interleaved matmul's own operand
        assert program.iattr[program.code[r, oc.ATTR] + 5] == 3 and operand == program.sources[0]
    for method, target in (("jacobian", wide), ("hessian", loss)):
        compiled = getattr(tape, method)(target, source).numpy()
        recorded = _recorded(tape, lambda: getattr(tape, method)(target, source)).numpy()
        np.testing.assert_allclose(compiled, recorded, rtol=1e-10, atol=1e-12, err_msg=method)


# functions of a with a NaN, an infinity or a partial of 0 in some entries: the NaNs of b and of a reach
# the Jacobian through products of partials; the matmul mixes entries of a row
NAN_PATHS = {
    "relu": lambda a, b, w: jt.nn.relu(a) * b,
    "abs": lambda a, b, w: jt.abs(a) * b,
    "clip": lambda a, b, w: jt.clip_by_value(a, 0.0, 1.5) * b,
    "maximum": lambda a, b, w: jt.maximum(a, b) * b,
    "reduce_max": lambda a, b, w: jt.reduce_max(a * b, axis=1, keepdims=True) * b,
    "matmul": lambda a, b, w: jt.tanh(jt.matmul(a * b, w)),
}


def _with_special_values(seed):
    """a, b (8, 8) and w (8, 8), float64, with NaN, ±inf, zeros and ties in some examples (rows) only."""
    rng = np.random.default_rng(seed)
    a, b = rng.choice([-1.5, -0.5, 0.0, 0.5, 1.5], (8, 8)), rng.standard_normal((8, 8))
    b[1, 2], a[3, 5], b[3, 0], b[6, 6], a[6, 1] = np.nan, np.nan, np.inf, 0.0, -np.inf
    a[4] = b[4]
    return jt.constant(a), jt.constant(b), jt.constant(rng.standard_normal((8, 8)))


def _equal_where_neither_is_nan(actual, expected):
    """Equal wherever neither is NaN (infinities included)."""
    comparable = ~np.isnan(actual) & ~np.isnan(expected)
    np.testing.assert_allclose(actual[comparable], expected[comparable], rtol=1e-12, atol=1e-14)


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")
@pytest.mark.parametrize("name", sorted(NAN_PATHS))
def test_every_mode_agrees_where_neither_is_nan_and_nan_stays_in_its_example(name, monkeypatch):
    """Where values or partials are NaN or infinite, a product with a structural zero is NaN (IEEE, as in
    BLAS and the peers), so a NaN spreads along the row of the Jacobian in forward mode and along the
    column in reverse mode. Every path (recorded, compiled reverse, forward mode, chunked, per example,
    replayed, forward over reverse) gives the same value wherever neither is NaN, and a NaN never leaves its
    example."""
    a, b, w = _with_special_values(0)
    f = NAN_PATHS[name]
    with jt.GradientTape(persistent=True) as tape:
        tape.watch([a, b])
        y = f(a, b, w)
        wide = jt.tile(y, [1, 72 // y.shape[1]])          # wider than a: the forward-mode sweeps
    pairs = [(t, s) for t in (y, wide) for s in (a, b)]
    compiled = [tape.jacobian(t, s).numpy() for t, s in pairs]
    compiled_batch = [tape.batch_jacobian(t, s).numpy() for t, s in pairs]
    recorded = _recorded(tape, lambda: [tape.jacobian(t, s).numpy() for t, s in pairs])
    recorded_batch = _recorded(tape, lambda: [tape.batch_jacobian(t, s).numpy() for t, s in pairs])
    replayed = jt.jacobian(lambda a: jt.tile(f(a, b, w), [1, 72 // y.shape[1]]))
    replayed(a)
    monkeypatch.setattr(jt.config, "jacobian_memory_bytes", 64)
    chunked = [tape.jacobian(t, s).numpy() for t, s in pairs]
    for actual, expected in zip(compiled + compiled_batch + chunked + [replayed(a).numpy()],
                                recorded + recorded_batch + compiled + [compiled[2]]):
        _equal_where_neither_is_nan(actual, expected)
    examples = np.arange(8)
    special = ~(np.isfinite(a.numpy()) & np.isfinite(b.numpy())).all(axis=1)
    for full, per_example in zip(compiled, compiled_batch):
        _equal_where_neither_is_nan(per_example, full[examples, :, examples])
        assert np.isfinite(per_example[~special]).all()

    with jt.GradientTape(persistent=True) as second:
        second.watch(a)
        z = jt.reduce_sum(f(a, b, w) * a)
    hessian = second.hessian(z, a).numpy()
    _equal_where_neither_is_nan(hessian, _recorded(second, lambda: second.hessian(z, a)).numpy())
    _equal_where_neither_is_nan(jt.hessian(lambda x: jt.reduce_sum(f(x, b, w) * x))(a).numpy(), hessian)
