# %% [markdown]
# # Choosing a solver
#
# A jupytext `py:percent` notebook. The registry, what each kind of method costs and
# promises, residual histories, and the parallel depth of cyclic reduction.

# %%
import numpy as np

import propop as pp

from propop.solvers.registry import REQUIREMENT_WORDS

for info in pp.solvers.available():
    words = ", ".join(REQUIREMENT_WORDS[r] for r in info.requires)
    needs = f" (needs a {words})" if info.requires else ""
    print(f"{info.name:28s} {info.kind:9s} exact={info.exact!s:5s} {info.description}{needs}")

# %% [markdown]
# A backward system of a 12-layer tanh network with a batch of 8. Exact methods agree
# with the sequential reference to rounding; `levels` counts parallel steps.

# %%
net = pp.FNN.random([32] * 13, activation="tanh", seed=0, bias=0.1)
rng = np.random.default_rng(1)
x = rng.standard_normal((32, 8))
trace = net.forward(x)
B = pp.backward_system(net, trace, pp.loss_gradient(trace.output, rng.standard_normal((32, 8))))
exact = pp.solve(B, "substitution").x
for method in ["substitution", "cyclic-reduction", "parallel-cyclic-reduction", "jacobi",
               "bicgstab", "scipy.gmres", "scipy.bicgstab"]:
    sol = pp.solve(B, method)
    error = np.linalg.norm(sol.x - exact) / np.linalg.norm(exact)
    print(f"{method:26s} {sol.status.name:10s} iterations={sol.iterations:3d} "
          f"levels={sol.levels:3d} error={error:.1e} flops={sol.info.get('flops', '-')}")

# %% [markdown]
# The off-diagonal part is nilpotent: Jacobi reaches the exact answer at sweep
# `l + 1 = 13` and not before. Whether each sweep contracts the error is known ahead
# of time from the block diagonal dominance (paper section 3.2).

# %%
print(pp.solvers.diagonal_dominance(B))
histories = {m: pp.solve(B, m, rtol=1e-14)
             for m in ("jacobi", "batched-bicgstab", "batched-gmres", "scipy.gmres")}
for method, sol in histories.items():
    relative = np.array(sol.residuals) / sol.residuals[0]
    print(method, " ".join(f"{r:.0e}" for r in relative))

# %% [markdown]
# SciPy's BiCGStab takes the shadow residual `r0`, which lives in the last block of a
# backward system; after one step the residual is orthogonal to it. propop reports the
# breakdown instead of returning wrong gradients; its own BiCGStab uses a random shadow.

# %%
print(pp.solve(B, "scipy.bicgstab").message)
print(pp.solve(B, "bicgstab", shadow="residual").message)

# %% [markdown]
# Any Krylov solver of `scipy.sparse.linalg` is a method, by name or as the function
# itself (`pp.solvers.adapt` wraps one explicitly); one that needs a symmetric matrix
# is refused with the reason.

# %%
import scipy.sparse.linalg

print(pp.solve(B, scipy.sparse.linalg.gcrotmk))
try:
    pp.solve(B, "scipy.cg")
except ValueError as error:
    print(error)

# %% [markdown]
# The batch is eight matrices (the per-sample `f'(y)` differ): the batched methods run
# eight recurrences in lock-step. Block methods are for one matrix with several
# right-hand sides; here the batch-mean matrix, an approximation they report.
# `explain` says which applies, with the nilpotency index and the Jacobian decay.

# %%
pp.solvers.explain(B)
S = B.shared("mean").with_rhs(rng.standard_normal(B.rhs.shape))  # one matrix, 8 columns
for method in ("block-gmres", "block-bicgstab", "batched-gmres"):
    sol = pp.solve(S, method, rtol=1e-10)
    histories[f"{method} (one matrix)"] = sol
    print(f"{method:15s} {sol.status.name} operator applications "
          f"{sol.info['operator_applications']}, matvecs {sol.info['matvecs']}")
print("preconditioned:", pp.solve(B, "batched-gmres", M=("block-jacobi", {"group": 4})))

# %% [markdown]
# Cyclic reduction's depth grows as `log2 l` where substitution's grows as `l`; its work
# grows as `n^3` per block product, `r` of them per pair for a batch
# (`propop.solvers.selection.cost`).

# %%
from propop.solvers.selection import cost

for depth in (4, 16, 64, 256):
    sizes = (32,) * (depth + 1)
    print(f"l={depth:4d}  levels: substitution {depth + 1:4d}, cyclic reduction "
          f"{int(np.ceil(np.log2(depth + 1))):2d};  flops for r=8: sequential "
          f"{2 * cost.sequential_work(sizes, 8, gamma=0):.1e}, CR "
          f"{cost.cyclic_reduction_flops(sizes, 8):.1e}")

# %%
try:
    import matplotlib  # noqa: F401  (drawn inline in Jupyter, on Agg when headless)
except ImportError:
    print("matplotlib not installed: skipping the plots")
else:
    from propop import plot

    plot.plot_convergence(histories)  # labelled by its keys
    print("plotted the residual histories and the levels")
