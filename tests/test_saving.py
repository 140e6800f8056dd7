"""jt.save / jt.load: every registry op's Program round-trips into a fresh interpreter; corrupt, foreign and
crafted files raise ProgramFileError before anything runs; mutated files never crash compiled code (CI runs
this file with NUMBA_BOUNDSCHECK=1 as well)."""
import json
import os
import subprocess
import sys
import textwrap
import zipfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import jitape as jt
from jitape import saving
from jitape_kernels import opcodes as oc
from tests.ops.test_registry import CASES, OPS, _flatten_args, _substitute


def _traced_example(name):
    """(f, scalar, tensors) for the op's first drawn example: f(*tensors) is the op, scalar its weighted sum."""
    found = []

    @settings(max_examples=1, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(CASES[name].inputs)
    def draw(args):
        found.append(args)

    draw()
    args = found[0]
    where = _flatten_args(args)
    arrays = [args[i] if j is None else args[i][j] for i, j in where]
    ct = np.random.default_rng(3).uniform(0.5, 1.5, np.shape(CASES[name].ref(*args)))
    f = jt.function(lambda *ts: CASES[name].fn(*_substitute(args, where, list(ts))))
    s = jt.function(lambda *ts: jt.reduce_sum(CASES[name].fn(*_substitute(args, where, list(ts))) * ct))
    return f, s, [jt.constant(a) for a in arrays]


def test_every_registry_op_round_trips_into_a_fresh_interpreter(tmp_path):
    expected = {}
    for name in OPS:
        f, s, tensors = _traced_example(name)
        if not tensors:
            continue
        f(*tensors)
        s(*tensors)
        guarded = any(c.slot_guards for g in (f, s) for vs in g._variants.values() for c in vs)
        # new values, unless the op reads values into Python (a loaded function cannot trace again)
        moved = tensors if guarded else [jt.constant(t.numpy() * 1.01) for t in tensors]
        with jt.GradientTape() as tape:
            tape.watch(moved)
            value = s.python_function(*moved)
        grads = tape.gradient(value, moved, unconnected_gradients="zero")
        jt.save(tmp_path / f"{name}.f.npz", f)
        jt.save(tmp_path / f"{name}.s.npz", s)
        expected[name] = {"inputs": [t.numpy() for t in moved], "value": f.python_function(*moved).numpy(),
                          "scalar": value.numpy(), "grads": [g.numpy() for g in grads]}
    np.save(tmp_path / "expected.npy", np.array([expected], dtype=object), allow_pickle=True)
    script = textwrap.dedent(f"""
        import numpy as np, jitape as jt
        expected = np.load({str(tmp_path / 'expected.npy')!r}, allow_pickle=True)[0]
        for name, e in expected.items():
            f = jt.load({str(tmp_path)!r} + f"/{{name}}.f.npz")
            s = jt.load({str(tmp_path)!r} + f"/{{name}}.s.npz")
            inputs = [jt.constant(a) for a in e["inputs"]]
            np.testing.assert_allclose(f(*inputs).numpy(), e["value"], rtol=1e-7, atol=1e-12, err_msg=name)
            value, grads = jt.value_and_grad(s, argnums=tuple(range(len(inputs))))(*inputs)
            np.testing.assert_allclose(value.numpy(), e["scalar"], rtol=1e-7, atol=1e-12, err_msg=name)
            for g, want in zip(grads, e["grads"]):
                np.testing.assert_allclose(g.numpy(), want, rtol=1e-7, atol=1e-10, err_msg=name)
            jt.hessian(s)(*inputs)
            jt.jacobian(f)(*inputs)
        print("checked", len(expected))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"checked {len(expected)}" in done.stdout


def _saved(tmp_path):
    w = jt.Variable([0.5, -1.0, 2.0])

    @jt.function
    def f(x):
        h = jt.tanh(jt.matmul(jt.reshape(x, (2, 3)), jt.reshape(w, (3, 1))))
        return jt.reduce_sum(jt.where(h > 0, h * h, -h)) + jt.reduce_max(jt.gather(x, [5, 0, 2]))

    x = jt.constant([0.3, -0.2, 0.9, 1.1, -0.7, 0.4])
    f(x)
    path = tmp_path / "f.npz"
    jt.save(path, f)
    pristine = jt.load(path)        # the exact results a mutated file must reproduce, or raise
    return path, x, pristine(x).numpy(), jt.grad(pristine)(x).numpy()


def _rewrite(path, out, edit):
    """Copy the file with `edit(arrays, meta)` applied and a fresh checksum: a crafted file."""
    with np.load(path, allow_pickle=False) as npz:
        arrays = {k: npz[k].copy() for k in npz.files}
    meta = json.loads(str(arrays["meta"]))
    edit(arrays, meta)
    arrays["meta"] = np.array(json.dumps(meta))
    arrays["checksum"] = np.array(saving._checksum(arrays))
    with open(out, "wb") as f:
        np.savez(f, **arrays)
    return out


def test_a_loaded_function_replays_and_differentiates_with_its_variables(tmp_path):
    path, x, value, grad = _saved(tmp_path)
    g = jt.load(path)
    assert float(g(x)) == pytest.approx(float(value), rel=1e-6)
    np.testing.assert_array_equal(jt.grad(g)(x).numpy(), grad)
    (w,) = g.variables
    w.assign([0.0, 0.0, 0.0])
    assert float(g(x)) == pytest.approx(0.9, rel=1e-6)      # the variable is an input: h = 0
    with pytest.raises(ValueError, match="no saved trace for arguments"):
        g(jt.constant([1.0]))


def test_a_loaded_function_saved_again_loads_with_the_same_traces(tmp_path):
    path, x, value, grad = _saved(tmp_path)
    jt.save(tmp_path / "again.npz", jt.load(path))
    again = jt.load(tmp_path / "again.npz")
    np.testing.assert_array_equal(again(x).numpy(), value)
    np.testing.assert_array_equal(jt.grad(again)(x).numpy(), grad)


def _code_key(meta):
    return meta["variants"][0]["code"]


CRAFTED = {
    "wrong version": (lambda a, m: m.update(version=99), "format version 99"),
    "unknown opcode": (lambda a, m: a.update(opcodes=np.array(["frobnicate", *oc.NAMES[1:]])), "unknown to this"),
    "slot out of range": (lambda a, m: a[_code_key(m)].__setitem__((0, oc.IN0), 10 ** 6), "out of range"),
    "negative slot": (lambda a, m: a[_code_key(m)].__setitem__((0, oc.OUT), -5), "out of range"),
    "opcode out of range": (lambda a, m: a[_code_key(m)].__setitem__((0, oc.OP), 999), "opcode is out of range"),
    "offset outside the arena": (lambda a, m: a[m["variants"][0]["slots"]].__setitem__((0, oc.OFFSET), 10 ** 9),
                                 "outside the arena"),
    "size not its dims": (lambda a, m: a[m["variants"][0]["slots"]].__setitem__((1, oc.SIZE), 7), "product"),
    "rank out of range": (lambda a, m: a[m["variants"][0]["slots"]].__setitem__((1, oc.RANK), 12), "rank"),
    "attribute out of the pool": (lambda a, m: a[_code_key(m)].__setitem__(
        (int(np.flatnonzero(a[_code_key(m)][:, oc.ATTR] >= 0)[0]), oc.ATTR), 10 ** 6), "outside the pool"),
    "gather index out of range": (lambda a, m: a[m["variants"][0]["iattr"]].__setitem__(
        slice(None), np.where(a[m["variants"][0]["iattr"]] == 5, 50, a[m["variants"][0]["iattr"]])), "instruction"),
    "missing array": (lambda a, m: m["variants"][0].update(code="nope"), "missing array"),
    "output slot out of range": (lambda a, m: m["variants"][0]["outputs"][0].update(slot=10 ** 6), "out of range"),
    "argument slot mismatched": (lambda a, m: m["variants"][0].update(arg_slots=[[0, 10 ** 7]]), "out of range"),
    "bad JSON types": (lambda a, m: m["variants"][0].update(guards="x"), "inconsistent"),
}


@pytest.mark.parametrize("case", sorted(CRAFTED))
def test_crafted_files_raise_before_anything_runs(tmp_path, case):
    path, x, _, _ = _saved(tmp_path)
    edit, message = CRAFTED[case]
    crafted = _rewrite(path, tmp_path / "crafted.npz", edit)
    with pytest.raises(jt.ProgramFileError, match=message):
        jt.load(crafted)


def test_a_tile_whose_output_is_not_whole_tiles_is_refused(tmp_path):
    """The kernels walk a TILE as (repeats, input axis) pairs: an output axis that is not a multiple of its input
    axis (whose entry count still matches the slot) is refused when loaded."""
    f = jt.function(lambda x: jt.reduce_sum(jt.tile(x, [1, 2]) ** 2))
    x = jt.constant(np.arange(6.0).reshape(3, 2))
    f(x)
    path = tmp_path / "tile.npz"
    jt.save(path, f)
    assert float(jt.load(path)(x)) == 110.0

    def edit(arrays, meta):
        code, iattr = arrays[_code_key(meta)], arrays[meta["variants"][0]["iattr"]]
        a = int(code[np.flatnonzero(code[:, oc.OP] == oc.TILE)[0], oc.ATTR])
        assert list(iattr[a:a + 5]) == [2, 3, 2, 3, 4]
        iattr[a + 3:a + 5] = [2, 6]         # 12 entries, as before, but 2 rows are not whole tiles of 3

    with pytest.raises(jt.ProgramFileError, match="not whole tiles"):
        jt.load(_rewrite(path, tmp_path / "crafted.npz", edit))


def test_a_matmul_over_interleaved_items_round_trips_and_a_bad_interleave_is_refused(tmp_path):
    """einsum with its batch axis between the rows and the sums saves one MATMUL with inner > 1; the loaded
    function gives the same value and gradient, and an inner that does not divide the batch is refused."""
    ls = jt.constant(np.random.default_rng(3).standard_normal((3, 4, 2)))
    f = jt.function(lambda x: jt.reduce_sum(jt.einsum("kij,nkj->nki", ls, x) ** 2))
    x = jt.constant(np.random.default_rng(4).standard_normal((5, 3, 2)))
    value, grad = f(x).numpy(), jt.grad(f)(x).numpy()
    path = tmp_path / "einsum.npz"
    jt.save(path, f)
    loaded = jt.load(path)
    assert loaded(x).numpy() == value
    np.testing.assert_array_equal(jt.grad(loaded)(x).numpy(), grad)

    def edit(arrays, meta):
        code, iattr = arrays[_code_key(meta)], arrays[meta["variants"][0]["iattr"]]
        a = int(code[np.flatnonzero(code[:, oc.OP] == oc.MATMUL)[0], oc.ATTR])
        assert list(iattr[a:a + 6]) == [3, 3, 5, 2, 4, 3]
        iattr[a + 5] = 2

    with pytest.raises(jt.ProgramFileError, match="interleaved batch"):
        jt.load(_rewrite(path, tmp_path / "crafted.npz", edit))


def test_corrupt_and_foreign_files_raise(tmp_path):
    path, _, _, _ = _saved(tmp_path)
    data = path.read_bytes()
    cases = {"truncated": data[:len(data) // 2], "random bytes": np.random.default_rng(0).bytes(4000),
             "empty": b""}
    for name, content in cases.items():
        (tmp_path / name).write_bytes(content)
        with pytest.raises(jt.ProgramFileError):
            jt.load(tmp_path / name)
    np.savez(tmp_path / "foreign.npz", weights=np.ones(3))
    with pytest.raises(jt.ProgramFileError, match="no 'meta' entry"):
        jt.load(tmp_path / "foreign.npz")
    np.savez(tmp_path / "pickled.npz", meta=np.array([{"a": 1}], dtype=object))
    with pytest.raises(jt.ProgramFileError):
        jt.load(tmp_path / "pickled.npz")
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0xFF
    (tmp_path / "flipped.npz").write_bytes(bytes(flipped))
    with pytest.raises(jt.ProgramFileError):
        jt.load(tmp_path / "flipped.npz")


def test_a_tape_program_saves_and_loads(tmp_path):
    x = jt.constant([0.5, 1.5])
    with jt.GradientTape(persistent=True) as tape:
        tape.watch(x)
        y = jt.reduce_sum(jt.exp(x) * x)
    program = tape.program(y, x)
    jt.save(tmp_path / "p.npz", program)
    loaded = jt.load(tmp_path / "p.npz")
    assert str(loaded) == str(program)
    from jitape.execute import source_gradients
    (g,) = source_gradients(loaded, [np.ones((1, 1))], [x])
    np.testing.assert_allclose(g.numpy(), tape.gradient(y, x).numpy())


def test_what_cannot_be_saved_is_refused_by_name(tmp_path):
    f = jt.function(lambda x, thing: x * 2.0)
    f(jt.constant(1.0), object())
    with pytest.raises(ValueError, match="object argument"):
        jt.save(tmp_path / "f.npz", f)
    with pytest.raises(ValueError, match="not been traced"):
        jt.save(tmp_path / "g.npz", jt.function(lambda x: x))


@pytest.fixture(scope="module")
def saved_file(tmp_path_factory):
    return _saved(tmp_path_factory.mktemp("fuzz"))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(flips=st.lists(st.tuples(st.integers(0, 10 ** 9), st.integers(1, 255)), min_size=1, max_size=4),
       cut=st.one_of(st.none(), st.integers(0, 10 ** 9)))
def test_fuzz_mutated_files_raise_or_give_the_original_results(saved_file, flips, cut, tmp_path_factory):
    path, x, value, grad = saved_file
    data = bytearray(path.read_bytes())
    for position, mask in flips:
        data[position % len(data)] ^= mask
    if cut is not None:
        data = data[:cut % len(data)]
    mutated = tmp_path_factory.mktemp("m") / "m.npz"
    mutated.write_bytes(bytes(data))
    try:
        g = jt.load(mutated)
    except jt.ProgramFileError:
        return
    np.testing.assert_array_equal(g(x).numpy(), value)
    np.testing.assert_array_equal(jt.grad(g)(x).numpy(), grad)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(array=st.sampled_from(["code", "slots", "iattr"]), position=st.integers(0, 10 ** 6),
       value=st.sampled_from([-1, 0, 1, 2, 3, 7, 100, 10 ** 6, -(10 ** 6), 2 ** 62]))
def test_fuzz_crafted_files_raise_or_run_in_bounds(saved_file, array, position, value, tmp_path_factory):
    """A crafted file (valid checksum) either fails validation or runs: never out of bounds (bounds-checked in
    CI), whatever it computes."""
    path, x, _, _ = saved_file

    def edit(arrays, meta):
        target = arrays[meta["variants"][0][array]]
        target.reshape(-1)[position % target.size] = value

    crafted = _rewrite(path, tmp_path_factory.mktemp("c") / "c.npz", edit)
    try:
        g = jt.load(crafted)
    except jt.ProgramFileError:
        return
    try:
        g(x)
        jt.grad(g)(x)
    except (ValueError, np.linalg.LinAlgError, ZeroDivisionError):
        pass        # a crafted file may compute nonsense, or raise a Python error; never read out of bounds


def test_loading_executes_nothing_from_the_file(tmp_path):
    path, _, _, _ = _saved(tmp_path)
    with zipfile.ZipFile(path) as z:
        assert all(name.endswith(".npy") for name in z.namelist())
    assert os.path.getsize(path) < 20_000
