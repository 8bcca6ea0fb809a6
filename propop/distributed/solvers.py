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

from ..solvers.reduction.chain import Counter, apply, product
from ..solvers.convergence import Tolerance, finish, initial_guess
from ..solvers.registry import register
from ..solvers.reduction.segments import expand, relation
from ..solvers.solution import Solution
from .guard import COLLECTIVE
from .system import DistributedSystem

__all__ = ["mpi_substitution", "mpi_cyclic_reduction", "mpi_jacobi"]


def _info(d: DistributedSystem, **more: Any) -> dict:
    local = d.comm.allgather(len(d.blocks))
    return {"ranks": d.size, "blocks_per_rank": local, **more}


@register("mpi.substitution", kind="direct", exact=True, backends=("numpy",), needs=("mpi4py",),
          extra="mpi", guard=COLLECTIVE)
def mpi_substitution(system: Any, *, comm: Any = None, rtol: float | None = None,
                     atol: float = 0.0) -> Solution:
    """Pipelined block substitution over MPI ranks: the distributed baseline.

    ``levels`` is the number of blocks: the ranks take their turns.
    """
    d = DistributedSystem(system, comm)
    imported = d.receive() if d.rank > 0 else {}
    x_local = d.solve_local(d.local.rhs + d.external_rhs(imported))
    if d.rank + 1 < d.size:
        d.send(d.split(x_local))
    return finish(system, d.gather(x_local), tol=Tolerance.of(system, rtol, atol),
                  levels=system.nblocks, info=_info(d), direct=True)


def _boundary_relation(d: DistributedSystem) -> tuple[Any, Any, int]:
    """``(Y, Ag, m)``: the local solution ``Y [y_prev; 1]`` and the exports' ``[A | g]``.

    ``Y = D^{-1} [G | c]`` per sample, ``(r, local entries, imports + 1)``, from
    ``1 + imports`` local substitutions (a unit right-hand side per imported
    entry, then the system's own); ``Ag`` holds its exported rows
    (:func:`~propop.solvers.reduction.segments.relation`) padded to ``m`` entries,
    ``(r, m, m + 1)``, one buffer per sample for the exchanges.
    """
    xp = d.xp
    columns = []
    for k in d.imports:
        for i in range(d.sizes[k]):
            unit = {j: xp.zeros((d.sizes[j],) + d.local.rhs.shape[1:], dtype=d.dtype)
                    for j in d.imports}
            unit[k][i] = 1
            columns.append(d.solve_local(d.external_rhs(unit)))
    columns.append(d.solve_local(d.local.rhs))
    Y = xp.stack(columns, axis=-1)  # (entries[, r], imports + 1)
    Y = xp.permute_dims(Y[:, None] if Y.ndim == 2 else Y, (1, 0, 2))
    A, g = relation(Y, d.boundary_entries(d.exports))
    m = d.boundary
    Ag = xp.zeros((Y.shape[0], m, m + 1), dtype=d.dtype)
    Ag[:, : A.shape[1], : A.shape[2]] = A
    Ag[:, : g.shape[1], m] = g
    return Y, Ag, m


def _compose_over_ranks(d: DistributedSystem, Ag: Any, m: int) -> tuple[Any, int]:
    """Recursive doubling: after ``ceil(log2 P)`` steps ``Ag[..., m]`` holds ``y_p``."""
    from mpi4py import MPI

    step, levels = 1, 0
    while step < d.size:
        levels += 1
        incoming = np.zeros_like(Ag)
        dest = d.rank + step if d.rank + step < d.size else MPI.PROC_NULL
        source = d.rank - step if d.rank - step >= 0 else MPI.PROC_NULL
        d.comm.Sendrecv(Ag, dest=dest, recvbuf=incoming, source=source)
        if source != MPI.PROC_NULL:  # F_p o F_q: A_p A_q, A_p g_q + g_p
            Ag = _composed(Ag, incoming, m)
        step *= 2
    return Ag, levels


def _composed(Ag: Any, incoming: Any, m: int) -> Any:
    """``[A_p A_q | A_p g_q + g_p]`` per sample: one reduction step of the chain over ranks.

    The cores and right-hand sides are a one-position :class:`~propop.solvers.reduction.chain.Chain`
    level (``(1, r, m, m)`` and ``(1, r, m)``, unit scalings), combined by the
    reduction's own kernels, :func:`~propop.solvers.reduction.chain.product` and
    :func:`~propop.solvers.reduction.chain.apply`, as cyclic reduction combines neighbours.
    """
    counter, ones = Counter(), np.ones((1,) + Ag.shape[:2], dtype=Ag.dtype)
    A, g = Ag[None, :, :, :m], Ag[None, :, :, m]
    A_q, g_q = incoming[None, :, :, :m], incoming[None, :, :, m]
    core = product(ones, A, ones, A_q, counter)
    rhs = apply(ones, A, g_q, counter) + g
    return np.concatenate([core[0], rhs[0][:, :, None]], axis=2)


@register("mpi.cyclic-reduction", kind="direct", exact=True, backends=("numpy",),
          needs=("mpi4py",), extra="mpi", guard=COLLECTIVE)
def mpi_cyclic_reduction(system: Any, *, comm: Any = None, rtol: float | None = None,
                         atol: float = 0.0) -> Solution:
    """Local reduction to boundary relations, cyclic reduction over the ranks, local solves.

    ``levels`` counts the blocks of the largest rank (its local solves run in
    parallel with the others') plus the ``ceil(log2 P)`` steps over the ranks;
    ``info["rank_levels"]`` gives the latter.
    """
    d = DistributedSystem(system, comm)
    Y, Ag, m = _boundary_relation(d)
    Ag, rank_levels = _compose_over_ranks(d, Ag, m)
    y = np.ascontiguousarray(Ag[:, :, m])  # my exports, (r, m)
    y_prev = np.zeros_like(y)
    d.comm.Sendrecv(y, dest=d.next, recvbuf=y_prev, source=d.previous)
    x = expand(Y, y_prev[:, : Y.shape[2] - 1], Counter())  # (r, local entries)
    x_local = x[0] if d.local.rhs.ndim == 1 else x.T
    local_levels = max(d.comm.allgather(len(d.blocks)))
    return finish(system, d.gather(x_local), tol=Tolerance.of(system, rtol, atol),
                  levels=local_levels + rank_levels, direct=True,
                  info=_info(d, rank_levels=rank_levels,
                                            expected_rank_levels=math.ceil(math.log2(d.size))
                                            if d.size > 1 else 0))


@register("mpi.jacobi", kind="iterative", exact=False, backends=("numpy",), needs=("mpi4py",),
          extra="mpi", guard=COLLECTIVE)
def mpi_jacobi(system: Any, *, comm: Any = None, x0: Any = None, rtol: float | None = None,
               atol: float = 0.0, maxiter: int | None = None, callback: Any = None
               ) -> Solution:
    """Block Jacobi over MPI ranks: one neighbour exchange and two ``Allreduce`` a sweep."""
    from .krylov import DistributedBlock

    d = DistributedSystem(system, comm)
    block = DistributedBlock(d)
    maxiter = system.nblocks if maxiter is None else int(maxiter)
    tol = Tolerance.of(system, rtol, atol)
    X = d.own(initial_guess(system, x0)).reshape(d.local.size, -1)
    history, it = [], 0
    while True:
        R = block.residual(X)
        met, norms = block.met(tol, R, X)
        history.append(float(norms.max()))
        if met.all() or it >= maxiter:
            break
        X = X + R
        it += 1
        if callback is not None:
            callback(block.out(X))
    return finish(system, d.gather(block.out(X)), tol=tol, iterations=it, history=history,
                  levels=it, maxiter=maxiter, info=_info(d))
