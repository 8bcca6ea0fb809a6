"""Pruned networks on the digits: accuracy, cyclic reduction's fill-in and time against density.

A 64-256-256-256-10 tanh MLP is trained densely (SGD lr 0.1, batch 32, 5 epochs), then
pruned to each density by each pattern of :mod:`propop.sparsity` (``magnitude``,
``block`` with 8x8 tiles, ``banded``), either one-shot followed by 4 epochs or
gradually in 4 stages of 1 epoch (Zhu and Gupta's cubic schedule): the same training
budget. For the pruned network :func:`propop.sparsity.report` gives the test
accuracy, the fill-in of sparse cyclic reduction level by level (non-zeros of a
reduced block over an original one) and the median times (warm-up, then 5 runs) of
substitution and sparse cyclic reduction on the backward system of a batch of 32.

Run: ``python -m benchmarks.sparsity`` (about two minutes on 2 cores); writes
``results/sparsity.{md,json}`` and, with matplotlib, ``results/sparsity.png``.
"""

from __future__ import annotations

import propop as pp
from propop.data import digits
from propop.sparsity import PATTERNS, report

from .common import destination, each, publish, pyplot

DENSITIES = (0.5, 0.2, 0.1, 0.05, 0.02)
SCHEDULES = {"one-shot": {"stages": 1, "epochs": 4}, "gradual": {"stages": 4, "epochs": 1}}
SIZES = [64, 256, 256, 256, 10]


def trained(data: tuple) -> tuple:
    """The dense MLP after 5 epochs, and its row (density 1, 4 more epochs)."""
    xtr, ytr, xte, yte = data
    base = pp.FNN.random(SIZES, activation="tanh", seed=0)
    net = pp.FNN(base.W, base.b, activation=["tanh"] * (len(SIZES) - 2) + ["identity"])
    net, _ = pp.train(net, xtr, ytr, epochs=5, lr=0.1, progress=False)
    row = report(net, xtr, ytr, [1.0], xte, yte, lr=0.1, epochs=4, progress=False)[0]
    return net, dict(row, pattern="dense", schedule="-")


def rows_for(net: pp.FNN, data: tuple, pattern: str, schedule: str) -> list:
    """One pattern and schedule over every density."""
    rows = report(net, *data[:2], DENSITIES, *data[2:], pattern, block=8, lr=0.1,
                  progress=False, **SCHEDULES[schedule])
    return [dict(r, pattern=pattern, schedule=schedule) for r in rows]


def table(rows: list) -> str:
    """The Markdown table of every row."""
    out = ["| pattern | schedule | density | test accuracy | CR fill-in per level "
           "| substitution [ms] | CR [ms] | CR / substitution | CR error |",
           "|---|---|---:|---:|---|---:|---:|---:|---:|"]
    for r in rows:
        fill = " ".join(f"{f:.1f}" for f in r["fill_in"]) or "(dense)"
        out.append(f"| {r['pattern']} | {r['schedule']} | {r['density']:.3f} | "
                   f"{r['test_accuracy']:.3f} | {fill} | {1e3 * r['substitution_seconds']:.2f} "
                   f"| {1e3 * r['cr_seconds']:.2f} | "
                   f"{r['cr_seconds'] / r['substitution_seconds']:.0f}x | {r['cr_error']:.0e} |")
    return "\n".join(out) + (
        f"\n\n{'-'.join(map(str, SIZES))} tanh MLP trained densely 5 epochs (SGD lr 0.1, "
        "batch 32), pruned, then 4 epochs of training (one-shot) or 4 stages of 1 epoch "
        "(gradual); block tiles 8x8. Times: the backward system of 32 training samples, "
        "median of 5 after a warm-up. Fill-in: the mean non-zeros of a reduced coupling "
        "over an original one's, per sparse level (the reduced chain keeps the 64- and "
        "10-wide ends, so below 1 is possible); '(dense)': dense enough that cyclic "
        "reduction ran dense from the start. Every layer is pruned, the first and last "
        "included.")


def plot(rows: list) -> None:
    """Accuracy and CR's time ratio against density (skipped without matplotlib)."""
    plt = pyplot()
    if plt is None:
        return

    from propop.plot import plot_density

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    dense = next(r for r in rows if r["pattern"] == "dense")
    left.axhline(dense["test_accuracy"], color="k", ls=":", label="dense")
    for pattern in PATTERNS:
        for schedule in SCHEDULES:
            mine = [r for r in rows if (r["pattern"], r["schedule"]) == (pattern, schedule)]
            plot_density(mine, ax=left, label=f"{pattern}, {schedule}")
            right.loglog([r["density"] for r in mine],
                         [r["cr_seconds"] / r["substitution_seconds"] for r in mine],
                         marker="o", label=f"{pattern}, {schedule}")
    right.set(xlabel="weight density", ylabel="CR time / substitution time")
    for ax in (left, right):
        ax.set_xticks(DENSITIES, [str(d) for d in DENSITIES])
        ax.tick_params(axis="x", which="minor", labelbottom=False)
    left.legend(fontsize=7)
    fig.tight_layout()
    folder = destination()
    folder.mkdir(parents=True, exist_ok=True)
    fig.savefig(folder / "sparsity.png", dpi=100)


def main() -> None:
    """Every pattern and schedule at every density; print and save the table and plot."""
    data = digits()
    net, dense = trained(data)
    cases = [(p, s) for p in PATTERNS for s in SCHEDULES]
    rows = [dense] + [r for p, s in each(cases, "sparsity") for r in rows_for(net, data, p, s)]
    plot(rows)
    publish("sparsity", rows, table(rows))


if __name__ == "__main__":
    main()
