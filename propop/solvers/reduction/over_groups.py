"""Cyclic reduction over groups of blocks: residual blocks as single nodes (paper section 2).

Written for propop. A graph with skip connections is not block bi-diagonal, but
its blocks split into consecutive groups (:attr:`~propop.Blocks.groups`) coupled
only to neighbouring groups, for instance one group per residual block: over the
groups the system is block bi-diagonal, ``D_s x_s = c_s + G_s y_{s-1}``, with
``y_{s-1}`` the blocks of the previous group that group ``s`` reads. As for RNNs
(:mod:`.over_time`):

1. ``Y_s = D_s^{-1} [G_s | c_s]`` for every group and sample: block substitution
   over the group's own blocks (``within`` levels: its number of blocks; ``D_s`` is
   block triangular with diagonal blocks, about ``n_s^2 w`` flops a sample where an
   inverse took ``2 n_s^3``);
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

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ... import backend
from .chain import Counter
from .odd_even import depth
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
        self.own, self.DG = [], []  # per group: its own rows (_Own), D^{-1} G (r, rows, carried)
        for s, group in enumerate(groups):
            own, G = _group(system, group, edges[s], self.carried[s - 1] if s else {})
            self.own.append(own)
            self.DG.append(_within(xp, own, G, counter))
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
        for s, (own, rows) in enumerate(zip(self.own, self.rows)):
            Dc.append(_within(xp, own, xp.permute_dims(rhs[rows, :], (1, 0))[:, :, None],
                              counter)[..., 0])
            carried = self._carried_rows(xp, Dc[-1], s)
            g[s, :, : carried.shape[1]] = carried
        previous = self.across.previous(g, self.substitute, counter)
        x = xp.zeros((system.size, rhs.shape[1]), dtype=system.dtype, device=backend.device(rhs))
        for s, rows in enumerate(self.rows):
            x[rows, :] = xp.permute_dims(expand(self.DG[s], Dc[s],
                                                previous[s, :, : self.DG[s].shape[2]], counter),
                                         (1, 0))
        levels = depth(self.across.levels)
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


@dataclass
class _Own:
    """A group's own rows, ``D = diag(diagonal) - sum_e diag(s_e) M_e``, block by block.

    ``diagonal`` ``(r, rows)``; ``blocks`` in solve order (first to last for a lower
    system, last to first for an upper one), each ``(a, b, terms)``: its rows
    ``a:b`` of the group, and per coupling within the group ``(c, d, M, scale)``,
    the columns ``c:d`` it reads through ``M`` (shared) and ``scale`` ``(r, b - a)``
    (``None``: one).
    """

    diagonal: Any
    blocks: list


def _within(xp: Any, own: _Own, B: Any, counter: Counter) -> Any:
    """``D^{-1} B`` by block substitution over a group's blocks, every sample at once.

    ``B`` ``(r, rows, w)``. Each block's rows take its couplings' products with the
    blocks solved before, ``M`` shared by the samples (one product of ``M`` with all
    of them), then divide by the diagonal: no per-sample dense ``D``.
    """
    Y = xp.zeros(tuple(B.shape), dtype=B.dtype, device=backend.device(B))
    for a, b, terms in own.blocks:
        part = B[:, a:b, ...]
        for c, d, M, scale in terms:
            term = backend.over_time(M, Y[:, c:d, ...])  # M Y_s for every sample s at once
            part = part + (term if scale is None else scale[:, :, None] * term)
            counter.flops += 2 * B.shape[0] * (b - a) * (d - c) * B.shape[2]
        Y[:, a:b, ...] = part / own.diagonal[:, a:b, None]
    return Y


def _group(system: Any, group: tuple, edges: list, reads: dict) -> tuple[_Own, Any]:
    """``(own, G)`` of one group: its own rows (:class:`_Own`), ``G`` ``(r, rows, carried)``.

    ``G = -A[rows, reads]`` holds the couplings to the previous group's carried
    blocks ``reads`` (``{block: offset}``), per sample; ``edges`` are the couplings
    of the group's rows, each ``-diag(s) M`` in ``A``.
    """
    xp, B, r = system.backend.xp, system.blocks, system.nrhs
    rows, start = _span(system, group), system.offsets[min(group)]
    n, device = rows.stop - rows.start, backend.device(system.rhs)
    diagonal = xp.ones((r, n), dtype=system.dtype, device=device)
    G = xp.zeros((r, n, _width(reads, system)), dtype=system.dtype, device=device)
    place = {k: (system.offsets[k] - start, system.offsets[k + 1] - start) for k in group}
    terms: dict = {k: [] for k in group}
    for k in group:
        if B.diagonal[k] is not None:
            diagonal[:, place[k][0]: place[k][1]] = _per_sample(xp, B.diagonal[k], r)
    for e in edges:
        scale = None if e.scale is None else _per_sample(xp, e.scale, r)
        if e.col in place:  # kept as it is stored: sparse couplings multiply as sparse
            terms[e.row].append((*place[e.col], e.matrix, scale))
        elif e.col in reads:
            M = backend.astype(backend.dense(e.matrix), system.dtype)
            top, at = place[e.row][0], reads[e.col]
            G[:, top: top + M.shape[0], at: at + M.shape[1]] += (
                M if scale is None else scale[:, :, None] * M)
    order = sorted(group) if system.lower else sorted(group, reverse=True)
    return _Own(diagonal, [(*place[k], terms[k]) for k in order]), G


def _per_sample(xp: Any, a: Any, r: int) -> Any:
    """A scaling ``(n,)``, ``(n, 1)`` or ``(n, r)`` as ``(r, n)`` (broadcast where shared)."""
    a = a[:, None] if a.ndim == 1 else a
    return xp.broadcast_to(xp.permute_dims(a, (1, 0)), (r, a.shape[0]))
