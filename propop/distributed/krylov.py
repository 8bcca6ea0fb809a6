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
from ..solvers.convergence import Tolerance, finish, initial_guess
from ..solvers.method import Method
from ..solvers.registry import register
from ..solvers.solution import Solution
from ..solvers.iterative.views import Block, Setup
from ..systems.triangular import TriangularSystem
from .guard import COLLECTIVE
from .system import DistributedSystem

__all__ = ["DistributedBlock", "Distributed", "MpiGMRES", "MpiBiCGStab"]


class DistributedBlock(Block):
    """A rank's rows as ``(N_local, c)`` blocks, with global inner products.

    ``C`` is my rows of the canonical right-hand side (:meth:`DistributedSystem.own`).
    """

    def __init__(self, d: DistributedSystem, C: Any) -> None:
        self.d, self.xp, self.minv = d, d.xp, None
        self.system = TriangularSystem.of(d.local, C, check=False)
        self._tolerances: dict = {}

    def A(self, P: Any) -> Any:
        """``(A P)`` on my rows: local couplings, then the neighbour's blocks."""
        imported = self.d.exchange(self.d.split(P), P.shape[1])
        return self.d.local.apply(P) - self.d.external_rhs(imported, P.shape[1])

    def residual(self, X: Any) -> Any:
        """``C - A X`` on my rows."""
        return self.system.rhs - self.A(X)

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
            self._tolerances[key] = Tolerance.of(self.system, tol.rtol, tol.atol)
        return self._tolerances[key]

    def ratios(self, tol: Tolerance, R: Any, X: Any) -> Any:
        """The worst block's ratio per column over all ranks (one ``Allreduce``)."""
        return self.d.allreduce(self._mine(tol).ratios(R, X), "max")

    def floor(self, tol: Tolerance, X: Any) -> Any:
        """The smallest rank's residual floor per column (one ``Allreduce``)."""
        return self.d.allreduce(self._mine(tol).floor(X), "min")


class Distributed(Method):
    """An ``mpi.*`` method's ``init``: my rows of the operator, the options checked.

    Subclasses define :meth:`compute`; :meth:`start` gives a solve its block,
    tolerance and my rows of ``x0``.
    """

    def init(self, operator: Any, *, comm: Any = None, rtol: float | None = None,
             atol: float = 0.0, maxiter: int | None = None, **own: Any) -> Setup:
        """:class:`DistributedSystem` of the operator (no message sent) and the options."""
        return Setup.of(operator, rtol, atol, maxiter, None, **own,
                        d=DistributedSystem(operator, comm))

    @staticmethod
    def start(state: Setup, system: Any, x0: Any) -> tuple[Any, DistributedBlock, Tolerance, Any]:
        """``(d, block, tolerance, X)`` for ``system``'s right-hand side."""
        d = state.own["d"]
        return (d, DistributedBlock(d, d.own(system.rhs)), state.tolerance(system),
                d.own(initial_guess(system, x0)))


@register("mpi.gmres", kind="krylov", exact=False, backends=("numpy",), needs=("mpi4py",),
          extra="mpi", guard=COLLECTIVE,
          requires=("shared_couplings",))
class MpiGMRES(Distributed):
    """``batched-gmres`` over MPI ranks: a neighbour exchange per product, ``Allreduce`` dots.

    ``restart`` as for ``batched-gmres``; the solution is gathered on every rank.
    """

    def init(self, operator: Any, *, comm: Any = None, rtol: float | None = None,
             atol: float = 0.0, maxiter: int | None = None, restart: int | None = None
             ) -> Setup:
        """My rows, ``restart`` checked."""
        return super().init(operator, comm=comm, rtol=rtol, atol=atol, maxiter=maxiter,
                            restart=restart_length(operator, restart))

    def compute(self, state: Setup, system: Any, x0: Any = None,
                callback: Callable | None = None) -> Solution:
        """Lock-step GMRES(m) cycles on my rows."""
        d, block, tol, X = self.start(state, system, x0)
        m, maxiter = state.own["restart"], state.maxiter
        X, history, it, stagnated, _, _ = gmres(block, X, tol, maxiter, m, callback)
        return finish(system, d.gather(X), tol=tol, iterations=it, history=history,
                      levels=it, maxiter=maxiter, breakdown=stagnated, estimates=True,
                      info={"ranks": d.size, "restart": m})


@register("mpi.bicgstab", kind="krylov", exact=False, backends=("numpy",), needs=("mpi4py",),
          extra="mpi", guard=COLLECTIVE,
          requires=("shared_couplings",))
class MpiBiCGStab(Distributed):
    """The ``bicgstab`` method over MPI ranks (random shadow residual, seeded per rank)."""

    def init(self, operator: Any, *, comm: Any = None, rtol: float | None = None,
             atol: float = 0.0, maxiter: int | None = None, seed: int = 0) -> Setup:
        """My rows and the seed."""
        return super().init(operator, comm=comm, rtol=rtol, atol=atol, maxiter=maxiter,
                            seed=seed)

    def compute(self, state: Setup, system: Any, x0: Any = None,
                callback: Callable | None = None) -> Solution:
        """BiCGStab iterations on my rows."""
        d, block, tol, X = self.start(state, system, x0)
        X, history, it, breakdown = iterate(block, X, tol, state.maxiter, callback, "random",
                                            state.own["seed"] + 7919 * d.rank)
        return finish(system, d.gather(X), tol=tol, iterations=it, history=history,
                      levels=2 * it, maxiter=state.maxiter, breakdown=breakdown,
                      estimates=True, info={"ranks": d.size})
