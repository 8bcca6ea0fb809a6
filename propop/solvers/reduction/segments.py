"""Solve inside, reduce across: the outer stages of every two-level reduction.

Written for propop. A system split into consecutive segments ``s = 0..m-1``,
each reading only a few *carried* entries ``y_{s-1}`` of the segment before it
(an RNN's time steps, end of paper section 3.1; a graph's residual groups,
section 2; the block rows of an MPI rank), is block bi-diagonal over the
segments: ``D_s x_s = c_s + G_s y_{s-1}``. With each segment's own solve

    ``Y_s = D_s^{-1} [G_s | c_s]``  (its last column ``D_s^{-1} c_s``)

the carried rows form the chain ``y_s = A_s y_{s-1} + g_s``, ``[A_s | g_s]``
those rows of ``Y_s`` (:func:`relation`); it is solved by cyclic reduction over
the segments (:func:`across`, or over MPI ranks by recursive doubling), and
every segment follows in one batched product, ``x_s = Y_s [y_{s-1}; 1]``
(:func:`expand`). The inner solves differ (a reduction over layers, a dense
solve per group, local substitutions per rank); these stages are shared.

Stacks put segments (or any batch) first: ``Y`` ``(..., rows, w + 1)`` for ``w``
carried entries, ``y`` ``(..., w)``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ... import backend
from .chain import Chain, Counter

__all__ = ["relation", "across", "expand"]


def relation(Y: Any, rows: Any) -> tuple[Any, Any]:
    """``(A, g)``: the carried ``rows`` of ``Y = [D^{-1} G | D^{-1} c]``."""
    carried = Y[..., rows, :]
    return carried[..., :-1], carried[..., -1]


def across(A: Any, g: Any, reduce: Callable, counter: Counter, names: Sequence[str]
           ) -> tuple[Any, int]:
    """The value each segment reads, ``y_{s-1}`` (zero for the first), and the levels.

    ``A`` is ``(m, r, w, w)`` and ``g`` ``(m, r, w)`` in chain order;
    ``reduce(chain, counter)`` is odd-even cyclic reduction returning ``(y, levels)``.
    ``A_0`` is never read: the first segment reads nothing.
    """
    xp = backend.namespace(g)
    ones = xp.ones((g.shape[0], 1, g.shape[2]), dtype=g.dtype)
    y, levels = reduce(Chain(ones, A[1:], g, names, ()), counter)
    previous = xp.zeros_like(y)
    previous[1:] = y[:-1]
    return previous, levels


def expand(Y: Any, previous: Any, counter: Counter) -> Any:
    """``x = D^{-1} c + D^{-1} G y_prev`` from ``Y`` ``(..., rows, w + 1)`` and ``(..., w)``."""
    w = Y.shape[-1] - 1
    counter.flops += 2 * Y[..., 0].size * w
    return Y[..., -1] + (Y[..., :-1] @ previous[..., None])[..., 0]
