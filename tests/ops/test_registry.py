"""One test over the op registry: every primitive and composite against numpy, its njit kernels,
its Python VJP and central finite differences (float64), on hypothesis-drawn shapes and values.

An op registered without a case here fails `test_every_op_has_a_case`; a primitive whose case does
not lower to its opcode fails the check; a missing piece (kernel, VJP, shape rule) fails the run.
"""
from dataclasses import dataclass
from typing import Callable
from unittest import mock

import numpy as np
import pytest
import scipy.special
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import jitape as jt
import jitape.program
from jitape.ops import COMPOSITES, NON_DIFFERENTIABLE, PRIMITIVES
from jitape_kernels import opcodes as oc
from jitape.execute import lowered, source_jacobians
from jitape_kernels.planning import READS_FIRST_ORDER
from jitape_kernels.cpu import forward_kernels, forward_sweep, new_temps
from jitape_kernels.cpu.interpreter import SMALL

SHAPES = hnp.array_shapes(min_dims=0, max_dims=4, min_side=1, max_side=3)
# size-0 tensors and empty axes: compiled code must neither crash nor leave its arrays on them
EMPTY_SHAPES = hnp.array_shapes(min_dims=1, max_dims=3, min_side=0, max_side=3).filter(lambda s: 0 in s)
SHAPES_OR_EMPTY = st.one_of(SHAPES, EMPTY_SHAPES)
# the sweeps run elementwise rows of at most SMALL entries inline and larger ones in the vectorised kernels:
# sizes on both sides of it
AROUND_SMALL = st.one_of(st.integers(SMALL - 1, SMALL + 2).map(lambda n: (n,)),
                         hnp.array_shapes(min_dims=2, max_dims=2, min_side=4, max_side=6))
MATRIX_SIDE = st.integers(1, 4)


@dataclass
class Case:
    fn: Callable                # jitape function of tensors
    ref: Callable               # numpy reference of arrays
    inputs: st.SearchStrategy   # tuple of args: float64 arrays (differentiated) and plain parameters
    step: float = 1e-6          # central-difference step
    rtol: float = 1e-10         # forward tolerance (a float64 Program cannot round to float32)
    keeps_dtype: bool = True    # float32 inputs give a float32 output
    draws_empty: bool = False   # the strategy itself draws size-0 tensors and empty axes (else see EMPTY)


def values(shape, lo, hi, gap=0.0):
    """Arrays in [lo, hi]; with gap > 0, bounded away from 0 by gap (kinks of abs, relu, sign ...)."""
    floats = st.floats(lo, hi, allow_nan=False, allow_infinity=False, width=64)
    arr = hnp.arrays(np.float64, shape, elements=floats)
    if gap:
        arr = arr.map(lambda a: np.where(a >= 0, a + gap, a - gap))
    return arr


def distinct(shape):
    """Values with no ties (extrema are unique) and no two within 0.1 of each other."""
    return st.builds(lambda s, seed: np.random.default_rng(seed).permutation(np.arange(int(np.prod(s))) * 0.37 - 1.1)
                     .reshape(s), st.just(shape) if isinstance(shape, tuple) else shape, st.integers(0, 2**16))


def unary(fn, ref, lo=-2.0, hi=2.0, gap=0.0):
    return Case(fn, ref, st.one_of(SHAPES_OR_EMPTY, AROUND_SMALL).flatmap(lambda s: st.tuples(values(s, lo, hi, gap))),
                draws_empty=True)


def binary(fn, ref, a=(-2.0, 2.0), b=(-2.0, 2.0), gap_b=0.0):
    pairs = st.one_of(hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=4, max_side=3),
                      hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=1, max_dims=3, min_side=0,
                                                        max_side=3)).map(lambda p: p.input_shapes)
    pairs = st.one_of(pairs, AROUND_SMALL.flatmap(lambda s: st.sampled_from([(s, s), (s, s[-1:]), ((), s)])))
    return Case(fn, ref, pairs.flatmap(lambda p: st.tuples(values(p[0], *a), values(p[1], *b, gap=gap_b))),
                draws_empty=True)


def separated_pair(fn, ref):
    """Equal-shape pairs whose entries differ by at least 0.2 (no ties for maximum/minimum)."""
    def build(s):
        return st.tuples(values(s, -2, 2), values(s, 0.2, 1.0), hnp.arrays(np.bool_, s)).map(
            lambda t: (t[0], t[0] + np.where(t[2], t[1], -t[1])))
    return Case(fn, ref, SHAPES.flatmap(build))


def with_axis(fn, ref, strategy=None, keepdims=True, shapes=SHAPES_OR_EMPTY):
    """Reductions over a random axis subset of a random shape (empty axes included unless `shapes` says)."""
    def build(s):
        axes = st.lists(st.integers(0, len(s) - 1), unique=True, max_size=len(s)).map(tuple) if s else st.just(())
        data = strategy(s) if strategy else values(s, -2, 2)
        return st.tuples(data, axes, st.booleans() if keepdims else st.just(False))
    return Case(lambda x, axes, keep: fn(x, axes or None, keep), lambda x, axes, keep: ref(x, axes or None, keep),
                shapes.flatmap(build), draws_empty=shapes is SHAPES_OR_EMPTY)


def square_matrices(count=1):
    def build(n):
        batch = st.sampled_from([(), (2,)])
        return batch.flatmap(lambda b: st.tuples(*[values(b + (n, n), -0.4, 0.4).map(lambda a: a + 2 * np.eye(n))
                                                   for _ in range(count)]))
    return MATRIX_SIDE.flatmap(build)


def _matmul_inputs():
    def build(m, k, n, batch_a, batch_b):
        return st.tuples(values(batch_a + (m, k), -2, 2), values(batch_b + (k, n), -2, 2))
    batches = st.sampled_from([((), ()), ((2,), ()), ((), (2,)), ((2,), (2,)), ((2, 1), (3,))])
    sides = st.integers(0, 4)       # 0: empty products (zeros) and empty operands
    return st.tuples(sides, sides, sides, batches).flatmap(
        lambda t: build(t[0], t[1], t[2], *t[3]))


def _perm_inputs():
    return SHAPES_OR_EMPTY.flatmap(lambda s: st.tuples(values(s, -2, 2), st.permutations(list(range(len(s))))))


def _tile_inputs():
    return SHAPES_OR_EMPTY.flatmap(lambda s: st.tuples(values(s, -2, 2), st.tuples(*[st.integers(1, 3) for _ in s])))


def _slice_inputs():
    def build(s):
        def window(n):
            return st.tuples(st.integers(0, n - 1), st.sampled_from([1, 2, -1]), st.booleans()).flatmap(
                lambda t: st.integers(1, len(range(t[0], n if t[1] > 0 else -1, t[1]))).map(
                    lambda c: (t[0], t[1], c, t[2] and c == 1)))
        return st.tuples(values(s, -2, 2), st.tuples(*[window(n) for n in s]))
    return SHAPES.filter(lambda s: len(s) > 0).flatmap(build)


def _window_key(windows):
    """A numpy subscript per window (start, step, count[, as an int index: an axis of one entry, dropped])."""
    return tuple(w[0] if w[3:] == (True,) else slice(w[0], w[0] + w[2] * w[1] if w[0] + w[2] * w[1] >= 0 else None, w[1])
                 for w in windows)


def _pad_inputs():
    return SHAPES.filter(lambda s: len(s) > 0).flatmap(
        lambda s: st.tuples(values(s, -2, 2), st.tuples(*[st.tuples(st.integers(0, 2), st.integers(0, 2)) for _ in s]),
                            st.sampled_from(["CONSTANT", "REFLECT", "SYMMETRIC"])))


def _pad_ref(x, pads, mode):
    pads = [(min(b, n - (mode == "REFLECT")), min(a, n - (mode == "REFLECT"))) for (b, a), n in zip(pads, x.shape)]
    return np.pad(x, pads, mode={"CONSTANT": "constant", "REFLECT": "reflect", "SYMMETRIC": "symmetric"}[mode])


def _pad_fn(x, pads, mode):
    pads = [(min(b, n - (mode == "REFLECT")), min(a, n - (mode == "REFLECT"))) for (b, a), n in zip(pads, x.shape)]
    return jt.pad(x, pads, mode)


def _concat_inputs():
    def build(s, axis, sizes):
        shapes = [s[:axis] + (k,) + s[axis + 1:] for k in sizes]
        return st.tuples(st.tuples(*[values(sh, -2, 2) for sh in shapes]), st.just(axis))
    return SHAPES.filter(lambda s: len(s) > 0).flatmap(
        lambda s: st.tuples(st.just(s), st.integers(0, len(s) - 1), st.lists(st.integers(1, 3), min_size=1, max_size=3))
    ).flatmap(lambda t: build(*t))


def _gather_inputs():
    def build(s, axis):
        idx = hnp.arrays(np.int64, hnp.array_shapes(min_dims=0, max_dims=2, max_side=3),
                         elements=st.integers(0, s[axis] - 1))
        return st.tuples(values(s, -2, 2), idx, st.just(axis))
    return SHAPES.filter(lambda s: len(s) > 0).flatmap(
        lambda s: st.integers(0, len(s) - 1).flatmap(lambda a: build(s, a)))


def _einsum_inputs():
    specs = [("ij,jk->ik", [(2, 3), (3, 4)]), ("bij,bjk->bik", [(2, 2, 3), (2, 3, 1)]), ("ii->", [(3, 3)]),
             ("ij->ji", [(2, 3)]), ("i,i->", [(3,), (3,)]), ("ij,kj,k->i", [(2, 3), (4, 3), (4,)]),
             ("...ij,jk->...ik", [(2, 2, 3), (3, 2)]), ("ij,ij->i", [(2, 3), (2, 3)]), ("ijk->kj", [(2, 3, 2)]),
             # a batch axis between rows and sums: one MATMUL over the strided items (interleaved_matmul)
             ("kij,nkj->nki", [(3, 2, 2), (2, 3, 2)]), ("nkj,kjl->nkl", [(2, 3, 2), (3, 2, 3)]),
             ("bnkj,bkij->bnki", [(2, 2, 2, 3), (2, 2, 2, 3)])]
    return st.sampled_from(specs).flatmap(
        lambda sp: st.tuples(st.just(sp[0]), st.tuples(*[values(s, -2, 2) for s in sp[1]])))


def _logits_labels(one_hot):
    def build(s):
        labels = values(s, 0.0, 1.0)
        if one_hot:
            labels = labels.map(lambda z: np.exp(z) / np.exp(z).sum(axis=-1, keepdims=True))
        return st.tuples(labels, values(s, -3, 3))
    return SHAPES.filter(lambda s: len(s) > 0).flatmap(build)


def _softmax_ref(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _norm_inputs():
    return st.one_of(
        SHAPES.flatmap(lambda s: st.tuples(values(s, -2, 2, gap=0.1), st.sampled_from(["euclidean", 1, np.inf, 3]),
                                           st.just(None))),
        st.tuples(values((3, 4), -2, 2, gap=0.1), st.sampled_from(["fro", "euclidean"]), st.just((0, 1))),
        st.tuples(values((2, 3), -2, 2, gap=0.1), st.sampled_from([2, 1]), st.just(1)))


def _running_ref(ufunc):
    """numpy's running reduction with TensorFlow's exclusive and reverse flags."""
    def ref(x, axis, exclusive, reverse):
        v = np.flip(x, axis) if reverse else x
        out = ufunc.accumulate(v, axis=axis)
        if exclusive and out.shape[axis]:
            n = out.shape[axis]
            first = np.full_like(np.take(out, [0], axis), ufunc.identity)
            out = np.concatenate([first, np.take(out, np.arange(n - 1), axis)], axis)
        return np.flip(out, axis) if reverse else out
    return ref


def _running_inputs():
    return SHAPES.filter(len).flatmap(lambda s: st.tuples(values(s, -2, 2), st.integers(-len(s), len(s) - 1),
                                                          st.booleans(), st.booleans()))


def _gelu_ref(x, approximate):
    if approximate:
        return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))
    return 0.5 * x * (1 + scipy.special.erf(x / np.sqrt(2)))


# -- TensorFlow names (composites): input strategies ----------------------------------------
NONSCALAR = SHAPES.filter(len)


def _axis_of(s):
    return st.integers(-len(s), len(s) - 1)


def _roll_inputs():
    return NONSCALAR.flatmap(lambda s: st.tuples(values(s, -2, 2), st.lists(st.integers(-4, 4), min_size=1, max_size=2),
                                                 st.just(s)).flatmap(
        lambda t: st.tuples(st.just(t[0]), st.just(tuple(t[1])),
                            st.tuples(*[st.integers(0, len(t[2]) - 1) for _ in t[1]]))))


def _repeat_inputs():
    def build(s):
        along_axis = st.integers(0, len(s) - 1).flatmap(
            lambda a: st.tuples(values(s, -2, 2), st.tuples(*[st.integers(0, 2) for _ in range(s[a])]).map(
                lambda r: r if sum(r) else (1,) + r[1:]), st.just(a)))
        flattened = st.tuples(values(s, -2, 2), st.integers(1, 3), st.just(None))
        return st.one_of(along_axis, flattened)
    return NONSCALAR.flatmap(build)


def _std_inputs():
    """Reduced axes of size >= 2 with distinct values: the variance stays away from 0 (sqrt's kink)."""
    shapes = hnp.array_shapes(min_dims=1, max_dims=3, min_side=2, max_side=3)
    return shapes.flatmap(lambda s: st.tuples(distinct(s), st.lists(st.integers(0, len(s) - 1), unique=True, min_size=1,
                                                                      max_size=len(s)).map(tuple), st.booleans()))


def _sort_inputs():
    return NONSCALAR.flatmap(lambda s: st.tuples(distinct(s), _axis_of(s), st.sampled_from(["ASCENDING", "DESCENDING"])))


def _sort_ref(x, axis, direction):
    return np.sort(x, axis) if direction == "ASCENDING" else -np.sort(-x, axis)


def _top_k_ref(x, k):
    return -np.sort(-x, axis=-1)[..., :k]


def _matvec_inputs():
    def build(m, n, batch, transpose):
        a_shape = batch + ((n, m) if transpose else (m, n))
        return st.tuples(values(a_shape, -2, 2), values(batch + (n,), -2, 2), st.just(transpose))
    return st.tuples(MATRIX_SIDE, MATRIX_SIDE, st.sampled_from([(), (2,)]), st.booleans()).flatmap(lambda t: build(*t))


def _matrix_inputs():
    """Matrices (..., m, n), not necessarily square."""
    return st.tuples(st.sampled_from([(), (2,)]), MATRIX_SIDE, MATRIX_SIDE).flatmap(
        lambda t: st.tuples(values(t[0] + (t[1], t[2]), -2, 2)))


def _band_ref(x, lower, upper):
    offset = np.arange(x.shape[-2])[:, None] - np.arange(x.shape[-1])[None, :]
    return np.where(((lower < 0) | (offset <= lower)) & ((upper < 0) | (-offset <= upper)), x, 0.0)


def _triangular_ref(a, b, lower, adjoint):
    t = np.tril(a) if lower else np.triu(a)
    return np.linalg.solve(np.swapaxes(t, -1, -2) if adjoint else t, b)


def _pivoting_matrices():
    """Well-conditioned matrices whose rows are shuffled and some negated: LU must pivot, and determinants
    take both signs."""
    def build(n):
        return st.tuples(st.sampled_from([(), (2,)]), st.permutations(list(range(n))),
                         hnp.arrays(np.bool_, (n,))).flatmap(
            lambda t: values(t[0] + (n, n), -0.4, 0.4).map(
                lambda a: ((a + 2 * np.eye(n)) * np.where(t[2], -1.0, 1.0)[:, None])[..., t[1], :]))
    return MATRIX_SIDE.flatmap(lambda n: st.tuples(build(n)))


def _cross_inputs():
    return st.sampled_from([((3,), (3,)), ((2, 3), (2, 3)), ((2, 3), (3,)), ((1, 3), (2, 1, 3))]).flatmap(
        lambda p: st.tuples(values(p[0], -2, 2), values(p[1], -2, 2)))


def _sparse_labels_inputs():
    return NONSCALAR.flatmap(lambda s: st.tuples(
        hnp.arrays(np.int64, s[:-1], elements=st.integers(0, s[-1] - 1)), values(s, -3, 3)))


def _sparse_ce_ref(labels, logits):
    log_p = np.log(_softmax_ref(logits))
    return -np.take_along_axis(log_p, labels[..., None], axis=-1)[..., 0]


def _index_tuples(dims, count):
    """An int64 array (count, len(dims)) of in-range index tuples."""
    return st.tuples(*[st.integers(0, d - 1) for d in dims]).map(list) if dims else st.just([])


def _gather_nd_inputs():
    def build(s, k, count):
        idx = st.lists(_index_tuples(s[:k], count), min_size=count, max_size=count).map(
            lambda rows: np.asarray(rows, np.int64).reshape(count, k))
        return st.tuples(values(s, -2, 2), idx)
    return NONSCALAR.flatmap(lambda s: st.tuples(st.just(s), st.integers(1, len(s)), st.integers(1, 3))).flatmap(
        lambda t: build(*t))


def _gather_nd_ref(x, idx):
    return x[tuple(idx.T)]


def _boolean_mask_inputs():
    def build(s, axis, rank):
        mask = hnp.arrays(np.bool_, s[axis:axis + rank]).map(lambda m: m | (np.arange(m.size) == 0).reshape(m.shape))
        return st.tuples(values(s, -2, 2), mask, st.just(axis))
    return NONSCALAR.flatmap(lambda s: st.integers(0, len(s) - 1).flatmap(
        lambda a: st.integers(1, len(s) - a).flatmap(lambda r: build(s, a, r))))


def _boolean_mask_ref(x, mask, axis):
    flat = x.reshape(x.shape[:axis] + (mask.size,) + x.shape[axis + mask.ndim:])
    return np.take(flat, np.flatnonzero(mask), axis=axis)


def _scatter_inputs():
    def build(s, k, count):
        idx = st.lists(_index_tuples(s[:k], count), min_size=count, max_size=count).map(
            lambda rows: np.asarray(rows, np.int64).reshape(count, k))
        return st.tuples(values(s, -2, 2), idx, values((count,) + s[k:], -2, 2))
    return NONSCALAR.flatmap(lambda s: st.tuples(st.just(s), st.integers(1, len(s)), st.integers(1, 4))).flatmap(
        lambda t: build(*t))


def _scatter_add_ref(x, idx, updates):
    out = x.copy()
    np.add.at(out, tuple(idx.T), updates)
    return out


def _scatter_update_ref(x, idx, updates):
    out = x.copy()
    for row, u in zip(idx, updates):          # in order: the last duplicate wins
        out[tuple(row)] = u
    return out


def _away_from(points, lo, hi, gap=0.1):
    """Values in [lo, hi] at least `gap` from every kink in `points`."""
    def push(a):
        for p in points:
            a = np.where(np.abs(a - p) < gap, p + np.where(a >= p, gap, -gap), a)
        return a
    return SHAPES.flatmap(lambda s: st.tuples(values(s, lo, hi).map(push)))


CASES = {
    # elementwise unary
    "negative": unary(jt.negative, np.negative),
    "square": unary(jt.square, np.square),
    "sqrt": unary(jt.sqrt, np.sqrt, 0.2, 3.0),
    "exp": unary(jt.exp, np.exp),
    "log": unary(jt.log, np.log, 0.2, 3.0),
    "log1p": unary(jt.log1p, np.log1p, -0.5, 3.0),
    "sin": unary(jt.sin, np.sin, -3, 3),
    "cos": unary(jt.cos, np.cos, -3, 3),
    "tan": unary(jt.tan, np.tan, -1.2, 1.2),
    "tanh": unary(jt.tanh, np.tanh, -3, 3),
    "abs": unary(jt.abs, np.abs, gap=0.1),
    "sign": unary(jt.sign, np.sign, gap=0.1),
    "sigmoid": unary(jt.nn.sigmoid, lambda x: 1 / (1 + np.exp(-x)), -8, 8),
    "relu": unary(jt.nn.relu, lambda x: np.maximum(x, 0), gap=0.1),
    "softplus": unary(jt.nn.softplus, lambda x: np.log1p(np.exp(x)), -5, 5),
    "elu": Case(lambda x, a: jt.nn.elu(x, a), lambda x, a: np.where(x > 0, x, a * np.expm1(x)),
                SHAPES.flatmap(lambda s: st.tuples(values(s, -2, 2, gap=0.1), st.sampled_from([1.0, 0.5])))),
    "clip_by_value": Case(lambda x: jt.clip_by_value(x, -0.5, 0.7), lambda x: np.clip(x, -0.5, 0.7),
                          SHAPES.flatmap(lambda s: st.tuples(distinct(s)))),
    "scale": Case(lambda x: x * 2.5, lambda x: x * 2.5, SHAPES.flatmap(lambda s: st.tuples(values(s, -2, 2)))),
    "powc": Case(lambda x, c: x ** c, lambda x, c: x ** c,
                 SHAPES.flatmap(lambda s: st.tuples(values(s, 0.3, 2), st.sampled_from([2, 3, 0.5, -1.5])))),
    "cast": Case(lambda x: jt.cast(jt.cast(x, np.float32), np.float64),
                 lambda x: x.astype(np.float32).astype(np.float64),
                 SHAPES.flatmap(lambda s: st.tuples(values(s, -2, 2))), step=1e-2, rtol=1e-7, keeps_dtype=False),
    # elementwise binary (numpy broadcasting)
    "add": binary(jt.add, np.add),
    "subtract": binary(jt.subtract, np.subtract),
    "multiply": binary(jt.multiply, np.multiply),
    "divide": binary(jt.divide, np.divide, b=(0.5, 2.0), gap_b=0.0),
    "pow": binary(jt.pow, np.power, a=(0.3, 2.0), b=(-2.0, 2.0)),
    "maximum": separated_pair(jt.maximum, np.maximum),
    "minimum": separated_pair(jt.minimum, np.minimum),
    "where": Case(lambda c, x, y: jt.where(c > 0, x, y), lambda c, x, y: np.where(c > 0, x, y),
                  hnp.mutually_broadcastable_shapes(num_shapes=3, max_dims=3, max_side=3).flatmap(
                      lambda p: st.tuples(values(p.input_shapes[0], -2, 2, gap=0.1),
                                          *[values(s, -2, 2) for s in p.input_shapes[1:]]))),
    # shape
    "reshape": Case(lambda x: jt.reshape(x, (-1,)), lambda x: x.reshape(-1),
                    SHAPES.flatmap(lambda s: st.tuples(values(s, -2, 2)))),
    "transpose": Case(lambda x, p: jt.transpose(x, p), lambda x, p: np.transpose(x, p), _perm_inputs(),
                      draws_empty=True),
    "tile": Case(lambda x, r: jt.tile(x, r), lambda x, r: np.tile(x, r), _tile_inputs(), draws_empty=True),
    "strided_slice": Case(lambda x, w: x[_window_key(w)], lambda x, w: x[_window_key(w)], _slice_inputs()),
    "pad": Case(_pad_fn, _pad_ref, _pad_inputs()),
    "concat": Case(lambda xs, axis: jt.concat(list(xs), axis), lambda xs, axis: np.concatenate(xs, axis),
                   _concat_inputs()),
    "gather": Case(lambda x, idx, axis: jt.gather(x, idx, axis=axis), lambda x, idx, axis: np.take(x, idx, axis=axis),
                   _gather_inputs()),
    # reductions
    "reduce_sum": with_axis(lambda x, a, k: jt.reduce_sum(x, a, k), lambda x, a, k: np.sum(x, a, keepdims=k)),
    # (an extremum of an empty axis raises, as numpy's: tested in test_errors)
    "reduce_max": with_axis(lambda x, a, k: jt.reduce_max(x, a, k), lambda x, a, k: np.max(x, a, keepdims=k), distinct,
                            shapes=SHAPES),
    "reduce_min": with_axis(lambda x, a, k: jt.reduce_min(x, a, k), lambda x, a, k: np.min(x, a, keepdims=k), distinct,
                            shapes=SHAPES),
    "reduce_prod": with_axis(lambda x, a, k: jt.reduce_prod(x, a, k), lambda x, a, k: np.prod(x, a, keepdims=k)),
    "reduce_mean": with_axis(lambda x, a, k: jt.reduce_mean(x, a, k), lambda x, a, k: np.mean(x, a, keepdims=k)),
    "reduce_variance": with_axis(lambda x, a, k: jt.reduce_variance(x, a, k), lambda x, a, k: np.var(x, a, keepdims=k)),
    "reduce_logsumexp": with_axis(lambda x, a, k: jt.reduce_logsumexp(x, a, k),
                                  lambda x, a, k: np.log(np.sum(np.exp(x), a, keepdims=k))),
    # linear algebra
    "matmul": Case(jt.matmul, np.matmul, _matmul_inputs(), draws_empty=True),
    "solve": Case(lambda a, b: jt.linalg.solve(a, b), np.linalg.solve,
                  square_matrices(1).flatmap(lambda t: st.tuples(st.just(t[0]), values(t[0].shape[:-1] + (2,), -2, 2)))),
    "inv": Case(jt.linalg.inv, np.linalg.inv, square_matrices(1)),
    "einsum": Case(lambda eq, xs: jt.einsum(eq, *xs), lambda eq, xs: np.einsum(eq, *xs), _einsum_inputs()),
    "tensordot": Case(lambda a, b: jt.tensordot(a, b, 2), lambda a, b: np.tensordot(a, b, 2),
                      st.tuples(values((2, 3, 4), -2, 2), values((3, 4, 2), -2, 2))),
    "norm": Case(lambda x, o, a: jt.norm(x, o, a), lambda x, o, a: np.linalg.norm(x.reshape(-1) if a is None else x,
                                                                                   None if o == "euclidean" else o, a),
                 _norm_inputs()),
    "clip_by_norm": Case(lambda x, c: jt.clip_by_norm(x, c), lambda x, c: x * c / max(np.linalg.norm(x), c),
                         SHAPES.flatmap(lambda s: st.tuples(values(s, -2, 2, gap=0.1), st.sampled_from([0.5, 100.0])))),
    # nn
    "softmax": Case(jt.nn.softmax, _softmax_ref, SHAPES.filter(len).flatmap(lambda s: st.tuples(values(s, -3, 3)))),
    "log_softmax": Case(jt.nn.log_softmax, lambda x: np.log(_softmax_ref(x)),
                        SHAPES.filter(len).flatmap(lambda s: st.tuples(values(s, -3, 3)))),
    "sigmoid_cross_entropy_with_logits": Case(
        lambda z, x: jt.nn.sigmoid_cross_entropy_with_logits(labels=z, logits=x),
        lambda z, x: -z * np.log(1 / (1 + np.exp(-x))) - (1 - z) * np.log(1 - 1 / (1 + np.exp(-x))),
        _logits_labels(False)),
    "softmax_cross_entropy_with_logits": Case(
        lambda z, x: jt.nn.softmax_cross_entropy_with_logits(z, x),
        lambda z, x: -np.sum(z * np.log(_softmax_ref(x)), axis=-1), _logits_labels(True)),
    # -- TensorFlow names (primitives) --
    "sinh": unary(jt.sinh, np.sinh, -3, 3),
    "cosh": unary(jt.cosh, np.cosh, -3, 3),
    "asinh": unary(jt.asinh, np.arcsinh, -3, 3),
    "acosh": unary(jt.acosh, np.arccosh, 1.2, 3.0),
    "atanh": unary(jt.atanh, np.arctanh, -0.8, 0.8),
    "asin": unary(jt.asin, np.arcsin, -0.8, 0.8),
    "acos": unary(jt.acos, np.arccos, -0.8, 0.8),
    "atan": unary(jt.atan, np.arctan, -3, 3),
    "expm1": unary(jt.expm1, np.expm1),
    "erf": unary(jt.erf, scipy.special.erf),
    "erfc": unary(jt.erfc, scipy.special.erfc),
    "lgamma": unary(jt.lgamma, scipy.special.gammaln, 0.3, 4.0),
    "digamma": unary(jt.digamma, scipy.special.digamma, 0.3, 4.0),
    "polygamma": Case(lambda x, n: jt.math.polygamma(n, x), lambda x, n: scipy.special.polygamma(n, x),
                      SHAPES.flatmap(lambda s: st.tuples(values(s, 0.3, 4.0), st.sampled_from([1, 2])))),
    "log10": unary(jt.math.log10, np.log10, 0.2, 3.0),
    "log2": unary(jt.math.log2, np.log2, 0.2, 3.0),
    "atan2": binary(jt.atan2, np.arctan2, a=(-2.0, 2.0), b=(0.3, 2.0)),
    "cumsum": Case(lambda x, axis, ex, rev: jt.cumsum(x, axis, ex, rev), _running_ref(np.add), _running_inputs()),
    "cumprod": Case(lambda x, axis, ex, rev: jt.math.cumprod(x, axis, ex, rev), _running_ref(np.multiply),
                    _running_inputs()),
    "gelu": Case(lambda x, approximate: jt.nn.gelu(x, approximate), _gelu_ref,
                 SHAPES.flatmap(lambda s: st.tuples(values(s, -3, 3), st.booleans()))),
    # -- TensorFlow names (composites) --
    "roll": Case(lambda x, s, a: jt.roll(x, s, a), lambda x, s, a: np.roll(x, s, a), _roll_inputs()),
    "repeat": Case(lambda x, r, a: jt.repeat(x, r, a), lambda x, r, a: np.repeat(x, r, a), _repeat_inputs()),
    "reduce_std": Case(lambda x, a, k: jt.math.reduce_std(x, a, k), lambda x, a, k: np.std(x, a, keepdims=k),
                       _std_inputs()),
    "sort": Case(lambda x, a, d: jt.sort(x, a, d), _sort_ref, _sort_inputs()),
    "top_k": Case(lambda x, k: jt.math.top_k(x, k).values, _top_k_ref,
                  NONSCALAR.flatmap(lambda s: st.tuples(distinct(s), st.integers(1, s[-1])))),
    "matvec": Case(lambda a, b, t: jt.linalg.matvec(a, b, transpose_a=t),
                   lambda a, b, t: np.einsum("...ji,...j->...i" if t else "...ij,...j->...i", a, b), _matvec_inputs()),
    "cross": Case(jt.linalg.cross, np.cross, _cross_inputs()),
    "diag_part": Case(jt.linalg.diag_part, lambda x: np.diagonal(x, axis1=-2, axis2=-1), _matrix_inputs()),
    "trace": Case(jt.linalg.trace, lambda x: np.trace(x, axis1=-2, axis2=-1), _matrix_inputs()),
    "band_part": Case(lambda x, lo, up: jt.linalg.band_part(x, lo, up), _band_ref,
                      _matrix_inputs().flatmap(lambda t: st.tuples(st.just(t[0]), st.integers(-1, 2), st.integers(-1, 2)))),
    "triangular_solve": Case(lambda a, b, lower, adj: jt.linalg.triangular_solve(a, b, lower, adj), _triangular_ref,
                             square_matrices(1).flatmap(lambda t: st.tuples(
                                 st.just(t[0]), values(t[0].shape[:-1] + (2,), -2, 2), st.booleans(), st.booleans()))),
    "cholesky": Case(jt.linalg.cholesky, np.linalg.cholesky, square_matrices(1)),
    "det": Case(jt.linalg.det, np.linalg.det, _pivoting_matrices()),
    "slogdet": Case(lambda a: jt.linalg.slogdet(a)[1], lambda a: np.linalg.slogdet(a)[1], _pivoting_matrices()),
    "gather_nd": Case(jt.gather_nd, _gather_nd_ref, _gather_nd_inputs()),
    "boolean_mask": Case(lambda x, m, a: jt.boolean_mask(x, m, axis=a), _boolean_mask_ref, _boolean_mask_inputs()),
    "tensor_scatter_nd_add": Case(jt.tensor_scatter_nd_add, _scatter_add_ref, _scatter_inputs()),
    "tensor_scatter_nd_update": Case(jt.tensor_scatter_nd_update, _scatter_update_ref, _scatter_inputs()),
    "sparse_softmax_cross_entropy_with_logits": Case(
        lambda z, x: jt.nn.sparse_softmax_cross_entropy_with_logits(z, x), _sparse_ce_ref, _sparse_labels_inputs()),
    "l2_loss": unary(jt.nn.l2_loss, lambda x: np.sum(x ** 2) / 2),
    "leaky_relu": Case(lambda x, a: jt.nn.leaky_relu(x, a), lambda x, a: np.where(x > 0, x, a * x),
                       SHAPES.flatmap(lambda s: st.tuples(values(s, -2, 2, gap=0.1), st.sampled_from([0.2, 0.01])))),
    "selu": unary(jt.nn.selu, lambda x: 1.0507009873554805 * np.where(x > 0, x, 1.6732632423543772 * np.expm1(x)),
                  gap=0.1),
    "silu": unary(jt.nn.silu, lambda x: x / (1 + np.exp(-x)), -5, 5),
    "log_sigmoid": unary(jt.nn.log_sigmoid, lambda x: -np.log1p(np.exp(-x)), -8, 8),
    "relu6": Case(jt.nn.relu6, lambda x: np.clip(x, 0, 6), _away_from((0.0, 6.0), -2, 8)),
}

def _zeros(*shape):
    return np.zeros(shape)


# size-0 examples of the ops whose strategies draw none: every op meets empty tensors and empty axes
EMPTY = {
    "elu": [(_zeros(0, 3), 1.0)], "clip_by_value": [(_zeros(2, 0),)], "scale": [(_zeros(0),)],
    "powc": [(_zeros(0, 2), 2)], "cast": [(_zeros(0, 2),)], "maximum": [(_zeros(0, 2), _zeros(0, 2))],
    "minimum": [(_zeros(0, 2), _zeros(2))], "where": [(_zeros(0, 2), _zeros(0, 2), _zeros(2))],
    "reshape": [(_zeros(0, 3),)],
    "strided_slice": [(_zeros(0, 3), ((0, 1, 0), (0, 1, 3))), (_zeros(2, 3), ((0, 1, 2), (1, 1, 0)))],
    "pad": [(_zeros(0, 2), ((1, 1), (0, 1)), "CONSTANT")],
    "concat": [((_zeros(2, 0), np.full((2, 3), 0.5)), 1), ((_zeros(0, 3), _zeros(0, 3)), 0)],
    "gather": [(np.ones((3, 2)), np.zeros(0, np.int64), 0), (_zeros(3, 0), np.array([0, 2]), 0)],
    "solve": [(_zeros(0, 2, 2), _zeros(0, 2, 1))], "inv": [(_zeros(0, 2, 2),)],
    "einsum": [("ij,jk->ik", (_zeros(2, 0), _zeros(0, 3))), ("i,i->", (_zeros(0), _zeros(0)))],
    "tensordot": [(_zeros(2, 0, 3), _zeros(0, 3, 2))],
    "norm": [(_zeros(0), "euclidean", None), (_zeros(0, 3), "euclidean", 1)],
    "clip_by_norm": [(_zeros(0), 0.5)], "softmax": [(_zeros(0, 3),)], "log_softmax": [(_zeros(0, 3),)],
    "sigmoid_cross_entropy_with_logits": [(_zeros(0, 2), _zeros(0, 2))],
    "softmax_cross_entropy_with_logits": [(_zeros(0, 3), _zeros(0, 3))],
    "reduce_max": [(_zeros(0, 3), (1,), False)], "reduce_min": [(_zeros(0, 3), (1,), True)],
    "polygamma": [(_zeros(0) + 1, 1)],
    "cumsum": [(_zeros(0, 3), 1, False, False), (_zeros(2, 0), 1, True, True)],
    "cumprod": [(_zeros(0, 3), 1, False, True), (_zeros(2, 0), 1, True, False)],
    "gelu": [(_zeros(0, 2), False)], "roll": [(_zeros(0, 3), 1, 1)], "repeat": [(_zeros(0, 2), 2, 1)],
    "reduce_std": [(_zeros(0, 3), (1,), False)], "sort": [(_zeros(0, 3), -1, "ASCENDING")],
    "top_k": [(_zeros(0, 3), 2)], "matvec": [(_zeros(0, 2, 3), _zeros(3), False)],
    "cross": [(_zeros(0, 3), _zeros(0, 3))], "diag_part": [(_zeros(0, 2, 2),)], "trace": [(_zeros(0, 2, 2),)],
    "band_part": [(_zeros(0, 3, 3), 1, 0)], "triangular_solve": [(_zeros(0, 2, 2), _zeros(0, 2, 1), True, False)],
    "cholesky": [(_zeros(0, 2, 2),)], "det": [(_zeros(0, 2, 2),)], "slogdet": [(_zeros(0, 2, 2),)],
    "gather_nd": [(np.ones((3, 2)), np.zeros((0, 1), np.int64))],
    "boolean_mask": [(np.ones((3, 2)), np.zeros(3, bool), 0)],
    "tensor_scatter_nd_add": [(np.ones((3, 2)), np.zeros((0, 1), np.int64), _zeros(0, 2))],
    "tensor_scatter_nd_update": [(np.ones((3, 2)), np.zeros((0, 1), np.int64), _zeros(0, 2))],
    "sparse_softmax_cross_entropy_with_logits": [(np.zeros(0, np.int64), _zeros(0, 3))],
    "leaky_relu": [(_zeros(0, 2), 0.2)], "relu6": [(_zeros(0, 2),)],
}

OPS = sorted(PRIMITIVES) + sorted(COMPOSITES)


def test_every_op_meets_empty_tensors():
    missing = [name for name in OPS if not CASES[name].draws_empty and name not in EMPTY]
    assert not missing, f"ops whose cases never meet a size-0 tensor: {missing}"


def test_every_op_has_a_case():
    missing = [name for name in OPS if name not in CASES]
    assert not missing, f"ops registered without a test case: {missing}"
    assert not set(CASES) - set(OPS), f"cases for unregistered ops: {set(CASES) - set(OPS)}"


def _flatten_args(args):
    """Float arrays among args, including inside one level of tuples (concat/einsum operand lists)."""
    flat = []
    for i, a in enumerate(args):
        if isinstance(a, np.ndarray) and a.dtype == np.float64:
            flat.append((i, None))
        elif isinstance(a, tuple) and a and all(isinstance(v, np.ndarray) for v in a):
            flat.extend((i, j) for j in range(len(a)))
    return flat


def _substitute(args, where, replacements):
    args = [list(a) if isinstance(a, tuple) and all(isinstance(v, np.ndarray) for v in a) else a for a in args]
    for (i, j), r in zip(where, replacements):
        if j is None:
            args[i] = r
        else:
            args[i][j] = r
    return [tuple(a) if isinstance(a, list) else a for a in args]


def _numerical_vjp(case, args, where, ct):
    h = case.step
    grads = []
    for k, (i, j) in enumerate(where):
        base = args[i] if j is None else args[i][j]
        g = np.zeros_like(base)
        for idx in np.ndindex(base.shape):
            plus, minus = base.copy(), base.copy()
            plus[idx] += h
            minus[idx] -= h
            f_plus = np.sum(case.ref(*_substitute(args, [(i, j)], [plus])) * ct)
            f_minus = np.sum(case.ref(*_substitute(args, [(i, j)], [minus])) * ct)
            g[idx] = (f_plus - f_minus) / (2 * h)
        grads.append(g)
    return grads


def _sharing_every_row():
    """Non-persistent tapes' first-order Programs planned with every slot (scalars too) sharing adjoint rows where
    never live at once (planning.adjoint_layout), none kept from before: no rule reads a row outside its slot's
    lifetime, or its numbers change."""
    return mock.patch.multiple(jitape.program, SHARED_ROWS_MIN=1, _plans={})


def _check(name, args):
    """Run every comparison for one example; returns the opcodes its Program holds."""
    case = CASES[name]
    where = _flatten_args(args)
    arrays = [args[i] if j is None else args[i][j] for i, j in where]
    tensors = [jt.constant(a) for a in arrays]
    expected = np.asarray(case.ref(*args))

    # eager forward == numpy
    eager = case.fn(*_substitute(args, where, tensors))
    np.testing.assert_allclose(np.asarray(eager), expected, rtol=case.rtol, atol=1e-12, err_msg=f"{name}: forward")
    assert eager.shape == expected.shape and eager.dtype == np.float64

    ct = np.random.default_rng(len(expected.shape)).uniform(0.5, 1.5, expected.shape)
    with jt.GradientTape(persistent=True) as tape:
        tape.watch(tensors)
        y = case.fn(*_substitute(args, where, tensors))
    program = tape.program(y, tensors)
    for prim, inputs, out, params in tape.records():      # every recorded op's shape rule agrees
        assert prim.shape(tuple(t.shape for t in inputs), params) == out.shape, f"{name}: {prim.name} shape rule"

    # njit forward == numpy: clear every computed value, replay, compare the target
    arena = program.arena.copy()
    for row in program.code:
        size = program.slots[row[oc.OUT], oc.SIZE]
        arena[row[oc.OUT_OFF]:row[oc.OUT_OFF] + size] = np.nan
    temps = new_temps(program.code, program.iattr, 1, program.dtype)
    forward_sweep(program.code, program.slots, program.iattr, program.fattr, arena, temps,
                  forward_kernels(program.code, program.slots, program.iattr, program.fattr, arena, temps))
    t = program.targets[0]
    off, size = program.slots[t, oc.OFFSET], program.slots[t, oc.SIZE]
    np.testing.assert_allclose(arena[off:off + size].reshape(expected.shape), expected, rtol=case.rtol, atol=1e-12,
                               err_msg=f"{name}: njit forward")

    # njit reverse == Python VJP == central differences
    compiled = tape.gradient(y, tensors, output_gradients=ct, unconnected_gradients="zero")
    with jt.GradientTape() as enclosing:         # a recording tape selects the Python VJP path
        enclosing.watch(tensors)
        recorded = tape.gradient(y, tensors, output_gradients=ct, unconnected_gradients="zero")
    numeric = _numerical_vjp(case, args, where, ct)
    for k, (c, r, n) in enumerate(zip(compiled, recorded, numeric)):
        np.testing.assert_allclose(np.asarray(c), np.asarray(r), rtol=max(case.rtol, 1e-9), atol=1e-12,
                                   err_msg=f"{name}: compiled vs Python VJP, input {k}")
        np.testing.assert_allclose(np.asarray(c), n, rtol=1e-5, atol=1e-6,
                                   err_msg=f"{name}: compiled vs finite differences, input {k}")

    # the same gradient over adjoint rows shared wherever slots are never live at once, bit for bit
    with _sharing_every_row():
        with jt.GradientTape() as fresh:
            fresh.watch(tensors)
            y_fresh = case.fn(*_substitute(args, where, tensors))
        shared = fresh.gradient(y_fresh, tensors, output_gradients=ct, unconnected_gradients="zero")
    for k, (s, c) in enumerate(zip(shared, compiled)):
        np.testing.assert_array_equal(np.asarray(s), np.asarray(c), err_msg=f"{name}: shared adjoint rows, input {k}")

    # float32 in, float32 out, on both paths
    tensors32 = [jt.constant(a.astype(np.float32)) for a in arrays]
    with jt.GradientTape() as tape32:
        tape32.watch(tensors32)
        y32 = case.fn(*_substitute(args, where, tensors32))
    if not case.keeps_dtype:
        return set(program.code[:, oc.OP].tolist())
    assert y32.dtype == np.float32, f"{name}: float32 inputs gave {y32.dtype}"
    grads32 = tape32.gradient(y32, tensors32, output_gradients=ct.astype(np.float32), unconnected_gradients="zero")
    for g32, c in zip(grads32, compiled):
        assert g32.dtype == np.float32
        np.testing.assert_allclose(np.asarray(g32), np.asarray(c), rtol=2e-3, atol=2e-3,
                                   err_msg=f"{name}: float32 gradient")
    return set(program.code[:, oc.OP].tolist())


@pytest.mark.parametrize("name", OPS)
def test_op(name):
    if name not in CASES:
        pytest.fail(f"{name} is registered without a test case")

    @settings(max_examples=12, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large])
    @given(CASES[name].inputs)
    def run(args):
        seen.update(_check(name, args))

    seen = set()
    run()
    for args in EMPTY.get(name, ()):
        seen.update(_check(name, args))
    if name in PRIMITIVES:
        assert PRIMITIVES[name].opcode in seen, f"{name}: no example lowered to its opcode"


# Each non-differentiable op: a call on the watched 2-D float x and its numpy reference (value and dtype).
NON_DIFFERENTIABLE_CASES = {
    "round": (jt.round, np.round),
    "stop_gradient": (jt.stop_gradient, lambda x: x),
    **{name: (lambda x, name=name: getattr(jt, name)(x, 0.0), lambda x, name=name: getattr(np, name)(x, 0.0))
       for name in ("equal", "not_equal", "less", "less_equal", "greater", "greater_equal")},
    "argmax": (lambda x: jt.argmax(x, axis=1), lambda x: np.argmax(x, 1).astype(np.int64)),
    "argmin": (lambda x: jt.argmin(x, output_type=jt.int32), lambda x: np.argmin(x, 0).astype(np.int32)),
    "argsort": (lambda x: jt.argsort(x, direction="DESCENDING"),
                lambda x: np.argsort(-x, axis=-1, kind="stable").astype(np.int32)),
    "reduce_any": (lambda x: jt.reduce_any(x > 1.0, axis=1), lambda x: np.any(x > 1.0, axis=1)),
    "reduce_all": (lambda x: jt.reduce_all(x, keepdims=True), lambda x: np.all(x != 0, keepdims=True)),
    # on_value derived from x: the one-hot result is still a constant
    "one_hot": (lambda x: jt.one_hot([0, 2, 7], 4, on_value=x[0, 0], off_value=-1.0),
                lambda x: np.where(np.arange(4) == np.array([0, 2, 7])[:, None], x[0, 0], -1.0).astype(np.float32)),
}


@pytest.mark.parametrize("name", sorted(NON_DIFFERENTIABLE))
def test_non_differentiable_ops_are_not_recorded(name):
    assert name in NON_DIFFERENTIABLE_CASES, f"{name} is registered without a NON_DIFFERENTIABLE_CASES entry"
    call, reference = NON_DIFFERENTIABLE_CASES[name]
    values = np.array([[0.4, 1.6, -2.5], [0.0, 3.0, 0.4]], np.float32)
    x = jt.constant(values)
    with jt.GradientTape() as tape:
        tape.watch(x)
        y = call(x)
    expected = np.asarray(reference(values))
    np.testing.assert_array_equal(np.asarray(y), expected)
    assert y.dtype == expected.dtype, f"{name}: dtype {y.dtype}, expected {expected.dtype}"
    assert tape.gradient(y, x) is None


def _nested_scalar(case, args, where, tensors, ct, directions, order):
    """s_0 = <f(x), ct>; s_k = sum_i <d s_(k-1) / d x_i, u_i>: each level one more tape around the last."""
    if order == 0:
        return jt.reduce_sum(case.fn(*_substitute(args, where, tensors)) * ct)
    with jt.GradientTape() as tape:
        tape.watch(tensors)
        inner = _nested_scalar(case, args, where, tensors, ct, directions, order - 1)
    grads = tape.gradient(inner, tensors, unconnected_gradients="zero")
    return sum(jt.reduce_sum(g * u) for g, u in zip(grads, directions))


def _directional(case, args, where, arrays, ct, directions, v, order):
    """<grad s_order, v> from nested tapes, and the central difference of s_order along v."""
    tensors = [jt.constant(a) for a in arrays]
    with jt.GradientTape() as tape:
        tape.watch(tensors)
        s = _nested_scalar(case, args, where, tensors, ct, directions, order)
    analytic = sum(float(np.sum(np.asarray(g) * vi))
                   for g, vi in zip(tape.gradient(s, tensors, unconnected_gradients="zero"), v))
    h = max(case.step, 1e-5)

    def at(t):
        shifted = [jt.constant(a + t * vi) for a, vi in zip(arrays, v)]
        return float(_nested_scalar(case, args, where, shifted, ct, directions, order))

    return analytic, (at(h) - at(-h)) / (2 * h)


@pytest.mark.parametrize("order", [1, 2])
@pytest.mark.parametrize("name", OPS)
def test_op_higher_order(name, order):
    """Second (order 1) and third (order 2) derivatives through nested tapes against central differences."""
    case = CASES[name]

    @settings(max_examples=4 if order == 1 else 2, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large])
    @given(case.inputs)
    def run(args):
        where = _flatten_args(args)
        arrays = [args[i] if j is None else args[i][j] for i, j in where]
        rng = np.random.default_rng(7)
        ct = rng.uniform(0.5, 1.5, np.shape(case.ref(*args)))
        directions = [rng.uniform(-1, 1, a.shape) for a in arrays]
        v = [rng.uniform(-1, 1, a.shape) for a in arrays]
        analytic, numeric = _directional(case, args, where, arrays, ct, directions, v, order)
        assert abs(analytic - numeric) <= 1e-4 * max(1.0, abs(numeric)), (name, order, analytic, numeric)

    run()


def _packed(case, args, where, shapes, z):
    """f(inputs) with every float input a reshaped window of the one vector z."""
    parts, start = [], 0
    for shape in shapes:
        size = int(np.prod(shape))
        parts.append(jt.reshape(z[start:start + size], shape))
        start += size
    return case.fn(*_substitute(args, where, parts))


def _packed_scalar(case, args, where, shapes, z, ct):
    return jt.reduce_sum(_packed(case, args, where, shapes, z) * ct)


@pytest.mark.parametrize("name", OPS)
def test_op_forward_mode_and_hessian(name):
    """Forward-mode Jacobian == reverse-mode Jacobian; compiled forward-over-reverse Hessian == recorded
    VJPs differentiated again == central differences of the gradient. All inputs are packed into one
    source, so cross terms are covered."""
    @settings(max_examples=4, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large])
    @given(CASES[name].inputs)
    def run(args):
        _check_forward_mode_and_hessian(name, args)

    run()
    for args in EMPTY.get(name, ()):
        _check_forward_mode_and_hessian(name, args)


def _check_forward_mode_and_hessian(name, args):
    case = CASES[name]
    where = _flatten_args(args)
    arrays = [args[i] if j is None else args[i][j] for i, j in where]
    shapes = [a.shape for a in arrays]
    z0 = np.concatenate([a.ravel() for a in arrays])
    rng = np.random.default_rng(11)
    ct = rng.uniform(0.5, 1.5, np.shape(case.ref(*args)))
    v = rng.uniform(-1, 1, z0.shape)
    z = jt.constant(z0)
    with jt.GradientTape(persistent=True) as tape:
        tape.watch(z)
        y = _packed(case, args, where, shapes, z)
        s = jt.reduce_sum(y * ct)
    # every op's tangent kernel: forward-mode Jacobian == reverse-mode Jacobian
    program = lowered(tape, [y], [z])
    (forward,), (reverse,) = (source_jacobians(program, y.size, [z], mode) for mode in ("forward", "reverse"))
    np.testing.assert_allclose(forward, reverse, rtol=1e-10, atol=1e-12, err_msg=f"{name}: forward vs reverse")
    with _sharing_every_row():      # both sweeps over adjoint rows shared wherever slots are never live at once
        with jt.GradientTape() as fresh:
            fresh.watch(z)
            y_fresh = _packed(case, args, where, shapes, z)
        shared = lowered(fresh, [y_fresh], [z], READS_FIRST_ORDER)
        for mode, owned in (("forward", forward), ("reverse", reverse)):
            (found,) = source_jacobians(shared, y.size, [z], mode)
            np.testing.assert_array_equal(found, owned, err_msg=f"{name}: {mode} Jacobian over shared rows")
    compiled = tape.hessian(s, z)
    hv = tape.hessian_vector_product(s, z, v)
    with jt.GradientTape() as enclosing:      # a tape recording what the Hessian reads selects the recorded path
        enclosing.watch(z)
        recorded = tape.hessian(s, z)
    if compiled is None:
        assert recorded is None
        return
    np.testing.assert_allclose(compiled.numpy(), recorded.numpy(), rtol=1e-9, atol=1e-10,
                               err_msg=f"{name}: compiled vs recorded Hessian")
    np.testing.assert_allclose(hv.numpy(), compiled.numpy() @ v, rtol=1e-9, atol=1e-10,
                               err_msg=f"{name}: hessian_vector_product vs hessian @ v")
    h = max(case.step, 1e-5)

    def gradient_at(t):
        zt = jt.constant(z0 + t * v)
        with jt.GradientTape() as g_tape:
            g_tape.watch(zt)
            value = _packed_scalar(case, args, where, shapes, zt, ct)
        return g_tape.gradient(value, zt, unconnected_gradients="zero").numpy()

    numeric = (gradient_at(h) - gradient_at(-h)) / (2 * h)
    np.testing.assert_allclose(hv.numpy(), numeric, rtol=1e-4, atol=1e-4,
                               err_msg=f"{name}: Hessian vs central differences of the gradient")


def _moved(case, args, where, arrays, rng):
    """Other values for the float inputs, of the same shapes and in the op's domain: the entries permuted
    (branches and masks flip), else scaled by a few percent (matrices that must stay invertible)."""
    expected = np.asarray(case.ref(*args))
    for candidate in ([rng.permutation(a.reshape(-1)).reshape(a.shape) + 1e-3 * rng.normal(size=a.shape)
                       for a in arrays],
                      [a * rng.uniform(0.97, 1.03, a.shape) for a in arrays]):
        try:
            with np.errstate(all="ignore"):
                moved = np.asarray(case.ref(*_substitute(args, where, candidate)))
        except (np.linalg.LinAlgError, ValueError):
            continue
        if np.all(np.isfinite(moved) >= np.isfinite(expected)):
            return candidate
    return arrays


def _check_replay(name, args, seed):
    case = CASES[name]
    where = _flatten_args(args)
    arrays = [args[i] if j is None else args[i][j] for i, j in where]
    if not arrays:
        return
    moved = _moved(case, args, where, arrays, np.random.default_rng(seed))
    ct = np.random.default_rng(1).uniform(0.5, 1.5, np.shape(case.ref(*args)))
    f = jt.function(lambda *ts: case.fn(*_substitute(args, where, list(ts))))
    scalar = lambda *ts: jt.reduce_sum(case.fn(*_substitute(args, where, list(ts))) * ct)     # noqa: E731
    value_and_grad = jt.value_and_grad(scalar, argnums=tuple(range(len(arrays))))
    jacobian, hessian = jt.jacobian(f, argnums=0), jt.hessian(scalar, argnums=0)
    for values in (arrays, moved, arrays):        # traced, replayed on new values, replayed on the first again
        tensors = [jt.constant(a) for a in values]
        with np.errstate(all="ignore"):
            reference = np.asarray(case.ref(*_substitute(args, where, values)))
        np.testing.assert_allclose(f(*tensors).numpy(), reference, rtol=max(case.rtol, 1e-9), atol=1e-12,
                                   err_msg=f"{name}: replayed value")
        with jt.GradientTape(persistent=True) as tape:
            tape.watch(tensors)
            y = case.fn(*_substitute(args, where, tensors))
            s = jt.reduce_sum(y * ct)
        value, grads = value_and_grad(*tensors)
        np.testing.assert_allclose(value.numpy(), s.numpy(), rtol=max(case.rtol, 1e-9), atol=1e-12,
                                   err_msg=f"{name}: value")
        for k, (g, e) in enumerate(zip(grads, tape.gradient(s, tensors, unconnected_gradients="zero"))):
            np.testing.assert_allclose(g.numpy(), e.numpy(), rtol=1e-8, atol=1e-10,
                                       err_msg=f"{name}: replayed gradient {k}")
        expected_jacobian = tape.jacobian(y, tensors[0], unconnected_gradients="zero")
        np.testing.assert_allclose(jacobian(*tensors).numpy(), expected_jacobian.numpy(), rtol=1e-8, atol=1e-10,
                                   err_msg=f"{name}: replayed Jacobian")
        expected_hessian = tape.hessian(s, tensors[0])
        if expected_hessian is not None:
            np.testing.assert_allclose(hessian(*tensors).numpy(), expected_hessian.numpy(), rtol=1e-7, atol=1e-9,
                                       err_msg=f"{name}: replayed Hessian")


@pytest.mark.parametrize("name", OPS)
def test_op_replays(name):
    """A jt.function of the op traced on one example equals eager on other values of the same shapes: its
    value (numpy), and the gradient, Jacobian and Hessian of its replay (the tape's)."""
    @settings(max_examples=3, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large])
    @given(CASES[name].inputs, st.integers(0, 2 ** 16))
    def run(args, seed):
        _check_replay(name, args, seed)

    run()


# the elementwise unary and binary cases (listed first in CASES): on 0-d arguments, replays run their rows from
# compact rows (jitape_kernels.layout.scalar_runs), a gradient step's with the flags its plan fixes
ELEMENTWISE = list(CASES)[:list(CASES).index("where")]


def _all_scalars(args):
    return all(np.ndim(a) == 0 for a in args if isinstance(a, np.ndarray))


@pytest.mark.parametrize("name", ELEMENTWISE)
def test_op_replays_on_scalars(name):
    @settings(max_examples=2, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large])
    @given(CASES[name].inputs.filter(_all_scalars), st.integers(0, 2 ** 16))
    def run(args, seed):
        _check_replay(name, args, seed)

    run()
