"""Solver registry and the built-in methods (DESIGN section 3)."""

from . import auto as _auto  # noqa: F401  (registers its methods)
from . import batched_krylov as _batched_krylov  # noqa: F401
from . import bicgstab as _bicgstab  # noqa: F401
from . import block_krylov as _block_krylov  # noqa: F401
from . import cyclic_reduction as _cyclic_reduction  # noqa: F401
from . import hybrid as _hybrid  # noqa: F401
from . import direct as _direct  # noqa: F401
from . import krylov as _krylov  # noqa: F401
from . import stationary as _stationary  # noqa: F401
from .diagnostics import (Decay, Dominance, diagonal_dominance, explain, jacobian_decay,
                          nilpotency_index)
from .preconditioners import PRECONDITIONERS
from .plan import Plan, prepare
from .registry import KINDS, SolverInfo, available, get, info, register, solve
from .solution import ConvergenceError, Solution, Status

__all__ = [
    "register", "get", "info", "available", "solve", "prepare", "Plan", "SolverInfo", "KINDS",
    "Solution", "Status", "ConvergenceError", "Dominance", "diagonal_dominance",
    "nilpotency_index", "Decay", "jacobian_decay", "explain", "PRECONDITIONERS",
]
