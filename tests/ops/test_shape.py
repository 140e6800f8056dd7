"""Tensor subscripts (jitape.ops.shape.getitem): basic subscripts of ints (Python and numpy), slices and tuples
take one fast path with no tape and when recorded (one SLICE, its windows cached by shape and subscript);
every subscript equals numpy's on every path, raises numpy's IndexError out of range, and a slice bound
given as a tensor is a guard of a traced function. Large transposes and broadcasts are views of their input
on every eager path, and stay the values they were when the input's variable changes."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jitape as jt


def _part(n):
    ints = st.integers(-n - 1, n).flatmap(lambda i: st.sampled_from([i, np.int64(i)]))
    bound = st.none() | st.integers(-n - 2, n + 2)
    slices = st.builds(slice, bound, bound, st.none() | st.sampled_from([1, 2, 3, -1, -2]))
    return ints | slices


@st.composite
def _subscripts(draw):
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=3)))
    parts = tuple(draw(_part(n)) for n in shape[:draw(st.integers(1, len(shape)))])
    return shape, parts[0] if len(parts) == 1 and draw(st.booleans()) else parts


def _index_error(a, key):
    try:
        a[key]
    except IndexError:
        return True
    return False


@settings(max_examples=150, deadline=None)
@given(_subscripts())
def test_basic_subscripts_equal_numpy_with_and_without_a_tape(case):
    shape, key = case
    a = np.random.default_rng(len(shape)).standard_normal(shape)
    x = jt.constant(a)
    if _index_error(a, key):
        with pytest.raises(IndexError):
            x[key]
        with jt.GradientTape() as tape:
            tape.watch(x)
            y = x * 2.0
            with pytest.raises(IndexError):
                y[key]
            z = jt.reduce_sum(y)
        np.testing.assert_array_equal(tape.gradient(z, x).numpy(), np.full(shape, 2.0))   # the tape is intact
        return
    expected = a[key]
    np.testing.assert_array_equal(x[key].numpy(), expected)
    weights = np.random.default_rng(0).standard_normal(np.shape(expected))
    with jt.GradientTape() as tape:
        tape.watch(x)
        picked = x[key]
        loss = jt.reduce_sum(picked * weights)
    np.testing.assert_array_equal(picked.numpy(), expected)
    reference = np.zeros(shape)
    np.add.at(reference, key, weights)
    np.testing.assert_array_equal(tape.gradient(loss, x).numpy(), reference)
    replayed = jt.function(lambda t: jt.reduce_sum(t[key] * weights))
    for _ in range(2):      # the trace, then the replay
        np.testing.assert_allclose(float(replayed(x)), float(np.sum(expected * weights)), rtol=1e-12)


def test_a_window_cached_for_one_shape_is_not_used_for_another():
    for shape in [(5, 3), (2, 3), (7,)]:
        a = np.arange(np.prod(shape), dtype=np.float64).reshape(shape)
        x = jt.constant(a)
        with jt.GradientTape() as tape:
            tape.watch(x)
            loss = jt.reduce_sum(x[1:] * 3.0)
        expected = np.zeros(shape)
        expected[1:] = 3.0
        np.testing.assert_array_equal(tape.gradient(loss, x).numpy(), expected)


def test_a_slice_s_window_is_the_one_of_its_bounds_whatever_their_kind_and_the_order_cached():
    # windows are cached by the bounds as written where they are ints or None: a bound of another kind (np.int64,
    # an integer tensor, one whose hash equals an int bound's) must give its own value's window, cached or not
    n = 64
    tensor_bound = jt.constant(np.int64(5))
    a = np.arange(float(n))
    x = jt.constant(a)
    bounds = [(2, 6), (np.int64(2), 6), (tensor_bound, 9), (5, 9), (tensor_bound._id % n, 9), (-7, None),
              (np.int64(-7), None), (None, jt.constant(np.int32(3))), (None, 3)]
    for _ in range(2):      # the second round reads every window from the caches
        for start, stop in bounds + bounds[::-1]:
            with jt.GradientTape() as tape:
                tape.watch(x)
                picked = x[start:stop]
                loss = jt.reduce_sum(picked * 3.0)
            lo, hi = (None if b is None else int(b) for b in (start, stop))
            np.testing.assert_array_equal(picked.numpy(), a[lo:hi])
            expected = np.zeros(n)
            expected[lo:hi] = 3.0
            np.testing.assert_array_equal(tape.gradient(loss, x).numpy(), expected)


def test_whole_window_is_the_tensor_itself_and_integer_tensors_are_not_recorded():
    x = jt.constant(np.ones((2, 3)))
    with jt.GradientTape() as tape:
        tape.watch(x)
        assert x[:] is x and x[:, :] is x and x[0:2] is x
        ints = jt.constant(np.arange(6).reshape(2, 3))
        assert ints[1].numpy().tolist() == [3, 4, 5]
    assert not tape._rows and not tape._records     # no op recorded (the watched x has its slot: watch gives it)


def test_a_tensor_slice_bound_is_a_guard_of_a_traced_function():
    @jt.function
    def head_sum(x):
        n = jt.cast(x[0], jt.int32)
        return jt.reduce_sum(x[1:][:n])

    assert float(head_sum(jt.constant([2.0, 1.0, 2.0, 3.0, 4.0]))) == 3.0
    assert float(head_sum(jt.constant([2.0, 5.0, 2.0, 3.0, 4.0]))) == 7.0          # replayed
    assert float(head_sum(jt.constant([3.0, 1.0, 2.0, 3.0, 4.0]))) == 6.0          # the guard flips: a new trace
    assert head_sum.trace_count == 2


LARGE = (300, 200)      # 60,000 entries: above jitape.ops.shape._VIEWS_FROM


@pytest.mark.parametrize("name,op,reference", [
    ("transpose", lambda t: jt.transpose(t), lambda a: a.T),
    ("batched transpose", lambda t: jt.transpose(jt.reshape(t, (3, 100, 200)), (0, 2, 1)),
     lambda a: np.transpose(a.reshape(3, 100, 200), (0, 2, 1))),
    ("broadcast of a column", lambda t: jt.broadcast_to(t[:, :1], LARGE), lambda a: np.broadcast_to(a[:, :1], LARGE)),
    ("broadcast of a row", lambda t: t[:1] * jt.ones(LARGE, jt.float64), lambda a: a[:1] * np.ones(LARGE)),
])
def test_large_transposes_and_broadcasts_are_views_on_every_path(name, op, reference):
    rng = np.random.default_rng(4)
    a = rng.standard_normal(LARGE)
    weights = rng.standard_normal(reference(a).shape)
    x = jt.constant(a)
    y = op(x)
    np.testing.assert_array_equal(y.numpy(), reference(a))
    if name.startswith("broadcast of a column"):
        assert 0 in y._value.strides            # repeats the column's memory
    elif name.endswith("transpose"):
        assert np.shares_memory(y._value, x._value)
    with jt.GradientTape(persistent=True) as tape:
        tape.watch(x)
        total = jt.reduce_sum(jt.exp(op(x)) * weights)
    expected = jt.constant(np.zeros(LARGE))
    with jt.GradientTape() as outer:       # the recorded Python VJPs: the reference of the compiled sweep
        outer.watch(x)
        recorded = jt.reduce_sum(jt.exp(op(x)) * weights)
        expected = outer.gradient(recorded, x)
    # repeats summed in another order than numpy's: a sum that cancels differs by rounding, not relatively
    atol = 1e-13 * np.abs(expected.numpy()).max()
    np.testing.assert_allclose(tape.gradient(total, x).numpy(), expected.numpy(), rtol=1e-13, atol=atol)
    g = jt.grad(lambda v: jt.reduce_sum(jt.exp(op(v)) * weights))
    g(x)
    np.testing.assert_allclose(g(x).numpy(), expected.numpy(), rtol=1e-13, atol=atol)


def test_a_transposed_variable_keeps_its_values_when_the_variable_changes():
    v = jt.Variable(np.arange(60_000.0).reshape(LARGE))
    before = jt.transpose(v)
    step = jt.function(lambda: v.assign(v * 2.0))
    step()
    step()                                  # a replay: may write the variable's array in place, never a shared one
    np.testing.assert_array_equal(before.numpy(), np.arange(60_000.0).reshape(LARGE).T)
    np.testing.assert_array_equal(v.numpy(), 4 * np.arange(60_000.0).reshape(LARGE))
    v.assign_add(jt.ones(LARGE, jt.float64))
    np.testing.assert_array_equal(before.numpy(), np.arange(60_000.0).reshape(LARGE).T)
