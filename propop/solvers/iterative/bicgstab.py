"""propop's BiCGStab: random shadow residual, per-sample scalars, breakdown reported.

SciPy's and PyAMG's BiCGStab take the shadow residual ``rhat = r0``. On the
backward system ``r0`` lives only in the last block, and after one step the
new residual is orthogonal to it: ``rho = rhat . r = 0`` and the method stops
with a wrong answer. A random ``rhat`` is orthogonal to the Krylov residuals
with probability zero. No maintained library offers that choice with
per-sample scalars over a batch, hence this implementation.

References
----------
H. A. van der Vorst, "Bi-CGSTAB: a fast and smoothly converging variant of
Bi-CG for the solution of nonsymmetric linear systems", SIAM J. Sci. Stat.
Comput. 13 (1992), 631-644 (Algorithm 3.1; steps are numbered after it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import numpy as np

from ... import backend

from ..convergence import Tolerance, finish, initial_guess
from ..method import Method
from ..registry import register
from ..solution import Solution
from .views import Block, Setup

__all__ = ["BiCGStab", "iterate"]

def _ratio(xp: Any, num: Any, den: Any, active: Any) -> Any:
    """``num / den`` on the active columns with a non-zero denominator, 0 elsewhere."""
    ok = active & (den != 0)
    return xp.where(ok, num / xp.where(ok, den, 1), 0)


@register("bicgstab", kind="krylov", exact=False, native=True)
class BiCGStab(Method):
    """BiCGStab with a random shadow residual; all samples in lock-step.

    Parameters
    ----------
    shadow : {"random", "residual"}
        The shadow residual ``rhat``: random normal (default), or ``r0`` as in
        SciPy, to reproduce its breakdown.
    seed : int
        Seed of the random shadow residual.
    M : spec, optional
        Right preconditioner (:mod:`propop.solvers.iterative.preconditioners`),
        built once by ``init``.

    Notes
    -----
    Each iteration applies the operator twice to the whole ``(N, r)`` block
    (``levels`` counts these applications). ``residuals`` between the first and
    last entries are the recurrence residuals; convergence is confirmed on the
    true residual, block by block (:mod:`.convergence`), and a column whose
    recurrence drifted, or whose small blocks the recurrence resolved only to the
    precision of its large ones, is restarted from it.
    """

    def init(self, operator: Any, *, rtol: float | None = None, atol: float = 0.0,
             maxiter: int | None = None, shadow: Literal["random", "residual"] = "random",
             seed: int = 0, M: Any = None) -> Setup:
        """The options checked and the preconditioner built."""
        return Setup.of(operator, rtol, atol, maxiter, M, shadow=shadow, seed=seed)

    def compute(self, state: Setup, system: Any, x0: Any = None,
                callback: Callable | None = None) -> Solution:
        """The lock-step iteration from ``x0`` for ``system``'s right-hand side."""
        tol, maxiter = state.tolerance(system), state.maxiter
        X, history, it, breakdown = iterate(state.block(system), initial_guess(system, x0),
                                            tol, maxiter, callback, **state.own)
        return finish(system, X, tol=tol, iterations=it, history=history,
                      levels=2 * it, maxiter=maxiter, breakdown=breakdown, estimates=True,
                      info={"matvecs": (2 * it + 1) * X.shape[1], "shadow": state.own["shadow"],
                            "operator_applications": 2 * it + 1})


def iterate(block: Block, X: Any, tol: Tolerance, maxiter: int, callback: Callable | None,
            shadow: str = "random", seed: int = 0) -> tuple:
    """The lock-step BiCGStab loop on ``block`` (any :class:`Block`, distributed too).

    Returns ``(X, history, iterations, breakdown)``.
    """
    xp, A, true_residual, dot = block.xp, block.A, block.residual, block.dot
    R = true_residual(X)
    Rhat = (xp.astype(backend.like(np.random.default_rng(seed).standard_normal(R.shape), R),
                      R.dtype) if shadow == "random" else xp.asarray(R, copy=True))
    ones = xp.ones(R.shape[1], dtype=R.dtype, device=backend.device(R))
    rho_old, alpha, omega = ones, ones, ones
    V = xp.zeros_like(R)
    P = xp.zeros_like(R)
    met, norms = block.met(tol, R, X)
    active = backend.like(~met, R)
    history, breakdown, it = [float(norms.max())], "", 0
    tiny = backend.eps(R.dtype) ** 2
    while it < maxiter and bool(xp.any(active)):
        it += 1
        rho = dot(Rhat, R)                                               # 1
        scale = xp.sqrt(dot(Rhat, Rhat) * dot(R, R))
        broken = active & (abs(rho) <= tiny * scale)
        if bool(xp.any(broken)):
            breakdown = _breakdown("rho = rhat . r", broken, it)
            active &= ~broken
        beta = _ratio(xp, rho * alpha, rho_old * omega, active)          # 2
        P = R + beta * (P - omega * V)                                   # 3
        P_hat = block.M(P)
        V = A(P_hat)                                                     # 4
        alpha = _ratio(xp, rho, dot(Rhat, V), active)                    # 5
        S = R - alpha * V                                                # 6
        S_hat = block.M(S)
        T = A(S_hat)                                                     # 7
        omega = _ratio(xp, dot(T, S), dot(T, T), active)                 # 8
        X = X + alpha * P_hat + omega * S_hat                            # 9
        R = xp.where(active, S - omega * T, R)                           # 10
        rho_old = xp.where(active, rho, rho_old)
        met, norms = block.met(tol, R, X)
        history.append(float(norms.max()))
        stalled = active & (omega == 0) & backend.like(~met, R)
        if bool(xp.any(stalled)):
            breakdown = _breakdown("omega = t.s / t.t", stalled, it)
            active &= ~stalled
        if callback is not None:
            callback(X)
        active, restart, R = _confirm(block, tol, active, met, X, R)
        if bool(xp.any(restart)):  # a fresh recurrence from the true residual
            P, V = (xp.where(restart, 0.0, a) for a in (P, V))
            rho_old, alpha, omega = (xp.where(restart, 1.0, a) for a in (rho_old, alpha, omega))
    return X, history, it, breakdown


def _confirm(block: Block, tol: Tolerance, active: Any, met: np.ndarray, X: Any, R: Any
             ) -> tuple[Any, Any]:
    """Retire columns whose true residual meets the contract; restart the others that claim to.

    Columns the recurrence calls converged but the true residual does not get
    their recurrence residual replaced by the true one and are returned as the
    second value, to restart their recurrence; the third is the residual.
    """
    xp = block.xp
    claimed = active & backend.like(met, R)
    if not bool(xp.any(claimed)):
        return active, claimed, R
    R_true = block.residual(X)
    truly = backend.like(block.met(tol, R_true, X)[0], R)
    drifted = claimed & ~truly
    return active & ~(claimed & truly), drifted, xp.where(drifted, R_true, R)


def _breakdown(what: str, columns: Any, iteration: int) -> str:
    first = int(np.flatnonzero(backend.to_host(columns))[0])
    return (f"BiCGStab breakdown at iteration {iteration}: {what} vanished in sample "
            f"{first}; use shadow='random' (the default), another seed, 'scipy.gmres' or "
            "a direct method")
