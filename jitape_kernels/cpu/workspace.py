"""The integer workspace a sweep allocates once and its instructions share: the rank-sized metadata of the
data-movement kernels (merged axes and their steps, strides, odometer indices), a logsumexp row's running sums
or the left halves' sums of a pairwise sum (lanes(work), viewed as floats), and a pairwise sum's pending
halves (frames(work)), so no instruction allocates them. A kernel takes fixed regions of
2 MAXRANK + 1 entries (region(work, k, n); ranks above opcodes.MAXRANK are refused when recorded and when
loaded); a kernel it calls with the same workspace uses regions it does not."""
import numpy as np

from .. import njit, opcodes as oc

REGIONS = 5
REGION = 2 * oc.MAXRANK + 1     # a TILE's axes split in two (shape.affine_spec), or a rank and K columns


# a logsumexp row's running sums (eight vector registers' worth, so its loop vectorises without one register's
# dependency chain), or a pairwise sum's left halves' sums (one per level of FRAMES)
LANES = 64
# a pairwise sum's pending halves, (start, size, which half is done) per level: 64 levels halve any row
FRAMES = 64


@njit(cache=True)
def new_work():
    return np.empty(REGIONS * REGION + LANES + 3 * FRAMES, np.int64)


@njit(cache=True, inline="always")
def region(work, k, n):
    """The first n entries of region k (n <= REGION)."""
    return work[k * REGION:k * REGION + n]


@njit(cache=True, inline="always")
def lanes(work):
    """The LANES entries after the regions (as int64: a caller views them as its floats)."""
    return work[REGIONS * REGION:REGIONS * REGION + LANES]


@njit(cache=True, inline="always")
def frames(work):
    """FRAMES rows of 3 entries after the lanes."""
    return work[REGIONS * REGION + LANES:REGIONS * REGION + LANES + 3 * FRAMES].reshape(FRAMES, 3)
