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


def test_copies_and_pickles_never_share_a_tensors_identity():
    import copy
    import pickle
    v = jt.Variable(2.0)
    w = copy.deepcopy(v)
    w.assign(5.0)
    assert copy.copy(v) is v and float(v) == 2.0                  # TensorFlow: copy.copy is the variable
    with jt.GradientTape() as tape:
        y = v ** 2 + 3 * w
    gv, gw = tape.gradient(y, [v, w])
    assert (float(gv), float(gw)) == (4.0, 3.0)
    restored = pickle.loads(pickle.dumps(v))
    assert isinstance(restored, jt.Variable) and restored._id != v._id and float(restored) == 2.0
    assert restored.trainable and restored.name == v.name
    t = jt.constant([1.0, 2.0])
    assert copy.copy(t) is t and copy.deepcopy(t) is t              # immutable: a copy is the tensor
    t2 = pickle.loads(pickle.dumps(t))
    assert t2._id != t._id and t2.dtype == t.dtype
    np.testing.assert_array_equal(t2.numpy(), t.numpy())


def test_a_deep_copied_module_trains_on_its_own_variables():
    import copy
    layer = jt.layers.Dense(2)
    x = jt.constant(np.ones((3, 4), np.float32))
    layer(x)
    target = copy.deepcopy(layer)
    with jt.GradientTape() as tape:
        loss = jt.reduce_sum(target(x)) + jt.reduce_sum(layer(x) * 0.0)
    grads = tape.gradient(loss, target.trainable_variables + layer.trainable_variables)
    assert all(g is not None for g in grads)
    np.testing.assert_array_equal(grads[0].numpy(), np.full((4, 2), 3.0))
    np.testing.assert_array_equal(grads[2].numpy(), np.zeros((4, 2)))
