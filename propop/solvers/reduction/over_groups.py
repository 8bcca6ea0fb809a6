"""Cyclic reduction over groups of blocks: residual blocks as single nodes (paper section 2).

Written for propop. A graph with skip connections is not block bi-diagonal, but
its blocks split into consecutive groups (:attr:`~propop.Blocks.groups`) coupled
only to neighbouring groups, for instance one group per residual block: over the
groups the system is block bi-diagonal, ``D_s x_s = c_s + G_s y_{s-1}``, with
``y_{s-1}`` the blocks of the previous group that group ``s`` reads. As for RNNs
(:mod:`.time_reduction`):

1. ``Y_s = D_s^{-1} [G_s | c_s]`` for every group and sample: a dense triangular
   solve of the group's own rows (``within`` levels: its number of blocks);
2. odd-even reduction of the chain ``y_s = A_s y_{s-1} + g_s`` over the groups,
   ``A_s`` the rows of ``D_s^{-1} G_s`` that the next group reads
   (``ceil(log2 groups)`` levels);
3. ``x_s = D_s^{-1} c_s + D_s^{-1} G_s y_{s-1}``.

Stages 2 and 3 are :mod:`.segments`', shared with the RNN's reduction over time.

The group matrices are dense and per sample: meant for narrow layers and few,
long chains of groups, like the reduction over time.
"""

from __future__ import annotations

from typing import Any

from .chain import Counter
from .segments import across, expand, relation

__all__ = ["reduce_over_groups", "read_by"]


def reduce_over_groups(system: Any, reduce: Any, counter: Counter) -> tuple[Any, int, dict]:
    """Solve ``system`` over its :attr:`Blocks.groups`; ``(x, levels, info)``."""
    system = system.scaled()
    xp = system.backend.xp
    groups = system.blocks.groups
    rows = [_entries(system, group) for group in groups]
    carried = [_entries(system, read_by(system, groups, s)) for s in range(len(groups))]
    A, rhs, r = system.csr, _stacked_rhs(system), system.nrhs or 1  # all samples, one matrix
    Y = []  # per group: (r, rows, carried-before + 1)
    for s, group_rows in enumerate(rows):
        reads = carried[s - 1] if s > 0 else xp.zeros(0, dtype=int)
        blocks = [_group_solve(xp, A, rhs, i * system.size, group_rows, reads)
                  for i in range(r)]
        Y.append(xp.stack(blocks))
        counter.flops += r * 2 * len(group_rows) ** 2 * (len(reads) + 1)
    n = max(1, max(len(c) for c in carried))
    m = len(groups)
    A = xp.zeros((m, r, n, n), dtype=system.dtype)
    g = xp.zeros((m, r, n), dtype=system.dtype)
    for s, Ys in enumerate(Y):
        A_s, g_s = relation(Ys, _positions(xp, rows[s], carried[s]))
        A[s, :, : A_s.shape[1], : A_s.shape[2]] = A_s
        g[s, :, : g_s.shape[1]] = g_s
    previous, levels = across(A, g, reduce, counter, [f"group {s}" for s in range(m)])
    x = xp.zeros((system.size, r), dtype=system.dtype)
    for s, Ys in enumerate(Y):
        x[rows[s]] = expand(Ys, previous[s, :, : Ys.shape[2] - 1], counter).T
    within = max(len(group) for group in groups)
    info = {"levels": {"within": within, "groups": levels}, "groups": len(groups)}
    return (x[:, 0] if system.nrhs is None else x), within + levels, info


def _entries(system: Any, blocks: Any) -> Any:
    """The entries of ``blocks`` in the stacked vector, in block order."""
    xp = system.backend.xp
    parts = [xp.arange(system.offsets[k], system.offsets[k + 1]) for k in sorted(blocks)]
    return xp.concatenate(parts) if parts else xp.zeros(0, dtype=int)


def read_by(system: Any, groups: tuple, s: int) -> list:
    """The blocks of group ``s`` that group ``s + 1`` reads."""
    if s + 1 == len(groups):
        return []
    mine, theirs = set(groups[s]), set(groups[s + 1])
    return sorted({e.col for e in system.blocks.edges if e.row in theirs and e.col in mine})


def _positions(xp: Any, rows: Any, wanted: Any) -> Any:
    """Where the entries ``wanted`` sit within ``rows``."""
    where = {int(v): i for i, v in enumerate(rows.tolist())}
    return xp.asarray([where[int(v)] for v in wanted.tolist()], dtype=int)


def _stacked_rhs(system: Any) -> Any:
    """The right-hand sides of all samples stacked as :attr:`TriangularSystem.csr` acts."""
    return system.rhs if system.nrhs is None else system.rhs.T.reshape(-1)


def _group_solve(xp: Any, A: Any, rhs: Any, offset: int, rows: Any, reads: Any) -> Any:
    """``D^{-1} [G | c]`` of one sample: ``D`` its rows and columns, ``G = -A[rows, reads]``.

    ``A`` is the explicit matrix of all samples, sample ``i``'s rows and columns
    from ``offset = i N``.
    """
    mine = A[rows + offset]
    D = mine[:, rows + offset].toarray()
    G = -mine[:, reads + offset].toarray() if len(reads) else xp.zeros((len(rows), 0))
    return xp.linalg.solve(D, xp.concatenate([G, rhs[rows + offset][:, None]], axis=1))
