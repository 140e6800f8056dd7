"""jitape/tensor.py and jitape/dtypes.py: TensorFlow's dtype names, TensorShape, convert_to_tensor."""
import numpy as np
import pytest

import jitape as jt


@pytest.mark.parametrize("name", ["float32", "float64", "int32", "int64", "bool"])
def test_dtype_names_are_numpy_dtypes(name):
    dtype = getattr(jt, name)
    assert dtype == np.dtype(name) and getattr(jt.dtypes, name) is dtype
    assert jt.constant([1, 0], dtype=dtype).dtype == dtype
    assert jt.Variable([1, 0], dtype=dtype).dtype == dtype
    assert jt.convert_to_tensor([1, 0], dtype=dtype).dtype == dtype
    assert jt.zeros((2,), dtype=dtype).dtype == dtype and jt.ones((2,), dtype).dtype == dtype
    assert jt.cast(jt.constant([1.5, 0.0]), dtype).dtype == dtype
    assert jt.dtypes.cast(jt.constant([1.5, 0.0]), dtype).dtype == dtype
    assert jt.one_hot([1], 2, dtype=dtype).dtype == dtype


def test_dtypes_cast_is_differentiable_between_floats():
    x = jt.constant(2.0, jt.float32)
    with jt.GradientTape() as tape:
        tape.watch(x)
        y = jt.dtypes.cast(x, jt.float64) ** 2
    assert y.dtype == jt.float64 and float(tape.gradient(y, x)) == 4.0


def test_as_dtype_refuses_unsupported_types():
    assert jt.dtypes.as_dtype("int64") == jt.int64
    with pytest.raises(TypeError, match="unsupported dtype complex128"):
        jt.dtypes.as_dtype(np.complex128)


def test_get_shape_is_a_tensor_shape():
    shape = jt.zeros((2, 3, 4)).get_shape()
    assert isinstance(shape, jt.TensorShape) and shape == (2, 3, 4)
    assert shape.as_list() == [2, 3, 4] and shape.rank == 3 and shape.num_elements() == 24
    scalar = jt.constant(1.0).get_shape()
    assert scalar.as_list() == [] and scalar.rank == 0 and scalar.num_elements() == 1
    assert repr(shape) == "TensorShape([2, 3, 4])"


def test_convert_to_tensor():
    t = jt.constant([1.0])
    assert jt.convert_to_tensor(t) is t and jt.convert_to_tensor(t, dtype=jt.float32) is t
    assert jt.convert_to_tensor(3, dtype_hint=jt.float64).dtype == jt.float64
    assert jt.convert_to_tensor(np.int64(3), dtype_hint=jt.float64).dtype == jt.int64    # hints only Python values
    with pytest.raises(ValueError, match="requested dtype float64 for a Tensor of dtype float32; use jt.cast"):
        jt.convert_to_tensor(t, dtype=jt.float64)
