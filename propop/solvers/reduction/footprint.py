"""What a reduction will hold in memory, from shapes alone: the memory guard's estimates.

Cyclic reduction forms per-sample blocks (``r`` cores per pair where the batch
has its own scalings), so its memory grows as ``r l n^2`` and can exceed the
machine before the first level ends. The reductions themselves run here on
shape-only arrays (:mod:`.shapes`), whose operations hold and release their
bytes in a :class:`~.chain.Counter` as NumPy would allocate and free them: the
plans of :mod:`.plans` (the chain, its levels, the two-level reduction of an RNN
system) and one solve, on the system's shape-only twin (:func:`reduction`), so no
walk of that code is kept in step by hand (the reduction over groups included);
a run's peak is remembered per shape, as a training loop repeats one. SciPy's own
solve with the explicit matrix and a GMRES basis are estimated from their
measured costs (:func:`explicit_matrix`, :func:`krylov_basis`). The tests hold
the estimates to within 20% of ``tracemalloc``'s measured peak.
"""

from __future__ import annotations

import math
import functools
import collections
from collections.abc import Callable
from typing import Any


from ... import backend

from . import odd_even as loops
from . import plans, shapes
from .chain import Chain, Counter

__all__ = ["dense_cyclic_reduction", "time_cyclic_reduction", "groups", "explicit_matrix",
           "krylov_basis"]



def _chain_of(counter: Counter, m: int, n: int, bl: int, b0: int, item: int) -> Chain:
    """A shape-only chain of ``m`` positions (its bytes counted by the caller)."""
    dtype = shapes.DTYPES[item]
    return Chain(shapes.array((m, bl, n), dtype, counter),
                 shapes.array((max(m - 1, 0), b0, n, n), dtype, counter), None, range(m), ())


def odd_even(counter: Counter, m: int, n: int, r: int, c: int, bl: int, b0: int,
             item: int) -> None:
    """:func:`.odd_even.factor` then :func:`.odd_even.substitute`, run on shapes.

    ``G`` has ``r`` samples of ``c`` columns, ``L`` ``bl`` scalings, ``C`` ``b0`` cores
    per position (the chain held already); everything but the solution released.
    Each half's effect is remembered per shape (the sparse reduction's dense rest).
    """
    peak, kept = _factor_effect(m, n, bl, b0, item)
    _replay(counter, peak, kept)
    shape = (m, r, n) if c == 1 else (m, r, n, c)
    _replay(counter, *_substitute_effect(m, n, bl, b0, shape, item))
    counter.release(kept)


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
    G = shapes.array(shape, shapes.DTYPES[item], counter)  # the right-hand side, counted before
    X = loops.substitute(levels, G, counter, shapes.namespace(counter))
    return counter.peak_bytes - start, X._owned


def reduction(prepare: Callable, system: Any, shared_diagonal: str | None = None,
              name: tuple = ()) -> int:
    """Peak bytes of a reduction's plan (:mod:`.plans`) on ``system`` and of one solve.

    ``prepare(system, shared_diagonal, counter)`` and the solve it returns run
    as they are, on the system's shape-only twin (:func:`.shapes.system`); then
    the solution's check against the true residual (``A x`` and its difference
    from the right-hand side, :func:`~propop.solvers.convergence.finish`; a time
    structure's products of a layer's steps one more array), the reduced levels
    still held, as a method's plan holds them.
    ``name`` tells ``prepare`` from other reductions: the peak is remembered per
    name and :func:`.shapes.signature` (equal signatures make equal twins), as
    a training loop solves systems of one shape again and again.
    """
    signature = shapes.signature(system)
    key = (name, shared_diagonal, hash(signature))  # hashed once: a long chain's is long
    seen = _PEAKS.get(key)
    if seen is not None and seen[0] == signature:
        _PEAKS.move_to_end(key)
        return seen[1]
    counter = Counter()
    with shapes.counting(counter):
        shaped = shapes.system(system, counter)
        solve = prepare(shaped, shared_diagonal, counter)  # a plan holds its levels ...
        x = solve(shaped, counter)[0]
        # ... through the check of its solution: A x and c - A x, and for a time structure
        # the product of a layer's steps beside them (2.5-3 x measured, 2 x for a chain)
        counter.passing((3 if system.structure is not None else 2) * x.nbytes)
        del solve
    _PEAKS[key] = (signature, counter.peak_bytes)
    _PEAKS.move_to_end(key)
    if len(_PEAKS) > _REMEMBERED:
        _PEAKS.popitem(last=False)
    return counter.peak_bytes


_PEAKS: collections.OrderedDict = collections.OrderedDict()  # (signature, peak), latest last
_REMEMBERED = 256


def dense_cyclic_reduction(system: Any, shared: bool, parallel_form: bool) -> int:
    """Peak bytes of ``cyclic-reduction`` (``parallel-cyclic-reduction``) on the dense chain."""
    halves = ((loops.parallel_factor, loops.parallel_substitute) if parallel_form
              else (loops.factor, loops.substitute))
    return reduction(plans.factored(*halves), system, "mean" if shared else None,
                     ("chain", parallel_form))


def time_cyclic_reduction(system: Any, within: str) -> int:
    """Peak bytes of the two-level reduction of an RNN system (:mod:`.over_time`)."""
    return reduction(plans.time_factored(within), system, name=("time", within))


def groups(system: Any) -> int:
    """Peak bytes of the reduction over groups (:mod:`.over_groups`)."""
    return reduction(plans.groups_factored, system, name=("groups",))


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
            + 3 * shapes.HEADER * arrays)
