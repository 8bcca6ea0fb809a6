"""The solvers: a registry of methods by name, plans, and the stopping rule (docs/architecture.md).

Methods live in ``direct/``, ``reduction/``, ``iterative/`` and ``selection/``; the
registry imports a method's module when the method is first asked for. The names
below resolve on first use (PEP 562).
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    **dict.fromkeys(("register", "unregister", "info", "available", "names", "SolverInfo",
                     "KINDS", "BUILTIN"), "propop.solvers.registry"),
    **dict.fromkeys(("solve", "prepare", "Plan", "get"), "propop.solvers.plan"),
    "Method": "propop.solvers.method",
    "adapt": "propop.solvers.iterative.adapters",
    **dict.fromkeys(("Solution", "Status", "ConvergenceError"), "propop.solvers.solution"),
    "PRECONDITIONERS": "propop.solvers.options",
    **dict.fromkeys(("Decay", "Dominance", "diagonal_dominance", "explain", "jacobian_decay",
                     "nilpotency_index"), "propop.solvers.selection.diagnostics"),
}

__all__ = [
    "register", "unregister", "adapt", "get", "info", "available", "solve", "prepare", "Plan",
    "SolverInfo", "KINDS", "Method",
    "Solution", "Status", "ConvergenceError", "Dominance", "diagonal_dominance",
    "nilpotency_index", "Decay", "jacobian_decay", "explain", "PRECONDITIONERS",
]


def __getattr__(name: str) -> Any:
    """A public name, imported from its module on first use."""
    if name in _WHERE:
        value = getattr(importlib.import_module(_WHERE[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
