"""Adapters for SciPy's and PyAMG's Krylov methods (paper section 3.2).

Each adapter translates propop's options explicitly (DESIGN section 3):

- SciPy takes ``rtol``/``atol`` with the same rule as propop; its ``gmres``
  and ``lgmres`` count ``maxiter`` in restart cycles, so propop's ``maxiter``
  (inner iterations) is divided by ``restart`` (``inner_m``), each capped at
  ``maxiter``; GMRES's residual history comes from ``callback_type="pr_norm"``
  (Arnoldi estimates), LGMRES reports outer cycles as its iterations.
- PyAMG takes one relative ``tol`` (``||r|| < tol ||b||``), so
  ``tol = max(rtol, atol / ||b||)``; its history comes from ``residuals=``.

The default ``maxiter`` is :func:`~propop.solvers.convergence.default_maxiter`: the
off-diagonal part is nilpotent, so ``nblocks`` iterations are exact in exact
arithmetic, and a library left to its own default (``10 N``) spends minutes
producing NaN after a breakdown.

These solvers take one vector: a batch is solved column by column, each with
its sample's ``LinearOperator`` and preconditioner (built once, by ``init``: one
for all columns where the matrix is shared), and ``callback(x)`` is called after
each sample with the whole ``x``. The libraries stop on a global residual;
propop's accuracy contract holds every block to ``rtol`` (:mod:`.convergence`),
so each sample is refined:
the library solves ``A d = c - A x`` to ``rtol`` and ``x += d``, until every
block meets the contract, ``maxiter`` iterations are spent, or a round stops
improving. Each round resolves blocks down to ``rtol`` of the current residual,
so the small blocks of a network with vanishing gradients take a round or two
more. The final status is decided on the true residual. ``M`` is propop's spec
(:mod:`.preconditioners`), handed to the library as a ``LinearOperator``; the
library's own options (``restart``, ``inner_m``, ``orthog``, ...) pass through.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pyamg.krylov
import scipy.sparse.linalg as spla

from ...systems import assemble
from ...systems.triangular import TriangularSystem
from ..convergence import Tolerance, column_norms, default_maxiter, finish, initial_guess
from ..method import Method
from .preconditioners import preconditioner
from ..registry import register
from ..solution import Solution

__all__ = ["LibraryMethod"]

# Library parameters propop sets itself; the others are the method's own options.
TRANSLATED = {"A", "b", "x0", "rtol", "atol", "tol", "maxiter", "M", "callback",
              "callback_type", "residuals", "restrt", "show", "criteria"}


def _scipy_call(function: Callable, sample: _Sample, rhs: Any, rtol: float, maxiter: int,
                options: dict) -> tuple[Any, int, list, int]:
    """Solve ``A d = rhs`` with a SciPy solver; return ``(d, info, history, iterations)``."""
    history: list[float] = []
    norm_c = float(np.linalg.norm(rhs))

    def record(value: Any) -> None:
        """Arnoldi residual estimates for GMRES; a count (``nan``) for x-callbacks."""
        history.append(value * norm_c if np.isscalar(value) else float("nan"))

    if function is spla.gmres:
        restart = min(int(options.get("restart") or 20), maxiter)
        options = {**options, "restart": restart, "maxiter": math.ceil(maxiter / restart),
                   "callback_type": "pr_norm"}
    elif function is spla.lgmres:  # outer cycles of inner_m steps, counted as cycles
        inner = min(int(options.get("inner_m") or 30), maxiter)
        options = {**options, "inner_m": inner, "maxiter": math.ceil(maxiter / inner)}
    else:  # x-callbacks are only counted: a true residual each would cost a product
        options = {**options, "maxiter": maxiter}
    d, info = function(sample.linear, rhs, rtol=rtol, atol=0.0, M=sample.M, callback=record,
                       **options)
    estimates = [h for h in history if not np.isnan(h)]
    return d, info, estimates, len(history)


def _pyamg_call(function: Callable, sample: _Sample, rhs: Any, rtol: float, maxiter: int,
                options: dict) -> tuple[Any, int, list, int]:
    """Solve ``A d = rhs`` with a PyAMG solver; return ``(d, info, history, iterations)``."""
    residuals: list[float] = []
    maxiter = min(maxiter, sample.operator.size)  # PyAMG's GMRES warns beyond N: exact there
    d, info = function(sample.linear, rhs, tol=rtol, maxiter=maxiter, M=sample.M,
                       residuals=residuals, **options)
    return d, info, residuals[1:], max(len(residuals) - 1, 0)


def _refine(call: Callable, function: Callable, sample: Any, built: _Sample, x: Any,
            tol: Tolerance, maxiter: int, options: dict) -> tuple[int, list, int, bool]:
    """Rounds ``x += library(A, c - A x)`` on one sample's system, in place in ``x``.

    Returns ``(library info, residual history, iterations, stopped improving)``.
    """
    info, history, its, previous = 0, [], 0, (math.inf, math.inf)
    while its < maxiter:
        r = sample.residual(x)
        progress = (float(column_norms(r)[0]), float(tol.ratios(r, x)[0]))
        if tol.met(np.array([progress[1]]), np.array([progress[0]])).all():
            return info, history, its, False
        if all(a >= b for a, b in zip(progress, previous)):  # neither norm nor worst block
            return info, history, its, True
        previous = progress
        with np.errstate(all="ignore"):
            d, info, estimates, k = call(function, built, r, tol.rtol, maxiter - its,
                                         options)
        x += d
        history += estimates
        its += max(k, 1)
        if not np.isfinite(d).all():
            info = min(int(info), -1)  # NaN from inside the library: a breakdown
        if info < 0:
            break
    return int(info), history, its, False


class _Sample:
    """One sample's matrix as the libraries take it, built once by ``init``.

    ``operator`` is the sample's (one vector), ``linear`` its ``LinearOperator``
    and ``M`` the preconditioner spec's ``LinearOperator`` (or ``None``).
    """

    def __init__(self, operator: Any, spec: Any) -> None:
        self.operator = operator.ready()
        self.linear = assemble.linear_operator(operator, None)
        apply = preconditioner(operator.batch, spec)
        self.M = None if apply is None else spla.LinearOperator(
            self.linear.shape, matvec=lambda v: apply(v.reshape(-1, 1))[:, 0],
            dtype=operator.dtype)

    def system(self, c: Any) -> Any:
        """The sample's system with right-hand side ``c`` (nothing of the matrix rebuilt)."""
        return TriangularSystem.of(self.operator, c, check=False)


class LibraryMethod(Method):
    """A SciPy or PyAMG Krylov function as a method: ``call`` runs ``function`` per sample.

    ``init`` builds every sample's ``LinearOperator`` and preconditioner (one
    for all columns where the matrix is shared); ``compute`` refines each
    column of the right-hand side with the library (:func:`_refine`).
    """

    def __init__(self, call: Callable, function: Callable, name: str) -> None:
        self.call, self.function, self.name = call, function, name
        self.__doc__ = (f"``{function.__module__.split('.')[0]}``'s ``{function.__name__}``, "
                        "one sample at a time, refined until every block meets rtol.")

    def init(self, operator: Any, *, rtol: float | None = None, atol: float = 0.0,
             maxiter: int | None = None, M: Any = None, **options: Any) -> dict:
        """The samples' operators and preconditioners; the library's options kept."""
        shared = operator.shares_matrix
        samples = [_Sample(operator.sample(i), M)
                   for i in range(1 if shared else operator.samples)]
        maxiter = default_maxiter(operator) if maxiter is None else int(maxiter)
        return dict(rtol=rtol, atol=atol, maxiter=maxiter, samples=samples, options=options)

    def compute(self, state: dict, system: Any, x0: Any = None,
                callback: Callable | None = None) -> Solution:
        """Every column refined with the library, sample by sample."""
        tol, maxiter = Tolerance.of(system, state["rtol"], state["atol"]), state["maxiter"]
        x = initial_guess(system, x0)
        samples = state["samples"]
        infos, histories, iterations, stalled = [], [], [], []
        for j in range(x.shape[1]):
            sample = samples[min(j, len(samples) - 1)]
            one = sample.system(system.rhs[:, j])
            column = x[:, j].copy()
            info, history, its, stopped = _refine(
                self.call, self.function, one, sample, column,
                Tolerance.of(one, tol.rtol, tol.atol), maxiter, state["options"])
            x[:, j] = column
            infos.append(info)
            histories.append(history)
            iterations.append(its)
            stalled.append(stopped)
            if callback is not None:
                callback(x)
        breakdown = next((f"{self.name} reported breakdown (info={i}) in sample {s}; try "
                          "'bicgstab' (propop's, random shadow residual) or 'scipy.gmres'"
                          for s, i in enumerate(infos) if i < 0), "") or next((
            f"{self.name} stopped improving in sample {s}: a round of refinement did not "
            "bring its worst block closer to rtol; use a direct method such as 'substitution'"
            for s, stop in enumerate(stalled) if stop), "")
        initial = float(column_norms(system.residual(initial_guess(system, x0))).max())
        return finish(system, x, tol=tol, iterations=max(iterations), levels=max(iterations),
                      history=[initial] + _merge(histories), maxiter=maxiter,
                      breakdown=breakdown, estimates=True,
                      info={"library_info": infos, "sample_iterations": iterations,
                            "sample_histories": histories})

    @property
    def parameters(self) -> list[inspect.Parameter]:
        """``init``'s options, the library's own (``restart``, ``orthog``, ...), ``compute``'s."""
        base = [p for p in super().parameters if p.kind is not p.VAR_KEYWORD]
        own = [inspect.Parameter(p.name, inspect.Parameter.KEYWORD_ONLY, default=p.default)
               for p in inspect.signature(self.function).parameters.values()
               if p.name not in TRANSLATED and p.kind is not p.VAR_KEYWORD]
        return base + own


def _merge(histories: list[list[float]]) -> list[float]:
    """Per-iteration maximum over samples, shorter histories held at their last value."""
    length = max((len(h) for h in histories), default=0)
    padded = [h + [h[-1]] * (length - len(h)) for h in histories if h]
    return [float(max(col)) for col in zip(*padded)]


_SCIPY = {
    "gmres": (spla.gmres, "GMRES(restart=20); maxiter counts inner iterations"),
    "lgmres": (spla.lgmres, "LGMRES(inner_m=30); iterations are outer cycles"),
    "bicgstab": (spla.bicgstab, "BiCGStab with shadow r0: breaks down on backward systems"),
    "cgs": (spla.cgs, "conjugate gradient squared"),
    "tfqmr": (spla.tfqmr, "transpose-free QMR"),
}
_PYAMG = {
    "gmres": (pyamg.krylov.gmres, "GMRES (Householder), no restart by default"),
    "fgmres": (pyamg.krylov.fgmres, "flexible GMRES"),
    "bicgstab": (pyamg.krylov.bicgstab, "BiCGStab with shadow r0"),
}
for _prefix, _call, _table in (("scipy", _scipy_call, _SCIPY), ("pyamg", _pyamg_call, _PYAMG)):
    for _short, (_function, _description) in _table.items():
        _name = f"{_prefix}.{_short}"
        register(_name, kind="krylov", exact=False, description=f"{_prefix}: {_description}")(
            LibraryMethod(_call, _function, _name))
