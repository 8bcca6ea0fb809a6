"""The solver registry: methods found by name, their modules loaded on first look-up.

As PETSc's ``KSPRegister``: ``register("name", kind=..., exact=...)`` adds a
:class:`~propop.solvers.method.Method` (``init``/``compute``) or a plain function
``method(system, *, x0=None, rtol=..., atol=..., maxiter=..., callback=None,
**own_options) -> Solution``. Nothing is imported until a method
is asked for: :data:`BUILTIN` names the module that registers each of propop's
methods, and :func:`info` imports it on the first look-up of one of its names
(``import propop`` loads no solver, no PyAMG and no ``scipy.sparse.linalg``);
third-party packages add theirs through the entry-point group ``propop.solvers``,
loaded on the first look-up too.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

from .method import Method, as_method

__all__ = ["SolverInfo", "KINDS", "BUILTIN", "register", "unregister", "refuse", "info",
           "names", "available"]

KINDS = ("direct", "iterative", "krylov", "block", "hybrid")
# How each requirement reads in "needs a ..." messages.
REQUIREMENT_WORDS = {"chain": "chain", "time_structure": "time structure",
                     "reducible": "chain or RNN system",
                     "shared_couplings": "system whose samples share their couplings",
                     "shared_matrix": "shared matrix"}
# Whether a system meets each requirement, from its operator's tags (Operator.tags); a
# shared matrix is also one whose samples' columns are equal (read once).
_MEETS = {"chain": lambda system, tags: "chain" in tags,
          "time_structure": lambda system, tags: "time" in tags,
          "reducible": lambda system, tags: bool(tags & {"chain", "time"}),
          "shared_couplings": lambda system, tags: "per-sample" not in tags,
          "shared_matrix": lambda system, tags: ("shared-matrix" in tags
                                                 or system.shares_matrix)}
REQUIREMENTS = tuple(_MEETS)
BACKENDS = ("numpy", "cupy", "torch", "array_api_strict")
ENTRY_POINT_GROUP = "propop.solvers"
_DIRECT, _REDUCTION = "propop.solvers.direct", "propop.solvers.reduction"
_ITERATIVE, _MPI = "propop.solvers.iterative", "propop.distributed"
# propop's methods: name -> the module whose @register makes it (imported when asked for)
BUILTIN = {
    "substitution": f"{_DIRECT}.substitution", "level-scheduled": f"{_DIRECT}.substitution",
    "scipy.spsolve_triangular": f"{_DIRECT}.scipy_triangular",
    "cyclic-reduction": f"{_REDUCTION}.cyclic", "parallel-cyclic-reduction": f"{_REDUCTION}.cyclic",
    "jacobi": f"{_ITERATIVE}.stationary", "richardson": f"{_ITERATIVE}.stationary",
    "bicgstab": f"{_ITERATIVE}.bicgstab", "batched-gmres": f"{_ITERATIVE}.batched",
    "batched-bicgstab": f"{_ITERATIVE}.batched", "block-gmres": f"{_ITERATIVE}.block",
    "block-bicgstab": f"{_ITERATIVE}.block", "hybrid": f"{_ITERATIVE}.hybrid",
    **{f"scipy.{m}": f"{_ITERATIVE}.adapters" for m in (
        "gmres", "lgmres", "gcrotmk", "bicgstab", "bicg", "qmr", "cgs", "tfqmr", "lsqr", "lsmr")},
    **{f"pyamg.{m}": f"{_ITERATIVE}.adapters" for m in ("gmres", "fgmres", "bicgstab")},
    "auto": "propop.solvers.selection.auto",
    "mpi.substitution": f"{_MPI}.solvers", "mpi.cyclic-reduction": f"{_MPI}.solvers",
    "mpi.jacobi": f"{_MPI}.solvers", "mpi.gmres": f"{_MPI}.krylov",
    "mpi.bicgstab": f"{_MPI}.krylov",
}
# Other names under a library's prefix ("scipy.cg"): its adapters' module may refuse them.
LIBRARY_PREFIXES = {"scipy": f"{_ITERATIVE}.adapters", "pyamg": f"{_ITERATIVE}.adapters",
                    "cupyx": f"{_ITERATIVE}.adapters"}


@dataclass(frozen=True)
class SolverInfo:
    """A registered method: what it is and where it runs."""

    name: str
    kind: str
    exact: bool
    backends: tuple
    description: str
    method: Method = dataclasses.field(repr=False, compare=False)
    requires: tuple = ()
    needs: tuple = ()
    extra: str = ""
    guard: Any = dataclasses.field(default=None, repr=False, compare=False)
    native: bool = False

    @property
    def tested(self) -> str:
        """Where the method has run: the backends its tests run on, and any GPU run recorded.

        Native methods run in every CI on NumPy, PyTorch (CPU) and ``array_api_strict``
        (``tests/test_backends.py``); their CuPy and PyTorch CUDA backends count as run
        only once a GPU run is recorded (:mod:`propop.solvers.gpu_runs`).
        """
        from .gpu_runs import RUNS

        cpu = ("numpy, torch (CPU), array_api_strict" if self.native else
               ", ".join(b for b in self.backends if b != "cupy"))
        gpu = [b for b in self.backends if b == "cupy"] + (["torch (CUDA)"] if self.native
                                                           else [])
        if not gpu:
            return cpu
        ran = RUNS.get(self.name)
        return (f"{cpu}; {', '.join(gpu)}: " + (f"run on {ran}" if ran
                                                 else "not yet run on a GPU"))

    @property
    def missing(self) -> tuple:
        """The optional modules this method needs that are not installed."""
        return tuple(m for m in self.needs if not _installed(m))

    @property
    def available(self) -> bool:
        """Whether every optional module the method needs is installed."""
        return not self.missing

    def require_available(self) -> None:
        """Raise ``ImportError`` naming the missing modules and the extra that provides them."""
        if self.missing:
            raise ImportError(f"solver {self.name!r} needs {', '.join(self.missing)}: "
                              f"pip install propop[{self.extra}]")

    def applies_to(self, system: Any) -> bool:
        """Whether ``system`` has the structure this method requires (:data:`_MEETS`)."""
        tags = system.tags
        return all(_MEETS[need](system, tags) for need in self.requires)


_REGISTRY: dict[str, SolverInfo] = {}
_REFUSED: dict[str, str] = {}  # name -> why it is not offered
_ENTRY_POINTS_LOADED = False


@functools.cache
def _installed(module: str) -> bool:
    """Whether ``module`` can be imported, without importing it."""
    return importlib.util.find_spec(module) is not None


def register(name: str, *, kind: str, exact: bool, backends: tuple = ("numpy",),
             native: bool = False, description: str | None = None, requires: tuple = (),
             needs: tuple = (), extra: str = "", guard: Any = None, replace: bool = False
             ) -> Callable[[Any], Any]:
    """Decorator that registers a method (a :class:`~.method.Method` class or a function).

    Parameters
    ----------
    name : str
        The name users pass as ``method=``; registering a name twice is an error
        unless ``replace`` (a notebook's cell run again).
    kind : {"direct", "iterative", "krylov", "block", "hybrid"}
    exact : bool
        Whether the method solves exactly (up to rounding) in a fixed number of steps.
    backends : tuple of {"numpy", "cupy", "torch", "array_api_strict"}
        Array backends the function supports, for a method that is not ``native``
        (an adapter of a library: NumPy, and CuPy where ``cupyx`` has the method).
    native : bool
        The method is written on the array API namespace of its arrays (propop's
        own methods): it runs on every backend, which ``backends`` then lists
        without being told; ``tests/test_backends.py`` runs every native method
        on PyTorch tensors and ``array_api_strict`` arrays.
    description : str, optional
        One line for listings; defaults to the first line of the docstring.
    requires : tuple of {"chain", "time_structure", "reducible", "shared_couplings", \
"shared_matrix"}
        Structure a system must have: block bi-diagonal (parallel cyclic
        reduction), repeated over time steps (RNN-specific methods), either of
        the two (cyclic reduction), couplings that every sample shares, scaled per
        sample or not (the MPI methods: not a recurrence's per-sample Jacobians),
        or one matrix for all samples (block Krylov).
    needs : tuple of str
        Optional modules the method imports when it runs (``("mpi4py",)``); without
        them it is listed as unavailable and :func:`solve` names ``extra``.
    extra : str
        The ``propop[extra]`` that installs ``needs``.
    guard : object, optional
        For a method that communicates: ``guard.init(name, system, options,
        checks, init)`` runs the option checks and the method's ``init`` so
        that a failure on one process ends :func:`prepare` on all, and
        ``guard.solve(name, system, options, run)`` makes each solve's system
        (``system()``) and runs it the same way, returning ``(system,
        solution)``; ``guard.prepare(options, work)`` does the same for the work
        before a solve (:class:`propop.distributed.guard.Collective`).
    replace : bool
        Register ``name`` again, replacing the method it names.

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
    backends = BACKENDS if native else backends
    unknown = set(backends) - set(BACKENDS)
    if unknown:
        raise ValueError(f"unknown backends {sorted(unknown)}; choose from {BACKENDS}")
    if set(requires) - set(REQUIREMENTS):
        raise ValueError(f"requires must be drawn from {REQUIREMENTS}, got {requires}")
    if needs and not extra:
        raise ValueError("a method with optional modules (needs=) must name the extra that "
                         "installs them (extra=)")

    def decorate(target: Any) -> Any:
        if name in _REGISTRY and not replace:
            raise ValueError(f"solver {name!r} is already registered; pass replace=True to "
                             "register it again (a notebook cell run twice), or "
                             "propop.solvers.unregister(name)")
        method = as_method(target)
        doc = (target.__doc__ or "").strip().splitlines()
        _REGISTRY[name] = SolverInfo(name, kind, bool(exact), tuple(backends),
                                     description or (doc[0] if doc else ""), method,
                                     tuple(requires), tuple(needs), extra, guard, bool(native))
        return target

    return decorate


def unregister(name: str) -> None:
    """Remove method ``name`` from the registry (``KeyError`` names the known ones)."""
    info(name)
    if name in BUILTIN:
        raise ValueError(f"{name!r} is one of propop's own methods; register another name")
    del _REGISTRY[name]


def refuse(name: str, reason: str) -> None:
    """Make a look-up of ``name`` raise ``ValueError`` with ``reason`` (``"scipy.cg"``: why not)."""
    _REFUSED[name] = reason


def _load(name: str | None = None) -> None:
    """Import what registers ``name`` (a built-in's module), or everything for ``None``.

    Third-party entry points are loaded on the first look-up of any name.
    """
    global _ENTRY_POINTS_LOADED
    if not _ENTRY_POINTS_LOADED:
        _ENTRY_POINTS_LOADED = True
        for point in entry_points(group=ENTRY_POINT_GROUP):
            point.load()  # importing the module runs its @register decorators
    wanted = set(BUILTIN.values()) if name is None else {
        BUILTIN.get(name) or LIBRARY_PREFIXES.get(name.split(".")[0])} - {None}
    for module in sorted(wanted):
        importlib.import_module(module)


def info(name: str) -> SolverInfo:
    """The :class:`SolverInfo` of method ``name``.

    Raises
    ------
    KeyError
        For an unknown name; the message lists the known ones.
    ValueError
        For a name that is refused, with the reason (``"scipy.cg"``: it needs symmetry).
    """
    if isinstance(name, str) and name not in _REGISTRY:
        _load(name)
        if name in _REFUSED:
            raise ValueError(f"solver {name!r} is not offered: {_REFUSED[name]}")
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise KeyError(f"unknown solver {name!r}{_did_you_mean(str(name))}; known: "
                       f"{', '.join(sorted(_known()))}") from None


def _known() -> list:
    """Every name that can be looked up, registered or not yet loaded: built-ins first."""
    return list(BUILTIN) + [name for name in _REGISTRY if name not in BUILTIN]


def _did_you_mean(name: str) -> str:
    """Up to three registered names close to ``name``, ignoring case.

    Whole names and the part after a library prefix count: ``gmres`` finds ``scipy.gmres``.
    """
    def score(known: str) -> float:
        parts = {known.lower(), known.lower().split(".")[-1]}
        return max(difflib.SequenceMatcher(None, name.lower(), p).ratio() for p in parts)

    close = sorted((k for k in _known() if score(k) >= 0.75), key=lambda k: -score(k))[:3]
    if not close:
        return ""
    quoted = [repr(k) for k in close]
    listed = ", ".join(quoted[:-1]) + " or " + quoted[-1] if len(quoted) > 1 else quoted[0]
    return f" (did you mean {listed}?)"


def names() -> list[str]:
    """The registered method names (every built-in's module loaded)."""
    _load()
    return list(_REGISTRY)


def available() -> list[SolverInfo]:
    """All registered methods, sorted by kind then name.

    A method whose optional modules are missing is listed too; its
    :attr:`SolverInfo.available` is ``False``. Loads every built-in's module.
    """
    _load()
    return sorted(_REGISTRY.values(), key=lambda s: (KINDS.index(s.kind), s.name))
