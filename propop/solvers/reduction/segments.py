"""Solve inside, reduce across: the outer stages of every two-level reduction.

Written for propop. A system split into consecutive segments ``s = 0..m-1``,
each reading only a few *carried* entries ``y_{s-1}`` of the segment before it
(an RNN's time steps, end of paper section 3.1; a graph's residual groups,
section 2; the block rows of an MPI rank), is block bi-diagonal over the
segments: ``D_s x_s = c_s + G_s y_{s-1}``. With each segment's own solve

    ``Y_s = D_s^{-1} [G_s | c_s]``  (its last column ``D_s^{-1} c_s``)

the carried rows form the chain ``y_s = A_s y_{s-1} + g_s``, ``[A_s | g_s]``
those rows of ``Y_s``; it is solved by cyclic reduction over the segments
(:class:`Across`, or over MPI ranks by recursive doubling), and every segment
follows in one batched product, ``x_s = Y_s [y_{s-1}; 1]`` (:func:`expand`).
The inner solves differ (a reduction over layers, a dense solve per group, local
substitutions per rank); these stages are shared. A plan splits each in two:
``D_s^{-1} G_s``, ``A_s`` and the reduction of the ``A_s`` depend on the matrix
alone (a method's ``init``); ``D_s^{-1} c_s``, ``g_s`` and the rest on the
right-hand side.

Stacks put segments (or any batch) first: ``D^{-1} G`` ``(..., rows, w)`` for
``w`` carried entries, ``y`` ``(..., w)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from ... import backend
from .chain import Chain, Counter

__all__ = ["Across", "expand", "shifted"]


class Across:
    """The chain over the segments, ``y_s = A_s y_{s-1} + g_s``, its blocks reduced once.

    ``A`` is ``(m, r, w, w)`` in chain order (``A_0`` is never read: the first
    segment reads nothing); ``factor(chain, counter)`` is the matrix half of
    odd-even cyclic reduction, whose levels :meth:`previous` takes each ``g``
    through with ``substitute(levels, G, counter)``. ``scales`` ``(m, r | 1, w)``,
    if given, are the blocks' left scalings: ``A_s = diag(scales_s) A_s`` (a
    recurrence's slopes times its one matrix, ``A`` then a broadcast view of it).
    """

    def __init__(self, A: Any, factor: Callable, counter: Counter, names: Sequence[str],
                 scales: Any = None) -> None:
        self.levels = factor(Chain(scales, A[1:, ...], None, names, ()), counter)

    def solve(self, g: Any, substitute: Callable, counter: Counter) -> Any:
        """Every segment's carried entries ``y_s`` from ``g`` ``(m, r, w)``."""
        return substitute(self.levels, g, counter)

    def previous(self, g: Any, substitute: Callable, counter: Counter) -> Any:
        """What each segment reads, ``y_{s-1}`` (zero for the first), from ``g`` ``(m, r, w)``."""
        return shifted(self.solve(g, substitute, counter))


def shifted(y: Any) -> Any:
    """``y_{s-1}`` at every segment ``s`` of ``y`` ``(m, ...)``, zero at the first."""
    previous = backend.namespace(y).zeros_like(y)
    previous[1:, ...] = y[:-1, ...]
    return previous


def expand(DG: Any, Dc: Any, previous: Any, counter: Counter) -> Any:
    """``x = D^{-1} c + D^{-1} G y_prev``: ``DG`` ``(..., rows, w)``, ``Dc`` ``(..., rows)``."""
    counter.flops += 2 * math.prod(DG.shape)
    return Dc + (DG @ previous[..., None])[..., 0]
