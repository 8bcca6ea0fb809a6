"""A system seen as ``(N, r)`` blocks, the common ground of propop's Krylov methods."""

from __future__ import annotations

from typing import Any


from ..convergence import Tolerance, column_norms
from .preconditioners import preconditioner

__all__ = ["Block"]


class Block:
    """A system seen as ``(N, r)`` blocks: ``A``, ``M^{-1}`` and the true residual."""

    def __init__(self, system: Any, M: Any) -> None:
        self.system, self.xp = system, system.backend.xp
        self.vector = system.nrhs is None
        self.minv = preconditioner(system, M)

    def A(self, P: Any) -> Any:
        """The operator on a block (one product for all its columns)."""
        return self.system.apply(P[:, 0])[:, None] if self.vector else self.system.apply(P)

    def M(self, P: Any) -> Any:
        """The right preconditioner (identity without one)."""
        if self.minv is None:
            return P
        return self.minv(P[:, 0])[:, None] if self.vector else self.minv(P)

    def dot(self, a: Any, b: Any) -> Any:
        """Column-wise inner products ``a_j . b_j`` (a distributed view sums over ranks)."""
        return self.xp.sum(a * b, axis=0)

    def norms(self, R: Any) -> Any:
        """Column norms as host floats."""
        return column_norms(R)

    def ratios(self, tol: Tolerance, R: Any, X: Any) -> Any:
        """Per column, the worst block's residual over its bound (:class:`Tolerance`)."""
        return tol.ratios(R, X)

    def floor(self, tol: Tolerance, X: Any) -> Any:
        """Per column, a residual norm that surely meets the contract (:meth:`Tolerance.floor`)."""
        return tol.floor(X)

    def met(self, tol: Tolerance, R: Any, X: Any) -> tuple[Any, Any]:
        """``(met, norms)``: which columns meet the contract, and their residual norms."""
        norms = self.norms(R)
        return tol.met(self.ratios(tol, R, X), norms), norms

    def residual(self, X: Any) -> Any:
        """``C - A X`` on the block."""
        return self.system.residual(X[:, 0] if self.vector else X).reshape(X.shape)

    def out(self, X: Any) -> Any:
        """``X`` in the shape of the system's right-hand side."""
        return X[:, 0] if self.vector else X

    def end_cycle(self, X: Any, previous: tuple, history: list, callback: Any,
                  tol: Tolerance, it: int, restart: int, name: str, last: bool = False
                  ) -> tuple[Any, Any, tuple, str]:
        """The true residual after a restart cycle, and a message if it did not improve.

        Records the residual norm in ``history`` and calls ``callback(x)``; returns
        ``(R, met, progress, stagnated)``. ``progress`` is the largest residual norm
        and the largest block ratio of the columns still short of the contract; a
        cycle that lowers neither has stagnated (never the ``last`` one, cut short
        by ``maxiter``).
        """
        R = self.residual(X)
        ratios = self.ratios(tol, R, X)
        norms = self.norms(R)
        met = tol.met(ratios, norms)
        history[-1] = float(norms.max())
        if callback is not None:
            callback(self.out(X))
        short = ~met
        progress = (float(norms[short].max()) if short.any() else 0.0,
                    float(ratios[short].max()) if short.any() else 0.0)
        stagnated = ""
        if short.any() and not last and all(a >= b for a, b in zip(progress, previous)):
            stagnated = (f"{name} stagnated: the cycle ending at iteration {it} lowered "
                         f"neither the residual ({progress[0]:.1e}) nor the worst block's "
                         f"residual relative to rtol ({progress[1]:.1e} times its bound); "
                         f"raise restart (now {restart}) or use a direct method such as "
                         "'substitution'")
        return R, met, progress, stagnated
