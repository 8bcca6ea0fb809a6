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

from collections.abc import Callable
from typing import Any

from .chain import Counter
from .segments import Across, expand

__all__ = ["OverGroups", "read_by"]


class OverGroups:
    """Cyclic reduction over :attr:`Blocks.groups` split as a plan: the matrix once, then rhs.

    Built on the system's canonical operator: every group's ``D_s^{-1}`` and
    ``D_s^{-1} G_s`` per sample (stage 1's dense solves), the ``A_s`` and their
    reduction over the groups (:class:`~.segments.Across`); :meth:`solve` takes a
    right-hand side through ``D_s^{-1} c_s``, the groups' levels and stage 3.
    """

    def __init__(self, system: Any, factor: Callable, substitute: Callable,
                 counter: Counter) -> None:
        xp = system.backend.xp
        groups = system.blocks.groups
        self.system, self.substitute = system, substitute
        self.rows = [_entries(system, group) for group in groups]
        carried = [_entries(system, read_by(system, groups, s)) for s in range(len(groups))]
        A, r = system.csr, system.nrhs  # all samples, one matrix
        self.inverse, self.DG = [], []  # per group: (r, rows, rows), (r, rows, carried-before)
        for s, group_rows in enumerate(self.rows):
            reads = carried[s - 1] if s > 0 else xp.zeros(0, dtype=int)
            parts = [_group_solve(xp, A, i * system.size, group_rows, reads) for i in range(r)]
            self.inverse.append(xp.stack([p[0] for p in parts]))
            self.DG.append(xp.stack([p[1] for p in parts]))
            counter.flops += r * 2 * len(group_rows) ** 3 // 3 * (1 + len(reads))
        n = max(1, max(len(c) for c in carried))
        self.carried = [_positions(xp, rows, c) for rows, c in zip(self.rows, carried)]
        self.n = n
        stacked = xp.zeros((len(groups), r, n, n), dtype=system.dtype)
        for s, (DG, rows) in enumerate(zip(self.DG, self.carried)):
            A_s = DG[:, rows, :]
            stacked[s, :, : A_s.shape[1], : A_s.shape[2]] = A_s
        self.across = Across(stacked, factor, counter, [f"group {s}" for s in range(len(groups))])
        self.within = max(len(group) for group in groups)

    def solve(self, system: Any, counter: Counter) -> tuple[Any, int, dict]:
        """``(x, levels, info)`` for ``system``'s right-hand side (canonical, ``(N, r)``)."""
        xp = system.backend.xp
        rhs = system.rhs
        Dc = []  # per group: (r, rows)
        g = xp.zeros((len(self.rows), rhs.shape[1], self.n), dtype=system.dtype)
        for s, (inverse, rows) in enumerate(zip(self.inverse, self.rows)):
            Dc.append((inverse @ rhs[rows].T[:, :, None])[..., 0])
            counter.flops += 2 * inverse.size
            g[s, :, : len(self.carried[s])] = Dc[-1][:, self.carried[s]]
        previous = self.across.previous(g, self.substitute, counter)
        x = xp.zeros((system.size, rhs.shape[1]), dtype=system.dtype)
        for s, rows in enumerate(self.rows):
            x[rows] = expand(self.DG[s], Dc[s], previous[s, :, : self.DG[s].shape[2]],
                             counter).T
        levels = len(self.across.levels)
        info = {"levels": {"within": self.within, "groups": levels}, "groups": len(self.rows)}
        return x, self.within + levels, info


def _entries(system: Any, blocks: Any) -> Any:
    """The entries of ``blocks`` in the stacked vector, in block order."""
    xp = system.backend.xp
    parts = [xp.arange(system.offsets[k], system.offsets[k + 1]) for k in sorted(blocks)]
    return xp.concat(parts) if parts else xp.zeros(0, dtype=int)


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


def _group_solve(xp: Any, A: Any, offset: int, rows: Any, reads: Any) -> tuple[Any, Any]:
    """``(D^{-1}, D^{-1} G)`` of one sample: ``D`` its rows and columns, ``G = -A[rows, reads]``.

    ``A`` is the explicit matrix of all samples, sample ``i``'s rows and columns
    from ``offset = i N``. The group is small and unit triangular: its inverse is
    exact to rounding and makes each right-hand side one product.
    """
    mine = A[rows + offset]
    D = mine[:, rows + offset].toarray()
    G = -mine[:, reads + offset].toarray() if len(reads) else xp.zeros((len(rows), 0))
    inverse = xp.linalg.inv(D)
    return inverse, inverse @ G
