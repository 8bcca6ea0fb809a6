"""What propop's Krylov methods share: their prepared state and a system seen as ``(N, c)`` blocks.

:class:`Setup` is a Krylov method's ``init`` (the options checked, ``maxiter``
resolved, the preconditioner built for the operator); :class:`Block` is the
system of one ``compute`` as the loops see it: ``A``, ``M^{-1}``, inner products
and the true residual on ``(N, c)`` blocks (a distributed view overrides the
operations that see the whole vector).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..convergence import Tolerance, column_norms, default_maxiter
from .preconditioners import preconditioner

__all__ = ["Setup", "Block"]


@dataclass(frozen=True)
class Setup:
    """A Krylov method's per-matrix state: tolerances, ``maxiter``, the built preconditioner.

    Attributes
    ----------
    rtol, atol : float or None, float
        As given (``rtol=None`` resolves per system, from its dtype).
    maxiter : int
        Given, or :func:`~propop.solvers.convergence.default_maxiter` of the operator.
    minv : callable or None
        ``R -> M^{-1} R`` on ``(N, c)`` blocks (:func:`.preconditioner`).
    own : dict
        The method's other options.
    """

    rtol: float | None
    atol: float
    maxiter: int
    minv: Callable[[Any], Any] | None = field(repr=False)
    own: dict = field(default_factory=dict)

    @classmethod
    def of(cls, operator: Any, rtol: float | None, atol: float, maxiter: int | None,
           M: Any = None, **own: Any) -> Setup:
        """The state for ``operator``: ``maxiter`` resolved, ``M``'s preconditioner built."""
        maxiter = default_maxiter(operator) if maxiter is None else int(maxiter)
        return cls(rtol, atol, maxiter, preconditioner(operator, M), own)

    def tolerance(self, system: Any) -> Tolerance:
        """The accuracy contract for ``system``'s right-hand side."""
        return Tolerance.of(system, self.rtol, self.atol)

    def block(self, system: Any) -> Block:
        """``system`` as ``(N, c)`` blocks, with this state's preconditioner."""
        return Block(system, self.minv)


class Block:
    """A system seen as ``(N, c)`` blocks: ``A``, ``M^{-1}`` and the true residual.

    ``system`` is canonical (:mod:`propop.systems.make_system`): scaled form,
    right-hand side ``(N, c)``.
    """

    def __init__(self, system: Any, minv: Callable[[Any], Any] | None = None) -> None:
        self.system, self.xp, self.minv = system, system.backend.xp, minv

    def A(self, P: Any) -> Any:
        """The operator on a block (one product for all its columns)."""
        return self.system.apply(P)

    def M(self, P: Any) -> Any:
        """The right preconditioner (identity without one)."""
        return P if self.minv is None else self.minv(P)

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
        return self.system.residual(X)

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
            callback(X)
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
