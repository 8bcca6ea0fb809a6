# %% [markdown]
# # Cost model vs measurement
#
# A jupytext `py:percent` notebook. `propop.solvers.selection.cost` holds the paper's section 4
# formulas (sequential, direct and iterative work, time and memory) and the
# mini-batch correction: cyclic reduction's reduced blocks are per sample, so a batch
# of `r` costs `O(r l n^3)`, not the paper's `O(l n^3)`. Here the formulas meet the
# flops the solvers count and the seconds they take.

# %%
import time

import numpy as np

import propop as pp
from propop.solvers.selection import cost


def system(depth: int, n: int, r: int) -> pp.TriangularSystem:
    """The backward system of a random tanh net of ``depth`` layers of width ``n``."""
    rng = np.random.default_rng(0)
    net = pp.FNN.random([n] * (depth + 1), activation="tanh", seed=0, bias=0.1)
    trace = net.forward(rng.standard_normal((n, r)))
    return pp.backward_system(net, trace, rng.standard_normal((n, r)))


def seconds(B: pp.TriangularSystem, method: str, repeats: int = 5) -> float:
    """Median seconds of ``repeats`` solves after a warm-up."""
    pp.solve(B, method)  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        pp.solve(B, method, check=True)
        times.append(time.perf_counter() - start)
    return float(np.median(times))


# %% [markdown]
# Counted flops equal the model exactly; the paper's batch-free count is `r` times
# smaller than what a batch really needs, and the ratio to the sequential work is
# what a CPU pays for the `log2 l` depth.

# %%
print("   l    n  r | CR flops counted | model      | paper (shared) | sequential | CR/seq")
work = {"counted": [], "paper": [], "sequential": []}
for depth, n, r in [(16, 16, 1), (16, 16, 8), (64, 32, 8), (64, 64, 4)]:
    sizes = (n,) * (depth + 1)
    B = system(depth, n, r)
    counted = pp.solve(B, "cyclic-reduction").info["flops"]
    model = cost.cyclic_reduction_flops(sizes, r)
    paper = cost.cyclic_reduction_flops(sizes, r, shared=True)
    sequential = 2 * cost.sequential_work(sizes, r, gamma=0)
    assert counted == model, (counted, model)
    print(f"{depth:4d} {n:4d} {r:2d} | {counted:16.3e} | {model:10.3e} | {paper:14.3e} | "
          f"{sequential:10.3e} | {counted / sequential:6.1f}")
    for key, value in (("counted", counted), ("paper", paper), ("sequential", sequential)):
        work[key].append(value)

# %% [markdown]
# Measured time grows with the flop ratio but stays below it: cyclic reduction's
# batched block products run closer to the machine's peak than substitution's thin
# matrix products do. On 2 cores nothing wins the depth back. Iterative methods cost
# `eta` products of the whole system (`cost.iterative_work`): Jacobi with
# `eta = l + 1` sweeps does `l + 1` times substitution's work.

# %%
print("   l    n  r | time CR / substitution | flop ratio | Jacobi / substitution | "
      "iterative model")
for depth, n, r in [(16, 16, 8), (32, 64, 8), (16, 128, 4)]:
    sizes = (n,) * (depth + 1)
    B = system(depth, n, r)
    base = seconds(B, "substitution")
    flops = cost.cyclic_reduction_flops(sizes, r) / (2 * cost.sequential_work(sizes, r, 0))
    model = cost.iterative_work(sizes, r, eta=depth + 1, gamma=0) / cost.sequential_work(
        sizes, r, gamma=0)
    print(f"{depth:4d} {n:4d} {r:2d} | {seconds(B, 'cyclic-reduction') / base:22.1f} | "
          f"{flops:10.1f} | {seconds(B, 'jacobi') / base:21.1f} | {model:15.1f}")

# %% [markdown]
# Memory: the sequential pass keeps `sum_k n_k r` entries; cyclic reduction's peak,
# reduced blocks and temporaries, is estimated from the shapes before it allocates
# anything (`info["peak_bytes"]`, within 20% of tracemalloc's measured peak; above the
# memory budget the solve raises `pp.MemoryBudgetError` instead).

# %%
for depth, n, r in [(64, 32, 1), (64, 32, 8)]:
    sizes = (n,) * (depth + 1)
    sol = pp.solve(system(depth, n, r), "cyclic-reduction")
    vectors = 8 * cost.sequential_memory(sizes, r)
    print(f"l={depth} n={n} r={r}: vectors {vectors / 1e6:.2f} MB, CR peak "
          f"{sol.info['peak_bytes'] / 1e6:.2f} MB ({sol.info['peak_bytes'] / vectors:.0f}x), "
          f"{sol.status.name}")

# %% [markdown]
# With a matrix per sample, that peak grows with the batch (`r` reduced blocks per pair).
# `chunk_size=k` reduces `k` samples at a time, each chunk's blocks freed before the next:
# the same work and answer in one chunk's memory. Over the budget, the error says which
# `chunk_size` fits (`error.advice`).

# %%
big = system(64, 32, 8)
with pp.memory.limit(pp.solve(big, "cyclic-reduction").info["peak_bytes"] // 2):
    try:
        pp.solve(big, "cyclic-reduction")
    except pp.MemoryBudgetError as error:
        chunked = pp.solve(big, "cyclic-reduction", **error.advice)
        print(f"over the budget; {error.advice}: peak {chunked.info['peak_bytes'] / 1e6:.2f}"
              f" MB, {chunked.status.name}")

# %%
try:
    import matplotlib.pyplot as plt
except ImportError:
    print("matplotlib not installed: skipping the figure")
else:
    fig, ax = plt.subplots()
    for (key, label), (marker, line) in zip(
            [("paper", "the paper's count (one shared matrix)"),
             ("sequential", "sequential work")], [("s", ""), ("^", "")]):
        ax.loglog(work["counted"], work[key], marker=marker, linestyle=line, label=label)
    edge = [min(work["counted"]), max(work["counted"])]
    ax.loglog(edge, edge, color="gray", linestyle="--", label="equal to the counted flops")
    ax.set_xlabel("cyclic reduction flops, counted (= the model)")
    ax.set_ylabel("flops")
    ax.set_title("Section 4's cost model against counted work")
    ax.legend()
    print("plotted:", [line.get_label() for line in ax.lines])
