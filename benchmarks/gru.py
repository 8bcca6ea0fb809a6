"""GRU forward passes on the CPU: the Newton family against the sequential loop and PyTorch.

DEER's setting (a 1-layer GRU, hidden 2, batch 16, tau = 10000) in float64 on
this machine's CPU, and a wider one (hidden 8, 2 layers, batch 4, tau = 2000).
Contenders: ``torch.nn.GRU`` (PyTorch's C++ loop, the strongest sequential
peer here), propop's sequential reference (``gru.forward``: PyTorch's GRU kernel
one layer at a time, every layer's states kept) and ``pp.forward(gru, xs,
method="cyclic-reduction", linearization=...)`` for each member of the Newton
family; the deviation is the largest absolute difference of the states from
``torch.nn.GRU``'s. Times: a warm-up, then the median of 5, round-robin; ratios
against ``torch.nn.GRU``. A second table times the sequential passes of
``pp.LSTM`` and propop's Elman cell against ``torch.nn.LSTM`` and ``torch.nn.RNN``
at the same sizes, a third ``pp.Recurrence``'s sequential pass of a user's cell a
step against the same cell's rows in a plain PyTorch loop (its overhead a step).

Where propop loses: every Newton iteration computes ``tau r`` Jacobians with
``torch.func`` and reduces a chain of ``tau`` dense blocks (``O(tau r n^3)``
work against the loop's ``O(tau r n^2)``) on 2 cores; a GPU is where the
reduction's ``O(log tau)`` depth pays (the GPU issue's DEER row).

Run: ``python -m benchmarks.gru`` (about a minute).
"""

from __future__ import annotations

from typing import Any

import numpy as np

import propop as pp

from .common import each, median_times, publish

CASES = [(1, 2, 16, 10000), (2, 8, 4, 2000)]  # (layers, hidden, batch, tau)
LINEARIZATIONS = ("newton", "quasi", "block-diagonal", "damped")


def row(layers: int, hidden: int, batch: int, tau: int) -> dict:
    """Every contender on one GRU forward pass."""
    import torch

    torch.manual_seed(0)
    module = torch.nn.GRU(2, hidden, num_layers=layers).double()
    gru = pp.from_torch(module)
    xs = np.random.default_rng(1).standard_normal((tau, 2, batch))
    X = torch.tensor(xs.transpose(0, 2, 1).copy())
    with torch.no_grad():
        reference = module(X)[0].numpy().transpose(0, 2, 1)
    jobs = {"torch.nn.GRU": lambda: module(X), "sequential": lambda: gru.forward(xs)}
    runs = {name: (lambda name=name: pp.forward(gru, xs, method="cyclic-reduction",
                                                 linearization=name))
            for name in LINEARIZATIONS}
    jobs.update(runs)
    with torch.no_grad():
        times = median_times(jobs, repeats=5, settle=False)
    deviation, iterations = {}, {}
    for name, run in runs.items():
        trace = run()
        deviation[name] = float(np.abs(gru.outputs(trace) - reference).max())
        iterations[name] = trace.info["iterations"]
    deviation["sequential"] = float(np.abs(gru.outputs(gru.forward(xs)) - reference).max())
    base = times["torch.nn.GRU"]
    return {"case": f"layers={layers} hidden={hidden} batch={batch} tau={tau}",
            "seconds": times, "vs_torch": {k: v / base for k, v in times.items()},
            "deviation": deviation, "iterations": iterations}


def table(rows: list[dict]) -> str:
    """One Markdown table: time against ``torch.nn.GRU``, iterations, deviation."""
    names = ["sequential", *LINEARIZATIONS]
    out = ["| case | torch.nn.GRU [ms] | " + " | ".join(names) + " |",
           "|---|---:|" + "---:|" * len(names)]
    for r in rows:
        cells = [f"{r['vs_torch'][n]:.2f}x" + (f", {r['iterations'][n]} it." if n in
                                                r["iterations"] else "")
                 + f" ({r['deviation'][n]:.0e})" for n in names]
        out.append(f"| {r['case']} | {1e3 * r['seconds']['torch.nn.GRU']:.0f} | "
                   + " | ".join(cells) + " |")
    return ("**GRU forward pass (float64, CPU)**: time / torch.nn.GRU (lower is better), "
            "Newton iterations, and in brackets the largest deviation of the states from "
            "torch.nn.GRU's\n\n" + "\n".join(out))


SEQUENTIAL = {"LSTM": ("LSTM", {}), "RNN": ("ElmanRNN", {"nonlinearity": "tanh"})}


def sequential_row(kind: str, layers: int, hidden: int, batch: int, tau: int) -> dict:
    """The sequential pass of propop against a ``torch.nn`` recurrent module of one kind."""
    import torch

    from propop.networks import gated

    torch.manual_seed(0)
    ours, options = SEQUENTIAL[kind]
    module = getattr(torch.nn, kind)(2, hidden, num_layers=layers, **options).double()
    net = getattr(gated, ours).from_torch(module)
    xs = np.random.default_rng(1).standard_normal((tau, 2, batch))
    X = torch.tensor(xs.transpose(0, 2, 1).copy())
    with torch.no_grad():
        reference = module(X)[0].numpy().transpose(0, 2, 1)
        times = median_times({"torch": lambda: module(X), "propop": lambda: net.forward(xs)},
                             repeats=5, settle=False)
    return {"case": f"{kind} layers={layers} hidden={hidden} batch={batch} tau={tau}",
            "seconds": times, "ratio": times["propop"] / times["torch"],
            "deviation": float(np.abs(net.outputs(net.forward(xs)) - reference).max())}


def sequential_table(rows: list[dict]) -> str:
    """The sequential passes of propop against ``torch.nn``, as a Markdown table."""
    out = ["| case | torch.nn [ms] | propop sequential | deviation |", "|---|---:|---:|---:|"]
    out += [f"| {r['case']} | {1e3 * r['seconds']['torch']:.0f} | {r['ratio']:.2f}x | "
            f"{r['deviation']:.0e} |" for r in rows]
    return ("**Sequential passes (float64, CPU)**: propop's `forward` of `pp.LSTM` and the "
            "Elman cell / `torch.nn.LSTM` and `torch.nn.RNN` (lower is better)\n\n"
            + "\n".join(out))


STEPS = [(1, 2000), (16, 2000)]  # (batch, tau) of a user's cell, pp.Recurrence


def tanh_cell(p: dict, h: Any, x: Any) -> Any:
    """A user's cell written for one sample: ``tanh(W h + U x + b)``, 8 states."""
    import torch

    return torch.tanh(p["W"] @ h + p["U"] @ x + p["b"])


def tanh_rows(p: dict, h: Any, x: Any) -> Any:
    """The same cell written for a batch's rows ``(r, n)``."""
    import torch

    return torch.tanh(h @ p["W"].T + x @ p["U"].T + p["b"])


def recurrence_row(batch: int, tau: int, n: int = 8) -> dict:
    """``pp.Recurrence``'s sequential pass of a user's cell against the loop of its rows.

    The baseline is the same cell written for a batch's rows in a plain PyTorch loop
    (preallocated nothing, nothing checked); propop's overhead a step is the
    difference, for the cell written for one sample (``vmap``, or each sample in turn
    up to four) and declared ``batched=True`` for rows.
    """
    import torch

    rng = np.random.default_rng(0)
    p = {"W": 0.3 * rng.standard_normal((n, n)), "U": 0.3 * rng.standard_normal((n, n)),
         "b": rng.standard_normal(n)}
    xs = rng.standard_normal((tau, n, batch))
    P = {k: torch.tensor(v) for k, v in p.items()}
    X = torch.tensor(xs.transpose(0, 2, 1).copy())
    def loop() -> Any:
        h, states = torch.zeros(batch, n, dtype=torch.float64), []
        for x in X.unbind(0):
            h = tanh_rows(P, h, x)
            states.append(h)
        return torch.stack(states)

    one = pp.Recurrence(tanh_cell, p, state_size=n, input_size=n)
    rows = pp.Recurrence(tanh_rows, p, state_size=n, input_size=n, batched=True)
    with torch.no_grad():
        reference = loop().numpy().transpose(0, 2, 1)
        times = median_times({"loop": loop, "one sample": lambda: one.forward(xs),
                              "batched": lambda: rows.forward(xs)}, repeats=5, settle=False)
    deviation = max(float(np.abs(net.forward(xs).z[1] - reference).max()) for net in (one, rows))
    return {"kind": "recurrence", "case": f"n={n} batch={batch} tau={tau}", "seconds": times,
            "overhead_us": {k: 1e6 * (times[k] - times["loop"]) / tau
                            for k in ("one sample", "batched")}, "deviation": deviation}


def recurrence_table(rows: list[dict]) -> str:
    """``pp.Recurrence``'s time a step and its overhead over the user's own loop."""
    out = ["| case | the cell's rows in a loop [us a step] | one-sample cell: propop "
           "[us a step] (overhead) | batched=True: propop (overhead) | deviation |",
           "|---|---:|---:|---:|---:|"]
    for r in rows:
        tau = int(r["case"].split("tau=")[1])
        each_step = {k: 1e6 * v / tau for k, v in r["seconds"].items()}
        out.append(f"| {r['case']} | {each_step['loop']:.1f} | {each_step['one sample']:.1f} "
                   f"({r['overhead_us']['one sample']:+.1f}) | {each_step['batched']:.1f} "
                   f"({r['overhead_us']['batched']:+.1f}) | {r['deviation']:.0e} |")
    return ("**pp.Recurrence, a user's cell (float64, CPU)**: the sequential pass a step, "
            "and in brackets its overhead over the same cell's rows in a plain PyTorch loop "
            "(`tanh(W h + U x + b)`, 8 states)\n\n" + "\n".join(out))


def main() -> None:
    """Measure every case, print and save the tables."""
    rows = [row(*case) for case in each(CASES, "gru")]
    more = [sequential_row(kind, *case) for kind in SEQUENTIAL
            for case in each(CASES, kind.lower())]
    cells = [recurrence_row(*case) for case in each(STEPS, "recurrence")]
    publish("gru", rows + more + cells, table(rows) + "\n\n" + sequential_table(more)
            + "\n\n" + recurrence_table(cells))


if __name__ == "__main__":
    main()
