"""Odd-even reduction of a chain, split in two: the matrix's levels, then a right-hand side.

Written for propop. The one loop of each reduction of :mod:`.cyclic`, on the
padded :class:`~.chain.Chain` ``x_k = diag(L_k) C_k x_{k-1} + G_k`` and its
kernels :func:`~.chain.product` and :func:`~.chain.apply`, on any array namespace
``xp``: NumPy, CuPy, PyTorch's, or the shape-only arrays of :mod:`.shapes`, on
which the memory guard (:mod:`.footprint`) runs these same loops.

- :func:`factor` / :func:`substitute`: odd-even (work-efficient) cyclic
  reduction, eq. def_back_prop2_even's pairing: the cores of every level once,
  then each right-hand side down the levels and back up.
- :func:`parallel_factor` / :func:`parallel_substitute`: parallel cyclic
  reduction (eqs. forw_prop_sys_reordered, back_prop_sys_reordered).

A non-finite reduced core (a long product of Jacobians that overflowed) raises
:class:`ReductionOverflow`, naming the level and the blocks.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ... import backend
from .chain import Chain, Counter, apply, product

__all__ = ["ReductionOverflow", "factor", "substitute", "parallel_factor",
           "parallel_substitute"]


class ReductionOverflow(Exception):  # noqa: N818 (a failed solve's reason, reported)
    """A reduced block that is not finite: the reduction's solve is reported NONFINITE."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    @classmethod
    def between(cls, level: int, a: int, b: int) -> ReductionOverflow:
        """The error for the reduced block coupling blocks ``a`` and ``b`` at ``level``."""
        return cls(f"level {level}: the reduced block coupling blocks {a} and {b} is not "
                   "finite: a long product of Jacobians overflowed; use 'substitution' "
                   "(it multiplies vectors only) or float64")


def _check_finite(xp: Any, cores: Any, level: int, start: int, stride: int, span: int,
                  chain: Chain) -> None:
    """Raise :class:`ReductionOverflow` if a reduced core is not finite.

    Core ``i`` couples chain positions ``a = start + i stride`` and ``a - span``.
    """
    if cores.shape[0] == 0:
        return
    finite = xp.all(xp.reshape(xp.isfinite(cores), (cores.shape[0], -1)), axis=1)
    if bool(xp.all(finite)):
        return
    a = start + stride * int(np.argmin(backend.to_host(finite)))  # on the host: an error
    raise ReductionOverflow.between(level, chain.order[a], chain.order[a - span])


def factor(chain: Chain, counter: Counter, xp: Any) -> list[tuple]:
    """The matrix half of odd-even reduction: every level's blocks, right-hand sides aside.

    Level ``t`` keeps ``(L, C)`` of its chain, ``C`` the cores of positions
    ``1..m-1`` (position 0 has none), and reduces to the chain of the even
    positions, ``A_k A_{k-1}`` for even ``k`` (eq. def_back_prop2_even's pairing).
    """
    L, C = chain.L, chain.C
    levels: list[tuple] = []
    while C.shape[0] > 0:
        pairs = C.shape[0] // 2  # even positions 2..2 pairs, each with the one before
        levels.append((L, C))
        even, odd = slice(2, 2 * pairs + 1, 2), slice(1, 2 * pairs, 2)
        cores = product(L[even, ...], C[odd, ...], L[odd, ...], C[0: 2 * pairs - 1: 2, ...],
                        counter)
        _check_finite(xp, cores, len(levels), 2 ** len(levels), 2 ** len(levels),
                      2 ** len(levels), chain)
        L, C = xp.concat([L[:1, ...], L[even, ...]]), cores
    return levels


def substitute(levels: list[tuple], G: Any, counter: Counter, xp: Any) -> Any:
    """The right-hand-side half: reduce ``G`` level by level, then back-substitute.

    ``x_k = A_k x_{k-1} + G_k``: the even positions' right-hand sides gather
    their odd neighbours' going down, the odd unknowns follow from their even
    neighbours coming back up (one whole-level operation each way).
    """
    eliminated = []
    for L, C in levels:
        pairs = C.shape[0] // 2
        even, before = slice(2, 2 * pairs + 1, 2), slice(1, 2 * pairs, 2)
        rhs = apply(L[even, ...], C[before, ...], G[before, ...], counter, xp) + G[even, ...]
        eliminated.append(G[1::2, ...])
        G = xp.concat([G[:1, ...], rhs])
        del rhs
    X = G
    for (L, C), G_odd in zip(reversed(levels), reversed(eliminated)):
        full = xp.empty((X.shape[0] + G_odd.shape[0],) + tuple(X.shape[1:]), dtype=X.dtype,
                        device=backend.device(X))
        full[0::2, ...] = X
        full[1::2, ...] = apply(L[1::2, ...], C[0::2, ...], X[: G_odd.shape[0], ...], counter,
                                xp) + G_odd
        X = full
    return X


def parallel_factor(chain: Chain, counter: Counter, xp: Any) -> list[tuple]:
    """The matrix half of parallel cyclic reduction: the cores of every level.

    At level ``t`` (shift ``s = 2^(t-1)``) every position ``k >= s`` reads ``k - s``:
    ``x_k = A_k x_{k-s} + G_k``, the cores combining as ``A_k A_{k-s}`` for the next
    level. ``C[i]`` is the core of position ``first + i``; each level keeps
    ``(L, C, first)``.
    """
    L, C, first = chain.L, chain.C, 1
    m, shift, levels = chain.L.shape[0], 1, []
    while shift < m:
        levels.append((L, C, first))
        if 2 * shift < m:
            cores = product(L[2 * shift:, ...], C[2 * shift - first:, ...],
                            L[shift: m - shift, ...], C[shift - first: m - shift - first, ...],
                            counter)
            _check_finite(xp, cores, len(levels), 2 * shift, 1, 2 * shift, chain)
            C, first = cores, 2 * shift
        shift *= 2
    return levels


def parallel_substitute(levels: list[tuple], G: Any, counter: Counter, xp: Any) -> Any:
    """The right-hand-side half: ``G_k <- A_k G_{k-s} + G_k`` at every level, no way back."""
    m, shift = G.shape[0], 1
    for L, C, first in levels:
        rhs = apply(L[shift:, ...], C[shift - first:, ...], G[: m - shift, ...], counter,
                    xp) + G[shift:, ...]
        G = xp.concat([G[:shift, ...], rhs])
        del rhs
        shift *= 2
    return G
