"""Damped Newton for the forward pass of a recurrence: Levenberg-Marquardt, as in ELK.

After Gonzalez et al., "Towards Scalable and Stable Parallelization of Nonlinear
RNNs" (NeurIPS 2024). Newton's step (DEER) solves the linearised recurrence
``h_s - A_s h_{s-1} = c_s`` exactly; far from the solution it can overshoot. The
Levenberg-Marquardt step instead minimises

    ``sum_s ||h_s - A_s h_{s-1} - c_s||^2 + lambda ||h_s - g_s||^2``

around the current iterate ``g``: its normal equations are block tridiagonal::

    -A_s h_{s-1} + ((1 + lambda) I + A_{s+1}^T A_{s+1}) h_s - A_{s+1}^T h_{s+1}
        = c_s - A_{s+1}^T c_{s+1} + lambda g_s

solved by block cyclic reduction (:mod:`.tridiagonal`, ``ceil(log2 tau)``
levels). ELK keeps ``lambda`` fixed (its Kalman smoother's prior); here each
sample's ``lambda`` follows Marquardt's schedule: a step that lowers the merit
``sum_s ||h_s - F(h_{s-1}, x_s)||^2`` is taken and ``lambda`` divided by
``factor``, one that does not is refused and ``lambda`` multiplied, so the
iteration becomes Newton's near the solution and stays stable far from it.
``A`` is the Jacobian (``"damped"``, ELK) or its diagonal (``"quasi-damped"``,
quasi-ELK): then every block of the normal equations is diagonal and each state
component of each sample is its own scalar tridiagonal system, reduced as ``r n``
"samples" of ``1 x 1`` blocks by the same code (``O(tau r n)``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import backend
from ..networks.trace import Trace
from ..solvers.reduction.tridiagonal import block_tridiagonal

__all__ = ["damped_newton", "DAMPED"]

DAMPED = {"damped": "newton", "quasi-damped": "quasi"}


def damped_newton(net: Any, xs: Any, trace: Trace, linearization: str, damping: float,
                  factor: float = 10.0) -> tuple[Trace, dict]:
    """One Levenberg-Marquardt step from ``trace``; returns the new trace and what it did.

    ``damping`` is each sample's ``lambda`` (scalar or ``(r,)``); the returned
    ``info`` holds the next ``"damping"``, which samples ``"accepted"`` the
    step, and the reduction's ``"levels"``.
    """
    A, c = net.linearized(xs, trace, DAMPED[linearization], diagonal=True)
    xp, device = backend.namespace(A), backend.device(A)
    H = xp.moveaxis(trace.z[1], 1, 2) if xs.ndim == 3 else trace.z[1][:, None, :]
    tau, r, n = H.shape
    lam = xp.astype(backend.like(np.broadcast_to(backend.to_host(damping) if hasattr(
        damping, "shape") else np.asarray(damping), (r,)).copy(), A), A.dtype)
    rows, G = lam, H  # the systems' samples: (tau, r, n, n) blocks, or r n of 1 x 1
    if A.ndim == 3:  # (tau, r, n) diagonals: each component its own scalar system
        A = xp.reshape(A, (tau, r * n, 1, 1))
        c, G = (xp.reshape(a, (tau, r * n, 1)) for a in (c, H))
        rows = xp.reshape(xp.broadcast_to(lam[:, None], (r, n)), (r * n,))
    after = xp.concat([A[1:, ...], xp.zeros_like(A[:1, ...])])  # A_{s+1}, zero after the last
    after_t = xp.matrix_transpose(after)
    eye = xp.eye(A.shape[2], dtype=A.dtype, device=device)
    D = (1 + rows)[None, :, None, None] * eye + after_t @ after
    c_after = xp.concat([c[1:, ...], xp.zeros_like(c[:1, ...])])
    f = c - (after_t @ c_after[..., None])[..., 0] + rows[None, :, None] * G
    candidate_states, levels = block_tridiagonal(-A, D, -after_t, f)
    candidate_states = xp.reshape(candidate_states, (tau, r, n))
    candidate = net.trace_from_states(xs, [None, _layout(xp, candidate_states, xs)])
    accepted = net.merit(candidate) < net.merit(trace)
    states = xp.where(accepted[None, :, None], candidate_states, H)
    new = net.trace_from_states(xs, [None, _layout(xp, states, xs)])
    return new, {"damping": xp.where(accepted, lam / factor, lam * factor),
                 "accepted": accepted, "levels": levels}


def _layout(xp: Any, states: Any, xs: Any) -> Any:
    """``(tau, r, n)`` states as the recurrence's sequence layout."""
    return backend.contiguous(xp.moveaxis(states, 1, 2)) if xs.ndim == 3 else states[:, 0, :]
