"""jitape_kernels.cpu.row_kernels: the sweeps' row kernels (forward, reverse, tangent and second-order) and fused
groups' block kernels are compiled for the families a Program uses, once per signature, and called through a table
the sweep checks; a new user's first gradient or Hessian compiles no other family's kernels, and no sweep links
them."""
import os
import subprocess
import sys

import numpy as np
import pytest

import jitape as jt
from jitape_kernels import cpu, opcodes as oc
from jitape_kernels.cpu import interpreter, row_kernels
from jitape_kernels.cpu import batch, tangents
from jitape_kernels.cpu.interpreter import (ADDRESSED_KERNELS, FORWARD_KINDS, FORWARD_ROW_KERNELS, REVERSE_KINDS,
                                            REVERSE_ROW_KERNELS)
from jitape_kernels.cpu.row_kernels import FORWARD, REVERSE

UNARY_ROWS, BINARY_ROWS, SUM_ROWS, TILE_ROWS, MATMUL_ROWS = map(REVERSE_KINDS.index,
                                                                ("unary", "binary", "sum", "tile", "matmul"))


def _program(f, x):
    x = jt.constant(x)
    with jt.GradientTape() as tape:
        tape.watch(x)
        y = f(x)
    return tape.program(y, x)


@pytest.mark.parametrize("f, x, expected", [
    (lambda x: jt.sin(x) * x + 2.0 * x, 0.5, []),                                 # scalar rows run inline
    (lambda x: jt.reduce_sum(jt.sin(x)), np.linspace(0, 1, 40), [UNARY_ROWS, SUM_ROWS]),
    (lambda x: jt.reduce_sum(jt.sin(x) * x), np.linspace(0, 1, 4), [SUM_ROWS]),   # small elementwise rows too
    (lambda x: jt.reduce_sum(jt.matmul(x, x) + jt.reduce_sum(x)), np.ones((5, 5)),
     [BINARY_ROWS, SUM_ROWS, TILE_ROWS, MATMUL_ROWS]),
])
def test_a_program_needs_the_row_kernels_of_the_rows_the_sweep_does_not_run_inline(f, x, expected):
    program = _program(f, x)
    assert row_kernels.needed_reverse_kernels(program.code, program.slots) == expected


@pytest.mark.parametrize("f, x, expected", [
    (lambda x: jt.sin(x) * x + 2.0 * x, 0.5, []),
    (lambda x: jt.reduce_sum(jt.sin(x)), np.linspace(0, 1, 40), ["unary", "sum"]),
    (lambda x: jt.reduce_sum(jt.matmul(x, x) + jt.reduce_max(x)), np.ones((5, 5)),
     ["binary", "sum", "reduce", "mapped", "matmul"]),
])
def test_a_program_needs_the_forward_row_kernels_of_the_rows_the_sweep_does_not_run_inline(f, x, expected):
    program = _program(f, x)
    assert row_kernels.needed_forward_kernels(program.code, program.slots) == [FORWARD_KINDS.index(kind)
                                                                             for kind in expected]


def test_the_rows_planning_calls_small_are_those_the_compiled_loops_run_inline():
    # one rule, in numpy for a Program's rows (row_kernels.needed_forward_kernels) and compiled per row (the
    # scalar loops): every opcode, inputs and outputs around the SMALL bound
    import numba
    sizes = np.array([0, 1, 2, interpreter.SMALL, interpreter.SMALL + 1, 100], np.int64)
    ops, n0, size = (a.ravel() for a in np.meshgrid(np.arange(len(oc.NAMES)), np.arange(sizes.size),
                                                    np.arange(sizes.size), indexing="ij"))
    slots = np.zeros((sizes.size, oc.S), np.int64)
    slots[:, oc.SIZE] = sizes
    code = np.full((ops.size, oc.W), -1, np.int64)
    code[:, oc.OP], code[:, oc.IN0], code[:, oc.OUT] = ops, n0, size

    @numba.njit
    def compiled(code, slots):
        return [interpreter.small_row(code[r, oc.OP], slots[code[r, oc.IN0], oc.SIZE], slots[code[r, oc.OUT], oc.SIZE])
                for r in range(code.shape[0])]

    small = interpreter.small_rows(code, slots)
    assert small.tolist() == compiled(code, slots)
    assert small[(ops == oc.SIN) & (sizes[size] <= interpreter.SMALL)].all() and not small[ops == oc.MATMUL].any()


@pytest.mark.parametrize("kernels, kinds, kernel_of, direction", [
    (REVERSE_ROW_KERNELS, REVERSE_KINDS, lambda: interpreter.REVERSE_KERNEL_OF, "reverse"),
    (FORWARD_ROW_KERNELS, FORWARD_KINDS, lambda: interpreter.FORWARD_KERNEL_OF - interpreter.FORWARD_FIRST,
     "forward"),
    (tangents.TANGENT_ROW_KERNELS, REVERSE_KINDS, lambda: tangents.TANGENT_KERNEL_OF - tangents.TANGENT_FIRST,
     "tangent")])
def test_every_opcode_has_a_row_kernel_of_its_family(kernels, kinds, kernel_of, direction):
    assert [kernel.__name__ for kernel in kernels] == [f"{direction}_{kind}_row" for kind in kinds]
    for name, family, kind in zip(oc.NAMES, oc.FAMILIES, [kinds[k] for k in kernel_of()]):
        assert kind in (name, family) or (family, kind) == ("compare", "binary"), (name, kind)


def test_the_second_order_row_kernels_are_those_of_the_families_with_second_order_terms():
    kinds = tangents.SECOND_ORDER_KINDS
    assert [k.__name__ for k in tangents.SECOND_ORDER_ROW_KERNELS] == [f"second_{kind}_row" for kind in kinds]
    for name, family, row in zip(oc.NAMES, oc.FAMILIES, tangents.SECOND_ORDER_KERNEL_OF):
        kind = kinds[row - tangents.SECOND_ORDER_FIRST] if row >= 0 else None
        linear = family in ("where", "cumsum", "mapped", "moved") or name in ("sum", "max", "min")
        assert kind == (None if linear else "binary" if family == "compare" else family), name
    assert row_kernels.KERNELS == (ADDRESSED_KERNELS + tangents.TANGENT_ROW_KERNELS
                                   + tangents.SECOND_ORDER_ROW_KERNELS)
    assert tangents.SECOND_ORDER_FIRST == len(ADDRESSED_KERNELS) + len(tangents.TANGENT_ROW_KERNELS)

def test_small_elementwise_rows_with_several_columns_run_in_a_loop_kernel_of_their_own():
    program = _program(lambda x: jt.reduce_sum(jt.sin(x) * x), np.linspace(0, 1, 4))
    temps = np.zeros(0, program.dtype)
    for columns, every_row, needed in ((1, False, []), (3, False, [0]), (3, True, [])):
        adjoint = np.zeros((program.adjoint_size, columns), program.dtype)
        needs = row_kernels.reverse_needs(program.code, program.slots, program.iattr, program.fattr, program.arena,
                                          adjoint, temps, program.homes, every_row)
        (loop,) = [indices for group, _, indices in needs if group is row_kernels.SMALL_ROWS_REVERSE_COLUMNS_GROUP]
        assert list(loop) == needed
        (rows,) = [indices for group, _, indices in needs if group is REVERSE]
        # the second-order and per-example sweeps (every_row) run every row's kernel, small rows' too
        assert list(rows) == ([UNARY_ROWS, BINARY_ROWS, SUM_ROWS] if every_row else [SUM_ROWS])
    x = jt.constant(np.linspace(0.1, 0.4, 4))
    with jt.GradientTape() as tape:
        tape.watch(x)
        y = jt.sin(x) * x + 0.5 * x
    xv = x.numpy()
    np.testing.assert_allclose(tape.jacobian(y, x).numpy(), np.diag(np.cos(xv) * xv + np.sin(xv) + 0.5), rtol=1e-6)

def _table(dtype, group, kernels):
    arrays = cpu.replay_arrays(dtype)
    code, slots, iattr, fattr, arena, temps, adjoint = (arrays[i] for i in (0, 1, 2, 3, 4, 14, 8))
    outer = (code, slots, iattr, fattr, arena, temps) if group is FORWARD else (
        code, slots, iattr, fattr, arena, adjoint, temps, np.zeros(0, np.int64))
    return row_kernels.kernel_table([(group, outer, kernels)])


def test_a_table_holds_the_addresses_asked_for_and_grows_for_later_programs(monkeypatch):
    monkeypatch.setattr(row_kernels, "_by_kind", {})       # no table the tests before filled
    table = _table(np.float64, REVERSE, [UNARY_ROWS])
    assert table.shape == (len(row_kernels.KERNELS), 2) and table[UNARY_ROWS, 0] != 0
    assert table[SUM_ROWS, 0] == 0 and table[SUM_ROWS, 1] == table[UNARY_ROWS, 1] != 0
    assert (table[len(REVERSE_ROW_KERNELS):] == 0).all()          # the other groups' rows: no key, no address
    grown = _table(np.float64, REVERSE, [SUM_ROWS])
    assert grown is table and table[SUM_ROWS, 0] != 0 and table[UNARY_ROWS, 0] != 0


def _gradient_arrays(program):
    adjoint = np.zeros((program.adjoint_size, 1), program.dtype)
    written = np.zeros(program.slots.shape[0], np.bool_)
    adjoint[program.adjoint_rows[program.targets[0]]] = 1
    written[program.targets[0]] = True
    return adjoint, written


def test_a_sweep_given_a_table_of_other_types_raises_instead_of_running():
    program = _program(lambda x: jt.reduce_sum(jt.sin(x)), np.linspace(0, 1, 40))
    other = np.float32 if program.dtype == np.float64 else np.float64
    adjoint, written = _gradient_arrays(program)
    temps = np.zeros(0, program.dtype)
    for wrong in (_table(other, REVERSE, [UNARY_ROWS, SUM_ROWS]), row_kernels.empty_table()):
        with pytest.raises(RuntimeError, match="not prepared"):
            cpu.reverse_sweep(program.code, program.slots, program.iattr, program.fattr, program.arena, adjoint,
                              written, program.homes, temps, wrong)
    arena = program.arena.copy()
    target = program.slots[program.targets[0], oc.OFFSET]
    arena[target] = np.nan
    # a forward sweep given the reverse row kernels only: its rows' keys are not the forward kernels' own
    reverse_only = cpu.reverse_kernels(program.code, program.slots, program.iattr, program.fattr, arena, adjoint,
                                       temps, program.homes)
    with pytest.raises(RuntimeError, match="not prepared"):
        cpu.forward_sweep(program.code, program.slots, program.iattr, program.fattr, arena, temps, reverse_only)
    assert np.isnan(arena[target])
    cpu.forward_sweep(program.code, program.slots, program.iattr, program.fattr, arena, temps,
                      cpu.forward_kernels(program.code, program.slots, program.iattr, program.fattr, arena, temps))
    assert arena[target] == program.arena[target]


def _traced_gradient(body):
    """jt.function of the gradient of body(x), taken with a tape inside (a gradient step of the replay)."""
    def step(x):
        with jt.GradientTape() as tape:
            tape.watch(x)
            y = body(x)
        return tape.gradient(y, x)
    return step, jt.function(step)


def _scalar_chain(x):
    y = x
    for _ in range(20):
        y = jt.sin(y) * x + 0.5 * y
    return y


@pytest.mark.parametrize("body, x, loops", [
    (_scalar_chain, 0.3, ["run forward", "run reverse"]),      # every row in a scalar run
    (lambda x: jt.reduce_sum(jt.sin(x) * x), np.linspace(0, 1, 4), ["rows forward", "rows reverse", "small"]),
    (lambda x: jt.reduce_sum(jt.sin(x) * x) * _scalar_chain(jt.reduce_sum(x)), np.linspace(0, 1, 4),
     ["rows forward", "run forward", "rows reverse", "small", "run reverse"]),
])
def test_a_replay_needs_the_loops_of_small_rows_only_where_a_row_is_outside_every_scalar_run(body, x, loops):
    step, replayed = _traced_gradient(body)
    x = np.asarray(x, np.float64)
    for value in (x, x * 0.5, x + 0.25):
        np.testing.assert_allclose(replayed(jt.constant(value)).numpy(), step(jt.constant(value)).numpy(), rtol=1e-6)
    (concrete,) = [c for variants in replayed._variants.values() for c in variants]
    arrays = concrete._replayers["cpu"].args[:-1]       # the bound replay's arrays but its table
    needed = {group.first for group, _, indices in row_kernels.replay_needs(*arrays) if len(indices)}
    names = {"rows forward": row_kernels.SCALAR_ROWS_FORWARD_GROUP, "run forward": row_kernels.SCALAR_RUN_FORWARD_GROUP,
             "rows reverse": row_kernels.SCALAR_ROWS_REVERSE_GROUP, "small": row_kernels.SMALL_ROWS_REVERSE_GROUP,
             "run reverse": row_kernels.SCALAR_RUN_REVERSE_GROUP}
    assert [name for name, group in names.items() if group.first in needed] == loops


_FIRST_GRADIENT = """
import numpy as np
import jitape as jt
from jitape_kernels.cpu import interpreter, linalg, reduction, shape
x = jt.constant(np.linspace(0.0, 1.0, 40))
with jt.GradientTape() as tape:
    tape.watch(x)
    y = jt.reduce_sum(jt.sin(x))
np.testing.assert_allclose(tape.gradient(y, x).numpy(), np.cos(x.numpy()), rtol=1e-6)
print(sorted(k.__name__ for k in interpreter.ADDRESSED_KERNELS if k.signatures))
print(sorted(f.__name__ for f in (shape.mapped_linear, reduction.reduce_linear, linalg.matmul_reverse,
                                  linalg.solve_reverse, shape.mapped_forward, reduction.reduce_forward,
                                  linalg.matmul_forward) if f.signatures))
grad = jt.grad(lambda v: jt.reduce_sum(jt.sin(v) * v))
for _ in range(3):
    np.testing.assert_allclose(grad(x).numpy(), np.sin(x.numpy()) + x.numpy() * np.cos(x.numpy()), rtol=1e-6)
print(sorted(k.__name__ for k in interpreter.ADDRESSED_KERNELS if k.signatures))
print(sorted(f.__name__ for f in (shape.mapped_linear, reduction.reduce_linear, linalg.matmul_reverse,
                                  linalg.solve_reverse, shape.mapped_forward, linalg.matmul_forward) if f.signatures))
"""


_LOADED = """
print(sorted(f.__name__ for f in (interpreter.row_operands, interpreter.forward_operands) if f.signatures))
print(len(interpreter.small_rows_reverse.signatures))
"""


def test_a_first_gradient_on_an_empty_cache_compiles_only_its_families_kernels(tmp_path):
    # compiled in this process (no workers), so the callees it compiles show too
    environment = dict(os.environ, JITAPE_CACHE_DIR=str(tmp_path), JITAPE_COMPILE_JOBS="1")
    result = subprocess.run([sys.executable, "-c", _FIRST_GRADIENT], env=environment, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr
    compiled, other_families, compiled_by_replay, other_families_by_replay = result.stdout.splitlines()
    assert compiled == "['reverse_sum_row', 'reverse_unary_row', 'scalar_rows_reverse', 'small_rows_reverse']"
    assert other_families == "[]"
    # the replay: sin, the product and the sum of 40 entries, rows of their own (too short for a fused group),
    # and no scalar run
    assert compiled_by_replay == ("['forward_binary_row', 'forward_sum_row', 'forward_unary_row', "
                                  "'reverse_binary_row', 'reverse_sum_row', 'reverse_unary_row', "
                                  "'scalar_rows_forward', 'scalar_rows_reverse', 'small_rows_reverse']"
                                  ), compiled_by_replay
    assert other_families_by_replay == "[]"
    # a new process on that cache loads what it needs, and no operand builder (the sweeps inline them: the
    # tables read their types from the cache); reverse_sweep and the replay run one small_rows_reverse
    result = subprocess.run([sys.executable, "-c", _FIRST_GRADIENT + _LOADED], env=environment, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-2:] == ["[]", "1"]


_FIRST_HESSIAN = """
import numpy as np
import jitape as jt
from jitape_kernels.cpu import row_kernels
x = jt.constant(np.linspace(0.0, 1.0, 40))
with jt.GradientTape(persistent=True) as tape:
    tape.watch(x)
    y = jt.reduce_sum(jt.sin(x) * x)
h = tape.hessian(y, x).numpy()
np.testing.assert_allclose(h, np.diag(2 * np.cos(x.numpy()) - x.numpy() * np.sin(x.numpy())), rtol=1e-6, atol=1e-12)
print(sorted(k.__name__ for k in row_kernels.KERNELS if k.signatures))
"""


def test_a_first_hessian_on_an_empty_cache_compiles_only_its_families_kernels_side_by_side(tmp_path):
    environment = dict(os.environ, JITAPE_CACHE_DIR=str(tmp_path), JITAPE_COMPILE_JOBS="2")
    result = subprocess.run([sys.executable, "-c", _FIRST_HESSIAN], env=environment, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr
    # the product and the sum in the reverse sweep; every row's reverse, tangent and second-order kernels after it
    assert result.stdout.strip() == ("['reverse_binary_row', 'reverse_sum_row', 'reverse_unary_row', "
                                     "'scalar_rows_reverse', 'second_binary_row', 'second_unary_row', "
                                     "'small_rows_reverse', 'tangent_binary_row', 'tangent_sum_row', "
                                     "'tangent_unary_row']")

def _defined_functions(dispatcher):
    """The names of the functions the module of `dispatcher`'s first compiled signature defines (numba links a
    callee's whole module into its caller's)."""
    library = dispatcher.overloads[dispatcher.signatures[0]].library
    return [f.name for f in library._get_module_for_linking().functions if not f.is_declaration]


def _mangled(name):
    return f"{len(name)}{name}B"        # numba's mangling of a function's name: its length, the name, B + a hash


def test_the_sweeps_link_no_row_kernel():
    x = jt.constant(np.linspace(0.1, 1.0, 50))
    with jt.GradientTape() as tape:
        tape.watch(x)
        y = jt.reduce_sum(jt.matmul(jt.reshape(x, (5, 10)), jt.reshape(x, (10, 5))))
    tape.gradient(y, x)
    grad = jt.grad(lambda v: jt.reduce_sum(jt.sin(v) * v))
    for _ in range(3):
        grad(x)
    program = _program(lambda v: jt.reduce_sum(jt.exp(v)), np.linspace(0, 1, 40))
    temps = np.zeros(0, program.dtype)
    cpu.forward_sweep(program.code, program.slots, program.iattr, program.fattr, program.arena.copy(), temps,
                      cpu.forward_kernels(program.code, program.slots, program.iattr, program.fattr, program.arena,
                                          temps))
    kernels_and_theirs = [kernel.__name__ for kernel in row_kernels.KERNELS] + [
        "mapped_linear", "matmul_reverse", "reduce_linear", "solve_reverse", "inv_reverse", "cumsum_linear",
        "unary_forward", "binary_forward", "where_forward", "reduce_forward", "mapped_forward", "moved_forward",
        "matmul_forward", "solve_forward", "inv_forward", "logsumexp_forward", "unary_reverse_1d",
        "broadcast_block", "binary_tangent", "matmul_tangent", "solve_tangent", "inv_tangent", "unary_second",
        "binary_second", "reduce_second", "matmul_second", "solve_second", "inv_second"]
    steps = dict(cpu.warmup_steps())
    steps["tangent_sweep[float64]"]()
    steps["second_order_sweep[float64]"]()
    steps["per_example_sweep[float64]"]()
    for sweep in (interpreter.forward_sweep, interpreter.reverse_sweep, interpreter.replay_sweep,
                  tangents.tangent_sweep, tangents.second_order_sweep, batch.per_example_sweep):
        defined = _defined_functions(sweep)
        # the sweeps' own rules that call a reverse rule: the per-example sweep's junctions of a MATMUL with a
        # parameter
        own = {batch.per_example_sweep: ("matmul_reverse",)}.get(sweep, ())
        theirs = [name for name in kernels_and_theirs if name not in own]
        assert not [name for name in theirs if any(_mangled(name) in f for f in defined)], sweep
    assert any(_mangled("matmul_reverse") in f for f in _defined_functions(interpreter.reverse_matmul_row))
    assert any(_mangled("unary_forward") in f for f in _defined_functions(interpreter.forward_unary_row))


def test_scalar_broadcasts_and_whole_sums_of_small_rows_run_in_the_scalar_loops():
    # W6a's rows: w and b broadcast to three entries, the squared residuals summed into one
    x, y = np.array([1.0, 2.0, 3.0]), np.array([3.0, 5.0, 7.5])
    program = _program(lambda w: jt.reduce_sum(jt.square(w * jt.constant(x) + 1.0 - jt.constant(y))), 2.0)
    ops = {oc.NAMES[op] for op in program.code[:, oc.OP]}
    assert {"tile", "sum"} <= ops
    assert row_kernels.needed_forward_kernels(program.code, program.slots) == []
    temps = np.zeros(0, program.dtype)
    arena = program.arena.copy()
    for row in program.code:
        arena[row[oc.OUT_OFF]:row[oc.OUT_OFF] + program.slots[row[oc.OUT], oc.SIZE]] = np.nan
    # a table holding the scalar loop alone: a row needing its kernel would raise
    cpu.forward_sweep(program.code, program.slots, program.iattr, program.fattr, arena, temps,
                      cpu.forward_kernels(program.code, program.slots, program.iattr, program.fattr, arena, temps))
    np.testing.assert_array_equal(arena, program.arena)        # numpy's bits: a fill, a sum in numpy's order
    w = jt.Variable(2.0)
    with jt.GradientTape(persistent=True) as tape:
        loss = jt.reduce_sum(jt.square(w * jt.constant(x) + 1.0 - jt.constant(y)))
        both = jt.stack([loss, 2.0 * loss])
    gradient = tape.gradient(loss, w).numpy()           # one column: the scalar loops
    jacobian = tape.jacobian(both, w).numpy()           # two columns: the row kernels
    expected = np.sum(2 * (2.0 * x + 1.0 - y) * x)
    np.testing.assert_allclose(gradient, expected, rtol=1e-15)
    np.testing.assert_allclose(jacobian, [expected, 2 * expected], rtol=1e-15)
