"""Approximate gradients in training: accuracy on the digits against backward iterations.

An 8-layer tanh MLP (64-32x7-10), SGD lr 0.3, batch 32, 5 epochs, the same seed for
every run. The backward pass is solved exactly (substitution) or by Jacobi,
``batched-gmres`` and ``batched-bicgstab`` stopped at ``maxiter`` in {1, 2, 4, 8, l + 1};
reported: test accuracy after training and the mean relative gradient error of the
steps. The paper's open question: when do ``eta < l`` iterations suffice?

Run: ``python -m benchmarks.approximate_training`` (about a minute); writes a table
and ``results/approximate_training.png`` (with matplotlib).
"""

from __future__ import annotations

import numpy as np

import propop as pp
from propop.data import digits
from propop.training import train

from .common import each, publish

LAYERS, EPOCHS = 8, 5
METHODS = ("jacobi", "batched-gmres", "batched-bicgstab")
MAXITERS = (1, 2, 4, 8, LAYERS + 1)


def network() -> pp.FNN:
    """The MLP, identical for every run."""
    base = pp.FNN.random([64] + [32] * (LAYERS - 1) + [10], activation="tanh", seed=0)
    return pp.FNN(base.W, base.b, activation=["tanh"] * (LAYERS - 1) + ["identity"])


def run(method: str, maxiter: int | None) -> dict:
    """Train once; the test accuracy and the mean gradient error."""
    xtr, ytr, xte, yte = digits()
    options = {} if maxiter is None else {"maxiter": maxiter}
    _, history = train(network(), xtr, ytr, epochs=EPOCHS, batch_size=32, lr=0.3,
                       method=method, solver_options=options, gradient_error=maxiter is not None,
                       x_test=xte, y_test=yte)
    errors = [s["gradient_error"] for s in history.steps if "gradient_error" in s]
    return {"method": method, "maxiter": maxiter, "error": float(np.mean(errors)) if errors
            else 0.0, "test_accuracy": history.epochs[-1]["test_accuracy"]}


def plot(rows: list) -> None:
    """Accuracy against maxiter, one line per method (skipped without matplotlib)."""
    try:
        import matplotlib
    except ImportError:
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .common import RESULTS

    fig, ax = plt.subplots(figsize=(5, 3.5))
    exact = next(r["test_accuracy"] for r in rows if r["maxiter"] is None)
    for method in METHODS:
        mine = [r for r in rows if r["method"] == method]
        ax.plot([r["maxiter"] for r in mine], [r["test_accuracy"] for r in mine], "o-",
                label=method)
    ax.axhline(exact, color="k", ls="--", label="exact (substitution)")
    ax.set(xscale="log", xlabel="backward iterations (maxiter)", ylabel="test accuracy",
           title=f"{LAYERS}-layer MLP, digits, {EPOCHS} epochs")
    ax.legend()
    fig.tight_layout()
    fig.savefig(RESULTS / "approximate_training.png", dpi=100)


def main() -> None:
    """Train every variant, print and save the table and the plot."""
    cases = [("substitution", None)] + [(m, k) for m in METHODS for k in MAXITERS]
    rows = [run(*case) for case in each(cases, "approximate_training")]
    lines = ["| method | maxiter | mean gradient error | test accuracy |",
             "|---|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['method']} | {r['maxiter'] or 'exact'} | {r['error']:.1e} | "
                     f"{r['test_accuracy']:.3f} |")
    table = "\n".join(lines) + (f"\n\n{LAYERS}-layer tanh MLP (64-32x7-10), SGD lr 0.3, "
                                f"batch 32, {EPOCHS} epochs, seed 0.")
    plot(rows)
    publish("approximate_training", rows, table)


if __name__ == "__main__":
    main()
