"""A rank's share of a triangular system: its block rows, its neighbours, the exchanges."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..solvers.direct.substitution import substitute
from ..systems.make_system import make_system
from ..systems.triangular import TriangularSystem

__all__ = ["DistributedSystem", "partition", "world", "check_partition"]


def world() -> Any:
    """``MPI.COMM_WORLD`` (imports mpi4py; a clear error without the ``mpi`` extra)."""
    try:
        from mpi4py import MPI
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise ImportError('the mpi.* methods need mpi4py: pip install "propop[mpi]"') from error
    return MPI.COMM_WORLD


def partition(nblocks: int, ranks: int) -> list[tuple[int, int]]:
    """Contiguous ranges of solve-order positions, as even as possible (the first get more)."""
    if ranks > nblocks:
        raise ValueError(f"{ranks} ranks for {nblocks} blocks: every rank needs at least one "
                         "block row; run with fewer processes")
    base, extra = divmod(nblocks, ranks)
    bounds = np.cumsum([0] + [base + (p < extra) for p in range(ranks)])
    return [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]


class DistributedSystem:
    """The block rows rank ``comm.rank`` owns of a system's matrix (its canonical operator).

    ``system`` is a :class:`~propop.TriangularSystem` or its canonical operator
    (scaled form, 2-D: :mod:`propop.systems.make_system`); no right-hand side is
    kept: a method's ``init`` builds this once and each solve passes its rows
    (:meth:`own`). ``local`` is the operator of my rows; ``imports`` are the
    blocks of the previous rank (in solve order) that they read, ``exports`` the
    blocks of this rank that the next rank reads. Both are exchanged with one
    ``Sendrecv`` of a contiguous buffer, padded to the widest block so that
    every message has the same shape.
    """

    def __init__(self, system: Any, comm: Any = None) -> None:
        self.comm = world() if comm is None else comm
        self._adopt(_share(_canonical(system), self.comm.Get_rank(), self.comm.Get_size()))

    @classmethod
    def scatter(cls, system: Any, comm: Any = None, root: int = 0) -> DistributedSystem:
        """Build on rank ``root`` only (``system`` is ignored elsewhere); send each its rows."""
        comm = world() if comm is None else comm
        shares = None
        if comm.Get_rank() == root:
            system = _canonical(system)
            shares = [_share(system, p, comm.Get_size()) for p in range(comm.Get_size())]
        self = cls.__new__(cls)
        self.comm = comm
        self._adopt(comm.scatter(shares, root=root))
        return self

    def _adopt(self, share: dict) -> None:
        """Take over a rank's share (:func:`_share`): no message is sent."""
        self.__dict__.update(share)
        self.xp = self.local.backend.xp
        self.local.ready().blocks.steps  # noqa: B018 (products and solves' order, once)

    # -- exchanges --------------------------------------------------------------------
    def _buffer(self, count: int, columns: int) -> Any:
        return np.zeros((max(count, 1), self.width, columns), dtype=self.dtype)

    def _pack(self, values: dict, columns: int) -> Any:
        out = self._buffer(len(self.exports), columns)
        for i, k in enumerate(self.exports):
            out[i, : self.sizes[k]] = values[k]
        return out

    def _unpack(self, incoming: Any) -> dict:
        return {k: incoming[i, : self.sizes[k]] for i, k in enumerate(self.imports)}

    def exchange(self, values: dict, columns: int) -> dict:
        """Send my exports to the next rank, receive my imports from the previous one.

        ``values`` maps my blocks to ``(n_k, columns)`` arrays (every rank passes
        the same ``columns``: the right-hand side's, agreed on by the guard).
        """
        incoming = self._buffer(len(self.imports), columns)  # the previous rank's exports
        self.comm.Sendrecv(self._pack(values, columns), dest=self.next, recvbuf=incoming,
                           source=self.previous)
        return self._unpack(incoming)

    def allreduce(self, values: Any, op: str) -> Any:
        """``values`` (a host array) combined over all ranks by ``op``: sum, max or min."""
        from mpi4py import MPI

        local = np.ascontiguousarray(values)
        total = np.empty_like(local)
        self.comm.Allreduce(local, total, op={"sum": MPI.SUM, "max": MPI.MAX,
                                              "min": MPI.MIN}[op])
        return total

    def receive(self, columns: int) -> dict:
        """Wait for my imports from the previous rank (a pipeline step)."""
        incoming = self._buffer(len(self.imports), columns)
        self.comm.Recv(incoming, source=self.previous)
        return self._unpack(incoming)

    def send(self, values: dict, columns: int) -> None:
        """Pass my exports on to the next rank."""
        self.comm.Send(self._pack(values, columns), dest=self.next)

    def boundary_entries(self, blocks: Sequence[int]) -> Any:
        """Positions in the local vector of ``blocks``' entries (my exports, say)."""
        offsets = dict(zip(self.blocks, np.cumsum([0] + [self.sizes[k] for k in self.blocks])))
        parts = [np.arange(offsets[k], offsets[k] + self.sizes[k]) for k in blocks]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=int)

    @property
    def previous(self) -> int:
        """The previous rank in solve order (``MPI.PROC_NULL`` on the first)."""
        return self.rank - 1 if self.rank > 0 else _null()

    @property
    def next(self) -> int:
        """The next rank in solve order (``MPI.PROC_NULL`` on the last)."""
        return self.rank + 1 if self.rank + 1 < self.size else _null()

    # -- the local rows ---------------------------------------------------------------
    def external_rhs(self, imported: dict, columns: int) -> Any:
        """``s * (M x_import)`` summed into the local rows: the couplings to the neighbour."""
        parts = self.local.split(self.xp.zeros((self.local.size, columns), dtype=self.dtype))
        position = {k: i for i, k in enumerate(self.blocks)}
        for e in self.external:
            product = e.matrix @ imported[e.col]
            parts[position[e.row]] += product if e.scale is None else e.scale * product
        return self.xp.concat(parts)

    def solve_local(self, rhs: Any) -> Any:
        """The local rows solved for ``rhs`` ``(N_local, c)`` by substitution."""
        return substitute(TriangularSystem.of(self.local, rhs, check=False))

    def own(self, x: Any) -> Any:
        """My rows of a full ``(N, c)`` array ``x`` (a canonical right-hand side, say)."""
        offsets = np.cumsum([0] + list(self.sizes))
        return np.concatenate([x[offsets[k]: offsets[k + 1]] for k in self.blocks])

    def split(self, x_local: Any) -> dict:
        """Local solution ``(N_local[, r])`` as ``{block: values}``."""
        return dict(zip(self.blocks, self.local.split(x_local)))

    def gather(self, x_local: Any) -> Any:
        """The full solution on every rank, in the system's block order."""
        pieces = self.comm.allgather(np.asarray(x_local))
        blocks: dict[int, Any] = {}
        for (a, b), piece in zip(self.ranges, pieces):
            owned = sorted(self._order[a:b])
            offsets = np.cumsum([0] + [self.sizes[k] for k in owned])
            for k, lo, hi in zip(owned, offsets[:-1], offsets[1:]):
                blocks[k] = piece[lo:hi]
        return np.concatenate([blocks[k] for k in range(len(self.sizes))])


def check_partition(system: Any, size: int) -> None:
    """Raise ``ValueError`` unless ``size`` ranks can share ``system``'s rows.

    Every rank needs a block row, and a rank's rows may read only its own
    blocks and the previous rank's: the same check on every rank, before any
    message is sent.
    """
    order = list(system.blocks.order())
    owner = {k: p for p, (a, b) in enumerate(partition(system.nblocks, size))
             for k in order[a:b]}
    for e in system.blocks.edges:
        if owner[e.col] not in (owner[e.row], owner[e.row] - 1):
            raise ValueError(f"rank {owner[e.row]} reads {system.label(e.col)} of rank "
                             f"{owner[e.col]}, not of its neighbour: use fewer ranks so "
                             "that each owns more blocks than a coupling spans")


def _canonical(system: Any) -> Any:
    """The canonical operator of a system (:func:`make_system`); an operator as it is."""
    return make_system(system).system.operator_of if isinstance(system, TriangularSystem) \
        else system


def _share(system: Any, rank: int, size: int) -> dict:
    """Everything rank ``rank`` of ``size`` holds: its rows, couplings out, neighbours.

    ``boundary`` is the widest exchange of any rank (told from the whole matrix,
    which every rank holds, so no message is needed).
    """
    order = list(system.blocks.order())
    ranges = partition(system.nblocks, size)
    start, stop = ranges[rank]
    blocks = sorted(order[start:stop])
    owner = {k: p for p, (a, b) in enumerate(ranges) for k in order[a:b]}
    mine = set(blocks)
    external = [e for e in system.blocks.edges if e.row in mine and e.col not in mine]
    imports = sorted({e.col for e in external})  # all of rank - 1 (check_partition)
    exports = sorted({e.col for e in system.blocks.edges
                      if e.col in mine and owner[e.row] == rank + 1})
    crossing: dict[int, set] = {}  # per sending rank, the blocks the next one reads
    for e in system.blocks.edges:
        if owner[e.row] != owner[e.col]:
            crossing.setdefault(owner[e.col], set()).add(e.col)
    boundary = max([1] + [sum(system.sizes[k] for k in blocks_)
                          for blocks_ in crossing.values()])
    return {"rank": rank, "size": size, "ranges": ranges, "blocks": blocks,
            "external": external, "imports": imports, "exports": exports,
            "local": system.subsystem(blocks), "sizes": system.sizes,
            "width": system.width, "dtype": system.dtype, "boundary": boundary,
            "_order": order}


def _null() -> Any:
    from mpi4py import MPI

    return MPI.PROC_NULL


