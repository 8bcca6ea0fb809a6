"""The solver registry: methods are plain functions found by name (DESIGN section 3).

As PETSc's ``KSPRegister``: ``register("name", kind=..., exact=...)`` adds a
function ``method(system, *, x0=None, rtol=..., atol=..., maxiter=...,
callback=None, **own_options) -> Solution``; third-party packages add theirs
through the entry-point group ``propop.solvers``, loaded on first look-up.
"""

from __future__ import annotations

import dataclasses
import inspect
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

from ..progress import Silent, bar
from .solution import ConvergenceError, Solution

__all__ = ["SolverInfo", "KINDS", "register", "get", "info", "available", "solve"]

KINDS = ("direct", "iterative", "krylov", "block", "hybrid")
REQUIREMENTS = ("chain", "time_structure", "reducible", "shared_matrix")
# How each requirement reads in "needs a ..." messages.
REQUIREMENT_WORDS = {"chain": "chain", "time_structure": "time structure",
                     "reducible": "chain or RNN system", "shared_matrix": "shared matrix"}
BACKENDS = ("numpy", "cupy")
ENTRY_POINT_GROUP = "propop.solvers"


@dataclass(frozen=True)
class SolverInfo:
    """A registered method: what it is and where it runs."""

    name: str
    kind: str
    exact: bool
    backends: tuple
    description: str
    function: Callable[..., Solution] = dataclasses.field(repr=False, compare=False)
    requires: tuple = ()

    def applies_to(self, system: Any) -> bool:
        """Whether ``system`` has the structure this method requires."""
        needs = {"chain": lambda: system.blocks.is_chain,
                 "time_structure": lambda: system.structure is not None,
                 "reducible": lambda: system.blocks.is_chain or system.structure is not None,
                 "shared_matrix": lambda: system.shares_matrix}
        return all(needs[need]() for need in self.requires)


_REGISTRY: dict[str, SolverInfo] = {}
_ENTRY_POINTS_LOADED = False


def register(name: str, *, kind: str, exact: bool, backends: tuple = ("numpy",),
             description: str | None = None, requires: tuple = ()
             ) -> Callable[[Callable], Callable]:
    """Decorator that registers ``function`` as method ``name``.

    Parameters
    ----------
    name : str
        The name users pass as ``method=``; registering a name twice is an error.
    kind : {"direct", "iterative", "krylov", "block", "hybrid"}
    exact : bool
        Whether the method solves exactly (up to rounding) in a fixed number of steps.
    backends : tuple of {"numpy", "cupy"}
        Array backends the function supports.
    description : str, optional
        One line for listings; defaults to the first line of the docstring.
    requires : tuple of {"chain", "time_structure", "reducible", "shared_matrix"}
        Structure a system must have: block bi-diagonal (parallel cyclic
        reduction), repeated over time steps (RNN-specific methods), either of
        the two (cyclic reduction), or one matrix for all samples (block Krylov).

    Examples
    --------
    >>> import propop as pp
    >>> @pp.solvers.register("doc-example", kind="direct", exact=True)
    ... def doc_example(system, **options):
    ...     '''Delegates to substitution.'''
    ...     return pp.solvers.get("substitution")(system, **options)
    >>> pp.solvers.info("doc-example").kind
    'direct'
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    unknown = set(backends) - set(BACKENDS)
    if unknown:
        raise ValueError(f"unknown backends {sorted(unknown)}; choose from {BACKENDS}")
    if set(requires) - set(REQUIREMENTS):
        raise ValueError(f"requires must be drawn from {REQUIREMENTS}, got {requires}")

    def decorate(function: Callable[..., Solution]) -> Callable[..., Solution]:
        if name in _REGISTRY:
            raise ValueError(f"solver {name!r} is already registered")
        doc = (function.__doc__ or "").strip().splitlines()
        _REGISTRY[name] = SolverInfo(name, kind, bool(exact), tuple(backends),
                                     description or (doc[0] if doc else ""), function,
                                     tuple(requires))
        return function

    return decorate


def _load_entry_points() -> None:
    global _ENTRY_POINTS_LOADED
    if _ENTRY_POINTS_LOADED:
        return
    _ENTRY_POINTS_LOADED = True
    for point in entry_points(group=ENTRY_POINT_GROUP):
        point.load()  # importing the module runs its @register decorators


def info(name: str) -> SolverInfo:
    """The :class:`SolverInfo` of method ``name``.

    Raises
    ------
    KeyError
        For an unknown name; the message lists the known ones.
    """
    _load_entry_points()
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise KeyError(f"unknown solver {name!r}; known: {', '.join(sorted(_REGISTRY))}"
                       ) from None


def _advancing(shown: Any, callback: Callable | None) -> Callable[[Any], None]:
    """A callback that advances the bar, then calls the user's ``callback``."""
    def advance(x: Any) -> None:
        shown.update()
        if callback is not None:
            callback(x)

    return advance


def get(name: str) -> Callable[..., Solution]:
    """The function registered as method ``name`` (``KeyError`` lists the known ones)."""
    return info(name).function


def available() -> list[SolverInfo]:
    """All registered methods, sorted by kind then name."""
    _load_entry_points()
    return sorted(_REGISTRY.values(), key=lambda s: (KINDS.index(s.kind), s.name))


def solve(system: Any, method: str | Callable[..., Solution] = "substitution", *,
          check: bool = False, progress: bool | str = False, **options: Any) -> Solution:
    """Solve ``system`` with the method named ``method`` and time it.

    Parameters
    ----------
    system : TriangularSystem
    method : str or callable
        A registered name (see :func:`available`) or a solver function.
    check : bool
        Raise :class:`~propop.ConvergenceError` if the solve fails instead of
        returning a ``Solution`` whose ``converged`` is ``False``.
    progress : {False, True, "auto"}
        A tqdm bar that advances with every callback of the method (iterations,
        or restart cycles for GMRES); ``"auto"``: only in a terminal
        (:mod:`propop.progress`).
    **options
        Passed to the method: ``x0``, ``rtol``, ``atol``, ``maxiter``,
        ``callback`` and the method's own options.

    Examples
    --------
    >>> import numpy as np, propop as pp
    >>> net = pp.FNN.random([4, 8, 3], activation="tanh", seed=0)
    >>> tr = net.forward(np.ones(4))
    >>> B = pp.backward_system(net, tr, np.ones(3))
    >>> sol = pp.solve(B, method="jacobi")
    >>> sol.converged, sol.iterations
    (True, 3)
    """
    if callable(method):
        name, function = getattr(method, "__name__", "custom"), method
    else:
        solver = info(method)
        if system.backend.name not in solver.backends:
            raise ValueError(f"solver {method!r} runs on {solver.backends}, but the system's "
                             f"arrays are {system.backend.name} arrays")
        name, function = method, solver.function
    with bar(progress, options.get("maxiter"), name) as shown:
        if not isinstance(shown, Silent) and "callback" in inspect.signature(function).parameters:
            options["callback"] = _advancing(shown, options.get("callback"))
        start = time.perf_counter()
        solution = function(system, **options)
        elapsed = time.perf_counter() - start
    solution = dataclasses.replace(solution, time=elapsed, method=name)
    if check and not solution.converged:
        raise ConvergenceError(solution)
    return solution
