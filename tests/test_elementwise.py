"""jitape_kernels.cpu.elementwise: the vectorised forward loops give the bits of the per-entry rules they
replace (binary_value, unary_value), and replays running them give eager's (numpy's) values, in both dtypes,
on arrays with NaN, infinities, signed zeros and ties, at sizes that take each replay path (rows inline below
SMALL, rows one by one, fused groups of blocks)."""
import numpy as np
import pytest

import jitape as jt
from jitape_kernels import opcodes as oc
from jitape_kernels.cpu.elementwise import (binary_forward, binary_value, strided_arithmetic, unary_forward,
                                           unary_value, where_forward)
from jitape_kernels.layout import FUSE_MIN_SIZE
from tests.test_replay import _rows_shared

pytestmark = pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")     # eager inf * 0

SPECIAL = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 2.5]

BINARY = {
    "maximum": (oc.MAXIMUM, jt.maximum), "minimum": (oc.MINIMUM, jt.minimum),
    "greater": (oc.GREATER, jt.greater), "greater_equal": (oc.GREATER_EQUAL, jt.greater_equal),
    "less": (oc.LESS, jt.less), "less_equal": (oc.LESS_EQUAL, jt.less_equal),
    "equal": (oc.EQUAL, jt.equal), "not_equal": (oc.NOT_EQUAL, jt.not_equal),
}


def _operands(n, dtype, seed=0):
    """Two arrays of n entries: every pair of SPECIAL values, then random values with ties between a and b."""
    rng = np.random.default_rng(seed)
    pairs = np.array([(a, b) for a in SPECIAL for b in SPECIAL], np.float64)
    a = rng.choice([-1.5, -0.5, 0.0, 0.5, 1.5], n).astype(np.float64)
    b = np.where(rng.random(n) < 0.3, a, rng.standard_normal(n))
    count = min(n, len(pairs))
    a[:count], b[:count] = pairs[:count, 0], pairs[:count, 1]
    return a.astype(dtype), b.astype(dtype)


def _same_bits(actual, expected):
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape and actual.dtype == expected.dtype
    nan = np.isnan(expected) if expected.dtype.kind == "f" else np.zeros(expected.shape, bool)
    np.testing.assert_array_equal(np.isnan(actual) if actual.dtype.kind == "f" else nan, nan)
    assert np.array_equal(actual[~nan].view(np.uint8) if actual.dtype.kind == "f" else actual[~nan],
                          expected[~nan].view(np.uint8) if expected.dtype.kind == "f" else expected[~nan])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_loops_equal_the_per_entry_rule(name, dtype):
    op = BINARY[name][0]
    a, b = _operands(200, dtype)
    out = np.empty_like(a)
    binary_forward(op, a, b, out)
    _same_bits(out, np.array([binary_value(op, x, y) for x, y in zip(a, b)]).astype(dtype))


WRITTEN_OVER_AN_INPUT = {"add": (oc.ADD, np.add), "subtract": (oc.SUB, np.subtract),
                         "multiply": (oc.MUL, np.multiply), "divide": (oc.DIV, np.divide),
                         "maximum": (oc.MAXIMUM, np.maximum), "minimum": (oc.MINIMUM, np.minimum)}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", sorted(WRITTEN_OVER_AN_INPUT))
def test_binary_ops_written_over_either_input_equal_numpy(name, dtype):
    """A variable updated in its own rows runs its last op with the output over one input: its own loops then."""
    op, ufunc = WRITTEN_OVER_AN_INPUT[name]
    a, b = _operands(300, dtype)
    expected = ufunc(a, b)
    for over in ("a", "b"):
        left, right = a.copy(), b.copy()
        binary_forward(op, left, right, left if over == "a" else right)
        _same_bits(left if over == "a" else right, expected)
        _same_bits(right if over == "a" else left, b if over == "a" else a)     # the other input untouched


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_where_over_either_input_and_unary_ops_over_their_input_equal_new_arrays(dtype):
    a, b = _operands(300, dtype)
    cond = np.where(np.arange(300) % 3 == 0, 0.0, 1.0).astype(dtype)
    cond[1] = np.nan        # a nonzero: selects a, as np.where does
    for over in ("a", "b"):
        left, right = a.copy(), b.copy()
        where_forward(cond, left, right, left if over == "a" else right)
        _same_bits(left if over == "a" else right, np.where(cond != 0, a, b))
    for op in (oc.NEG, oc.SCALE, oc.SQUARE, oc.SQRT, oc.RELU):
        expected = np.empty_like(a)
        unary_forward(op, a, expected, 0.1, 0.0)
        over = a.copy()
        unary_forward(op, over, over, 0.1, 0.0)
        _same_bits(over, expected)


@pytest.mark.parametrize("n", [7, 300, FUSE_MIN_SIZE + 5])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_variables_updated_in_their_rows_by_each_elementwise_op_equal_eager(dtype, n):
    """Each op with the variable on either side, in a replay that writes every new value over the old one."""
    values = _operands(n, dtype, seed=3)
    x = jt.constant(values[1])
    updates = [lambda v: v + x, lambda v: x + v, lambda v: v - x, lambda v: x - v,
               lambda v: v * x, lambda v: x * v, lambda v: v / x, lambda v: x / v,
               lambda v: jt.maximum(v, x), lambda v: jt.maximum(x, v),
               lambda v: jt.minimum(v, x), lambda v: jt.minimum(x, v),
               lambda v: jt.where(x > 0, v, x), lambda v: jt.where(x > 0, x, v),
               lambda v: -v, lambda v: v * 0.5, jt.square, jt.sqrt, jt.nn.relu]
    variables = [jt.Variable(values[0]) for _ in updates]

    def step():
        for v, update in zip(variables, updates):
            v.assign(update(v))

    replayed = jt.function(step)
    expected = [values[0].copy() for _ in variables]
    for _ in range(3):
        replayed()
        expected = [update(jt.constant(e)).numpy() for e, update in zip(expected, updates)]
        for v, e in zip(variables, expected):
            _same_bits(v.numpy(), e)
    assert all(_rows_shared(replayed.concrete(), v) for v in variables)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_scale_loop_equals_the_per_entry_rule(dtype):
    x, _ = _operands(200, dtype)
    factor = float(dtype(0.1))          # as recorded: the factor in the tensor's dtype
    out = np.empty_like(x)
    unary_forward(oc.SCALE, x, out, factor, 0.0)
    _same_bits(out, np.array([unary_value(oc.SCALE, v, factor, 0.0) for v in x]).astype(dtype))
    _same_bits(out, x * dtype(0.1))


@pytest.mark.parametrize("n", [7, 300, FUSE_MIN_SIZE + 5])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_replays_equal_eager(name, dtype, n):
    """Replayed on new values of the traced shapes: the compare family inside a product (so it is a row of a
    fused group where the arrays are large), maximum and minimum alone."""
    _, call = BINARY[name]
    compare = name not in ("maximum", "minimum")

    def f(a, b):
        y = call(a, b)
        return jt.cast(y, a.dtype) * a if compare else y

    replayed = jt.function(f)
    replayed(*map(jt.constant, _operands(n, dtype, seed=1)))
    a, b = map(jt.constant, _operands(n, dtype, seed=2))
    _same_bits(replayed(a, b).numpy(), f(a, b).numpy())


@pytest.mark.parametrize("n", [7, 300, FUSE_MIN_SIZE + 5])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_scale_replays_equal_eager(dtype, n):
    def f(x):
        return (x * 0.1 + 1.0) * 3.7

    replayed = jt.function(f)
    replayed(jt.constant(_operands(n, dtype, seed=1)[0]))
    x = jt.constant(_operands(n, dtype, seed=2)[0])
    _same_bits(replayed(x).numpy(), f(x).numpy())


# rules that pick or compare values (numpy's maximum and minimum: NaN wins, ties give the second operand)
EXACT_UNARY = {
    "relu": jt.nn.relu, "sign": jt.sign, "abs": jt.abs,
    "clip": lambda x: jt.clip_by_value(x, 0.0, 1.5),        # a bound of 0: signed zeros
}
ROUNDED_UNARY = {"elu": jt.nn.elu, "softplus": jt.nn.softplus}


@pytest.mark.parametrize("n", [7, 300, FUSE_MIN_SIZE + 5])
@pytest.mark.parametrize("name", sorted(EXACT_UNARY) + sorted(ROUNDED_UNARY))
def test_unary_replays_equal_eager_on_special_values(name, n):
    call = EXACT_UNARY.get(name) or ROUNDED_UNARY[name]
    replayed = jt.function(call)
    replayed(jt.constant(_operands(n, np.float64, seed=1)[0]))
    x = jt.constant(_operands(n, np.float64, seed=2)[0])
    actual, expected = replayed(x).numpy(), call(x).numpy()
    if name in EXACT_UNARY:
        _same_bits(actual, expected)
    else:
        np.testing.assert_array_equal(np.isnan(actual), np.isnan(expected))
        np.testing.assert_allclose(actual, expected, rtol=1e-15, atol=0)
        zeros = expected == 0
        np.testing.assert_array_equal(np.signbit(actual[zeros]), np.signbit(expected[zeros]))


PICKING = {
    "maximum": jt.maximum, "minimum": jt.minimum, "relu": lambda a, b: jt.nn.relu(a) * b,
    "abs": lambda a, b: jt.abs(a) * b, "clip": lambda a, b: jt.clip_by_value(a, 0.0, 1.5) * b,
    # reductions whose cotangents are NaN for some lines (b's first entries: every SPECIAL value)
    "reduce_max_of_rows": lambda a, b: jt.reduce_max(jt.reshape(a, (8, 8)), axis=1) * b[:8],
    "reduce_min_across_rows": lambda a, b: jt.reduce_min(jt.reshape(a, (8, 8)), axis=0) * b[:8],
}


@pytest.mark.parametrize("name", sorted(PICKING))
def test_partials_at_special_values_equal_the_python_vjps(name):
    """The compiled reverse sweeps (one column and K columns) and the Python VJPs (a recording tape) agree entry
    by entry, NaN included: a NaN cotangent times a partial of 0 is NaN on every path."""
    a, b = map(jt.constant, _operands(64, np.float64))
    with jt.GradientTape(persistent=True) as tape:
        tape.watch([a, b])
        y = PICKING[name](a, b)
    compiled = tape.gradient(y, [a, b], unconnected_gradients="zero")
    compiled_jacobian = tape.jacobian(y, a)
    with jt.GradientTape(persistent=True) as enclosing:
        enclosing.watch([a, b])
        recorded = tape.gradient(y, [a, b], unconnected_gradients="zero")
        recorded_jacobian = tape.jacobian(y, a)
    pairs = list(zip(compiled, recorded)) + [(compiled_jacobian, recorded_jacobian)]
    for c, r in pairs:
        actual, expected = c.numpy(), r.numpy()
        np.testing.assert_array_equal(np.isnan(actual), np.isnan(expected))
        finite = ~np.isnan(expected)
        np.testing.assert_array_equal(actual[finite], expected[finite])


def _with_specials(rng, shape, dtype):
    a = rng.standard_normal(shape)
    flat = a.reshape(-1)
    count = min(64, flat.size)
    flat[rng.choice(flat.size, count, replace=False)] = rng.choice(SPECIAL, count)
    return a.astype(dtype)


def _short_run_pairs(dtype):
    """(x, y) whose layouts numpy iterates in short runs, each result over VIEWS_FROM entries (smaller broadcasts
    are copied): W8's (n, 1, d) against (1, k, d), an array against a transposed one, a column broadcast against
    a row, a transposed matrix against a contiguous one, and a last axis of 3 broadcast over two."""
    rng = np.random.default_rng(3)
    draw = lambda *shape: _with_specials(rng, shape, dtype)     # noqa: E731
    return [(draw(1000, 1, 10), draw(1, 25, 10)),
            (draw(80, 25, 10), draw(25, 80, 10).transpose(1, 0, 2)),
            (draw(30000, 1), draw(1, 7)),
            (draw(9, 2000).T, draw(2000, 9)),
            (draw(2, 50000, 3), draw(3))]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", sorted(WRITTEN_OVER_AN_INPUT))
def test_eager_arithmetic_over_short_runs_runs_compiled_and_gives_numpy_s_bits(name, dtype, monkeypatch):
    import jitape.ops.elementwise as elementwise
    calls = []
    monkeypatch.setattr(elementwise, "strided_arithmetic",
                        lambda *args: calls.append(args[0]) or strided_arithmetic(*args))
    op, ufunc = getattr(jt, name), WRITTEN_OVER_AN_INPUT[name][1]
    pairs = _short_run_pairs(dtype)
    for x, y in pairs:
        _same_bits(op(jt.constant(x), jt.constant(y)).numpy(), ufunc(x, y))
        _same_bits(op(jt.constant(y), jt.constant(x)).numpy(), ufunc(y, x))
    assert calls == [WRITTEN_OVER_AN_INPUT[name][0]] * (2 * len(pairs))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gradients_through_eager_arithmetic_over_short_runs_are_the_broadcasts_sums(dtype):
    x, y = (np.random.default_rng(4).standard_normal(s).astype(dtype) for s in ((1000, 1, 10), (1, 25, 10)))
    tx, ty = jt.constant(x), jt.constant(y)
    with jt.GradientTape() as tape:
        tape.watch([tx, ty])
        loss = jt.reduce_sum((tx - ty) * (tx + ty) / (ty * ty + 1))     # x² / (y² + 1) - y² / (y² + 1)
    gx, gy = tape.gradient(loss, [tx, ty])
    d = y * y + 1
    np.testing.assert_allclose(gx.numpy(), np.sum(2 * x / d, 1, keepdims=True), rtol=1e-4)
    np.testing.assert_allclose(gy.numpy(), np.sum(-2 * y * (x * x + 1) / (d * d), 0, keepdims=True), rtol=1e-4)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_warmup_compiles_strided_arithmetic_for_every_pair_of_layouts_eager_ops_pass(dtype, monkeypatch):
    # a signature the warmup left out compiles on a user's first eager op of that layout (~0.3 s, cold)
    import jitape.ops.elementwise as elementwise
    from jitape_kernels.cpu import _eager_steps
    _eager_steps(dtype)
    warmed = set(strided_arithmetic.signatures)
    layouts = set()
    layout = lambda a: "C" if a.flags.c_contiguous else "F" if a.flags.f_contiguous else "A"     # noqa: E731
    monkeypatch.setattr(elementwise, "strided_arithmetic",
                        lambda op, a, b, out: layouts.add(layout(a) + layout(b)) or strided_arithmetic(op, a, b, out))
    rng = np.random.default_rng(5)
    draw = lambda *shape: rng.standard_normal(shape).astype(dtype)      # noqa: E731
    transposed = draw(9, 4000).T       # large enough that a broadcast against it stays a view (tensor.VIEWS_FROM)
    for x, y in _short_run_pairs(dtype) + [(transposed, draw(9, 4000).T), (transposed, draw(4000, 1))]:
        for a, b in ((x, y), (y, x)):
            np.testing.assert_array_equal(jt.subtract(jt.constant(a), jt.constant(b)).numpy(), a - b)
    assert layouts == {"AA", "AC", "CA", "AF", "FA", "CF", "FC", "FF"}
    assert set(strided_arithmetic.signatures) == warmed


def test_strided_arithmetic_refuses_operands_unlike_its_output_and_other_opcodes():
    out = np.zeros((2, 3, 4))
    with pytest.raises(ValueError, match="shapes"):
        strided_arithmetic(oc.ADD, np.zeros((2, 3, 5)), out, out)
    with pytest.raises(ValueError, match="shapes"):
        strided_arithmetic(oc.ADD, out, np.zeros((1, 3, 4)), out)
    with pytest.raises(ValueError, match="opcode"):
        strided_arithmetic(oc.POW, out, out, out)
