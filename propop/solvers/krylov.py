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

These solvers take one vector: a batch is solved sample by sample through
``system.sample(i)``, and ``callback(x)`` is called after each sample with the
whole ``x``. The final status is decided on the true residual.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pyamg.krylov
import scipy.sparse.linalg as spla

from .convergence import (Tolerance, check_options, column_norms, default_maxiter, finish,
                          initial_guess)
from .registry import register
from .solution import Solution

__all__: list[str] = []


def _scipy_call(function: Callable, sample: Any, x0: Any, rtol: float, atol: float,
                maxiter: int | None, options: dict) -> tuple[Any, int, list, int]:
    """Run a SciPy solver on one sample; return ``(x, info, history, iterations)``."""
    history: list[float] = []
    norm_c = float(np.linalg.norm(sample.rhs))

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
    x, info = function(sample.operator, sample.rhs, x0=x0, rtol=rtol, atol=atol,
                       callback=record, **options)
    estimates = [h for h in history if not np.isnan(h)]
    return x, info, estimates, len(history)


def _pyamg_call(function: Callable, sample: Any, x0: Any, rtol: float, atol: float,
                maxiter: int | None, options: dict) -> tuple[Any, int, list, int]:
    """Run a PyAMG solver on one sample; return ``(x, info, history, iterations)``."""
    norm_c = float(np.linalg.norm(sample.rhs))
    tol = max(rtol, atol / norm_c) if norm_c > 0 else max(atol, 1e-300)
    residuals: list[float] = []
    maxiter = min(maxiter, sample.size)  # PyAMG's GMRES warns beyond N, which is exact
    x, info = function(sample.operator, sample.rhs, x0=x0, tol=tol, maxiter=maxiter,
                       residuals=residuals, **options)
    return x, info, residuals[1:], max(len(residuals) - 1, 0)


def _adapter(call: Callable, function: Callable, name: str) -> Callable[..., Solution]:
    """A registered method that runs ``function`` through ``call`` on every sample."""

    def method(system: Any, *, x0: Any = None, rtol: float = 1e-10, atol: float = 0.0,
               maxiter: int | None = None, callback: Callable | None = None,
               **options: Any) -> Solution:
        check_options(rtol, atol, maxiter)
        maxiter = default_maxiter(system) if maxiter is None else int(maxiter)
        tol = Tolerance.of(system, rtol, atol)
        x = initial_guess(system, x0)
        columns = [x] if system.nrhs is None else [x[:, i] for i in range(system.nrhs)]
        initial = column_norms(system.residual(x))
        done = tol.met(initial)
        infos, histories, iterations = [], [], []
        for sample, column, skip in zip(system.samples(), columns, done):
            if skip:  # some libraries iterate even from the solution
                infos.append(0)
                histories.append([])
                iterations.append(0)
                continue
            with np.errstate(all="ignore"):
                xi, info, history, its = call(function, sample, column, rtol, atol,
                                              maxiter, options)
            column[...] = xi
            if not np.isfinite(xi).all():
                info = min(int(info), -1)  # NaN from inside the library: a breakdown
            infos.append(int(info))
            histories.append(history)
            iterations.append(its)
            if callback is not None:
                callback(x)
        breakdown = next((f"{name} reported breakdown (info={i}) in sample {s}; try "
                          "'bicgstab' (propop's, random shadow residual) or 'scipy.gmres'"
                          for s, i in enumerate(infos) if i < 0), "")
        return finish(system, x, tol=tol, iterations=max(iterations), levels=max(iterations),
                      history=[float(initial.max())] + _merge(histories), maxiter=maxiter,
                      breakdown=breakdown, estimates=True,
                      info={"library_info": infos, "sample_iterations": iterations,
                            "sample_histories": histories})

    method.__name__ = name.replace(".", "_")
    method.__doc__ = (f"``{function.__module__.split('.')[0]}``'s ``{function.__name__}``, "
                      "one sample at a time.")
    return method


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
            _adapter(_call, _function, _name))
