"""Truncated solves as approximate gradients: error against iterations (paper section 3.2).

The backward pass of a 16-layer network of width 32, batch 8, solved with
``maxiter = k`` for ``k = 1 .. l + 1`` by Jacobi, ``batched-gmres`` and
``batched-bicgstab``. Three nets: linear with orthogonal weights scaled by 0.7
(contractive: vanishing gradients) and by 1.3 (expanding), and a tanh net as
``FNN.random`` builds it. Reported: the relative error of ``dW`` (all layers)
against the exact gradient, and each method's largest residual. GMRES's
residual is never above Jacobi's at equal ``k`` (Jacobi's iterate lies in the
same Krylov space); the errors show when ``k < l`` iterations already give a
useful gradient. BiCGStab applies the operator twice per iteration.

Run: ``python -m benchmarks.truncated`` (seconds)
"""

from __future__ import annotations

import numpy as np

import propop as pp

from .common import publish

LAYERS, WIDTH, BATCH = 16, 32, 8
METHODS = ("jacobi", "batched-gmres", "batched-bicgstab")


def network(kind: str) -> pp.FNN:
    """The three nets of the module docstring."""
    if kind == "tanh":
        return pp.FNN.random([WIDTH] * (LAYERS + 1), activation="tanh", seed=0, bias=0.1)
    rng = np.random.default_rng(0)
    gain = {"contractive": 0.7, "expanding": 1.3}[kind]
    W = [gain * np.linalg.qr(rng.standard_normal((WIDTH, WIDTH)))[0] for _ in range(LAYERS)]
    return pp.FNN(W, activation="identity")


def weight_error(net: pp.FNN, trace: object, system: object, x: np.ndarray,
                 exact: list) -> float:
    """Relative error of all ``dW`` from the solution ``x`` of the backward system."""
    g = net.gradients(trace, net.unstack(system, x))
    num = sum(np.linalg.norm(a - b) ** 2 for a, b in zip(g.W, exact))
    return float(np.sqrt(num / sum(np.linalg.norm(b) ** 2 for b in exact)))


def study(kind: str) -> list[dict]:
    """Error and residual against ``k`` for every method on one net."""
    rng = np.random.default_rng(1)
    net = network(kind)
    trace = net.forward(rng.standard_normal((WIDTH, BATCH)))
    system = pp.backward_system(net, trace, rng.standard_normal((WIDTH, BATCH)))
    exact = net.gradients(trace, net.unstack(system, pp.solve(system, "substitution").x)).W
    rows = []
    for k in range(1, system.nblocks + 1):
        row = {"net": kind, "k": k}
        for method in METHODS:
            options = {"restart": k} if method == "batched-gmres" else {}
            sol = pp.solve(system, method, maxiter=k, rtol=1e-14, **options)
            row[method] = weight_error(net, trace, system, sol.x, exact)
            row[f"{method} residual"] = float(sol.residuals[-1])
        rows.append(row)
    return rows


def main() -> None:
    """Measure, print and save the tables."""
    rows = [row for kind in ("contractive", "tanh", "expanding") for row in study(kind)]
    lines = ["| net | k | Jacobi dW error | GMRES dW error | BiCGStab dW error "
             "| Jacobi residual | GMRES residual |", "|---|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        if row["k"] in (1, 2, 4, 8, 12, LAYERS, LAYERS + 1):
            lines.append(f"| {row['net']} | {row['k']} | {row['jacobi']:.1e} | "
                         f"{row['batched-gmres']:.1e} | {row['batched-bicgstab']:.1e} | "
                         f"{row['jacobi residual']:.1e} | {row['batched-gmres residual']:.1e} |")
    if any(row["batched-gmres residual"] > row["jacobi residual"] * (1 + 1e-8) + 1e-10
           for row in rows):
        raise RuntimeError("GMRES's residual above Jacobi's: the Krylov argument is broken")
    table = "\n".join(lines) + (f"\n\nl = {LAYERS}, width {WIDTH}, batch {BATCH}, float64; "
                                "k = iterations (maxiter).")
    publish("truncated", rows, table)


if __name__ == "__main__":
    main()
