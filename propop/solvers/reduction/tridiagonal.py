"""Block tridiagonal systems by odd-even cyclic reduction, batched over samples.

Written for propop (SciPy's banded solvers take scalar bands and one system at a
time). The damped Newton step of a recurrence (Levenberg-Marquardt, ELK) solves
normal equations ``(L^T L + lambda I) h = ...`` with ``L`` block bi-diagonal: a
block tridiagonal, symmetric positive definite system

    ``B_i x_{i-1} + D_i x_i + C_i x_{i+1} = f_i``,  ``i = 0..m-1``.

Odd-even reduction (Heller 1976) eliminates the odd blocks: for an even ``i``,
with ``a = B_i D_{i-1}^{-1}`` and ``c = C_i D_{i+1}^{-1}``,

    ``D_i' = D_i - a C_{i-1} - c B_{i+1}``, ``B_i' = -a B_{i-1}``, ``C_i' = -c C_{i+1}``,
    ``f_i' = f_i - a f_{i-1} - c f_{i+1}``,

then solves the even blocks the same way and recovers the odd ones,
``x_i = D_i^{-1} (f_i - B_i x_{i-1} - C_i x_{i+1})``: ``ceil(log2 m)`` levels of
batched solves and products. The chain is padded with identity blocks to a power
of two, which decouple (``C`` of the last block is zero).
"""

from __future__ import annotations

from typing import Any

from ... import backend

__all__ = ["block_tridiagonal"]


def block_tridiagonal(B: Any, D: Any, C: Any, f: Any) -> tuple[Any, int]:
    """Solve ``B_i x_{i-1} + D_i x_i + C_i x_{i+1} = f_i``; returns ``(x, levels)``.

    ``B``, ``D``, ``C`` are ``(m, r, n, n)`` (``B_0`` and ``C_{m-1}`` are not read),
    ``f`` is ``(m, r, n)``; samples ``r`` are a batch axis.
    """
    xp = backend.namespace(D)
    m = D.shape[0]
    B, D, C, f = _padded(xp, B, D, C, f)
    eliminated = []
    odd, even = slice(1, None, 2), slice(0, None, 2)
    while D.shape[0] > 1:
        solved = xp.linalg.solve(D[odd, ...], xp.concat([B[odd, ...], C[odd, ...],
                                                         f[odd, ...][..., None]], axis=3))
        n = D.shape[2]
        solved_b, solved_c, solved_f = solved[..., :n], solved[..., n: 2 * n], solved[..., 2 * n]
        eliminated.append((B[odd, ...], C[odd, ...], D[odd, ...], f[odd, ...]))
        B, D, C, f = _reduced(xp, B[even, ...], D[even, ...], C[even, ...], f[even, ...],
                              solved_b, solved_c, solved_f)
    x = xp.linalg.solve(D, f[..., None])[..., 0]
    for b_odd, c_odd, d_odd, f_odd in reversed(eliminated):
        after = xp.concat([x[1:, ...], xp.zeros_like(x[:1, ...])])  # the even block after each
        rhs = f_odd - (b_odd @ x[..., None])[..., 0] - (c_odd @ after[..., None])[..., 0]
        full = xp.empty((2 * x.shape[0],) + tuple(x.shape[1:]), dtype=x.dtype,
                        device=backend.device(x))
        full[even, ...] = x
        full[odd, ...] = xp.linalg.solve(d_odd, rhs[..., None])[..., 0]
        x = full
    return x[:m, ...], len(eliminated)


def _reduced(xp: Any, B: Any, D: Any, C: Any, f: Any, solved_b: Any, solved_c: Any, solved_f: Any
             ) -> tuple[Any, Any, Any, Any]:
    """The even blocks after eliminating their odd neighbours (the module's equations).

    Even block ``e`` reads odd block ``e`` after it and odd block ``e - 1`` before it.
    """
    D = D - C @ solved_b
    D[1:, ...] = D[1:, ...] - B[1:, ...] @ solved_c[:-1, ...]
    f = f - (C @ solved_f[..., None])[..., 0]
    f[1:, ...] = f[1:, ...] - (B[1:, ...] @ solved_f[:-1, ...][..., None])[..., 0]
    new_b = xp.zeros_like(B)
    new_b[1:, ...] = -(B[1:, ...] @ solved_b[:-1, ...])
    return new_b, D, -(C @ solved_c), f


def _padded(xp: Any, B: Any, D: Any, C: Any, f: Any) -> tuple[Any, Any, Any, Any]:
    """Pad to a power of two with identity blocks, and zero the unread corner blocks."""
    m = D.shape[0]
    size = 1 << max(m - 1, 0).bit_length()
    extra, device = size - m, backend.device(D)
    eye = xp.broadcast_to(xp.eye(D.shape[2], dtype=D.dtype, device=device),
                          (extra,) + tuple(D.shape[1:]))
    zeros = xp.zeros((extra,) + tuple(D.shape[1:]), dtype=D.dtype, device=device)
    B, C = xp.concat([B, zeros]), xp.concat([C, zeros])
    B[0, ...], C[m - 1, ...] = 0.0, 0.0
    return B, xp.concat([D, eye]), C, xp.concat([f, xp.zeros((extra,) + tuple(f.shape[1:]),
                                                              dtype=f.dtype, device=device)])
