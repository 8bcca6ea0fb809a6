"""The reductions of a chain, an RNN system and groups split in two: the matrix once, then each rhs.

Written for propop. ``prepare(system, shared_diagonal, counter)`` does a reduction's
work on the matrix (the chain, its reduced levels) and returns the solve of one
right-hand side, ``solve(s, counter) -> (x, levels, info)``, for any system ``s``
of the same operator. :mod:`.cyclic` wraps them in a method's ``init`` and
``compute``; the memory guard (:mod:`.footprint`) runs the same two on shape-only
arrays to know their peak before anything is allocated.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...systems.triangular import TriangularSystem
from ..options import OptionError
from . import odd_even
from .chain import Chain, Counter
from .over_groups import OverGroups
from .over_time import OverTime

__all__ = ["factored", "time_factored", "groups_factored", "standing", "DENSE_FILL_IN"]

# info["fill_in"] of a dense reduction: its reduced blocks are dense arrays, nothing followed.
DENSE_FILL_IN = ("not followed: the blocks were reduced as dense arrays; sparse=True follows "
                 "the non-zeros of each level")


def factored(factor: Callable, substitute: Callable, diagonal: bool = False) -> Callable:
    """A reduction of the padded dense chain split in two: ``factor`` here, once.

    Returns ``prepare(system, shared_diagonal, counter)``, which reduces the
    chain's blocks and returns the per-rhs solve ``(s, counter) -> (x, levels,
    info)`` running ``substitute`` on ``s``'s right-hand side. ``diagonal``: the
    system's couplings are the identity (:class:`~propop.systems.coefficients.IdentityCouplings`),
    reduced on :class:`~.odd_even.DiagonalKernels` (odd-even loops only).
    """
    def prepare(system: Any, shared_diagonal: str | None, counter: Counter) -> Callable:
        xp = system.backend.xp
        chain = Chain.of(system, shared_diagonal, diagonal=diagonal)
        levels = factor(chain, counter, odd_even.DiagonalKernels(xp) if diagonal else xp)

        def solve(s: Any, counter: Counter) -> tuple[Any, int, dict]:
            X = substitute(levels, chain.rhs_of(s), counter, xp)
            info = {"width": chain.G.shape[2], "fill_in": DENSE_FILL_IN}
            return chain.solution(X, s), odd_even.depth(levels), info

        return solve

    return prepare


def time_factored(within: str) -> Callable:
    """The two-level reduction of an RNN system (:mod:`.over_time`), split as :func:`factored`.

    Another number of columns than the operator's samples (a shared matrix) has
    its own reduction, made on its first solve and kept.
    """
    def prepare(system: Any, shared_diagonal: str | None, counter: Counter) -> Callable:
        if shared_diagonal is not None:
            raise OptionError("shared_diagonal is not supported on RNN systems: their reduced "
                              "blocks are per sample and per step anyway")
        xp = system.backend.xp
        halves = (lambda chain, c, kernels=xp: odd_even.factor(chain, c, kernels),
                  lambda levels, G, c: odd_even.substitute(levels, G, c, xp))
        made = {system.nrhs: OverTime(system, *halves, counter, within)}

        def solve(s: Any, counter: Counter) -> tuple[Any, int, dict]:
            if s.nrhs not in made:
                made[s.nrhs] = OverTime(standing(s.operator_of, s.nrhs), *halves, counter,
                                        within)
            return made[s.nrhs].solve(s, counter)

        return solve

    return prepare


def groups_factored(system: Any, shared_diagonal: str | None, counter: Counter) -> Callable:
    """Cyclic reduction over groups of blocks (:mod:`.over_groups`), split as :func:`factored`."""
    if shared_diagonal is not None:
        raise OptionError("shared_diagonal is not supported on grouped systems")
    xp = system.backend.xp
    over = OverGroups(system, lambda chain, c: odd_even.factor(chain, c, xp),
                      lambda levels, G, c: odd_even.substitute(levels, G, c, xp), counter)
    return over.solve


def standing(operator: Any, columns: int | None = None) -> TriangularSystem:
    """``operator`` with a zero right-hand side: the system a plan's matrix work sees."""
    return TriangularSystem.of(operator, operator.backend.xp.zeros(
        (operator.size, columns or operator.samples), dtype=operator.dtype,
        device=operator.device))
