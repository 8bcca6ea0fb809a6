"""Systems of recurrences (:class:`~propop.networks.recurrence.Recurrence`): chains over time.

Block ``s`` is the state (forward) or its adjoint ``v_s = dE/dh_s`` (backward) at
step ``s``; the couplings are the per-step, per-sample Jacobians, stacked
``(tau - 1, r, n, n)`` (``(tau - 1, n, n)`` for one sample), never unrolled.
"""

from __future__ import annotations

from typing import Any

from .. import backend
from .._checks import real_array, require_finite
from ..networks.recurrence import Recurrence
from ..networks.trace import Trace
from .builders import backward_system, forward_system
from .triangular import TriangularSystem

__all__: list[str] = []


def _names(letter: str) -> Any:
    return lambda s: f"{letter}[{s}] (step {s})"


def _chain(net: Recurrence, coupling: Any, rhs: Any, lower: bool, letter: str, form: str,
           batch: bool) -> TriangularSystem:
    """The chain of ``tau`` blocks: ``coupling`` ``(tau - 1, r, n, n)``, ``rhs`` ``(tau, n, r)``."""
    tau, n = rhs.shape[:2]
    stack = coupling if batch else coupling[:, 0, ...]
    rhs = net.backend.xp.reshape(rhs, (tau * n,) + tuple(rhs.shape[2:]))
    return TriangularSystem(None, None, rhs, lower=lower, sizes=[n] * tau, form=form,
                            names=_names(letter), coupling_stack=stack)


@backward_system.register
def _recurrence_backward(net: Recurrence, trace: Trace, eps: Any, *, form: str = "scaled"
                         ) -> TriangularSystem:
    """``v_s - J_{s+1}^T v_{s+1} = eps_s``: backpropagation through time as a chain."""
    h = trace.z[1]
    eps = real_array(eps, "eps", net.dtype)
    if tuple(eps.shape) != tuple(h.shape):
        raise ValueError(f"eps has shape {tuple(eps.shape)}, expected the states' "
                         f"{tuple(h.shape)}")
    require_finite(eps, "eps")
    J = net.jacobians_along(trace)
    return _chain(net, net.backend.xp.matrix_transpose(J[1:, ...]), eps, False, "v", form,
                  eps.ndim == 3)


@forward_system.register
def _recurrence_forward(net: Recurrence, xs: Any, around: Any = None, *,
                        linearization: str = "newton", form: str = "scaled"
                        ) -> TriangularSystem:
    """``h_s - A_s h_{s-1} = F(h_{s-1}^(i), x_s) - A_s h_{s-1}^(i)`` around ``around``."""
    xs = net.check_input(xs)
    A, c = net.linearized(xs, around if isinstance(around, Trace) else None, linearization,
                          diagonal=True)
    xp = net.backend.xp
    rhs = (backend.contiguous(xp.permute_dims(c, (0, 2, 1))) if xs.ndim == 3 else c[:, 0, :])
    if A.ndim == 3:  # quasi: the Jacobians' diagonals scale identity couplings, O(tau r n)
        tau, n = rhs.shape[:2]
        D = backend.contiguous(xp.permute_dims(A[1:, ...], (0, 2, 1))) if xs.ndim == 3 \
            else A[1:, 0, :]
        return TriangularSystem(None, None, xp.reshape(rhs, (tau * n,) + tuple(rhs.shape[2:])),
                                lower=True, sizes=[n] * tau, form=form, names=_names("h"),
                                coupling_stack="identity", scale_stack=D)
    return _chain(net, A[1:, ...], rhs, True, "h", form, xs.ndim == 3)
