# %% [markdown]
# # Training: exact and truncated backward solves, Newton forward, pruning
#
# A jupytext `py:percent` notebook. `pp.train` runs mini-batch SGD (or momentum, or
# Adam) and solves every step's backward system (eq. back_prop_sys) with the method
# you name. Exact methods train identically; a truncated iterative solve
# (`maxiter < l`) gives approximate gradients on purpose, the paper's "solve these
# problems approximately or exactly". Needs scikit-learn for the digits
# (`pip install "propop[data]"`).

# %%
import numpy as np

import propop as pp
from propop.data import digits

xtr, ytr, xte, yte = digits()
LAYERS = 6


def mlp(seed: int = 0, width: int = 32) -> pp.FNN:
    """A tanh MLP 64-width x (LAYERS - 1)-10 with a linear output layer."""
    base = pp.FNN.random([64] + [width] * (LAYERS - 1) + [10], activation="tanh", seed=seed)
    return pp.FNN(base.W, base.b, activation=["tanh"] * (LAYERS - 1) + ["identity"])


settings = dict(epochs=4, batch_size=32, lr=0.2, x_test=xte, y_test=yte)

# %% [markdown]
# Exact methods give the same weights (to rounding): substitution's `l + 1` sequential
# steps and cyclic reduction's `ceil(log2(l + 1))` levels compute the same gradients.

# %%
runs = {}
for method in ("substitution", "cyclic-reduction"):
    model, runs[method] = pp.train(mlp(), xtr, ytr, method=method, **settings)
    step = runs[method].steps[-1]
    print(f"{method:17s} {step['status']} levels {step['levels']}, test accuracy "
          f"{runs[method].epochs[-1]['test_accuracy']:.3f}")
    if method == "substitution":
        exact_model = model
print("largest weight difference:",
      max(float(np.abs(a - b).max()) for a, b in zip(model.W, exact_model.W)))

# %% [markdown]
# Truncated solves. With the right-hand side in the output block, `k` Jacobi sweeps
# from zero give the errors of the top `k` layers exactly and nothing below (one
# product per layer): the bottom layers do not learn. `l` sweeps are exact for every
# weight. GMRES minimises the residual over the same `k` top blocks, so it is not
# even exact on those.

# %%
for method, k in (("jacobi", 1), ("jacobi", 3), ("jacobi", LAYERS), ("batched-gmres", 3)):
    label = f"{method} maxiter={k}"
    _, runs[label] = pp.train(mlp(), xtr, ytr, method=method, solver_options={"maxiter": k},
                              gradient_error=True, **settings)
    errors = [s["gradient_error"] for s in runs[label].steps]
    print(f"{label:24s} test accuracy {runs[label].epochs[-1]['test_accuracy']:.3f}, "
          f"mean gradient error {np.mean(errors):.1e}, last status "
          f"{runs[label].steps[-1]['status']}")

# %% [markdown]
# Newton forward: each step's forward pass by Newton's method on the forward system
# (eq. forw_prop_sys), every linear step solved by cyclic reduction.

# %%
_, newton = pp.train(mlp(), xtr, ytr, forward="cyclic-reduction", **settings)
iterations = [s["forward_iterations"] for s in newton.steps]
print(f"Newton forward: {min(iterations)}-{max(iterations)} iterations per step, "
      f"test accuracy {newton.epochs[-1]['test_accuracy']:.3f}")

# %% [markdown]
# Pruning: magnitude (unstructured) and 8x8 block (structured) pruning of a trained
# 64-wide network, each followed by two epochs. `report` also solves the pruned
# network's backward system (8 samples) by sparse cyclic reduction: its fill-in per
# level, and its time against substitution's (on a CPU, cyclic reduction's per-sample
# reduced blocks cost far more than the sequential solve).

# %%
from propop import sparsity

wide, _ = pp.train(mlp(width=64), xtr, ytr, **settings)
reports = {}
for pattern in ("magnitude", "block"):
    reports[pattern] = sparsity.report(wide, xtr, ytr, (0.3, 0.1, 0.03), xte, yte, pattern,
                                       block=8, epochs=2, lr=0.2, batch=8)
    for r in reports[pattern]:
        fill = " ".join(f"{f:.1f}" for f in r["fill_in"]) or "dense"
        print(f"{pattern:9s} density {r['density']:.3f}: test accuracy "
              f"{r['test_accuracy']:.3f}, CR fill-in {fill}, CR "
              f"{r['cr_seconds'] / r['substitution_seconds']:.0f}x substitution's time")

# %% [markdown]
# Time. Every step returns new arrays (the trace, the solution, the gradients) and frees
# its temporaries; on Linux glibc gives that memory back after each step and faults it
# in again at the next. Set `MALLOC_TRIM_THRESHOLD_=4000000000
# MALLOC_MMAP_THRESHOLD_=33554432` before starting Python (or Jupyter), or call
# `pp.allocator.keep_freed()` in this kernel, to keep it: at 256 layers of 32 a loop of
# `g = pp.backprop(...)` alone takes 7.1-8.5 ms a call with glibc's defaults and 6.0-6.5
# ms so (`python -m benchmarks.fresh_memory`). The setting is the whole process's; this
# notebook leaves it as it is.

# %% [markdown]
# The plots (needs matplotlib).

# %%
try:
    import matplotlib  # noqa: F401  (drawn inline in Jupyter, on Agg when headless)
except ImportError:
    print("matplotlib not installed: skipping the plots")
else:
    from propop import plot

    plot.plot_training(runs, key="test_accuracy")
    ax = None
    for pattern, rows in reports.items():
        ax = plot.plot_density(rows, ax=ax, label=pattern)
    print("plotted the training histories and accuracy against density")
