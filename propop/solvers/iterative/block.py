"""Block Krylov methods for several right-hand sides of one matrix (paper section 3.3).

Written for propop: no maintained PyPI package has nonsymmetric block Krylov
methods that work with current SciPy. Both methods need one matrix for all
columns (:attr:`~propop.TriangularSystem.shares_matrix`: a linear network,
several right-hand sides of one sample, or ``shared_diagonal="mean"``); a
mini-batch of a nonlinear network is ``r`` different matrices, for which the
batched methods (:mod:`.batched_krylov`) are the right tool. Each iteration
applies the operator once to a whole ``(N, p)`` block, and the block Krylov
space grows by up to ``p`` directions per application instead of one.

- ``block-gmres`` (Simoncini and Gallopoulos 1996): block Arnoldi with block
  classical Gram-Schmidt done twice, the block least-squares problem
  ``min ||E_1 B - H Y||`` solved by QR at every step for per-column residual
  estimates, restarts, and deflation: a rank-revealing factorisation (SVD) of
  every new block drops linearly dependent directions at once, and converged
  columns leave at the next restart.
- ``block-bicgstab`` (Guennouni, Jbilou and Sadok 2003, Algorithm 2): the
  ``r x r`` matrix coefficients ``alpha``, ``beta`` and a scalar ``omega``.

References
----------
D. P. O'Leary, "The block conjugate gradient algorithm and related methods",
Linear Algebra Appl. 29 (1980); V. Simoncini, E. Gallopoulos, "Convergence
properties of block GMRES and matrix polynomials", Linear Algebra Appl. 247
(1996); A. El Guennouni, K. Jbilou, H. Sadok, "A block version of BiCGSTAB for
linear systems with multiple right-hand sides", ETNA 16 (2003).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import numpy as np

from ... import backend

from ...systems.triangular import TriangularSystem
from .batched import restart_length
from ..convergence import Tolerance, finish, initial_guess
from ..direct.substitution import approximation_report
from ..method import Method
from ..options import OptionError
from ..registry import register
from ..solution import Solution
from .views import Block, Setup

__all__ = ["BlockGMRES", "BlockBiCGStab"]


def _orthonormal(xp: Any, W: Any, drop: float, size: float = 0.0) -> tuple[Any, Any]:
    """``W = Q T`` with orthonormal ``Q`` of the numerical rank of ``W`` (deflation).

    Directions below ``drop`` of the largest, or rounding (``1e3 eps``) of
    ``size`` (the norm of ``W`` before orthogonalisation), are dropped.
    """
    U, s, Vh = xp.linalg.svd(W, full_matrices=False)
    floor = 1e3 * backend.eps(W.dtype) * size
    keep = int(xp.count_nonzero(s > max(drop * float(s[0]), floor, 1e-300))) if s.shape[0] else 0
    return U[:, :keep], s[:keep, None] * Vh[:keep, :]


class _Arnoldi:
    """A block Arnoldi basis and the QR factorisation of its block Hessenberg ``H``.

    ``H`` is never stored: each new block column is reduced at once by the
    orthogonal factors of the earlier ones and one QR of its
    ``(p_j + p_{j+1}) x p_j`` lower part; the same factors rotate the
    right-hand side ``E_1 E``, whose rows below the triangle give the residual
    norm of every column at no extra cost.
    """

    def __init__(self, xp: Any, R: Any, drop: float) -> None:
        self.xp, self.drop = xp, drop
        V, self.G = _orthonormal(xp, R, drop)  # R = V_0 G: the rotated rhs starts as E
        self.V, self.rotations, self.columns, self.ncols = [V], [], [], 0

    @property
    def width(self) -> int:
        """The width of the newest basis block."""
        return self.V[-1].shape[1]

    def extend(self, W: Any) -> bool:
        """Add ``W = A M^{-1} V_j`` to the basis; ``False`` if it adds no direction."""
        xp = self.xp
        size = float(xp.linalg.vector_norm(W))
        basis = xp.concat(self.V, axis=1)
        coefficients = basis.T @ W
        W = W - basis @ coefficients
        again = basis.T @ W  # classical Gram-Schmidt twice: orthogonal to rounding
        V, T = _orthonormal(xp, W - basis @ again, self.drop, size)
        c = xp.concat([coefficients + again, T])  # the new block column of H
        for start, Q in self.rotations:
            c[start: start + Q.shape[0], :] = Q.T @ c[start: start + Q.shape[0], :]
        start = self.ncols
        Q = xp.linalg.qr(c[start:, :], mode="complete")[0]
        c[start:, :] = Q.T @ c[start:, :]
        self.G = xp.concat([self.G, xp.zeros((V.shape[1], self.G.shape[1]), dtype=self.G.dtype,
                                             device=backend.device(self.G))])
        self.G[start:, :] = Q.T @ self.G[start:, :]
        self.rotations.append((start, Q))
        self.ncols += W.shape[1]
        self.columns.append(c[: self.ncols, :])
        self.V.append(V)
        return V.shape[1] > 0

    def estimates(self) -> Any:
        """The residual norm of every column, ``||E_1 E - H Y||``."""
        return self.xp.linalg.vector_norm(self.G[self.ncols:, :], axis=0)

    def correction(self) -> Any:
        """``V Y`` with ``Y`` the least-squares solution (a triangular solve).

        ``None`` where the triangle is singular or not finite (an overflowed
        product): a breakdown the caller reports.
        """
        xp = self.xp
        T = xp.zeros((self.ncols, self.ncols), dtype=self.G.dtype, device=backend.device(self.G))
        first = 0
        for c in self.columns:
            T[: c.shape[0], first: first + c.shape[1]] = c
            first += c.shape[1]
        if not bool(xp.all(xp.isfinite(T))) or not bool(xp.all(xp.linalg.diagonal(T) != 0)):
            return None
        Y = xp.linalg.solve(T, self.G[: self.ncols, :])
        return xp.concat(self.V[:-1], axis=1) @ Y


class _BlockMethod(Method):
    """What both block methods do per matrix: the one shared operator and its preconditioner."""

    def _setup(self, operator: Any, rtol: float | None, atol: float, maxiter: int | None,
               M: Any, shared_diagonal: str | None, **own: Any) -> Setup:
        shared = operator.shared("exact" if shared_diagonal is None else "mean").ready()
        return Setup.of(shared, rtol, atol, maxiter, M, shared=shared, **own)

    @staticmethod
    def _start(state: Setup, system: Any, x0: Any) -> tuple[Any, Block, Tolerance, Any]:
        """The shared system of ``system``'s right-hand side, its block, tolerance and ``X``."""
        shared = TriangularSystem.of(state.own["shared"], system.rhs, check=False)
        return shared, state.block(shared), state.tolerance(shared), initial_guess(shared, x0)

    @staticmethod
    def _judged(system: Any, solution: Solution) -> Solution:
        """Report a ``shared_diagonal="mean"`` answer as the approximation it is."""
        return solution if system.shares_matrix else approximation_report(system, solution)


@register("block-gmres", kind="block", exact=False, native=True,
          requires=("shared_matrix",))
class BlockGMRES(_BlockMethod):
    """Block GMRES for several right-hand sides of one matrix, with deflation.

    Parameters
    ----------
    restart : int, optional
        Block iterations per cycle; default ``min(nblocks + 1, 50)``.
    M : spec, optional
        Right preconditioner (:mod:`propop.solvers.iterative.preconditioners`),
        built once by ``init``.
    shared_diagonal : {None, "mean"}
        ``None``: the system must share one matrix over its columns, else
        ``ValueError``. ``"mean"``: solve the batch-mean matrix instead, an
        approximation reported as in ``cyclic-reduction``.
    deflation_tol : float, optional
        Relative singular value below which a direction counts as linearly
        dependent and is dropped; default ``sqrt(eps)``.

    Notes
    -----
    ``iterations`` counts block Arnoldi steps;
    ``info["operator_applications"]`` adds the true residuals (the initial one
    and one a cycle), ``info["matvecs"]`` the columns all of them carried,
    ``info["block_widths"]`` the width of each Arnoldi block.
    """

    def init(self, operator: Any, *, rtol: float | None = None, atol: float = 0.0,
             maxiter: int | None = None, restart: int | None = None, M: Any = None,
             shared_diagonal: Literal["mean"] | None = None,
             deflation_tol: float | None = None) -> Setup:
        """The shared operator, ``restart`` and ``deflation_tol`` checked, ``M`` built."""
        if deflation_tol is not None and not 0 <= deflation_tol < 1:
            raise OptionError(f"deflation_tol must lie in [0, 1), got {deflation_tol}")
        drop = float(np.sqrt(backend.eps(operator.dtype))) if deflation_tol is None \
            else float(deflation_tol)
        return self._setup(operator, rtol, atol, maxiter, M, shared_diagonal,
                           restart=restart_length(operator, restart), drop=drop)

    def compute(self, state: Setup, system: Any, x0: Any = None,
                callback: Callable | None = None) -> Solution:
        """Block GMRES(m) cycles on the shared matrix from ``x0``."""
        shared, block, tol, X = self._start(state, system, x0)
        maxiter, m, drop = state.maxiter, state.own["restart"], state.own["drop"]
        R = block.residual(X)
        met, norms = block.met(tol, R, X)
        history, it, widths, stagnated, cycles = [float(norms.max())], 0, [], "", 0
        progress = (np.inf, np.inf)
        while it < maxiter and not met.all():
            active = np.flatnonzero(~met)
            columns = backend.like(active, X)
            floor = np.maximum(tol.floor(backend.take_columns(X, columns), active),
                               10 * backend.eps(R.dtype)  # or rounding: restart refines
                               * block.norms(backend.take_columns(R, columns)))
            arnoldi = _Arnoldi(block.xp, backend.take_columns(R, columns), drop)
            for _ in range(min(m, maxiter - it)):
                it += 1
                widths.append(arnoldi.width)
                grew = arnoldi.extend(block.A(block.M(arnoldi.V[-1])))
                estimates = backend.to_host(arnoldi.estimates())
                history.append(float(estimates.max()))
                if not grew or (estimates <= floor).all():
                    break
            correction = arnoldi.correction()
            if correction is None:
                stagnated = (f"block GMRES breakdown at iteration {it}: the block Hessenberg "
                             "matrix is singular or not finite (a long product of Jacobians "
                             "overflowed?); use a direct method such as 'substitution'")
                break
            X = X + backend.spread_columns(block.M(correction), active, X.shape[1])
            cycles += 1
            R, met, progress, stagnated = block.end_cycle(
                X, progress, history, callback, tol, it, m, "block GMRES", last=it >= maxiter)
            if stagnated:
                break
        solution = finish(system, X, tol=state.tolerance(system), iterations=it,
                          history=history, levels=it, maxiter=maxiter, breakdown=stagnated,
                          estimates=True,
                          info={"restart": m, "block_widths": widths,
                                "matvecs": int(sum(widths)) + (cycles + 1) * X.shape[1],
                                "operator_applications": it + cycles + 1})
        return self._judged(system, solution)


@register("block-bicgstab", kind="block", exact=False, native=True,
          requires=("shared_matrix",))
class BlockBiCGStab(_BlockMethod):
    """Block BiCGStab (Guennouni et al. 2003) for several right-hand sides of one matrix.

    Parameters
    ----------
    M : spec, optional
        Right preconditioner (:mod:`propop.solvers.iterative.preconditioners`),
        built once by ``init``.
    shared_diagonal : {None, "mean"}
        As for ``block-gmres``.
    seed : int
        Seed of the random shadow block ``R~`` (``R~ = R_0`` stalls on the
        backward system, as for ``bicgstab``).

    Notes
    -----
    Two block operator applications per iteration. A singular ``R~^T V`` is a
    breakdown, reported with the iteration.
    """

    def init(self, operator: Any, *, rtol: float | None = None, atol: float = 0.0,
             maxiter: int | None = None, M: Any = None,
             shared_diagonal: Literal["mean"] | None = None, seed: int = 0) -> Setup:
        """The shared operator and ``M`` built."""
        return self._setup(operator, rtol, atol, maxiter, M, shared_diagonal, seed=seed)

    def compute(self, state: Setup, system: Any, x0: Any = None,
                callback: Callable | None = None) -> Solution:
        """Block BiCGStab iterations on the shared matrix from ``x0``."""
        shared, block, tol, X = self._start(state, system, x0)
        xp, maxiter = block.xp, state.maxiter
        R = block.residual(X)
        shadow = xp.astype(backend.like(
            np.random.default_rng(state.own["seed"]).standard_normal(R.shape), R), R.dtype)
        P = xp.asarray(R, copy=True)
        met, norms = block.met(tol, R, X)
        history, it, breakdown = [float(norms.max())], 0, ""
        while it < maxiter and not met.all():
            it += 1
            P_hat = block.M(P)
            V = block.A(P_hat)
            SV = shadow.T @ V
            if _singular(xp, SV):
                breakdown = _breakdown(xp, it, block.residual(X))
                break
            alpha = xp.linalg.solve(SV, shadow.T @ R)
            S = R - V @ alpha
            S_hat = block.M(S)
            T = block.A(S_hat)
            tt = float(xp.sum(T * T))
            omega = float(xp.sum(T * S)) / tt if tt > 0 else 0.0
            X = X + P_hat @ alpha + omega * S_hat
            R = S - omega * T
            beta = xp.linalg.solve(SV, -(shadow.T @ T))
            P = R + (P - omega * V) @ beta
            met, norms = block.met(tol, R, X)
            history.append(float(norms.max()))
            if callback is not None:
                callback(X)
            if met.all():  # confirm on the true residual; restart from it if it disagrees
                R = block.residual(X)
                met, norms = block.met(tol, R, X)
                P = xp.asarray(R, copy=True)
        solution = finish(system, X, tol=state.tolerance(system), iterations=it,
                          history=history, levels=2 * it, maxiter=maxiter,
                          breakdown=breakdown, estimates=True,
                          info={"matvecs": 2 * it * X.shape[1] + X.shape[1],
                                "operator_applications": 2 * it + 1})
        return self._judged(system, solution)


def _breakdown(xp: Any, it: int, R: Any) -> str:
    """Why ``R~^T A P`` became singular, and what to do."""
    rank = int(xp.count_nonzero(xp.linalg.svdvals(R) > float(np.sqrt(backend.eps(R.dtype)))
                                * float(xp.linalg.vector_norm(R))))
    if rank < R.shape[1]:
        return (f"block BiCGStab breakdown at iteration {it}: the {R.shape[1]} residuals are "
                f"linearly dependent (rank {rank}; a backward system's right-hand sides "
                "span at most the output width); use 'block-gmres', which deflates them")
    return (f"block BiCGStab breakdown at iteration {it}: R~^T A P is singular; use another "
            "seed, 'block-gmres' or a direct method")


def _singular(xp: Any, S: Any) -> bool:
    """Whether the small matrix ``S`` is numerically singular (or not finite)."""
    if not bool(xp.all(xp.isfinite(S))):
        return True
    s = xp.linalg.svdvals(S)
    return bool(s[-1] <= s[0] * backend.eps(S.dtype) * S.shape[0])
