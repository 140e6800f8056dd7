"""jt.function: traces replay on new inputs, guards retrace instead of returning a stale branch, variables are
inputs and outputs, calls under tapes, and a replay costs the same Python calls whatever the Program's length."""
import warnings

import numpy as np
import pytest

import jitape as jt
from jitape_kernels import opcodes as oc
from jitape_kernels.layout import FUSE_MIN_SIZE
from tests.test_tape import _count_python_calls


def test_a_replay_recomputes_value_dependent_masks():
    @jt.function
    def f(x):
        return jt.reduce_sum(jt.where(x > 0, x * x, -x))

    assert float(f(jt.constant([1.0, -2.0, 0.5]))) == pytest.approx(3.25)
    assert float(f(jt.constant([1.5, -0.5, -1.0]))) == pytest.approx(3.75)     # traced branch would give 1.25
    assert f.trace_count == 1


def test_masks_of_relu_maximum_clip_and_abs_replay_with_their_gradients():
    def loss(x, y):
        return jt.reduce_sum(jt.nn.relu(x) * jt.maximum(x, y) + jt.abs(y) + jt.clip_by_value(x * y, -0.5, 0.5))

    step = jt.function(lambda x, y: jt.grad(loss, argnums=(0, 1))(x, y))
    rng = np.random.default_rng(0)
    for _ in range(4):
        x, y = (jt.constant(rng.normal(size=6)) for _ in range(2))
        with jt.GradientTape() as tape:
            tape.watch([x, y])
            value = loss(x, y)
        expected = tape.gradient(value, [x, y])
        for got, want in zip(step(x, y), expected):
            np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6)
    assert step.trace_count == 1


def test_variables_are_read_at_each_call_and_assignments_are_replayed():
    w = jt.Variable([1.0, 2.0])
    counter = jt.Variable(0.0, trainable=False)

    @jt.function
    def f(x):
        counter.assign_add(1.0)
        y = jt.reduce_sum(w * x)
        w.assign(w * 2.0)
        return y

    assert float(f(jt.constant([1.0, 1.0]))) == 3.0
    np.testing.assert_array_equal(w.numpy(), [2.0, 4.0])
    assert float(f(jt.constant([1.0, 1.0]))) == 6.0
    np.testing.assert_array_equal(w.numpy(), [4.0, 8.0])
    w.assign([1.0, 1.0])
    assert float(f(jt.constant([2.0, 3.0]))) == 5.0
    assert float(counter) == 3.0 and f.trace_count == 1


def test_new_shapes_dtypes_and_python_numbers_retrace():
    f = jt.function(lambda x, c: x * c)
    f(jt.constant([1.0]), 2.0)
    f(jt.constant([3.0]), 2.0)
    assert f.trace_count == 1
    np.testing.assert_array_equal(f(jt.constant([1.0, 2.0]), 2.0).numpy(), [2.0, 4.0])
    np.testing.assert_array_equal(f(jt.constant([1.0]), 3.0).numpy(), [3.0])
    assert f(jt.constant([1.0], jt.float64), 3.0).dtype == np.float64
    assert f.trace_count == 4


def test_a_flipped_guard_never_returns_the_stale_branch():
    @jt.function
    def f(x):
        if jt.reduce_sum(x) > 0:
            return x * 2.0
        return x * 3.0

    for values in ([1.0, 2.0], [-1.0, -2.0], [3.0, 1.0], [-4.0, 1.0], [0.5, 0.5]):
        expected = np.array(values, np.float32) * (2.0 if sum(values) > 0 else 3.0)
        np.testing.assert_array_equal(f(jt.constant(values)).numpy(), expected)
    assert f.trace_count == 2       # one variant per guard outcome, then replays only


def test_values_read_into_python_are_guards():
    @jt.function
    def f(x):
        n = int(jt.argmax(x))           # an op computed on values: a guard on x
        return x[n] * float(jt.reduce_max(x))

    for values in ([1.0, 3.0, 2.0], [4.0, 0.0, 1.0], [1.0, 3.0, 2.0]):
        x = np.array(values, np.float32)
        assert float(f(jt.constant(values))) == pytest.approx(float(x[np.argmax(x)] * x.max()))


def test_the_retrace_warning_names_the_argument_and_the_guard():
    f = jt.function(lambda x: x + 1.0, retrace_warning=2)
    with pytest.warns(UserWarning, match="argument leaf 0 changed"):
        for n in range(1, 5):
            f(jt.zeros((n,)))
    g = jt.function(lambda x: x * float(x), retrace_warning=1)
    with pytest.warns(UserWarning, match=r"float\(tensor\)"):
        for v in (1.0, 2.0, 3.0):
            assert float(g(jt.constant(v))) == v * v


def test_a_function_under_tapes_and_nested_tapes():
    f = jt.function(lambda x: jt.reduce_sum(jt.sin(x) * x))
    x = jt.constant([0.3, -1.2])
    with jt.GradientTape() as outer:
        outer.watch(x)
        with jt.GradientTape() as inner:
            inner.watch(x)
            y = f(x)
        g = inner.gradient(y, x)
        s = jt.reduce_sum(g)
    h = outer.gradient(s, x)
    xv = x.numpy()
    np.testing.assert_allclose(g.numpy(), np.sin(xv) + xv * np.cos(xv), rtol=1e-6)
    np.testing.assert_allclose(h.numpy(), 2 * np.cos(xv) - xv * np.sin(xv), rtol=1e-5)


def test_a_training_step_with_an_inner_tape_replays_equal_to_eager():
    rng = np.random.default_rng(1)
    data = [(rng.normal(size=(8, 3)), rng.normal(size=(8, 1))) for _ in range(5)]

    def make():
        return jt.Variable(np.full((3, 1), 0.5)), jt.Variable(np.zeros(1))

    def step(w, b, x, y):
        with jt.GradientTape() as tape:
            loss = jt.reduce_mean(jt.square(jt.nn.relu(jt.matmul(x, w) + b) - y))
        gw, gb = tape.gradient(loss, [w, b])
        w.assign_sub(0.1 * gw)
        b.assign_sub(0.1 * gb)
        return loss

    eager_w, eager_b = make()
    traced_w, traced_b = make()
    traced = jt.function(lambda x, y: step(traced_w, traced_b, x, y))
    for x, y in data * 4:
        expected = step(eager_w, eager_b, jt.constant(x), jt.constant(y))
        got = traced(jt.constant(x), jt.constant(y))
        assert float(got) == pytest.approx(float(expected), rel=1e-14)     # numpy sums pairwise, kernels in order
        np.testing.assert_array_equal(traced_w.numpy(), eager_w.numpy())
        np.testing.assert_array_equal(traced_b.numpy(), eager_b.numpy())
    assert traced.trace_count == 1


def _chain(n_ops):
    def f(x):
        y = x
        for _ in range(n_ops // 2):
            y = jt.sin(y) * 0.5
        return y
    return jt.function(f)


def test_replays_make_the_same_python_calls_whatever_the_length():
    counts = {}
    for n in (1_000, 10_000):
        f = _chain(n)
        x = jt.constant(0.3)
        f(x)
        counts[n], _ = _count_python_calls(lambda: f(x))
    assert counts[1_000] == counts[10_000], counts
    assert sum(counts[1_000].values()) < 300, counts


def test_a_function_used_as_a_method_traces_per_instance():
    class Scale:
        def __init__(self, c):
            self.c = jt.Variable(c)

        @jt.function
        def __call__(self, x):
            return x * self.c

    a, b = Scale(2.0), Scale(3.0)
    assert float(a(jt.constant(1.0))) == 2.0 and float(b(jt.constant(1.0))) == 3.0
    assert float(a(jt.constant(2.0))) == 4.0


def test_nothing_is_left_recording_when_the_function_raises():
    @jt.function
    def f(x):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        f(jt.constant(1.0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y = jt.constant(2.0) * 2.0      # no trace is left active
    assert float(y) == 4.0
    assert not jt.recording.recording_tapes()


@pytest.mark.parametrize("width", [2, 6000])      # 6000: the updates and the layer run as fused groups
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("make_optimizer", [lambda: jt.optimizers.Adam(0.05), lambda: jt.optimizers.Adam(0.05, amsgrad=True),
                                            lambda: jt.optimizers.SGD(0.1, momentum=0.9, nesterov=True),
                                            lambda: jt.optimizers.SGD(0.1)])
def test_a_training_step_with_an_optimizer_replays_like_eager_for_100_steps(make_optimizer, dtype, width):
    rng = np.random.default_rng(4)
    x, y = rng.normal(size=(16, 3)).astype(dtype), rng.normal(size=(16, width)).astype(dtype)
    init = [rng.normal(size=(3, width)).astype(dtype), np.zeros(width, dtype)]

    def model():
        return [jt.Variable(v) for v in init], make_optimizer()

    def step(params, opt, x, y):
        with jt.GradientTape() as tape:
            loss = jt.reduce_mean(jt.square(jt.nn.relu(jt.matmul(x, params[0]) + params[1]) - y))
        opt.apply_gradients(zip(tape.gradient(loss, params), params))
        return loss

    eager_params, eager_opt = model()
    params, opt = model()
    traced = jt.function(lambda x, y: step(params, opt, x, y))
    for _ in range(100):
        expected = step(eager_params, eager_opt, jt.constant(x), jt.constant(y))
        loss = traced(jt.constant(x), jt.constant(y))
        assert float(loss) == pytest.approx(float(expected), rel=1e-6)     # numpy sums pairwise, kernels in order
        for p, e in zip(params, eager_params):      # bit for bit: the replay's gradient is the same compiled sweep
            np.testing.assert_array_equal(p.numpy(), e.numpy())
    assert opt.iterations == eager_opt.iterations == 100 and traced.trace_count == 1
    (concrete,) = [c for variants in traced._variants.values() for c in variants]
    assert len(concrete.gradient_steps) == 1      # one compiled reverse sweep per replay, no recorded VJPs
    assert np.any(concrete._fused) == (width * 3 >= FUSE_MIN_SIZE)


@pytest.mark.parametrize("width", [2, 6000])
@pytest.mark.parametrize("make_optimizer", [lambda: jt.optimizers.Adam(0.05, amsgrad=True),
                                            lambda: jt.optimizers.SGD(0.1, momentum=0.9)])
def test_eager_and_replayed_steps_of_one_optimizer_take_turns_like_eager_steps(make_optimizer, width):
    # the eager update writes the optimizer's slot variables in place: a replay reading them must see it
    rng = np.random.default_rng(5)
    x = jt.constant(rng.normal(size=(8, 3)).astype(np.float32))
    init = rng.normal(size=(3, width)).astype(np.float32)

    def step(w, opt):
        with jt.GradientTape() as tape:
            loss = jt.reduce_sum(jt.sin(jt.matmul(x, w)))
        opt.apply_gradients([(tape.gradient(loss, w), w)])

    eager_w, eager_opt = jt.Variable(init), make_optimizer()
    w, opt = jt.Variable(init), make_optimizer()
    traced = jt.function(lambda: step(w, opt))
    for replayed in [0, 1, 1, 0, 0, 1, 0, 1, 1, 1, 0]:
        step(eager_w, eager_opt)
        traced() if replayed else step(w, opt)
        np.testing.assert_array_equal(w.numpy(), eager_w.numpy())
    assert traced.trace_count == 1


def test_cond_and_while_loop_trip_counts_are_guards():
    @jt.function
    def f(x):
        y = jt.cond(jt.reduce_sum(x) > 0, lambda: x * 2.0, lambda: 1.0 - x)
        _, z = jt.while_loop(lambda i, z: jt.reduce_sum(z) < 10.0, lambda i, z: (i + 1, z * 2.0),
                             (jt.constant(0), y))
        return z

    for values in ([1.0, 1.0], [0.5, 0.25], [-1.0, -2.0], [1.0, 1.0], [3.0, 2.0], [-4.0, 1.0]):
        x = np.array(values, np.float32)
        z = x * 2.0 if x.sum() > 0 else 1.0 - x
        while z.sum() < 10.0:
            z = z * 2.0
        np.testing.assert_allclose(f(jt.constant(values)).numpy(), z)


def test_shapes_read_with_numpy_are_no_guards():
    f = jt.function(lambda x: x * float(np.size(x)) + np.zeros_like(x))
    for values in ([1.0, 2.0], [3.0, 4.0], [5.0, 6.0]):
        np.testing.assert_array_equal(f(jt.constant(values)).numpy(), np.array(values, np.float32) * 2)
    assert f.trace_count == 1


def test_a_replayed_program_keeps_only_its_own_slots_and_attributes():
    @jt.function
    def f(x):
        unused = jt.reduce_sum(jt.transpose(jt.reshape(x, (2, 2)))) * 3.0    # recorded, not an output
        del unused
        return jt.clip_by_value(x, -0.5, 0.5) * 2.0

    x = jt.constant([0.1, -1.0, 2.0, 0.3])
    f(x)
    concrete = f.concrete(x)
    assert len(concrete) == 2 and concrete.slots.shape[0] == 3
    assert concrete.iattr.size == 2 and concrete.fattr.tolist() == [-0.5, 0.5, 2.0]
    np.testing.assert_allclose(f(jt.constant([0.2, 0.9, -3.0, 0.0])).numpy(), [0.4, 1.0, -1.0, 0.0])


@pytest.mark.parametrize("name,op", [
    ("a Python float", lambda x: jt.sqrt(x) + 1e-7),
    ("a numpy scalar", lambda x: x * np.float32(3.0) - np.float32(0.5) * x),
    ("a row", lambda x: jt.maximum(x, np.linspace(0.0, 1.0, 300, dtype=np.float32))),
    ("a column, in where", lambda x: jt.where(x > 0.5, x, np.ones((200, 1), np.float32))),
    ("a tiled row", lambda x: x * jt.tile(jt.constant(np.linspace(0.0, 1.0, 30, dtype=np.float32)[None]), [200, 10])),
])
def test_a_broadcast_constant_stays_its_own_size_in_a_replayed_program(name, op):
    f = jt.function(op)
    x = jt.constant(np.random.default_rng(1).uniform(0, 1, (200, 300)).astype(np.float32))
    for _ in range(2):
        np.testing.assert_array_equal(f(x).numpy(), op(x).numpy())
    concrete = f.concrete(x)
    produced = set(concrete.code[:, oc.OUT].tolist()) | {slot for _, slot in concrete.arg_slots}
    constants = [s for s in range(concrete.slots.shape[0]) if s not in produced]
    assert constants and all(concrete.slots[s, oc.SIZE] <= 300 for s in constants)   # never x's 60,000 entries


def test_inner_gradients_of_a_differentiated_function_are_recorded():
    def inner_gradient(x):
        with jt.GradientTape() as tape:
            tape.watch(x)
            y = jt.reduce_sum(x ** 3)
        return tape.gradient(y, x)

    f = jt.function(inner_gradient)
    second = jt.grad(lambda x: jt.reduce_sum(inner_gradient(x) * x))
    for values in ([1.0, 2.0], [-0.5, 3.0]):
        x = jt.constant(values, jt.float64)
        np.testing.assert_allclose(f(x).numpy(), 3 * np.array(values) ** 2)
        np.testing.assert_allclose(second(x).numpy(), 9 * np.array(values) ** 2)
    (concrete,) = [c for variants in f._variants.values() for c in variants]
    assert len(concrete.gradient_steps) == 1


def _sgd_step(w):
    """A jt.function taking one SGD step of w on a squared error: a gradient step, then a variable write."""
    @jt.function
    def step(x):
        with jt.GradientTape() as tape:
            loss = jt.reduce_sum(jt.square(w * x - 1.0))
        w.assign_sub(0.1 * tape.gradient(loss, w))
        return loss
    return step


def test_a_saved_training_step_replays_in_a_loaded_function(tmp_path):
    w = jt.Variable([0.5, -1.0])
    step = _sgd_step(w)
    x = jt.constant([1.0, 2.0])
    step(x)
    jt.save(tmp_path / "step.npz", step)
    loaded = jt.load(tmp_path / "step.npz")
    (lw,) = loaded.variables
    for _ in range(5):
        assert float(loaded(x)) == pytest.approx(float(step(x)), rel=1e-6)
        np.testing.assert_array_equal(lw.numpy(), w.numpy())


def test_an_inner_gradient_through_a_variable_assigned_between_its_reads():
    v = jt.Variable(2.0)

    def step(x):
        with jt.GradientTape() as tape:
            a = v * x
            v.assign(v * 3.0)
            b = v * x
            loss = a + b
        return tape.gradient(loss, v)

    traced = jt.function(step)
    for value in (1.0, 2.0, -1.5):
        v.assign(2.0)
        expected = step(jt.constant(value))
        v.assign(2.0)
        assert float(traced(jt.constant(value))) == pytest.approx(float(expected))


def test_stop_gradient_is_recorded_a_replay_recomputes_it_and_derivatives_treat_it_as_a_constant():
    """stop_gradient is an instruction (STOP_GRADIENT): a replay recomputes its value without tracing again
    (before it was a guard, and before that a stale constant: f(5) was 9), and every derivative path (reverse,
    forward mode, second order, a jt.function inside a tape) sees a constant."""
    f = jt.function(lambda x: x * 2 - jt.stop_gradient(x))
    assert [float(f(jt.constant(v))) for v in (1.0, 5.0, -2.5)] == [1.0, 5.0, -2.5] and f.trace_count == 1
    g = jt.grad(lambda x: x * jt.stop_gradient(x) ** 2)
    assert [float(g(jt.constant(v))) for v in (3.0, 5.0)] == [9.0, 25.0]
    # the inner gradient is recorded with the Python VJPs inside the outer trace: d/dx (3 x^2 sg(x)) = 6 x sg(x)
    gg = jt.grad(jt.grad(lambda x: x ** 3 * jt.stop_gradient(x)))
    assert [float(gg(jt.constant(v))) for v in (2.0, 3.0)] == [24.0, 54.0]
    h = jt.hessian(lambda x: jt.reduce_sum(x ** 2 * jt.stop_gradient(x)))
    np.testing.assert_allclose(h(jt.constant([1.0, -2.0])).numpy(), np.diag([2.0, -4.0]))
    np.testing.assert_allclose(h(jt.constant([3.0, 0.5])).numpy(), np.diag([6.0, 1.0]))
    weights = jt.constant([1.0, 2.0, 3.0])
    forward_mode = jt.jacobian(lambda d: d * jt.stop_gradient(d) * weights)     # one source, three outputs
    np.testing.assert_allclose(forward_mode(jt.constant(2.0)).numpy(), [2.0, 4.0, 6.0])
    np.testing.assert_allclose(forward_mode(jt.constant(-1.0)).numpy(), [-1.0, -2.0, -3.0])
    inner = jt.function(lambda x: jt.reduce_sum(x * jt.stop_gradient(jt.exp(x))))
    for values in ([0.0, 1.0], [2.0, -1.0]):
        x = jt.constant(values)
        with jt.GradientTape() as tape:
            tape.watch(x)
            y = inner(x)
        np.testing.assert_allclose(tape.gradient(y, x).numpy(), np.exp(values), rtol=1e-6)
    assert inner.trace_count == 1


def test_a_replay_writes_a_variable_in_place_only_when_nothing_else_sees_its_value():
    v = jt.Variable(np.zeros(5, np.float32))
    f = jt.function(lambda: v.assign_add(jt.ones(5)))
    f()
    f()
    held, read, view = v.numpy(), v.read_value(), v._value[1:]
    f()
    # what was read before the call keeps the value it had
    assert held.tolist() == read.numpy().tolist() == [2.0] * 5 and view.tolist() == [2.0] * 4
    assert v.numpy().tolist() == [3.0] * 5
    value = id(v._value)
    f()
    assert id(v._value) == value and v.numpy().tolist() == [4.0] * 5      # no one held it: written in place


def test_a_replay_leaves_its_written_variables_in_its_arena_until_they_are_read():
    """A training loop's replays copy no variable back per call: each variable takes its value when first read,
    into its own array where nothing else holds that, and every reader (numpy, a tape, another function, the
    optimizer's own state) sees the value of the last call."""
    v = jt.Variable(np.zeros(1000, np.float32))
    w = jt.Variable(np.ones(1000, np.float32))
    step = jt.function(lambda: (v.assign(v + w), w.assign(w * 2.0))[0])
    twice = jt.function(lambda: v * 2.0)
    step()
    step()
    stored = id(v._value)
    expected_v, expected_w = np.float32(3.0), np.float32(4.0)
    for _ in range(3):
        step()
        expected_v, expected_w = expected_v + expected_w, expected_w * 2
        assert v._pending is not None and w._pending is not None        # left in the arena
    held = v.read_value()       # taken now: into v's own array, which nothing else held
    assert id(v._value) == stored and held.numpy()[0] == expected_v and w.numpy()[0] == expected_w
    step()
    expected_v, expected_w = expected_v + expected_w, expected_w * 2
    assert held.numpy()[0] == expected_v - expected_w / 2       # what was read keeps its value
    np.testing.assert_array_equal(twice().numpy(), np.full(1000, 2 * expected_v))     # another replay reads it
    with jt.GradientTape() as tape:
        y = jt.reduce_sum(v * w)
    np.testing.assert_array_equal(tape.gradient(y, v).numpy(), np.full(1000, expected_w))
    v.assign(np.zeros(1000, np.float32))        # an assignment replaces a value never taken
    step()
    assert v.numpy()[0] == expected_w
    step()
    step.replay((), {})     # a run that never writes its variables (internal): the values it ran over are lost
    for _ in range(2):
        with pytest.raises(RuntimeError, match="variable 'Variable'.*lost"):
            v.numpy()
    v.assign(np.ones(1000, np.float32))
    assert v.numpy()[0] == 1.0


def _rows_shared(concrete, variable):
    """Whether the variant reads `variable` and writes its new value in the same arena rows (in place)."""
    (read,) = [s for v, s in concrete.variable_inputs if v is variable]
    (written,) = [s for v, s in concrete.writes if v is variable]
    return concrete._bounds(read) == concrete._bounds(written)


@pytest.mark.parametrize("shape", [(), (6,)])
def test_a_replay_updates_variables_in_its_arena_and_reads_them_there_until_they_change(shape):
    """A training step's variables live in their replay's arena between calls: whatever changed a variable since
    (an assignment, another function's replay, a replay stopped by a guard) is read again."""
    start = np.arange(6.0)[-int(np.prod(shape)):].reshape(shape)
    v = jt.Variable(start)
    w = jt.Variable(np.ones(shape))
    step = jt.function(lambda: (v.assign(v * 0.5 + w), w.assign_add(v))[0])
    other = jt.function(lambda: v.assign_sub(jt.ones(shape)))
    expected_v, expected_w = start, np.ones(shape)

    def check(run):
        nonlocal expected_v, expected_w
        if run == "step":
            expected_v = expected_v * 0.5 + expected_w
            expected_w = expected_w + expected_v
            step()
        elif run == "other":
            expected_v = expected_v - 1.0
            other()
        elif run == "assign":
            expected_v = expected_v + 10.0
            v.assign(v + 10.0)
        np.testing.assert_array_equal(v.numpy(), expected_v)
        np.testing.assert_array_equal(w.numpy(), expected_w)

    for run in ["step", "step", "step", "other", "step", "assign", "step", "step", "other", "other", "step"]:
        check(run)
    concrete = step.concrete()
    assert _rows_shared(concrete, v) and _rows_shared(concrete, w)
    step()
    assert v._pending is not None and w._pending is not None        # 0-d values too are left in the arena
    assert step.trace_count == 1 and other.trace_count == 1


def test_a_variable_read_after_its_new_value_is_written_keeps_rows_of_its_own():
    v = jt.Variable(np.arange(4.0))

    def f():
        before = jt.identity(v)         # a copy: it reads v's rows
        v.assign(v + 1.0)
        return before * 2.0             # read after the write: v cannot be updated in place

    replayed = jt.function(f)
    for expected in ([0.0, 2.0, 4.0, 6.0], [2.0, 4.0, 6.0, 8.0], [4.0, 6.0, 8.0, 10.0]):
        np.testing.assert_array_equal(replayed().numpy(), expected)
    np.testing.assert_array_equal(v.numpy(), [3.0, 4.0, 5.0, 6.0])
    assert not _rows_shared(replayed.concrete(), v)


def test_a_guard_that_stops_a_replay_leaves_no_stale_variable_in_its_arena():
    """Guards are checked after the replay's rows ran: a replay stopped by one has updated v in its arena but
    not v itself, and the next call of that variant (after another that leaves v alone) reads v again."""
    v = jt.Variable(np.array([1.0, 2.0]))

    @jt.function
    def f(x):
        if float(jt.reduce_sum(x)) > 0:
            v.assign(v * 2.0)
            return v + 0.0
        return x * 1.0

    assert f(jt.constant([1.0])).numpy().tolist() == [2.0, 4.0]
    assert f(jt.constant([1.0])).numpy().tolist() == [4.0, 8.0]
    assert f(jt.constant([-1.0])).numpy().tolist() == [-1.0]      # the first variant's guard stops it: a new trace
    assert f(jt.constant([-1.0])).numpy().tolist() == [-1.0]
    assert f(jt.constant([1.0])).numpy().tolist() == [8.0, 16.0]   # the first variant again: v read again
    assert f.trace_count == 2 and v.numpy().tolist() == [8.0, 16.0]


def test_an_argument_is_copied_again_unless_it_is_the_tensor_the_last_call_copied():
    f = jt.function(lambda x: x * 2.0)
    x = jt.constant(np.arange(3.0))
    assert f(x).numpy().tolist() == f(x).numpy().tolist() == [0.0, 2.0, 4.0]
    array = np.arange(3.0)
    assert f(array).numpy().tolist() == [0.0, 2.0, 4.0]
    array[:] = 5.0                      # numpy arrays are mutable: always copied
    assert f(array).numpy().tolist() == [10.0] * 3
    assert f(jt.constant(np.ones(3))).numpy().tolist() == [2.0] * 3
    assert f(x).numpy().tolist() == [0.0, 2.0, 4.0]
