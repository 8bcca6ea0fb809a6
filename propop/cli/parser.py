"""The command line: sub-commands, their options and checks, one-line errors."""

from __future__ import annotations

import argparse
from typing import NoReturn

from .. import backend, solvers
from ..activations import available_activations
from ..sparsity import PATTERNS
from .experiments import NETWORKS

__all__ = ["parser", "message", "check_problem", "tolerances", "widths", "check_training"]


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


def message(error: BaseException) -> str:
    """One line of an exception's message (a KeyError's without the quotes repr adds)."""
    text = error.args[0] if isinstance(error, KeyError) and error.args else str(error)
    return " ".join(str(text).split())


def parser() -> _Parser:
    """The ``propop`` command line with its sub-commands."""
    from .. import __version__

    parser = _Parser(prog="propop", description="The propop command: list solvers, run the "
                     "demo, run an experiment, train, calibrate.")
    parser.add_argument("--version", action="version", version=f"propop {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def command(name: str, text: str) -> _Parser:
        return commands.add_parser(name, help=text, description=text,
                                   formatter_class=argparse.ArgumentDefaultsHelpFormatter)

    command("solvers", "list the registered solvers")
    demo = command("demo", "propop in seconds: where depth, width, time and graphs make "
                           "each method win (an FNN of 1024 layers of width 8, one of 6 "
                           "layers of width 128, an RNN, a residual graph) and why the "
                           "others lose; one storage, plans, method='auto'; PyTorch "
                           "tensors, PyTorch in the loop, your own models and the Newton "
                           "family (with the torch extra); what CONVERGED means; training "
                           "on the digits (with the data extra)")
    demo.add_argument("--full", action="store_true",
                      help="every registered method on four networks (an FNN of 6 layers "
                           "of width 256, batch 32, an RNN, a linear FNN whose samples "
                           "share one matrix, a residual graph) and the full training "
                           "table, pruning included (minutes)")
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
    fit.add_argument("--backend", default="numpy", choices=backend.KINDS,
                     help="where the network, the data and every solve live (torch: the "
                          "torch extra; cupy: the gpu extra)")
    fit.add_argument("--device", default=None,
                     help="a PyTorch device for --backend torch, such as cuda")
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


def check_problem(args: argparse.Namespace) -> None:
    """Refuse an option the chosen network kind does not take (never ignore it)."""
    for option, kinds in _NETWORK_OPTIONS.items():
        if args.network not in kinds and getattr(args, option) != _DEFAULTS[option]:
            raise ValueError(f"--{option} applies to --network {' or '.join(kinds)}, not "
                             f"{args.network}")


def tolerances(args: argparse.Namespace) -> dict:
    """The ``rtol``/``atol`` given on the command line, as solver options."""
    return {k: getattr(args, k) for k in ("rtol", "atol") if getattr(args, k) is not None}


def widths(text: str) -> list[int]:
    """``--layers`` of ``train``: comma-separated positive widths."""
    try:
        widths = [int(w) for w in text.split(",") if w.strip()]
    except ValueError:
        widths = []
    if not widths or min(widths) < 1:
        raise ValueError(f"--layers takes comma-separated positive widths such as 64,32; got "
                         f"{text!r}")
    return widths


def check_training(args: argparse.Namespace) -> None:
    """Refuse the ``train`` options that would be ignored."""
    if args.prune and args.density == 1.0:
        raise ValueError("--prune needs --density below 1 (the share of weights kept)")
    if args.stages != 1 and not args.prune:
        raise ValueError("--stages applies with --prune (gradual pruning)")
    if args.device is not None and args.backend != "torch":
        raise ValueError(f"--device applies to --backend torch, not {args.backend}")
    if args.backend in backend.DENSE_ONLY and (args.density < 1 or args.prune):
        raise ValueError(f"--backend {args.backend} has no sparse arrays: sparse weights "
                         "(--density below 1, --prune) train on numpy, torch or cupy")
    kind = solvers.info(args.method).kind
    if args.maxiter is not None and kind == "direct":
        raise ValueError(f"--maxiter applies to iterative methods; {args.method} is direct "
                         "(exact in one pass)")
