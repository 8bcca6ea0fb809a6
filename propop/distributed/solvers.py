"""The ``mpi.*`` methods: distributed solves of a triangular system over MPI ranks.

Every rank builds the same system (from the same network and data) and calls
``pp.solve(system, "mpi.<method>")`` under ``mpiexec``; each works on its own
block rows (:class:`~propop.distributed.DistributedSystem`) and the solution is
gathered on every rank, so the result equals the single-process one.

- ``mpi.substitution``: the pipelined sequential baseline; rank ``p`` waits for
  rank ``p - 1``'s boundary blocks, solves its rows, passes its own on.
- ``mpi.cyclic-reduction``: each rank reduces its rows to a boundary relation
  ``y_p = A_p y_{p-1} + g_p`` (its exported blocks as an affine function of its
  imported ones, from ``1 + imports`` local substitutions), the relations are
  composed across ranks by recursive doubling (``ceil(log2 P)`` ``Sendrecv``
  steps, cyclic reduction over the ranks), then each rank solves its rows: the
  ranks are the segments of :mod:`propop.solvers.reduction.segments`.
- ``mpi.jacobi``: Jacobi sweeps with one neighbour exchange each and the
  residual norms summed with ``Allreduce``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..solvers.reduction.chain import Counter, product
from ..solvers.reduction.segments import expand
from ..solvers.convergence import finish
from ..solvers.iterative.views import Setup
from ..solvers.registry import register
from ..solvers.solution import Solution
from .guard import COLLECTIVE
from .krylov import Distributed
from .system import DistributedSystem

__all__ = ["MpiSubstitution", "MpiCyclicReduction", "MpiJacobi"]


def _info(d: DistributedSystem, **more: Any) -> dict:
    local = d.comm.allgather(len(d.blocks))
    return {"ranks": d.size, "blocks_per_rank": local, **more}


@register("mpi.substitution", kind="direct", exact=True, backends=("numpy",), needs=("mpi4py",),
          extra="mpi", guard=COLLECTIVE,
          requires=("shared_couplings",))
class MpiSubstitution(Distributed):
    """Pipelined block substitution over MPI ranks: the distributed baseline.

    ``levels`` is the number of blocks: the ranks take their turns.
    """

    def init(self, operator: Any, *, comm: Any = None, rtol: float | None = None,
             atol: float = 0.0) -> Setup:
        """My rows."""
        return super().init(operator, comm=comm, rtol=rtol, atol=atol)

    def compute(self, state: Setup, system: Any) -> Solution:
        """Wait for the previous rank's boundary, solve my rows, pass mine on."""
        d = state.own["d"]
        C = d.own(system.rhs)
        c = C.shape[1]
        imported = d.receive(c) if d.rank > 0 else {}
        x_local = d.solve_local(C + d.external_rhs(imported, c))
        if d.rank + 1 < d.size:
            d.send(d.split(x_local), c)
        return finish(system, d.gather(x_local), tol=state.tolerance(system),
                      levels=system.nblocks, info=_info(d), direct=True)


class _Relation:
    """``mpi.cyclic-reduction``'s state: my rows' boundary relation, composed over the ranks.

    :func:`~propop.solvers.reduction.segments`' stages with the ranks as
    segments: ``D^{-1} G`` from one local substitution per imported entry (a
    unit right-hand side each), ``A`` its exported rows padded to ``(s, m, m)``
    (``s`` the operator's samples); :meth:`connect` composes the ``A`` over the
    ranks by recursive doubling, keeping at each step the ``A_p`` that a solve's
    ``g`` needs: ``g_p <- A_p g_q + g_p``.
    """

    def __init__(self, setup: Setup, samples: int) -> None:
        d = setup.own["d"]
        xp, self.d, self.setup = d.xp, d, setup
        columns = []
        for k in d.imports:
            for i in range(d.sizes[k]):
                unit = {j: xp.zeros((d.sizes[j], samples), dtype=d.dtype) for j in d.imports}
                unit[k][i] = 1
                columns.append(d.solve_local(d.external_rhs(unit, samples)))
        entries = d.local.size
        G = xp.stack(columns, axis=-1) if columns else xp.zeros((entries, samples, 0),
                                                                 dtype=d.dtype)
        self.G = xp.permute_dims(G, (1, 0, 2))  # D^{-1} G: (s, entries, imported entries)
        self.rows, self.m = d.boundary_entries(d.exports), d.boundary
        A = xp.zeros((samples, self.m, self.m), dtype=d.dtype)
        exported = self.G[:, self.rows, :]
        A[:, : exported.shape[1], : exported.shape[2]] = exported
        self.A, self.steps = A, []

    def connect(self) -> None:
        """Recursive doubling of the ``A``: ``ceil(log2 P)`` ``Sendrecv`` steps, once."""
        from mpi4py import MPI

        d, A, step = self.d, self.A, 1
        ones = np.ones((1,) + A.shape[:2], dtype=A.dtype)
        while step < d.size:
            incoming = np.zeros_like(A)
            dest = d.rank + step if d.rank + step < d.size else MPI.PROC_NULL
            source = d.rank - step if d.rank - step >= 0 else MPI.PROC_NULL
            d.comm.Sendrecv(A, dest=dest, recvbuf=incoming, source=source)
            self.steps.append((dest, source, A if source != MPI.PROC_NULL else None))
            if source != MPI.PROC_NULL:  # F_p o F_q: A_p A_q, as cyclic reduction pairs
                A = np.ascontiguousarray(product(ones, A[None], ones, incoming[None],
                                                 Counter())[0])
            step *= 2

    def exports(self, g: Any) -> Any:
        """``y_p`` ``(c, m)``, my exported entries, from my ``g`` ``(c, m)``: one message a step."""
        for dest, source, A in self.steps:
            incoming = np.zeros_like(g)
            self.d.comm.Sendrecv(g, dest=dest, recvbuf=incoming, source=source)
            if A is not None:
                g = g + (A @ incoming[..., None])[..., 0]
        return g


@register("mpi.cyclic-reduction", kind="direct", exact=True, backends=("numpy",),
          needs=("mpi4py",), extra="mpi", guard=COLLECTIVE,
          requires=("shared_couplings",))
class MpiCyclicReduction(Distributed):
    """Local reduction to boundary relations, cyclic reduction over the ranks, local solves.

    ``init`` reduces my rows to the relation ``y_p = A_p y_{p-1} + g_p``
    (``1 + imports`` local substitutions) and composes the ``A`` over the ranks;
    each solve then substitutes once locally, sends ``g`` in ``ceil(log2 P)``
    steps and expands. ``levels`` counts the blocks of the largest rank (its
    local solves run in parallel with the others') plus the ``ceil(log2 P)``
    steps over the ranks; ``info["rank_levels"]`` gives the latter.
    """

    def init(self, operator: Any, *, comm: Any = None, rtol: float | None = None,
             atol: float = 0.0) -> _Relation:
        """My rows and their boundary relation (composed over the ranks by its ``connect``)."""
        return _Relation(super().init(operator, comm=comm, rtol=rtol, atol=atol),
                         operator.samples)

    def compute(self, state: _Relation, system: Any) -> Solution:
        """``g`` from one local substitution, composed over the ranks, then my rows."""
        d, relation = state.d, state
        Y = d.solve_local(d.own(system.rhs))  # D^{-1} c: (entries, c)
        g = np.zeros((Y.shape[1], relation.m), dtype=Y.dtype)
        g[:, : len(relation.rows)] = Y[relation.rows].T
        y = np.ascontiguousarray(relation.exports(g))
        y_prev = np.zeros_like(y)
        d.comm.Sendrecv(y, dest=d.next, recvbuf=y_prev, source=d.previous)
        G = relation.G  # x = D^{-1} c + D^{-1} G y_prev
        x_local = expand(G, Y.T, y_prev[:, : G.shape[2]], Counter()).T
        rank_levels = len(relation.steps)
        local_levels = max(d.comm.allgather(len(d.blocks)))
        return finish(system, d.gather(x_local), tol=state.setup.tolerance(system),
                      levels=local_levels + rank_levels, direct=True,
                      info=_info(d, rank_levels=rank_levels,
                                 expected_rank_levels=math.ceil(math.log2(d.size))
                                 if d.size > 1 else 0))


@register("mpi.jacobi", kind="iterative", exact=False, backends=("numpy",), needs=("mpi4py",),
          extra="mpi", guard=COLLECTIVE,
          requires=("shared_couplings",))
class MpiJacobi(Distributed):
    """Block Jacobi over MPI ranks: one neighbour exchange and two ``Allreduce`` a sweep."""

    def init(self, operator: Any, *, comm: Any = None, rtol: float | None = None,
             atol: float = 0.0, maxiter: int | None = None) -> Setup:
        """My rows; ``maxiter`` defaults to ``nblocks`` (exact)."""
        return super().init(operator, comm=comm, rtol=rtol, atol=atol,
                            maxiter=operator.nblocks if maxiter is None else maxiter)

    def compute(self, state: Setup, system: Any, x0: Any = None, callback: Any = None
                ) -> Solution:
        """Sweeps ``x <- x + (c - A x)`` on my rows."""
        d, block, tol, X = self.start(state, system, x0)
        history, it = [], 0
        while True:
            R = block.residual(X)
            met, norms = block.met(tol, R, X)
            history.append(float(norms.max()))
            if met.all() or it >= state.maxiter:
                break
            X = X + R
            it += 1
            if callback is not None:
                callback(X)
        return finish(system, d.gather(X), tol=tol, iterations=it, history=history,
                      levels=it, maxiter=state.maxiter, info=_info(d))
