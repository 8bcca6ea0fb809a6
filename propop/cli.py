"""The ``propop`` command: list solvers, run the demo, run an experiment."""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, NoReturn

import numpy as np
import scipy

from . import backend, memory, solvers
from .solvers.registry import REQUIREMENT_WORDS
from .activations import available_activations
from .memory import MemoryBudgetError
from .networks.fnn import FNN
from .networks.graph import Graph
from .networks.rnn import RNN
from .propagation import backprop
from .progress import bar
from .sparsity import PATTERNS
from .solvers import solve
from .solvers.solution import ConvergenceError, Solution, Status
from .systems import TriangularSystem, backward_system

__all__ = ["main", "experiment", "Row", "gradient_error"]

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


def _problem(network: str, layers: int, width: int, batch: int, activation: str,
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
    net, trace, eps = _problem(network, layers, width, batch, activation, density, dtype,
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
    from .distributed.system import world

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


def _solvers_table() -> str:
    lines = ["| name | kind | exact | backends | available | description |",
             "|---|---|---|---|---|---|"]
    for s in solvers.available():
        here = "yes" if s.available else f"no: pip install propop[{s.extra}]"
        lines.append(f"| {s.name} | {s.kind} | {'yes' if s.exact else 'no'} | "
                     f"{', '.join(s.backends)} | {here} | {s.description} |")
    return "\n".join(lines)


def unavailable_note() -> str:
    """One line naming the registered methods whose optional modules are missing, or ``""``."""
    missing: dict[str, list[str]] = {}
    for s in solvers.available():
        if not s.available:
            missing.setdefault(s.extra, []).append(s.name)
    return "; ".join(f"Skipped {', '.join(names)}: they need pip install propop[{extra}]."
                     for extra, names in missing.items())


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line error and exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"propop: error: {message}\n")


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _density(text: str) -> float:
    value = float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must lie in (0, 1], got {value}")
    return value


def _tolerance(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


_positive.__name__ = "positive integer"  # argparse says "invalid positive integer value"
_density.__name__ = "density"
_tolerance.__name__ = "tolerance"


def _message(error: BaseException) -> str:
    """One line of an exception's message (a KeyError's without the quotes repr adds)."""
    text = error.args[0] if isinstance(error, KeyError) and error.args else str(error)
    return " ".join(str(text).split())


def _parser() -> _Parser:
    from . import __version__

    parser = _Parser(prog="propop", description=__doc__)
    parser.add_argument("--version", action="version", version=f"propop {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def command(name: str, text: str) -> _Parser:
        return commands.add_parser(name, help=text, description=text,
                                   formatter_class=argparse.ArgumentDefaultsHelpFormatter)

    command("solvers", "list the registered solvers")
    command("demo", "every method on an FNN (6 layers, width 256, batch 32), an RNN (2 "
                    "layers, width 16, batch 8, 50 steps), a linear FNN (width 64), whose "
                    "samples share one matrix, and a residual graph; method='auto'; PyTorch "
                    "tensors, your own models and the Newton family (with the torch extra); "
                    "what CONVERGED means; then training on the digits")
    run = command("run", "chosen methods on a chosen network's backward pass: a table of "
                         "status, iterations, levels, gradient error and time")
    _problem_arguments(run)
    run.add_argument("--method", default=None,
                     help="comma-separated solver names (default: all)")
    run.add_argument("--repeats", type=_positive, default=5, help="timed runs per method")
    _tolerance_arguments(run)
    explain = command("explain", "what to expect from each method on a chosen network's "
                                 "backward system, and what method='auto' picks")
    _problem_arguments(explain)
    calibrate = command("calibrate", "measure the constants of method='auto' on this "
                                     "machine")
    calibrate.add_argument("--output", default=None,
                           help="where to store them (default: $PROPOP_CALIBRATION or "
                                "~/.config/propop/calibration.json)")
    calibrate.add_argument("--quick", action="store_true", help="a few small systems only")
    fit = command("train", "train an MLP on the digits with a chosen backward solver")
    fit.add_argument("--data", default="digits", choices=["digits"], help="the data set")
    fit.add_argument("--layers", default="32", help="hidden widths, comma-separated")
    fit.add_argument("--activation", default="tanh", choices=available_activations(),
                     help="of the hidden layers (the output layer's is the identity)")
    fit.add_argument("--method", default="substitution", help="the backward solver")
    fit.add_argument("--maxiter", type=_positive, default=None,
                     help="iterations of an iterative solver (truncated gradients)")
    _tolerance_arguments(fit)
    fit.add_argument("--epochs", type=_positive, default=5, help="passes over the data")
    fit.add_argument("--batch-size", type=_positive, default=32, help="samples per step")
    fit.add_argument("--lr", type=float, default=0.5, help="learning rate")
    fit.add_argument("--optimizer", default="sgd", choices=["sgd", "momentum", "adam"],
                     help="the update rule (PyTorch's)")
    fit.add_argument("--density", type=_density, default=1.0,
                     help="weight density: random sparse weights, or with --prune the share "
                          "kept; sparse weights keep their pattern through training")
    fit.add_argument("--prune", default=None, choices=PATTERNS,
                     help="prune the initial weights to --density by this pattern")
    fit.add_argument("--stages", type=_positive, default=1,
                     help="with --prune: prune gradually in this many stages (cubic "
                          "schedule), training --epochs after each")
    fit.add_argument("--forward", default=None,
                     help="Newton forward with this solver (default: the sequential pass)")
    fit.add_argument("--seed", type=int, default=0, help="of the weights and the batches")
    run.add_argument("--distributed", action="store_true",
                     help="the mpi.* methods (default), times per rank; run as mpiexec -n P "
                          "python -m mpi4py -m propop run --distributed")
    return parser


def _problem_arguments(parser: argparse.ArgumentParser) -> None:
    """The network and data options that ``run`` and ``explain`` share."""
    parser.add_argument("--layers", type=_positive, default=6,
                        help="layers (graph: residual blocks)")
    parser.add_argument("--width", type=_positive, default=256, help="of every layer")
    parser.add_argument("--batch", type=_positive, default=32, help="samples")
    parser.add_argument("--activation", default="tanh", choices=available_activations(),
                        help="of every layer")
    parser.add_argument("--density", type=_density, default=1.0,
                        help="share of non-zero weights (fnn only)")
    parser.add_argument("--dtype", default="float64", choices=["float64", "float32"],
                        help="of weights and data (fnn and rnn)")
    parser.add_argument("--seed", type=int, default=0, help="of the weights and data")
    parser.add_argument("--network", default="fnn", choices=NETWORKS,
                        help="graph: a residual MLP of --layers blocks")
    parser.add_argument("--tau", type=_positive, default=100, help="time steps (rnn only)")


def _tolerance_arguments(parser: argparse.ArgumentParser) -> None:
    """``--rtol`` and ``--atol``, passed to every solve."""
    parser.add_argument("--rtol", type=_tolerance, default=None,
                        help="relative tolerance of every block (default: by dtype, 1e-10 "
                             "in float64)")
    parser.add_argument("--atol", type=_tolerance, default=None, help="absolute tolerance")


_NETWORK_OPTIONS = {"density": ("fnn",), "dtype": ("fnn", "rnn"), "tau": ("rnn",)}
_DEFAULTS = {"density": 1.0, "dtype": "float64", "tau": 100}


def _check_problem(args: argparse.Namespace) -> None:
    """Refuse an option the chosen network kind does not take (never ignore it)."""
    for option, kinds in _NETWORK_OPTIONS.items():
        if args.network not in kinds and getattr(args, option) != _DEFAULTS[option]:
            raise ValueError(f"--{option} applies to --network {' or '.join(kinds)}, not "
                             f"{args.network}")


def _tolerances(args: argparse.Namespace) -> dict:
    return {k: getattr(args, k) for k in ("rtol", "atol") if getattr(args, k) is not None}


def _widths(text: str) -> list[int]:
    """``--layers`` of ``train``: comma-separated positive widths."""
    try:
        widths = [int(w) for w in text.split(",") if w.strip()]
    except ValueError:
        widths = []
    if not widths or min(widths) < 1:
        raise ValueError(f"--layers takes comma-separated positive widths such as 64,32; got "
                         f"{text!r}")
    return widths


def _check_training(args: argparse.Namespace) -> None:
    """Refuse the ``train`` options that would be ignored."""
    if args.prune and args.density == 1.0:
        raise ValueError("--prune needs --density below 1 (the share of weights kept)")
    if args.stages != 1 and not args.prune:
        raise ValueError("--stages applies with --prune (gradual pruning)")
    kind = solvers.info(args.method).kind
    if args.maxiter is not None and kind == "direct":
        raise ValueError(f"--maxiter applies to iterative methods; {args.method} is direct "
                         "(exact in one pass)")


def _explain(args: argparse.Namespace) -> int:
    """``propop explain``: :func:`propop.solvers.explain` on the described backward system."""
    _check_problem(args)
    net, trace, eps = _problem(args.network, args.layers, args.width, args.batch,
                               args.activation, args.density, args.dtype, args.seed, args.tau)
    solvers.explain(backward_system(net, trace, eps))
    return 0


def _calibrate(args: argparse.Namespace) -> int:
    """``propop calibrate``: measure, fit, store, and show the fit."""
    from .calibration import calibrate

    print("Timing substitution, cyclic reduction and PCR on FNN and RNN backward systems "
          "(median of 5 after a warm-up) to fit method='auto''s cost model...\n")
    result = calibrate(args.output, quick=args.quick)
    print("| system | method | measured [ms] | model [ms] |\n|---|---|---:|---:|")
    for row in result.measurements:
        print(f"| {row['system']} | {row['method']} | {1e3 * row['seconds']:.3f} | "
              f"{1e3 * row['predicted']:.3f} |")
    print(f"\nStored: {result.source}")
    return 0


def _require_abort_on_failure() -> None:
    """Warn when several ranks run without ``python -m mpi4py`` (a failing rank would hang)."""
    from .distributed.system import world

    if world().Get_size() > 1 and "mpi4py.run" not in sys.modules and world().Get_rank() == 0:
        print("propop: warning: not started as 'mpiexec -n P python -m mpi4py -m propop run "
              "--distributed': an exception on one rank would leave the others waiting "
              "instead of aborting the job", file=sys.stderr)


def _report(settings: dict) -> None:
    start = time.perf_counter()
    if settings.get("distributed"):
        _require_abort_on_failure()
    rows = experiment(**settings)
    if settings.get("distributed"):
        from .distributed.system import world

        if world().Get_rank() != 0:  # rank 0 prints the table
            return
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


def _demo_auto() -> None:
    """The demo's method='auto': what it takes where depth dominates and where width does."""
    from .solvers.auto import choose

    print("method='auto' picks the exact method its cost model predicts fastest (propop "
          "calibrate measures the constants on this machine; propop explain shows the "
          "choice for any network):\n")
    for layers, width, batch in ((1024, 8, 1), (6, 256, 32)):
        net, trace, eps = _problem("fnn", layers, width, batch, "tanh", 1.0, "float64", 0, 1)
        print(f"- FNN, {layers} layers of width {width}, batch {batch}: "
              f"{choose(backward_system(net, trace, eps)).reason}")
    print()


def _demo_backends() -> None:
    """The demo's PyTorch tensors: one stacked chain solved by the same code as NumPy's."""
    try:
        import torch
    except ImportError:
        print("PyTorch tensors: skipped, torch is not installed (pip install propop[torch]).\n")
        return
    net = FNN.random([32] * 65, activation="tanh", seed=0)
    x = np.random.default_rng(1).standard_normal((32, 4))
    trace = net.forward(x)
    B = backward_system(net, trace, trace.output)
    T = TriangularSystem(None, None, torch.from_numpy(B.rhs), lower=False, sizes=B.sizes,
                         coupling_stack=torch.from_numpy(B.coupling_stack),
                         scale_stack=torch.from_numpy(B.scale_stack))
    reference = solve(B, "substitution").x
    print("PyTorch tensors, one code path: a 64-layer backward system (width 32, batch 4) "
          "as torch tensors (a stacked chain), solved by the methods that declare "
          "'torch':\n")
    print("| method | status | returns | max difference from NumPy substitution |\n"
          "|---|---|---|---:|")
    for name in ("substitution", "cyclic-reduction", "jacobi", "batched-bicgstab"):
        sol = solve(T, name)
        difference = float(np.abs(sol.x.numpy() - reference).max())
        print(f"| {name} | {sol.status.name} | {type(sol.x).__module__}."
              f"{type(sol.x).__name__} | {difference:.1e} |")
    print()


def _demo_models() -> None:
    """The demo's own models: a module traced by torch.fx, and a GRU's Newton family."""
    try:
        import torch
    except ImportError:
        print("Your own models: skipped, torch is not installed (pip install propop[torch]).\n")
        return
    from .propagation import forward
    from .torch_interop import from_torch

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1, self.fc2 = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)
            self.norm, self.head = torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = x + self.fc2(torch.nn.functional.silu(self.fc1(x)))  # a residual, as written
            return torch.softmax(self.head(self.norm(h)), dim=-1)

    torch.manual_seed(0)
    module = Block().double().eval()
    x = np.random.default_rng(2).standard_normal((8, 5))
    X = torch.tensor(x.T, requires_grad=True)
    (0.5 * (module(X) ** 2).sum()).backward()
    graph = from_torch(module)
    errors = {m: float(np.abs(backprop(graph, x, np.zeros((3, 5)), method=m).x
                              - X.grad.numpy().T).max()) for m in ("substitution", "jacobi")}
    print(f"Your own models. A module whose forward() writes a residual sum, SiLU, "
          f"BatchNorm (eval) and a softmax, traced by torch.fx into {len(graph.order) - 1} "
          f"nodes ({', '.join(graph.order[1:])}); dE/dx against autograd: "
          + ", ".join(f"{m} {e:.0e}" for m, e in errors.items()) + ".\n")
    gru = from_torch(torch.nn.GRU(4, 8, num_layers=2).double())
    xs = np.random.default_rng(3).standard_normal((200, 4, 4))
    exact = gru.forward(xs).z[1]
    print("A 2-layer GRU (hidden 8, from nn.GRU) over 200 steps, batch 4, evaluated in "
          "parallel: Newton-type iterations, each a cyclic reduction over time (ELK's "
          "damped steps a block tridiagonal one):\n")
    print("| linearization | iterations | max state error | Lyapunov exponent |\n"
          "|---|---:|---:|---:|")
    for name in ("newton", "quasi", "block-diagonal", "damped"):
        f = forward(gru, xs, method="cyclic-reduction", linearization=name)
        print(f"| {name} | {f.info['iterations']} | {np.abs(f.z[1] - exact).max():.1e} | "
              f"{f.info['lyapunov']:+.3f} |")
    print()


def _demo_trust() -> None:
    """The demo's accuracy and memory checks: what CONVERGED means, and N/A before OOM."""
    net = FNN.random([16] * 21, activation="sigmoid", seed=0)
    rng = np.random.default_rng(1)
    x, t = rng.standard_normal((16, 4)), rng.standard_normal((16, 4))
    exact = backprop(net, x, t)
    ratio = np.linalg.norm(exact.W[0]) / np.linalg.norm(exact.W[-1])
    print(f"Vanishing gradients: 20 sigmoid layers of width 16, batch 4; the first layer's "
          f"gradient is {ratio:.0e} of the last one's. CONVERGED means every layer meets "
          "rtol = 1e-10 relative to its own size; errors are relative to substitution.\n")
    print("| method | status | iterations | worst layer error | first layer error |\n"
          "|---|---|---:|---:|---:|")
    for name in ("jacobi", "bicgstab", "batched-gmres", "scipy.gmres", "pyamg.gmres",
                 "scipy.bicgstab"):
        g = backprop(net, x, t, method=name, check=False)
        errors = [np.linalg.norm(a - b) / np.linalg.norm(b) for a, b in zip(g.W, exact.W)]
        print(f"| {name} | {g.solution.status.name} | {g.solution.iterations} | "
              f"{max(errors):.1e} | {errors[0]:.1e} |")
    _demo_nothing_unchecked(net, x, t)
    rnn = RNN.random([256] * 7, activation="tanh", seed=0)
    trace = rnn.forward(rng.standard_normal((100, 256, 32)))
    try:  # 16 GiB at most: never attempted, even where more memory is available
        with memory.limit(min(memory.budget(), 2**34)):
            solvers.solve(backward_system(rnn, trace, trace.output), "cyclic-reduction")
    except MemoryBudgetError as error:
        print(f"\nMemory guard: cyclic-reduction on a 6-layer width-256 tanh RNN over 100 "
              f"steps, batch 32 (propop run --network rnn), would need about "
              f"{error.estimate / 2**30:.0f} GiB; it raised MemoryBudgetError before "
              f"allocating (budget {error.budget / 2**30:.1f} GiB), and propop run marks it "
              "N/A.\n")


def _demo_nothing_unchecked(net: FNN, x: Any, t: Any) -> None:
    """Weights updated in place, a method that lies, an approximate system: none slips by."""
    W = [Wk.copy() for Wk in net.W]
    net = FNN(W, net.b, net.activations)
    backprop(net, x, t, method="cyclic-reduction")
    g = backprop(net, x, t)
    for Wk, dW in zip(W, g.W):  # a hand-written SGD step, in place
        Wk -= 0.5 * dW
    fresh = backprop(FNN([Wk.copy() for Wk in W], net.b, net.activations), x, t)
    again = backprop(net, x, t, method="cyclic-reduction")
    drift = max(float(np.abs(a - b).max()) for a, b in zip(again.W, fresh.W))
    B = backward_system(net, net.forward(x), net.loss_gradient(net.forward(x), t))
    lie = solvers.solve(B, lambda s, **o: Solution(x=0 * s.rhs, status=Status.CONVERGED))
    mean = solvers.solve(B.shared("mean"), "substitution")
    print(f"\nNothing unchecked: after an in-place SGD step (W[k] -= lr * dW) the next "
          f"gradients equal a fresh network's to {drift:.0e}; a method that returns zeros "
          f"and claims CONVERGED is judged {lie.status.name} by its true residual; the "
          f"batch-mean system B.shared('mean') solves {mean.status.name}: its worst layer "
          f"misses the true system's bound {mean.info['true_block_ratio']:.0e} times.")


DEMO_TRAINING = (("substitution", None, 1.0), ("cyclic-reduction", None, 1.0),
                 ("jacobi", 1, 1.0), ("jacobi", 3, 1.0), ("jacobi", 6, 1.0),
                 ("batched-gmres", 3, 1.0), ("substitution", None, 0.1),
                 ("cyclic-reduction", None, 0.1))


def _demo_training() -> None:
    """The demo's training table: exact, truncated and pruned runs on the digits."""
    from .data import digits
    from .sparsity import density_of, prune_gradually
    from .training import train

    try:
        xtr, ytr, xte, yte = digits()
    except ImportError as error:
        print(f"Training on the digits skipped: {error}\n")
        return
    base = FNN.random([64] + [32] * 5 + [10], activation="tanh", seed=0)
    net = FNN(base.W, base.b, activation=["tanh"] * 5 + ["identity"])
    print("Training a 6-layer tanh MLP (64-32x5-10) on the digits, 4 epochs of SGD (lr 0.2, "
          "batch 32) with each backward method; density 0.1: magnitude pruning in 4 stages "
          "of one epoch (cubic schedule); seconds: the whole run, with the exact reference "
          "solves that measure a truncated run's gradient error.\n")
    print("| backward method | maxiter | density | test accuracy | mean gradient error "
          "| seconds |\n|---|---:|---:|---:|---:|---:|")
    for method, maxiter, density in DEMO_TRAINING:
        options = dict(batch_size=32, lr=0.2, method=method, x_test=xte, y_test=yte,
                       solver_options={} if maxiter is None else {"maxiter": maxiter},
                       gradient_error=maxiter is not None, progress=False)
        start = time.perf_counter()
        if density < 1:
            model, histories = prune_gradually(net, xtr, ytr, density, 4, 1, **options)
        else:
            model, histories = train(net, xtr, ytr, epochs=4, **options)
            histories = [histories]
        errors = [s["gradient_error"] for h in histories for s in h.steps
                  if "gradient_error" in s] or [0.0]
        label = "exact" if maxiter is None else maxiter
        print(f"| {method} | {label} | {density_of(model):.2f} | "
              f"{histories[-1].epochs[-1]['test_accuracy']:.3f} | {np.mean(errors):.1e} | "
              f"{time.perf_counter() - start:.2f} |")
    print("\nk < l Jacobi sweeps give the top k layers' errors exactly and none below; "
          "l = 6 sweeps are exact for every weight.\n")


def _train(args: argparse.Namespace) -> int:
    """``propop train``: per-epoch loss and accuracy, then a summary."""
    from .data import digits
    from .sparsity import density_of, prune_gradually
    from .training import train

    hidden = _widths(args.layers)
    _check_training(args)
    xtr, ytr, xte, yte = digits(seed=args.seed)
    sizes = [64, *hidden, 10]
    net = FNN.random(sizes, activation=args.activation, output_activation="identity",
                     density=1.0 if args.prune else args.density, seed=args.seed)
    options = {**({} if args.maxiter is None else {"maxiter": args.maxiter}),
               **_tolerances(args)}
    settings = dict(batch_size=args.batch_size, lr=args.lr, optimizer=args.optimizer,
                    method=args.method, solver_options=options, forward=args.forward,
                    gradient_error=args.maxiter is not None, x_test=xte, y_test=yte,
                    seed=args.seed, progress="auto")
    sparsity = (f"pruned to {args.density} by {args.prune} in {args.stages} stage(s)"
                if args.prune else f"density {args.density}")
    solver = " ".join([args.method] + [f"{k}={v}" for k, v in options.items()])
    print(f"Training {'-'.join(map(str, sizes))} ({args.activation}, {sparsity}) on the "
          f"digits with {solver}, "
          f"forward {f'Newton with {args.forward}' if args.forward else 'sequential'}, "
          f"{args.optimizer} lr={args.lr}, batch {args.batch_size}\n")
    if args.prune:
        net, histories = prune_gradually(net, xtr, ytr, args.density, args.stages, args.epochs,
                                         args.prune, **settings)
    else:
        net, history = train(net, xtr, ytr, epochs=args.epochs, **settings)
        histories = [history]
    print("| epoch | loss | train accuracy | test accuracy | seconds |\n|---:|---:|---:|---:|---:|")
    epochs = [e for h in histories for e in h.epochs]
    for k, e in enumerate(epochs, start=1):
        print(f"| {k} | {e['loss']:.4f} | {e['accuracy']:.3f} | {e['test_accuracy']:.3f} | "
              f"{e['seconds']:.2f} |")
    steps = [s for h in histories for s in h.steps]
    errors = [s["gradient_error"] for s in steps if "gradient_error" in s]
    summary = f"; mean gradient error {np.mean(errors):.2e}" if errors else ""
    print(f"\nfinal test accuracy {epochs[-1]['test_accuracy']:.3f}, weight density "
          f"{density_of(net):.3f}, {len(steps)} steps{summary}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``propop`` console script."""
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        return _command(args)
    except (KeyError, ValueError, OSError, ImportError, ConvergenceError,
            MemoryError) as error:
        parser.error(_message(error))


def _command(args: argparse.Namespace) -> int:
    """Run the parsed command; errors propagate to :func:`main` as one line."""
    if args.command == "solvers":
        print(_solvers_table())
        return 0
    if args.command in ("explain", "calibrate", "train"):
        return {"explain": _explain, "calibrate": _calibrate, "train": _train}[args.command](args)
    base = dict(layers=6, width=256, batch=32, activation="tanh", density=1.0,
                methods=None, dtype="float64", seed=0, repeats=5, network="fnn", tau=100,
                progress="auto")
    if args.command == "demo":
        runs = [base, dict(base, network="rnn", layers=2, width=16, batch=8, tau=50),
                dict(base, activation="identity", width=64),  # one matrix: block methods
                dict(base, network="graph", layers=4, width=64)]
    else:
        _check_problem(args)
        runs = [dict(base, layers=args.layers, width=args.width, batch=args.batch,
                     activation=args.activation, density=args.density, dtype=args.dtype,
                     seed=args.seed, repeats=args.repeats, network=args.network,
                     tau=args.tau, methods=args.method.split(",") if args.method else None,
                     distributed=args.distributed, options=_tolerances(args))]
    for settings in runs:
        _report(settings)
    if args.command == "demo":
        _demo_auto()
        _demo_backends()
        _demo_models()
        _demo_trust()
        _demo_training()
    return 0


if __name__ == "__main__":
    sys.exit(main())
