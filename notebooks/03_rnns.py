# %% [markdown]
# # RNNs: two-level systems, the structured operator, two-level cyclic reduction, hybrid
#
# A jupytext `py:percent` notebook. An RNN's backward pass is one block triangular
# system over layers and time (eqs. back_prop_sys_rnn, back_prop_sub_sys_rnn). Its
# operator applies each repeated coupling once for all time steps; cyclic reduction
# reduces it over the layers of a step, then over time; `hybrid` solves each step's
# layers directly inside an iteration over time (paper section 3.4).

# %%
import time

import numpy as np

import propop as pp

rnn = pp.RNN.random([4, 16, 16], activation="tanh", seed=0)
rng = np.random.default_rng(1)
tau, r = 200, 4
xs = rng.standard_normal((tau, 4, r))
targets = rng.standard_normal((tau, 16, r))
trace = rnn.forward(xs)
B = pp.backward_system(rnn, trace, rnn.loss_gradient(trace, targets))
print(B, "nilpotency index", pp.solvers.nilpotency_index(B))

# %% [markdown]
# The structured operator equals the explicit matrix, at one product per template.

# %%
v = rng.standard_normal(B.shape[0])
print("operator vs matrix:", np.abs(B.operator @ v - B.matrix @ v).max())

# %% [markdown]
# Every exact method agrees with backpropagation through time; cyclic reduction takes
# `ceil(log2 l') + ceil(log2 tau)` levels where substitution takes one per block.

# %%
reference = rnn.gradients(trace, rnn.backward(trace, rnn.loss_gradient(trace, targets)))
for method, options in [("substitution", {}), ("cyclic-reduction", {}),
                        ("cyclic-reduction", {"within": "substitution"}),
                        ("hybrid", {"outer": "jacobi"}), ("hybrid", {"outer": "gmres"}),
                        ("hybrid", {"outer": "bicgstab"}),
                        ("batched-gmres", {})]:
    g = pp.backprop(rnn, xs, targets, method=method, **options)
    error = max(np.abs(a - b).max() / np.abs(b).max() for a, b in zip(g.W, reference.W))
    sol = g.solution
    print(f"{method:17s} {str(options):28s} {sol.status.name} levels={sol.levels:5d} "
          f"iterations={sol.iterations:4d} dW error={error:.1e} {sol.info.get('levels', '')}")

# %% [markdown]
# Long sequences: cyclic reduction's dense per-step blocks cost `O(tau r H^3)` against
# the loop's `O(tau r H^2)`, so at small widths it can beat substitution even on a CPU.

# %%
small = pp.RNN.random([8, 8], activation="tanh", seed=0)
long_xs = rng.standard_normal((20000, 8))
long_targets = rng.standard_normal((20000, 8))
methods, repeats = ("substitution", "cyclic-reduction"), 5
runs = {method: [] for method in methods}
for _ in range(repeats + 1):  # the methods interleaved; the first round warms up
    for method in methods:
        start = time.perf_counter()
        g = pp.backprop(small, long_xs, long_targets, method=method)
        runs[method].append(time.perf_counter() - start)
        levels, status = g.solution.levels, g.solution.status.name
for method, seconds in runs.items():
    timed = np.array(seconds[1:])
    print(f"tau=20000 hidden 8: {method:17s} median {np.median(timed):.3f} s (min "
          f"{timed.min():.3f}, max {timed.max():.3f}, {repeats} runs after a warm-up)")
print(f"cyclic-reduction: {levels} levels, {status}")

# %% [markdown]
# The depth in a picture: parallel steps of the backward pass against the sequence
# length, one sequential step per block for substitution against
# `ceil(log2 l') + ceil(log2 tau)` for the two-level cyclic reduction.

# %%
taus = [16, 64, 256, 1024]
steps = {"substitution": [], "cyclic-reduction": []}
tiny = pp.RNN.random([4, 4, 4], activation="tanh", seed=0)
for tau in taus:
    sequence = rng.standard_normal((tau, 4))
    tiny_trace = tiny.forward(sequence)
    B_tau = pp.backward_system(tiny, tiny_trace, tiny.loss_gradient(tiny_trace, sequence))
    for method in steps:
        steps[method].append(pp.solve(B_tau, method).levels)
try:
    import matplotlib.pyplot as plt
except ImportError:
    print("matplotlib not installed: skipping the figure")
else:
    fig, ax = plt.subplots()
    for (method, levels), (marker, line) in zip(steps.items(), [("o", "-"), ("s", "--")]):
        ax.loglog(taus, levels, marker=marker, linestyle=line, label=method, base=2)
    ax.set_xlabel("time steps tau")
    ax.set_ylabel("levels (parallel steps)")
    ax.set_title("RNN backward pass (2 layers, hidden 4): parallel steps")
    ax.legend()
    print("plotted:", [line.get_label() for line in ax.lines])
