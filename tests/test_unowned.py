"""jitape_kernels.cpu.unowned: a view without a reference is the same array (data, shape, strides), for reading
and writing, whatever its layout; a view at an address is the array that lives there."""
import numpy as np
import pytest
from numba import njit

from jitape_kernels.cpu.unowned import at_address, unowned


@njit(cache=True)
def _scale_through_view(x, factor):
    view = unowned(x)
    for i in range(view.shape[0]):
        view[i] *= factor
    return view.shape[0], view.strides[0], view.size


@njit(cache=True)
def _sum_of_slices(x, width):
    view = unowned(x)
    total = 0.0
    for start in range(0, view.shape[0] - width + 1):
        total += view[start:start + width].sum()
    return total


@pytest.mark.parametrize("make", [lambda: np.arange(10.0), lambda: np.arange(20.0)[::3],
                                  lambda: np.arange(12.0).reshape(3, 4)[:, 1], lambda: np.zeros(0)])
def test_unowned_view_is_the_array(make):
    x = make()
    expected = x * 2.5
    shape, stride, size = _scale_through_view(x, 2.5)
    assert (shape, stride, size) == (x.shape[0], x.strides[0], x.size)
    np.testing.assert_array_equal(x, expected)


def test_slices_of_an_unowned_view_read_the_array():
    x = np.random.default_rng(0).random(50)
    assert _sum_of_slices(x, 7) == pytest.approx(sum(x[s:s + 7].sum() for s in range(44)))


def test_unowned_refuses_what_is_not_an_array():
    with pytest.raises(Exception, match="unowned"):
        njit(lambda v: unowned(v))(1.0)


@njit(cache=True)
def _double_at(address, size, like):
    view = at_address(address, size, like)
    for i in range(view.shape[0]):
        view[i] *= 2
    return view.sum(), view.shape[0], view.strides[0]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("size", [0, 1, 9])
def test_a_view_at_an_address_is_the_array_there(dtype, size):
    x = np.arange(size, dtype=dtype) + 1
    expected = x * 2
    total, shape, stride = _double_at(x.__array_interface__["data"][0], size, np.zeros(0, dtype))
    np.testing.assert_array_equal(x, expected)
    assert (total, shape, stride) == (pytest.approx(expected.sum()), size, x.itemsize)


def test_at_address_refuses_what_is_not_an_address_and_an_array():
    with pytest.raises(Exception, match="at_address"):
        njit(lambda a, n, like: at_address(a, n, like))(1.5, 2, np.zeros(0))
    with pytest.raises(Exception, match="at_address"):
        njit(lambda a, n, like: at_address(a, n, like))(1, 2, np.zeros((0, 2)))
