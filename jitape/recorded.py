"""The recorded path: derivatives computed with the ops' Python VJPs over a tape's records, so that they are
themselves recorded by the tapes around them (higher order). Used when a recording tape tracks what a
derivative reads (GradientTape._must_record); the compiled sweeps (execute.py) serve every other call."""
from array import array

import numpy as np

from jitape_kernels import opcodes as oc
from jitape_kernels.cpu.batch import JUNCTION
from jitape_kernels.cpu.shape import leading_broadcast_block

from .execute import per_example_program
from .ops import add, concat, matmul, reduce_sum, reshape, stack
from .tensor import Tensor


def gradient(tape, targets, seeds, sources):
    """Reverse accumulation in Python over the records, with VJPs written in jitape ops."""
    records = tape.records()
    active = {s._id for s in sources}
    for prim, inputs, out, _ in records:
        if prim.differentiable:         # comparisons pass no derivative on
            for t in inputs:
                if t._id in active:
                    active.add(out._id)
                    break
    grads = {}
    for t, seed in zip(targets, seeds):
        if t._id in active:
            seed = seed if isinstance(seed, Tensor) else Tensor(seed)
            grads[t._id] = add(grads[t._id], seed) if t._id in grads else seed
    for prim, inputs, out, params in reversed(records):
        g = grads.get(out._id)
        if g is None:
            continue
        wants = tuple(t._id in active for t in inputs)
        for t, gi in zip(inputs, prim.vjp(g, out, inputs, params, wants)):
            if gi is not None and t._id in active:
                grads[t._id] = add(grads[t._id], gi) if t._id in grads else gi
    return [grads.get(s._id) for s in sources]


def jacobian(tape, target, sources):
    """One recorded VJP per target entry, stacked: the Jacobian is itself differentiable."""
    if target.size == 0:        # no rows to stack: a zero seed says which sources are connected
        found = gradient(tape, [target], [np.zeros(target.shape, target.dtype)], sources)
        return [None if g is None else Tensor(np.zeros(target.shape + s.shape, s.dtype))
                for s, g in zip(sources, found)]
    rows = []
    for i in range(target.size):
        seed = np.zeros(target.size, target.dtype)
        seed[i] = 1
        rows.append(gradient(tape, [target], [seed.reshape(target.shape)], sources))
    return [None if g is None else reshape(g, target.shape + s.shape) for s, g in zip(sources, _stacked(rows, sources))]


def _stacked(rows, sources):
    """Per source, its gradients of the passes in `rows` stacked (zeros where a pass did not reach it; None
    where none did)."""
    results = []
    for k, s in enumerate(sources):
        column = [r[k] for r in rows]
        if all(g is None for g in column):
            results.append(None)
            continue
        results.append(stack([Tensor(np.zeros_like(s._value)[()]) if g is None else g for g in column]))
    return results


def batch_jacobian(tape, target, source, shape):
    """One recorded VJP per target feature, its seed shared by the rows (rows are independent: checked),
    so B rows cost no more passes than one."""
    batch = target.shape[0]
    features = target.size // batch
    columns = []
    for f in range(features):
        seed = np.zeros((batch, features), target.dtype)
        seed[:, f] = 1
        (g,) = gradient(tape, [target], [seed.reshape(target.shape)], [source])
        if g is None:
            return None
        columns.append(reshape(g, (batch, 1, -1)))
    if not columns:
        return Tensor(np.zeros(shape, source.dtype))
    return reshape(concat(columns, axis=1), shape)


def per_example_gradients(tape, target, sources):
    """Per-example gradients with recorded VJPs, in passes that do not grow with B: one pass gives the
    row cotangents at the junctions where rows meet parameters (rows are independent, so row b's cotangent
    is example b's); each example's share there is a batched op; a parameter computed from a source by
    parameter-only ops adds the recorded Jacobian of that computation (its size in passes)."""
    planned = per_example_program(tape, target, sources)       # the compiled path's checks and plan
    if planned is None:
        return [None] * len(sources)
    program, (_, _, modes, _, _, _, layouts) = planned
    batch = target.shape[0]
    tensors = {tape._slot_of[t._id]: t for _, inputs, out, _ in tape.records() for t in (*inputs, out)
               if not t._is_variable}
    junctions = [r for r in range(len(program)) if modes[r] == JUNCTION]
    if any(program.code[r, oc.OUT] not in tensors for r in junctions):
        # a junction inside a jt.function call has no tensor of its own: one recorded pass per example
        return _per_example_by_passes(tape, target, sources)
    outs = [tensors[program.code[r, oc.OUT]] for r in junctions]
    cotangents = gradient(tape, [target], [np.ones(target.shape, target.dtype)], outs)
    owner = {int(s): i for i, src in enumerate(program.sources)
             for s in (src, *program.source_aliases[i].tolist()) if s >= 0}
    results = [None] * len(sources)
    for r, g in zip(junctions, cotangents):
        if g is None:
            continue
        param = int(program.code[r, oc.IN0 if program.code[r, oc.OP] == oc.TILE else oc.IN1])
        shares = _junction_shares(tape, program, r, g, tensors, layouts, batch)
        if param in owner:
            i = owner[param]
            share = reshape(shares, (batch,) + sources[i].shape)
            results[i] = share if results[i] is None else add(results[i], share)
            continue
        computed = tensors[param]
        for i, s in enumerate(sources):
            (jac,) = jacobian(tape, computed, [s])
            if jac is not None:
                share = reshape(matmul(shares, reshape(jac, (computed.size, s.size))), (batch,) + s.shape)
                results[i] = share if results[i] is None else add(results[i], share)
    return results


def _per_example_by_passes(tape, target, sources):
    rows = []
    for b in range(target.shape[0]):
        seed = np.zeros(target.shape, target.dtype)
        seed[b] = 1
        rows.append(gradient(tape, [target], [seed], sources))
    return _stacked(rows, sources)


def _junction_shares(tape, program, r, g, tensors, layouts, batch):
    """[B, parameter size]: each example's share of the parameter cotangent at junction r, whose output
    cotangent is g; recorded ops."""
    code, iattr = program.code, program.iattr
    a = code[r, oc.ATTR]
    if code[r, oc.OP] == oc.TILE:
        block = leading_broadcast_block(oc.TILE, iattr, a)
        return reduce_sum(reshape(g, (batch, -1, block)), axis=1)
    batch_a, batch_b, m, k, n = (int(v) for v in iattr[a:a + 5])
    x = tensors[code[r, oc.IN0]]
    if layouts[code[r, oc.IN0]] * batch != x.size or batch_b not in (1, batch_a):
        raise ValueError(f"per_example_gradients under a recording tape: instruction {r} of the program "
                         f"meets a parameter in a layout not supported on the recorded path:\n"
                         f"{program.instruction(r)}")
    if batch_b == 1:
        rows = batch_a * m // batch
        shares = matmul(reshape(x, (batch, rows, k)), reshape(g, (batch, rows, n)), transpose_a=True)
        return reshape(shares, (batch, k * n))
    blocks = matmul(reshape(x, (batch_a, m, k)), reshape(g, (batch_a, m, n)), transpose_a=True)
    example = np.arange(batch_a) // (batch_a // batch)
    mask = (example[None, :] == np.arange(batch)[:, None]).astype(g.dtype)[:, :, None]
    return reshape(reshape(blocks, (1, batch_a, k * n)) * mask, (batch, batch_a * k * n))


def recording_of_gradient(tape, target, source):
    """A persistent tape holding this tape's records plus the recorded gradient of target w.r.t. source.

    The forward values are unchanged, so the copy needs no replay: the VJP ops
    recorded on it connect to the forward tensors it already tracks.
    """
    copy = type(tape)(persistent=True, watch_accessed_variables=False)
    copy._records = tape._records[:]
    copy._rows = tape._rows[:]
    copy._slot_rows = tape._slot_rows[:]
    copy._iattr = bytearray(tape._iattr)
    copy._fattr = array("d", tape._fattr)
    copy._values = tape._values[:]
    copy._slot_of = dict(tape._slot_of)
    copy._tracked = set(tape._tracked)
    copy._variables = dict(tape._variables)
    copy._aliases = {k: v[:] for k, v in tape._aliases.items()}
    copy._push()
    try:
        (grad,) = gradient(tape, [target], [np.ones((), target.dtype)], [source])
    finally:
        copy._pop()
    return copy, grad
