"""Options checked once, at the registry's front door (docs/architecture.md, "Adding a method").

:func:`validate` runs before any method does: every option must be a parameter
of the method's function (no method takes ``**ignored``), of the type its
annotation names (``int``, ``float``, ``bool``, ``str``, a ``Literal`` of
choices, ``None``), and the options every method shares (``rtol``, ``atol``,
``maxiter``, ``x0``, ``callback``, ``M``) must make sense. Messages name the
method and the option; an unknown name gets SciPy's ``difflib`` suggestion.

A method's own range checks (``restart >= 1``, say) raise :class:`OptionError`,
which :func:`propop.solve` prefixes with the method's name.
"""

from __future__ import annotations

import difflib
import functools
import math
import numbers
import types
import typing
from typing import Any

from .._checks import require_finite

__all__ = ["OptionError", "validate", "check_options", "check_spec", "PRECONDITIONERS"]

COMMON = ("x0", "rtol", "atol", "maxiter", "callback", "M")
PRECONDITIONERS = ("diagonal", "block-jacobi", "air")


def check_spec(spec: Any) -> tuple[str, dict] | None:
    """``(name, options)`` of a named spec, ``None`` for none or a function; else ``ValueError``."""
    if spec is None or callable(spec):
        return None
    name, options = spec if isinstance(spec, tuple) and len(spec) == 2 else (spec, {})
    if not isinstance(name, str) or name not in PRECONDITIONERS or not isinstance(options, dict):
        raise ValueError(f"unknown preconditioner {spec!r}; choose one of {PRECONDITIONERS}, "
                         "a (name, {options}) tuple or a function R -> M^{-1} R")
    return name, options



class OptionError(ValueError):
    """A bad option value; :func:`propop.solve` prefixes the method's name."""


def check_options(rtol: float | None, atol: float, maxiter: int | None) -> None:
    """Raise :class:`OptionError` with an actionable message for bad shared options."""
    if rtol is not None and not (_real(rtol) and 0 <= rtol < 1):
        raise OptionError(f"rtol must be a number in [0, 1), got {rtol!r}")
    if not (_real(atol) and 0 <= atol < math.inf):
        raise OptionError(f"atol must be a finite number >= 0, got {atol!r}")
    if maxiter is not None and not (_integer(maxiter) and maxiter >= 1):
        raise OptionError(f"maxiter must be an integer >= 1, got {maxiter!r}")


def _real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) \
        and not math.isnan(value)


def _integer(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def validate(name: str, method: Any, system: Any, options: dict) -> None:
    """Raise ``TypeError``/``ValueError`` naming ``name`` and the option unless all are good.

    ``method`` is a :class:`~propop.solvers.method.Method`: its options are its
    ``init``'s and ``compute``'s parameters (a function's, for a plain function).
    """
    known, open_ended, hints = _options_of(method)
    for key in options:
        if key not in known and not open_ended:
            listed = ", ".join(known) if known else "none"
            raise TypeError(f"{name} has no option {key!r}{_suggestion(key, known)}; its "
                            f"options are {listed}")
    for key, value in options.items():
        if key in hints:
            _check_type(name, key, value, hints[key])
    try:
        check_options(options.get("rtol"), options.get("atol", 0.0), options.get("maxiter"))
    except OptionError as error:
        raise ValueError(f"{name}: {error}") from None
    _check_common(name, system, options)


def refuse_misspelt_keywords(caller: str, own: Any, method: Any, options: dict) -> None:
    """A keyword of ``caller`` misspelt, named as that, not as an unknown solver option.

    ``caller`` (``pp.train``, ``pp.forward``) passes the keywords it does not take to
    the solver ``method`` (a :class:`~propop.solvers.method.Method`); a key that
    method does not take but that is close to one of ``own`` (the caller's keyword
    names) raises here: ``pp.train(..., epoch=2)`` said that the substitution has no
    option ``'epoch'``.
    """
    known = _options_of(method)[0]
    listed = ", ".join(known) if known else "none"
    for key in (k for k in options if k not in known):  # a solver's option passes at once
        close = difflib.get_close_matches(key, list(own), n=1, cutoff=0.8)
        if close:
            raise TypeError(f"{caller} has no keyword {key!r} (did you mean {close[0]!r}?); "
                            f"its other keywords go to the solver, whose options are "
                            f"{listed}")


def _suggestion(key: str, known: list) -> str:
    close = difflib.get_close_matches(key, list(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


@functools.lru_cache(maxsize=256)
def _options_of(method: Any) -> tuple[tuple, bool, dict]:
    """``(option names, takes any **options, evaluated annotations)``, read once a method."""
    parameters = method.parameters
    open_ended = any(p.kind is p.VAR_KEYWORD for p in parameters)
    known = tuple(p.name for p in parameters
                  if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD))
    try:
        hints = method.hints()
    except Exception:  # a user's function with annotations we cannot resolve
        hints = {}
    return known, open_ended, hints


def _check_type(name: str, key: str, value: Any, hint: Any) -> None:
    allowed = _alternatives(hint)
    if allowed is None or any(_fits(value, kind) for kind in allowed):
        return
    if isinstance(value, numbers.Real) and math.isnan(value):
        raise ValueError(f"{name}: option {key} is NaN")
    choices = [c for kind in allowed if typing.get_origin(kind) is typing.Literal
               for c in typing.get_args(kind)]
    if choices:
        extra = ["None"] if type(None) in allowed else []
        raise ValueError(f"{name}: option {key}={value!r} must be one of "
                         f"{', '.join([repr(c) for c in choices] + extra)}")
    words = " or ".join(_word(kind) for kind in allowed)
    raise TypeError(f"{name}: option {key}={value!r} must be {words}, got "
                    f"{type(value).__name__}")


def _alternatives(hint: Any) -> list | None:
    """The kinds a hint allows, or ``None`` for a hint not checked here (``Any``, classes)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        parts = [_alternatives(h) for h in typing.get_args(hint)]
        return None if any(p is None for p in parts) else [k for p in parts for k in p]
    if hint in (bool, int, float, str, type(None)) or typing.get_origin(hint) is typing.Literal:
        return [hint]
    return None


def _fits(value: Any, kind: Any) -> bool:
    if typing.get_origin(kind) is typing.Literal:
        return any(value == c and type(value) is type(c) for c in typing.get_args(kind))
    if kind is type(None):
        return value is None
    if kind is bool:
        return isinstance(value, bool) or type(value).__name__ == "bool_"
    if kind is int:
        return _integer(value)
    if kind is float:
        return _real(value)
    return isinstance(value, kind)


def _word(kind: Any) -> str:
    return {type(None): "None", bool: "a bool", int: "an integer", float: "a number",
            str: "a string"}.get(kind, str(kind))


def _check_common(name: str, system: Any, options: dict) -> None:
    """``x0`` shaped like the right-hand side and finite; ``callback`` callable; ``M`` known."""
    x0 = options.get("x0")
    if x0 is not None:
        shape = tuple(getattr(x0, "shape", ()))
        if shape != tuple(system.rhs.shape):
            raise ValueError(f"{name}: option x0 has shape {shape}, expected "
                             f"{tuple(system.rhs.shape)} (the right-hand side's)")
        if getattr(x0, "dtype", None) is None or x0.dtype.kind not in "fiub":
            raise TypeError(f"{name}: option x0 must be a real array, got dtype "
                            f"{getattr(x0, 'dtype', type(x0).__name__)}")
        require_finite(x0, f"{name}: option x0")
    callback = options.get("callback")
    if callback is not None and not callable(callback):
        raise TypeError(f"{name}: option callback must be callable, got "
                        f"{type(callback).__name__}")
    if options.get("M") is not None:
        try:
            check_spec(options["M"])
        except ValueError as error:
            raise ValueError(f"{name}: option M: {error}") from None
