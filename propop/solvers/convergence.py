"""One stopping rule for every method, on the true residual (DESIGN section 3).

``||c - A x|| <= max(atol, rtol ||c||)`` per sample: SciPy's rule.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import backend
from .._checks import require_finite, require_shape
from .solution import Solution, Status

__all__ = [
    "Tolerance", "check_options", "initial_guess", "finish", "column_norms", "default_maxiter",
]


def check_options(rtol: float, atol: float, maxiter: int | None) -> None:
    """Raise ``ValueError`` with an actionable message for bad common options."""
    if not rtol >= 0:
        raise ValueError(f"rtol must be >= 0, got {rtol}")
    if not atol >= 0:
        raise ValueError(f"atol must be >= 0, got {atol}")
    if maxiter is not None and (int(maxiter) != maxiter or maxiter < 1):
        raise ValueError(f"maxiter must be an integer >= 1, got {maxiter}")


def default_maxiter(system: Any) -> int:
    """``2 nblocks + 10``: room for rounding beyond the exact ``nblocks`` steps.

    Krylov methods are exact after ``nblocks`` steps in exact arithmetic: the
    off-diagonal part is nilpotent.
    """
    return 2 * system.nblocks + 10


def column_norms(R: Any) -> np.ndarray:
    """Euclidean norm of each column (one entry for a vector), as host floats."""
    xp = backend.namespace(R)
    squares = xp.einsum("ij,ij->j", R, R) if R.ndim == 2 else (R @ R)[None]
    return np.sqrt(np.asarray(backend.to_host(squares), dtype=float))


@dataclass(frozen=True)
class Tolerance:
    """The per-sample thresholds ``max(atol, rtol ||c_i||)`` of a system."""

    rtol: float
    atol: float
    thresholds: np.ndarray

    @classmethod
    def of(cls, system: Any, rtol: float, atol: float) -> Tolerance:
        """Thresholds for ``system.rhs``."""
        return cls(rtol, atol, np.maximum(atol, rtol * column_norms(system.rhs)))

    def met(self, norms: np.ndarray) -> np.ndarray:
        """Which columns meet their threshold."""
        return norms <= self.thresholds


def initial_guess(system: Any, x0: Any) -> Any:
    """Zeros, or a validated copy of ``x0`` in the system's shape and dtype."""
    xp = system.backend.xp
    if x0 is None:
        return xp.zeros_like(system.rhs)
    x0 = xp.asarray(x0)
    require_shape(x0, system.rhs.shape, "x0", " (the rhs's shape)")
    require_finite(x0, "x0")
    return x0.astype(system.dtype, copy=True)


def _first_nonfinite(system: Any, x: Any) -> str:
    xs = system.split(x)
    for k in system.blocks.order():
        if not bool(system.backend.xp.isfinite(xs[k]).all()):
            return system.names[k]
    return "the solution"


def finish(system: Any, x: Any, *, tol: Tolerance | None, iterations: int = 0,
           history: Sequence[float] = (), levels: int = 0, info: dict | None = None,
           maxiter: int | None = None, breakdown: str = "", estimates: bool = False,
           verify: bool = True) -> Solution:
    """Build the :class:`Solution`: status from the true residual, never silent.

    ``history`` holds the residual norms the method recorded (initial first);
    with ``estimates=True`` its last entry is replaced by the true final norm.
    ``verify=False`` (for exact direct methods, whose residual costs as much as
    the solve) only checks that ``x`` is finite; ``residuals`` then holds the
    initial norm alone and ``info["verified"]`` is ``False``.
    """
    info = dict(info or {}, verified=verify)
    if not verify:
        return _unverified(system, x, levels, info)
    with backend.quiet(system.backend.xp):
        norms = column_norms(system.residual(x))
    history = [float(h) for h in history] or [float(column_norms(system.rhs).max())]
    final = float(norms.max())
    if estimates and len(history) > 1:
        history[-1] = final
    elif history[-1] != final or len(history) == 1:
        history.append(final)
    info.update(residual_estimates=estimates, sample_residuals=norms)
    met = tol.met(norms)
    if met.all():
        status, message = Status.CONVERGED, (
            f"converged in {iterations} iterations, residual {final:.2e}")
    elif breakdown:
        status, message = Status.BREAKDOWN, breakdown
    elif not np.isfinite(norms).all() or not bool(system.backend.xp.isfinite(x).all()):
        status, message = Status.NONFINITE, _nonfinite_message(system, x)
    else:
        status, message = Status.MAX_ITER, _max_iter_message(system, tol, norms, maxiter)
    return Solution(x=x, status=status, message=message, iterations=iterations,
                    residuals=tuple(history), levels=levels, info=info)


def _unverified(system: Any, x: Any, levels: int, info: dict) -> Solution:
    initial = (float(column_norms(system.rhs).max()),)
    if bool(system.backend.xp.isfinite(x).all()):
        return Solution(x=x, status=Status.CONVERGED, message="solved exactly (unverified: "
                        "pass verify=True for the true residual)", residuals=initial,
                        levels=levels, info=info)
    return Solution(x=x, status=Status.NONFINITE, message=_nonfinite_message(system, x),
                    residuals=initial, levels=levels, info=info)


def _nonfinite_message(system: Any, x: Any) -> str:
    return (f"non-finite values, first in {_first_nonfinite(system, x)} in solve order: a "
            "long product of Jacobians overflowed or the iteration diverged; check the "
            "weights' scale, use float64, or a direct method such as 'substitution'")


def _max_iter_message(system: Any, tol: Tolerance, norms: np.ndarray,
                      maxiter: int | None) -> str:
    bad = ~tol.met(norms)
    worst = int(np.argmax(np.where(bad, norms / np.maximum(tol.thresholds, 1e-300), 0)))
    where = "" if norms.size == 1 else f" in {int(bad.sum())} of {norms.size} samples"
    return (f"reached maxiter={maxiter} with residual {norms[worst]:.2e} > "
            f"{tol.thresholds[worst]:.2e} (rtol={tol.rtol:g}, atol={tol.atol:g}){where}; "
            f"raise maxiter (the off-diagonal part is nilpotent: {system.nblocks} Jacobi "
            "sweeps are exact) or use a direct method such as 'substitution'")
