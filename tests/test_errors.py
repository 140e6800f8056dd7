"""Bad input (DESIGN.md "Bad input"): every misuse raises a clear exception and
leaves the tape and the variables working."""
import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import jitape as jt

NOT_PERSISTENT_MSG = (
    "GradientTape.gradient can only be called once on non-persistent tapes.")

V0 = np.array([1.0, 2.0, 3.0], np.float32)
X0 = np.float32(2.0)


def npv(t):
    assert isinstance(t, jt.Tensor), type(t)
    return np.asarray(t.numpy())


def shape_forms(shape):
    shape = tuple(int(d) for d in shape)
    dims = [str(d) for d in shape]
    return {str(shape), "[" + ", ".join(dims) + "]", "[" + ",".join(dims) + "]"}


def assert_names_shape(message, shape):
    assert any(form in message for form in shape_forms(shape)), (message, shape)


def recorded_tape(middle=lambda tape, v, x, y1: None):
    """v, x and a persistent tape that recorded y1 = sum(v*v)*x, then `middle(tape, v, x, y1)`, then
    y2 = sum(sin v) + x*x: (tape, v, x, y1, y2, what middle returned), for assert_state_intact."""
    v = jt.Variable(V0)
    x = jt.constant(X0)
    with jt.GradientTape(persistent=True) as tape:
        tape.watch(x)
        y1 = jt.reduce_sum(v * v) * x
        extra = middle(tape, v, x, y1)
        y2 = jt.reduce_sum(jt.sin(v)) + x * x
    return tape, v, x, y1, y2, extra


def record_around(bad, exc_types):
    """Record y1 before and y2 after a failing call `bad(v, x, y1)` on one
    persistent tape, then check that nothing was corrupted."""
    def failing(tape, v, x, y1):
        with pytest.raises(exc_types) as excinfo:
            bad(v, x, y1)
        return excinfo

    tape, v, x, y1, y2, excinfo = recorded_tape(failing)
    assert_state_intact(tape, v, x, y1, y2)
    return excinfo.value


def assert_state_intact(tape, v, x, y1, y2):
    # the tape gives correct gradients for targets recorded before and after
    gv, gx = tape.gradient(y1, [v, x])
    np.testing.assert_allclose(npv(gv), 2 * V0 * X0, rtol=1e-6)
    np.testing.assert_allclose(npv(gx), np.sum(V0 * V0), rtol=1e-6)
    gv, gx = tape.gradient(y2, [v, x])
    np.testing.assert_allclose(npv(gv), np.cos(V0), rtol=1e-6)
    np.testing.assert_allclose(npv(gx), 2 * X0, rtol=1e-6)
    # the variable still reads, records and assigns
    np.testing.assert_array_equal(npv(v), V0)
    with jt.GradientTape() as fresh:
        z = jt.reduce_sum(v * v * v)
    np.testing.assert_allclose(npv(fresh.gradient(z, v)), 3 * V0 ** 2, rtol=1e-6)
    v.assign_add(np.ones(3, np.float32))
    np.testing.assert_array_equal(npv(v), V0 + 1)


# --------------------------------------------------------------------------
# gradient twice on a non-persistent tape

def test_gradient_twice_non_persistent():
    v = jt.Variable(V0)
    with jt.GradientTape() as tape:
        y = jt.reduce_sum(v * v)
    np.testing.assert_allclose(npv(tape.gradient(y, v)), 2 * V0)
    for _ in range(2):   # and it keeps saying so
        with pytest.raises(RuntimeError) as excinfo:
            tape.gradient(y, v)
        assert str(excinfo.value) == NOT_PERSISTENT_MSG
    with jt.GradientTape() as tape2:
        y = jt.reduce_sum(v * v * v)
    np.testing.assert_allclose(npv(tape2.gradient(y, v)), 3 * V0 ** 2, rtol=1e-6)


def test_jacobian_after_gradient_non_persistent():
    v = jt.Variable(V0)
    with jt.GradientTape() as tape:
        y = v * v
    tape.gradient(y, v)
    with pytest.raises(RuntimeError, match="non-persistent"):   # TF words it differently
        tape.jacobian(y, v)


# --------------------------------------------------------------------------
# unsupported dtypes

BAD_DTYPE_VALUES = [
    ("complex", np.array([1 + 2j, 3.0]), ("complex",)),
    ("complex64", np.array([1j], np.complex64), ("complex64",)),
    ("python-complex", 1 + 2j, ("complex",)),
    ("object", np.array([1.0, None], dtype=object), ("object",)),
    ("object-floats", np.array([1.0, 2.0], dtype=object), ("object",)),
    ("str-array", np.array(["a", "bc"]), ("str", "<u", "unicode", "string")),
    ("python-str", "abc", ("str", "<u", "string")),
    ("bytes-array", np.array([b"a"]), ("bytes", "|s", "string")),
    ("datetime", np.array(["2020-01-01", "2021-06-30"], dtype="datetime64[D]"),
     ("datetime64",)),
    ("timedelta", np.array([1, 2], dtype="timedelta64[s]"), ("timedelta64",)),
]


DTYPE_CASES = [(make, value, names, case_id)
               for case_id, value, names in BAD_DTYPE_VALUES
               for make in ("constant", "Variable", "binary_op")
               if not (make == "binary_op" and isinstance(value, str))]


@pytest.mark.parametrize("make, value, names", [c[:3] for c in DTYPE_CASES],
                         ids=[f"{c[0]}-{c[3]}" for c in DTYPE_CASES])
def test_unsupported_dtype(make, value, names):
    def bad(v, x, y1):
        if make == "constant":
            jt.constant(value)
        elif make == "Variable":
            jt.Variable(value)
        else:
            v * value
    err = record_around(bad, TypeError)
    assert any(name in str(err).lower() for name in names), str(err)


def test_str_operand_in_binary_op():
    record_around(lambda v, x, y1: v + "abc", TypeError)


@pytest.mark.parametrize("dtype, names", [
    ("complex64", ("complex64",)), ("complex128", ("complex128",)),
    (np.complex64, ("complex64",)), (object, ("object",)),
    ("U3", ("str", "<u3", "unicode", "string"))], ids=str)
def test_unsupported_dtype_argument(dtype, names):
    err = record_around(lambda v, x, y1: jt.constant(1.0, dtype=dtype), TypeError)
    assert any(name in str(err).lower() for name in names), str(err)


# --------------------------------------------------------------------------
# shape errors in ops name both shapes

def test_matmul_shape_error_names_both_shapes():
    a = jt.constant(np.ones((2, 3), np.float32))
    b = jt.constant(np.ones((4, 5), np.float32))
    err = record_around(lambda v, x, y1: jt.matmul(a * x, b), ValueError)
    assert_names_shape(str(err), (2, 3))
    assert_names_shape(str(err), (4, 5))
    err = record_around(lambda v, x, y1: (a * x) @ b, ValueError)
    assert_names_shape(str(err), (2, 3))
    assert_names_shape(str(err), (4, 5))


def test_add_shape_error_names_both_shapes():
    a = jt.constant(np.ones((2, 3), np.float32))
    b = jt.constant(np.ones((4,), np.float32))
    for bad in (lambda v, x, y1: a * x + b, lambda v, x, y1: jt.add(a, b * x)):
        err = record_around(bad, ValueError)
        assert_names_shape(str(err), (2, 3))
        assert_names_shape(str(err), (4,))


def _incompatible(s1, s2):
    try:
        np.broadcast_shapes(s1, s2)
    except ValueError:
        return True
    return False


shapes = hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=5)


@given(s1=shapes, s2=shapes,
       op=st.sampled_from(["add", "subtract", "multiply", "divide", "maximum", "pow"]))
def test_elementwise_broadcast_errors(s1, s2, op):
    assume(_incompatible(s1, s2))
    a = jt.constant(np.ones(s1, np.float32))
    b = jt.constant(np.ones(s2, np.float32))
    err = record_around(lambda v, x, y1: getattr(jt, op)(a * x, b), ValueError)
    assert_names_shape(str(err), s1)
    assert_names_shape(str(err), s2)


@given(m=st.integers(1, 4), k1=st.integers(1, 5), k2=st.integers(1, 5), n=st.integers(1, 4),
       batch=st.sampled_from([(), (2,)]))
def test_matmul_inner_dimension_errors(m, k1, k2, n, batch):
    assume(k1 != k2)
    a = jt.constant(np.ones(batch + (m, k1), np.float32))
    b = jt.constant(np.ones(batch + (k2, n), np.float32))
    err = record_around(lambda v, x, y1: jt.matmul(a, b * x), ValueError)
    assert_names_shape(str(err), batch + (m, k1))
    assert_names_shape(str(err), batch + (k2, n))


def test_other_shape_errors_name_shapes():
    a = jt.constant(np.ones((2, 3), np.float32))
    b = jt.constant(np.ones((2, 4), np.float32))
    err = record_around(lambda v, x, y1: jt.concat([a * x, b], axis=0), ValueError)
    assert_names_shape(str(err), (2, 3))
    assert_names_shape(str(err), (2, 4))
    err = record_around(lambda v, x, y1: jt.reshape(a * x, (4,)), ValueError)
    assert_names_shape(str(err), (2, 3))
    assert_names_shape(str(err), (4,))
    err = record_around(lambda v, x, y1: jt.stack([a, b * x]), ValueError)
    assert_names_shape(str(err), (2, 3))
    assert_names_shape(str(err), (2, 4))


# --------------------------------------------------------------------------
# gradient arguments

@given(s1=shapes, s2=shapes)
def test_output_gradients_wrong_shape(s1, s2):
    assume(_incompatible(s1, s2))
    tape, v, x, y1, y2, y = recorded_tape(lambda tape, v, x, y1: jt.ones(s1) * x)
    with pytest.raises(ValueError) as excinfo:
        tape.gradient(y, x, output_gradients=jt.constant(np.ones(s2, np.float32)))
    msg = str(excinfo.value)
    assert "output_gradients" in msg, msg
    assert_names_shape(msg, s1)
    assert_names_shape(msg, s2)
    # the tape still works, also for the target that failed
    g = tape.gradient(y, x, output_gradients=jt.constant(np.full(s1, 2.0, np.float32)))
    assert npv(g) == np.float32(2 * np.prod(s1))
    assert_state_intact(tape, v, x, y1, y2)


def test_output_gradients_wrong_shape_scalar_target():
    def bad(v, x, y1):
        tape = jt.GradientTape()
        with tape:
            tape.watch(x)
            y = x * x
        tape.gradient(y, x, output_gradients=jt.constant([1.0, 2.0]))
    err = record_around(bad, ValueError)
    assert_names_shape(str(err), (2,))
    assert "()" in str(err) or "[]" in str(err), str(err)


def test_output_gradients_wrong_shape_on_outer_persistent_tape():
    tape, v, x, y1, y2, y3 = recorded_tape(lambda tape, v, x, y1: v * x)
    with pytest.raises(ValueError) as excinfo:
        tape.gradient(y3, v, output_gradients=jt.constant(np.ones((4,), np.float32)))
    assert_names_shape(str(excinfo.value), (3,))
    assert_names_shape(str(excinfo.value), (4,))
    with pytest.raises(ValueError):
        tape.gradient([y3, y1], v, output_gradients=[jt.constant(np.ones(3, np.float32)),
                                                     jt.constant([1.0, 1.0])])
    assert_state_intact(tape, v, x, y1, y2)


@pytest.mark.parametrize("bad_value", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("where", [0, 2])
def test_nan_inf_output_gradients(bad_value, where):
    tape, v, x, y1, y2, y3 = recorded_tape(lambda tape, v, x, y1: v * x)
    og = np.ones(3, np.float32)
    og[where] = bad_value
    with pytest.raises(ValueError) as excinfo:
        tape.gradient(y3, [v, x], output_gradients=jt.constant(og))
    msg = str(excinfo.value).lower()
    assert "output_gradients" in msg, msg
    assert "nan" in msg or "inf" in msg or "finite" in msg, msg
    np.testing.assert_allclose(npv(tape.gradient(y3, v)), np.full(3, X0))
    assert_state_intact(tape, v, x, y1, y2)


def test_nan_output_gradients_on_outer_tape():
    tape, v, x, y1, y2, _ = recorded_tape()
    with pytest.raises(ValueError):
        tape.gradient(y1, v, output_gradients=jt.constant(np.float32(np.nan)))
    with pytest.raises(ValueError):
        tape.gradient(y1, v, output_gradients=jt.constant(np.float32(np.inf)))
    assert_state_intact(tape, v, x, y1, y2)


@pytest.mark.parametrize("target", [3.0, np.array([1.0, 2.0], np.float32), "loss", None,
                                    [3.0], {"a": "b"}],
                         ids=["float", "ndarray", "str", "None", "list-float", "dict-str"])
def test_non_tensor_target(target):
    tape, v, x, y1, y2, _ = recorded_tape()
    with pytest.raises((TypeError, ValueError)) as excinfo:
        tape.gradient(target, v)
    assert "target" in str(excinfo.value), str(excinfo.value)
    assert_state_intact(tape, v, x, y1, y2)


@pytest.mark.parametrize("sources", [3.0, np.array([1.0], np.float32), "x", None,
                                     "mixed-list", "dict-str"],
                         ids=["float", "ndarray", "str", "None", "mixed-list", "dict-str"])
def test_non_tensor_sources(sources):
    tape, v, x, y1, y2, _ = recorded_tape()
    if sources == "mixed-list":
        sources = [v, 3.0]
    elif sources == "dict-str":
        sources = {"v": v, "name": "x"}
    with pytest.raises(TypeError) as excinfo:
        tape.gradient(y1, sources)
    assert "source" in str(excinfo.value), str(excinfo.value)
    assert_state_intact(tape, v, x, y1, y2)


@pytest.mark.parametrize("thing", [3.0, np.array([1.0]), "x", [jt.constant(1.0), 2.0]],
                         ids=["float", "ndarray", "str", "mixed-list"])
def test_watch_non_tensor(thing):
    def watch_on_recording_tape(v, x, y1):
        # the failing watch happens on a second tape that is recording too
        with jt.GradientTape() as t2:
            t2.watch(thing)
    record_around(watch_on_recording_tape, (TypeError, ValueError))


def test_batch_jacobian_first_dims_differ_leaves_tape_working():
    m = jt.constant(np.ones((4, 3), np.float32))

    def transposed(tape, v, x, y1):
        tape.watch(m)
        return jt.transpose(m * x)      # (3, 4) against a (4, 3) source

    tape, v, x, y1, y2, yt = recorded_tape(transposed)
    with pytest.raises(ValueError):
        tape.batch_jacobian(yt, m)
    assert_state_intact(tape, v, x, y1, y2)


@pytest.mark.parametrize("bad", [
    lambda v, x, y1: jt.reshape(y1 * x, (1,) * 9),                           # the result has rank 9
    lambda v, x, y1: jt.reduce_sum(jt.constant(np.ones((1,) * 9)) * x),       # an input has rank 9
    lambda v, x, y1: jt.stack([jt.reshape(x, (1,) * 8)] * 2),                # a composite's last step fails
], ids=["rank-9 result", "rank-9 input", "stack to rank 9"])
def test_an_op_that_raises_records_nothing_on_any_tape(bad):
    error = record_around(bad, ValueError)
    assert "rank" in str(error)
    x = jt.constant(X0)
    with jt.GradientTape(persistent=True) as first, jt.GradientTape(persistent=True) as second:
        first.watch(x)
        second.watch(x)
        y = x * 2.0
        with pytest.raises(ValueError, match="rank"):
            bad(None, x, y)
        for tape in (first, second):
            # a composite may have recorded its earlier, valid steps; the failing one added no value or slot
            assert len(b"".join(tape._slot_rows)) == len(tape._values) * (3 + 8) * 8     # packed int64
        z = y * y
    assert float(first.gradient(z, x)) == pytest.approx(8 * X0) and float(second.gradient(z, x)) == pytest.approx(8 * X0)
