"""Buffers reused instead of allocated.

- The sweeps' per-thread workspace (`workspace`): arena, adjoint, tangent and kernel scratch buffers reused
  across sweeps.
- Large buffers that outlive a call: a persistent tape's Programs keep their arena and cotangents, and large
  eager results live in them (`fresh`: the array is its buffer's owner). A fresh
  multi-megabyte buffer costs a page fault per 4 KiB on its first touch (7 ms for 40 MB here, more than a
  sweep over it), and glibc hands buffers above 32 MiB back to the system when freed, so every new tape would
  pay it again. Such buffers are handed out here (take, keep), and once their owner is gone and nothing else
  references them (no view of them survives), they are handed out again; at most
  jt.config.workspace_reuse_bytes of them wait unused.
"""
import math
import sys
import threading
import weakref

import numpy as np

from . import config

_MIN_BYTES = 1 << 20            # smaller buffers come from malloc's free lists without page faults
LARGE_BYTES = _MIN_BYTES        # eager results of at least this many bytes are written into fresh() arrays

_lock = threading.RLock()     # re-entrant: an owner can die (a callback) while take() holds it
_owned = []                     # (weak reference to the owner, the buffer as uint8, whether the owner is an array
                                # viewing the buffer: see _unused); those whose owner is gone in the order their
                                # owners were freed


def take(size, dtype):
    """An uninitialised 1-D buffer of `size` entries of `dtype`; pass it to keep() with its owner."""
    dtype = np.dtype(dtype)
    nbytes = size * dtype.itemsize
    if nbytes < _MIN_BYTES:
        return np.empty(size, dtype)
    with _lock:
        # a buffer at most a quarter larger: one of twice the size, handed out again and again, held budget the
        # buffers that fit a workload needed (W10 after W8: 12.8 MB buffers served its 8 MB requests, so its
        # 40 MB one was forgotten and allocated afresh every call, 10,000 page faults each)
        fits = [entry for entry in _unused() if nbytes <= entry[1].nbytes <= nbytes + (nbytes >> 2)]
        if fits:
            # the smallest, of those the one freed last: the likeliest to be in cache (an eager op whose
            # inputs just died writes where they were, as malloc's free lists would give it)
            entry = min(reversed(fits), key=lambda e: e[1].nbytes)
            _forget(entry)
            buffer = entry[1]
        else:
            buffer = np.empty(nbytes, np.uint8)
    return buffer[:nbytes].view(dtype)


def keep(owner, array):
    """Record that `array` (from take) lives as long as `owner`, and may be handed out again after it."""
    root = array if array.base is None else array.base
    if root.dtype == np.uint8 and root.nbytes >= _MIN_BYTES:
        with _lock:
            _owned.append((weakref.ref(owner, _owner_gone), root, owner is array and array.base is root))


def fresh(shape, dtype):
    """An uninitialised array of `shape` for an eager op's result (written with out=): at least _MIN_BYTES come
    from a buffer handed out again (no page faults on its first touch: numpy's own result of an 8 MB
    elementwise op took 1.3 ms here, one written into a reused buffer 0.4), owned by the array itself, so
    the buffer waits for reuse once the array and every view of it are gone."""
    dtype = np.dtype(dtype)
    size = math.prod(shape)
    if size * dtype.itemsize < _MIN_BYTES:
        return np.empty(shape, dtype)
    array = take(size, dtype).reshape(shape)
    keep(array, array)
    return array


def _owner_gone(reference):
    # while the owner is being freed its buffers are still referenced (by it): keep within the budget only. An
    # array that owns its buffer (fresh) references it once, as its base: past the budget it is forgotten now,
    # and freed with the array
    with _lock:
        for i, entry in enumerate(_owned):     # in the order they were freed (take, _unused)
            if entry[0] is reference:
                _owned.append(_owned.pop(i))
                break
        _unused(forget_shared=False, dying=reference)


def _unused(forget_shared=True, dying=None):
    """The entries whose owner is gone and whose buffer nothing else references, first freed first, at most the
    budget's worth (unused ones beyond it are forgotten). With forget_shared, so are entries whose owner is gone
    but whose buffer something still references (a view handed to the user): it dies with that reference.
    dying: the weak reference of an owner being freed; its array's base reference to the buffer is allowed."""
    unused = []
    for entry in list(_owned):
        if entry[0]() is not None:
            continue
        # only the entry's reference and this call's (and the base of a dying array that owns it)
        if sys.getrefcount(entry[1]) <= 2 + (entry[0] is dying and entry[2]):
            unused.append(entry)
        elif forget_shared:
            _forget(entry)
    total = sum(entry[1].nbytes for entry in unused)
    while unused and total > config.workspace_reuse_bytes:
        total -= unused[0][1].nbytes
        _forget(unused.pop(0))
    return unused


def _forget(entry):
    _owned[:] = [e for e in _owned if e is not entry]


class _Workspace(threading.local):
    """Per-thread buffers reused across sweeps: arena, adjoint and tangent buffers (take) and the kernels' scratch
    (scratch).

    Fresh multi-megabyte buffers cost a page fault per 4 KiB on first touch,
    more than an MLP's whole reverse sweep; buffers above jt.config.workspace_reuse_bytes are not kept, nor
    those of at most _MALLOC_BYTES (malloc serves them faster). A buffer that a gradient still views (see
    source_gradients) is not handed out again: a new one replaces it.
    """

    def __init__(self):
        self.buffers = {}

    def take(self, name, size, dtype):
        dtype = np.dtype(dtype)
        nbytes = size * dtype.itemsize
        if nbytes <= _MALLOC_BYTES or nbytes > config.workspace_reuse_bytes:
            return np.empty(size, dtype)
        buf = self.buffers.get((name, dtype))
        if buf is None or buf.size < size or sys.getrefcount(buf) > _HELD:
            buf = self.buffers[(name, dtype)] = np.empty(max(size, 1024), dtype)
        return buf[:size]

    def scratch(self, size, dtype):
        """A buffer of at least `size` entries of numpy dtype `dtype` that only one sweep uses while it runs
        (nothing keeps a view of it, so no reference check): the kernels' scratch."""
        buf = self.buffers.get(("scratch", dtype))
        if buf is None or buf.size < size:
            if size * dtype.itemsize > config.workspace_reuse_bytes:
                return np.empty(size, dtype)
            buf = self.buffers[("scratch", dtype)] = np.empty(max(size, 1024), dtype)
        return buf


# below glibc's mmap threshold (128 KiB) np.empty takes a buffer from malloc's free lists, without page faults, in
# 0.16 us, where a workspace buffer's lookup took 0.63 (an eager gradient's arena of 2,500 entries)
_MALLOC_BYTES = 64 << 10
_HELD = 3      # sys.getrefcount of a workspace buffer nothing else views: the dict's, take()'s name, the call's
workspace = _Workspace()
