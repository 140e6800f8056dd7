"""TensorFlow's dtype names (jt.float32 ... jt.bool) as numpy dtypes, and the jt.dtypes namespace.

jitape tensors hold numpy values, so a dtype is a numpy dtype: `jt.float32 == np.float32`, and every
`dtype=` argument (constant, Variable, cast, zeros, one_hot ...) accepts these names.
"""
import numpy as np

float32 = np.dtype(np.float32)
float64 = np.dtype(np.float64)
int32 = np.dtype(np.int32)
int64 = np.dtype(np.int64)
bool = np.dtype(np.bool_)


def as_dtype(type_value):
    """`type_value` (a name, numpy type or dtype) as a numpy dtype jitape tensors can hold.

    >>> import jitape as jt
    >>> jt.dtypes.as_dtype("float32") == jt.float32
    True
    """
    from .tensor import check_dtype
    try:
        dtype = np.dtype(type_value)
    except TypeError:
        raise TypeError(f"as_dtype: expected a dtype name or numpy dtype, got {type_value!r}") from None
    return check_dtype(dtype, "as_dtype")


def cast(x, dtype, name=None):
    """x converted to `dtype` (jt.cast): float-to-float casts are differentiable."""
    from .ops import cast as _cast
    return _cast(x, as_dtype(dtype))
