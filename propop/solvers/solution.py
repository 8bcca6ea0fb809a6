"""What every solver returns: a :class:`Solution` with a :class:`Status` that explains itself."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Status", "Solution", "ConvergenceError"]


class Status(enum.Enum):
    """How a solve ended (as lineax's ``RESULTS`` and PETSc's ``KSPConvergedReason``).

    ``APPROXIMATE``: an explicitly approximate option (such as cyclic reduction's
    ``shared_diagonal="mean"``) or an approximate system (``B.shared("mean")``)
    gave an answer that misses the tolerance of the true system; ``info`` holds
    its error. ``INACCURATE``: a method that stops by itself (a direct one, or a
    user's method claiming convergence) returned a result whose true residual
    misses the tolerance. ``UNCHECKED``: a direct method's finite result under
    :func:`propop.solvers.convergence.unchecked`, its true residual not computed
    because the caller judges it (Newton's forward pass, by the nonlinear
    residual of every iterate); never CONVERGED.
    """

    CONVERGED = "converged"
    MAX_ITER = "reached maxiter"
    BREAKDOWN = "breakdown"
    NONFINITE = "non-finite values"
    APPROXIMATE = "approximate by request"
    INACCURATE = "missed the tolerance"
    UNCHECKED = "not checked by request"


@dataclass(frozen=True)
class Solution:
    """The result of :func:`propop.solve`.

    Attributes
    ----------
    x : array
        The solution, shaped like ``system.rhs``.
    status : Status
    message : str
        What happened and, when it failed, what to try.
    iterations : int
        Iterations taken (0 for direct methods).
    residuals : tuple of float
        Residual norms ``||c - A x||``, initial first and final (true residual)
        last; for a batch, the largest column norm. Between these, methods
        that would need an extra product per step record their own estimate
        (``info["residual_estimates"]`` is then ``True``).
    levels : int
        Parallel steps taken: sequential steps for substitution, one per
        iteration for iterative methods, reduction levels for cyclic reduction.
    info : dict
        Method-specific facts, raw backend output included.
    time : float
        Wall-clock seconds spent in the method (set by :func:`propop.solve`).
    method : str
        The registered name of the method.
    """

    x: Any
    status: Status
    message: str = ""
    iterations: int = 0
    residuals: tuple = ()
    levels: int = 0
    info: dict = field(default_factory=dict)
    time: float = 0.0
    method: str = ""

    @property
    def converged(self) -> bool:
        """Whether the solve met its tolerance (exact methods: produced finite values)."""
        return self.status is Status.CONVERGED

    @property
    def usable(self) -> bool:
        """Whether ``x`` stands as the answer: CONVERGED, or UNCHECKED (its caller judges it)."""
        return self.status is Status.CONVERGED or self.status is Status.UNCHECKED

    @property
    def exit_code(self) -> int:
        """SciPy's ``info``: 0 converged, the iterations if ``maxiter`` ran out, -1 otherwise.

        0 also for ``UNCHECKED`` (a direct solve's finite result, as SciPy's
        direct solvers return theirs: unjudged).
        """
        if self.usable:
            return 0
        return max(self.iterations, 1) if self.status in (Status.MAX_ITER,
                                                          Status.APPROXIMATE) else -1

    def __iter__(self) -> Any:
        """``x, info = pp.solve(...)`` as with SciPy's solvers (``info`` is :attr:`exit_code`)."""
        return iter((self.x, self.exit_code))

    def __repr__(self) -> str:
        """The final residual (the true one), or "not computed" where none was."""
        residual = f"{self.residuals[-1]:.2e}" if self.residuals else "not computed"
        return (f"Solution(method={self.method!r}, status={self.status.name}, "
                f"iterations={self.iterations}, levels={self.levels}, "
                f"residual={residual}, time={self.time:.3g}s)")


class ConvergenceError(RuntimeError):
    """Raised by ``solve(..., check=True)`` when a solve fails; ``.solution`` holds it."""

    def __init__(self, solution: Solution) -> None:
        super().__init__(f"{solution.method}: {solution.message}")
        self.solution = solution
