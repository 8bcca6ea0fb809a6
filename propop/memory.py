"""The memory budget: methods that form large blocks estimate their peak before allocating.

Cyclic reduction forms a reduced block per sample and pair of layers, SciPy's
triangular solve an explicit matrix of every sample, GMRES a Krylov basis of
``restart`` vectors: on a wide network or a long sequence these exceed the
machine before the first level ends. Each such method computes its peak from
shapes alone (:mod:`propop.solvers.reduction.footprint`) and calls :func:`require`, which
raises :class:`MemoryBudgetError` (estimate, budget, a cheaper method) above the
budget instead of letting the operating system kill the process.

The budget is, in order: what :func:`set_budget` (or :func:`limit`) set; the
environment variable ``PROPOP_MEMORY_BUDGET`` (bytes, or a fraction such as
``0.8`` of the available memory); half of the memory available now.

Examples
--------
>>> import propop as pp
>>> with pp.memory.limit(10**6):
...     pp.memory.budget()
1000000
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

__all__ = ["MemoryBudgetError", "available", "budget", "set_budget", "limit", "fits", "require",
           "require_arrays"]

DEFAULT_FRACTION = 0.5
SMALL = 2**24  # estimates below 16 MiB pass without a look at the available memory
ENVIRONMENT = "PROPOP_MEMORY_BUDGET"
_budget: float | None = None


class MemoryBudgetError(MemoryError):
    """A method would need more memory than the budget; raised before it allocates.

    Attributes
    ----------
    estimate, budget : int
        The estimated peak and the budget, in bytes.
    advice : dict
        Options of the same method that would fit, where it knows them
        (``{"chunk_size": k}`` for cyclic reduction of a batch); empty otherwise.
    """

    def __init__(self, message: str, estimate: int, budget: int,
                 advice: dict | None = None) -> None:
        super().__init__(message)
        self.estimate, self.budget, self.advice = estimate, budget, dict(advice or {})


def available() -> int:
    """Bytes of memory available now (``MemAvailable`` on Linux, free pages elsewhere)."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # no way to tell: no limit
        return 2**62


def _resolve(value: float) -> int:
    """Bytes from a budget given as bytes (> 1) or as a fraction of the available memory."""
    return int(value * available()) if 0 < value <= 1 else int(value)


def _check(value: float, where: str) -> float:
    if not value > 0 or value == float("inf"):
        raise ValueError(f"{where}: a memory budget is a number of bytes or a fraction in "
                         f"(0, 1] of the available memory, got {value!r}")
    return float(value)


def budget() -> int:
    """The memory budget in bytes (see the module docstring for where it comes from)."""
    if _budget is not None:
        return _resolve(_budget)
    setting = os.environ.get(ENVIRONMENT)
    if setting:
        try:
            value = float(setting)
        except ValueError:
            raise ValueError(f"{ENVIRONMENT}={setting!r} is not a number") from None
        return _resolve(_check(value, ENVIRONMENT))
    return _resolve(DEFAULT_FRACTION)


def set_budget(value: float | None) -> None:
    """Set the budget: bytes, a fraction of the available memory, or ``None`` for the default.

    A value in ``(0, 1]`` is a fraction of the memory available when a method
    checks; a larger one is a number of bytes.
    """
    global _budget
    _budget = None if value is None else _check(value, "set_budget")


@contextlib.contextmanager
def limit(value: float | None) -> Iterator[None]:
    """:func:`set_budget` inside a ``with`` block only."""
    global _budget
    previous = _budget
    set_budget(value)
    try:
        yield
    finally:
        _budget = previous


def _size(nbytes: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{int(nbytes)} bytes"


def require_arrays(entries: float, itemsize: int, what: str, cheaper: str) -> None:
    """:func:`require` for ``entries`` floats of ``itemsize`` bytes, checked before allocating.

    For networks, traces and systems, whose sizes are products of user input
    (``layers * width**2``): one look at the product, no allocation.
    """
    require(int(entries) * int(itemsize), what, cheaper)


def fits(estimate: int) -> bool:
    """Whether ``estimate`` bytes are within the budget.

    Below :data:`SMALL` with no budget set, without reading the available memory
    (a file read on Linux: 35 us, a tenth of ``method="auto"``'s choice).
    """
    if estimate <= SMALL and _budget is None and ENVIRONMENT not in os.environ:
        return True
    return estimate <= budget()


def require(estimate: int, what: str, cheaper: str, advice: dict | None = None) -> None:
    """Raise :class:`MemoryBudgetError` if ``estimate`` bytes exceed the budget.

    ``what`` names the method and its blocks, ``cheaper`` what to use instead,
    ``advice`` the method's options that would fit (kept on the error).
    """
    if not fits(estimate):
        allowed = budget()
        raise MemoryBudgetError(
            f"{what} would need about {_size(estimate)} at its peak, over the memory budget "
            f"of {_size(allowed)} (propop.memory.set_budget or {ENVIRONMENT} change it); "
            f"{cheaper}", estimate, allowed, advice)
