"""The ``propop`` command: list solvers, run the demo, run an experiment, train, calibrate.

:mod:`.parser` reads the command line, :mod:`.experiments` measures and prints the
tables, :mod:`.demos` adds the demo's sections.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import numpy as np

from .. import backend, solvers
from ..networks.fnn import FNN
from ..solvers.solution import ConvergenceError
from ..systems import backward_system
from . import demos
from .experiments import problem, report, solvers_table
from .tables import BASE
from .parser import check_problem, check_training, message, parser, tolerances, widths

__all__ = ["main"]


def _explain(args: argparse.Namespace) -> int:
    """``propop explain``: :func:`propop.solvers.explain` on the described backward system."""
    check_problem(args)
    net, trace, eps = problem(args.network, args.layers, args.width, args.batch,
                               args.activation, args.density, args.dtype, args.seed, args.tau)
    solvers.explain(backward_system(net, trace, eps))
    return 0


def _calibrate(args: argparse.Namespace) -> int:
    """``propop calibrate``: measure, fit, store, and show the fit."""
    from ..calibration import calibrate

    print("Timing substitution, cyclic reduction and PCR on FNN and RNN backward systems "
          "(median of 5 after a warm-up) to fit method='auto''s cost model...\n")
    result = calibrate(args.output, quick=args.quick)
    print("| system | method | measured [ms] | model [ms] |\n|---|---|---:|---:|")
    for row in result.measurements:
        print(f"| {row['system']} | {row['method']} | {1e3 * row['seconds']:.3f} | "
              f"{1e3 * row['predicted']:.3f} |")
    print(f"\nStored: {result.source}")
    return 0


def _train(args: argparse.Namespace) -> int:
    """``propop train``: per-epoch loss and accuracy, then a summary."""
    from ..data import digits
    from ..sparsity import density_of, prune_gradually
    from ..training import train

    hidden = widths(args.layers)
    check_training(args)
    xtr, ytr, xte, yte = digits(seed=args.seed)
    sizes = [64, *hidden, 10]
    net = FNN.random(sizes, activation=args.activation, output_activation="identity",
                     density=1.0 if args.prune else args.density, seed=args.seed)
    if args.backend != "numpy":  # the network and inputs there; integer labels go anywhere
        net = net.to(args.backend, args.device)
        xtr, xte = (backend.convert(x, args.backend, args.device) for x in (xtr, xte))
    options = {**({} if args.maxiter is None else {"maxiter": args.maxiter}),
               **tolerances(args)}
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
          f"{args.optimizer} lr={args.lr}, batch {args.batch_size}, on {args.backend}"
          f"{f' ({args.device})' if args.device else ''}\n")
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
    command_line = parser()
    args = command_line.parse_args(argv)
    try:
        return _command(args)
    except (KeyError, ValueError, OSError, ImportError, ConvergenceError,
            MemoryError) as error:
        command_line.error(message(error))


def _command(args: argparse.Namespace) -> int:
    """Run the parsed command; errors propagate to :func:`main` as one line."""
    if args.command == "solvers":
        print(solvers_table())
        return 0
    if args.command in ("explain", "calibrate", "train"):
        return {"explain": _explain, "calibrate": _calibrate, "train": _train}[args.command](args)
    if args.command == "demo":
        demos.run(full=args.full)
        return 0
    check_problem(args)
    report(dict(BASE, layers=args.layers, width=args.width, batch=args.batch,
                activation=args.activation, density=args.density, dtype=args.dtype,
                seed=args.seed, repeats=args.repeats, network=args.network, tau=args.tau,
                methods=args.method.split(",") if args.method else None,
                distributed=args.distributed, options=tolerances(args)))
    return 0
