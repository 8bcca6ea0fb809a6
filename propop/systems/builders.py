"""The two entry points that turn a network into a :class:`TriangularSystem`.

Each network kind registers its builders here (``functools.singledispatch`` on
the network's type), so ``backward_system(net, ...)`` works for every kind.
"""

from __future__ import annotations

import functools
from typing import Any

from .triangular import TriangularSystem

__all__ = ["backward_system", "forward_system"]


@functools.singledispatch
def backward_system(net: Any, trace: Any, eps: Any, *, form: str = "scaled") -> TriangularSystem:
    """The exact backward-propagation system ``R v = c`` (eq. back_prop_sys).

    Parameters
    ----------
    net : network
        An :class:`~propop.FNN` (other kinds register their own builders).
    trace : Trace
        The forward pass whose derivatives ``f'(y)`` fill the system.
    eps : array
        ``dE/dz^(l)``, shaped like ``trace.output`` (see :func:`propop.loss_gradient`).
    form : {"scaled", "paper"}
        Unit-diagonal form (default, always exists) or the paper's ``E`` blocks.
    """
    raise TypeError(f"no backward system for {type(net).__name__}; expected an FNN")


@functools.singledispatch
def forward_system(net: Any, x: Any, around: Any = None, *, linearization: str = "secant",
                   form: str = "scaled") -> TriangularSystem:
    """The linearised forward-propagation system ``L z = b`` (eq. forw_prop_sys).

    Parameters
    ----------
    net : network
        An :class:`~propop.FNN` (other kinds register their own builders).
    x : array
        The input, ``(n0,)`` or ``(n0, r)``.
    around : Trace or sequence of arrays, optional
        The point ``y`` each activation is linearised at; a :class:`~propop.Trace`
        or the list ``y[0..l-1]``. ``None`` linearises at ``y = 0``. Around the
        true trace the solution is the exact forward pass.
    linearization : {"secant", "newton"}
        ``f(y) ~= a y + beta`` with ``a = f(y)/y`` (the paper's) or ``a = f'(y)``.
    form : {"scaled", "paper"}
        Unit-diagonal form (default) or the paper's ``D`` blocks.
    """
    raise TypeError(f"no forward system for {type(net).__name__}; expected an FNN")
