"""jitape_kernels.cpu.unowned: a view without a reference is the same array (data, shape, strides), for reading
and writing, whatever its layout."""
import numpy as np
import pytest
from numba import njit

from jitape_kernels.cpu.unowned import unowned


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
