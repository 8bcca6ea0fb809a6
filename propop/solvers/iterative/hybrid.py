"""Hybrid direct/iterative solves of RNN systems (paper section 3.4).

The diagonal blocks ``L^(s)``/``R^(s)`` of eqs. forw_prop_sub_sys_rnn and
back_prop_sub_sys_rnn (the layers of one time step) are solved directly, and the
whole system iteratively: block Jacobi over time, or GMRES preconditioned by the
direct diagonal-block solve. The direct solve treats all time steps at once (time
is a batch axis there): ``l + 1`` sequential steps, each one product per layer.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Literal

from ...systems.triangular import TriangularSystem
from ..convergence import Tolerance, finish, initial_guess
from ..direct.substitution import substitute
from ..method import Method
from ..registry import info, register
from ..solution import Solution
from .stationary import fixed_point

__all__ = ["within_step_solve", "Hybrid"]


def within_step_solve(within: Any, R: Any) -> Any:
    """``D^{-1} R`` for ``D`` the block diagonal over time steps (the layers of each step).

    ``within`` is :meth:`Operator.within_steps` of a canonical operator (scaled
    form, :mod:`propop.systems.make_system`) and ``R`` ``(N, c)``: block
    substitution (:func:`~propop.solvers.direct.substitution.substitute`) whose
    rows are whole layers, all time steps and columns at once (eqs.
    forw_prop_sub_sys_rnn, back_prop_sub_sys_rnn).
    """
    return substitute(TriangularSystem.of(within, R, check=False))


OUTER = {"gmres": "batched-gmres", "bicgstab": "bicgstab"}


@register("hybrid", kind="hybrid", exact=False, native=True,
          requires=("time_structure",))
class Hybrid(Method):
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

    def init(self, operator: Any, *, rtol: float | None = None, atol: float = 0.0,
             maxiter: int | None = None,
             outer: Literal["jacobi", "gmres", "bicgstab"] = "jacobi") -> dict:
        """The outer method's ``init``, with the within-step solve as its preconditioner."""
        if operator.structure is None:
            raise ValueError("'hybrid' needs a system with a time structure (an RNN's); use "
                             "'jacobi', a Krylov method or a direct method for this one")
        maxiter = operator.structure.tau + 1 if maxiter is None else int(maxiter)
        solve = functools.partial(within_step_solve, operator.within_steps())
        state = dict(rtol=rtol, atol=atol, maxiter=maxiter, outer=outer, solve=solve)
        if outer != "jacobi":
            krylov = info(OUTER[outer]).method
            state.update(krylov=krylov, inner=krylov.init(
                operator, rtol=rtol, atol=atol, maxiter=maxiter, M=solve))
        return state

    def compute(self, state: dict, system: Any, x0: Any = None,
                callback: Callable | None = None) -> Solution:
        """The outer iteration from ``x0``."""
        tol, maxiter = Tolerance.of(system, state["rtol"], state["atol"]), state["maxiter"]
        x = initial_guess(system, x0)
        if state["outer"] == "jacobi":
            x, history, iterations = fixed_point(system, x, tol, maxiter, callback,
                                                 state["solve"])
        else:
            sol = state["krylov"].compute(state["inner"], system, x0=x, callback=callback)
            x, history, iterations = sol.x, list(sol.residuals), sol.iterations
        per = len(system.structure.sizes)
        return finish(system, x, tol=tol, iterations=iterations, history=history,
                      levels=iterations * per, maxiter=maxiter,
                      estimates=state["outer"] != "jacobi",
                      info={"outer": state["outer"], "inner_steps": per,
                            "outer_iterations": iterations})
