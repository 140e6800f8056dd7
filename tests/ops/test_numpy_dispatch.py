"""numpy on tensors (jitape/ops/__init__.py): every ufunc and common function applied to a float Tensor is
either recorded (its gradient equals central differences) or raises TypeError; none returns a value whose
gradient a tape silently loses."""
import numpy as np
import pytest

import jitape as jt
from jitape.ops import _CONSTANT_UFUNCS

UFUNCS = sorted((getattr(np, name) for name in dir(np) if isinstance(getattr(np, name), np.ufunc)),
                key=lambda u: u.__name__)
UFUNCS = list({u.__name__: u for u in UFUNCS}.values())       # aliases (abs/absolute) once

FUNCTIONS = {
    "sum": lambda x: np.sum(x, axis=0), "mean": np.mean, "prod": np.prod, "max": np.max, "min": np.min,
    "var": np.var, "std": np.std, "cumsum": np.cumsum, "cumprod": np.cumprod, "sort": np.sort,
    "median": np.median, "percentile": lambda x: np.percentile(x, 30), "diff": np.diff,
    "outer": lambda x: np.outer(x, x), "inner": lambda x: np.inner(x, x), "kron": lambda x: np.kron(x, x),
    "dot": lambda x: np.dot(x, x), "vdot": lambda x: np.vdot(x, x), "trace": lambda x: np.trace(np.outer(x, x)),
    "diagonal": lambda x: np.diagonal(np.outer(x, x)), "flip": np.flip, "roll": lambda x: np.roll(x, 1),
    "repeat": lambda x: np.repeat(x, 2), "clip": lambda x: np.clip(x, 0.35, 0.6), "ravel": np.ravel,
    "atleast_2d": np.atleast_2d, "append": lambda x: np.append(x, x), "hstack": lambda x: np.hstack([x, x]),
    "vstack": lambda x: np.vstack([x, x]), "concatenate": lambda x: np.concatenate([x, x]),
    "stack": lambda x: np.stack([x, x]), "copy": np.copy, "reshape": lambda x: np.reshape(x, (3, 1)),
    "transpose": np.transpose, "expand_dims": lambda x: np.expand_dims(x, 0), "tile": lambda x: np.tile(x, 2),
    "where": lambda x: np.where(np.asarray(x) > 0.5, x, 0.0), "einsum": lambda x: np.einsum("i,i->", x, x),
    "tensordot": lambda x: np.tensordot(x, x, 1), "convolve": lambda x: np.convolve(x, x),
    "interp": lambda x: np.interp(0.5, [0.0, 1.0, 2.0], x), "polyval": lambda x: np.polyval(x, 0.7),
    "norm": np.linalg.norm, "det": lambda x: np.linalg.det(np.outer(x, x) + np.eye(3)),
    "inv": lambda x: np.linalg.inv(np.outer(x, x) + np.eye(3)), "eigh": lambda x: np.linalg.eigh(np.outer(x, x)),
    "svd": lambda x: np.linalg.svd(np.outer(x, x)), "trapezoid": np.trapezoid, "average": np.average,
    "nanmean": np.nanmean, "nansum": np.nansum, "amax": np.amax, "ptp": np.ptp, "linalg.solve":
        lambda x: np.linalg.solve(np.outer(x, x) + np.eye(3), x), "matmul": lambda x: np.matmul(x, x),
    "broadcast_to": lambda x: np.broadcast_to(x, (2, 3)), "squeeze": lambda x: np.squeeze(np.reshape(x, (1, 3))),
}
X0 = np.array([0.3, 0.45, 0.7])


def _scalar(value):
    return float(np.sum(np.asarray(value, dtype=np.float64)))


def _assert_recorded_or_refused(call, name, constant=False):
    """call(x) on a watched float64 tensor: TypeError, a locally constant result, or a recorded value whose
    gradient is the central difference of numpy's own function."""
    x = jt.constant(X0)
    with jt.GradientTape() as tape:
        tape.watch(x)
        try:
            result = call(x)
        except TypeError:
            return "refused"
        outputs = result if isinstance(result, tuple) else (result,)
        floats = [o for o in outputs if isinstance(o, (jt.Tensor, np.ndarray, np.generic, float))
                  and np.asarray(o).dtype.kind == "f"]
        assert all(isinstance(o, jt.Tensor) for o in floats), f"{name}: returned an untracked numpy value"
        total = sum(jt.reduce_sum(o) for o in floats) if floats else None
    if total is None:
        return "not float"
    gradient = tape.gradient(total, x)
    if gradient is None:
        assert constant, f"{name}: a float result no tape recorded (its gradient is silently lost)"
        return "constant"
    reference = _central(lambda v: _scalar(call(v)), X0)
    finite = np.isfinite(reference)
    np.testing.assert_allclose(gradient.numpy()[finite], reference[finite], rtol=1e-5, atol=1e-6, err_msg=name)
    return "recorded"


def _central(f, x0, h=1e-6):
    g = np.zeros_like(x0)
    for i in range(x0.size):
        e = np.zeros_like(x0)
        e[i] = h
        g[i] = (f(x0 + e) - f(x0 - e)) / (2 * h)
    return g


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("ufunc", UFUNCS, ids=lambda u: u.__name__)
def test_every_ufunc_is_recorded_or_refused(ufunc):
    if ufunc.nin == 1:
        call = ufunc
    elif ufunc.nin == 2:
        def call(x):
            return ufunc(x, x * 0.5 + 0.1) if isinstance(x, jt.Tensor) else ufunc(x, x * 0.5 + 0.1)
    else:
        pytest.fail(f"no call pattern for a ufunc of {ufunc.nin} inputs: {ufunc.__name__}")
    _assert_recorded_or_refused(call, ufunc.__name__, ufunc in _CONSTANT_UFUNCS)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_common_numpy_functions_are_recorded_or_refused(name):
    _assert_recorded_or_refused(FUNCTIONS[name], name)


def test_the_refusal_names_the_function_and_the_way_out():
    x = jt.constant(X0)
    with pytest.raises(TypeError, match=r"numpy.cbrt.*jt.sign\(x\) \* jt.abs\(x\) \*\* \(1 / 3\).*np.asarray"):
        np.cbrt(x)
    with pytest.raises(TypeError, match=r"numpy.median .*np.asarray"):
        np.median(x)
    with pytest.raises(TypeError, match="immutable"):
        np.sin(x, out=(jt.constant(X0),))


def test_ufunc_methods_and_non_float_tensors():
    x = jt.constant(X0)
    with jt.GradientTape() as tape:
        tape.watch(x)
        y = np.add.reduce(x) + np.maximum.reduce(x)
    np.testing.assert_allclose(tape.gradient(y, x).numpy(), [1.0, 1.0, 2.0])
    with pytest.raises(TypeError, match="numpy.add.accumulate"):
        np.add.accumulate(x)
    counts = jt.constant(np.array([1, 2, 3]))
    assert isinstance(np.bitwise_and(counts, 1), jt.Tensor)       # nothing to differentiate: computed
    assert np.allclose(x, X0) and np.shape(x) == (3,)              # questions about values are answered
    assert int(np.argmax(x)) == 2


@pytest.mark.parametrize("convert", [jt.constant, jt.convert_to_tensor])
def test_a_nest_holding_recorded_tensors_is_packed_by_recorded_ops(convert):
    x0, x1 = jt.constant(np.float64(2.0)), jt.constant(np.float64(3.0))
    with jt.GradientTape() as tape:
        tape.watch([x0, x1])
        m = convert([[x0, 0.0], [1.0, x1 * x0]])
        y = jt.reduce_sum(m * m)
    assert m.dtype == np.float64 and m.shape == (2, 2)
    g0, g1 = tape.gradient(y, [x0, x1])
    assert float(g0) == pytest.approx(2 * 2.0 + 2 * 6.0 * 3.0)
    assert float(g1) == pytest.approx(2 * 6.0 * 2.0)
