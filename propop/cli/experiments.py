"""Experiments: the tables of ``propop run`` and ``propop demo``, method by method.

Each row is one method on one backward system of a random network: status,
iterations, levels, the gradient error against the sequential reference, and
the median time (:func:`experiment`; :func:`report` prints it).
"""

from __future__ import annotations

import platform
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import scipy

from .. import backend, memory, solvers
from ..memory import MemoryBudgetError
from ..networks.fnn import FNN
from ..networks.graph import Graph
from ..networks.rnn import RNN
from ..progress import bar
from ..solvers.registry import REQUIREMENT_WORDS
from ..systems import backward_system

__all__ = ["Row", "experiment", "gradient_error", "problem", "report", "format_table",
           "solvers_table", "unavailable_note", "NETWORKS"]


NETWORKS = ("fnn", "rnn", "graph")


@dataclass(frozen=True)
class Row:
    """One method's line in the experiment table."""

    method: str
    exact: bool
    status: str
    iterations: int
    levels: int
    error: float
    seconds: float
    rank_seconds: tuple = ()


def _dense(a: Any) -> np.ndarray:
    return np.asarray(backend.dense(a), dtype=float)


def gradient_error(g: Any, reference: Any) -> float:
    """Largest relative 2-norm error over all of ``dW``, ``dU`` (RNNs), ``db`` and ``dx``."""
    pairs = [(g.x, reference.x)]
    for name in ("W", "U", "b"):
        pairs += list(zip(getattr(g, name, ()), getattr(reference, name, ())))
    for node, grads in getattr(g, "parameters", {}).items():  # a Graph's
        pairs += [(value, reference.parameters[node][key]) for key, value in grads.items()]
    errors = [np.linalg.norm(_dense(a) - _dense(b)) / max(np.linalg.norm(_dense(b)), 1e-300)
              for a, b in pairs]
    return float(max(errors))


def problem(network: str, layers: int, width: int, batch: int, activation: str,
             density: float, dtype: str, seed: int, tau: int) -> tuple:
    """``(net, trace, eps)`` of a random FNN, RNN or residual graph with random data.

    Its memory is estimated from the sizes alone first: no list of ``layers``
    widths is made for a problem beyond the budget.
    """
    what = f"a {network} of {layers} layers of width {width}"
    memory.require_arrays((1 if network == "fnn" else 2) * layers * width * width,
                          np.dtype(dtype).itemsize, what, "use fewer or narrower layers")
    memory.require_arrays(2 * (layers + 1) * width * batch * (tau if network == "rnn" else 1),
                          np.dtype(dtype).itemsize, f"the forward pass of {what} with batch "
                          f"{batch}", "use a smaller batch or fewer layers")
    rng = np.random.default_rng(seed)
    if network == "graph":
        net = Graph.residual_mlp(width, layers, activation, seed)
        trace = net.forward(rng.standard_normal((width, batch)))
        return net, trace, net.loss_gradient(trace, rng.standard_normal((width, batch)))
    if network == "rnn":
        net = RNN.random([width] * (layers + 1), activation=activation, seed=seed, dtype=dtype)
        trace = net.forward(rng.standard_normal((tau, width, batch)).astype(dtype))
        return net, trace, net.loss_gradient(trace, rng.standard_normal(
            trace.output.shape).astype(dtype))
    net = FNN.random([width] * (layers + 1), activation=activation, density=density,
                     seed=seed, dtype=dtype, bias=0.1)
    trace = net.forward(rng.standard_normal((width, batch)).astype(dtype))
    return net, trace, net.loss_gradient(trace, rng.standard_normal(
        (width, batch)).astype(dtype))


def experiment(layers: int = 6, width: int = 256, batch: int = 32, activation: str = "tanh",
               density: float = 1.0, methods: Sequence[str] | None = None,
               dtype: str = "float64", seed: int = 0, repeats: int = 5,
               network: str = "fnn", tau: int = 100, progress: bool | str = False,
               distributed: bool = False, options: dict | None = None) -> list[Row]:
    """Backward pass of a random network through each method, against the sequential reference.

    ``network`` is ``"fnn"``, ``"rnn"`` (``tau`` time steps) or ``"graph"`` (a
    residual MLP of ``layers`` blocks). Each method runs
    once to warm up, then ``repeats`` times; the median time is reported. Errors
    are of the gradients (``dW``, ``dU``, ``db``, ``dx``). Methods that need a
    structure the system lacks get a row saying so. ``progress`` shows a bar over
    the methods (:mod:`propop.progress`). ``distributed`` (under ``mpiexec``) runs
    the ``mpi.*`` methods by default, times each rank and reports the slowest
    rank's time, with every rank's in ``Row.rank_seconds``. ``options`` (``rtol``,
    ``atol``) go to every solve.
    """
    names = [s.name for s in solvers.available() if s.available and (
        s.name.startswith("mpi.") or not distributed)] if methods is None else list(methods)
    for name in names:
        solvers.info(name).require_available()  # unknown names fail before any work
    if network not in NETWORKS:
        raise ValueError(f"network must be one of {NETWORKS}, got {network!r}")
    net, trace, eps = problem(network, layers, width, batch, activation, density, dtype,
                               seed, tau)
    reference = net.gradients(trace, net.backward(trace, eps))
    system = backward_system(net, trace, eps)
    rows = []
    with bar(progress, len(names), "methods") as shown:
        for name in names:
            rows.append(_measure(name, system, net, trace, reference, repeats, options or {}))
            shown.update()
    return [_per_rank(row) for row in rows] if distributed else rows


def _per_rank(row: Row) -> Row:
    """``row`` with every rank's time, and the slowest as its time."""
    from ..distributed.system import world

    seconds = tuple(world().allgather(row.seconds))
    return replace(row, seconds=max(seconds), rank_seconds=seconds)


def _measure(name: str, system: Any, net: Any, trace: Any, reference: Any, repeats: int,
             options: dict) -> Row:
    """One method's row: warm-up solve, ``repeats`` timed solves, gradient error."""
    exact = solvers.info(name).exact
    if not solvers.info(name).applies_to(system):
        needs = " and ".join(REQUIREMENT_WORDS[r] for r in solvers.info(name).requires)
        return Row(name, exact, f"N/A (needs a {needs})", 0, 0, float("nan"), float("nan"))
    try:
        solution = solvers.solve(system, name, **options)
    except MemoryBudgetError as error:
        return Row(name, exact, f"N/A (memory: needs {error.estimate / 2**30:.1f} GiB, budget "
                   f"{error.budget / 2**30:.1f} GiB)", 0, 0, float("nan"), float("nan"))
    times = [solvers.solve(system, name, **options).time for _ in range(repeats)]
    g = net.gradients(trace, net.unstack(system, solution.x))
    return Row(name, exact, solution.status.name, solution.iterations, solution.levels,
               gradient_error(g, reference), statistics.median(times))


def format_table(rows: Sequence[Row], baseline: str = "substitution") -> str:
    """A Markdown table of ``rows``, times also relative to ``baseline`` if present."""
    base = next((r.seconds for r in rows if r.method == baseline), None)
    ranks = any(r.rank_seconds for r in rows)
    lines = ["| method | exact | status | iterations | levels | gradient error | time [ms] "
             f"| vs {baseline} |" + (" per rank [ms] |" if ranks else ""),
             "|---|---|---|---:|---:|---:|---:|---:|" + ("---|" if ranks else "")]
    for r in rows:
        if r.status.startswith("N/A"):
            lines.append(f"| {r.method} | {'yes' if r.exact else 'no'} | {r.status} | "
                         "| | | | |" + (" |" if ranks else ""))
            continue
        ratio = f"{r.seconds / base:.2f}x" if base else "-"
        per_rank = " ".join(f"{1e3 * t:.2f}" for t in r.rank_seconds)
        lines.append(f"| {r.method} | {'yes' if r.exact else 'no'} | {r.status} | "
                     f"{r.iterations} | {r.levels} | {r.error:.1e} | "
                     f"{1e3 * r.seconds:.2f} | {ratio} |" + (f" {per_rank} |" if ranks else ""))
    return "\n".join(lines)


def machine() -> str:
    """One line naming the machine and library versions."""
    import pyamg

    return (f"{platform.machine()} {platform.system()}, Python {platform.python_version()}, "
            f"numpy {np.__version__}, scipy {scipy.__version__}, pyamg {pyamg.__version__}")


def solvers_table() -> str:
    """The registry as a Markdown table (``propop solvers``)."""
    lines = ["| name | kind | exact | runs on | available | description |",
             "|---|---|---|---|---|---|"]
    for s in solvers.available():
        here = "yes" if s.available else f"no: pip install propop[{s.extra}]"
        lines.append(f"| {s.name} | {s.kind} | {'yes' if s.exact else 'no'} | "
                     f"{s.tested} | {here} | {s.description} |")
    return "\n".join(lines)


def unavailable_note() -> str:
    """One line naming the registered methods whose optional modules are missing, or ``""``."""
    missing: dict[str, list[str]] = {}
    for s in solvers.available():
        if not s.available:
            missing.setdefault(s.extra, []).append(s.name)
    return "; ".join(f"Skipped {', '.join(names)}: they need pip install propop[{extra}]."
                     for extra, names in missing.items())


def _require_abort_on_failure() -> None:
    """Warn when several ranks run without ``python -m mpi4py`` (a failing rank would hang)."""
    from ..distributed.system import world

    if world().Get_size() > 1 and "mpi4py.run" not in sys.modules and world().Get_rank() == 0:
        print("propop: warning: not started as 'mpiexec -n P python -m mpi4py -m propop run "
              "--distributed': an exception on one rank would leave the others waiting "
              "instead of aborting the job", file=sys.stderr)


def report(settings: dict) -> list[Row]:
    """Run :func:`experiment` with ``settings``, print its table, the machine and the time.

    Returns the rows (on the ranks that do not print, too).
    """
    start = time.perf_counter()
    if settings.get("distributed"):
        _require_abort_on_failure()
    rows = experiment(**settings)
    if settings.get("distributed"):
        from ..distributed.system import world

        if world().Get_rank() != 0:  # rank 0 prints the table
            return rows
        print(f"Distributed over {world().Get_size()} MPI ranks; times are the slowest "
              "rank's, then every rank's.")
    kind = {"fnn": "an FNN", "rnn": f"a tanh RNN over {settings['tau']} time steps",
            "graph": "a residual MLP graph (blocks x + W2 f(W1 x + b1))"}[settings["network"]]
    print(f"Backward pass of {kind}: {settings['layers']} layers of width "
          f"{settings['width']}, batch {settings['batch']}, {settings['activation']}, "
          f"density {settings['density']}, {settings['dtype']}"
          + "".join(f", {k}={v:g}" for k, v in (settings.get("options") or {}).items())
          + "; gradient error relative to "
          f"the sequential reference; median of {settings['repeats']} runs after a "
          "warm-up.\n")
    print(format_table(rows, "mpi.substitution" if settings.get("distributed")
                       else "substitution"))
    if settings.get("methods") is None and unavailable_note():
        print(f"\n{unavailable_note()}")
    print(f"\n{machine()}; total {time.perf_counter() - start:.1f} s\n")
    return rows
