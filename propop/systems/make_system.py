"""The door of every solve: a system made canonical once, the caller's shapes restored once.

As SciPy's ``make_system`` in ``scipy.sparse.linalg._isolve.utils``: everything a
method could otherwise branch on is settled here, before it runs. A method's
``compute`` receives a :class:`~propop.TriangularSystem` in the **scaled form**
(unit diagonal) whose right-hand side is **2-D**, ``(N, c)`` (one vector is one
column of an operator whose scalings have a column axis too), checked finite, of
the operator's dtype and backend, and an ``x0`` of the same shape or ``None``.
:meth:`Problem.postprocess` gives a solution back in the shape the caller used.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .._checks import require_finite, require_shape
from .triangular import TriangularSystem

__all__ = ["Problem", "make_system"]


@dataclass(frozen=True)
class Problem:
    """A system ready for a method, and how to give its solution back.

    Attributes
    ----------
    system : TriangularSystem
        Scaled form, right-hand side ``(N, c)``.
    x0 : array or None
        The initial guess, ``(N, c)``.
    vector : bool
        Whether the caller gave one vector ``(N,)``.
    caller : TriangularSystem
        The system as the caller gave it.
    """

    system: TriangularSystem
    x0: Any
    vector: bool
    caller: TriangularSystem

    def postprocess(self, x: Any) -> Any:
        """``x`` ``(N, c)`` in the caller's shape: ``(N,)`` for one vector."""
        return x[:, 0] if self.vector else x


def make_system(system: TriangularSystem, x0: Any = None) -> Problem:
    """``system`` (any form, a vector or a batch) and ``x0`` as a :class:`Problem`.

    ``system`` has been checked where it was made (its right-hand side finite and
    of its dtype); ``x0`` is checked here: its shape, finiteness and type.
    """
    vector = system.nrhs is None
    op = system.operator_of.scaled().batch
    rhs = system._scaled_rhs[:, None] if vector else system._scaled_rhs
    canonical = TriangularSystem.of(op, rhs, system.rhs_support, check=False)  # checked
    if x0 is not None:
        xp = op.backend.xp
        x0 = xp.asarray(x0)
        require_shape(x0, tuple(system._scaled_rhs.shape), "x0", " (the rhs's shape)")
        require_finite(x0, "x0")
        x0 = xp.asarray(x0, dtype=system.dtype, copy=True)
        x0 = x0[:, None] if vector else x0
    return Problem(canonical, x0, vector, system)
