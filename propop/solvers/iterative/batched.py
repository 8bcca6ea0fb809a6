"""GMRES for the shifted mini-batch systems: ``r`` recurrences in lock-step (paper section 3.3).

The batch system's per-sample diagonals make it ``r`` different matrices with
the same off-diagonal structure (eqs. forw_prop_sys_shifted,
back_prop_sys_shifted). ``batched-gmres`` runs one GMRES recurrence per sample
(Saad and Schultz's Arnoldi with Givens rotations), all at once: each iteration
is one batched operator product on the ``(N, r)`` block, and every scalar of the
recurrence (inner products, rotations, least-squares updates) is a vector of
``r``. Written for propop because SciPy's and PyAMG's GMRES take one right-hand
side at a time and CuPy's likewise.

References
----------
Y. Saad, M. H. Schultz, "GMRES: a generalized minimal residual algorithm for
solving nonsymmetric linear systems", SIAM J. Sci. Stat. Comput. 7 (1986).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ... import backend, memory
from ..reduction import footprint
from .bicgstab import BiCGStab
from ..convergence import Tolerance, finish, initial_guess
from ..method import Method
from ..options import OptionError
from ..registry import register
from ..solution import Solution
from .views import Block, Setup

__all__ = ["BatchedGMRES", "gmres", "restart_length"]


def _safe(xp: Any, num: Any, den: Any) -> Any:
    """``num / den`` where ``den != 0``, else 0."""
    ok = den != 0
    return xp.where(ok, num / xp.where(ok, den, 1.0), 0.0)


def restart_length(operator: Any, restart: int | None) -> int:
    """``restart``, checked against the memory budget, or the default ``min(nblocks + 1, 50)``.

    A cycle keeps ``restart + 1`` basis blocks the size of the right-hand side
    (``operator.samples`` columns).
    """
    if restart is not None and restart < 1:
        raise OptionError(f"restart must be >= 1, got {restart}")
    m = min(operator.nblocks + 1, 50) if restart is None else int(restart)
    memory.require(footprint.krylov_basis(operator, m), f"GMRES with restart={m} on this "
                   f"{operator.nrhs or 1}-sample system", "lower restart, or use 'bicgstab' "
                   "or 'substitution'")
    return m


class _Cycle:
    """One restart cycle of ``r`` GMRES recurrences: Arnoldi, rotations, residual estimates."""

    def __init__(self, xp: Any, R: Any, beta: Any, m: int, dot: Any) -> None:
        r = R.shape[1]
        self.xp, self.dot, self.V = xp, dot, [_safe(xp, R, beta)]
        at = backend.device(R)
        self.H = xp.zeros((m + 1, m, r), dtype=R.dtype, device=at)
        self.cs = xp.zeros((m, r), dtype=R.dtype, device=at)
        self.sn = xp.zeros((m, r), dtype=R.dtype, device=at)
        self.g = xp.zeros((m + 1, r), dtype=R.dtype, device=at)
        self.g[0, ...] = beta

    def step(self, j: int, W: Any) -> tuple[Any, Any]:
        """Orthogonalise ``W = A M^{-1} V_j`` (modified Gram-Schmidt), rotate.

        Returns the residual estimates and which columns' Krylov space is
        exhausted (the new direction is rounding: ``1e3 eps`` of ``W``).
        """
        xp, H, cs, sn, g = self.xp, self.H, self.cs, self.sn, self.g
        size = xp.sqrt(self.dot(W, W))
        for i, Vi in enumerate(self.V):
            H[i, j, ...] = self.dot(Vi, W)
            W = W - H[i, j, ...] * Vi
        H[j + 1, j, ...] = xp.sqrt(self.dot(W, W))
        exhausted = H[j + 1, j, ...] <= 1e3 * backend.eps(W.dtype) * size
        self.V.append(_safe(xp, W, H[j + 1, j, ...]))  # a zero column: that sample is solved
        for i in range(j):  # the rotations so far, on the new column
            upper = cs[i, ...] * H[i, j, ...] + sn[i, ...] * H[i + 1, j, ...]
            H[i + 1, j, ...] = -sn[i, ...] * H[i, j, ...] + cs[i, ...] * H[i + 1, j, ...]
            H[i, j, ...] = upper
        d = xp.hypot(H[j, j, ...], H[j + 1, j, ...])
        cs[j, ...] = xp.where(d != 0, _safe(xp, H[j, j, ...], d), 1.0)
        sn[j, ...] = _safe(xp, H[j + 1, j, ...], d)
        H[j, j, ...], H[j + 1, j, ...] = d, 0.0
        g[j + 1, ...] = -sn[j, ...] * g[j, ...]
        g[j, ...] = cs[j, ...] * g[j, ...]
        return xp.abs(g[j + 1, ...]), exhausted

    def update(self, steps: Any) -> Any:
        """``sum_i V_i y_i`` with ``y`` from the triangular ``H``, ``steps[c]`` rows per column."""
        xp, H, g = self.xp, self.H, self.g
        k = int(xp.max(steps))
        y = xp.zeros((k,) + tuple(steps.shape), dtype=H.dtype, device=backend.device(H))
        for i in range(k - 1, -1, -1):
            rest = xp.sum(H[i, i + 1: k, ...] * y[i + 1:, ...], axis=0)
            y[i, ...] = xp.where(steps > i, _safe(xp, g[i, ...] - rest, H[i, i, ...]), 0.0)
        return sum(Vi * yi for Vi, yi in zip(self.V, backend.walk(y)))


def gmres(block: Block, X: Any, tol: Tolerance, maxiter: int, m: int,
          callback: Callable | None) -> tuple:
    """The lock-step GMRES(m) loop on ``block`` (any :class:`Block`, distributed too).

    A cycle ends early for a column once its residual estimate is below
    :meth:`Tolerance.floor` (every block then meets ``rtol``) or at the rounding
    level of the cycle's initial residual, or when its Krylov space is
    exhausted; the true residual at the end of every cycle decides,
    block by block, which columns go on. Restarts from the true residual refine
    the small blocks that a cycle resolved only to the precision of the largest.

    Returns ``(X, history, iterations, stagnated, column_iterations, cycles)``.
    """
    xp = block.xp
    R = block.residual(X)
    met, norms = block.met(tol, R, X)
    history, it, stagnated, cycles = [float(norms.max())], 0, "", 0
    progress = (np.inf, np.inf)
    columns = np.zeros(norms.size, dtype=int)
    while it < maxiter and not met.all():
        done = backend.like(met, R)
        beta = block.norms(R)  # below rounding of the cycle's start, a restart must refine
        floor = backend.like(np.maximum(block.floor(tol, X), 10 * backend.eps(R.dtype) * beta),
                             R)  # on R's device, in float64: each step compares there
        beta = xp.astype(backend.like(beta, R), R.dtype)
        cycle = _Cycle(xp, R, beta, m, block.dot)
        steps = xp.zeros(norms.size, dtype=xp.int64, device=backend.device(R))
        for j in range(min(m, maxiter - it)):
            it += 1
            estimate, exhausted = cycle.step(j, block.A(block.M(cycle.V[j])))
            steps = xp.where(done, steps, j + 1)
            done = done | (estimate <= floor) | exhausted
            history.append(float(xp.max(xp.where(done, 0.0, estimate))))
            if bool(xp.all(done)):
                break
        X = X + block.M(cycle.update(steps))
        cycles += 1
        columns += backend.to_host(steps)
        R, met, progress, stagnated = block.end_cycle(X, progress, history, callback, tol, it,
                                                      m, "GMRES", last=it >= maxiter)
        if stagnated:
            break
    return X, history, it, stagnated, columns, cycles


@register("batched-gmres", kind="krylov", exact=False, native=True)
class BatchedGMRES(Method):
    """GMRES for every sample at once: one batched product per iteration.

    Parameters
    ----------
    restart : int, optional
        Iterations per cycle (the Krylov basis kept); default
        ``min(nblocks + 1, 50)``: the off-diagonal part is nilpotent of index at
        most ``nblocks``, so an unrestarted cycle of that length is exact.
    M : spec, optional
        Right preconditioner: ``"diagonal"``, ``"block-jacobi"``, ``"air"``, a
        ``(name, {options})`` tuple or a function (:mod:`.preconditioners`),
        built once by ``init``.

    Notes
    -----
    ``iterations`` counts Arnoldi steps, each one operator application on the
    whole batch; ``info["operator_applications"]`` adds the true residuals (one
    a cycle and the initial one), ``info["matvecs"]`` the columns all of them
    carried, ``info["column_iterations"]`` the steps each sample needed.
    ``residuals`` holds the largest residual estimate per iteration. A restart
    cycle that does not bring the worst block closer to ``rtol`` (the accuracy
    contract of :mod:`.convergence`) stops the method as stagnated
    (``BREAKDOWN``); ``callback(x)`` is called after each cycle.
    """

    def init(self, operator: Any, *, rtol: float | None = None, atol: float = 0.0,
             maxiter: int | None = None, restart: int | None = None, M: Any = None
             ) -> Setup:
        """The options checked (``restart`` against the memory budget), the preconditioner built."""
        return Setup.of(operator, rtol, atol, maxiter, M,
                        restart=restart_length(operator, restart))

    def compute(self, state: Setup, system: Any, x0: Any = None,
                callback: Callable | None = None) -> Solution:
        """The lock-step GMRES(m) cycles from ``x0`` for ``system``'s right-hand side."""
        tol, maxiter, m = state.tolerance(system), state.maxiter, state.own["restart"]
        X, history, it, stagnated, columns, cycles = gmres(
            state.block(system), initial_guess(system, x0), tol, maxiter, m, callback)
        return finish(system, X, tol=tol, iterations=it, history=history, levels=it,
                      maxiter=maxiter, breakdown=stagnated, estimates=True,
                      info={"restart": m, "matvecs": (it + cycles + 1) * columns.size,
                            "column_iterations": columns.tolist(),
                            "operator_applications": it + cycles + 1})


register("batched-bicgstab", kind="krylov", exact=False, native=True,
         description="propop's 'bicgstab' by its batched name: r recurrences in lock-step, "
                     "per-sample scalars")(BiCGStab)
