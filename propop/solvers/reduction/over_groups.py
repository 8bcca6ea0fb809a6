"""Cyclic reduction over groups of blocks: residual blocks as single nodes (paper section 2).

Written for propop. A graph with skip connections is not block bi-diagonal, but
its blocks split into consecutive groups (:attr:`~propop.Blocks.groups`) coupled
only to neighbouring groups, for instance one group per residual block: over the
groups the system is block bi-diagonal, ``D_s x_s = c_s + G_s y_{s-1}``, with
``y_{s-1}`` the blocks of the previous group that group ``s`` reads. As for RNNs
(:mod:`.over_time`):

1. ``Y_s = D_s^{-1} [G_s | c_s]`` for every group and sample: a dense triangular
   solve of the group's own rows (``within`` levels: its number of blocks);
2. odd-even reduction of the chain ``y_s = A_s y_{s-1} + g_s`` over the groups,
   ``A_s`` the rows of ``D_s^{-1} G_s`` that the next group reads
   (``ceil(log2 groups)`` levels);
3. ``x_s = D_s^{-1} c_s + D_s^{-1} G_s y_{s-1}``.

Stages 2 and 3 are :mod:`.segments`', shared with the RNN's reduction over time.

The group matrices are dense and per sample, assembled from the blocks on the
system's own array namespace (no explicit sparse matrix): meant for narrow layers
and long chains of groups, like the reduction over time.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from ... import backend
from .chain import Counter
from .segments import Across, expand

__all__ = ["OverGroups"]


class OverGroups:
    """Cyclic reduction over :attr:`Blocks.groups` split as a plan: the matrix once, then rhs.

    Built on the system's canonical operator: every group's ``D_s^{-1}`` and
    ``D_s^{-1} G_s`` per sample (stage 1's dense solves), the ``A_s`` and their
    reduction over the groups (:class:`~.segments.Across`); :meth:`solve` takes a
    right-hand side through ``D_s^{-1} c_s``, the groups' levels and stage 3.
    """

    def __init__(self, system: Any, factor: Callable, substitute: Callable,
                 counter: Counter) -> None:
        xp, groups = system.backend.xp, system.blocks.groups
        self.substitute, self.offsets = substitute, system.offsets
        self.rows = [_span(system, group) for group in groups]  # each group's entries
        group_of = {k: s for s, group in enumerate(groups) for k in group}
        edges: list[list] = [[] for _ in groups]  # per group: the couplings of its rows
        for e in system.blocks.edges:
            edges[group_of[e.row]].append(e)
        # per group: the blocks the next group reads, each at its offset among them
        self.carried = [_place(system, sorted({e.col for e in edges[s + 1]
                                               if group_of[e.col] == s}))
                        for s in range(len(groups) - 1)] + [{}]
        self.inverse, self.DG = [], []  # per group: (r, rows, rows), (r, rows, carried-before)
        for s, group in enumerate(groups):
            D, G = _group(system, group, edges[s], self.carried[s - 1] if s else {})
            self.inverse.append(xp.linalg.inv(D))
            self.DG.append(self.inverse[-1] @ G)
            n = D.shape[1]
            counter.flops += D.shape[0] * (2 * n**3 + 2 * n * n * G.shape[2])
        self.n = max(1, max(_width(c, system) for c in self.carried))
        A = xp.zeros((len(groups), system.nrhs, self.n, self.n), dtype=system.dtype,
                     device=backend.device(self.DG[0]))
        for s, DG in enumerate(self.DG):
            A_s = self._carried_rows(xp, DG, s)
            A[s, :, : A_s.shape[1], : A_s.shape[2]] = A_s
        self.across = Across(A, factor, counter, [f"group {s}" for s in range(len(groups))])
        self.within = max(len(group) for group in groups)

    def _carried_rows(self, xp: Any, Y: Any, s: int) -> Any:
        """The rows of group ``s``'s ``Y`` ``(r, rows, ...)`` that the next group reads."""
        start = self.rows[s].start
        parts = [Y[:, self.offsets[k] - start: self.offsets[k + 1] - start, ...]
                 for k in self.carried[s]]
        if not parts:
            return Y[:, :0, ...]
        return parts[0] if len(parts) == 1 else xp.concat(parts, axis=1)

    def solve(self, system: Any, counter: Counter) -> tuple[Any, int, dict]:
        """``(x, levels, info)`` for ``system``'s right-hand side (canonical, ``(N, r)``)."""
        xp, rhs = system.backend.xp, system.rhs
        Dc = []  # per group: (r, rows)
        g = xp.zeros((len(self.rows), rhs.shape[1], self.n), dtype=system.dtype,
                     device=backend.device(rhs))
        for s, (inverse, rows) in enumerate(zip(self.inverse, self.rows)):
            Dc.append((inverse @ xp.permute_dims(rhs[rows, :], (1, 0))[:, :, None])[..., 0])
            counter.flops += 2 * math.prod(inverse.shape)
            carried = self._carried_rows(xp, Dc[-1], s)
            g[s, :, : carried.shape[1]] = carried
        previous = self.across.previous(g, self.substitute, counter)
        x = xp.zeros((system.size, rhs.shape[1]), dtype=system.dtype, device=backend.device(rhs))
        for s, rows in enumerate(self.rows):
            x[rows, :] = xp.permute_dims(expand(self.DG[s], Dc[s],
                                                previous[s, :, : self.DG[s].shape[2]], counter),
                                         (1, 0))
        levels = len(self.across.levels)
        info = {"levels": {"within": self.within, "groups": levels}, "groups": len(self.rows)}
        return x, self.within + levels, info


def _span(system: Any, blocks: tuple) -> slice:
    """The entries of consecutive ``blocks`` in the stacked vector."""
    return slice(system.offsets[min(blocks)], system.offsets[max(blocks) + 1])


def _place(system: Any, blocks: list) -> dict:
    """Each of ``blocks`` (sorted) at its offset among them: ``{block: offset}``."""
    place, offset = {}, 0
    for k in blocks:
        place[k], offset = offset, offset + system.sizes[k]
    return place


def _width(place: dict, system: Any) -> int:
    return sum(system.sizes[k] for k in place)


def _group(system: Any, group: tuple, edges: list, reads: dict) -> tuple[Any, Any]:
    """``(D, G)`` of one group for every sample: ``(r, rows, rows)``, ``(r, rows, carried)``.

    ``D`` holds the group's diagonal and its couplings within, ``G = -A[rows,
    reads]`` those to the previous group's carried blocks ``reads`` (``{block:
    offset}``); ``edges`` are the couplings of the group's rows, each ``-diag(s) M``
    in ``A``.
    """
    xp, B, r = system.backend.xp, system.blocks, system.nrhs
    rows, start = _span(system, group), system.offsets[min(group)]
    n, device = rows.stop - rows.start, backend.device(system.rhs)
    diagonal = xp.ones((r, n), dtype=system.dtype, device=device)
    for k in group:
        if B.diagonal[k] is not None:
            diagonal[:, system.offsets[k] - start: system.offsets[k + 1] - start] = \
                _per_sample(xp, B.diagonal[k], r)
    D = diagonal[:, :, None] * xp.eye(n, dtype=system.dtype, device=device)
    G = xp.zeros((r, n, _width(reads, system)), dtype=system.dtype, device=device)
    mine = set(group)
    for e in edges:
        into, at = (D, system.offsets[e.col] - start) if e.col in mine else (G, reads.get(e.col))
        if at is None:
            continue
        M = backend.astype(backend.dense(e.matrix), system.dtype)
        part = M if e.scale is None else _per_sample(xp, e.scale, r)[:, :, None] * M
        top = system.offsets[e.row] - start
        into[:, top: top + M.shape[0], at: at + M.shape[1]] += -part if into is D else part
    return D, G


def _per_sample(xp: Any, a: Any, r: int) -> Any:
    """A scaling ``(n,)``, ``(n, 1)`` or ``(n, r)`` as ``(r, n)`` (broadcast where shared)."""
    a = a[:, None] if a.ndim == 1 else a
    return xp.broadcast_to(xp.permute_dims(a, (1, 0)), (r, a.shape[0]))
