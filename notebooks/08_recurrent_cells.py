# %% [markdown]
# # GRUs, LSTMs, any cell: backpropagation and parallel forward passes
#
# A jupytext `py:percent` notebook. A recurrence `h_s = F(h_{s-1}, x_s)` has one
# Jacobian `J_s = dF/dh` per step and sample. Backpropagation through time is the
# chain `v_s - J_{s+1}^T v_{s+1} = eps_s`; the forward pass, linearised around a guess,
# the chain `h_s - J_s h_{s-1} = c_s` (Newton's method on the whole sequence, DEER).
# Both are block bi-diagonal with per-sample blocks, so cyclic reduction solves them
# in `ceil(log2 tau)` levels. Needs PyTorch (`pip install "propop[torch]"`).

# %%
import numpy as np
import torch

import propop as pp

torch.manual_seed(0)
module = torch.nn.GRU(3, 8, num_layers=2).double()
gru = pp.from_torch(module)
print(gru)

# %% [markdown]
# The gradients of every parameter against autograd, through two methods.

# %%
xs = np.random.default_rng(1).standard_normal((100, 3, 4))  # (tau, inputs, samples)
X = torch.tensor(xs.transpose(0, 2, 1).copy(), requires_grad=True)
(0.5 * (module(X)[0] ** 2).sum()).backward()
for method in ("substitution", "cyclic-reduction"):
    g = pp.backprop(gru, xs, np.zeros((100, 8, 4)), method=method)
    error = max(np.abs(g.parameters[k] - p.grad.numpy()).max() / np.abs(p.grad.numpy()).max()
                for k, p in module.named_parameters())
    print(f"{method:17s} {g.solution.status.name} levels={g.solution.levels:3d} "
          f"worst relative parameter error {error:.1e}")

# %% [markdown]
# The Newton family: the full Jacobian (DEER), its diagonal (quasi-DEER), each layer's
# block, and Levenberg-Marquardt steps (ELK) whose damping shrinks as they succeed.
# Each iteration is one reduction over time; `info["lyapunov"]` estimates the largest
# Lyapunov exponent along the trajectory (negative: contractive, fast convergence).

# %%
exact = gru.forward(xs).z[1]
runs = {name: pp.forward(gru, xs, method="cyclic-reduction", linearization=name)
        for name in ("newton", "quasi", "block-diagonal", "damped")}
for name, trace in runs.items():
    print(f"{name:15s} {trace.info['iterations']:2d} iterations, "
          f"max state error {np.abs(trace.z[1] - exact).max():.1e}, "
          f"Lyapunov exponent {trace.info['lyapunov']:+.3f}")
print("CONVERGED" if all(t.info["converged"] for t in runs.values()) else "not converged")

# %% [markdown]
# What judges each iterate is its nonlinear residual, `max_k ||z_(k+1) - f(y_k)||` over
# `||f(y_k)||`, the true residual of the system Newton solves (`info["residuals"]`). A
# direct method's linear solves are therefore not checked a second time: they say
# `UNCHECKED`, never CONVERGED, and a failing iteration has its last solve judged and
# named in the message.

# %%
newton = runs["newton"].info
print("residuals:", " ".join(f"{r:.1e}" for r in newton["residuals"]))
print("linear solves:", {s.status.name for s in newton["solutions"]})

# %% [markdown]
# Quasi-DEER's linear system is a diagonal recurrence, `h_s = c_s + d_s * h_{s-1}`: its
# couplings are one identity shared by every step (`coupling_stack="identity"`, no
# memory) and its row scalings the Jacobians' diagonals, in closed form for the built-in
# cells. An iteration holds and reduces `O(tau r n)` where Newton's holds `tau r n^2`.

# %%
quasi_system = pp.forward_system(gru, xs, around=runs["quasi"], linearization="quasi")
newton_system = pp.forward_system(gru, xs, around=runs["newton"], linearization="newton")
print(f"quasi: {quasi_system.scale_stack.nbytes / 1e3:.0f} kB of diagonals, identity "
      f"couplings: {quasi_system.couplings.identity}; newton: "
      f"{newton_system.coupling_stack.nbytes / 1e3:.0f} kB of full blocks")

# %%
from propop import plot

try:
    import matplotlib  # noqa: F401  (drawn inline in Jupyter, on Agg when headless)
except ImportError:
    print("matplotlib not installed: skipping the plot")
else:
    ax = plot.plot_newton(runs)
    print("plotted:", [line.get_label() for line in ax.lines])

# %% [markdown]
# Any cell: a step function on one sample's tensors. Its Jacobians come from
# `torch.func`; its sequential pass calls it as written on each sample for up to four
# samples and batches it with `vmap` above, recorded once as one graph of the batched
# operations for sequences of 256 steps or more, and used when its first step equals
# `vmap`'s exactly (declare `batched=True` for a step written on rows). Here a diagonal
# recurrence, whose quasi-DEER linearisation is exact.

# %%
def step(p, h, x):
    """One sample's step: ``tanh(a * h + B x)``."""
    return torch.tanh(p["a"] * h + p["B"] @ x)


rng = np.random.default_rng(2)
cell = pp.Recurrence(step, {"a": rng.uniform(0.5, 0.9, 6), "B": rng.standard_normal((6, 3))},
                     state_size=6, input_size=3)
quasi = pp.forward(cell, xs, method="cyclic-reduction", linearization="quasi")
print("quasi-DEER on a diagonal cell:", quasi.info["iterations"], "iterations,",
      "CONVERGED" if quasi.info["converged"] else "not converged")

# %%
long = rng.standard_normal((512, 3, 8))  # 512 steps, 8 samples: the recorded graph runs it
states = cell.forward(long).z[1]
t = dict(cell.parameters)  # the tensors the cell holds
h, by_hand = torch.zeros(6, dtype=torch.float64), []
for s in range(512):  # sample 0 by hand, as a user's loop
    h = step(t, h, torch.tensor(long[s, :, 0]))
    by_hand.append(h.numpy())
print("the sequential pass against a loop by hand:",
      f"{np.abs(states[:, :, 0] - np.stack(by_hand)).max():.0e}")
