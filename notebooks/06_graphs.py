# %% [markdown]
# # Computation graphs: skip connections, convolutions, PyTorch import
#
# A jupytext `py:percent` notebook. A DAG of layers gives a block triangular system
# with one block per node and one coupling per edge (the Jacobian form of the paper's
# systems). `level-scheduled` solves it by topological levels; cyclic reduction needs
# a chain, and with `groups=True` treats each residual block as one node.

# %%
import numpy as np
import torch
from torch import nn

import propop as pp
from propop.interop.torch_import import Residual

torch.manual_seed(0)
module = nn.Sequential(
    nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
    nn.Linear(64, 16), nn.Tanh(),
    Residual(nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 16))),
    Residual(nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 16))),
    nn.Linear(16, 3)).double()
graph = pp.from_torch(module, input_shape=(1, 8, 8))
print(graph.order)

# %% [markdown]
# The same gradients as autograd, through several solvers; `x` is flattened in
# PyTorch's C order with samples as columns.

# %%
x = np.random.default_rng(0).standard_normal((5, 1, 8, 8))
X = torch.tensor(x, requires_grad=True)
(0.5 * (module(X) ** 2).sum()).backward()
flat, target = x.reshape(5, -1).T, np.zeros((3, 5))
for method, options in [("substitution", {}), ("level-scheduled", {}),
                        ("cyclic-reduction", {"groups": True}), ("batched-gmres", {})]:
    g = pp.backprop(graph, flat, target, method=method, **options)
    error = np.abs(g.parameters["0"]["W"] - module[0].weight.grad.numpy()).max()
    print(f"{method:17s} {g.solution.status.name} levels={g.solution.levels:3d} "
          f"conv dW error={error:.1e} {g.solution.info.get('levels', '')}")

# %% [markdown]
# The groups: consecutive blocks coupled only to their neighbours. Each residual
# block is one group, so over the groups the system is block bi-diagonal.

# %%
trace = graph.forward(flat)
B = pp.backward_system(graph, trace, graph.loss_gradient(trace, target))
print("chain:", B.blocks.is_chain, " group sizes:", [len(q) for q in B.blocks.groups])
print("level sizes:", pp.solve(B, "level-scheduled").info["level_sizes"])

# %% [markdown]
# Newton's method on the whole graph (the forward pass as iterated linear solves):
# exact after at most the number of blocks, usually far sooner.

# %%
newton = pp.forward(graph, flat, method="level-scheduled", linearization="newton")
print("Newton iterations:", newton.info["iterations"], "of at most", B.nblocks - 1,
      "residuals:", " ".join(f"{r:.0e}" for r in newton.info["residuals"]))
print("CONVERGED" if newton.info["converged"] else "not converged")

# %%
from propop import plot

try:
    import matplotlib  # noqa: F401  (drawn inline in Jupyter, on Agg when headless)
except ImportError:
    print("matplotlib not installed: skipping the figure")
else:
    secant = pp.forward(graph, flat, method="level-scheduled", linearization="secant",
                        check=False)
    ax = plot.plot_newton({"newton": newton, "secant": secant},
                          title="Newton on the whole conv-ResNet graph")
    print("plotted:", [line.get_label() for line in ax.lines])

# %% [markdown]
# Any module, as PyTorch users write it: `from_torch` traces `forward()` with
# `torch.fx`, so a residual sum, a batch norm in evaluation mode and a softmax over
# the features need no special classes. `print(graph)` lists the traced nodes, and
# `pp.state_dict` writes parameters back into the module.

# %%
class Written(nn.Module):
    """A residual block, a batch norm and a softmax, written in forward()."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(6, 6), nn.Linear(6, 6)
        self.norm, self.head = nn.BatchNorm1d(6), nn.Linear(6, 3)

    def forward(self, x):
        """``softmax(head(norm(x + fc2(silu(fc1(x))))))``."""
        h = x + self.fc2(torch.nn.functional.silu(self.fc1(x)))
        return torch.softmax(self.head(self.norm(h)), dim=1)


written = Written().double().eval()
traced = pp.from_torch(written)
print(traced)
xw = np.random.default_rng(3).standard_normal((6, 5))
Xw = torch.tensor(xw.T, requires_grad=True)
(0.5 * (written(Xw) ** 2).sum()).backward()
gw = pp.backprop(traced, xw, np.zeros((3, 5)), method="level-scheduled")
print(gw.solution.status.name, "dE/dx error", f"{np.abs(gw.x - Xw.grad.numpy().T).max():.1e}")
written.load_state_dict(pp.state_dict(traced), strict=False)

# %% [markdown]
# The same graph on PyTorch tensors: `traced.to("torch")` moves every layer's values
# (weights, biases, the batch norm's statistics; `.to("torch", "cuda")` on a GPU), and
# the forward pass, the backward system, the solve and the gradients then run on the
# tensors, through the same code as on NumPy. Cyclic reduction over groups makes each
# residual block one node of the chain it reduces.

# %%
on_torch = traced.to("torch")
gt = pp.backprop(on_torch, torch.from_numpy(xw), torch.zeros((3, 5), dtype=torch.float64),
                 method="cyclic-reduction", groups=True)
print(type(gt.x).__name__, gt.solution.status.name, "dE/dx error",
      f"{np.abs(gt.x.numpy() - Xw.grad.numpy().T).max():.1e}")
