"""Plan once, solve many: a method's ``init`` on the matrix, its ``compute`` per right-hand side.

As lineax's ``init``/``compute`` split (docs/architecture.md): :func:`prepare` checks
the options once and runs the method's :meth:`~.method.Method.init` on the
system's operator, everything that depends on the matrix alone (cyclic reduction
reduces its blocks, Krylov methods build their preconditioners);
:meth:`Plan.solve` then makes each right-hand side canonical
(:func:`~propop.systems.make_system.make_system`), runs
:meth:`~.method.Method.compute`, judges the result (:func:`judged`) and gives it
back in the caller's shape. :func:`propop.solve` is ``prepare(...).solve()``.

Examples
--------
>>> import numpy as np, propop as pp
>>> net = pp.FNN.random([4, 8, 3], activation="tanh", seed=0)
>>> B = pp.backward_system(net, net.forward(np.ones((4, 2))), np.ones((3, 2)))
>>> plan = pp.prepare(B, "cyclic-reduction")
>>> sols = [plan.solve(rhs) for rhs in np.random.default_rng(0).standard_normal((3,) + B.rhs.shape)]
>>> [s.converged for s in sols]
[True, True, True]
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from .. import backend
from ..progress import Silent, bar
from ..systems.make_system import Problem, make_system
from ..systems.plain import as_system
from ..systems.triangular import TriangularSystem
from .method import COMPUTE_OPTIONS, Method, as_method
from .convergence import Tolerance, finish
from .options import OptionError, refuse_misspelt_keywords, validate
from .registry import available, info
from .solution import ConvergenceError, Solution, Status

__all__ = ["Plan", "prepare", "solve", "get", "agreed", "judged"]


@dataclasses.dataclass
class Plan:
    """A method prepared for one matrix (:func:`prepare`); :meth:`solve` per right-hand side.

    Attributes
    ----------
    system : TriangularSystem
        The system the plan was prepared for (its right-hand side is the default).
    method : str
        The method's name.
    options : dict
        The options, checked once.
    prepare_time : float
        Seconds spent preparing (the matrix work).
    """

    system: Any
    method: str
    options: dict
    prepare_time: float
    _method: Method = dataclasses.field(repr=False)
    _state: Any = dataclasses.field(repr=False)
    _guard: Any = dataclasses.field(default=None, repr=False)

    def solve(self, rhs: Any = None, *, check: bool = False, progress: bool | str = False
              ) -> Solution:
        """Solve for ``rhs`` (default: the system's own), in the system's form and shape.

        A matrix shared by all samples takes any number of columns. ``check``
        raises :class:`~propop.ConvergenceError` on failure; ``progress`` shows a
        bar over the method's callbacks (:mod:`propop.progress`).
        """
        extra = {k: self.options[k] for k in COMPUTE_OPTIONS
                 if k != "x0" and self.options.get(k) is not None}
        with bar(progress, self.options.get("maxiter"), self.method) as shown:
            if not isinstance(shown, Silent) and self._method.takes("callback"):
                extra["callback"] = _advancing(shown, self.options.get("callback"))
            start = time.perf_counter()
            try:  # overflow is reported by the Solution's status, not by NumPy's warnings
                with backend.quiet(self.system.backend.xp):
                    problem, solution = self._solve(rhs, extra)
            except OptionError as error:
                raise OptionError(f"{self.method}: {error}") from None
            elapsed = time.perf_counter() - start
        exact = _approximated(problem)
        solution = judged(problem.system, exact, _as_solution(self.method, solution),
                          self.options)
        solution = dataclasses.replace(solution, x=problem.postprocess(solution.x),
                                       time=elapsed, method=self.method)
        if check and not solution.converged:
            raise ConvergenceError(solution)
        return solution

    def _solve(self, rhs: Any, extra: dict) -> tuple[Problem, Solution]:
        """``(problem, solution)`` for ``rhs``; under MPI, every check agreed on by all ranks."""
        def system() -> Any:
            return self.system if rhs is None else self.system.with_rhs(rhs)

        def compute(made: Any, given: dict) -> tuple[Problem, Solution]:
            problem = make_system(made, self.options.get("x0"))
            own = dict(given, x0=problem.x0) if problem.x0 is not None or \
                self._method.names("x0") else dict(given)
            if own.get("callback") is not None:  # the caller's shape, as x is given back
                own["callback"] = _postprocessed(problem, own["callback"])
            return problem, self._method.compute(self._state, problem.system, **own)

        if self._guard is None:
            return compute(system(), extra)
        options = {**self.options, **extra}  # under MPI the right-hand side is agreed on
        made, (problem, solution) = self._guard.solve(
            self.method, system, options,
            lambda made: compute(made, {k: options[k] for k in ("callback",)  # the agreed one
                                        if options.get(k) is not None}))
        return problem, solution


def prepare(system: Any, method: str | Callable[..., Solution] | Method = "substitution",
            **options: Any) -> Plan:
    """Check the options and run ``method``'s ``init`` on the matrix of ``system``, once.

    Parameters
    ----------
    system : TriangularSystem
    method : str, Method or callable
        A registered name (see :func:`propop.solvers.available`), a
        :class:`~.method.Method` or a solver function.
    **options
        The method's options (``rtol``, ``maxiter``, ...), checked here.

    Returns
    -------
    Plan
        ``plan.solve(rhs)`` for any right-hand side of this matrix.
    """
    system = _as_system(system, options)
    guard = None
    if isinstance(method, str):
        solver = info(method)
        solver.require_available()
        if system.backend.name not in solver.backends:
            here = [s.name for s in available() if system.backend.name in s.backends]
            raise ValueError(f"solver {method!r} runs on {', '.join(solver.backends)} arrays, "
                             f"but the system's are {system.backend.name} arrays; on those "
                             f"use one of {', '.join(here)}, or move the system with "
                             ".to('numpy')")
        name, runner, guard = method, solver.method, solver.guard
    else:
        runner = _runner(method)
        name = getattr(runner, "name", None) or getattr(method, "__name__", None) or \
            type(runner).__name__
    start = time.perf_counter()
    own = {k: v for k, v in options.items() if k not in COMPUTE_OPTIONS}

    def init() -> Any:  # a solve's true residual applies the operator: built here, once
        operator = make_system(system).system.operator_of
        with backend.quiet(system.backend.xp):
            state = runner.init(operator, **own)
        if runner.applies(state):
            operator.ready()
        return state

    try:
        if guard is None:
            validate(name, runner, system, options)
            state = init()
        else:  # a communicating method: every rank agrees on the checks and the init
            state = guard.init(name, system, options,
                               lambda: validate(name, runner, system, options), init)
    except OptionError as error:
        raise OptionError(f"{name}: {error}") from None
    return Plan(system, name, dict(options), time.perf_counter() - start, runner, state, guard)


def check_keywords(caller: Any, method: Any, options: dict) -> None:
    """``options`` that ``caller`` passes on to ``method``: none a misspelt keyword of its own.

    (:func:`~.options.refuse_misspelt_keywords`); an unknown method is left to the solve.
    """
    if not options:  # the common call: nothing passed on
        return
    try:
        runner = info(method).method if isinstance(method, str) else _runner(method)
    except (KeyError, ValueError, TypeError):
        return
    refuse_misspelt_keywords(f"pp.{caller.__name__}", _keywords(caller), runner, options)


@functools.lru_cache(maxsize=16)
def _keywords(caller: Callable) -> tuple:
    """The names of ``caller``'s own keywords, read once."""
    return tuple(p for p in inspect.signature(caller).parameters if p not in ("options",))


def _runner(method: Any) -> Method:
    """A :class:`~.method.Method` for ``method``; a SciPy, CuPy or PyAMG solver adapted.

    ``method=scipy.sparse.linalg.gcrotmk`` works as ``method="scipy.gcrotmk"``
    (:func:`~.iterative.adapters.adapt`); the libraries are imported only then.
    """
    module = (getattr(method, "__module__", None) or "").split(".")[0]
    if callable(method) and not isinstance(method, (Method, type)) and \
            module in ("scipy", "cupyx", "pyamg"):
        from .iterative.adapters import adapt

        return adapt(method)
    return as_method(method)


def get(name: str) -> Callable[..., Solution]:
    """A function solving with method ``name``: ``get(name)(system, **options)``.

    The same as ``propop.solve(system, name, **options)``; ``KeyError`` lists the
    known names.
    """
    description = info(name).description

    def method(system: Any, **options: Any) -> Solution:
        return solve(system, name, **options)

    method.__name__, method.__doc__ = name, description
    return method


def _approximated(problem: Problem) -> Any:
    """The true system of an approximate one, canonical as ``problem``'s; ``False``/``None``."""
    exact = problem.caller.approximates
    return exact if not exact else make_system(exact).system


def _as_system(system: Any, options: dict) -> Any:
    """A :class:`~propop.TriangularSystem` as it is; a plain matrix with ``b`` wrapped."""
    if isinstance(system, TriangularSystem):
        if "b" in options:
            raise OptionError("b is the right-hand side of a plain matrix; a TriangularSystem "
                              "holds its own (system.with_rhs(b) for another)")
        return system
    if backend.is_matrix_like(system):
        return as_system(system, options.pop("b", None))
    raise TypeError(f"pp.solve takes a TriangularSystem (pp.backward_system, "
                    f"pp.forward_system, or pp.TriangularSystem(...)) or a triangular "
                    f"scipy.sparse matrix with b=..., got {type(system).__name__}")


def _as_solution(method: str, solution: Any) -> Solution:
    """``solution`` if it is one; a method that returns something else is named."""
    if not isinstance(solution, Solution):
        raise TypeError(f"solver {method!r} returned a {type(solution).__name__}, not a "
                        "propop Solution (build one with propop.solvers.convergence.finish)")
    return solution


def judged(system: Any, exact: Any, solution: Solution, options: dict) -> Solution:
    """Every CONVERGED checked against the true residual, once.

    As docs/index.md, "What CONVERGED promises", says.

    A method that judged its own result by :func:`~.convergence.finish` (every
    method of propop's) is taken as it is; a user's method claiming convergence
    is judged here, and its result is ``INACCURATE`` where it misses the
    tolerance. An approximate system (``exact``, from :meth:`TriangularSystem.shared`
    with ``how="mean"``) is judged against the true one: ``APPROXIMATE`` unless
    the answer meets the true system's tolerance.
    """
    rtol, atol = options.get("rtol"), options.get("atol", 0.0)
    if solution.converged and not solution.info.get("verified"):
        x = solution.x
        if tuple(getattr(x, "shape", ())) != tuple(system.rhs.shape):
            raise TypeError(f"the method returned x of shape {getattr(x, 'shape', None)}, "
                            f"expected the right-hand side's {tuple(system.rhs.shape)}")
        solution = dataclasses.replace(finish(
            system, x, tol=Tolerance.of(system, rtol, atol), iterations=solution.iterations,
            levels=solution.levels, info=solution.info, direct=True), method=solution.method)
    if exact is None or solution.status not in (Status.CONVERGED, Status.INACCURATE):
        return solution
    if exact is False:
        return dataclasses.replace(solution, status=Status.APPROXIMATE, message=(
            "solved the batch-mean approximation (B.shared('mean')); not judged against the "
            "true system, which has another number of samples"))
    truth = finish(exact, solution.x, tol=Tolerance.of(exact, rtol, atol),
                   iterations=solution.iterations, levels=solution.levels, direct=True)
    if truth.converged:
        return dataclasses.replace(solution, residuals=truth.residuals, info={
            **solution.info, "true_residual": truth.residuals[-1]})
    worst = float(np.max(truth.info["block_ratios"]))
    return dataclasses.replace(solution, status=Status.APPROXIMATE, residuals=truth.residuals,
                               info={**solution.info, "true_residual": truth.residuals[-1],
                                     "true_block_ratio": worst},
                               message=(
        f"solved the batch-mean approximation (B.shared('mean')) of the system: the true "
        f"system's residual is {truth.residuals[-1]:.2e}, its worst block {worst:.1e} times "
        f"its bound at rtol={truth.info['rtol']:.1e}; solve the system itself with a "
        "batched method for the exact answer"))


def _postprocessed(problem: Problem, callback: Callable) -> Callable[[Any], None]:
    """``callback`` called with the iterate in the caller's shape (:meth:`Problem.postprocess`)."""
    return lambda x: callback(problem.postprocess(x))


def _advancing(shown: Any, callback: Callable | None) -> Callable[[Any], None]:
    """A callback that advances the bar, then calls the user's ``callback``."""
    def advance(x: Any) -> None:
        shown.update()
        if callback is not None:
            callback(x)

    return advance


def solve(system: Any, method: str | Callable[..., Solution] = "substitution", *,
          check: bool = False, progress: bool | str = False, **options: Any) -> Solution:
    """Solve ``system`` with the method named ``method`` and time it: ``prepare(...).solve()``.

    Parameters
    ----------
    system : TriangularSystem
    method : str or callable
        A registered name (see :func:`propop.solvers.available`) or a solver function.
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

    Returns
    -------
    Solution
        ``x``, ``status`` (``converged``), ``message``, ``iterations``,
        ``residuals``, ``levels``, ``info`` and ``time`` (the matrix work of
        :func:`prepare` included).

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
    plan = prepare(system, method, **options)
    solution = plan.solve(progress=progress)  # check after the time is complete
    solution = dataclasses.replace(solution, time=solution.time + plan.prepare_time)
    if check and not solution.converged:
        raise ConvergenceError(solution)
    return solution


def agreed(method: Any, options: dict, work: Callable[[], Any]) -> Any:
    """``work()``; for a method that communicates, its failure on one rank raised on all.

    A forward pass or a system that fails on one MPI rank only (that rank's bad
    input, say) must not leave the others waiting in the solve
    (:mod:`propop.distributed.guard`). An unknown name is left to the solve to name.
    """
    try:
        guard = info(method).guard if isinstance(method, str) else None
    except KeyError:
        guard = None
    return work() if guard is None else guard.prepare(options, work)
