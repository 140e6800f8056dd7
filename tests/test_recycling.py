"""jitape.recycling: a dead owner's large buffers are handed out again (the last freed first, for requests they
fit within a quarter), never while a view of them survives, and no more than jt.config.workspace_reuse_bytes of
them wait unused; a persistent tape's Programs use it. The sweeps' workspace keeps buffers malloc would not serve
from its free lists."""
import gc
import weakref

import numpy as np
import pytest

import jitape as jt
from jitape import recycling

MB = 1 << 20


class Owner:
    pass


@pytest.fixture(autouse=True)
def empty_pool():
    recycling._owned.clear()
    yield
    recycling._owned.clear()


def _address(a):
    return a.__array_interface__["data"][0]


def _freed_buffer():
    """The address of a 1 MB float64 buffer from take() whose owner is gone (it waits in the pool)."""
    owner = Owner()
    first = recycling.take(MB, np.float64)
    recycling.keep(owner, first)
    address = _address(first)
    del owner, first
    gc.collect()
    return address


def test_a_dead_owners_buffer_is_handed_out_again():
    address = _freed_buffer()
    again = recycling.take(7 * MB // 4, np.float32)     # 7/8 of the bytes (within a quarter), another dtype
    assert _address(again) == address and again.dtype == np.float32 and again.size == 7 * MB // 4
    assert recycling._owned == []                    # handed out: no longer waiting


def test_a_buffer_more_than_a_quarter_larger_waits_for_a_request_it_fits():
    # handed out for smaller requests, it would hold budget their workload's own buffers need: a workload whose
    # buffers all fit the budget then allocated one afresh every call
    address = _freed_buffer()
    smaller = recycling.take(3 * MB // 4, np.float64)
    assert _address(smaller) != address and len(recycling._owned) == 1
    assert _address(recycling.take(MB, np.float64)) == address


def test_of_buffers_that_fit_alike_the_one_freed_last_is_handed_out_first():
    """An eager op whose inputs just died writes where they were (in cache), as malloc's free lists would give:
    the order owners were freed in, not the order they came."""
    arrays = [recycling.fresh((MB // 8,), np.float64) for _ in range(4)]
    addresses = [_address(a) for a in arrays]
    for i in (2, 0, 3, 1):          # freed in this order
        arrays[i] = None
    gc.collect()
    taken = [_address(recycling.take(MB // 8, np.float64)) for _ in range(4)]
    assert taken == [addresses[i] for i in (1, 3, 0, 2)]
    assert recycling._owned == []


def test_a_buffer_with_a_surviving_view_is_never_handed_out():
    owner = Owner()
    buffer = recycling.take(MB, np.float64)
    recycling.keep(owner, buffer)
    buffer[:] = 7.0
    view = buffer[10:20]
    del owner, buffer
    gc.collect()
    other = recycling.take(MB, np.float64)
    assert _address(other) != _address(view) - 10 * 8
    other[:] = 0.0
    np.testing.assert_array_equal(view, 7.0)
    assert recycling._owned == []                    # forgotten: it dies with the view


def test_a_live_owners_buffer_is_not_handed_out():
    owner = Owner()
    buffer = recycling.take(MB, np.float64)
    recycling.keep(owner, buffer)
    other = recycling.take(MB, np.float64)
    assert _address(other) != _address(buffer)


def test_unused_buffers_stay_within_the_budget(monkeypatch):
    monkeypatch.setattr(jt.config, "workspace_reuse_bytes", 3 * MB)
    owners = [Owner() for _ in range(4)]
    for owner in owners:
        recycling.keep(owner, recycling.take(MB // 8, np.float64))     # 1 MiB each
    del owners, owner
    gc.collect()
    assert sum(entry[1].nbytes for entry in recycling._owned) <= 3 * MB


def test_small_buffers_are_plain_arrays():
    small = recycling.take(100, np.float64)
    recycling.keep(Owner(), small)
    assert recycling._owned == [] and small.base is None


def test_the_workspace_keeps_only_buffers_malloc_would_not_serve_from_its_free_lists():
    """The sweeps' workspace: buffers of at most _MALLOC_BYTES are plain arrays, one per request (malloc's free
    lists serve them faster than a lookup), larger ones are kept and handed out again."""
    workspace = recycling._Workspace()
    entries = recycling._MALLOC_BYTES // 8
    small = workspace.take("arena", entries, np.float64)
    assert small.base is None and small.size == entries and workspace.buffers == {}
    assert not np.shares_memory(workspace.take("arena", entries, np.float64), small)
    large = workspace.take("arena", entries + 1, np.float64)
    kept = weakref.ref(workspace.buffers[("arena", np.dtype(np.float64))])      # a reference would hold it
    assert large.size == entries + 1 and large.base is kept()
    del large
    assert workspace.take("arena", entries + 1, np.float64).base is kept()


def test_persistent_tapes_reuse_their_predecessors_buffers():
    x = jt.constant(np.linspace(0.5, 2.0, 300_000))
    addresses, gradients = [], []
    for _ in range(3):
        with jt.GradientTape(persistent=True) as tape:
            tape.watch(x)
            y = jt.reduce_sum(jt.exp(x) * x)
        gradients.append(tape.gradient(y, x).numpy())
        program = next(iter(tape._programs.values()))
        addresses.append((_address(program.arena), _address(program.cotangents)))
        del tape, y, program
        gc.collect()
    assert addresses[1] == addresses[2]
    expected = np.exp(x.numpy()) * (x.numpy() + 1)
    for g in gradients:
        np.testing.assert_allclose(g, expected, rtol=1e-14)


@pytest.mark.parametrize("op", [lambda a, b: a + b, lambda a, b: a - b[:1], lambda a, b: jt.exp(a),
                                lambda a, b: a * 3.0,
                                lambda a, b: jt.matmul(a, jt.transpose(b)),
                                lambda a, b: jt.matmul(jt.reshape(a, (2, 256, 512)), jt.reshape(b, (2, 512, 256)))])
def test_large_eager_results_live_in_reused_buffers_never_shared_with_a_live_value(op):
    """An eager op's result of at least LARGE_BYTES is written into a recycling.fresh array, which owns its
    buffer: once the result and its views are gone the next large result reuses the buffer, never while the
    result, a view of it or a tape's copy of it lives; the values are numpy's."""
    rng = np.random.default_rng(0)
    a0, b0 = rng.normal(size=(512, 512)), rng.normal(size=(512, 512))
    a, b = jt.constant(a0), jt.constant(b0)
    expected = op(a, b).numpy().copy()
    first = op(a, b)
    address = _address(first._value)
    np.testing.assert_array_equal(first.numpy(), expected)
    view = first._value[3:5]
    with jt.GradientTape() as tape:      # a recording tape keeps its recorded values too
        tape.watch(a)
        recorded = op(a, b)
    del first
    gc.collect()
    held = [op(a, b) for _ in range(3)]
    assert all(_address(h._value) != address for h in held)        # the view keeps it
    np.testing.assert_array_equal(view, expected[3:5])
    addresses = {_address(h._value) for h in held}
    del view, held
    gc.collect()
    again = op(a, b)
    assert _address(again._value) in addresses        # handed out again
    np.testing.assert_array_equal(again.numpy(), expected)
    np.testing.assert_array_equal(recorded.numpy(), expected)
    assert _address(recorded._value) != address


@pytest.mark.parametrize("dtype", [None, np.float32])
def test_large_replay_outputs_live_in_reused_buffers(dtype):
    """A jt.function's large output is copied out of its arena into a recycling.fresh array (as the output's
    dtype): the next call's output reuses the buffer once the previous output is gone, never while it lives."""
    x = jt.constant(np.random.default_rng(1).normal(size=(512, 512)))
    cast = (lambda y: y) if dtype is None else (lambda y: jt.cast(y, dtype))
    f = jt.function(lambda x: cast(x * 2.0 + 1.0))
    expected = cast(x * 2.0 + 1.0).numpy().copy()
    f(x)
    first = f(x)
    assert any(entry[1] is first._value.base for entry in recycling._owned)      # a recycled buffer
    address = _address(first._value)
    second = f(x)
    assert _address(second._value) != address
    np.testing.assert_array_equal(first.numpy(), expected)
    del first
    gc.collect()
    third = f(x)
    assert _address(third._value) == address
    np.testing.assert_array_equal(third.numpy(), expected)
    np.testing.assert_array_equal(second.numpy(), expected)
    assert third.numpy().dtype == expected.dtype
