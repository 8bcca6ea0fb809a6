"""Any Krylov solver of SciPy, CuPy or PyAMG as a method (paper section 3.2).

:func:`adapt` wraps a library function; the registry offers SciPy's
(``scipy.gmres``, ``scipy.gcrotmk``, ``scipy.qmr``, ...) and PyAMG's by name, a
function object passed as ``method=`` is adapted on the way in, and on CuPy
arrays a ``scipy.*`` name runs the ``cupyx.scipy.sparse.linalg`` function of
the same name. Each adapter translates propop's options explicitly
(docs/architecture.md):

- SciPy and CuPy take ``rtol``/``atol`` with the same rule as propop. Iterations
  are counted in inner steps, never more than ``maxiter``: ``gmres`` counts
  ``maxiter`` in restart cycles, so it gets ``maxiter // restart`` of them (the
  rest, if any, in the next round of refinement); ``lgmres`` and ``gcrotmk``
  count outer cycles of ``inner_m`` and ``m`` steps, reported as that many
  iterations (or as the products made, where a cycle ended early). ``restart``,
  ``inner_m`` and ``m`` default to the number of blocks
  (these methods are exact after that many steps: the off-diagonal part is
  nilpotent), capped by the memory budget (the basis holds one vector per step
  and sample); a MAX_ITER message says when raising them is the fix. GMRES's
  residual history comes from ``callback_type="pr_norm"`` (Arnoldi estimates).
  ``lsqr`` and ``lsmr`` (least squares, which a triangular system's solution
  is) take ``atol = btol = rtol`` and no preconditioner.
- PyAMG takes one relative ``tol`` (``||r|| < tol ||b||``); its history comes
  from ``residuals=``.
- A solver that needs a symmetric matrix (``cg``, ``minres``, PyAMG's ``cr``,
  ...) is refused with the reason: a triangular system's matrix is not symmetric.

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
more. The final status is decided on the true residual; ``info["products"]``
counts the products with ``A`` (and ``A^T``) each column's solves made, and
``levels`` is the largest (operator applications, as for propop's Krylov methods). ``M`` is
propop's spec (:mod:`.preconditioners`), handed to the library as a
``LinearOperator``; the library's own options (``restart``, ``inner_m``,
``orthog``, ``M1``/``M2`` for ``qmr``, ...) pass through.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from ... import backend, memory
from ...systems import assemble
from ...systems.triangular import TriangularSystem
from ..convergence import Tolerance, column_norms, default_maxiter, finish, initial_guess
from ..method import Method
from ..options import OptionError
from ..registry import refuse, register
from ..solution import Solution, Status
from .preconditioners import preconditioner

__all__ = ["LibraryMethod", "adapt"]

# Library parameters propop sets itself; the others are the method's own options.
TRANSLATED = {"A", "b", "x0", "rtol", "atol", "btol", "tol", "maxiter", "iter_lim", "M",
              "callback", "callback_type", "residuals", "restrt", "show", "criteria"}
# The modules whose solvers are adapted, and the prefix of their names.
LIBRARIES = {"scipy.sparse.linalg": "scipy", "cupyx.scipy.sparse.linalg": "cupyx",
             "pyamg.krylov": "pyamg"}
# The option that sets the inner steps of one outer cycle (a restart).
CYCLES = {"gmres": "restart", "lgmres": "inner_m", "gcrotmk": "m"}
# Solvers whose theory needs what a triangular system's matrix is not.
NEEDS = {"cg": "a symmetric positive definite matrix", "minres": "a symmetric matrix",
         "cr": "a symmetric positive definite matrix",
         "steepest_descent": "a symmetric positive definite matrix",
         "minimal_residual": "a matrix whose symmetric part is positive definite"}
# PyAMG's normal-equation solvers transpose A as an explicit array (np.asarray(A).conj()).
EXPLICIT = {"cgne", "cgnr"}
# Solvers that apply M's transpose, which propop's preconditioners do not give.
TRANSPOSED_M = {"bicg"}
# Solvers that multiply by A^T too (its edge groups then built by init).
TRANSPOSES = {"bicg", "qmr", "lsqr", "lsmr", "cgne", "cgnr"}


def _parameters(function: Callable) -> dict:
    return dict(inspect.signature(function).parameters)


def _library(function: Callable) -> str | None:
    """``"scipy"``, ``"cupyx"`` or ``"pyamg"`` for a function of those libraries' solvers."""
    module = getattr(function, "__module__", None) or ""
    return next((prefix for path, prefix in LIBRARIES.items()
                 if module == path or module.startswith(path + ".")), None)


def refusal(name: str) -> str:
    """Why the symmetric solver ``name`` (``"scipy.cg"``) is not offered; what to use."""
    return (f"{name} needs {NEEDS[name.split('.')[-1]]}, and a triangular system's matrix "
            "(I - L, L strictly block lower triangular) is not symmetric: it would stall or "
            "return a "
            "wrong answer; use 'scipy.gmres', 'pyamg.gmres', propop's 'bicgstab' or a direct "
            "method such as 'substitution'")


def _scipy_call(function: Callable, sample: _Sample, rhs: Any, rtol: float, maxiter: int,
                options: dict) -> tuple[Any, int, list, int]:
    """Solve ``A d = rhs`` with a SciPy (or CuPy) solver: ``(d, info, history, iterations)``.

    A cycling solver runs ``maxiter // steps`` cycles of ``steps`` inner steps, so
    its iterations never pass ``maxiter``.
    """
    params, history = _parameters(function), []
    norm_c = float(column_norms(rhs)[0])
    own, steps = dict(options, maxiter=maxiter), 1
    cycle = CYCLES.get(function.__name__)
    if cycle in params:
        steps = min(int(own.get(cycle) or params[cycle].default or 20), maxiter)
        own[cycle], own["maxiter"] = steps, max(maxiter // steps, 1)
    per_call = steps  # x-callbacks: once per outer cycle of a cycling solver, else per step
    if "callback_type" in params:  # residual estimates: SciPy's per step, CuPy's per restart
        own["callback_type"] = "pr_norm"
        if function.__module__.startswith("scipy"):
            per_call = 1
        else:
            own["maxiter"] = steps * max(maxiter // steps, 1)  # CuPy counts inner steps

    def record(value: Any) -> None:
        history.append(float(value) * norm_c if np.isscalar(value) or getattr(
            value, "ndim", 1) == 0 else math.nan)

    tolerance = {"rtol" if "rtol" in params else "tol": rtol}
    if "atol" in params:
        tolerance["atol"] = 0.0
    if sample.M is not None:
        own["M"] = sample.M
    before = sample.products
    d, info = function(sample.linear, rhs, callback=record, **tolerance, **own)
    steps_made = len(history) * per_call  # a cycle that converged early made fewer products
    return (d, int(info), [h for h in history if not math.isnan(h)],
            min(steps_made, sample.products - before) if per_call > 1 else steps_made)


def _pyamg_call(function: Callable, sample: _Sample, rhs: Any, rtol: float, maxiter: int,
                options: dict) -> tuple[Any, int, list, int]:
    """Solve ``A d = rhs`` with a PyAMG solver; return ``(d, info, history, iterations)``."""
    residuals: list[float] = []
    maxiter = min(maxiter, sample.operator.size)  # PyAMG's GMRES warns beyond N: exact there
    d, info = function(sample.linear, rhs, tol=rtol, maxiter=maxiter, M=sample.M,
                       residuals=residuals, **options)
    return d, int(info), residuals[1:], max(len(residuals) - 1, 0)


def _least_squares_call(function: Callable, sample: _Sample, rhs: Any, rtol: float,
                        maxiter: int, options: dict) -> tuple[Any, int, list, int]:
    """Solve ``A d = rhs`` with ``lsqr``/``lsmr``: ``atol = btol = rtol``, no history.

    ``conlim=0`` unless given: a deep network's condition estimate passes the
    library's 1e8 without the solution being wrong, and the true residual decides.
    """
    limit = "iter_lim" if "iter_lim" in _parameters(function) else "maxiter"
    out = function(sample.linear, rhs, atol=rtol, btol=rtol, **{"conlim": 0.0, **options,
                                                                 limit: maxiter})
    d, stop, iterations = out[0], int(out[1]), int(out[2])
    info = iterations if stop == 7 else (-1 if stop in (3, 6) else 0)  # 7: limit; 3, 6: cond
    return d, info, [], iterations


def _convention(function: Callable) -> Callable | None:
    """The call that suits ``function``'s signature, or ``None`` for a non-solver."""
    params = _parameters(function)
    if {"A", "b"} - set(params):
        return None
    if {"atol", "btol"} <= set(params) and "M" not in params:
        return _least_squares_call
    if "residuals" in params and "tol" in params:
        return _pyamg_call
    if {"maxiter", "callback"} <= set(params) and ({"rtol", "tol"} & set(params)):
        return _scipy_call
    return None


def _refine(call: Callable, function: Callable, sample: Any, built: _Sample, x: Any,
            tol: Tolerance, maxiter: int, options: dict) -> tuple[int, list, int, bool]:
    """Rounds ``x += library(A, c - A x)`` on one sample's system, in place in ``x``.

    Returns ``(library info, residual history, iterations, stopped improving)``.
    """
    xp = sample.backend.xp
    info, history, its, previous = 0, [], 0, (math.inf, math.inf)
    while its < maxiter:
        r = sample.residual(x)
        progress = (float(column_norms(r)[0]), float(tol.ratios(r, x)[0]))
        if tol.met(np.array([progress[1]]), np.array([progress[0]])).all():
            return info, history, its, False
        if all(a >= b for a, b in zip(progress, previous)):  # neither norm nor worst block
            return info, history, its, True
        previous = progress
        with backend.quiet(xp):
            d, info, estimates, k = call(function, built, r, tol.rtol, maxiter - its,
                                         options)
        x += d
        history += estimates
        its += max(k, 1)
        if not bool(xp.all(xp.isfinite(d))):
            info = min(int(info), -1)  # NaN from inside the library: a breakdown
        if info < 0:
            break
    return int(info), history, its, False


class _Sample:
    """One sample's matrix as the libraries take it, built once by ``init``.

    ``operator`` is the sample's (one vector, ready for products with its
    transpose where the solver makes them), ``linear`` its ``LinearOperator`` (of
    the backend's ``scipy.sparse.linalg``, counting its products in ``products``)
    and ``M`` the preconditioner spec's (or ``None``).
    """

    def __init__(self, operator: Any, spec: Any, transpose: bool) -> None:
        self.operator, self.products = operator.ready(transpose), 0
        spla = operator.backend.spla
        linear = assemble.linear_operator(operator, None)
        self.linear = spla.LinearOperator(linear.shape, dtype=operator.dtype,
                                          matvec=self._counted(linear.matvec),
                                          rmatvec=self._counted(linear.rmatvec))
        apply = preconditioner(operator.batch, spec)
        self.M = None if apply is None else spla.LinearOperator(
            self.linear.shape, matvec=lambda v: apply(v.reshape(-1, 1))[:, 0],
            dtype=operator.dtype)

    def _counted(self, product: Callable) -> Callable:
        def counted(v: Any) -> Any:
            self.products += 1
            return product(v)
        return counted

    def system(self, c: Any) -> Any:
        """The sample's system with right-hand side ``c`` (nothing of the matrix rebuilt)."""
        return TriangularSystem.of(self.operator, c, check=False)


def _restart(operator: Any, asked: Any) -> tuple[int, int]:
    """``(steps, cap)``: a cycle of the number of blocks unless asked, within memory.

    GMRES, LGMRES and GCROT(m, k) are exact after ``nblocks`` steps of one cycle;
    the basis holds ``steps + 1`` vectors of one sample (``cap``: as many as the
    memory budget holds).
    """
    vector = operator.size * backend.itemsize(operator.dtype)
    cap = max(int(memory.budget() // vector) - 1, 1)
    return (min(operator.nblocks, cap) if asked is None else int(asked)), cap


class LibraryMethod(Method):
    """A SciPy, CuPy or PyAMG Krylov function as a method (made by :func:`adapt`).

    ``init`` builds every sample's ``LinearOperator`` and preconditioner (one
    for all columns where the matrix is shared); ``compute`` refines each
    column of the right-hand side with the library (:func:`_refine`). On CuPy
    arrays a SciPy function gives way to ``cupyx.scipy.sparse.linalg``'s of the
    same name; ``backends`` lists where the method runs.
    """

    def __init__(self, call: Callable, function: Callable, name: str,
                 backends: tuple = ("numpy",)) -> None:
        self.call, self.function, self.name, self.backends = call, function, name, backends
        self.__doc__ = (f"``{function.__module__.split('.')[0]}``'s ``{function.__name__}``, "
                        "one sample at a time, refined until every block meets rtol.")

    def on(self, be: Any) -> Callable:
        """The library function for backend ``be`` (CuPy's namesake on CuPy)."""
        kind = be.name
        if kind not in self.backends:
            raise ValueError(f"solver {self.name!r} runs on {', '.join(self.backends)} arrays, "
                             f"but the system's are {kind} arrays; use a native method such "
                             "as 'substitution' or 'bicgstab', or move the system with "
                             ".to('numpy')")
        if kind == "cupy" and _library(self.function) == "scipy":
            return getattr(be.spla, self.function.__name__)
        return self.function

    def init(self, operator: Any, *, rtol: float | None = None, atol: float = 0.0,
             maxiter: int | None = None, M: Any = None, **options: Any) -> dict:
        """The samples' operators and preconditioners; the library's options kept.

        ``gmres``'s ``restart`` defaults to the number of blocks, within the memory
        budget; ``M`` is refused where the library takes none or applies its transpose.
        """
        function = self.on(operator.backend)
        params = _parameters(function)
        if M is not None and ("M" not in params or function.__name__ in TRANSPOSED_M):
            raise OptionError(
                f"M: {function.__name__} " + ("applies the preconditioner's transpose too, "
                                              "which propop's M specs do not give"
                                              if "M" in params else "takes no preconditioner")
                + ("; pass your own LinearOperators as M1=/M2=" if "M1" in params else "")
                + "; use 'scipy.gmres' with M=")
        cycle, cap = CYCLES.get(function.__name__), None
        if cycle in params and self.call is _scipy_call:
            options[cycle], cap = _restart(operator.sample(0), options.get(cycle))
        shared = operator.shares_matrix
        samples = [_Sample(operator.sample(i), M, function.__name__ in TRANSPOSES)
                   for i in range(1 if shared else operator.samples)]
        maxiter = default_maxiter(operator) if maxiter is None else int(maxiter)
        return dict(rtol=rtol, atol=atol, maxiter=maxiter, samples=samples, options=options,
                    function=function, cycle=cycle, cap=cap)

    def compute(self, state: dict, system: Any, x0: Any = None,
                callback: Callable | None = None) -> Solution:
        """Every column refined with the library, sample by sample."""
        tol, maxiter = Tolerance.of(system, state["rtol"], state["atol"]), state["maxiter"]
        x = initial_guess(system, x0)
        samples = state["samples"]
        infos, histories, iterations, stalled, products = [], [], [], [], []
        for j in range(x.shape[1]):
            sample = samples[min(j, len(samples) - 1)]
            one = sample.system(system.rhs[:, j])
            column, before = x[:, j].copy(), sample.products
            info, history, its, stopped = _refine(
                self.call, state["function"], one, sample, column,
                Tolerance.of(one, tol.rtol, tol.atol), maxiter, state["options"])
            x[:, j] = column
            infos.append(info)
            histories.append(history)
            iterations.append(its)
            stalled.append(stopped)
            products.append(sample.products - before)
            if callback is not None:
                callback(x)
        breakdown = next((f"{self.name} reported breakdown (info={i}) in sample {s}; try "
                          "'bicgstab' (propop's, random shadow residual) or 'scipy.gmres'"
                          for s, i in enumerate(infos) if i < 0), "") or next((
            f"{self.name} stopped improving in sample {s}: a round of refinement did not "
            "bring its worst block closer to rtol; use a direct method such as 'substitution'"
            for s, stop in enumerate(stalled) if stop), "")
        initial = float(column_norms(system.residual(initial_guess(system, x0))).max())
        solution = finish(system, x, tol=tol, iterations=max(iterations),
                          levels=max(products), history=[initial] + _merge(histories),
                          maxiter=maxiter, breakdown=breakdown, estimates=True,
                          info={"library_info": infos, "sample_iterations": iterations,
                                "sample_histories": histories, "products": products})
        return _advised(solution, state, system.nblocks)

    @property
    def parameters(self) -> list[inspect.Parameter]:
        """``init``'s options, the library's own (``restart``, ``orthog``, ...), ``compute``'s."""
        base = [p for p in super().parameters if p.kind is not p.VAR_KEYWORD]
        own = [inspect.Parameter(p.name, inspect.Parameter.KEYWORD_ONLY, default=p.default)
               for p in _parameters(self.function).values()
               if p.name not in TRANSLATED and p.kind is not p.VAR_KEYWORD]
        return base + own


def _advised(solution: Solution, state: dict, nblocks: int) -> Solution:
    """A solver restarted before it is exact: the MAX_ITER message names the option."""
    cycle, cap = state["cycle"], state["cap"]
    steps = state["options"].get(cycle) if cap is not None else None
    if solution.status is not Status.MAX_ITER or steps is None or steps >= nblocks:
        return solution
    room = (f"raise {cycle} to {nblocks}" if cap >= nblocks else
            f"raise {cycle} (the memory budget holds {cap})")
    return dataclasses.replace(solution, message=(
        f"{solution.message}; it restarted every {cycle}={steps} steps, fewer than the "
        f"{nblocks} blocks after which a Krylov method is exact: {room}"))


def _merge(histories: list[list[float]]) -> list[float]:
    """Per-iteration maximum over samples, shorter histories held at their last value."""
    length = max((len(h) for h in histories), default=0)
    padded = [h + [h[-1]] * (length - len(h)) for h in histories if h]
    return [float(max(col)) for col in zip(*padded)]


def adapt(function: Callable, name: str | None = None) -> LibraryMethod:
    """A method from a Krylov solver of SciPy, CuPy or PyAMG (or one with their signature).

    Parameters
    ----------
    function : callable
        ``function(A, b, x0=None, *, rtol=..., maxiter=..., M=..., callback=...)
        -> (x, info)`` as in ``scipy.sparse.linalg`` and
        ``cupyx.scipy.sparse.linalg``, PyAMG's ``tol``/``residuals=`` form, or the
        least-squares form of ``lsqr``/``lsmr``.
    name : str, optional
        The name in messages and ``Solution.method``; ``"scipy.gcrotmk"`` and the
        like by default.

    Returns
    -------
    LibraryMethod
        Pass it as ``method=``, or register it:
        ``pp.solvers.register("mine", kind="krylov", exact=False)(adapt(f))``.

    Raises
    ------
    ValueError
        For a solver that needs a symmetric matrix (``cg``, ``minres``, ...).
    TypeError
        For a function that is not an iterative solver of that form.

    Examples
    --------
    >>> import scipy.sparse.linalg as spla, propop as pp
    >>> pp.solvers.adapt(spla.gcrotmk).name
    'scipy.gcrotmk'
    """
    short = getattr(function, "__name__", type(function).__name__)
    library = _library(function)
    home = library or (getattr(function, "__module__", None) or "").split(".")[0]
    name = name or (f"{home}.{short}" if home else short)
    if library is not None and short in NEEDS:
        raise ValueError(refusal(name))
    if library == "pyamg" and short in EXPLICIT:
        raise ValueError(f"{name} transposes A as an explicit array, which propop's "
                         "matrix-free operator is not; 'scipy.lsqr' solves the same normal "
                         "equations matrix-free")
    call = _convention(function) if callable(function) else None
    if call is None:
        shown = f"({', '.join(_parameters(function))})" if callable(function) else ""
        raise TypeError(f"{name}{shown} is not an iterative solver f(A, b, x0=None, rtol=..., "
                        "maxiter=..., M=..., callback=...) -> (x, info) as in "
                        "scipy.sparse.linalg; for a direct solve use 'substitution' or "
                        "'scipy.spsolve_triangular'")
    backends = {"cupyx": ("cupy",), "scipy": ("numpy", "cupy") if short in CUPYX else
                ("numpy",)}.get(library, ("numpy",))
    return LibraryMethod(call, function, name, backends)


# cupyx.scipy.sparse.linalg's solvers for non-symmetric matrices (CuPy 13-14).
CUPYX = ("gmres", "cgs", "lsmr")
_SCIPY = {
    "gmres": "GMRES, restart = number of blocks (within the memory budget)",
    "lgmres": "LGMRES, inner_m = number of blocks (within the memory budget)",
    "gcrotmk": "GCROT(m, k), m = number of blocks (within the memory budget)",
    "bicgstab": "BiCGStab with shadow r0: breaks down on backward systems",
    "bicg": "BiCG (products with A^T too): breaks down on backward systems",
    "qmr": "quasi-minimal residual (products with A^T too); M1/M2 its own",
    "cgs": "conjugate gradient squared",
    "tfqmr": "transpose-free QMR",
    "lsqr": "LSQR: the normal equations (condition squared: slow here), no preconditioner",
    "lsmr": "LSMR: the normal equations (condition squared: slow here), no preconditioner",
}
_PYAMG = {"gmres": "GMRES (Householder), no restart by default", "fgmres": "flexible GMRES",
          "bicgstab": "BiCGStab with shadow r0"}


def _register_all() -> None:
    """Register SciPy's and PyAMG's solvers by name, and refuse the symmetric ones."""
    import pyamg.krylov
    import scipy.sparse.linalg as spla

    for prefix, module, table in (("scipy", spla, _SCIPY), ("pyamg", pyamg.krylov, _PYAMG)):
        for short, description in table.items():
            method = adapt(getattr(module, short), f"{prefix}.{short}")
            register(method.name, kind="krylov", exact=False, backends=method.backends,
                     description=f"{prefix}: {description}")(method)
    for name in ("scipy.cg", "scipy.minres", "pyamg.cg", "pyamg.cr", "pyamg.steepest_descent",
                 "pyamg.minimal_residual", "cupyx.cg", "cupyx.minres"):
        refuse(name, refusal(name))


_register_all()
