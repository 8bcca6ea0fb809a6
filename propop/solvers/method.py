"""What a method is: ``init(operator, **options) -> state``, ``compute(state, system, ...)``.

As lineax's ``AbstractLinearSolver`` (docs/architecture.md): ``init`` does everything
that depends on the matrix alone (factorisations, reduced blocks, preconditioners,
partitions, the operators handed to SciPy) and returns it as the method's state;
``compute`` does only what depends on the right-hand side. :func:`propop.prepare`
is ``init``, :meth:`Plan.solve <propop.Plan.solve>` is ``compute``, so a plan
solves any number of right-hand sides for one matrix's work.

``compute`` receives what :func:`~propop.systems.make_system.make_system` made: a
system in the scaled form with a 2-D right-hand side ``(N, c)``, and ``x0`` of that
shape or ``None``. Its own parameters after ``(state, system)`` say which of
``x0`` and ``callback`` it takes; ``init``'s keyword parameters are the method's
options (``rtol``, ``atol``, ``maxiter`` and its own), checked by
:func:`~propop.solvers.options.validate` before ``init`` runs.

A plain function ``method(system, *, x0, rtol, atol, maxiter, callback, **own)
-> Solution`` (a user's, or a third party's) registers as it is: it becomes a
:class:`FunctionMethod`, whose ``init`` keeps the options and does nothing else.
"""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable
from typing import Any

from .solution import Solution

__all__ = ["Method", "FunctionMethod", "COMPUTE_OPTIONS", "as_method"]

COMPUTE_OPTIONS = ("x0", "callback")  # per right-hand side: given to compute, not to init


class Method:
    """A method by its two halves; subclasses define :meth:`init` and :meth:`compute`."""

    def init(self, operator: Any, **options: Any) -> Any:
        """The per-matrix work for ``operator`` (scaled form, 2-D): the method's state."""
        return options

    def compute(self, state: Any, system: Any, **extra: Any) -> Solution:
        """The per-right-hand-side work: the :class:`Solution` of ``system``."""
        raise NotImplementedError

    def applies(self, state: Any) -> bool:
        """Whether :meth:`compute` applies the operator (its iterations, its true residual).

        :func:`propop.prepare` then builds the operator's products once, after
        ``init``; a method whose blocks are its rows evaluated (substitution)
        says no, and its plan builds none.
        """
        return True

    @property
    def parameters(self) -> list[inspect.Parameter]:
        """The options the method takes: ``init``'s keywords, then ``compute``'s."""
        return list(_parameters(self.init)[1:] + _parameters(self.compute)[2:])

    def hints(self) -> dict:
        """The options' evaluated annotations (``init``'s and ``compute``'s)."""
        return {**typing.get_type_hints(self.init), **typing.get_type_hints(self.compute)}

    def takes(self, name: str) -> bool:
        """Whether ``compute`` takes ``name`` (``x0``, ``callback``), by name or ``**``."""
        return self.names(name) or any(p.kind is p.VAR_KEYWORD for p in self._computed)

    def names(self, name: str) -> bool:
        """Whether ``compute`` names ``name`` among its parameters."""
        return any(p.name == name for p in self._computed)

    @property
    def _computed(self) -> list[inspect.Parameter]:
        return list(_parameters(self.compute)[2:])


class FunctionMethod(Method):
    """A plain function ``method(system, **options) -> Solution`` as a method: an empty init."""

    def __init__(self, function: Callable[..., Solution]) -> None:
        self.function = function
        self.__doc__ = function.__doc__
        self.__name__ = getattr(function, "__name__", "custom")

    def init(self, operator: Any, **options: Any) -> dict:
        """Nothing per matrix: the options are kept for each solve."""
        return options

    def compute(self, state: dict, system: Any, **extra: Any) -> Solution:
        """The function on ``system`` with the options and ``x0``/``callback``."""
        return self.function(system, **state, **extra)

    @property
    def parameters(self) -> list[inspect.Parameter]:
        """The function's parameters after the system."""
        return list(_parameters(self.function)[1:])

    def hints(self) -> dict:
        """The function's evaluated annotations."""
        return typing.get_type_hints(self.function)

    @property
    def _computed(self) -> list[inspect.Parameter]:
        return self.parameters


def _parameters(function: Callable) -> tuple[inspect.Parameter, ...]:
    """``function``'s parameters, read once per function (a signature takes about 10 us)."""
    try:
        return _read_parameters(function)
    except TypeError:  # an unhashable callable
        return tuple(inspect.signature(function).parameters.values())


@functools.lru_cache(maxsize=256)
def _read_parameters(function: Callable) -> tuple[inspect.Parameter, ...]:
    return tuple(inspect.signature(function).parameters.values())


def as_method(candidate: Any) -> Method:
    """A :class:`Method`: itself, an instance of a Method class, or a wrapped function."""
    if isinstance(candidate, Method):
        return candidate
    if isinstance(candidate, type) and issubclass(candidate, Method):
        return candidate()
    if callable(candidate):
        return FunctionMethod(candidate)
    raise TypeError(f"a method is a propop.solvers.method.Method or a function "
                    f"method(system, **options) -> Solution, got {type(candidate).__name__}")
