"""GradientTape behaviour, rule by rule, as TensorFlow defines it (API.md)."""
import collections
import gc
import math
import sys
import threading
import tracemalloc
import warnings
import weakref

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import jitape as jt
import jitape.program
from jitape import recycling

NOT_PERSISTENT_MSG = (
    "GradientTape.gradient can only be called once on non-persistent tapes.")


def npv(t):
    """The numpy value of a jitape tensor (0-d arrays for scalars)."""
    assert isinstance(t, jt.Tensor), type(t)
    return np.asarray(t.numpy())


def floats_array(shape, lo=-3.0, hi=3.0):
    return hnp.arrays(np.float32, shape,
                      elements=st.floats(lo, hi, width=32, allow_nan=False))


# --------------------------------------------------------------------------
# persistence

def test_non_persistent_tape_second_gradient_raises():
    x = jt.constant(2.0)
    with jt.GradientTape() as tape:
        tape.watch(x)
        y = x * x
        z = y * x
    assert npv(tape.gradient(z, x)) == 12.0
    with pytest.raises(RuntimeError) as excinfo:
        tape.gradient(y, x)
    assert str(excinfo.value) == NOT_PERSISTENT_MSG


def test_persistent_tape_many_gradients():
    x = jt.constant(2.0)
    with jt.GradientTape(persistent=True) as tape:
        tape.watch(x)
        y = x * x
        z = y * x
    for _ in range(3):
        assert npv(tape.gradient(z, x)) == 12.0
        assert npv(tape.gradient(y, x)) == 4.0


# --------------------------------------------------------------------------
# what is watched

def test_unwatched_constant_gives_none():
    x = jt.constant(2.0)
    with jt.GradientTape() as tape:
        y = x * x
    assert tape.gradient(y, x) is None


@pytest.mark.parametrize("kind", ["list", "tuple", "dict", "nested"])
def test_watch_nests(kind):
    a, b, c = jt.constant(1.0), jt.constant(2.0), jt.constant(3.0)
    nest = {"list": [a, b, c], "tuple": (a, b, c), "dict": {"p": a, "q": b, "r": c},
            "nested": [a, {"k": (b, [c])}]}[kind]
    with jt.GradientTape() as tape:
        tape.watch(nest)
        y = a * b * c
    ga, gb, gc_ = tape.gradient(y, [a, b, c])
    assert (npv(ga), npv(gb), npv(gc_)) == (6.0, 3.0, 2.0)


def test_watch_accessed_variables_false():
    v = jt.Variable(3.0)
    w = jt.Variable(4.0)
    with jt.GradientTape(watch_accessed_variables=False) as tape:
        tape.watch(w)
        y = v * v * w
    gv, gw = tape.gradient(y, [v, w])
    assert gv is None
    assert npv(gw) == 9.0
    assert [id(x) for x in tape.watched_variables()] == [id(w)]


def test_trainable_float_variables_auto_watched_non_trainable_not():
    v = jt.Variable(3.0)
    frozen = jt.Variable(5.0, trainable=False)
    assert v.trainable and not frozen.trainable
    with jt.GradientTape() as tape:
        y = v * frozen
    gv, gf = tape.gradient(y, [v, frozen])
    assert npv(gv) == 5.0
    assert gf is None
    assert {id(x) for x in tape.watched_variables()} == {id(v)}


def test_non_trainable_variable_explicitly_watched():
    frozen = jt.Variable(5.0, trainable=False)
    with jt.GradientTape() as tape:
        tape.watch(frozen)
        y = frozen * frozen
    assert npv(tape.gradient(y, frozen)) == 10.0


def test_integer_sources_warn_and_give_none():
    xi = jt.constant(np.array([1, 2], dtype=np.int32))
    vi = jt.Variable(np.array([3, 4], dtype=np.int32))
    xf = jt.constant(2.0)
    assert xi.dtype == np.int32 and vi.dtype == np.int32
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with jt.GradientTape() as tape:
            tape.watch(xi)
            tape.watch(xf)
            y = xf * xf
        gf, gi, gv = tape.gradient(y, [xf, xi, vi])
    assert npv(gf) == 4.0
    assert gi is None and gv is None
    user = [w for w in caught if issubclass(w.category, UserWarning)]
    assert user, [str(w.message) for w in caught]
    assert any("int32" in str(w.message) for w in user), [str(w.message) for w in user]


def test_stop_recording():
    x = jt.constant(3.0)
    with jt.GradientTape(persistent=True) as tape:
        tape.watch(x)
        with tape.stop_recording():
            z = x * x          # not recorded: a constant 9 for the tape
        y = x * z
    assert tape.gradient(z, x) is None
    assert npv(tape.gradient(y, x)) == 9.0


def test_stop_recording_only_pauses_that_tape():
    x = jt.constant(3.0)
    with jt.GradientTape() as outer:
        outer.watch(x)
        with jt.GradientTape() as inner:
            inner.watch(x)
            with inner.stop_recording():
                z = x * x
    assert inner.gradient(z, x) is None
    assert npv(outer.gradient(z, x)) == 6.0


def test_reset_drops_records():
    v = jt.Variable(3.0)
    with jt.GradientTape(persistent=True) as tape:
        y = v * v
        tape.reset()
        z = v * v * v
    assert tape.gradient(y, v) is None
    assert npv(tape.gradient(z, v)) == 27.0


@pytest.mark.parametrize("step, tuples", [(lambda y, x: jt.sin(y) * 0.5, 0), (lambda y, x: y * x + x, 0),
                                          (lambda y, x: y * jt.constant(2.0), 0),   # a constant's first read
                                          (lambda y, x: jt.concat([y, x, y], 0)[1:3] * x, 1)])  # 3 inputs: a tuple
def test_a_recorded_op_leaves_no_object_for_the_garbage_collector(step, tuples):
    # Python's cyclic GC traverses every object a tape keeps at each full collection: with three per op, W9's
    # eager gradient spent half its time in them in a process holding TensorFlow, PyTorch and JAX. The tape
    # keeps ids; records() rebuilds the tensors
    x = jt.constant([0.5, 0.25])
    with jt.GradientTape() as tape:
        tape.watch(x)
        y = step(x, x)
        gc.collect()
        gc.disable()
        try:
            before = collections.Counter(map(type, gc.get_objects()))
            for _ in range(200):
                y = step(y, x)
            kept = collections.Counter(map(type, gc.get_objects())) - before
        finally:
            gc.enable()
    assert sum(kept.values()) <= 200 * tuples + 50, kept      # 50: first uses, warnings
    records = tape.records()
    assert len(records) >= 200 and records[-1][2]._id == y._id and records[-1][2]._value is y._value
    assert all(type(inputs) is tuple and inputs and all(isinstance(t, jt.Tensor) for t in inputs)
               for _, inputs, _, _ in records)


def test_reset_drops_watched_tensors():
    # TF: reset() is "equivalent to exiting and re-entering with a new tape".
    x = jt.constant(3.0)
    with jt.GradientTape() as tape:
        tape.watch(x)
        tape.reset()
        y = x * x
    assert tape.gradient(y, x) is None


def test_watched_variables():
    a = jt.Variable(1.0)
    b = jt.Variable(2.0, trainable=False)
    c = jt.Variable(3.0)
    unused = jt.Variable(4.0)
    with jt.GradientTape() as tape:
        y = a * b + c
    watched = tape.watched_variables()
    assert isinstance(watched, tuple)
    assert {id(v) for v in watched} == {id(a), id(c)}
    assert id(unused) not in {id(v) for v in watched}
    # still readable after the tape is used up
    tape.gradient(y, [a, c])
    assert {id(v) for v in tape.watched_variables()} == {id(a), id(c)}


def test_stop_gradient():
    x = jt.constant(3.0)
    with jt.GradientTape() as tape:
        tape.watch(x)
        y = x * jt.stop_gradient(x * x)
    assert npv(tape.gradient(y, x)) == 9.0


# --------------------------------------------------------------------------
# several tapes, threads

def test_several_tapes_record_at_once():
    x = jt.constant(2.0)
    t1, t2 = jt.GradientTape(), jt.GradientTape()
    with t1:
        t1.watch(x)
        a = x * x
        with t2:
            t2.watch(x)
            b = a * x
    assert npv(t1.gradient(b, x)) == 12.0   # d(x^3) = 3x^2
    assert npv(t2.gradient(b, x)) == 4.0    # t2 saw `a` as a constant


def test_tapes_in_threads_are_independent():
    n = 6
    barrier = threading.Barrier(n)
    results, errors = [None] * n, []

    def worker(i):
        try:
            x = jt.constant(float(i + 1))
            with jt.GradientTape() as tape:
                tape.watch(x)
                barrier.wait()
                y = x * x
                barrier.wait()
                y = y * x
                barrier.wait()
            results[i] = npv(tape.gradient(y, x))
        except Exception as exc:  # surfaced in the main thread
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert results == [3.0 * (i + 1) ** 2 for i in range(n)]


def test_tape_does_not_record_other_threads():
    v = jt.Variable(3.0)
    out = {}

    def other_thread():
        out["z"] = v * v

    with jt.GradientTape() as tape:
        th = threading.Thread(target=other_thread)
        th.start()
        th.join()
        y = v * 2.0
    assert npv(out["z"]) == 9.0
    # z was computed in another thread, so it is not on this tape: only y counts
    assert npv(tape.gradient([out["z"], y], v)) == 2.0

    with jt.GradientTape() as tape2:
        th = threading.Thread(target=other_thread)
        th.start()
        th.join()
    assert tape2.watched_variables() == ()
    assert tape2.gradient(out["z"], v) is None


# --------------------------------------------------------------------------
# structure of sources and targets

def test_structured_sources_keep_structure():
    a, b, c, d = (jt.Variable(float(i)) for i in (1, 2, 3, 4))
    with jt.GradientTape() as tape:
        y = a * b + c * d
    g = tape.gradient(y, {"a": a, "rest": [b, (c, {"d": d})]})
    assert isinstance(g, dict) and set(g) == {"a", "rest"}
    assert isinstance(g["rest"], list) and len(g["rest"]) == 2
    assert isinstance(g["rest"][1], tuple) and len(g["rest"][1]) == 2
    assert isinstance(g["rest"][1][1], dict) and set(g["rest"][1][1]) == {"d"}
    assert npv(g["a"]) == 2.0
    assert npv(g["rest"][0]) == 1.0
    assert npv(g["rest"][1][0]) == 4.0
    assert npv(g["rest"][1][1]["d"]) == 3.0


def test_tuple_and_single_sources():
    a, b = jt.Variable(2.0), jt.Variable(5.0)
    with jt.GradientTape(persistent=True) as tape:
        y = a * b
    g = tape.gradient(y, (a, b))
    assert isinstance(g, tuple) and (npv(g[0]), npv(g[1])) == (5.0, 2.0)
    single = tape.gradient(y, a)
    assert isinstance(single, jt.Tensor) and npv(single) == 5.0


@pytest.mark.parametrize("mode", ["zero", "ZERO_ENUM"])
def test_unconnected_gradients_zero(mode):
    unconnected = "zero" if mode == "zero" else jt.UnconnectedGradients.ZERO
    x = jt.Variable(2.0)
    m = jt.Variable(np.ones((2, 3), np.float32))
    with jt.GradientTape(persistent=True) as tape:
        y = x * x
    assert tape.gradient(y, m) is None
    assert tape.gradient(y, m, unconnected_gradients="none") is None
    assert tape.gradient(y, m, unconnected_gradients=jt.UnconnectedGradients.NONE) is None
    gx, gm = tape.gradient(y, [x, m], unconnected_gradients=unconnected)
    assert npv(gx) == 4.0
    assert gm.shape == (2, 3) and gm.dtype == np.float32
    np.testing.assert_array_equal(npv(gm), np.zeros((2, 3), np.float32))


@given(xv=floats_array((4,)), og=floats_array((4,)))
def test_output_gradients(xv, og):
    x = jt.constant(xv)
    with jt.GradientTape() as tape:
        tape.watch(x)
        y = x * x
    g = tape.gradient(y, x, output_gradients=jt.constant(og))
    np.testing.assert_allclose(npv(g), 2 * xv * og, rtol=1e-6, atol=1e-6)


def test_output_gradients_for_list_targets():
    x = jt.constant(np.array([1.0, 2.0], np.float32))
    with jt.GradientTape() as tape:
        tape.watch(x)
        y1 = x * x
        y2 = jt.reduce_sum(x * 3.0)
    g = tape.gradient([y1, y2], x, output_gradients=[
        jt.constant(np.array([10.0, 100.0], np.float32)), jt.constant(2.0)])
    np.testing.assert_allclose(npv(g), [2 * 1 * 10 + 6, 2 * 2 * 100 + 6])


@given(xv=floats_array((3,)))
def test_list_target_is_sum(xv):
    x = jt.constant(xv)
    with jt.GradientTape(persistent=True) as tape:
        tape.watch(x)
        y1 = jt.reduce_sum(jt.sin(x))
        y2 = x * x
    g = tape.gradient([y1, y2], x)
    np.testing.assert_allclose(npv(g), np.cos(xv) + 2 * xv, rtol=1e-5, atol=1e-6)


@given(xv=floats_array((2, 3)))
def test_non_scalar_target_is_sum(xv):
    x = jt.constant(xv)
    with jt.GradientTape() as tape:
        tape.watch(x)
        y = jt.exp(x * 0.5)            # shape (2, 3)
    g = tape.gradient(y, x)
    assert g.shape == (2, 3)
    np.testing.assert_allclose(npv(g), 0.5 * np.exp(0.5 * xv), rtol=1e-5)


# --------------------------------------------------------------------------
# memory

def _record_big_chain(tape, x):
    with tape:
        tape.watch(x)
        h = jt.sin(x)
        ref = weakref.ref(h)
        y = jt.reduce_sum(jt.exp(h) * h + jt.cos(h * 2.0))
    return y, ref


def _warm_big_chain():
    """Run the chain once on a tiny input so compilation happens untraced."""
    small = jt.constant(np.ones(4, np.float32))
    tape = jt.GradientTape(persistent=True)
    y, _ = _record_big_chain(tape, small)
    assert tape.gradient(y, small) is not None
    del tape, y
    gc.collect()


N_BIG = 1_000_000  # 4 MB per float32 intermediate


def test_non_persistent_tape_releases_after_gradient(monkeypatch):
    # the sweep's workspace buffers are a deliberate cache (jt.config.workspace_reuse_bytes), not the tape's
    monkeypatch.setattr(jt.config, "workspace_reuse_bytes", 0)
    x = jt.constant(np.linspace(-1, 1, N_BIG, dtype=np.float32))
    _warm_big_chain()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tape = jt.GradientTape()
        y, ref = _record_big_chain(tape, x)
        recorded = tracemalloc.get_traced_memory()[0] - base
        g = tape.gradient(y, x)
        assert g.shape == (N_BIG,)
        del g, y
        gc.collect()
        assert ref() is None, "the used-up tape still holds a recorded tensor"
        held = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert recorded > 8 * N_BIG  # sanity: the recording shows up in tracemalloc
    assert held < 2 * N_BIG, (recorded, held)
    assert tape is not None  # the tape object itself is still alive


def test_persistent_tape_releases_when_deleted():
    x = jt.constant(np.linspace(-1, 1, N_BIG, dtype=np.float32))
    _warm_big_chain()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tape = jt.GradientTape(persistent=True)
        y, ref = _record_big_chain(tape, x)
        g1 = tape.gradient(y, x)
        g2 = tape.gradient(y, x)
        np.testing.assert_array_equal(npv(g1), npv(g2))
        del g1, g2
        tape_ref = weakref.ref(tape)
        del tape, y
        gc.collect()
        assert tape_ref() is None, "something keeps the deleted tape alive"
        assert ref() is None, "a recorded tensor outlived its persistent tape"
        # its Programs' large buffers wait to be handed out again (jitape.recycling), within the budget
        waiting = sum(entry[1].nbytes for entry in recycling._owned if entry[0]() is None)
        assert waiting <= jt.config.workspace_reuse_bytes
        held = tracemalloc.get_traced_memory()[0] - base - waiting
    finally:
        tracemalloc.stop()
    assert held < 2 * N_BIG, held


# --------------------------------------------------------------------------
# higher order

def _nth_derivatives(f, x0, order):
    """[f'(x0), f''(x0), ...] from `order` nested tapes; each gradient is taken
    just after its tape exits, inside the tapes that enclose it."""
    x = jt.constant(x0)
    entered = []
    try:
        for _ in range(order):
            t = jt.GradientTape()
            t.__enter__()
            entered.append(t)
            t.watch(x)
        y = f(x)
        derivs = []
        while entered:
            t = entered.pop()
            t.__exit__(None, None, None)
            y = t.gradient(y, x)
            derivs.append(y)
    finally:
        while entered:
            entered.pop().__exit__(None, None, None)
    return derivs


@given(x0=st.floats(-3.0, 3.0))
@settings(max_examples=25)
def test_nested_tapes_sin(x0):
    x0 = np.float32(x0)
    d1, d2, d3 = _nth_derivatives(jt.sin, x0, 3)
    np.testing.assert_allclose(npv(d1), np.cos(x0), atol=1e-6)
    np.testing.assert_allclose(npv(d2), -np.sin(x0), atol=1e-6)
    np.testing.assert_allclose(npv(d3), -np.cos(x0), atol=1e-6)


@given(x0=st.floats(-3.0, 3.0))
@settings(max_examples=25)
def test_nested_tapes_cube(x0):
    x0 = np.float32(x0)
    d1, d2, d3 = _nth_derivatives(lambda x: x ** 3, x0, 3)
    np.testing.assert_allclose(npv(d1), 3 * x0 ** 2, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(npv(d2), 6 * x0, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(npv(d3), 6.0, rtol=1e-5)


# compiled sweep (no enclosing tape) vs Python VJP path (enclosing tape recording)

def _f_elementwise(x, w):
    return jt.reduce_sum(jt.sin(x) * jt.exp(-x * x) + jt.tanh(x * w) ** 2)


def _f_mlp(x, w):
    h = jt.tanh(jt.matmul(jt.reshape(x, (2, 3)), jt.reshape(w, (3, 2))))
    return jt.reduce_mean(h ** 2) + 0.1 * jt.reduce_sum(w * w)


def _f_softmax(x, w):
    logits = jt.reshape(x * w, (2, 3))
    return -jt.reduce_sum(jt.nn.log_softmax(logits) * jt.nn.softmax(logits * 0.5)) \
        + jt.reduce_max(logits) + jt.reduce_logsumexp(x)


def _f_misc(x, w):
    a = jt.maximum(x, w) + jt.minimum(x * 2.0, w)
    b = jt.where(x > 0.0, x * x, jt.sqrt(w * w + 1.0))
    return jt.reduce_sum(a * b / (1.0 + jt.abs(w))) + jt.reduce_prod(jt.cos(x[:3]))


def _compiled_and_nested(f, xv, wv):
    """f's value and gradients w.r.t. both inputs from the compiled sweep, and the value and gradients
    recorded on an enclosing tape (the Python VJP path)."""
    x, w = jt.constant(xv), jt.constant(wv)
    with jt.GradientTape() as tape:
        tape.watch([x, w])
        y = f(x, w)
    compiled = tape.gradient(y, [x, w])
    with jt.GradientTape() as outer:
        outer.watch([x, w])
        with jt.GradientTape() as inner:
            inner.watch([x, w])
            y2 = f(x, w)
        nested = inner.gradient(y2, [x, w])   # recorded on `outer`
        s = jt.reduce_sum(nested[0])
    assert outer.gradient(s, x) is not None   # proves the nested path ran
    return y, compiled, y2, nested


@pytest.mark.parametrize("f", [_f_elementwise, _f_mlp, _f_softmax, _f_misc],
                         ids=lambda f: f.__name__)
@given(xv=floats_array((6,), -2.0, 2.0), wv=floats_array((6,), -2.0, 2.0))
@settings(max_examples=20)
def test_compiled_and_nested_paths_agree(f, xv, wv):
    y, compiled, y2, nested = _compiled_and_nested(f, xv, wv)
    np.testing.assert_array_equal(npv(y), npv(y2))
    for c, n in zip(compiled, nested):
        assert c.dtype == n.dtype == np.float32
        np.testing.assert_allclose(npv(c), npv(n), rtol=2e-6, atol=1e-6)


def test_compiled_and_nested_paths_agree_float64():
    rng = np.random.default_rng(0)
    xv, wv = rng.normal(size=6), rng.normal(size=6)
    for f in (_f_elementwise, _f_mlp, _f_softmax, _f_misc):
        _, compiled, _, nested = _compiled_and_nested(f, xv, wv)
        for c, n in zip(compiled, nested):
            assert c.dtype == n.dtype == np.float64
            np.testing.assert_allclose(npv(c), npv(n), rtol=1e-12, atol=1e-13)
        # and both equal central finite differences
        for i, src in enumerate((xv, wv)):
            fd = np.empty(6)
            for k in range(6):
                e = np.zeros(6)
                e[k] = 1e-6
                args_p = [xv, wv]
                args_m = [xv, wv]
                args_p[i], args_m[i] = src + e, src - e
                fd[k] = (npv(f(*map(jt.constant, args_p)))
                         - npv(f(*map(jt.constant, args_m)))) / 2e-6
            np.testing.assert_allclose(npv(compiled[i]), fd, rtol=1e-5, atol=1e-7)


# --------------------------------------------------------------------------
# numpy interop

def test_np_asarray():
    t = jt.constant([[1.0, 2.0], [3.0, 4.0]])
    a = np.asarray(t)
    assert isinstance(a, np.ndarray) and a.dtype == np.float32
    np.testing.assert_array_equal(a, [[1, 2], [3, 4]])


@given(xv=floats_array((5,)))
def test_numpy_ufunc_recorded(xv):
    x = jt.constant(xv)
    with jt.GradientTape() as tape:
        tape.watch(x)
        y = np.sin(x)
        z = np.multiply(y, x)
    assert isinstance(z, jt.Tensor)
    g = tape.gradient(z, x)
    np.testing.assert_allclose(npv(g), np.cos(xv) * xv + np.sin(xv), rtol=1e-5, atol=1e-6)


def test_np_sum_recorded():
    xv = np.array([0.5, -1.0, 2.0], np.float32)
    x = jt.constant(xv)
    with jt.GradientTape() as tape:
        tape.watch(x)
        s = np.sum(x * x)
    assert isinstance(s, jt.Tensor)
    assert npv(s) == np.float32(5.25)
    np.testing.assert_array_equal(npv(tape.gradient(s, x)), 2 * xv)


def test_matmul_operator_with_numpy_and_variable():
    tv = np.arange(6, dtype=np.float32).reshape(2, 3)
    wv = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    t = jt.constant(tv)
    w = jt.Variable(wv)
    with jt.GradientTape(persistent=True) as tape:
        tape.watch(t)
        y1 = t @ w
        y2 = t @ wv            # Tensor @ ndarray
        y3 = tv.T @ y2         # ndarray @ Tensor
    np.testing.assert_allclose(npv(y1), tv @ wv, rtol=1e-6)
    np.testing.assert_allclose(npv(y2), tv @ wv, rtol=1e-6)
    assert isinstance(y3, jt.Tensor)
    gt, gw = tape.gradient(y1, [t, w])
    np.testing.assert_allclose(npv(gt), np.tile(wv.sum(1), (2, 1)), rtol=1e-6)
    np.testing.assert_allclose(npv(gw), np.tile(tv.sum(0)[:, None], (1, 4)), rtol=1e-6)
    g3 = tape.gradient(y3, t)
    np.testing.assert_allclose(npv(g3), tv.sum(1, keepdims=True) * wv.sum(1), rtol=1e-5,
                               atol=1e-5)


def test_repr():
    assert repr(jt.constant(6.0)) == "jitape.Tensor(6.0, shape=(), dtype=float32)"
    r = repr(jt.constant([1.0, 2.5]))
    assert r.startswith("jitape.Tensor(") and "2.5" in r
    assert r.endswith("shape=(2,), dtype=float32)")


# --------------------------------------------------------------------------
# float64

def test_set_floatx_float64(floatx64):
    assert jt.floatx() == "float64"
    x = jt.constant(0.7)
    v = jt.Variable(1.3)
    assert x.dtype == np.float64 and v.dtype == np.float64
    with jt.GradientTape() as tape:
        tape.watch(x)
        y = jt.exp(jt.sin(x)) * v
    gx, gv = tape.gradient(y, [x, v])
    assert gx.dtype == np.float64 and gv.dtype == np.float64
    np.testing.assert_allclose(npv(gx), math.exp(math.sin(0.7)) * math.cos(0.7) * 1.3, rtol=1e-14)
    np.testing.assert_allclose(npv(gv), math.exp(math.sin(0.7)), rtol=1e-14)


def test_floatx_default_restored():
    # runs after test_set_floatx_float64 in file order: the fixture restored it
    assert jt.floatx() == "float32"
    assert jt.constant(1.0).dtype == np.float32


def test_numpy_float64_input_keeps_dtype():
    xv = np.array([0.1, 0.2, 0.3])
    x = jt.constant(xv)
    assert x.dtype == np.float64
    with jt.GradientTape() as tape:
        tape.watch(x)
        y = jt.reduce_sum(jt.log1p(x) * x)
    g = tape.gradient(y, x)
    assert g.dtype == np.float64
    np.testing.assert_allclose(npv(g), np.log1p(xv) + xv / (1 + xv), rtol=1e-14)


# --------------------------------------------------------------------------
# structure: gradient makes O(1) Python calls

def _scalar_chain(n_ops):
    x = jt.constant(0.3)
    tape = jt.GradientTape()
    with tape:
        tape.watch(x)
        y = x
        # y = sin(y)*x + 0.5*y alone converges to 0 with a vanishing
        # derivative; "+ x" keeps dy/dx away from 0 so the value is checkable.
        for _ in range(n_ops // 5):     # sin, *, *, +, + : five ops a step
            y = jt.sin(y) * x + 0.5 * y + x
    return tape, y, x


def _count_python_calls(fn):
    counts = collections.Counter()

    def profiler(frame, event, arg):
        if event in ("call", "c_call"):
            counts[event] += 1

    gc.collect()
    gc.disable()
    sys.setprofile(profiler)
    try:
        result = fn()
    finally:
        sys.setprofile(None)
        gc.enable()
    return counts, result


def _chain_reference(n_steps, x0=0.3):
    ys = [x0]
    for _ in range(n_steps):
        ys.append(math.sin(ys[-1]) * x0 + 0.5 * ys[-1] + x0)
    ybar, xbar = 1.0, 0.0
    for y in reversed(ys[:-1]):
        xbar += ybar * (math.sin(y) + 1.0)
        ybar *= math.cos(y) * x0 + 0.5
    return xbar + ybar


@pytest.mark.parametrize("kept_plans", [False, True])
def test_gradient_python_calls_independent_of_tape_length(kept_plans, monkeypatch):
    # Warm up first: a small tape compiles the kernels, a 10,000-op one sizes
    # the per-thread buffers that are reused across sweeps (a one-off growth,
    # not a per-op cost). Then count one gradient of each length: planned anew
    # (no plans kept), or with the plan a tape recording the same rows left.
    monkeypatch.setattr(jitape.program, "_PLANNED_ROWS", 20_000 if kept_plans else 0)
    for n in (40, 1_000, 10_000):
        tape, y, x = _scalar_chain(n)
        tape.gradient(y, x)
    counts = {}
    for n in (1_000, 10_000):
        tape, y, x = _scalar_chain(n)
        counts[n], g = _count_python_calls(lambda: tape.gradient(y, x))
        np.testing.assert_allclose(npv(g), _chain_reference(n // 5), rtol=1e-4)
    assert counts[1_000] == counts[10_000], counts
    assert sum(counts[1_000].values()) < 1_000, counts


# --------------------------------------------------------------------------
# jacobian, batch_jacobian, hessian, hvp, per-example gradients, program

@given(xv=floats_array((3,)))
def test_jacobian_elementwise(xv):
    x = jt.constant(xv)
    with jt.GradientTape() as tape:
        tape.watch(x)
        y = x * x
    j = tape.jacobian(y, x)
    assert j.shape == (3, 3) and j.dtype == np.float32
    np.testing.assert_allclose(npv(j), np.diag(2 * xv), rtol=1e-6)


def test_jacobian_shape_is_target_plus_source():
    rng = np.random.default_rng(4)
    wv = rng.normal(size=(2, 3)).astype(np.float32)
    xv = rng.normal(size=(3,)).astype(np.float32)
    w = jt.Variable(wv)
    other = jt.Variable(np.ones((4,), np.float32))
    with jt.GradientTape(persistent=True) as tape:
        y = jt.tanh(jt.matmul(w, jt.reshape(jt.constant(xv), (3, 1))))[:, 0]
    j = tape.jacobian(y, w)
    assert j.shape == (2, 2, 3)
    yv = np.tanh(wv @ xv)
    expected = np.einsum("i,ij,k->ijk", 1 - yv ** 2, np.eye(2), xv)
    np.testing.assert_allclose(npv(j), expected, rtol=1e-5, atol=1e-7)
    assert tape.jacobian(y, other) is None
    jz = tape.jacobian(y, other, unconnected_gradients="zero")
    assert jz.shape == (2, 4)
    np.testing.assert_array_equal(npv(jz), np.zeros((2, 4), np.float32))


def test_jacobian_of_sigmoid_wrt_scalar():
    delta = jt.constant(0.3)
    grid = jt.linspace(-10.0, 10.0, 201)
    with jt.GradientTape() as tape:
        tape.watch(delta)
        y = jt.nn.sigmoid(grid + delta)
    j = tape.jacobian(y, delta)
    s = 1 / (1 + np.exp(-(np.linspace(-10, 10, 201) + 0.3)))
    assert j.shape == (201,)
    np.testing.assert_allclose(npv(j), s * (1 - s), rtol=1e-4, atol=1e-7)


def test_jacobian_chunked_by_memory_budget(jacobian_budget):
    rng = np.random.default_rng(5)
    m = jt.constant(rng.normal(size=(40, 40)).astype(np.float32) / 6)
    x = jt.constant(rng.normal(size=(40,)).astype(np.float32))

    def jac():
        with jt.GradientTape() as tape:
            tape.watch(x)
            y = jt.tanh(jt.reshape(jt.matmul(m, jt.reshape(x, (40, 1))), (40,)))
        return npv(tape.jacobian(y, x))

    full = jac()
    jacobian_budget(256)    # forces many small chunks
    chunked = jac()
    np.testing.assert_allclose(chunked, full, rtol=1e-6, atol=1e-7)
    yv = np.tanh(npv(m) @ npv(x))
    np.testing.assert_allclose(full, (1 - yv ** 2)[:, None] * npv(m), rtol=1e-5, atol=1e-6)


def test_batch_jacobian():
    rng = np.random.default_rng(6)
    xv = rng.normal(size=(4, 3)).astype(np.float32)
    wv = rng.normal(size=(3, 2)).astype(np.float32)
    x = jt.constant(xv)
    with jt.GradientTape() as tape:
        tape.watch(x)
        y = jt.tanh(x @ jt.constant(wv))
    bj = tape.batch_jacobian(y, x)
    assert bj.shape == (4, 2, 3)
    yv = np.tanh(xv @ wv)
    np.testing.assert_allclose(npv(bj), (1 - yv ** 2)[:, :, None] * wv.T[None], rtol=1e-5,
                               atol=1e-6)


def test_batch_jacobian_rejects_mixed_rows():
    x = jt.constant(np.arange(12, dtype=np.float32).reshape(4, 3))
    with jt.GradientTape() as tape:
        tape.watch(x)
        y = x - jt.reduce_mean(x, axis=0, keepdims=True)   # batch-norm style
    with pytest.raises(ValueError):
        tape.batch_jacobian(y, x)


def test_batch_jacobian_first_dimensions_differ():
    x = jt.constant(np.ones((4, 3), np.float32))
    with jt.GradientTape() as tape:
        tape.watch(x)
        y = jt.transpose(x * 2.0)          # (3, 4)
    with pytest.raises(ValueError):
        tape.batch_jacobian(y, x)


@given(xv=floats_array((3,), -2.0, 2.0), vv=floats_array((3,), -2.0, 2.0))
@settings(max_examples=25)
def test_hessian_and_hvp(xv, vv):
    def f(x):
        return jt.reduce_sum(x ** 3) + x[0] * x[1]

    expected_h = np.diag(6 * xv.astype(np.float64))
    expected_h[0, 1] = expected_h[1, 0] = 1.0
    x = jt.constant(xv)
    with jt.GradientTape() as tape:
        tape.watch(x)
        y = f(x)
    h = tape.hessian(y, x)
    assert h.shape == (3, 3) and h.dtype == np.float32
    np.testing.assert_allclose(npv(h), expected_h, rtol=1e-5, atol=1e-5)

    with jt.GradientTape() as tape:
        tape.watch(x)
        y = f(x)
    hv = tape.hessian_vector_product(y, x, jt.constant(vv))
    assert hv.shape == (3,)
    np.testing.assert_allclose(npv(hv), expected_h @ vv, rtol=1e-4, atol=1e-4)


def test_hessian_of_matrix_source():
    xv = np.array([[1.0, -2.0], [0.5, 3.0]], np.float32)
    x = jt.Variable(xv)
    with jt.GradientTape() as tape:
        y = jt.reduce_sum(x ** 3)
    h = tape.hessian(y, x)
    assert h.shape == (2, 2, 2, 2)
    np.testing.assert_allclose(npv(h).reshape(4, 4), np.diag(6 * xv.ravel()), rtol=1e-6)


def test_per_example_gradients():
    rng = np.random.default_rng(7)
    xv = rng.normal(size=(5, 3)).astype(np.float32)
    tv = rng.normal(size=(5,)).astype(np.float32)
    w = jt.Variable(rng.normal(size=(3,)).astype(np.float32))
    b = jt.Variable(0.25)
    with jt.GradientTape() as tape:
        pred = jt.reduce_sum(jt.constant(xv) * w, axis=1) + b
        losses = jt.square(pred - jt.constant(tv))          # (B,)
    gw, gb = tape.per_example_gradients(losses, [w, b])
    r = xv @ npv(w) + 0.25 - tv
    assert gw.shape == (5, 3) and gb.shape == (5,)
    np.testing.assert_allclose(npv(gw), 2 * r[:, None] * xv, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(npv(gb), 2 * r, rtol=1e-5, atol=1e-6)


def test_per_example_gradients_rejects_mixed_rows():
    xv = np.arange(6, dtype=np.float32).reshape(3, 2)
    w = jt.Variable(np.ones(2, np.float32))
    with jt.GradientTape() as tape:
        p = jt.reduce_sum(jt.constant(xv) * w, axis=1)
        losses = jt.square(p - jt.reduce_mean(p))
    with pytest.raises(ValueError):
        tape.per_example_gradients(losses, [w])


def test_program_listing():
    x = jt.constant(0.5)
    with jt.GradientTape(persistent=True) as tape:
        tape.watch(x)
        unrelated = jt.cos(x)               # recorded, but not on the path to y
        y = jt.sin(x) * x
    prog = tape.program(y, x)
    assert 1 <= len(prog) <= 3
    listing = str(prog)
    assert "sin" in listing.lower()
    assert "cos" not in listing.lower()   # pruned: not on a path from x to y
    np.testing.assert_allclose(npv(tape.gradient(y, x)), np.cos(0.5) * 0.5 + np.sin(0.5),
                               rtol=1e-6)
    assert unrelated is not None


# --------------------------------------------------------------------------
# a variable assigned while a tape records: each read keeps its own value (TensorFlow's numbers)

def test_gradient_sums_over_reads_of_a_variable_assigned_mid_tape():
    v = jt.Variable(1.0)
    with jt.GradientTape(persistent=True) as tape:
        y1 = v * 2.0
        v.assign(3.0)
        y2 = v * v
        total = y1 + y2
    assert float(tape.gradient(total, v)) == 8.0      # TF 2.21: 8.0 (2 from the first read, 6 from the second)
    assert float(tape.gradient(y1, v)) == 2.0
    assert float(tape.gradient(y2, v)) == 6.0
    with jt.GradientTape() as enclosing:               # the recorded (Python VJP) path agrees
        enclosing.watch(v)
        assert float(tape.gradient(total, v)) == 8.0


def test_vjps_of_earlier_reads_use_the_value_before_assign_add():
    w = jt.Variable(2.0)
    with jt.GradientTape() as tape:
        a = w * w
        w.assign_add(1.0)
        b = a * w
    assert float(tape.gradient(b, w)) == 16.0         # TF 2.21: 2*2*3 + 4
    w = jt.Variable(2.0)
    with jt.GradientTape() as outer:
        with jt.GradientTape() as inner:
            a = w * w
            w.assign_add(1.0)
            b = a * w
        g = inner.gradient(b, w)
    assert float(g) == 16.0
    assert float(outer.gradient(g, w)) == 2 * 3 + 2 * 2 + 2 * 2   # d/dw of 2*w_old*w_new + w_old**2, both reads


def test_numpy_views_of_a_tensor_cannot_change_recorded_values():
    x = jt.constant([1.0, 2.0])
    with jt.GradientTape() as tape:
        tape.watch(x)
        y = jt.reduce_sum(x * x)
    view = np.asarray(x)
    with pytest.raises(ValueError, match="read-only"):
        view[0] = 5.0
    copy = np.array(x)
    copy[0] = 5.0                                    # np.array copies: free to change
    np.testing.assert_array_equal(tape.gradient(y, x).numpy(), [2.0, 4.0])


def test_emit_of_one_two_or_three_inputs_records_what_record_and_the_first_reads_path_record():
    from jitape.ops.core import PRIMITIVES
    from jitape.recording import emit, record
    x, y, mask = jt.constant([1.0, 2.0]), jt.constant([3.0, -1.0]), jt.constant([1.0, 0.0])
    sin, add, where = PRIMITIVES["sin"], PRIMITIVES["add"], PRIMITIVES["where"]
    with jt.GradientTape() as tape:     # the shape's slot row known: both tapes below give x and y slots at watch
        tape.watch(x)
        jt.sin(x)
    found = []
    for one, two in [(lambda: emit(sin, (x,), np.sin(x._value)), lambda: emit(add, (x, y), x._value + y._value)),
                     (lambda: record(sin, x, None, np.sin(x._value)),
                      lambda: record(add, x, y, x._value + y._value))]:
        with jt.GradientTape() as tape:
            tape.watch([x, y])
            first_reads = [one(), two()]       # the constant mask's first read below: _record_first_reads
            inline = [one(), two()]            # their slots known: the inline path
            picked = emit(where, (mask, inline[0], inline[1]), np.where(mask._value != 0, inline[0]._value,
                                                                        inline[1]._value))
            total = jt.reduce_sum(first_reads[0] + first_reads[1] + inline[0] * inline[1] + picked)
        rows = b"".join(tape._rows)
        found.append((rows, [v.tolist() for v in tape._values], [g.numpy().tolist() for g in tape.gradient(
            total, [x, y])]))
    assert found[0] == found[1]
    rows = np.frombuffer(found[0][0], np.int64).reshape(-1, 6)
    assert rows[:, 0].tolist()[:5] == [sin.opcode, add.opcode, sin.opcode, add.opcode, where.opcode]
    s, c = np.sin([1.0, 2.0]), np.cos([1.0, 2.0])
    expected_x = c + 1 + c * np.array([4.0, 1.0]) + s + np.where([True, False], c, 1.0)
    np.testing.assert_allclose(found[0][2][0], expected_x, rtol=1e-6)


def test_watch_gives_a_tensor_its_slot_and_a_rank_it_cannot_record_raises_only_when_recorded():
    x = jt.constant(np.ones((2, 3)))
    deep = jt.constant(np.ones((1,) * 9))
    with jt.GradientTape() as tape:
        tape.watch(x)
        jt.reduce_sum(x)        # the shape's slot row is known from here on
    with jt.GradientTape() as tape:
        tape.watch([x, deep])           # x: a slot now (its first reads take record's inline path); deep: none
        assert x._id in tape._slot_of and deep._id not in tape._slot_of
        y = jt.reduce_sum(x * x)
        with pytest.raises(ValueError, match="rank at most 8"):
            jt.reduce_sum(deep)
    np.testing.assert_array_equal(tape.gradient(y, x).numpy(), 2 * np.ones((2, 3)))
