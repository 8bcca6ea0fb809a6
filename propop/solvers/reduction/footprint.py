"""What a reduction will hold in memory, from shapes alone: the memory guard's estimates.

Cyclic reduction forms per-sample blocks (``r`` cores per pair where the batch
has its own scalings), so its memory grows as ``r l n^2`` and can exceed the
machine before the first level ends. The reductions' loops themselves
(:mod:`.odd_even`) are run here on shape-only arrays (:mod:`.shapes`), whose
operations hold and release their bytes in a :class:`~.chain.Counter` as NumPy
would allocate and free them, so no walk of those loops is kept in step by
hand; a run's effect is remembered per shape, as a training loop repeats one.
What surrounds the loops (building the chain, the stages of the reductions over
time and over groups) is still counted step by step below. The tests hold the
estimates to within 20% of ``tracemalloc``'s measured peak.
"""

from __future__ import annotations

import math
import functools
from typing import Any

import numpy as np

from ... import backend

from . import odd_even as loops
from . import shapes
from .chain import Chain, Counter
from .over_groups import read_by
from .over_time import WITHIN, Layout

__all__ = ["dense_cyclic_reduction", "time_cyclic_reduction", "groups", "explicit_matrix",
           "krylov_basis"]

_DTYPES = {4: np.float32, 8: np.float64}  # by item size, for the shape-only runs
# Python objects per block (lists of positions and views, index arrays): measured.
BOOKKEEPING = 160
ARRAY = 112  # a NumPy array object, without its data


def _chain(counter: Counter, system: Any, shared: bool) -> tuple[int, int, int]:
    """:meth:`Chain.of`: holds the chain's ``L``, ``C``, ``G``; returns ``(m, bl, columns)``."""
    m, n, r = system.nblocks, system.width, system.nrhs or 1
    item = backend.itemsize(system.dtype)
    counter.hold(BOOKKEEPING * m)
    per_sample = system.nrhs is not None and not system._scaled_once
    bl = r if per_sample and not shared else 1
    if len(set(system.sizes)) == 1:  # _stacked: whole-array steps
        c = r if per_sample else 1
        G = counter.hold(m * n * r * item)  # the rhs in chain order
        read_as_is = system.scale_stack is not None and system.lower and system.form == "scaled"
        S = 0 if read_as_is else counter.hold((m - 1) * n * c * item)  # scalings gathered
        if system.form == "paper":  # divided by the diagonals
            D = counter.hold(m * n * c * item)
            counter.hold(m * n * r * item)
            counter.release(G)
            counter.release(S + D)
            S = counter.hold((m - 1) * n * c * item)
        if bl == 1 and per_sample:  # the batch mean
            counter.passing((m - 1) * n * item)
        counter.hold(m * n * bl * item)  # L
        if system.coupling_stack is None:  # C gathered; a stack is read as it is
            counter.hold((m - 1) * n * n * item)
        counter.release(S)
        return m, bl, r
    rows = sum(2 * k * r * item for k in system.sizes)  # each row's L and G, divided
    counter.hold(rows)
    counter.hold(m * (bl + 1 + r) * n * item + m * n * n * item)  # L, C, G padded
    counter.passing(n * n * item)  # a sparse coupling densified
    counter.release(rows)
    return m, bl, r


def _chain_of(counter: Counter, m: int, n: int, bl: int, b0: int, item: int) -> Chain:
    """A shape-only chain of ``m`` positions (its bytes counted by the caller)."""
    dtype = _DTYPES[item]
    return Chain(shapes.array((m, bl, n), dtype, counter),
                 shapes.array((max(m - 1, 0), b0, n, n), dtype, counter), None, range(m), ())


def odd_even(counter: Counter, m: int, n: int, r: int, c: int, bl: int, b0: int,
             item: int) -> None:
    """:func:`.odd_even.factor` then :func:`.odd_even.substitute`, run on shapes.

    ``G`` has ``r`` samples of ``c`` columns, ``L`` ``bl`` scalings, ``C`` ``b0`` cores
    per position (the chain held already); everything but the solution released.
    """
    kept = factored(counter, m, n, bl, b0, item)
    substituted(counter, (m, n, bl, b0), (m, r, n) if c == 1 else (m, r, n, c), item)
    counter.release(kept)


def factored(counter: Counter, m: int, n: int, bl: int, b0: int, item: int) -> int:
    """:func:`.odd_even.factor` of an ``m``-position chain: returns its levels' bytes, held."""
    peak, kept = _factor_effect(m, n, bl, b0, item)
    _replay(counter, peak, kept)
    return kept


def substituted(counter: Counter, chain: tuple, shape: tuple, item: int) -> int:
    """:func:`.odd_even.substitute` of a ``shape`` right-hand side: the solution's bytes, held.

    ``chain = (m, n, bl, b0)`` names the chain whose levels the caller holds.
    """
    peak, left = _substitute_effect(*chain, shape, item)
    _replay(counter, peak, left)
    return left


def parallel(counter: Counter, m: int, n: int, r: int, bl: int, item: int) -> None:
    """:func:`.odd_even.parallel_factor` then ``parallel_substitute``, run on shapes."""
    _replay(counter, *_parallel(m, n, r, bl, item))


def _replay(counter: Counter, peak: int, left: int) -> None:
    """A run's effect on ``counter``: its peak above the start, the bytes it leaves held."""
    counter.peak_bytes = max(counter.peak_bytes, counter.live_bytes + peak)
    counter.hold(left)


@functools.lru_cache(maxsize=1024)
def _factor_effect(m: int, n: int, bl: int, b0: int, item: int) -> tuple[int, int]:
    """``(peak, kept)`` of :func:`.odd_even.factor` on shapes, run once per shape."""
    counter = Counter()
    levels = loops.factor(_chain_of(counter, m, n, bl, b0, item), counter,
                          shapes.namespace(counter))
    peak, kept = counter.peak_bytes, counter.live_bytes  # read while the levels are held
    del levels
    return peak, kept


@functools.lru_cache(maxsize=1024)
def _substitute_effect(m: int, n: int, bl: int, b0: int, shape: tuple, item: int
                       ) -> tuple[int, int]:
    """``(peak, left)`` of :func:`.odd_even.substitute` after the factor, once per shape."""
    counter = Counter()
    levels = loops.factor(_chain_of(counter, m, n, bl, b0, item), counter,
                          shapes.namespace(counter))
    start, counter.peak_bytes = counter.live_bytes, counter.live_bytes
    G = shapes.array(shape, _DTYPES[item], counter)  # the right-hand side, counted before
    X = loops.substitute(levels, G, counter, shapes.namespace(counter))
    return counter.peak_bytes - start, X.nbytes if X._owned else 0


@functools.lru_cache(maxsize=1024)
def _parallel(m: int, n: int, r: int, bl: int, item: int) -> tuple[int, int]:
    """``(peak, left)`` of :func:`parallel`, run once per shape."""
    counter = Counter()
    chain = _chain_of(counter, m, n, max(1, bl), 1, item)
    xp = shapes.namespace(counter)
    levels = loops.parallel_factor(chain, counter, xp)
    G = shapes.array((m, r, n), _DTYPES[item], counter)
    loops.parallel_substitute(levels, G, counter, xp)
    del chain, levels, G
    return counter.peak_bytes, counter.live_bytes


def dense_cyclic_reduction(system: Any, shared: bool, parallel_form: bool) -> int:
    """Peak bytes of ``cyclic-reduction`` (``parallel-cyclic-reduction``) on the dense chain."""
    counter = Counter()
    item = backend.itemsize(system.dtype)
    m, bl, r = _chain(counter, system, shared)
    n = system.width
    if parallel_form:
        parallel(counter, m, n, r, bl, item)
    else:
        odd_even(counter, m, n, r, 1, bl, 1, item)
    counter.passing(2 * system.size * r * item)  # the solution in the system's order
    return counter.peak_bytes


def time_cyclic_reduction(system: Any, within: str) -> int:
    """Peak bytes of the two-level reduction of an RNN system (:mod:`.over_time`).

    The plan's ``OverTime`` (the layers' chain with the couplings across steps,
    its levels, ``D^{-1} G`` and the chain over time), then one solve.
    """
    layout, counter = Layout(system), Counter()
    item, sizes, r = backend.itemsize(system.dtype), layout.sizes, layout.r
    tau, n, m, w = layout.tau, max(layout.sizes), layout.kept - layout.first, layout.width
    b = tau * r
    scaled = [k for k, s in enumerate(system.periodic_scales(len(sizes))) if s is not None]
    counter.hold(b * sum(sizes[k] for k in scaled) * item)  # periodic_scales (cached)
    if r > 1:  # the scalings as (tau r, h) copies
        counter.hold(b * sum(sizes[k] for k in scaled) * item)
    G = counter.hold(m * b * n * w * item)
    counter.hold(m * b * n * item + m * n * n * item)  # L, C
    counter.passing(b * n * n * item)  # s * U, a template scaled per sample
    inner = _inner(counter, within, m, n, b, item)
    DG = _inner_solve(counter, within, m, n, b, w, item)
    if DG:  # the chain keeps its blocks only (one position: D^{-1} G is G itself)
        counter.release(G)
    else:
        DG = G
    carried = counter.hold(b * w * w * item) if (len(layout.carried_layers) > 1 or any(
        sizes[k] < n for k in layout.carried_layers)) else 0
    counter.hold(tau * w * item)  # the unit scalings of the chain over time
    across = factored(counter, tau, w, 1, r, item)
    # a solve: the right-hand side per layer, the leading positions, the chain's column
    counter.hold(b * sum(sizes) * item if r > 1 else 0)
    leading = [k for k in layout.order[: layout.first] if k in layout.within]
    counter.hold(b * sum(sizes[k] for k in leading) * item)
    counter.hold(m * b * n * item)
    if layout.first:  # folded into the first reduced position's right-hand side
        counter.passing(2 * b * sizes[layout.order[layout.first]] * item)
    _inner_solve(counter, within, m, n, b, 1, item)
    counter.hold(b * w * item)  # g on the carried rows
    counter.release(substituted(counter, (tau, w, 1, r), (tau, r, w), item))
    counter.hold(2 * b * w * item)  # the previous step's values, in chain order
    parts = counter.hold(b * sum(sizes) * item)
    counter.passing(b * n * item)  # a layer's product with the previous step
    counter.hold(b * sum(sizes) * item)  # concatenated
    counter.release(parts + DG + carried + across + inner)
    counter.passing(b * sum(sizes) * item)  # in the system's layout
    return counter.peak_bytes


def _inner(counter: Counter, within: str, m: int, n: int, b: int, item: int) -> int:
    """The layers' levels (``within="cyclic-reduction"``): their bytes, held."""
    return factored(counter, m, n, b, 1, item) if within == WITHIN[0] else 0


def _inner_solve(counter: Counter, within: str, m: int, n: int, b: int, c: int, item: int
                 ) -> int:
    """``D^{-1}`` of a ``c``-column right-hand side over the layers: its bytes, held."""
    if within == WITHIN[0]:
        return substituted(counter, (m, n, b, 1), (m, b, n, c), item)
    return counter.hold(m * b * n * c * item)  # the sweep writes every position in place


def groups(system: Any) -> int:
    """Peak bytes of the reduction over groups (:mod:`.over_groups`).

    The explicit matrix of all samples (built once, kept on the operator), each
    group's inverse and ``D^{-1} G`` per sample, kept, the chain over the groups
    with per-sample blocks reduced; then a solve.
    """
    counter, item, r = Counter(), backend.itemsize(system.dtype), system.nrhs or 1
    groups = system.blocks.groups
    sizes = [sum(system.sizes[k] for k in group) for group in groups]
    carried = [sum(system.sizes[k] for k in read_by(system, groups, s))
               for s in range(len(groups))]
    before = [0] + carried[:-1]
    counter.hold(8 * (system.size + 2 * sum(carried)))  # every group's entries, as indices
    counter.hold(BOOKKEEPING * (system.nblocks + _couplings(system)[0]))  # the block view
    counter.hold(2 * ARRAY * system.nblocks)  # the canonical operator's scalings: stack, view
    counter.hold(len(groups) * (2 * r + 6) * ARRAY)  # the arrays kept per group and sample
    build = counter.hold(explicit_matrix(system))
    counter.release(build - 16 * _entries(system))  # the matrix is kept (64-bit indices)
    parts = 0
    for n, c in zip(sizes, before):  # each group: an inverse per sample, both kept stacked
        counter.passing(item * (3 * n * n + 2 * n * c) + 16 * n * max(c, n))
        new = counter.hold(r * n * (n + c) * item)
        counter.release(parts)  # the previous group's list of per-sample parts
        parts = new
        counter.hold(r * n * (n + c) * item)  # stacked
    counter.release(parts)
    n = max(1, max(carried))
    counter.hold(len(sizes) * (r * n * n + n) * item)  # the A over the groups, unit scalings
    kept = factored(counter, len(sizes), n, 1, r, item)
    held = counter.hold(r * (system.size + len(sizes) * n) * item)  # D^{-1} c and g
    counter.release(substituted(counter, (len(sizes), n, 1, r), (len(sizes), r, n), item))
    counter.passing(2 * system.size * r * item)
    counter.release(held + kept)
    return counter.peak_bytes


def _couplings(system: Any) -> tuple[int, int]:
    """How many couplings one sample has, and their stored entries (a stack not unrolled)."""
    if system.coupling_stack is not None:
        C = system.coupling_stack
        return C.shape[0], C.shape[0] * C.shape[-2] * C.shape[-1]
    return len(system._edges), sum(int(getattr(M, "nnz", math.prod(M.shape)))
                                   for _, _, M in system._edges)


def _entries(system: Any) -> int:
    """Stored entries of the explicit matrix of all samples."""
    return (system.size + _couplings(system)[1]) * (system.nrhs or 1)


def krylov_basis(system: Any, restart: int, columns: int | None = None) -> int:
    """Bytes of a GMRES cycle: ``restart + 1`` basis blocks and a few more of ``(N, r)``."""
    columns = system.nrhs or 1 if columns is None else columns
    return (restart + 6) * system.size * columns * backend.itemsize(system.dtype)


def explicit_matrix(system: Any) -> int:
    """Peak bytes of :attr:`TriangularSystem.csr` and SciPy's solve with it.

    Building the matrix makes ``(rows, cols, values)`` triplets for every sample,
    24 bytes an entry, twice (per sample, then concatenated); once it is built
    (cached on the operator), the solve copies it (12 bytes an entry) and works in
    the copy, about 21 bytes an entry in all.
    """
    if ("csr", system.nrhs) in system._views:  # built by an earlier solve of the operator
        return 21 * _entries(system) + 2 * system.size * (system.nrhs or 1) * 8  # measured
    arrays = (_couplings(system)[0] + system.nblocks) * (system.nrhs or 1)  # 3 per block, edge
    return (48 * _entries(system) + 2 * system.size * (system.nrhs or 1) * 8
            + 3 * ARRAY * arrays)
