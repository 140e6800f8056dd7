"""The integer workspace a sweep allocates once and its instructions share: the rank-sized metadata of the
data-movement kernels (merged axes and their steps, strides, odometer indices) and the eight lanes of a row's
extremum (a region viewed as floats), so no instruction allocates them. A kernel takes fixed regions of
2 MAXRANK + 1 entries (region(work, k, n); ranks above opcodes.MAXRANK are refused when recorded and when
loaded); a kernel it calls with the same workspace uses regions it does not."""
import numpy as np
from numba import njit

from .. import opcodes as oc

REGIONS = 5
REGION = 2 * oc.MAXRANK + 1     # a TILE's axes split in two (shape.affine_spec), or a rank and K columns


@njit(cache=True)
def new_work():
    return np.empty(REGIONS * REGION, np.int64)


@njit(cache=True, inline="always")
def region(work, k, n):
    """The first n entries of region k (n <= REGION)."""
    return work[k * REGION:k * REGION + n]
