"""A system seen as ``(N, r)`` blocks, the common ground of propop's Krylov methods."""

from __future__ import annotations

from typing import Any

from .convergence import Tolerance, column_norms
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

    def residual(self, X: Any) -> Any:
        """``C - A X`` on the block."""
        return self.system.residual(X[:, 0] if self.vector else X).reshape(X.shape)

    def out(self, X: Any) -> Any:
        """``X`` in the shape of the system's right-hand side."""
        return X[:, 0] if self.vector else X

    def end_cycle(self, X: Any, norms: Any, history: list, callback: Any, tol: Tolerance,
                  it: int, restart: int, name: str) -> tuple[Any, Any, str]:
        """The true residual after a restart cycle, and a message if it did not shrink.

        Records the residual in ``history`` and calls ``callback(x)``; returns
        ``(R, norms, stagnated)``.
        """
        R = self.residual(X)
        previous, norms = norms, self.norms(R)
        history[-1] = float(norms.max())
        if callback is not None:
            callback(self.out(X))
        stagnated = ""
        if not tol.met(norms).all() and norms.max() >= previous.max():
            stagnated = (f"{name} stagnated: the cycle ending at iteration {it} did not "
                         f"reduce the residual ({norms.max():.2e}); raise restart (now "
                         f"{restart}) or use a direct method such as 'substitution'")
        return R, norms, stagnated
