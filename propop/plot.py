"""Plots of what propop studies: system structure, convergence, levels, training, density.

matplotlib is optional (``pip install "propop[plot]"``); it is imported when a
plot is drawn. Every function draws on ``ax`` (a new figure's axes if omitted)
and returns the matplotlib ``Axes``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from . import backend
from .networks.fnn import FNN
from .solvers.plan import solve
from .systems import backward_system

__all__ = ["plot_system", "plot_convergence", "plot_levels", "plot_training", "plot_density",
           "plot_newton"]

ENTRY_LIMIT = 2000  # above this many unknowns, plot the block pattern instead


def _axes(ax: Any) -> Any:
    if ax is not None:
        return ax
    try:
        import matplotlib.pyplot as plt
    except ImportError as error:  # pragma: no cover - exercised without matplotlib
        raise ImportError("propop.plot needs matplotlib: pip install 'propop[plot]'"
                          ) from error
    return plt.figure().add_subplot()


def block_pattern(system: Any) -> np.ndarray:
    """The ``nblocks x nblocks`` pattern: ``True`` where a block is non-zero."""
    B = system.blocks
    pattern = np.eye(system.nblocks, dtype=bool)
    for e in B.edges:
        pattern[e.row, e.col] = True
    return pattern


def plot_system(system: Any, ax: Any = None, sample: int = 0) -> Any:
    """Spy plot of one sample's matrix, or of the block pattern for large systems.

    Systems with at most ``ENTRY_LIMIT`` unknowns per sample show every entry
    (paper eqs. forw_prop_sys, back_prop_sys); larger ones show the
    ``nblocks x nblocks`` block pattern, one mark per non-zero block.
    """
    ax = _axes(ax)
    single = system.sample(sample) if system.nrhs is not None else system
    if single.size <= ENTRY_LIMIT:
        ax.spy(backend.to_host(single.matrix).tocsr(), markersize=max(0.5, 200 / single.size))
        ax.set_title(f"{'lower' if system.lower else 'upper'} system, N = {single.size}")
    else:
        ax.spy(block_pattern(system), markersize=max(1.0, 200 / system.nblocks))
        ax.set_title(f"block pattern, {system.nblocks} blocks")
    return ax


def _styles(count: int) -> list[tuple[str, str]]:
    """A marker and a line style per line, so that equal curves stay visible."""
    styles = [("o", "-"), ("s", "--"), ("^", "-."), ("D", ":"), ("v", "-"), ("x", "--")]
    return (styles * (count // len(styles) + 1))[:count]


def _unique(labels: Sequence[str]) -> list[str]:
    """``labels`` with repeats numbered, so that no legend entry appears twice."""
    seen: dict[str, int] = {}
    out = []
    for label in labels:
        seen[label] = seen.get(label, 0) + 1
        out.append(label if seen[label] == 1 else f"{label} #{seen[label]}")
    return out


def _semilogy_histories(ax: Any, histories: Sequence[Any], labels: Sequence[str],
                        steps: Sequence[Any] | None = None) -> None:
    """Residual histories on a log axis; an exact zero drawn at the floor, not as a drop.

    ``steps`` are each history's x values (default: ``0, 1, 2, ...``).
    """
    floor = min((float(v) for h in histories for v in h if v > 0), default=1e-16) / 10
    steps = steps or [np.arange(len(h)) for h in histories]
    for history, x, label, (marker, line) in zip(histories, steps, _unique(labels),
                                                 _styles(len(histories))):
        history = np.maximum(np.asarray(history, dtype=float), floor)
        ax.semilogy(x, history, marker=marker, linestyle=line, label=label)
    ax.xaxis.get_major_locator().set_params(integer=True)


def applications(solution: Any) -> np.ndarray:
    """The x of each entry of ``solution.residuals``: operator applications so far.

    ``solution.levels`` counts them (one per Jacobi sweep or GMRES step, two per
    BiCGStab iteration, the library's products for SciPy's and PyAMG's solvers;
    the parallel steps of a direct method), spread evenly over the history.
    """
    n = len(solution.residuals)
    return np.linspace(0, solution.levels, n) if n > 1 else np.zeros(n)


def plot_convergence(solutions: Sequence[Any] | Mapping[str, Any], ax: Any = None,
                     relative: bool = True, title: str = "Residual histories",
                     labels: Sequence[str] | None = None) -> Any:
    """Residual histories (semilogy) against operator applications, one line per solution.

    Parameters
    ----------
    solutions : sequence of Solution, or dict label -> Solution
        A dict's keys are the labels.
    relative : bool
        Divide each history by its initial residual.
    labels : sequence of str, optional
        One per solution; default ``"method (status)"``, repeats numbered.

    Every method on one x unit: operator applications (:func:`applications`),
    so two BiCGStab iterations and four GMRES steps sit at the same x.
    """
    if isinstance(solutions, Mapping):
        if labels is not None:
            raise ValueError("labels: a dict of solutions is labelled by its keys already")
        labels, solutions = list(solutions), list(solutions.values())
    solutions = list(solutions)
    if labels is not None and len(labels) != len(solutions):
        raise ValueError(f"labels: {len(labels)} given for {len(solutions)} solutions")
    ax = _axes(ax)
    histories = []
    for solution in solutions:
        history = np.asarray(solution.residuals, dtype=float)
        if relative and history.size and history[0] > 0:
            history = history / history[0]
        histories.append(history)
    _semilogy_histories(ax, histories, list(labels) if labels is not None else [
        f"{s.method} ({s.status.name.lower()})" for s in solutions],
        [applications(s) for s in solutions])
    ax.set_xlabel("operator applications (parallel steps of a direct method)")
    ax.set_ylabel("relative residual" if relative else "residual")
    ax.set_title(title)
    ax.legend()
    return ax


def levels_by_depth(depths: Sequence[int], methods: Sequence[str], width: int = 4,
                    seed: int = 0) -> dict[str, list[int]]:
    """``Solution.levels`` of each method on random tanh FNNs of each depth."""
    out: dict[str, list[int]] = {method: [] for method in methods}
    rng = np.random.default_rng(seed)
    for depth in depths:
        net = FNN.random([width] * (depth + 1), activation="tanh", seed=seed)
        trace = net.forward(rng.standard_normal(width))
        system = backward_system(net, trace, np.ones(width))
        for method in methods:
            out[method].append(solve(system, method).levels)
    return out


def plot_levels(depths: Sequence[int] = (1, 2, 4, 8, 16, 32, 64, 128, 256),
                methods: Sequence[str] = ("substitution", "cyclic-reduction",
                                          "parallel-cyclic-reduction"),
                ax: Any = None, width: int = 4) -> Any:
    """Parallel levels against depth: ``l + 1`` sequential steps against ``log2``."""
    ax = _axes(ax)
    styles = [("o", "-"), ("s", "--"), ("^", ":"), ("D", "-.")]
    for (method, levels), (marker, line) in zip(
            levels_by_depth(depths, methods, width).items(), styles * len(methods)):
        ax.loglog(depths, levels, marker=marker, linestyle=line, label=method, base=2)
    ax.set_xlabel("layers l")
    ax.set_ylabel("levels (parallel steps)")
    ax.set_title("Parallel steps of a backward pass")
    ax.legend()
    return ax


def plot_training(histories: Mapping[str, Any], key: str = "test_accuracy",
                  ax: Any = None) -> Any:
    """``key`` per epoch, one line per labelled :class:`~propop.History`.

    ``key`` is any per-epoch entry: ``"loss"``, ``"accuracy"``, ``"test_loss"``,
    ``"test_accuracy"``. Compare, say, exact and truncated backward solves.
    """
    ax = _axes(ax)
    for (label, history), (marker, line) in zip(histories.items(), _styles(len(histories))):
        values = [epoch[key] for epoch in history.epochs]
        ax.plot(np.arange(1, len(values) + 1), values, marker=marker, linestyle=line,
                label=label)
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_xlabel("epoch")
    ax.set_ylabel(key.replace("_", " "))
    ax.set_title(f"Training: {key.replace('_', ' ')} per epoch")
    ax.legend()
    return ax


def plot_density(rows: Sequence[dict], ax: Any = None, label: str | None = None) -> Any:
    """Test accuracy against weight density, from :func:`propop.sparsity.report` rows."""
    ax = _axes(ax)
    marker, line = _styles(len(ax.lines) + 1)[-1]  # one style per pattern drawn here
    densities = [r["density"] for r in rows]
    ax.semilogx(densities, [r["test_accuracy"] for r in rows], marker=marker,
                linestyle=line, label=label)
    ticks = sorted(set(densities) | set(ax.get_xticks(minor=False)) & set(densities))
    ax.set_xticks(ticks, [f"{d:g}" for d in ticks])  # every density labelled, no lone 10^-1
    ax.tick_params(axis="x", which="minor", labelbottom=False)
    ax.set_xlabel("weight density")
    ax.set_ylabel("test accuracy")
    ax.set_title("Pruned networks: test accuracy against density")
    if label is not None:
        ax.legend()
    return ax


def plot_newton(traces: Mapping[str, Any], ax: Any = None,
                title: str = "Parallel forward passes: the Newton family") -> Any:
    """Nonlinear residual per iteration of :func:`propop.forward` runs (semilogy).

    ``traces`` maps a label (a linearization, say) to a returned trace; each line
    has its own marker and line style, so that equal histories stay visible.
    An exactly zero residual is drawn at the axis' floor, not as a drop.
    """
    ax = _axes(ax)
    _semilogy_histories(ax, [t.info["residuals"] for t in traces.values()],
                        [f"{label} ({t.info['iterations']} iterations)"
                         for label, t in traces.items()])
    ax.set_xlabel("iteration")
    ax.set_ylabel("nonlinear residual")
    ax.set_title(title)
    ax.legend()
    return ax
