"""Ahead-of-time facts about a system that predict how iterative methods behave."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import backend

__all__ = ["Dominance", "diagonal_dominance"]


@dataclass(frozen=True)
class Dominance:
    """Block-row diagonal dominance of a system (paper section 3.2).

    Attributes
    ----------
    ratios : tuple of float
        Per block row, ``max_i sum_j |A_ij| / |A_ii|`` over the off-diagonal
        entries (worst sample of a batch); 0 for rows without a coupling.
    dominant : bool
        Whether every ratio is below 1: then each Jacobi sweep contracts the
        error in the max-norm by at least ``max(ratios)``.
    """

    ratios: tuple
    dominant: bool

    def __str__(self) -> str:
        worst = int(np.argmax(self.ratios))
        verdict = "diagonally dominant" if self.dominant else "not diagonally dominant"
        return (f"{verdict}: worst block row {worst} with ratio {self.ratios[worst]:.3g}; "
                "Jacobi is exact after nblocks sweeps either way (nilpotent coupling)")


def _row_abs_sums(M: Any) -> Any:
    be = backend.of(M)
    sums = abs(M).sum(axis=1)
    return be.xp.asarray(sums.todense() if hasattr(sums, "todense") else sums).reshape(-1)


def diagonal_dominance(system: Any) -> Dominance:
    """Check the paper's sufficient condition for Jacobi, before solving.

    The ratio is the same in the scaled and the paper's form, ``|s_i| sum_j |M_ij|``.

    Examples
    --------
    >>> import numpy as np, propop as pp
    >>> net = pp.FNN([0.5 * np.eye(3)], activation="identity")
    >>> B = pp.backward_system(net, net.forward(np.ones(3)), np.ones(3))
    >>> pp.solvers.diagonal_dominance(B).dominant
    True
    """
    B = system.blocks
    totals: dict[int, Any] = {}
    for e in B.edges:
        sums = _row_abs_sums(e.matrix)
        sums = sums if e.scale is None else abs(e.scale) * (sums if e.scale.ndim == 1
                                                            else sums[:, None])
        totals[e.row] = totals.get(e.row, 0) + sums
    ratios = [0.0] * system.nblocks
    for row, sums in totals.items():
        d = B.diagonal[row]
        sums = sums if d is None else sums / abs(d)
        ratios[row] = float(backend.to_host(sums.max())) if sums.size else 0.0
    return Dominance(tuple(ratios), max(ratios) < 1)
