"""jitape_kernels.cpu.row_kernels: reverse_sweep's row kernels are compiled for the families a Program uses, once
per signature, and called through a table the sweep checks; a new user's first gradient compiles no other
family's kernels."""
import os
import subprocess
import sys

import numpy as np
import pytest

import jitape as jt
from jitape_kernels import cpu, opcodes as oc
from jitape_kernels.cpu import interpreter, row_kernels
from jitape_kernels.cpu.interpreter import BINARY_ROWS, MATMUL_ROWS, REVERSE_ROW_KERNELS, SUM_ROWS, TILE_ROWS, UNARY_ROWS


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


def test_every_opcode_has_a_row_kernel_of_its_family():
    names = [kernel.__name__ for kernel in REVERSE_ROW_KERNELS]
    assert names == [f"reverse_{kind}_row" for kind in interpreter.ROW_KERNELS]
    kinds = [interpreter.ROW_KERNELS[k] for k in interpreter.REVERSE_KERNEL_OF]
    for name, family, kind in zip(oc.NAMES, oc.FAMILIES, kinds):
        assert kind in (name, family) or (family, kind) == ("compare", "binary"), (name, kind)


def test_a_table_holds_the_addresses_asked_for_and_grows_for_later_programs():
    signature = cpu._reverse_signature(np.float64)
    table = row_kernels.reverse_table(signature, [UNARY_ROWS])
    assert table[UNARY_ROWS] != 0 and table[-1] == row_kernels.signature_key(signature)
    grown = row_kernels.reverse_table(signature, [SUM_ROWS])
    assert grown is table and table[SUM_ROWS] != 0 and table[UNARY_ROWS] != 0


def test_a_sweep_given_a_table_of_other_types_raises_instead_of_running():
    program = _program(lambda x: jt.reduce_sum(jt.sin(x)), np.linspace(0, 1, 40))
    other = np.float32 if program.dtype == np.float64 else np.float64
    wrong = row_kernels.reverse_table(cpu._reverse_signature(other), [UNARY_ROWS, SUM_ROWS])
    adjoint = np.zeros((program.adjoint_size, 1), program.dtype)
    written = np.zeros(program.slots.shape[0], np.bool_)
    adjoint[program.adjoint_rows[program.targets[0]]] = 1
    written[program.targets[0]] = True
    with pytest.raises(RuntimeError, match="not prepared"):
        cpu.reverse_sweep(program.code, program.slots, program.iattr, program.fattr, program.arena, adjoint, written,
                          program.homes, np.zeros(0, program.dtype), wrong)


_FIRST_GRADIENT = """
import numpy as np
import jitape as jt
from jitape_kernels.cpu import interpreter, linalg, reduction, shape
x = jt.constant(np.linspace(0.0, 1.0, 40))
with jt.GradientTape() as tape:
    tape.watch(x)
    y = jt.reduce_sum(jt.sin(x))
np.testing.assert_allclose(tape.gradient(y, x).numpy(), np.cos(x.numpy()), rtol=1e-6)
print(sorted(k.__name__ for k in interpreter.REVERSE_ROW_KERNELS if k.signatures))
print(sorted(f.__name__ for f in (shape.mapped_linear, reduction.reduce_linear, linalg.matmul_reverse,
                                  linalg.solve_reverse) if f.signatures))
"""


def test_a_first_gradient_on_an_empty_cache_compiles_only_its_families_kernels(tmp_path):
    environment = dict(os.environ, JITAPE_CACHE_DIR=str(tmp_path))
    result = subprocess.run([sys.executable, "-c", _FIRST_GRADIENT], env=environment, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr
    compiled, other_families = result.stdout.splitlines()
    assert compiled == "['reverse_sum_row', 'reverse_unary_row']"
    assert other_families == "[]"


def _defined_functions(dispatcher):
    """The names of the functions the module of `dispatcher`'s first compiled signature defines (numba links a
    callee's whole module into its caller's)."""
    library = dispatcher.overloads[dispatcher.signatures[0]].library
    return [f.name for f in library._get_module_for_linking().functions if not f.is_declaration]


def _mangled(name):
    return f"{len(name)}{name}B"        # numba's mangling of a function's name: its length, the name, B + a hash


def test_the_reverse_and_replay_sweeps_link_no_row_kernel():
    x = jt.constant(np.linspace(0.1, 1.0, 50))
    with jt.GradientTape() as tape:
        tape.watch(x)
        y = jt.reduce_sum(jt.matmul(jt.reshape(x, (5, 10)), jt.reshape(x, (10, 5))))
    tape.gradient(y, x)
    grad = jt.grad(lambda v: jt.reduce_sum(jt.sin(v) * v))
    for _ in range(3):
        grad(x)
    row_kernels_and_theirs = [kernel.__name__ for kernel in REVERSE_ROW_KERNELS] + [
        "mapped_linear", "matmul_reverse", "reduce_linear", "solve_reverse", "inv_reverse", "cumsum_linear"]
    for sweep in (interpreter.reverse_sweep, interpreter.replay_sweep):
        defined = _defined_functions(sweep)
        assert not [name for name in row_kernels_and_theirs if any(_mangled(name) in f for f in defined)], sweep
    assert any(_mangled("matmul_reverse") in f for f in _defined_functions(interpreter.reverse_matmul_row))
