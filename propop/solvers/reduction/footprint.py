"""What a reduction will hold in memory, from shapes alone: the memory guard's estimates.

Cyclic reduction forms per-sample blocks (``r`` cores per pair where the batch
has its own scalings), so its memory grows as ``r l n^2`` and can exceed the
machine before the first level ends. Each function here walks one algorithm of
:mod:`.cyclic_reduction`, :mod:`.chain` and :mod:`.time_reduction` step by step
without arrays: a :class:`~.chain.Counter` holds and releases the bytes each
step allocates and frees, in the algorithm's order, so its ``peak_bytes`` is the
peak the solve will reach (temporaries included). The tests hold these
estimates to within 20% of ``tracemalloc``'s measured peak; change an algorithm's
allocations and its walk here together.
"""

from __future__ import annotations

from typing import Any

from .chain import Counter
from .over_groups import read_by
from .over_time import WITHIN, Layout

__all__ = ["dense_cyclic_reduction", "time_cyclic_reduction", "groups", "explicit_matrix",
           "krylov_basis"]

# Python objects per block (lists of positions and views, index arrays): measured.
BOOKKEEPING = 160
ARRAY = 112  # a NumPy array object, without its data


def _chain(counter: Counter, system: Any, shared: bool) -> tuple[int, int, int]:
    """:meth:`Chain.of`: holds the chain's ``L``, ``C``, ``G``; returns ``(m, bl, columns)``."""
    m, n, r = system.nblocks, max(system.sizes), system.nrhs or 1
    item = system.dtype.itemsize
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


def _apply(counter: Counter, p: int, bc: int, r: int, n: int, c: int, item: int) -> int:
    """:func:`.chain.apply` then ``+ G``: holds the result, ``p r n c`` entries."""
    product = counter.hold(p * (max(bc, r) if c > 1 or bc > 1 else r) * n * c * item)
    out = counter.hold(p * r * n * c * item)  # (C X, scaled by L in place) + G
    counter.release(product)
    return out


def odd_even(counter: Counter, m: int, n: int, r: int, c: int, bl: int, b0: int,
             item: int) -> None:
    """``_factor`` then ``_substitute`` of :mod:`.cyclic` on a chain of ``m`` positions.

    ``G`` has ``r`` samples of ``c`` columns, ``L`` ``bl`` scalings, ``C`` ``b0`` cores
    per position (the chain held already); everything but the solution released.
    """
    levels, kept = odd_even_factor(counter, m, n, bl, b0, item)
    counter.release(odd_even_substitute(counter, levels, n, r, c, item))
    counter.release(kept)


def odd_even_factor(counter: Counter, m: int, n: int, bl: int, b0: int, item: int
                    ) -> tuple[list, int]:
    """``_factor``: every level's cores and scalings, kept; returns ``(levels, kept bytes)``."""
    M, bc, kept, levels = m, b0, 0, []
    while M > 1:
        p, b = (M - 1) // 2, max(bc, bl)
        left = counter.hold(p * b * n * n * item)  # C1 diag(L2)
        kept += counter.hold(p * b * n * n * item)  # (C1 diag(L2)) C2, kept
        counter.release(left)
        counter.passing(p * b * n * n)  # the finiteness mask
        kept += counter.hold((p + 1) * bl * n * item)  # the next L
        levels.append((M, bc))
        M, bc = p + 1, b
    return levels, kept


def odd_even_substitute(counter: Counter, levels: list, n: int, r: int, c: int, item: int
                        ) -> int:
    """``_substitute`` through ``levels``: returns the bytes of the solution it leaves held.

    Every level's right-hand sides are kept until the back-substitution.
    """
    kept = 0
    for M, bc in levels:  # the right-hand side, down
        p = (M - 1) // 2
        rhs = _apply(counter, p, bc, r, n, c, item)
        kept += counter.hold((p + 1) * r * n * c * item)  # the next G
        counter.release(rhs)
    X = 0
    for M, bc in reversed(levels):  # and back up
        full = counter.hold(M * r * n * c * item)
        counter.release(_apply(counter, M // 2, bc, r, n, c, item))
        counter.release(X)
        X = full
    counter.release(kept)
    return X


def parallel(counter: Counter, m: int, n: int, r: int, bl: int, item: int) -> None:
    """``_parallel_factor`` then ``_parallel_substitute`` of :mod:`.cyclic` (chain held).

    The factor keeps every level's cores; the substitution's right-hand sides
    replace each other level by level.
    """
    shift, kept, levels = 1, 0, []
    while shift < m:  # the factor
        levels.append((m - shift, kept > 0))
        if 2 * shift < m:
            b = max(1, bl)
            left = counter.hold((m - 2 * shift) * b * n * n * item)
            kept += counter.hold((m - 2 * shift) * b * n * n * item)
            counter.release(left)
            counter.passing((m - 2 * shift) * b * n * n)  # the finiteness mask
        shift *= 2
    G = 0
    for p, reduced in levels:  # the right-hand side
        rhs = _apply(counter, p, max(1, bl) if reduced else 1, r, n, 1, item)
        g_new = counter.hold(m * r * n * item)
        counter.release(rhs + G)
        G = g_new
    counter.release(G + kept)


def dense_cyclic_reduction(system: Any, shared: bool, parallel_form: bool) -> int:
    """Peak bytes of ``cyclic-reduction`` (``parallel-cyclic-reduction``) on the dense chain."""
    counter = Counter()
    item = system.dtype.itemsize
    m, bl, r = _chain(counter, system, shared)
    n = max(system.sizes)
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
    item, sizes, r = system.dtype.itemsize, layout.sizes, layout.r
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
    DG = _inner_solve(counter, inner, within, m, n, b, w, item)
    if DG:  # the chain keeps its blocks only (one position: D^{-1} G is G itself)
        counter.release(G)
    else:
        DG = G
    carried = counter.hold(b * w * w * item) if (len(layout.carried_layers) > 1 or any(
        sizes[k] < n for k in layout.carried_layers)) else 0
    counter.hold(tau * w * item)  # the unit scalings of the chain over time
    across, _ = odd_even_factor(counter, tau, w, 1, r, item)
    # a solve: the right-hand side per layer, the leading positions, the chain's column
    counter.hold(b * sum(sizes) * item if r > 1 else 0)
    leading = [k for k in layout.order[: layout.first] if k in layout.within]
    counter.hold(b * sum(sizes[k] for k in leading) * item)
    counter.hold(m * b * n * item)
    if layout.first:  # folded into the first reduced position's right-hand side
        counter.passing(2 * b * sizes[layout.order[layout.first]] * item)
    _inner_solve(counter, inner, within, m, n, b, 1, item)
    counter.hold(b * w * item)  # g on the carried rows
    counter.release(odd_even_substitute(counter, across, w, r, 1, item))
    counter.hold(2 * b * w * item)  # the previous step's values, in chain order
    parts = counter.hold(b * sum(sizes) * item)
    counter.passing(b * n * item)  # a layer's product with the previous step
    counter.hold(b * sum(sizes) * item)  # concatenated
    counter.release(parts + DG + carried)
    counter.passing(b * sum(sizes) * item)  # in the system's layout
    return counter.peak_bytes


def _inner(counter: Counter, within: str, m: int, n: int, b: int, item: int) -> list:
    """The layers' levels (``within="cyclic-reduction"``), kept; none for substitution."""
    return odd_even_factor(counter, m, n, b, 1, item)[0] if within == WITHIN[0] else []


def _inner_solve(counter: Counter, levels: list, within: str, m: int, n: int, b: int, c: int,
                 item: int) -> int:
    """``D^{-1}`` of a ``c``-column right-hand side over the layers: its bytes, held."""
    if within == WITHIN[0]:
        return odd_even_substitute(counter, levels, n, b, c, item)
    rows = counter.hold(m * b * n * c * item)  # _substitute: one product a position, stacked
    out = counter.hold(m * b * n * c * item)
    counter.release(rows)
    return out


def groups(system: Any) -> int:
    """Peak bytes of the reduction over groups (:mod:`.over_groups`).

    The explicit matrix of all samples (built once, kept on the operator), each
    group's inverse and ``D^{-1} G`` per sample, kept, the chain over the groups
    with per-sample blocks reduced; then a solve.
    """
    counter, item, r = Counter(), system.dtype.itemsize, system.nrhs or 1
    groups = system.blocks.groups
    sizes = [sum(system.sizes[k] for k in group) for group in groups]
    carried = [sum(system.sizes[k] for k in read_by(system, groups, s))
               for s in range(len(groups))]
    before = [0] + carried[:-1]
    counter.hold(8 * (system.size + 2 * sum(carried)))  # every group's entries, as indices
    counter.hold(BOOKKEEPING * (system.nblocks + _couplings(system)[0]))  # the block view
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
    levels, _ = odd_even_factor(counter, len(sizes), n, 1, r, item)
    held = counter.hold(r * (system.size + len(sizes) * n) * item)  # D^{-1} c and g
    counter.release(odd_even_substitute(counter, levels, n, r, 1, item))
    counter.passing(2 * system.size * r * item)
    counter.release(held)
    return counter.peak_bytes


def _couplings(system: Any) -> tuple[int, int]:
    """How many couplings one sample has, and their stored entries (a stack not unrolled)."""
    if system.coupling_stack is not None:
        C = system.coupling_stack
        return C.shape[0], C.shape[0] * C.shape[-2] * C.shape[-1]
    return len(system._edges), sum(int(getattr(M, "nnz", M.size)) for _, _, M in system._edges)


def _entries(system: Any) -> int:
    """Stored entries of the explicit matrix of all samples."""
    return (system.size + _couplings(system)[1]) * (system.nrhs or 1)


def krylov_basis(system: Any, restart: int, columns: int | None = None) -> int:
    """Bytes of a GMRES cycle: ``restart + 1`` basis blocks and a few more of ``(N, r)``."""
    columns = system.nrhs or 1 if columns is None else columns
    return (restart + 6) * system.size * columns * system.dtype.itemsize


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
