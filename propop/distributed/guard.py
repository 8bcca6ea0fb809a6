"""Fault safety under MPI: agree on errors before communicating, abort on the unexpected.

An exception on one rank while the others wait in a collective hangs the job
for ever. Every ``mpi.*`` solve therefore runs in two phases (:class:`Collective`):

1. **Checks, agreed on by all ranks.** Each rank validates its options, its
   partition of the system and a fingerprint of the method, the system and the
   options, and runs the method's ``init`` (which sends no message); one
   ``allgather`` then shares the outcomes (:meth:`Collective.init`). Each solve
   of the plan agrees the same way on its right-hand side. If any rank failed, or
   the ranks' fingerprints differ (another method, system, options,
   ``maxiter``), every rank raises: the failing rank its own exception, the
   others a :class:`RankError` naming that rank and its message. No
   point-to-point message has been sent, so nobody hangs.
2. **The solve.** A ``callback`` given on some ranks only (logging on rank 0,
   the usual case) is fine: if any rank has one, every rank calls one at the
   same points (a no-op where none was given), and one that raises is agreed
   on after every call (one small ``allgather``). Any other exception escaping
   a rank mid-solve cannot be agreed on, because the other ranks may be
   waiting for a message that never comes: the rank prints it with its rank
   number to standard error and calls ``MPI.Abort``, which ends the job on
   every rank.

What no library can agree on is a call made on some ranks only: every rank
must make every ``mpi.*`` call (MPI's rule for collectives). Scripts run as
``mpiexec -n P python -m mpi4py script.py``, so that an uncaught exception on
one rank (or ``sys.exit`` with a non-zero status) aborts the job instead of
leaving the other ranks waiting.
"""

from __future__ import annotations

import hashlib
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np

from .. import backend
from .system import check_partition, world

__all__ = ["RankError", "Collective", "COLLECTIVE", "agree", "fingerprint", "digest"]

IGNORED = ("comm", "callback")  # may differ between ranks: not part of the fingerprint


class RankError(RuntimeError):
    """Another rank failed (or disagreed); raised on every rank but the failing one."""


def agree(comm: Any, error: BaseException | None, digest: str = "", flag: bool = False
          ) -> bool:
    """One ``allgather`` of every rank's outcome; raise on every rank if any failed.

    ``digest`` is compared too: ranks whose digests differ from rank 0's fail
    with a message naming the first differing part (see :func:`fingerprint`).
    Returns whether any rank raised ``flag`` (has a callback, say).
    """
    mine = None if error is None else f"{type(error).__name__}: {error}"
    outcomes = comm.allgather((mine, digest, bool(flag)))
    failed = [(rank, message) for rank, (message, _, _) in enumerate(outcomes) if message]
    if failed:
        if error is not None:
            raise error
        rank, message = failed[0]
        raise RankError(f"rank {rank} failed, so every rank stops: {message}")
    reference = outcomes[0][1]
    differing = [rank for rank, (_, d, _) in enumerate(outcomes) if d != reference]
    if differing:
        part = _first_difference(reference, outcomes[differing[0]][1])
        raise ValueError(f"the MPI ranks hold different problems: rank {differing[0]}'s "
                         f"{part} differs from rank 0's; every rank must call with the same "
                         "method, system and options")
    return any(flagged for _, _, flagged in outcomes)


def _first_difference(a: str, b: str) -> str:
    """The name of the first part in which two fingerprints differ."""
    for part_a, part_b in zip(a.split(";"), b.split(";")):
        if part_a != part_b:
            return part_a.split("=")[0]
    return "fingerprint"


def digest(*arrays: Any) -> str:
    """A short hash of arrays (dense or sparse, any backend), their shapes included."""
    h = hashlib.blake2b(digest_size=8)
    for a in arrays:
        if a is None:
            h.update(b"none")
        elif backend.is_sparse(a):
            for part in (a.data, a.indices, a.indptr):
                h.update(np.ascontiguousarray(backend.to_host(part)).tobytes())
        else:
            h.update(np.ascontiguousarray(backend.to_host(a)).tobytes())
            h.update(repr(a.shape).encode())
    return h.hexdigest()


def fingerprint(system: Any, options: dict, method: str = "", matrix: bool = True) -> str:
    """``part=digest;...`` of the method, the system and the options.

    The parts: method, structure, couplings, row scalings (``matrix=False``
    leaves these three out: a plan's solve, whose matrix was agreed on by its
    ``init``), right-hand side and options (``comm`` and ``callback`` excepted),
    named in :func:`agree`'s message.
    """
    settings = sorted((key, digest(value) if hasattr(value, "shape") else repr(value))
                      for key, value in options.items() if key not in IGNORED)
    parts = {"method": method}
    if matrix:
        structure = (system.lower, system.form, system.sizes, system.nrhs, str(system.dtype),
                     tuple((row, col, tuple(M.shape)) for row, col, M in system._edges))
        distinct = {id(M): M for _, _, M in system._edges}
        per = len(system.structure.sizes) if system.structure is not None else None
        scales = (system.periodic_scales(per) if per else system._row_scale)
        parts.update({"structure": repr(structure), "couplings": digest(*distinct.values()),
                      "row scalings": digest(*scales)})
    parts.update({"right-hand side": digest(system.rhs), "options": repr(settings)})
    return ";".join(f"{part}={hashlib.blake2b(text.encode(), digest_size=8).hexdigest()}"
                    for part, text in parts.items())


class Collective:
    """The registry's guard for the ``mpi.*`` methods (the module docstring's two phases).

    ``solve`` runs a method; ``prepare`` runs the work before a solve that could
    fail on one rank only (a forward pass of one rank's bad input, say) and
    agrees on its outcome the same way: :func:`propop.backprop` and
    :func:`propop.forward` call it for guarded methods.
    """

    def prepare(self, options: dict, work: Callable[[], Any]) -> Any:
        """``work()`` on every rank, its failure on any rank raised on all."""
        error, out = None, None
        try:
            out = work()
        except Exception as failure:  # agreed on below, then raised on every rank
            error = failure
        agree(options.get("comm") or world(), error)
        return out

    def init(self, method: str, system: Any, options: dict, checks: Callable[[], None],
             work: Callable[[], Any]) -> Any:
        """A plan's ``init`` on every rank, its outcome agreed on (one ``allgather``).

        ``checks()``, the partition, the fingerprints (method, matrix, options)
        and ``work()``, the method's ``init``, which sends no message, are
        agreed on together; then a state with a ``connect()`` method finishes
        its init by communicating, where an exception cannot be agreed on
        (:meth:`solve`'s second phase).
        """
        comm = options.get("comm") or world()
        error, mine, state = None, "", None
        try:
            checks()
            check_partition(system, comm.Get_size())
            mine = fingerprint(system, options, method)
            state = work()
        except Exception as failure:  # agreed on below, then raised on every rank
            error = failure
        agree(comm, error, mine)
        if hasattr(state, "connect"):
            _unagreeable(comm, state.connect)
        return state

    def solve(self, method: str, system: Any, options: dict, run: Callable[[Any], Any]
              ) -> Any:
        """A plan's solve: the right-hand side made and agreed on by every rank, then ``run``.

        ``system`` is a callable making the system (a plan's new right-hand
        side): its failure on one rank is agreed on, with the fingerprint of the
        right-hand side and the options (the matrix was agreed on by
        :meth:`init`). Returns ``(system, run(system))``.
        """
        comm = options.get("comm") or world()
        error, mine, callback = None, "", options.get("callback")
        try:
            system = system() if callable(system) else system
            mine = fingerprint(system, options, method, matrix=False)
        except Exception as failure:  # agreed on below, then raised on every rank
            error = failure
        if agree(comm, error, mine, flag=callback is not None):  # some rank has a callback
            options["callback"] = _agreed(comm, callback or _nothing)
        return system, _unagreeable(comm, lambda: run(system))


def _unagreeable(comm: Any, work: Callable[[], Any]) -> Any:
    """``work()``, which communicates: an exception no rank can agree on aborts the job."""
    try:
        return work()
    except RankError:  # agreed: every rank raises
        raise
    except _CallbackError as failure:  # agreed: this rank raises its own
        raise failure.__cause__ from None
    except BaseException:  # cannot be agreed on: end the job rather than hang it
        sys.stderr.write(f"propop: MPI rank {comm.Get_rank()} failed inside a solve; "
                         f"aborting all {comm.Get_size()} ranks:\n{traceback.format_exc()}")
        sys.stderr.flush()
        time.sleep(0.2)  # let mpiexec forward the message before it tears the job down
        comm.Abort(1)
        raise  # not reached under MPI


COLLECTIVE = Collective()


def _nothing(x: Any) -> None:
    """The callback of a rank that gave none while another rank gave one."""


class _CallbackError(Exception):
    """The callback raised on this rank (its exception is the cause)."""


def _agreed(comm: Any, callback: Callable) -> Callable:
    """``callback`` with its outcome agreed on by all ranks after every call."""
    def call(x: Any) -> None:
        error = None
        try:
            callback(x)
        except Exception as failure:
            error = failure
        try:
            agree(comm, error)
        except RankError:
            raise
        except Exception as failure:
            raise _CallbackError() from failure

    return call
