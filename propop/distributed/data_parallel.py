"""Data parallelism: the samples of a mini-batch split over ranks, gradients summed.

Each rank backpropagates its share of the columns with any method (``mpi.*`` or
not), then the parameter gradients are summed with ``Allreduce`` and ``dE/dx``
gathered, so every rank ends with the gradients of the whole batch.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from ..propagation import backprop as _backprop
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
    r = np.shape(x)[-1]
    if np.ndim(x) < 2 or comm.Get_size() > r:
        raise ValueError(f"{comm.Get_size()} ranks need a batch of at least as many samples, "
                         f"got x of shape {np.shape(x)}")
    lo, hi = partition(r, comm.Get_size())[comm.Get_rank()]
    mine = _backprop(net, x[..., lo:hi], _columns(target, lo, hi, r), loss, method, **options)
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
