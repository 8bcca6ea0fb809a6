"""Products with a computation graph's system: ``A x`` and ``A^T x``, and Jacobi built on them.

Residual MLPs (``Graph.residual_mlp``: blocks ``x + W2 f(W1 x + b1)``), their backward
system, and the products Krylov and Jacobi methods repeat: the couplings are grouped
by shape (``propop/systems/edge_groups.py``), so the Python work is per group, not
per edge. Warm-up, median of 5 (of 20 products each for the products).

Run: ``python -m benchmarks.graph_products [--save]`` (about 10 s).
"""

from __future__ import annotations

import numpy as np

import propop as pp

from .common import each, median_times, publish

CASES = [(256, 8, 1), (64, 32, 16)]  # (residual blocks, width, batch)


def row(blocks: int, width: int, batch: int) -> dict:
    """Times of the products and of a Jacobi solve on one residual graph."""
    graph = pp.Graph.residual_mlp(width, blocks)
    x = np.random.default_rng(0).standard_normal((width, batch))
    trace = graph.forward(x)
    system = pp.backward_system(graph, trace, graph.loss_gradient(trace, np.zeros_like(x)))
    v = np.random.default_rng(1).standard_normal(system.rhs.shape)
    jobs = {"A x": lambda: [system.apply(v) for _ in range(20)],
            "A^T x": lambda: [system.apply(v, transpose=True) for _ in range(20)],
            "jacobi": lambda: pp.solve(system, "jacobi")}
    times = median_times(jobs, repeats=5)
    return {"case": f"{blocks} blocks, width {width}, batch {batch}",
            "edges": len(system.blocks.edges), "A x_ms": 1e3 * times["A x"] / 20,
            "A^T x_ms": 1e3 * times["A^T x"] / 20, "jacobi_ms": 1e3 * times["jacobi"]}


def main() -> None:
    """Measure every case, print and save the table."""
    rows = [row(*case) for case in each(CASES, "graph_products")]
    lines = ["| residual graph | couplings | A x [ms] | A^T x [ms] | jacobi [ms] |",
             "|---|---:|---:|---:|---:|"]
    lines += [f"| {r['case']} | {r['edges']} | {r['A x_ms']:.3f} | {r['A^T x_ms']:.3f} | "
              f"{r['jacobi_ms']:.1f} |" for r in rows]
    publish("graph_products", rows, "\n".join(lines))


if __name__ == "__main__":
    main()
