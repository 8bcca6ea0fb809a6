"""Data parallelism: the samples of a mini-batch split over ranks, gradients summed.

Each rank backpropagates its share of the columns with a single-process method,
then the parameter gradients are summed with ``Allreduce`` and ``dE/dx``
gathered, so every rank ends with the gradients of the whole batch. As for the
``mpi.*`` methods (:mod:`.guard`), the ranks first agree that each succeeded and
that all hold the same network, batch and settings; otherwise every rank raises.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from ..propagation import backprop as _backprop
from .guard import IGNORED, agree, digest
from .system import partition, world

__all__ = ["backprop"]


def backprop(net: Any, x: Any, target: Any, loss: str = "mse", method: str = "substitution",
             *, comm: Any = None, **options: Any) -> Any:
    """:func:`propop.backprop` with the batch split over the ranks of ``comm``.

    Samples are the last axis of ``x`` and ``target`` (columns for FNNs and graphs,
    ``(tau, n, r)`` for RNNs); ranks take contiguous, nearly equal shares.
    ``g.solution`` is this rank's own solve.
    """
    comm = world() if comm is None else comm
    error, digest, mine = None, "", None
    try:  # checks and the local solve communicate nothing: agreed on below
        if str(method).startswith("mpi."):
            raise ValueError(f"{method!r} splits one system over the ranks, but data-parallel "
                             "backprop gives every rank its own samples: use a single-process "
                             "method such as 'substitution' or 'cyclic-reduction'")
        r = np.shape(x)[-1]
        if np.ndim(x) < 2 or comm.Get_size() > r:
            raise ValueError(f"{comm.Get_size()} ranks need a batch of at least as many "
                             f"samples, got x of shape {np.shape(x)}")
        digest = _fingerprint(net, x, target, loss, method, options)
        lo, hi = partition(r, comm.Get_size())[comm.Get_rank()]
        mine = _backprop(net, x[..., lo:hi], _columns(target, lo, hi, r), loss, method,
                         **options)
    except Exception as failure:
        error = failure
    agree(comm, error, digest)
    changes = {}
    for field in dataclasses.fields(mine):
        value = getattr(mine, field.name)
        if field.name == "x":
            changes["x"] = np.concatenate(comm.allgather(np.asarray(value)), axis=-1)
        elif field.name == "parameters":
            changes["parameters"] = {node: {k: _summed(comm, v) for k, v in grads.items()}
                                     for node, grads in value.items()}
        elif isinstance(value, tuple):
            changes[field.name] = tuple(_summed(comm, v) for v in value)
    return dataclasses.replace(mine, **changes)


def _fingerprint(net: Any, x: Any, target: Any, loss: str, method: str, options: dict) -> str:
    """``part=digest;...`` of the network, the whole batch and the settings.

    As :func:`~propop.distributed.guard.fingerprint`: every rank must pass the same.
    """
    from ..training import parameters

    targets = target if isinstance(target, list) else [target]
    settings = sorted((k, repr(v)) for k, v in options.items() if k not in IGNORED)
    parts = {"network": digest(*parameters(net).values()), "x": digest(np.asarray(x)),
             "target": digest(*(np.asarray(t) for t in targets)),
             "settings": repr((loss, method, settings))}
    return ";".join(f"{part}={digest(np.frombuffer(text.encode(), np.uint8))}"
                    if part == "settings" else f"{part}={text}" for part, text in parts.items())


def _columns(target: Any, lo: int, hi: int, r: int) -> Any:
    if isinstance(target, list):  # a graph's several outputs
        return [_columns(t, lo, hi, r) for t in target]
    target = np.asarray(target)
    return target[..., lo:hi] if target.shape[-1] == r else target


def _summed(comm: Any, value: Any) -> Any:
    """``value`` summed over the ranks (a sparse gradient on its pattern)."""
    from mpi4py import MPI

    data = value.data if hasattr(value, "toarray") else value
    total = np.empty_like(np.ascontiguousarray(data))
    comm.Allreduce(np.ascontiguousarray(data), total, op=MPI.SUM)
    if hasattr(value, "toarray"):
        summed = value.copy()
        summed.data = total
        return summed
    return total
