"""Sparse-weight experiments: pruning to a pattern, and what density costs cyclic reduction.

Sparse weights are ``scipy.sparse`` CSR arrays, and their gradients live on their
pattern (:meth:`propop.FNN.gradients`), so a pruned network keeps its mask through
:func:`propop.train` with no extra bookkeeping.

Three patterns, each chosen by :func:`mask` for a target density:

- ``"magnitude"``: the largest-magnitude entries of each matrix (unstructured).
- ``"block"``: the ``block x block`` tiles of largest Frobenius norm (structured, as
  block-sparse kernels want).
- ``"banded"``: a band of half-width ``h`` around the (stretched) diagonal, the
  magnitudes ignored (a local, convolution-like structure whose products widen
  by ``h`` per factor, so cyclic reduction's fill-in stays predictable).

:func:`prune` applies a pattern once, :func:`prune_gradually` along the cubic
schedule of Zhu and Gupta (2017) with training in between, and :func:`report`
tabulates accuracy, cyclic reduction's fill-in and its time against density (the
paper, section 4: the parallel algorithm "might also be relevant when the weight
matrices are sparse"). :func:`banded` and :func:`block_sparse` draw random
weights on the structured patterns, for networks built sparse from the start.

References
----------
M. Zhu and S. Gupta, "To prune, or not to prune: exploring the efficacy of pruning
for model compression", arXiv:1710.01878, 2017.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import scipy.sparse as sp

from . import backend
from ._checks import require_density
from .networks.fnn import FNN
from .solvers import solve
from .systems import backward_system
from .training import train

__all__ = ["PATTERNS", "mask", "prune", "prune_gradually", "density_of", "banded",
           "block_sparse", "report"]

PATTERNS = ("magnitude", "block", "banded")


def _largest(scores: np.ndarray, keep: int) -> np.ndarray:
    """A boolean array marking the ``keep`` largest ``scores`` (ties keep the first)."""
    chosen = np.zeros(scores.size, dtype=bool)
    chosen[np.argsort(-scores, axis=None, kind="stable")[:keep]] = True
    return chosen.reshape(scores.shape)


def _band(shape: Sequence[int], half_width: int) -> np.ndarray:
    """Entries within ``half_width`` columns of row ``i``'s centre ``(i + 1/2) m / n``."""
    n, m = shape
    centre = np.floor((np.arange(n) + 0.5) * m / n).astype(int)
    return np.abs(np.arange(m)[None, :] - centre[:, None]) <= half_width


def mask(W: Any, density: float, pattern: str = "magnitude", *, block: int = 4) -> Any:
    """The entries of ``W`` that ``pattern`` keeps at ``density``, as a boolean array.

    Parameters
    ----------
    W : array or sparse array, shape (n, m)
        Of any backend; entries already zero in a sparse ``W`` count as pruned.
        The mask is a NumPy array.
    density : float in (0, 1]
        The share of entries to keep: exact for ``"magnitude"`` (at least one
        entry), rounded to whole tiles for ``"block"`` and to a whole band
        ``2 h + 1`` columns wide for ``"banded"``.
    pattern : {"magnitude", "block", "banded"}
    block : int
        Tile size of the ``"block"`` pattern.

    Examples
    --------
    >>> import numpy as np
    >>> mask(np.arange(1.0, 7.0).reshape(2, 3), 0.5).astype(int)
    array([[0, 0, 0],
           [1, 1, 1]])
    >>> mask(np.ones((4, 4)), 0.75, "banded").astype(int)
    array([[1, 1, 0, 0],
           [1, 1, 1, 0],
           [0, 1, 1, 1],
           [0, 0, 1, 1]])
    """
    density = require_density(density)
    dense = np.abs(backend.to_host(backend.dense(W)))  # a pattern is chosen on the host
    if pattern == "magnitude":
        return _largest(dense, max(1, int(round(density * dense.size))))
    if pattern == "banded":
        return _band(dense.shape, max(0, int(round((density * dense.shape[1] - 1) / 2))))
    if pattern == "block":
        if int(block) != block or block < 1:
            raise ValueError(f"block must be an integer >= 1, got {block}")
        n, m = dense.shape
        padded = np.zeros((-(-n // block) * block, -(-m // block) * block))
        padded[:n, :m] = dense
        tiles = padded.reshape(padded.shape[0] // block, block, -1, block)
        norms = np.sqrt((tiles ** 2).sum(axis=(1, 3)))
        chosen = _largest(norms, max(1, int(round(density * norms.size))))
        return np.kron(chosen, np.ones((block, block), dtype=bool))[:n, :m]
    raise ValueError(f"unknown pattern {pattern!r}; choose one of {PATTERNS}")


def prune(net: FNN, density: float, pattern: str = "magnitude", *, block: int = 4) -> FNN:
    """``net`` with every weight matrix pruned to ``density`` by ``pattern`` (:func:`mask`).

    The kept entries keep their values; the weights become CSR arrays, whose
    pattern training preserves. Biases are not pruned. The pattern is chosen on
    the host, and the pruned network is on ``net``'s backend and device (a CSR
    tensor on PyTorch; the strict namespace has no sparse arrays and refuses).

    Examples
    --------
    >>> import propop as pp
    >>> net = prune(pp.FNN.random([16, 16, 4], seed=0), 0.25)
    >>> round(density_of(net), 2), net.sparse
    (0.25, True)
    """
    dense = [backend.to_host(backend.dense(W)) for W in net.W]
    weights = [sp.csr_array(np.where(mask(W, density, pattern, block=block), W, 0))
               for W in dense]
    pruned = FNN(weights, [backend.to_host(b) for b in net.b], activation=net.activations)
    kind = net.backend.name
    return pruned if kind == "numpy" else pruned.to(kind, backend.device(net.b[0]))


def density_of(net: FNN) -> float:
    """Stored weights over all weights, over every layer of ``net``."""
    nnz = sum(W.nnz if backend.is_sparse(W) else np.count_nonzero(backend.to_host(W))
              for W in net.W)
    return nnz / sum(W.shape[0] * W.shape[1] for W in net.W)


def prune_gradually(net: FNN, x: Any, y: Any, density: float, stages: int = 4,
                    epochs_per_stage: int = 1, pattern: str = "magnitude", *,
                    block: int = 4, **train_options: Any) -> tuple[FNN, list]:
    """Prune to ``density`` in ``stages`` steps with training after each (Zhu and Gupta).

    Stage ``t = 1..T`` prunes to ``d + (1 - d) (1 - t / T)^3``, the cubic
    schedule that prunes fast while the network has redundancy to spare and
    slowly near the target, then trains ``epochs_per_stage`` epochs
    (:func:`propop.train` with ``train_options``). Entries pruned once stay pruned.

    Returns
    -------
    net : FNN
        At ``density`` (to the rounding of ``pattern``).
    histories : list of History
        One per stage.
    """
    density = require_density(density)
    if int(stages) != stages or stages < 1:
        raise ValueError(f"stages must be an integer >= 1, got {stages}")
    histories = []
    for t in range(1, stages + 1):
        net = prune(net, density + (1 - density) * (1 - t / stages) ** 3, pattern, block=block)
        net, history = train(net, x, y, epochs=epochs_per_stage, **train_options)
        histories.append(history)
    return net, histories


def _random_on(pattern: np.ndarray, seed: int) -> Any:
    """Normal weights on ``pattern``, scaled by the mean number of entries per row."""
    rng = np.random.default_rng(seed)
    std = 1 / np.sqrt(max(1.0, pattern.sum() / pattern.shape[0]))
    return sp.csr_array(np.where(pattern, std * rng.standard_normal(pattern.shape), 0))


def banded(shape: Sequence[int], half_width: int, seed: int = 0) -> Any:
    """Random weights on a band ``2 half_width + 1`` wide (unit gain per row on average).

    Examples
    --------
    >>> banded((5, 5), 1).nnz
    13
    """
    return _random_on(_band(tuple(shape), half_width), seed)


def block_sparse(shape: Sequence[int], block: int, density: float, seed: int = 0) -> Any:
    """Random weights in ``block x block`` tiles, a ``density`` share of the tiles present."""
    rng = np.random.default_rng(seed)
    scores = rng.random((-(-shape[0] // block), -(-shape[1] // block)))
    return _random_on(mask(scores, density, "magnitude").repeat(block, 0).repeat(block, 1)
                      [: shape[0], : shape[1]], seed + 1)


def report(net: FNN, x: Any, y: Any, densities: Sequence[float], x_test: Any, y_test: Any,
           pattern: str = "magnitude", *, stages: int = 1, epochs: int = 1, block: int = 4,
           batch: int = 32, repeats: int = 5, **train_options: Any) -> list[dict]:
    """Accuracy, cyclic reduction's fill-in and its time against density.

    For each density, ``net`` is pruned by ``pattern`` (in ``stages`` steps of
    :func:`prune_gradually`, one-shot by default) and trained ``epochs`` epochs
    after each stage (``train_options`` go to :func:`propop.train`). Then the
    backward system of the first ``batch`` training samples is solved by
    ``substitution`` and by sparse ``cyclic-reduction``, each once to warm up
    and ``repeats`` times.

    Returns
    -------
    list of dict
        One per density: ``density`` (reached), ``test_accuracy``,
        ``fill_in`` (non-zeros of a reduced block over an original one, per
        level), ``cr_seconds`` and ``substitution_seconds`` (medians),
        ``cr_error`` (relative to substitution) and ``levels``.

    Raises
    ------
    ValueError
        For a network on another backend than NumPy (sparse cyclic reduction
        multiplies SciPy's sparse arrays).
    """
    if int(repeats) != repeats or repeats < 1:
        raise ValueError(f"repeats must be an integer >= 1, got {repeats}")
    if net.backend.name != "numpy":  # refused before any density is trained
        raise ValueError(f"report measures sparse cyclic reduction, whose products are "
                         f"SciPy's (on the CPU); this network is on {net.backend.name}: "
                         "pass net.to('numpy') and NumPy data")
    rows = []
    for density in densities:
        model, histories = prune_gradually(net, x, y, density, stages, epochs, pattern,
                                           block=block, x_test=x_test, y_test=y_test,
                                           **train_options)
        trace = model.forward(x[:, :batch])
        eps = model.loss_gradient(trace, y[..., :batch],
                                  train_options.get("loss", "cross_entropy"))
        system = backward_system(model, trace, eps)
        exact, substitution_seconds = _timed(system, "substitution", repeats)
        cr, cr_seconds = _timed(system, "cyclic-reduction", repeats, sparse=True)
        rows.append({"density": density_of(model),
                     "test_accuracy": histories[-1].epochs[-1]["test_accuracy"],
                     "fill_in": cr.info.get("fill_in", []), "levels": cr.levels,
                     "cr_error": float(np.linalg.norm(cr.x - exact.x) / np.linalg.norm(exact.x)),
                     "cr_seconds": cr_seconds, "substitution_seconds": substitution_seconds})
    return rows


def _timed(system: Any, method: str, repeats: int, **options: Any) -> tuple[Any, float]:
    """A solution by ``method``, and the median time of ``repeats`` solves after a warm-up."""
    solutions = [solve(system, method, **options) for _ in range(repeats + 1)]
    return solutions[-1], float(np.median([s.time for s in solutions[1:]]))
