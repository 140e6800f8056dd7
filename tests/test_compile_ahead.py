"""jitape_kernels/cpu/compile_ahead.py: a process's first derivative on a cold cache names, from the recorded rows, the
planners, sweeps and row kernels it will call, and compiles them side by side before planning; the derivative then
asks for nothing it did not name, and a cold first gradient compiles nothing after its cold start."""
import contextlib
import os
import subprocess
import sys

import numpy as np
import pytest

import jitape as jt
from jitape_kernels import opcodes as oc, parallel_compile
from jitape_kernels.cpu import compile_ahead, interpreter, row_kernels, tangents
from jitape_kernels.layout import FUSE_MIN_SIZE
from jitape_kernels.planning import derivative_plan, plan


@pytest.fixture
def named(monkeypatch):
    """The (kernel, signature) pairs cold starts name, every sweep taken as cold (nothing compiled ahead: the
    kernels load as the derivative asks for them); and, as `asked`, the pairs kernel tables then ask for, in tables
    made anew."""
    pairs, asked = [], []
    monkeypatch.setattr(compile_ahead, "_started", set())
    monkeypatch.setattr(compile_ahead, "_lacks", lambda sweep: True)
    monkeypatch.setattr(compile_ahead, "workers_run", lambda: True)
    monkeypatch.setattr(compile_ahead, "side_by_side", contextlib.contextmanager(lambda: (yield pairs.extend)))
    ready = row_kernels.ready
    monkeypatch.setattr(row_kernels, "ready", lambda wanted: (asked.extend(wanted), ready(wanted)))
    monkeypatch.setattr(row_kernels, "_by_kind", {})
    return pairs, asked


def _chain(x):
    y = x
    for _ in range(30):
        y = jt.sin(y) * x + 0.5 * y
    return y


def _arrays(x):
    return jt.reduce_sum(jt.matmul(jt.reshape(jt.tanh(x), (4, -1)), jt.reshape(x, (-1, 4))) * 2.0) + jt.reduce_max(x)


def _large(x):
    return jt.reduce_sum(jt.exp(x) * x - jt.sin(x))


CASES = [(_chain, np.float64(0.3)), (_chain, np.float32(0.3)), (_arrays, np.linspace(0.1, 1.0, 16)),
         (_arrays, np.linspace(0.1, 1.0, 16, dtype=np.float32)), (_large, np.linspace(0, 1, FUSE_MIN_SIZE + 4))]


def _names(pairs):
    return sorted(dispatcher.__name__ for dispatcher, _ in set(pairs))


def _check(named, asked, sweeps):
    """Every pair asked for was named, and so were the sweeps and planners with the signatures they ran."""
    assert set(asked) <= set(named), _names(set(asked) - set(named))
    for dispatcher in (*sweeps, plan, interpreter.planned_temps):
        (signature,) = {s for d, s in named if d is dispatcher}
        assert signature in dispatcher.overloads


@pytest.mark.parametrize("f, x", CASES)
def test_a_cold_start_names_what_a_first_tape_gradient_asks_for(named, f, x):
    pairs, asked = named
    x = jt.constant(x)
    with jt.GradientTape() as tape:
        tape.watch(x)
        y = f(x)
    tape.gradient(y, x)
    _check(pairs, asked, [interpreter.reverse_sweep])
    # nothing named twice, nothing of a sweep the gradient never runs
    assert len(pairs) == len(set(pairs))
    assert interpreter.replay_sweep not in dict(pairs) and derivative_plan not in dict(pairs)


@pytest.mark.parametrize("x, targets, sweep", [
    (np.linspace(0.1, 1.0, 40), 6, interpreter.reverse_sweep),     # reverse mode: K = 6 columns
    (np.linspace(0.1, 1.0, 16), 1, interpreter.reverse_sweep),     # one column
    (np.linspace(0.1, 1.0, 3), 40, tangents.tangent_sweep)])      # forward mode: K = 3 tangent columns
def test_a_cold_start_names_what_a_first_jacobian_asks_for_in_either_mode(named, x, targets, sweep):
    pairs, asked = named
    x = jt.constant(x)
    spread = jt.constant(np.linspace(-1.0, 1.0, x.shape[0] * targets).reshape(x.shape[0], targets))
    with jt.GradientTape() as tape:
        tape.watch(x)
        y = jt.tanh(jt.matmul(jt.reshape(jt.sin(x) * x, (1, -1)), spread))
        y = jt.reduce_sum(y) if targets == 1 else y
    tape.jacobian(y, x)
    _check(pairs, asked, [sweep])
    assert {d for d, _ in pairs} & {interpreter.reverse_sweep, tangents.tangent_sweep} == {sweep}


@pytest.mark.parametrize("f, x", CASES[:4])
def test_a_cold_start_names_what_a_first_hessian_and_hessian_vector_product_ask_for(named, f, x):
    pairs, asked = named
    x = jt.constant(x)
    with jt.GradientTape(persistent=True) as tape:
        tape.watch(x)
        y = jt.reduce_sum(f(x))
    tape.hessian(y, x)
    tape.hessian_vector_product(y, x, jt.ones_like(x))
    _check(pairs, asked, [interpreter.reverse_sweep, tangents.tangent_sweep, tangents.second_order_sweep])


@pytest.mark.parametrize("f, x", CASES[:4])
def test_a_cold_start_names_what_a_first_jt_hessian_asks_for(named, f, x):
    pairs, asked = named
    jt.hessian(lambda v: jt.reduce_sum(f(v)))(jt.constant(x))
    _check(pairs, asked, [interpreter.replay_sweep, tangents.tangent_sweep, tangents.second_order_sweep])


@pytest.mark.parametrize("f, x", CASES)
def test_a_cold_start_names_what_a_first_jt_grad_asks_for(named, f, x):
    pairs, asked = named
    x = jt.constant(x)
    grad = jt.grad(lambda v: jt.reduce_sum(f(v)))
    grad(x)
    grad(x)
    _check(pairs, asked, [interpreter.reverse_sweep, interpreter.replay_sweep, derivative_plan])


def test_a_cold_start_names_the_gradient_steps_of_a_traced_training_step(named):
    pairs, asked = named
    w = jt.Variable(np.linspace(-1.0, 1.0, 12).reshape(4, 3))
    batch = jt.constant(np.ones((5, 4)))

    @jt.function
    def step(rows):
        with jt.GradientTape() as tape:
            loss = jt.reduce_sum(jt.nn.relu(jt.matmul(rows, w)) ** 2)
        w.assign_sub(0.01 * tape.gradient(loss, w))
        return loss

    step(batch)
    step(batch)
    _check(pairs, asked, [interpreter.replay_sweep, derivative_plan])


def test_a_cold_start_names_nothing_where_the_process_holds_its_sweep_or_no_worker_compiles(monkeypatch):
    started = []
    x = jt.constant(np.linspace(0.1, 1.0, 16))
    with jt.GradientTape(persistent=True) as tape:
        tape.watch(x)
        y = jt.reduce_sum(jt.sin(x))
    tape.gradient(y, x)            # this process has compiled or loaded reverse_sweep
    monkeypatch.setattr(compile_ahead, "_started", set())
    monkeypatch.setattr(compile_ahead, "side_by_side", lambda: started.append(1))
    tape.gradient(y, x)
    monkeypatch.setattr(compile_ahead, "_started", set())
    monkeypatch.setattr(compile_ahead, "_lacks", lambda sweep: True)
    monkeypatch.setattr(compile_ahead, "workers_run", lambda: False)
    tape.gradient(y, x)
    assert started == []


_COLD_GRADIENT = """
import numba.core.event as event
import numpy as np
import jitape as jt
compiled = []
class Compiles(event.Listener):
    def on_start(self, e):
        compiled.append(e.data["dispatcher"].__name__)
    def on_end(self, e):
        pass
x = jt.constant(np.linspace(0.1, 1.0, 40))
with jt.GradientTape() as tape:
    tape.watch(x)
    y = jt.reduce_sum(jt.sin(x) * x)
import jitape_kernels.cpu.compile_ahead as compile_ahead
start = compile_ahead.cold_start
def cold_start_then_listen(*args):
    start(*args)
    event.register("numba:compile", Compiles())
compile_ahead.cold_start = cold_start_then_listen
import jitape_kernels.cpu as cpu
cpu.cold_start = cold_start_then_listen
g = tape.gradient(y, x).numpy()
xv = x.numpy()
print(float(np.max(np.abs(g - (np.cos(xv) * xv + np.sin(xv))))), *compiled)
"""


def test_a_cold_first_gradient_compiles_nothing_after_its_cold_start(tmp_path):
    environment = dict(os.environ, JITAPE_CACHE_DIR=str(tmp_path), JITAPE_COMPILE_JOBS="2",
                       PYTHONPATH=parallel_compile._PACKAGE_ROOT)
    result = subprocess.run([sys.executable, "-c", _COLD_GRADIENT], env=environment, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr
    error, *compiled = result.stdout.split()
    assert float(error) < 1e-12
    assert compiled == []


@pytest.mark.parametrize("size", [1, 8, FUSE_MIN_SIZE])
def test_rows_of_every_opcode_name_kernels_of_their_tables_for_every_sweep(size):
    # one row per opcode, each from slot 0 into a slot of its own, and a trace's gradient step (a negative opcode)
    ops = np.arange(len(oc.NAMES))
    rows = np.zeros((ops.size + 1, 6), np.int64)
    rows[:-1, 0], rows[:-1, 1], rows[:-1, 4:] = ops, ops + 1, -1
    rows[-1] = [-7, ops.size + 1, ops.size, 0, -1, -1]
    slot_rows = np.zeros((ops.size + 2, 3 + oc.MAXRANK), np.int64)
    slot_rows[:, 0] = size
    code, slots = compile_ahead._recorded_code(rows, slot_rows)
    assert code.shape[0] == ops.size
    for sweep in ("reverse", "reverse columns", "replay", "replay unfused", "steps", "tangent", "second order"):
        for dtype in (np.float32, np.float64):
            needs = compile_ahead._needs(sweep, code, slots, dtype)
            for group, _, indices in needs:
                assert set(indices) <= set(range(len(group.kernels)))
            kernels = {dispatcher for dispatcher, _ in row_kernels.needed_pairs(needs)}
            assert kernels and kernels <= set(row_kernels.KERNELS)
