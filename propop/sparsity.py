"""Sparse-weight experiments: magnitude pruning, structured patterns, and what density costs.

Sparse weights are ``scipy.sparse`` arrays; their gradients live on their pattern
(:meth:`propop.FNN.gradients`), so a pruned network keeps its mask through
:func:`propop.training.train` with no extra bookkeeping.

- :func:`prune`: one-shot magnitude pruning of a network to a target density;
  :func:`prune_gradually` alternates pruning and training along the cubic
  schedule of Zhu and Gupta (2017).
- :func:`banded`, :func:`block_sparse`: structured random patterns.
- :func:`report`: per density, the accuracy after training and the fill-in and
  time of cyclic reduction on the trained network's backward system.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import scipy.sparse as sp

from .networks.fnn import FNN
from .propagation import backprop
from .solvers import solve
from .systems import backward_system
from .training import train

__all__ = ["prune", "prune_gradually", "banded", "block_sparse", "report", "density_of"]


def _check_density(density: float) -> float:
    if not 0 < density <= 1:
        raise ValueError(f"density must lie in (0, 1], got {density}")
    return float(density)


def _pruned(W: Any, density: float) -> Any:
    """The largest-magnitude ``density`` share of ``W``'s entries (ties keep the first)."""
    dense = W.toarray() if sp.issparse(W) else np.asarray(W)
    keep = max(1, int(round(density * dense.size)))
    order = np.argsort(-np.abs(dense), axis=None, kind="stable")[:keep]
    mask = np.zeros(dense.size, dtype=bool)
    mask[order] = True
    return sp.csr_array(np.where(mask.reshape(dense.shape), dense, 0))


def prune(net: FNN, density: float) -> FNN:
    """``net`` with every weight matrix pruned by magnitude to ``density`` (biases kept)."""
    density = _check_density(density)
    return FNN([_pruned(W, density) for W in net.W], net.b, activation=net.activations)


def density_of(net: FNN) -> float:
    """Non-zero weights over all weights."""
    nnz = sum(W.nnz if sp.issparse(W) else np.count_nonzero(W) for W in net.W)
    return nnz / sum(W.shape[0] * W.shape[1] for W in net.W)


def prune_gradually(net: FNN, x: Any, y: Any, density: float, stages: int = 4,
                    epochs_per_stage: int = 1, **train_options: Any) -> tuple[FNN, list]:
    """Prune to ``density`` in ``stages`` steps, training after each (Zhu and Gupta's cubic).

    Stage ``t`` of ``T`` prunes to ``d + (1 - d)(1 - t / T)^3``; returns the
    network and each stage's :class:`~propop.training.History`.
    """
    density = _check_density(density)
    histories = []
    for t in range(1, stages + 1):
        net = prune(net, density + (1 - density) * (1 - t / stages) ** 3)
        net, history = train(net, x, y, epochs=epochs_per_stage, **train_options)
        histories.append(history)
    return net, histories


def banded(shape: Sequence[int], half_width: int, seed: int = 0) -> Any:
    """Random weights on ``2 half_width + 1`` diagonals, scaled for unit variance gain."""
    rng = np.random.default_rng(seed)
    offsets = range(-half_width, half_width + 1)
    std = 1 / np.sqrt(len(offsets))
    return sp.csr_array(sp.diags([std * rng.standard_normal(min(shape)) for _ in offsets],
                                 list(offsets), shape=tuple(shape)))


def block_sparse(shape: Sequence[int], block: int, density: float, seed: int = 0) -> Any:
    """Random weights in ``block x block`` tiles, a ``density`` share of the tiles present."""
    density = _check_density(density)
    rng = np.random.default_rng(seed)
    rows, cols = -(-shape[0] // block), -(-shape[1] // block)
    tiles = rng.random((rows, cols)) < density
    mask = np.kron(tiles, np.ones((block, block), dtype=bool))[: shape[0], : shape[1]]
    std = 1 / np.sqrt(max(1.0, density * shape[1]))
    return sp.csr_array(np.where(mask, std * rng.standard_normal(tuple(shape)), 0))


def report(net: FNN, x: Any, y: Any, densities: Sequence[float], x_test: Any, y_test: Any,
           **train_options: Any) -> list[dict]:
    """Per density: prune, train; then test accuracy, and CR's fill-in and time.

    The backward system is that of the first 32 training samples; ``fill_in``
    lists the non-zeros of a reduced block over an original one, level by level.
    """
    rows = []
    for density in densities:
        model, history = train(prune(net, density), x, y, x_test=x_test, y_test=y_test,
                               **train_options)
        trace = model.forward(x[:, :32])
        system = backward_system(model, trace, model.loss_gradient(trace, y[:32],
                                                                   "cross_entropy"))
        start = time.perf_counter()
        sol = solve(system, "cyclic-reduction", sparse=True)
        rows.append({"density": density, "test_accuracy": history.epochs[-1]["test_accuracy"],
                     "fill_in": sol.info.get("fill_in", []),
                     "cr_seconds": time.perf_counter() - start,
                     "backprop_seconds": _timed(model, x[:, :32], y[:32])})
    return rows


def _timed(model: FNN, x: Any, y: Any) -> float:
    """Seconds of one sequential backpropagation (forward and backward)."""
    start = time.perf_counter()
    backprop(model, x, y, "cross_entropy")
    return time.perf_counter() - start
