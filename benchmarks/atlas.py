"""The atlas: where each exact method wins, measured, with the cost model's prediction on top.

Two maps on this machine: MLP backpropagation over (width, depth), one sample, and
RNN backpropagation through time over (hidden size, sequence length), one sample.
Each cell is the whole job with ``pp.backprop(..., method=...)`` (forward pass,
backward solve, every gradient) for ``substitution`` and ``cyclic-reduction``,
timed against the tight NumPy loop of ``benchmarks.baselines`` in the same run (warm-up,
median of 5). The colour is the faster method's time against the loop (below 1: it
beats the loop); the letter names it (S substitution, C cyclic reduction); a
circle marks the cells where ``method="auto"``'s calibrated cost model predicts
cyclic reduction, so the model's crossover can be read against the measured one.

Run: ``python -m benchmarks.atlas [--save]`` (about two minutes on 2 cores); writes
``atlas.png`` and the table.
"""

from __future__ import annotations

import numpy as np

import propop as pp
from propop.solvers.selection.auto import choose

from .common import destination, each, median_times, publish, pyplot
from .baselines import TightMLP, TightRNN

WIDTHS, DEPTHS = (4, 8, 16, 32, 64), (16, 64, 256, 1024)
HIDDENS, TAUS = (4, 8, 16, 32), (256, 1024, 4096, 16384)
METHODS = ("substitution", "cyclic-reduction")


def mlp_cell(width: int, depth: int) -> dict:
    """One MLP: each method's time against the loop, and the model's choice."""
    net = pp.FNN.random([width] * (depth + 1), activation="tanh", seed=0, bias=0.1)
    rng = np.random.default_rng(1)
    x, t = rng.standard_normal((width, 1)), rng.standard_normal((width, 1))
    loop = TightMLP(net.W, net.b, 1)
    trace = net.forward(x)
    predicted = choose(pp.backward_system(net, trace, net.loss_gradient(trace, t))).method
    jobs = {"loop": lambda: loop(x, t)}
    jobs.update({m: (lambda m=m: pp.backprop(net, x, t, method=m)) for m in METHODS})
    return _cell("mlp", width, depth, median_times(jobs, repeats=5), predicted)


def rnn_cell(hidden: int, tau: int) -> dict:
    """One RNN: each method's time against the BPTT loop, and the model's choice."""
    rnn = pp.RNN.random([hidden, hidden], activation="tanh", seed=0)
    rng = np.random.default_rng(1)
    xs, t = rng.standard_normal((tau, hidden, 1)), rng.standard_normal((tau, hidden, 1))
    loop = TightRNN(rnn.W[0], rnn.U[0], rnn.b[0], tau, 1)
    trace = rnn.forward(xs)
    predicted = choose(pp.backward_system(rnn, trace, rnn.loss_gradient(trace, t))).method
    jobs = {"loop": lambda: loop(xs, t)}
    jobs.update({m: (lambda m=m: pp.backprop(rnn, xs, t, method=m)) for m in METHODS})
    return _cell("rnn", hidden, tau, median_times(jobs, repeats=5), predicted)


def _cell(kind: str, width: int, length: int, times: dict, predicted: str) -> dict:
    ratios = {m: times[m] / times["loop"] for m in METHODS}
    best = min(ratios, key=ratios.__getitem__)
    return {"kind": kind, "width": width, "length": length, "loop_s": times["loop"],
            "vs_loop": ratios, "fastest": best, "predicted": predicted}


def table(rows: list[dict]) -> str:
    """Both maps as Markdown: the faster method's ratio to the loop, per cell."""
    out = []
    for kind, widths, lengths, names in (("mlp", WIDTHS, DEPTHS, ("width", "depth")),
                                         ("rnn", HIDDENS, TAUS, ("hidden", "tau"))):
        cells = {(r["width"], r["length"]): r for r in rows if r["kind"] == kind}
        out += [f"**{kind.upper()}, one sample**: the faster exact method's time / NumPy loop "
                f"(S substitution, C cyclic reduction; * where the cost model predicts C)", "",
                f"| {names[0]} \\\\ {names[1]} | " + " | ".join(map(str, lengths)) + " |",
                "|---:|" + "---:|" * len(lengths)]
        for w in widths:
            marks = []
            for n in lengths:
                r = cells[(w, n)]
                letter = "C" if r["fastest"] == "cyclic-reduction" else "S"
                star = "*" if r["predicted"] == "cyclic-reduction" else ""
                marks.append(f"{letter} {r['vs_loop'][r['fastest']]:.2f}x{star}")
            out.append(f"| {w} | " + " | ".join(marks) + " |")
        out.append("")
    return "\n".join(out)


def draw(rows: list[dict]) -> None:
    """The two maps side by side, into ``atlas.png``."""
    plt = pyplot()
    if plt is None:
        return
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    for ax, (kind, widths, lengths, names) in zip(axes, (
            ("mlp", WIDTHS, DEPTHS, ("width n", "depth l")),
            ("rnn", HIDDENS, TAUS, ("hidden H", "sequence length tau")))):
        cells = {(r["width"], r["length"]): r for r in rows if r["kind"] == kind}
        grid = np.array([[cells[(w, n)]["vs_loop"][cells[(w, n)]["fastest"]] for n in lengths]
                         for w in widths])
        image = ax.imshow(np.log2(grid), cmap="RdBu_r", vmin=-2, vmax=2, origin="lower")
        for i, w in enumerate(widths):
            for j, n in enumerate(lengths):
                r = cells[(w, n)]
                ax.text(j, i, f"{'C' if r['fastest'] == 'cyclic-reduction' else 'S'}\n"
                               f"{grid[i, j]:.2f}x", ha="center", va="center", fontsize=8)
                if r["predicted"] == "cyclic-reduction":
                    ax.scatter(j, i, s=900, facecolors="none", edgecolors="black")
        ax.set_xticks(range(len(lengths)), [str(n) for n in lengths])
        ax.set_yticks(range(len(widths)), [str(w) for w in widths])
        ax.set_xlabel(names[1])
        ax.set_ylabel(names[0])
        ax.set_title(f"{kind.upper()} backpropagation, one sample")
        fig.colorbar(image, ax=ax, label="log2(fastest / NumPy loop)")
    fig.suptitle("Where each exact method wins (S substitution, C cyclic reduction; "
                 "circles: the cost model predicts C)")
    fig.tight_layout()
    folder = destination()
    folder.mkdir(parents=True, exist_ok=True)
    fig.savefig(folder / "atlas.png", dpi=90)


def main() -> None:
    """Measure both maps, draw them, print and save the table."""
    cases = [(mlp_cell, w, d) for w in WIDTHS for d in DEPTHS] + \
        [(rnn_cell, h, t) for h in HIDDENS for t in TAUS]
    rows = [measure(a, b) for measure, a, b in each(cases, "atlas")]
    draw(rows)
    publish("atlas", rows, table(rows))


if __name__ == "__main__":
    main()
