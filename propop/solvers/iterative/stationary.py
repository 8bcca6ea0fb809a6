"""Stationary iterations on the unit-diagonal system (paper section 3.2).

With the splitting ``A = D - N`` (``D`` block diagonal, ``N`` strictly block
triangular), Jacobi is ``x <- D^{-1} (N x + c) = x + D^{-1} (c - A x)``. On the
scaled form ``D = I``. ``N`` is nilpotent, so from ``x0 = 0`` the iteration is
exact after ``nblocks`` sweeps whatever the weights: the default ``maxiter``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..convergence import Tolerance, column_norms, finish, initial_guess
from ..options import OptionError
from ..registry import register
from ..solution import Solution

__all__ = ["jacobi", "richardson", "fixed_point"]


def fixed_point(system: Any, x: Any, tol: Tolerance, maxiter: int,
                callback: Callable | None, correction: Callable[[Any], Any]
                ) -> tuple[Any, list[float], int]:
    """``x <- x + correction(c - A x)`` until the true residual meets ``tol`` in every block.

    Returns ``(x, residual history, iterations)``; stops early on a non-finite
    residual (the caller's :func:`finish` reports it).
    """
    R = system.residual(x)
    norms = column_norms(R)
    history, it = [float(norms.max())], 0
    while it < maxiter and not tol.met(tol.ratios(R, x), norms).all() \
            and bool(np.isfinite(norms).all()):
        x = x + correction(R)
        R = system.residual(x)
        norms = column_norms(R)
        history.append(float(norms.max()))
        it += 1
        if callback is not None:
            callback(x)
    return x, history, it


def _iterate(system: Any, omega: float, x0: Any, rtol: float | None, atol: float,
             maxiter: int | None, callback: Callable | None) -> Solution:
    """``x <- x + omega D^{-1} (c - A x)``: Jacobi and Richardson."""
    maxiter = system.nblocks if maxiter is None else int(maxiter)
    tol = Tolerance.of(system, rtol, atol)
    x, history, it = fixed_point(system, initial_guess(system, x0), tol, maxiter, callback,
                                 lambda R: omega * system.unit_rows(R))
    return finish(system, x, tol=tol, iterations=it, history=history, levels=it,
                  maxiter=maxiter, info={"matvecs": it + 1, "omega": omega})


@register("jacobi", kind="iterative", exact=False, native=True)
def jacobi(system: Any, *, x0: Any = None, rtol: float | None = None, atol: float = 0.0,
           maxiter: int | None = None, callback: Callable | None = None) -> Solution:
    """Block Jacobi ``x <- x + D^{-1}(c - A x)``: exact after ``nblocks`` sweeps.

    Every block row updates independently: one parallel step per sweep
    (``levels = iterations``). :func:`propop.solvers.diagonal_dominance` tells
    ahead of time whether each sweep contracts the error.
    """
    return _iterate(system, 1.0, x0, rtol, atol, maxiter, callback)


@register("richardson", kind="iterative", exact=False, native=True)
def richardson(system: Any, *, x0: Any = None, rtol: float | None = None, atol: float = 0.0,
               maxiter: int | None = None, callback: Callable | None = None,
               omega: float = 1.0) -> Solution:
    """Damped Richardson on the scaled system, ``x <- x + omega (c - A x)``.

    On the unit-diagonal form the iteration matrix is ``(1 - omega) I + omega N``:
    it converges for ``0 < omega < 2`` and is exact after ``nblocks`` steps only
    for ``omega = 1`` (where it is Jacobi); other values trade that for damping.
    """
    if not 0 < omega < 2:
        raise OptionError(f"omega must lie in (0, 2) for convergence, got {omega}")
    return _iterate(system, float(omega), x0, rtol, atol, maxiter, callback)
