"""Approximate gradients in training: accuracy on the digits against backward iterations.

The paper (section 4.2) says iterative propagation "becomes practical when the number
of iterations required for convergence eta < l". This study trains the same 16-layer
tanh MLP (64-32x15-10) on scikit-learn's digits for 10 epochs with Adam (lr 1e-3,
batch 32), its backward pass solved exactly (``substitution``, ``cyclic-reduction``)
or by ``jacobi``, ``batched-gmres`` and propop's ``bicgstab`` stopped at ``maxiter``
in {1, 2, 4, 8, l, l + 1}, over three seeds (initial weights and batch order).
Reported: the test accuracy (mean and spread over the seeds), the mean relative
error of the step gradients against the exact ones, and the median time of a
step's backward solve relative to substitution's, all measured in this run.

Run: ``python -m benchmarks.approximate_training`` (about four minutes on 2 cores);
writes ``results/approximate_training.{md,json}`` and, with matplotlib,
``results/approximate_training.png``.
"""

from __future__ import annotations

import numpy as np

import propop as pp
from propop.data import digits

from .common import destination, each, publish, pyplot

LAYERS, WIDTH, EPOCHS, SEEDS = 16, 32, 10, (0, 1, 2)
EXACT = ("substitution", "cyclic-reduction")
METHODS = ("jacobi", "batched-gmres", "bicgstab")
MAXITERS = (1, 2, 4, 8, LAYERS, LAYERS + 1)


def network(seed: int) -> pp.FNN:
    """The MLP with seed ``seed``: tanh hidden layers, a linear output layer."""
    base = pp.FNN.random([64] + [WIDTH] * (LAYERS - 1) + [10], activation="tanh", seed=seed)
    return pp.FNN(base.W, base.b, activation=["tanh"] * (LAYERS - 1) + ["identity"])


def run(method: str, maxiter: int | None, seed: int, data: tuple) -> dict:
    """Train once: test accuracy, mean gradient error, median backward-solve time."""
    xtr, ytr, xte, yte = data
    options = {} if maxiter is None else {"maxiter": maxiter}
    _, history = pp.train(network(seed), xtr, ytr, epochs=EPOCHS, batch_size=32, lr=1e-3,
                          optimizer="adam", method=method, solver_options=options,
                          gradient_error=maxiter is not None, x_test=xte, y_test=yte,
                          seed=seed, progress=False)
    errors = [s["gradient_error"] for s in history.steps if "gradient_error" in s]
    return {"method": method, "maxiter": maxiter, "seed": seed,
            "test_accuracy": history.epochs[-1]["test_accuracy"],
            "error": float(np.mean(errors)) if errors else 0.0,
            "solve_seconds": float(np.median([s["solve_seconds"] for s in history.steps]))}


def summary(rows: list) -> list:
    """One line per (method, maxiter): accuracy over the seeds, error, time ratio."""
    base = np.median([r["solve_seconds"] for r in rows if r["method"] == "substitution"])
    cases = dict.fromkeys((r["method"], r["maxiter"]) for r in rows)
    lines = []
    for method, maxiter in cases:
        mine = [r for r in rows if (r["method"], r["maxiter"]) == (method, maxiter)]
        accuracy = np.array([r["test_accuracy"] for r in mine])
        lines.append({"method": method, "maxiter": maxiter, "accuracy": accuracy.mean(),
                      "spread": accuracy.max() - accuracy.min(),
                      "error": float(np.mean([r["error"] for r in mine])),
                      "time_ratio": np.median([r["solve_seconds"] for r in mine]) / base})
    return lines


def table(lines: list) -> str:
    """The Markdown table of :func:`summary`."""
    out = ["| method | maxiter | test accuracy (mean, max - min) | mean gradient error "
           "| backward time vs substitution |", "|---|---:|---:|---:|---:|"]
    for s in lines:
        out.append(f"| {s['method']} | {s['maxiter'] or 'exact'} | {s['accuracy']:.3f} "
                   f"({s['spread']:.3f}) | {s['error']:.1e} | {s['time_ratio']:.1f}x |")
    return "\n".join(out) + (
        f"\n\n{LAYERS}-layer tanh MLP (64-{WIDTH}x{LAYERS - 1}-10), Adam lr 1e-3, batch 32, "
        f"{EPOCHS} epochs on the digits (1437 train, 360 test), seeds {SEEDS}. l = {LAYERS}: "
        f"the backward system has l + 1 = {LAYERS + 1} blocks. Backward time: the median "
        "solve of a step (batch 32), relative to substitution's in this run.")


def plot(lines: list) -> None:
    """Accuracy against maxiter, one line per method (skipped without matplotlib)."""
    plt = pyplot()
    if plt is None:
        return

    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for method in METHODS:
        mine = [s for s in lines if s["method"] == method]
        ax.errorbar([s["maxiter"] for s in mine], [s["accuracy"] for s in mine],
                    yerr=[s["spread"] / 2 for s in mine], marker="o", capsize=3, label=method)
    exact = next(s for s in lines if s["method"] == "substitution")
    ax.axhline(exact["accuracy"], color="k", ls="--", label="exact (substitution, CR)")
    ax.set(xscale="log", xlabel="backward iterations (maxiter)", ylabel="test accuracy",
           title=f"{LAYERS}-layer MLP, digits, {EPOCHS} epochs")
    ax.set_xticks(MAXITERS[:-1], [str(k) for k in MAXITERS[:-1]])  # l + 1 sits by l
    ax.legend(fontsize=8)
    fig.tight_layout()
    folder = destination()
    folder.mkdir(parents=True, exist_ok=True)
    fig.savefig(folder / "approximate_training.png", dpi=100)


def main() -> None:
    """Train every variant on every seed; print and save the table and the plot."""
    data = digits()
    cases = [(m, None) for m in EXACT] + [(m, k) for m in METHODS for k in MAXITERS]
    rows = [run(method, maxiter, seed, data)
            for (method, maxiter), seed in each([(c, s) for c in cases for s in SEEDS],
                                                "approximate_training")]
    lines = summary(rows)
    plot(lines)
    publish("approximate_training", rows, table(lines))


if __name__ == "__main__":
    main()
