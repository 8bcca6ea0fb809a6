"""``mpi.gmres`` and ``mpi.bicgstab``: propop's lock-step Krylov loops on distributed vectors.

The loops of :func:`propop.solvers.iterative.batched.gmres` and
:func:`propop.solvers.iterative.bicgstab.iterate` run unchanged on a rank's rows; only the
three operations that see the whole vector change: the operator (one neighbour
``Sendrecv`` of boundary blocks), the column-wise inner products and the norms
(one ``Allreduce`` each).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..solvers.iterative.batched import gmres, restart_length
from ..solvers.iterative.bicgstab import iterate
from ..solvers.convergence import Tolerance, default_maxiter, finish, initial_guess
from ..solvers.registry import register
from ..solvers.solution import Solution
from ..solvers.iterative.views import Block
from .guard import COLLECTIVE
from .system import DistributedSystem

__all__ = ["DistributedBlock", "mpi_gmres", "mpi_bicgstab"]


class DistributedBlock(Block):
    """A rank's rows as ``(N_local, r)`` blocks, with global inner products."""

    def __init__(self, d: DistributedSystem) -> None:
        self.d, self.xp = d, d.xp
        self.vector = d.nrhs is None
        self.minv = None
        self.system = d.local
        self._tolerances: dict = {}

    def _local(self, P: Any) -> Any:
        return P[:, 0] if self.vector else P

    def A(self, P: Any) -> Any:
        """``(A P)`` on my rows: local couplings, then the neighbour's blocks."""
        local = self._local(P)
        imported = self.d.exchange(self.d.split(local))
        out = self.d.local.apply(local) - self.d.external_rhs(imported)
        return out[:, None] if self.vector else out

    def residual(self, X: Any) -> Any:
        """``C - A X`` on my rows."""
        return self.d.local.rhs.reshape(X.shape) - self.A(X)

    def dot(self, a: Any, b: Any) -> Any:
        """Column-wise inner products over all ranks (one ``Allreduce``)."""
        return self.d.allreduce(np.sum(a * b, axis=0), "sum")

    def norms(self, R: Any) -> Any:
        """Global column norms."""
        return np.sqrt(self.dot(R, R))

    def _mine(self, tol: Tolerance) -> Tolerance:
        """The contract ``tol`` on my rows."""
        key = (tol.rtol, tol.atol)
        if key not in self._tolerances:
            self._tolerances[key] = Tolerance.of(self.d.local, tol.rtol, tol.atol)
        return self._tolerances[key]

    def ratios(self, tol: Tolerance, R: Any, X: Any) -> Any:
        """The worst block's ratio per column over all ranks (one ``Allreduce``)."""
        return self.d.allreduce(self._mine(tol).ratios(R, X), "max")

    def floor(self, tol: Tolerance, X: Any) -> Any:
        """The smallest rank's residual floor per column (one ``Allreduce``)."""
        return self.d.allreduce(self._mine(tol).floor(X), "min")


def _start(system: Any, comm: Any, x0: Any, rtol: float | None, atol: float,
           maxiter: int | None) -> tuple[DistributedSystem, DistributedBlock, Tolerance, int, Any]:
    """The distributed view, its block, the tolerance, ``maxiter`` and my rows of ``x0``."""
    d = DistributedSystem(system, comm)
    maxiter = default_maxiter(system) if maxiter is None else int(maxiter)
    X = d.own(initial_guess(system, x0)).reshape(d.local.size, -1)
    return d, DistributedBlock(d), Tolerance.of(system, rtol, atol), maxiter, X


@register("mpi.gmres", kind="krylov", exact=False, backends=("numpy",), needs=("mpi4py",),
          extra="mpi", guard=COLLECTIVE)
def mpi_gmres(system: Any, *, comm: Any = None, x0: Any = None, rtol: float | None = None,
              atol: float = 0.0, maxiter: int | None = None, callback: Callable | None = None,
              restart: int | None = None) -> Solution:
    """``batched-gmres`` over MPI ranks: a neighbour exchange per product, ``Allreduce`` dots.

    ``restart`` as for ``batched-gmres``; the solution is gathered on every rank.
    """
    d, block, tol, maxiter, X = _start(system, comm, x0, rtol, atol, maxiter)
    m = restart_length(system, restart)
    X, history, it, stagnated, _, _ = gmres(block, X, tol, maxiter, m, callback)
    return finish(system, d.gather(block.out(X)), tol=tol, iterations=it, history=history,
                  levels=it, maxiter=maxiter, breakdown=stagnated, estimates=True,
                  info={"ranks": d.size, "restart": m})


@register("mpi.bicgstab", kind="krylov", exact=False, backends=("numpy",), needs=("mpi4py",),
          extra="mpi", guard=COLLECTIVE)
def mpi_bicgstab(system: Any, *, comm: Any = None, x0: Any = None, rtol: float | None = None,
                 atol: float = 0.0, maxiter: int | None = None,
                 callback: Callable | None = None, seed: int = 0) -> Solution:
    """The ``bicgstab`` method over MPI ranks (random shadow residual, seeded per rank)."""
    d, block, tol, maxiter, X = _start(system, comm, x0, rtol, atol, maxiter)
    X, history, it, breakdown = iterate(block, X, tol, maxiter, callback, "random",
                                        seed + 7919 * d.rank)
    return finish(system, d.gather(block.out(X)), tol=tol, iterations=it, history=history,
                  levels=2 * it, maxiter=maxiter, breakdown=breakdown, estimates=True,
                  info={"ranks": d.size})
