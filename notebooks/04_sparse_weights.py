# %% [markdown]
# # Sparse weights: pruned, banded and random patterns
#
# A jupytext `py:percent` notebook. Sparse weights keep the systems sparse, but cyclic
# reduction multiplies couplings, and products of sparse matrices fill in. Here:
# three patterns at the same width, the fill-in of every reduction level, and time
# against density next to substitution (which only ever multiplies vectors). The
# patterns come from `propop.sparsity`; notebook 7 trains pruned networks.

# %%
import numpy as np

import propop as pp
from propop import sparsity

WIDTH, LAYERS, BATCH = 512, 16, 4
rng = np.random.default_rng(0)


def pruned(density: float) -> list:
    """Dense random weights (scaled for the kept share) pruned by magnitude."""
    dense = [rng.standard_normal((WIDTH, WIDTH)) / np.sqrt(WIDTH * density)
             for _ in range(LAYERS)]
    return sparsity.prune(pp.FNN(dense, activation="tanh"), density).W


def banded(half_width: int) -> list:
    """Weights with ``2 half_width + 1`` diagonals (a local, convolution-like pattern)."""
    return [sparsity.banded((WIDTH, WIDTH), half_width, seed=k) for k in range(LAYERS)]


def random_sparse(density: float) -> list:
    """Weights with non-zeros at random positions (``FNN.random``)."""
    return pp.FNN.random([WIDTH] * (LAYERS + 1), activation="tanh", density=density,
                         seed=1).W


def backward(W: list) -> pp.TriangularSystem:
    """The backward system of a tanh net with weights ``W`` on random data."""
    net = pp.FNN(W, activation="tanh")
    trace = net.forward(rng.standard_normal((WIDTH, BATCH)))
    return pp.backward_system(net, trace, rng.standard_normal((WIDTH, BATCH)))


# %% [markdown]
# Fill-in: the non-zeros of a reduced block relative to an original one, level by
# level. A banded pattern widens by its bandwidth at each product; a random one fills
# in fast; pruning keeps the largest entries but no structure, so it behaves like
# random. Past `dense_threshold` the remaining levels run dense.

# %%
patterns = {"pruned 2%": pruned(0.02), "banded (5 diagonals)": banded(2),
            "random 2%": random_sparse(0.02)}
for name, W in patterns.items():
    B = backward(W)
    sol = pp.solve(B, "cyclic-reduction", sparse=True)
    exact = pp.solve(B, "substitution").x
    error = np.linalg.norm(sol.x - exact) / np.linalg.norm(exact)
    fill = " ".join(f"{f:.1f}" for f in sol.info["fill_in"])
    print(f"{name:22s} {sol.status.name} error {error:.1e} fill-in per level: {fill}")

# %% [markdown]
# Time against density: substitution's work grows with the non-zeros; sparse cyclic
# reduction's with the fill-in, so it is competitive only at the lowest densities
# and with structured patterns; on a CPU it loses at every density here.

# %%
densities, repeats = (0.005, 0.02, 0.1), 5
timed = {"substitution": [], "cyclic-reduction": []}  # per density: ms of each repeat
for density in densities:
    B = backward(random_sparse(density))
    runs = {method: [] for method in timed}
    for _ in range(repeats + 1):  # the methods interleaved; the first round warms up
        for method in timed:
            runs[method].append(1e3 * pp.solve(B, method, check=True).time)
    for method, ms in runs.items():
        timed[method].append(np.array(ms[1:]))
    sub, cr = (np.median(runs[m][1:]) for m in timed)
    print(f"density {density:5.3f}: substitution {sub:7.2f} ms, cyclic reduction {cr:7.2f} ms "
          f"({cr / sub:.0f}x; medians of {repeats} after a warm-up), CONVERGED")

# %%
try:
    import matplotlib.pyplot as plt
except ImportError:
    print("matplotlib not installed: skipping the figure")
else:
    fig, ax = plt.subplots()
    for (method, ms), (marker, line) in zip(timed.items(), [("o", "-"), ("s", "--")]):
        median = np.array([np.median(m) for m in ms])
        spread = [median - [m.min() for m in ms], [m.max() for m in ms] - median]
        ax.errorbar(densities, median, yerr=spread, marker=marker, linestyle=line,
                    capsize=3, label=f"{method} (median, min-max of {repeats})")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks(densities, [f"{d:g}" for d in densities])
    ax.set_xlabel("weight density")
    ax.set_ylabel("solve time [ms]")
    ax.set_title("Random sparse weights: time against density (this CPU, warmed up)")
    ax.legend()
    print("plotted:", [t.get_text() for t in ax.get_legend().get_texts()])
