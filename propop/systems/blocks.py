"""The structured view of a system: its blocks, couplings, substitution steps and levels.

:class:`Blocks` is what structure-aware solvers read (:attr:`Operator.blocks`): block
sizes, the diagonal of the system's form, and one :class:`Edge` per off-diagonal
block ``-diag(scale) @ matrix``, one Python object per block, made only for the
methods that walk blocks one by one. Its structural facts (chain, groups,
levels, order) are its :mod:`.layout`'s.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from .. import backend
from .layout import NOT_A_CHAIN, Layout

__all__ = ["Blocks", "Edge", "Step", "NOT_A_CHAIN"]

def _sizes(sizes: Any) -> str:
    """Block sizes in a few characters: ``8`` if all equal, else their range."""
    low, high = min(sizes), max(sizes)
    return str(low) if low == high else f"{low}..{high}"


@dataclass(frozen=True)
class Edge:
    """One off-diagonal block ``-diag(scale) @ matrix`` in block ``row``, ``col``."""

    row: int
    col: int
    matrix: Any
    scale: Any


@dataclass(frozen=True)
class Blocks:
    """The structured view of a system, in its own form.

    Attributes
    ----------
    lower : bool
    sizes : tuple of int
        Block sizes ``n_0..n_{nb-1}``.
    diagonal : tuple
        Per block, ``None`` (identity) or the diagonal entries, ``(n_k,)`` or ``(n_k, r)``.
    edges : tuple of Edge
        The off-diagonal blocks, each ``-diag(scale) @ matrix`` with a matrix
        shared by all samples (dense, sparse) and the row's scaling.
    layout : Layout
        The pattern of the edges, in the same order.

    A system is a **chain** (block bi-diagonal, paper eqs. forw_prop_sys and
    back_prop_sys) when edge ``j`` joins blocks ``j + 1`` and ``j`` (lower) or
    ``j`` and ``j + 1`` (upper); then ``coupling[j]``, ``scale[j]`` and
    :meth:`pair` describe it, as cyclic reduction needs.
    """

    lower: bool
    sizes: tuple
    diagonal: tuple
    edges: tuple
    layout: Layout

    def __repr__(self) -> str:
        """One line: the shape of the structure, no arrays."""
        kind = "chain" if self.is_chain else f"{len(self.groups)} groups"
        return (f"Blocks({'lower' if self.lower else 'upper'}, {len(self.sizes)} blocks of "
                f"sizes {_sizes(self.sizes)}, {len(self.edges)} couplings, {kind})")

    @property
    def is_chain(self) -> bool:
        """Whether the system is block bi-diagonal with edges in chain order."""
        return self.layout.is_chain

    @property
    def groups(self) -> tuple[tuple[int, ...], ...]:
        """Groups of blocks coupled only to neighbouring groups (:attr:`Layout.groups`)."""
        return self.layout.groups

    def require_chain(self) -> None:
        """Raise ``ValueError`` unless the system is block bi-diagonal (a chain)."""
        if not self.is_chain:
            raise ValueError(NOT_A_CHAIN)

    @property
    def coupling(self) -> tuple:
        """Per pair of a chain, the shared matrix."""
        self.require_chain()
        return tuple(e.matrix for e in self.edges)

    @property
    def scale(self) -> tuple:
        """Per pair of a chain, ``None`` or the row scaling of the off-diagonal block."""
        self.require_chain()
        return tuple(e.scale for e in self.edges)

    def pair(self, j: int) -> tuple[int, int]:
        """``(row, column)`` of off-diagonal block ``j`` of a chain."""
        return (j + 1, j) if self.lower else (j, j + 1)

    def order(self) -> range:
        """Block rows in substitution order."""
        return self.layout.order()

    def incoming(self, k: int) -> int | None:
        """The coupling that block row ``k`` of a chain reads in substitution, if any."""
        self.require_chain()
        j = k - 1 if self.lower else k
        return j if 0 <= j < len(self.edges) else None

    @functools.cached_property
    def steps(self) -> tuple[Step, ...]:
        """Block rows in substitution order with everything a step needs, made once.

        The matrix alone: a solve with any right-hand side reuses them.
        """
        into: dict[int, list[Edge]] = {}
        for e in self.edges:
            into.setdefault(e.row, []).append(e)
        steps = []
        for k in self.order():
            edges = into.get(k, [])
            steps.append(Step(
                block=k,
                sources=tuple((e.col, e.matrix, backend.is_sparse(e.matrix)) for e in edges),
                scale=edges[0].scale if edges else None, diagonal=self.diagonal[k]))
        return tuple(steps)

    @functools.cached_property
    def levels(self) -> tuple[tuple[Step, ...], ...]:
        """The :attr:`steps` grouped by topological level (:attr:`Layout.levels`)."""
        step = {s.block: s for s in self.steps}
        return tuple(tuple(step[k] for k in level) for level in self.layout.levels)


@dataclass(frozen=True)
class Step:
    """One block row of a substitution: ``x_k = (c_k + s * sum_e M_e x_e) / d``."""

    block: int
    sources: tuple  # (column block, shared matrix, is sparse) per incoming edge
    scale: Any
    diagonal: Any


