# %% [markdown]
# # Forward and backward propagation are triangular solves
#
# A jupytext `py:percent` notebook (open it in Jupyter with jupytext, or run it as a
# script). It builds an FNN, looks at its backward system, solves it with several
# methods and checks the gradients against the sequential reference and PyTorch.

# %%
import numpy as np

import propop as pp

net = pp.FNN.random([16, 32, 32, 32, 4], activation="tanh", seed=0, bias=0.1)
rng = np.random.default_rng(1)
x = rng.standard_normal((16, 8))
target = rng.standard_normal((4, 8))
trace = net.forward(x)
eps = pp.loss_gradient(trace.output, target)
B = pp.backward_system(net, trace, eps)
print(B)

# %% [markdown]
# The block pattern of one sample's system: identity on the diagonal, one coupling
# block `-f' W^T` above it in every block row (eq. back_prop_sys, scaled).

# %%
A = B.sample(0).matrix.toarray()
o = B.offsets
pattern = [["I" if i == j else ("W" if np.any(A[o[i]:o[i + 1], o[j]:o[j + 1]]) else ".")
            for j in range(B.nblocks)] for i in range(B.nblocks)]
print("\n".join(" ".join(row) for row in pattern))

# %% [markdown]
# Solve with several methods; the exact ones agree with the sequential backward pass
# to rounding, the iterative ones to their tolerance. Cyclic reduction needs
# ceil(log2(5)) = 3 levels where substitution takes 5 sequential steps.

# %%
reference = np.concatenate(net.backward(trace, eps))
for method in ["substitution", "cyclic-reduction", "parallel-cyclic-reduction", "jacobi",
               "bicgstab", "scipy.gmres", "scipy.bicgstab"]:
    sol = pp.solve(B, method)
    error = np.linalg.norm(sol.x - reference) / np.linalg.norm(reference)
    print(f"{method:16s} {sol.status.name:10s} iterations={sol.iterations:2d} "
          f"levels={sol.levels:2d} error={error:.1e}")

# %% [markdown]
# The same gradients as PyTorch's autograd, when PyTorch is installed.

# %%
g = pp.backprop(net, x, target, method="jacobi")
try:
    import torch
except ImportError:
    print("PyTorch not installed: skipping the autograd comparison")
else:
    W = [torch.tensor(Wk, requires_grad=True) for Wk in net.W]
    z = torch.tensor(x)
    for Wk, bk in zip(W, net.b):
        z = torch.tanh(Wk @ z + torch.tensor(bk)[:, None])
    (0.5 * ((z - torch.tensor(target)) ** 2).sum()).backward()
    worst = max(np.abs(gk - Wk.grad.numpy()).max() for gk, Wk in zip(g.W, W))
    print(f"largest difference from autograd: {worst:.1e}")
    assert worst < 1e-10

# %% [markdown]
# Pictures of the same: the system's pattern, the residual histories of the
# iterative methods (Jacobi's drops to zero at sweep l + 1), and parallel levels
# against depth. Needs matplotlib (`pip install "propop[plot]"`).

# %%
from propop import plot

try:
    import matplotlib  # noqa: F401  (drawn inline in Jupyter, on Agg when headless)
except ImportError:
    print("matplotlib not installed: skipping the plots")
else:
    plot.plot_system(B)
    plot.plot_convergence([pp.solve(B, m) for m in ("jacobi", "bicgstab", "scipy.gmres")])
    ax = plot.plot_levels()
    print("plotted:", [line.get_label() for line in ax.lines])
