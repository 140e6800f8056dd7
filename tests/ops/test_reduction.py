"""reduce_logsumexp, one LOGSUMEXP instruction, on values the registry's [-2, 2] draws never reach: entries far
from 0, -inf entries, infinite and NaN results, and lines longer than the forward kernel's running lanes (with a
tail), along a contiguous axis and across rows, on every path (eager, replayed, K columns, tangents, second
order, the recorded VJP, per-example). The replayed maxima and minima of rows of every length around the widths of
the kernel's vector loop, with NaN anywhere, and that kernel against numpy on infinities, signed zeros and NaN."""
import numpy as np
import pytest
import scipy.special

import jitape as jt
from jitape.execute import lowered, source_jacobians
from jitape_kernels import opcodes as oc
from jitape_kernels.cpu import reduction
from jitape_kernels.cpu.reduction import SHORT_ROWS, short_row_sums
from jitape_kernels.cpu.workspace import LANES
from tests.test_elementwise import _same_bits


def _softmax(x, axis):
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


def _nested(f, x):
    """(a persistent outer tape watching x, f(x), and f's gradient at x recorded on that tape: its Python VJPs)."""
    with jt.GradientTape(persistent=True) as outer:
        outer.watch(x)
        with jt.GradientTape() as inner:
            inner.watch(x)
            value = f(x)
        gradient = inner.gradient(value, x)
    return outer, value, gradient


def _rows(axis, n, rng, offset=0.0):
    """(3, n) or (n, 3) entries around `offset`, reduced along n (axis 1: contiguous rows; axis 0: across rows)."""
    shape = (3, n) if axis == 1 else (n, 3)
    return offset + rng.normal(scale=3.0, size=shape)


CASES = {
    "far from 0": lambda axis, rng: _rows(axis, 7, rng, offset=1000.0),
    "far below 0": lambda axis, rng: _rows(axis, 7, rng, offset=-1000.0),
    "-inf entries": lambda axis, rng: np.where(_rows(axis, 6, rng) > 1.0, -np.inf, _rows(axis, 6, rng)),
    "long lines": lambda axis, rng: _rows(axis, 16 * LANES + 37, rng, offset=500.0),
}


@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("case", sorted(CASES))
def test_logsumexp_values_and_gradients_agree_on_every_path(case, axis):
    x0 = CASES[case](axis, np.random.default_rng(7))
    x0[np.isinf(x0).all(axis=axis, keepdims=True) & np.ones_like(x0, bool)] = 0.0    # no all -inf line here
    expected = scipy.special.logsumexp(x0, axis=axis)
    softmax = _softmax(x0, axis)
    x = jt.constant(x0)

    def f(v):
        return jt.reduce_logsumexp(v, axis=axis)

    np.testing.assert_allclose(f(x).numpy(), expected, rtol=1e-13)
    np.testing.assert_allclose(jt.function(f)(x).numpy(), expected, rtol=1e-13)        # the compiled forward
    weights = jt.constant(np.arange(1.0, 4.0))

    def loss(v):
        return jt.reduce_sum(f(v) * weights)

    expected_grad = softmax * (np.arange(1.0, 4.0)[None, :] if axis == 0 else np.arange(1.0, 4.0)[:, None])
    with jt.GradientTape(persistent=True) as tape:
        tape.watch(x)
        y = f(x)
        total = jt.reduce_sum(y * weights)
    np.testing.assert_allclose(tape.gradient(total, x).numpy(), expected_grad, rtol=1e-12, atol=1e-300)
    np.testing.assert_allclose(jt.grad(loss)(x).numpy(), expected_grad, rtol=1e-12, atol=1e-300)
    jacobian = np.zeros((3,) + x0.shape)
    for r in range(3):
        jacobian[(r,) + ((slice(None), r) if axis == 0 else (r, slice(None)))] = (
            softmax[:, r] if axis == 0 else softmax[r])
    np.testing.assert_allclose(tape.jacobian(y, x).numpy(), jacobian, rtol=1e-12, atol=1e-300)
    program = lowered(tape, [y], [x])
    for mode in ("reverse", "forward"):     # K columns of cotangents, and of tangents
        (got,) = source_jacobians(program, y.size, [x], mode)
        np.testing.assert_allclose(got.reshape(jacobian.shape), jacobian, rtol=1e-12, atol=1e-300, err_msg=mode)
    np.testing.assert_allclose(jt.jacobian(f)(x).numpy(), jacobian, rtol=1e-12, atol=1e-300)


@pytest.mark.parametrize("axis", [0, 1])
def test_logsumexp_hessians_far_from_0_by_second_order_sweeps_and_the_recorded_vjp(axis):
    """The Hessian of a line's logsumexp is diag(p) - p p^T (p its softmax): the compiled forward-over-reverse
    sweep, jt.hessian's replay, and nested tapes (the recorded VJP, differentiated again) all give it."""
    x0 = _rows(axis, 5, np.random.default_rng(3), offset=800.0)
    x0[0, 0] = -np.inf
    p = _softmax(x0, axis)
    expected = np.zeros(x0.shape * 2)
    for line in range(3):
        index = (lambda a: (a, line)) if axis == 0 else (lambda a: (line, a))
        for a in range(5):
            for b in range(5):
                expected[index(a) + index(b)] = p[index(a)] * ((a == b) - p[index(b)])
    x = jt.constant(x0)

    def loss(v):
        return jt.reduce_sum(jt.reduce_logsumexp(v, axis=axis))

    outer, value, gradient = _nested(loss, x)
    np.testing.assert_allclose(outer.jacobian(gradient, x).numpy(), expected, atol=1e-15)
    np.testing.assert_allclose(outer.hessian(value, x).numpy(), expected, atol=1e-15)
    np.testing.assert_allclose(jt.hessian(loss)(x).numpy(), expected, atol=1e-15)


def test_logsumexp_results_are_inf_nan_or_minus_inf_where_numpy_s_are():
    x0 = np.array([[1.0, np.inf, 2.0], [np.nan, 0.0, 1.0], [-np.inf, -np.inf, -np.inf], [-np.inf, 1e308, 1e308]])
    with np.errstate(divide="ignore", invalid="ignore"):
        expected = np.log(np.sum(np.exp(x0 - 1e308 * (x0 == 1e308)), axis=1)) + 1e308 * np.any(x0 == 1e308, axis=1)
    f = jt.function(lambda v: jt.reduce_logsumexp(v, axis=1))
    with np.errstate(divide="ignore"):      # numpy's log(0) warns, as in np.log(np.sum(np.exp(x0), axis=1))
        eager = jt.reduce_logsumexp(jt.constant(x0), axis=1).numpy()
        traced, replayed = f(jt.constant(x0)).numpy(), f(jt.constant(x0)).numpy()
    for got in (eager, traced, replayed):
        np.testing.assert_array_equal(got, expected)
    assert jt.reduce_logsumexp(jt.constant(np.zeros((2, 0))), axis=1).numpy().tolist() == [-np.inf, -np.inf]
    assert f(jt.constant(np.zeros((2, 0)))).numpy().tolist() == [-np.inf, -np.inf]


def test_per_example_gradients_of_logsumexps_over_each_example_and_over_the_parameters():
    """One logsumexp per example's features (a row instruction, one column) and one over the parameters alone,
    shared by every example (a parameter instruction, a column per example)."""
    rng = np.random.default_rng(5)
    x0, w0 = rng.normal(size=(4, 6)) * 30.0, rng.normal(size=6)
    x, w = jt.constant(x0), jt.Variable(w0)
    with jt.GradientTape() as tape:
        losses = jt.reduce_logsumexp(x * w, axis=1) + jt.reduce_logsumexp(w * 50.0)
    (got,) = tape.per_example_gradients(losses, [w])
    np.testing.assert_allclose(got.numpy(), _softmax(x0 * w0, 1) * x0 + 50.0 * _softmax(w0 * 50.0, 0),
                               rtol=1e-12, atol=1e-300)


def test_a_traced_logsumexp_is_one_instruction_whose_replay_shifts_by_its_own_maximum():
    small, big = np.array([1.0, 2.0, 3.0]), np.array([1000.0, 1001.0, 999.0])
    concrete = jt.function(lambda v: jt.reduce_logsumexp(v)).twin().concrete(jt.constant(small))
    assert [oc.NAMES[op] for op in concrete.code[:, oc.OP]] == ["logsumexp"]
    f = jt.function(lambda v: jt.reduce_logsumexp(v))
    f(jt.constant(small))
    assert float(f(jt.constant(big))) == pytest.approx(scipy.special.logsumexp(big), rel=1e-15)
    g = jt.grad(lambda v: jt.reduce_logsumexp(v))
    g(jt.constant(small))
    np.testing.assert_allclose(g(jt.constant(big)).numpy(), _softmax(big, 0), rtol=1e-12)
    assert f.trace_count == 1


@pytest.mark.parametrize("reduce,reference", [(jt.reduce_max, np.max), (jt.reduce_min, np.min)])
@pytest.mark.parametrize("n", [1, 7, 8, 9, 17, 31, 32, 33, 63, 64, 65, 100, 1000, 4133])
def test_replayed_row_extrema_equal_numpy_s_with_nan_anywhere(reduce, reference, n):
    """A row's extremum runs in one vector loop (8 or 16 entries a vector, several vectors an iteration, then a
    tail): the replay's extrema and their gradients (the cotangent at the extremum) equal numpy's at every length
    around those widths; a NaN anywhere, the tail included, makes its row's result NaN."""
    rng = np.random.default_rng(n)
    x0 = rng.normal(size=(12, n))
    for row, at in enumerate(range(0, min(n, 11))):
        x0[row + 1, at] = np.nan
    x0[0] = rng.permutation(np.arange(float(n)))        # a distinct extremum: the gradient is one entry
    f = jt.function(lambda v: reduce(v, axis=1))
    g = jt.grad(lambda v: reduce(v, axis=1)[0])
    x = jt.constant(x0)
    for _ in range(2):      # traced, then replayed
        np.testing.assert_array_equal(f(x).numpy(), reference(x0, axis=1))
        expected = np.zeros_like(x0)
        expected[0, np.argmax(x0[0]) if reduce is jt.reduce_max else np.argmin(x0[0])] = 1.0
        np.testing.assert_array_equal(g(x).numpy(), expected)


@pytest.mark.parametrize("largest", [True, False], ids=["max", "min"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_row_extrema_kernel_equals_numpy_on_infinities_signed_zeros_and_nan(largest, dtype):
    """Rows of every length to 300 drawn from signed zeros, infinities and ordinary values, NaN in some: the
    kernel's extrema equal numpy's (a NaN anywhere gives NaN; of two tied zeros either may come back, as from
    numpy, whose choice depends on their order) in the rows' dtype."""
    rng = np.random.default_rng(4)
    for n in range(1, 300, 7):
        x2 = rng.choice(np.array([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, 0.5], dtype), (24, n))
        x2[::5, rng.integers(n)] = np.nan
        out = np.empty(24, dtype)
        reduction._extrema_of_rows(x2, out, largest)
        np.testing.assert_array_equal(out, np.max(x2, axis=1) if largest else np.min(x2, axis=1))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [2, 7, 8, 10, 17, SHORT_ROWS])
def test_eager_sums_of_many_short_rows_run_compiled_and_equal_numpy_s_and_replays_bit_for_bit(n, dtype,
                                                                                               monkeypatch):
    import jitape.ops.reduction as reduction
    calls = []
    monkeypatch.setattr(reduction, "short_row_sums", lambda *args: calls.append(1) or short_row_sums(*args))
    rng = np.random.default_rng(n)
    x = rng.standard_normal((40000 // n + 1, n)).astype(dtype)
    x.reshape(-1)[rng.choice(x.size, 16, replace=False)] = [np.nan, np.inf, -np.inf, -0.0] * 4
    summed = jt.function(lambda a: jt.reduce_sum(a, 1))
    _same_bits(jt.reduce_sum(jt.constant(x), 1).numpy(), np.add.reduce(x, 1))
    summed(jt.constant(x[::-1].copy()))         # traced
    _same_bits(summed(jt.constant(x)).numpy(), np.add.reduce(x, 1))       # replayed
    _same_bits(jt.reduce_sum(jt.transpose(jt.constant(x.T.copy())), 1).numpy(), np.add.reduce(x, 1))
    assert len(calls) == 3          # eager, the trace's eager value, and the transposed view (copied first)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("reduce", [jt.reduce_max, jt.reduce_min])
def test_tied_extrema_share_the_cotangent_with_the_compiled_sweep_s_bits_on_the_recorded_path(reduce, axis, dtype):
    """Ties split a reduced entry's cotangent evenly (as TensorFlow): the recorded VJP (under an enclosing tape,
    eager and replayed) divides each reduced entry's cotangent by its tie count once, as the compiled reverse
    does, so both give one number (w / 3 and w * (1 / 3) differ in the last bit for some of these weights); a
    NaN extremum passes none of it. The K-column reverse, forward mode, the batch path and the second-order
    sweeps (compiled and through the recorded gradient) take the same split."""
    low, high = np.arange(6.0)[:, None], np.arange(6.0)[:, None] + 2.5
    x0 = np.concatenate([np.where([True, False, True, True, False, False], low, high),      # three ties each way
                         [[np.nan, 1.0, 1.0, 2.0, 2.0, 0.0]]]).astype(dtype)
    x0 = x0 if axis == 1 else x0.T.copy()
    w0 = (np.arange(7) * 0.7 + 0.1).astype(dtype)
    weights = jt.constant(w0)

    def loss(x):
        return jt.reduce_sum(weights * reduce(x, axis=axis))

    x = jt.constant(x0)
    with jt.GradientTape() as tape:
        tape.watch(x)
        y = loss(x)
    compiled = tape.gradient(y, x).numpy()

    def recorded_gradient(x):
        return _nested(loss, x)[2]

    replayed = jt.function(recorded_gradient)
    for g in (recorded_gradient(x), replayed(x), replayed(x)):
        _same_bits(g.numpy(), compiled)
    extremum = np.max if reduce is jt.reduce_max else np.min
    ties = x0 == extremum(x0, axis=axis, keepdims=True)
    share = np.expand_dims(w0 / dtype(3), axis)
    np.testing.assert_array_equal(compiled, np.where(ties, share, 0).astype(dtype))
    # K columns: the reverse Jacobian's rows are the gradients of w_r y_r (each cotangent divided, then
    # masked); forward mode takes each tied tangent times 1 / 3
    scales = jt.constant((np.arange(9) * 0.7 + 0.1).astype(dtype))
    with jt.GradientTape(persistent=True) as tape:
        tape.watch(x)
        y = reduce(x, axis=axis)
        rows = weights * y
        per_row = jt.reshape(rows, (7, 1))
        wide = jt.reshape(scales, (9, 1)) * jt.reshape(y, (1, 7))      # 63 entries from 42: forward mode
    reverse, forward = tape.jacobian(rows, x).numpy(), tape.jacobian(wide, x).numpy()
    hits = np.stack([ties & (np.arange(7) == r).reshape(share.shape) for r in range(7)])    # per reduced entry
    for r in range(7):
        _same_bits(reverse[r], np.where(hits[r], share, 0).astype(dtype))
    _same_bits(forward, scales.numpy()[:, None, None, None] * np.where(hits, dtype(1) / dtype(3), dtype(0))[None])
    if axis == 1:       # rows as the batch: each example's seeded row through the batch path
        _same_bits(tape.batch_jacobian(per_row, x).numpy()[:, 0], compiled)
    # second order, where the rows are finite: sum w y², H = sum_r 2 w_r hit_r hit_rᵀ / 9, compiled (forward over
    # reverse) and through the recorded gradient (nested tapes)
    finite = jt.constant(x0[:6] if axis == 1 else x0[:, :6])
    hit = hits[:6, :6] if axis == 1 else hits[:6, :, :6]
    flat = hit.reshape(6, -1).astype(np.float64)
    expected = np.einsum("r,ri,rj->ij", 2 * w0[:6].astype(np.float64) / 9, flat, flat)
    squares = lambda v: jt.reduce_sum(weights[:6] * jt.square(reduce(v, axis=axis)))      # noqa: E731
    tape, _, gradient = _nested(squares, finite)
    with jt.GradientTape(persistent=True) as flat_tape:
        flat_tape.watch(finite)
        flat_value = squares(finite)
    for hessian in (tape.jacobian(gradient, finite), flat_tape.hessian(flat_value, finite)):
        np.testing.assert_allclose(hessian.numpy().reshape(expected.shape), expected, rtol=1e-6)
