"""The executor: runs Programs on the current backend (jitape.backend): seeding the adjoint and tangent
buffers, the reverse, tangent and second-order sweeps, chunking K columns to the memory budget, unpacking
source results."""
import numpy as np

from jitape_kernels import opcodes as oc
from jitape_kernels.planning import READS_ANY_ORDER, READS_FIRST_ORDER

from . import backend, config, recycling
from .program import lower
from .recycling import workspace as _workspace
from .tensor import VIEWS_FROM, Tensor


def _arena(size, dtype):
    return _workspace.take("arena", size, dtype)


def _adjoint(program, K):
    """The [adjoint_size, K] adjoint buffer, uninitialised: the sweep initialises each slot's rows on their first
    write, and the seeds' rows are written before it (see reverse_sweep)."""
    return _workspace.take("adjoint", program.adjoint_size * K, program.dtype).reshape(program.adjoint_size, K)


def _sweep(program, adjoint, written, runner=None, complete=False):
    """One reverse sweep from the seeded slots marked in `written`. Afterwards the sources' rows hold their
    cotangents, zeros where the sweep never reached them; with `complete`, every active slot's rows do (only on
    Programs that own every row: a first-order Program's slots may share rows, planning.adjoint_layout)."""
    (runner or backend.current()).reverse(program, adjoint, written)
    if complete:
        for s in np.flatnonzero(~written & (program.adjoint_rows >= 0)).tolist():
            adjoint[program.adjoint_rows[s]:program.adjoint_rows[s] + program.slots[s, oc.SIZE]] = 0
        return adjoint
    for spans in _source_spans(program):
        for s, row, size in spans:
            if not written[s]:
                adjoint[row:row + size] = 0
    return adjoint


def reverse(program, seeds, runner=None, complete=False, out=None):
    """Adjoint buffer [adjoint_size, K] (`out`, or a workspace buffer) after one sweep on `runner` (default: the
    current backend); seeds[i] is target i's [size, K] cotangent block. The sources' rows hold their
    cotangents (every active slot's rows with `complete`)."""
    K = 1
    for seed in seeds:
        if seed is not None:
            K = seed.shape[1]
            break
    adjoint = _adjoint(program, K) if out is None else out
    written = np.zeros(program.slots.shape[0], np.bool_)
    for (slot, row), seed in zip(_target_rows(program), seeds):
        if row >= 0 and seed is not None:
            if written[slot]:       # a target listed twice: its seeds add up
                adjoint[row:row + seed.shape[0]] += seed
            else:
                adjoint[row:row + seed.shape[0]] = seed
                written[slot] = True
    return _sweep(program, adjoint, written, runner, complete)


def _target_rows(program):
    """Per target, (slot, adjoint row), the row -1 where the target is not recorded or not active: planned once
    per Program (its memo)."""
    rows = program.memo.get("target rows")
    if rows is None:
        rows = program.memo["target rows"] = [(slot, int(program.adjoint_rows[slot]) if slot >= 0 else -1)
                                              for slot in program.targets.tolist()]
    return rows


def unit_cotangents(program):
    """The complete adjoint [adjoint_size, 1] of the scalar target seeded with one. A Program that keeps its
    cotangents computes it once (in a buffer of its own) and serves every later gradient, HVP and Hessian."""
    kept = program.__dict__.get("cotangents")
    if kept is not None:
        return kept
    seed = [np.ones((1, 1), program.dtype)]
    if not program.keeps_cotangents:
        return reverse(program, seed, complete=True)
    out = recycling.take(program.adjoint_size, program.dtype).reshape(program.adjoint_size, 1)
    recycling.keep(program, out)
    program.cotangents = reverse(program, seed, complete=True, out=out)
    return program.cotangents


def _unit_seed(program, seeds):
    """Whether `seeds` is one scalar target's seed of one (the plain gradient of a loss)."""
    return (len(seeds) == 1 and program.targets[0] >= 0 and program.slots[program.targets[0], oc.SIZE] == 1
            and seeds[0] is not None and np.size(seeds[0]) == 1 and float(np.ravel(seeds[0])[0]) == 1.0)


def _seed_identity(block, batch, features, row, column, count):
    """In each of `batch` [features, k] parts of a zeroed [batch * features, k] block, set the
    identity's entries (row + i, column + i) for i < count."""
    k = block.shape[1]
    first = row * k + column
    block.reshape(batch, features * k)[:, first:first + (count - 1) * (k + 1) + 1:k + 1] = 1


def _identity_sweep(program, batch, features, start, k):
    """Adjoint buffer [adjoint_size, k] after one reverse sweep seeded with _seed_identity on the target (the
    sources' rows hold their cotangents)."""
    adjoint = _adjoint(program, k)
    written = np.zeros(program.slots.shape[0], np.bool_)
    row = program.adjoint_rows[program.targets[0]] if program.targets[0] >= 0 else -1
    if row >= 0:
        adjoint[row:row + batch * features] = 0
        _seed_identity(adjoint[row:row + batch * features], batch, features, start, 0, k)
        written[program.targets[0]] = True
    return _sweep(program, adjoint, written)


def _source_spans(program):
    """Per source, (slot, adjoint row, size) of it and of its earlier values (aliases), where active toward the
    target: planned once per Program (its memo)."""
    spans = program.memo.get("source spans")
    if spans is None:
        rows, sizes = program.adjoint_rows, program.slots[:, oc.SIZE]
        spans = program.memo["source spans"] = [
            [(s, int(rows[s]), int(sizes[s])) for s in (slot, *aliases.tolist()) if s >= 0 and rows[s] >= 0]
            for slot, aliases in zip(program.sources.tolist(), program.source_aliases)]
    return spans


def _source_slots(program, i):
    """Slots of source i and of its earlier values (aliases), where active toward the target."""
    return [s for s, _, _ in _source_spans(program)[i]]


def _source_rows(program, i):
    return [row for _, row, _ in _source_spans(program)[i]]


def _seed_source_rows(tangent, rows, batch, features, entry, column, count):
    """In each block of source rows (`batch` x `features` entries, one per adjoint row start in `rows`),
    already zeroed, set the identity's entries (entry + i, column + i) for i < count in each batch part."""
    if count > 0:
        for row in rows:
            _seed_identity(tangent[row:row + batch * features], batch, features, entry, column, count)


def _zero_source_rows(program, tangent):
    """Zero the tangent rows of every source (a source listed twice shares its rows: seed after this)."""
    for s in _seeded_slots(program).tolist():
        tangent[program.adjoint_rows[s]:program.adjoint_rows[s] + program.slots[s, oc.SIZE]] = 0


def _tangent_buffer(program, k):
    """The [adjoint_size, k] tangent buffer; only the source rows need seeding (see tangent_sweep)."""
    return _workspace.take("tangent", program.adjoint_size * k, program.dtype).reshape(-1, k)


def _seeded_slots(program):
    """The slots whose tangent rows hold seeds: the sources and their earlier values, where active."""
    slots = [s for i in range(len(program.sources)) for s in _source_slots(program, i)]
    return np.array(slots, np.int64)


def _tangent_sweep(program, tangent, seed_row=-1, seed_start=0, target=-1):
    backend.current().tangent(program, tangent, _seeded_slots(program), seed_row, seed_start, target)
    return tangent


def _target_row(program):
    t = program.targets[0]
    return program.adjoint_rows[t] if t >= 0 else -1


def source_blocks(program, adjoint):
    """Each source's [size, K] block of the adjoint (None when the source is inactive)."""
    blocks = []
    for spans in _source_spans(program):
        block = None
        for _, row, size in spans:
            part = adjoint[row:row + size]
            block = part if block is None else block + part
        blocks.append(block)
    return blocks


def lowered(tape, targets, sources, reads=READS_ANY_ORDER, sweeps=()):
    """The Program of a tape's derivative (a persistent tape's are kept: see program.lower) over a workspace
    arena holding the values read by the derivative rules that will run (`reads`, jitape_kernels.planning),
    large ones left where they live. sweeps: those its derivative runs first, compiled ahead where the cache
    lacks them (Backend.cold_start)."""
    if sweeps:
        backend.current().cold_start(tape._rows, tape._slot_rows, sweeps)
    return lower(tape, targets, sources, _arena, reads)


def _unit_blocks(program):
    """Every target's seed of ones as a [size, 1] block (None for a target the tape did not record): planned
    once per Program (its memo), and only read."""
    blocks = program.memo.get("unit blocks")
    if blocks is None:
        blocks = program.memo["unit blocks"] = [None if t < 0 else np.ones((int(program.slots[t, oc.SIZE]), 1),
                                                                            program.dtype)
                                                for t in program.targets.tolist()]
    return blocks


def source_gradients(program, seeds, sources):
    """tape.gradient's compiled path: one sweep with K = 1 over `program` (seeds: per target, None or its
    cotangent; None: every target's ones; sources: the tensors, for shapes and dtypes)."""
    blocks = _unit_blocks(program) if seeds is None else [
        None if s is None else np.asarray(s._value if isinstance(s, Tensor) else s).reshape(-1, 1) for s in seeds]
    kept = program.keeps_cotangents and _unit_seed(program, blocks)
    # gradients are views of the adjoint, not copies, where that pins at most LENT_PER_GRADIENT times their
    # entries: large ones read-only views of the workspace's (it is not reused while they live: _Workspace),
    # every one of a small adjoint of their own (np.empty costs less than the workspace's and a copy; theirs
    # alone, so writable as a copy would be); kept cotangents are copied
    lend = not kept and LENT_PER_GRADIENT * _source_entries(program) >= program.adjoint_size
    own = lend and program.adjoint_size < VIEWS_FROM
    if kept:
        adjoint = unit_cotangents(program)
    else:
        adjoint = reverse(program, blocks, out=np.empty((program.adjoint_size, 1), program.dtype) if own else None)
    grads = []
    for s, block in zip(sources, source_blocks(program, adjoint)):
        if block is None:
            grads.append(None)
        elif own and block.dtype == s.dtype and s.shape:       # (a scalar's value is a numpy scalar, not a view)
            grads.append(Tensor(block[:, 0].reshape(s.shape)))
        elif lend and block.size >= VIEWS_FROM and block.dtype == s.dtype:
            value = block[:, 0].reshape(s.shape)
            value.flags.writeable = False
            grads.append(Tensor(value))
        else:
            grads.append(Tensor(block[:, 0].astype(s.dtype).reshape(s.shape)[()]))
    return grads


LENT_PER_GRADIENT = 8


def _source_entries(program):
    """The sources' entries, in all: planned once per Program (its memo)."""
    entries = program.memo.get("source entries")
    if entries is None:
        entries = program.memo["source entries"] = sum(int(program.slots[s, oc.SIZE]) for s in program.sources.tolist()
                                                       if s >= 0)
    return entries


def _columns_per_sweep(program, n, buffers=1):
    """K for one sweep: all n columns unless the buffers (`buffers` of adjoint_size rows, and the seed)
    would pass jt.config.jacobian_memory_bytes."""
    per_column = (buffers * program.adjoint_size + program.slots[program.targets[0], oc.SIZE]) * program.dtype.itemsize
    return int(max(1, min(n, config.jacobian_memory_bytes // max(per_column, 1))))


def source_jacobians(program, n, sources, mode=None):
    """tape.jacobian's compiled path: [n (the target's size), source.size] per source (None if not
    connected).

    One sweep carries K columns at once: reverse mode with K = target.size, or
    forward mode (a tangent sweep) with K = the connected sources' total size
    when that is smaller (mode None; "forward" or "reverse" to choose). K is
    chunked only to stay under jt.config.jacobian_memory_bytes.
    """
    rows = [_source_rows(program, i) for i in range(len(sources))]
    columns = sum(s.size for s, r in zip(sources, rows) if r)
    target_row = _target_row(program)
    if target_row < 0:
        return [None] * len(sources)
    if n == 0 or columns == 0:      # connected, but a target or source without entries: empty Jacobians
        return [np.zeros((n, s.size), s.dtype) if r else None for s, r in zip(sources, rows)]
    if _forward_mode(mode, columns, n):
        return _forward_jacobians(program, target_row, n, sources, rows, columns)
    chunk = _columns_per_sweep(program, n)
    jacobians = [None] * len(sources)
    for start in range(0, n, chunk):
        k = min(chunk, n - start)
        adjoint = _identity_sweep(program, 1, n, start, k)
        for i, block in enumerate(source_blocks(program, adjoint)):
            if block is not None:
                if jacobians[i] is None:
                    jacobians[i] = np.empty((n, block.shape[0]), sources[i].dtype)
                jacobians[i][start:start + k] = block.T
    return jacobians


def _forward_mode(mode, columns, n):
    return mode == "forward" or (mode is None and columns < n)


def jacobian_sweeps(n, sources):
    """The sweeps source_jacobians (mode None) runs for an n-entry target, every source taken as connected, as
    Backend.cold_start names them."""
    if _forward_mode(None, sum(s.size for s in sources), n):
        return ("tangent",)
    return ("reverse",) if n == 1 else ("reverse columns",)


def one_reverse_sweep(program, n, sources):
    """Whether source_jacobians (mode None) takes the n-entry target's Jacobians in one reverse sweep of n
    columns, seeded with the identity."""
    columns = sum(s.size for i, s in enumerate(sources) if _source_slots(program, i))
    return n > 0 and columns > 0 and not _forward_mode(None, columns, n) and _columns_per_sweep(program, n) >= n


def _forward_jacobians(program, target_row, n, sources, rows, columns):
    """Forward mode: the connected sources' entries, stacked, are the tangent columns; the target's
    tangent rows are then the Jacobian's columns, [n, k] per sweep."""
    chunk = _columns_per_sweep(program, columns)
    jacobians = [np.empty((n, s.size), s.dtype) if r else None for s, r in zip(sources, rows)]
    seeded = [r for r in rows if r]
    seed_row = seeded[0][0] if len(seeded) == 1 and len(seeded[0]) == 1 else -1
    for start in range(0, columns, chunk):
        k = min(chunk, columns - start)
        tangent = _tangent_buffer(program, k)
        _zero_source_rows(program, tangent)
        spans = []
        offset = 0
        for s, source_rows in zip(sources, rows):
            # source entry p is column offset + p - start of this sweep when that lies in [0, k)
            p, c = max(0, start - offset), max(0, offset - start)
            count = min(start + k, offset + s.size) - max(start, offset) if source_rows else 0
            _seed_source_rows(tangent, source_rows, 1, s.size, p, c, count)
            spans.append((p, c, count))
            offset += s.size if source_rows else 0
        _tangent_sweep(program, tangent, seed_row, start, program.targets[0])
        for jacobian, (p, c, count) in zip(jacobians, spans):
            if count > 0:
                jacobian[:, p:p + count] = tangent[target_row:target_row + n, c:c + count]
    return jacobians


def source_hessian(program, n, directions=None, cotangents=None, out=None):
    """tape.hessian's compiled path, forward over reverse: [n (the source's size), K], the Hessian times each
    column of `directions` (the identity when None), or None when the target does not depend on the source.
    cotangents: the complete adjoint of the target seeded with one, where the caller swept it (else swept here);
    out: the [n, K] array to write the result into.

    One reverse sweep gives every cotangent; then per chunk of directions one
    tangent sweep and one second-order sweep (see jitape_kernels.cpu.tangents).
    """
    slots = _source_slots(program, 0)
    rows = [program.adjoint_rows[s] for s in slots]
    if not rows or _target_row(program) < 0:
        return None
    adjoint = unit_cotangents(program) if cotangents is None else cotangents
    total = n if directions is None else directions.shape[1]
    chunk = _columns_per_sweep(program, total, buffers=2)
    result = np.empty((n, total), program.dtype) if out is None else out
    for start in range(0, total, chunk):
        k = min(chunk, total - start)
        tangent = _tangent_buffer(program, k)
        if directions is None:
            _zero_source_rows(program, tangent)
            _seed_source_rows(tangent, rows, 1, n, start, 0, k)
        else:
            for row in rows:
                tangent[row:row + n] = directions[:, start:start + k]
        _tangent_sweep(program, tangent, rows[0] if directions is None and len(rows) == 1 else -1, start)
        adjoint_tangent = _workspace.take("adjoint_tangent", program.adjoint_size * k, program.dtype)
        adjoint_tangent = adjoint_tangent.reshape(program.adjoint_size, k)
        written = backend.current().second_order(program, adjoint, tangent, adjoint_tangent, _seeded_slots(program))
        for s in slots:
            if not written[s]:
                adjoint_tangent[program.adjoint_rows[s]:program.adjoint_rows[s] + n] = 0
        (block,) = source_blocks(program, adjoint_tangent)
        result[:, start:start + k] = block
    return result


def check_rows(program, batch, method):
    """Raise ValueError naming the first instruction that makes a batch row depend on another row."""
    bad = backend.current().row_mixing(program, batch, _seeded_slots(program))
    if bad >= 0:
        name = oc.NAMES[program.code[bad, oc.OP]]
        raise ValueError(f"{method}: instruction {bad} of the program mixes rows of the batch (op {name}):\n"
                         f"{program.instruction(bad)}\nrow b of the result would depend on other rows "
                         f"(e.g. batch statistics); use jacobian instead")


def source_batch_jacobian(tape, target, source):
    """tape.batch_jacobian's compiled path: [B, F, S], seeds shared by the batch rows: one reverse sweep
    with K = F target features, or one tangent sweep with K = S source features when S < F."""
    program = lower(tape, [target], [source], _arena, READS_FIRST_ORDER)
    batch = target.shape[0]
    check_rows(program, batch, "batch_jacobian")
    features, per_row = target.size // batch, source.size // batch
    rows, target_row = _source_rows(program, 0), _target_row(program)
    if not rows or target_row < 0:
        return None
    result = np.empty((batch, features, per_row), source.dtype)
    forward = per_row < features
    total = per_row if forward else features
    chunk = _columns_per_sweep(program, total)
    for start in range(0, total, chunk):
        k = min(chunk, total - start)
        if forward:
            tangent = _tangent_buffer(program, k)
            _zero_source_rows(program, tangent)
            _seed_source_rows(tangent, rows, batch, per_row, start, 0, k)
            _tangent_sweep(program, tangent, target=program.targets[0])
            result[:, :, start:start + k] = tangent[target_row:target_row + target.size].reshape(batch, features, k)
        else:
            (block,) = source_blocks(program, _identity_sweep(program, batch, features, start, k))
            result[:, start:start + k] = block.reshape(batch, -1, k).transpose(0, 2, 1)
    return result


def per_example_program(tape, target, sources):
    """The Program of per-example gradients and its per_example_plan; ValueError if rows mix or a junction
    is not supported, or if the target depends on no batch rows. None when the target is not recorded."""
    program = lower(tape, [target], sources, _arena, READS_FIRST_ORDER)
    batch = target.shape[0]
    plan = backend.current().per_example_plan(program, batch)
    bad, layouts = plan[0], plan[-1]
    if bad >= 0:
        name = oc.NAMES[program.code[bad, oc.OP]]
        raise ValueError(f"per_example_gradients: instruction {bad} of the program (op {name}) mixes rows of "
                         f"the batch, or meets a parameter in a way not supported per example:\n"
                         f"{program.instruction(bad)}\nuse jacobian of the per-example losses instead")
    t = program.targets[0]
    if t < 0 or program.adjoint_rows[t] < 0:
        return None
    if layouts[t] != target.size // batch:
        raise ValueError(f"per_example_gradients: the target of shape {target.shape} does not depend on "
                         f"batch data with {batch} rows (no input with that leading dimension reaches it)")
    return program, plan


def source_per_example_gradients(tape, target, sources):
    """tape.per_example_gradients' compiled path: [B, source.size] per source (None if inactive).

    One sweep: activations keep one cotangent column (row b is example b's), the
    parameters keep B columns, filled where rows meet parameters (see per_example_plan).
    """
    planned = per_example_program(tape, target, sources)
    if planned is None:
        return [None] * len(sources)
    program, (_, code, modes, n_row, n_param, local, layouts) = planned
    row_adjoint = np.zeros((n_row, 1), program.dtype)
    param_adjoint = np.zeros((n_param, target.shape[0]), program.dtype)
    t = program.targets[0]
    row_adjoint[local[t]:local[t] + target.size] = 1     # each example's loss, summed over its other axes
    backend.current().per_example(program, code, modes, layouts, row_adjoint, param_adjoint)
    grads = []
    for s, slot, aliases in zip(sources, program.sources, program.source_aliases):
        parts = [param_adjoint[local[k]:local[k] + s.size] for k in (slot, *aliases.tolist())
                 if k >= 0 and local[k] >= 0 and layouts[k] < 0]
        grads.append(sum(parts[1:], parts[0]).T.astype(s.dtype) if parts else None)
    return grads


def source_jvps(tape, targets, sources, tangents):
    """ForwardAccumulator.jvp's compiled path: each target's directional derivative along `tangents`
    (one [size] array per source) as an array, None where the target does not depend on the sources.

    One lowering and one tangent sweep with K = 1 over every instruction of the Program
    (it holds only the rows between the sources and the targets).
    """
    program = lower(tape, targets, sources, _arena, READS_FIRST_ORDER)
    rows = [program.adjoint_rows[t] if t >= 0 else -1 for t in program.targets]
    if all(r < 0 for r in rows):
        return [None] * len(targets)
    tangent = _tangent_buffer(program, 1)
    for i, v in enumerate(tangents):
        for row in _source_rows(program, i):
            tangent[row:row + v.size, 0] = v
    _tangent_sweep(program, tangent, target=-2)
    return [None if r < 0 else tangent[r:r + t.size, 0].astype(t.dtype).reshape(t.shape) for t, r in zip(targets, rows)]
