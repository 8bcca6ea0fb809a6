"""The layout of a block triangular system: its blocks, and which couplings join them.

Every system propop builds has one of three layouts, the segments its solvers
iterate (docs/architecture.md, "Kernels and layouts"):

- :class:`ChainLayout`, block bi-diagonal (eqs. forw_prop_sys, back_prop_sys):
  coupling ``j`` joins blocks ``j + 1`` and ``j``, read by block ``j + 1`` (lower)
  or block ``j`` (upper);
- :class:`TimeLayout`, ``tau`` steps of the same blocks (eqs. forw_prop_sys_rnn,
  back_prop_sys_rnn): template ``t`` couples layer ``row`` at step ``s`` to layer
  ``col`` at step ``s + offset`` through coupling ``t``, one matrix for every step;
- :class:`GraphLayout`, one coupling per edge (eqs. forw_prop_sys_jacobian,
  back_prop_sys_jacobian), any block triangular pattern.

A layout holds no array. Its edges name their couplings by index into the
operator's couplings (:mod:`.coefficients`), so one matrix serves many edges (an
RNN's template at every step) and a layout is unrolled, restricted or cut into
a sub-system without touching a coefficient.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["Layout", "ChainLayout", "TimeLayout", "GraphLayout", "NOT_A_CHAIN"]

NOT_A_CHAIN = ("this system is not block bi-diagonal (a chain): each block row must have at "
               "most one neighbour; use 'substitution', 'jacobi' or a Krylov method")


class Layout:
    """What every layout tells: blocks, edges ``(row, col, coupling)`` and their orders.

    Attributes
    ----------
    lower : bool
        Lower (edges read earlier blocks) or upper triangular.
    sizes : tuple of int
        The size of every block.
    """

    kind = "graph"
    lower: bool
    sizes: tuple

    @property
    def nblocks(self) -> int:
        """The number of blocks."""
        return len(self.sizes)

    @functools.cached_property
    def offsets(self) -> tuple[int, ...]:
        """Start of each block in the stacked vector, and ``N`` last.

        Made once a layout: the operators of one system, its scaled form and the
        plan's, share it.
        """
        sizes = self.sizes
        if sizes and self.equal_sizes:  # a range: 17 -> 5 us at 1025 blocks
            return tuple(range(0, sizes[0] * (len(sizes) + 1), sizes[0]))
        return tuple(itertools.accumulate(sizes, initial=0))

    @property
    def size(self) -> int:
        """``N``, the blocks' sizes summed: the last offset."""
        return self.offsets[-1]

    @functools.cached_property
    def padded_rows(self) -> np.ndarray:
        """Rows of every block padded to :attr:`width`, ``(nblocks width,)``; ``N`` pads.

        Taking them from a stack with a zero row appended lays the blocks out as one
        ``(nblocks, width, ...)`` array. A host array, made once a layout: the caller
        moves it beside the stack it indexes.
        """
        o = np.asarray(self.offsets)
        rows = np.full((self.nblocks, self.width), o[-1], dtype=np.int64)
        within = np.arange(self.width)
        taken = within[None, :] < np.diff(o)[:, None]
        rows[taken] = (o[:-1, None] + within[None, :])[taken]
        return rows.reshape(-1)

    @functools.cached_property
    def distinct_sizes(self) -> frozenset:
        """The sizes the blocks take (equal ones told by one count: 1 against 15 us at 1025)."""
        sizes = self.sizes
        if sizes and sizes.count(sizes[0]) == len(sizes):
            return frozenset(sizes[:1])
        return frozenset(sizes)

    @property
    def width(self) -> int:
        """The widest block's size."""
        return max(self.distinct_sizes)

    @property
    def equal_sizes(self) -> bool:
        """Whether every block has the same size."""
        return len(self.distinct_sizes) == 1

    def edges(self) -> tuple:
        """Every off-diagonal block as ``(row, col, coupling index)``, unrolled."""
        raise NotImplementedError

    def used(self) -> set[int]:
        """The couplings some edge reads."""
        return {c for _, _, c in self.edges()}

    def coupled(self) -> bool:
        """Whether some block reads another (a layout without is diagonal)."""
        return bool(self.used())

    def order(self) -> range:
        """Block rows in substitution order."""
        return range(self.nblocks) if self.lower else range(self.nblocks - 1, -1, -1)

    def unrolled(self) -> GraphLayout:
        """The same pattern as a :class:`GraphLayout` (itself if it is one)."""
        return GraphLayout(self.lower, self.sizes, self.edges())

    def check(self, shape: Callable[[int], tuple]) -> None:
        """Raise ``ValueError`` unless every coupling is strictly triangular and fits its blocks.

        ``shape(j)`` is the ``(rows, columns)`` of coupling ``j``.
        """
        kind = "lower" if self.lower else "upper"
        nb = self.nblocks
        for j, (row, col, c) in enumerate(self.edges()):
            if not (0 <= row < nb and 0 <= col < nb) or row == col or (row > col) != self.lower:
                raise ValueError(f"coupling {j} sits in block row {row}, column {col}: not "
                                 f"strictly {kind} triangular in {nb} blocks")
            want = (self.sizes[row], self.sizes[col])
            if tuple(shape(c)) != want:
                raise ValueError(f"coupling {j} (block row {row}, column {col}) has shape "
                                 f"{tuple(shape(c))}, expected {want}: the blocks' sizes")

    @functools.cached_property
    def into(self) -> dict[int, list[tuple[int, int]]]:
        """Per block row, the ``(column, coupling)`` of the edges it reads."""
        into: dict[int, list[tuple[int, int]]] = {}
        for row, col, c in self.edges():
            into.setdefault(row, []).append((col, c))
        return into

    @functools.cached_property
    def is_chain(self) -> bool:
        """Whether the pattern is block bi-diagonal with edges in chain order."""
        edges = self.edges()
        pair = (lambda j: (j + 1, j)) if self.lower else (lambda j: (j, j + 1))
        return len(edges) == self.nblocks - 1 and all(
            (row, col) == pair(j) for j, (row, col, _) in enumerate(edges))

    @functools.cached_property
    def levels(self) -> tuple[tuple[int, ...], ...]:
        """The blocks grouped by topological level, each level in substitution order.

        A block's level is one more than the highest level it reads from, so the
        blocks of one level depend only on earlier levels and can be solved at
        once; the number of levels is the longest chain of couplings.
        """
        depth: dict[int, int] = {}
        for k in self.order():
            depth[k] = 1 + max((depth[col] for col, _ in self.into.get(k, ())), default=0)
        grouped: dict[int, list[int]] = {}
        for k in self.order():
            grouped.setdefault(depth[k], []).append(k)
        return tuple(tuple(grouped[d]) for d in sorted(grouped))

    @functools.cached_property
    def groups(self) -> tuple[tuple[int, ...], ...]:
        """Consecutive groups of blocks (solve order) coupled only to neighbouring groups.

        The most groups such that every coupling joins blocks of one group or of
        two consecutive groups: then the system is block bi-diagonal over the
        groups (a residual block becomes one node) and cyclic reduction applies
        to it. Greedy: a group ends before block ``i`` unless some coupling into
        a block at or after ``i`` reads a block before the current group's start.
        """
        order = list(self.order())
        position = {k: i for i, k in enumerate(order)}
        first_read = [self.nblocks] * self.nblocks  # earliest block read at or after i
        for row, col, _ in self.edges():
            reader, read = sorted((position[row], position[col]), reverse=True)
            first_read[reader] = min(first_read[reader], read)
        for i in range(len(first_read) - 2, -1, -1):
            first_read[i] = min(first_read[i], first_read[i + 1])
        groups, start = [], 0
        for i in range(1, self.nblocks + 1):
            if i == self.nblocks or first_read[i] >= start:
                groups.append(tuple(order[start:i]))
                start = i
        return tuple(groups)

    def restricted(self, keep: Callable[[int, int], bool]) -> GraphLayout:
        """The pattern with only the edges ``(row, col)`` for which ``keep`` holds."""
        return GraphLayout(self.lower, self.sizes,
                           tuple(e for e in self.edges() if keep(e[0], e[1])))

    def subset(self, blocks: Sequence[int]) -> GraphLayout:
        """The pattern of ``blocks`` (sorted) alone, renumbered, edges among them only."""
        new = {k: i for i, k in enumerate(blocks)}
        return GraphLayout(self.lower, tuple(self.sizes[k] for k in blocks),
                           tuple((new[row], new[col], c) for row, col, c in self.edges()
                                 if row in new and col in new))


@dataclass(frozen=True, eq=False)
class ChainLayout(Layout):
    """Block bi-diagonal: coupling ``j`` joins blocks ``j + 1`` and ``j``."""

    lower: bool
    sizes: tuple

    kind = "chain"

    def pair(self, j: int) -> tuple[int, int]:
        """``(row, column)`` of coupling ``j``."""
        return (j + 1, j) if self.lower else (j, j + 1)

    def edges(self) -> tuple:
        """``(row, col, j)`` of coupling ``j`` for every ``j``."""
        return tuple(self.pair(j) + (j,) for j in range(self.nblocks - 1))

    def used(self) -> set[int]:
        """Every coupling: each joins two neighbours (no edge list made)."""
        return set(range(self.nblocks - 1))

    def coupled(self) -> bool:
        """Two blocks or more are coupled (no set of couplings made)."""
        return self.nblocks > 1

    def incoming(self, k: int) -> int | None:
        """The coupling block row ``k`` reads in substitution, if any."""
        j = k - 1 if self.lower else k
        return j if 0 <= j < self.nblocks - 1 else None

    @property
    def is_chain(self) -> bool:
        """A chain is one."""
        return True

    @property
    def equal_widths(self) -> bool:
        """Whether every block has the same size."""
        return len(set(self.sizes)) == 1


@dataclass(frozen=True)
class Template:
    """Layer ``row`` at step ``s`` reads coupling ``coupling`` of ``col`` at ``s + offset``."""

    row: int
    col: int
    offset: int
    coupling: int


@dataclass(frozen=True, eq=False)
class TimeLayout(Layout):
    """``tau`` steps of blocks ``step_sizes``, time-major: block ``s L + k`` is layer ``k``.

    ``templates`` couple the layers; coupling ``t.coupling`` serves every step.
    """

    lower: bool
    step_sizes: tuple
    tau: int
    templates: tuple

    kind = "time"

    @functools.cached_property
    def sizes(self) -> tuple:  # type: ignore[override]
        """The sizes of all blocks: a step's, repeated ``tau`` times."""
        return tuple(self.step_sizes) * self.tau

    @functools.cached_property
    def distinct_sizes(self) -> frozenset:
        """The sizes the blocks take: a step's layers'."""
        return frozenset(self.step_sizes)

    @property
    def size(self) -> int:
        """``N``: a step's sizes times ``tau``, without the offsets of every block."""
        return self.tau * sum(self.step_sizes)

    @property
    def per(self) -> int:
        """Blocks per step."""
        return len(self.step_sizes)

    def edges(self) -> tuple:
        """The edges of every step, time-major."""
        per = self.per
        return tuple((s * per + t.row, (s + t.offset) * per + t.col, t.coupling)
                     for s in range(self.tau) for t in self.templates
                     if 0 <= s + t.offset < self.tau)

    def used(self) -> set[int]:
        """The templates' couplings."""
        return {t.coupling for t in self.templates}

    def check(self, shape: Callable[[int], tuple]) -> None:
        """Every template strictly triangular and of its layers' shape (once per template)."""
        per, kind = self.per, "lower" if self.lower else "upper"
        for t in self.templates:
            ahead = t.offset < 0 or (t.offset == 0 and t.row > t.col)
            behind = t.offset > 0 or (t.offset == 0 and t.row < t.col)
            if not (0 <= t.row < per and 0 <= t.col < per and abs(t.offset) <= 1) or \
                    not (ahead if self.lower else behind):
                raise ValueError(f"template (layer {t.row} reads layer {t.col} at step "
                                 f"offset {t.offset}) is not strictly {kind} triangular")
            want = (self.step_sizes[t.row], self.step_sizes[t.col])
            if tuple(shape(t.coupling)) != want:
                raise ValueError(f"template (layer {t.row} reads layer {t.col}) has shape "
                                 f"{tuple(shape(t.coupling))}, expected {want}")

    @functools.cached_property
    def is_chain(self) -> bool:
        """Whether it is block bi-diagonal, told without unrolling where a template recurs."""
        if self.tau > 1 and any(t.offset != 0 for t in self.templates):
            return False
        return Layout.is_chain.func(self)

    @functools.cached_property
    def recurrent(self) -> tuple[int, int]:
        """``(first, last)``: the span of the recurrent layers in a step's solve order.

        The layers before ``first`` and from ``last`` on read only their own step.
        """
        order = self.step_order()
        involved = [i for i, k in enumerate(order)
                    if any(t.offset != 0 and k in (t.row, t.col) for t in self.templates)]
        return (involved[0], involved[-1] + 1) if involved else (len(order), len(order))

    def step_order(self) -> list[int]:
        """The layers of a step in substitution order."""
        return sorted(range(self.per), reverse=not self.lower)

    def within_steps(self) -> TimeLayout:
        """The layout of the diagonal blocks over time: the templates within a step only."""
        return TimeLayout(self.lower, self.step_sizes, self.tau,
                          tuple(t for t in self.templates if t.offset == 0))


@dataclass(frozen=True, eq=False)
class GraphLayout(Layout):
    """Any block triangular pattern: ``edges`` ``(row, col, coupling)``."""

    lower: bool
    sizes: tuple
    edge_list: tuple

    def edges(self) -> tuple:
        """The edges as given."""
        return self.edge_list

    def unrolled(self) -> GraphLayout:
        """Itself."""
        return self
