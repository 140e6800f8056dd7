"""jitape_kernels.cpu.addressed: a compiled function called through its address runs with the caller's arguments
and raises the callee's exceptions; an address compiled for other argument types, or none, raises RuntimeError
(never runs)."""
import numpy as np
import pytest
from numba import njit, typeof, types

from jitape_kernels.cpu.addressed import call_at, signature_key


@njit
def _scaled_sum(a, b, out, factor):
    if factor < 0:
        raise ValueError("factor must be non-negative")
    for i in range(out.size):
        out[i] += a[i] + b[i] * factor


@njit
def _through(address, key, a, b, out, factor):
    call_at(address, key, (a, b, out, factor))


def _compiled(arguments):
    signature = tuple(typeof(a) for a in arguments)
    _scaled_sum.compile(signature)
    compiled = _scaled_sum.overloads[signature]
    return compiled.library.get_pointer_to_function(compiled.fndesc.llvm_func_name), signature_key(signature)


def test_a_call_at_an_address_runs_the_function_and_raises_its_exceptions():
    a, b, out = np.ones(5), np.arange(5.0), np.zeros(5)
    address, key = _compiled((a, b, out, 2))
    _through(address, key, a, b, out, 2)
    np.testing.assert_array_equal(out, 1 + 2 * np.arange(5.0))
    with pytest.raises(ValueError, match="non-negative"):
        _through(address, key, a, b, out, -1)
    assert _through.signatures and "_scaled_sum" not in _through.inspect_llvm(_through.signatures[0])


def test_an_address_for_other_types_or_none_raises_instead_of_running():
    a, b, out = np.ones(5), np.arange(5.0), np.zeros(5)
    address, key = _compiled((a, b, out, 2))
    a32, b32, out32 = (x.astype(np.float32) for x in (a, b, out))
    with pytest.raises(RuntimeError, match="not prepared"):
        _through(address, key, a32, b32, out32, 2)       # its key is float64's
    with pytest.raises(RuntimeError, match="not prepared"):
        _through(0, key, a, b, out, 2)
    np.testing.assert_array_equal(out32, 0)
    np.testing.assert_array_equal(out, 0)


def test_signature_keys_tell_types_apart_and_ignore_literals():
    f64 = types.Array(types.float64, 1, "C")
    assert signature_key((f64, types.int64)) == signature_key((f64, types.IntegerLiteral(3)))
    assert signature_key((f64, types.int64)) != signature_key((types.Array(types.float32, 1, "C"), types.int64))
    assert signature_key((f64, types.int64)) != signature_key((types.Array(types.float64, 1, "A"), types.int64))
