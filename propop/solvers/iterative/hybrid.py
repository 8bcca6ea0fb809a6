"""Hybrid direct/iterative solves of RNN systems (paper section 3.4).

The diagonal blocks ``L^(s)``/``R^(s)`` of eqs. forw_prop_sub_sys_rnn and
back_prop_sub_sys_rnn (the layers of one time step) are solved directly, and the
whole system iteratively: block Jacobi over time, or GMRES preconditioned by the
direct diagonal-block solve. The direct solve treats all time steps at once (time
is a batch axis there): ``l + 1`` sequential steps, each one product per layer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from ... import backend
from ..convergence import Tolerance, finish, initial_guess
from ..plan import solve
from ..registry import register
from ..solution import Solution
from .stationary import fixed_point

__all__ = ["within_step_solve", "hybrid"]


def within_step_solve(system: Any, R: Any) -> Any:
    """``D^{-1} R`` for ``D`` the block diagonal over time steps (the layers of each step).

    A substitution over layers for all time steps and samples at once.
    """
    structure = system.structure
    xp = system.backend.xp
    per = len(structure.sizes)
    X = R.reshape((structure.tau, sum(structure.sizes)) + R.shape[1:])
    offsets = [sum(structure.sizes[:k]) for k in range(per)]
    rhs = [X[:, o: o + n] for o, n in zip(offsets, structure.sizes)]
    scales = system.periodic_scales(per)
    paper = system.form == "paper"
    within = [t for t in structure.templates if t.offset == 0]
    y: list[Any] = [None] * per
    for k in (range(per) if system.lower else range(per - 1, -1, -1)):
        total = rhs[k].copy()
        for t in (t for t in within if t.row == k):
            product = backend.over_time(t.M, y[t.col])
            total += product if paper or scales[k] is None else scales[k] * product
        y[k] = scales[k] * total if paper and scales[k] is not None else total
    return xp.concatenate(y, axis=1).reshape(R.shape)


def _jacobi(system: Any, x: Any, tol: Tolerance, maxiter: int, callback: Callable | None
            ) -> tuple[Any, list, int]:
    return fixed_point(system, x, tol, maxiter, callback,
                       lambda R: within_step_solve(system, R))


def _krylov(method: str) -> Callable:
    """An outer Krylov method, right-preconditioned by the direct within-step solve."""

    def run(system: Any, x: Any, tol: Tolerance, maxiter: int, callback: Callable | None
            ) -> tuple[Any, list, int]:
        sol = solve(system, method, x0=x, rtol=tol.rtol, atol=tol.atol, maxiter=maxiter,
                    callback=callback, M=lambda R: within_step_solve(system, R))
        return sol.x, list(sol.residuals), sol.iterations

    return run


@register("hybrid", kind="hybrid", exact=False, backends=("numpy", "cupy"),
          requires=("time_structure",))
def hybrid(system: Any, *, x0: Any = None, rtol: float | None = None, atol: float = 0.0,
           maxiter: int | None = None, callback: Callable | None = None,
           outer: Literal["jacobi", "gmres", "bicgstab"] = "jacobi") -> Solution:
    """Direct solves of each time step's layers inside an iteration over time (RNNs).

    Parameters
    ----------
    outer : {"jacobi", "gmres", "bicgstab"}
        Block Jacobi over time steps (exact after ``tau`` sweeps: the coupling
        across steps is nilpotent), or ``batched-gmres`` / ``bicgstab`` (all
        samples in lock-step) right-preconditioned by the direct diagonal-block
        solve.

    Notes
    -----
    ``iterations`` counts outer iterations; ``info["inner_steps"]`` is the number
    of sequential layer steps each direct solve takes (``l + 1``).
    """
    if system.structure is None:
        raise ValueError("'hybrid' needs a system with a time structure (an RNN's); use "
                         "'jacobi', a Krylov method or a direct method for this one")
    tol = Tolerance.of(system, rtol, atol)
    maxiter = system.structure.tau + 1 if maxiter is None else int(maxiter)
    x = initial_guess(system, x0)
    run = _jacobi if outer == "jacobi" else _krylov({"gmres": "batched-gmres",
                                                     "bicgstab": "bicgstab"}[outer])
    x, history, iterations = run(system, x, tol, maxiter, callback)
    per = len(system.structure.sizes)
    return finish(system, x, tol=tol, iterations=iterations, history=history,
                  levels=iterations * per, maxiter=maxiter, estimates=outer != "jacobi",
                  info={"outer": outer, "inner_steps": per, "outer_iterations": iterations})
