"""Many right-hand sides: block and batched Krylov methods against r independent SciPy solves.

Two settings, each ``l = 16`` layers of width 32, float64:

1. **One matrix, r right-hand sides** (a linear network; random right-hand
   sides in every block, so no method finishes early): ``block-gmres``,
   ``block-bicgstab``, ``batched-gmres``, ``batched-bicgstab`` against
   ``scipy.sparse.linalg.gmres`` called once per column on the explicit matrix.
2. **The shifted mini-batch system** (tanh: one matrix per sample): the batched
   methods against one SciPy GMRES per sample; block methods do not apply.

Reported: median time of 5 runs after a warm-up, the time relative to the
independent solves, and operator applications (calls of the operator, each on
a whole block for propop's methods, on one vector for SciPy's) and the
columns they carried (matvecs).

Run: ``python -m benchmarks.block_krylov`` (about a minute on 2 cores)
"""

from __future__ import annotations

import numpy as np
import scipy.sparse.linalg as spla

import propop as pp

from .common import each, median_times, publish

LAYERS, WIDTH = 16, 32
BATCHES = (1, 4, 16, 64)


def system_for(activation: str, r: int) -> pp.TriangularSystem:
    """The backward system of a random net; random full-rank rhs for the linear one."""
    rng = np.random.default_rng(0)
    net = pp.FNN.random([WIDTH] * (LAYERS + 1), activation=activation, seed=0, bias=0.1)
    trace = net.forward(rng.standard_normal((WIDTH, r)))
    system = pp.backward_system(net, trace, rng.standard_normal((WIDTH, r)))
    if activation != "identity":
        return system
    shared = system.shared()
    return shared.with_rhs(rng.standard_normal(shared.rhs.shape))


def independent(system: pp.TriangularSystem) -> int:
    """One SciPy GMRES per column on its sample's explicit matrix; operator applications."""
    count = 0
    for sample in system.samples():
        A = sample.matrix.tocsr()

        def matvec(v: np.ndarray, A: object = A) -> np.ndarray:
            nonlocal count
            count += 1
            return A @ v

        op = spla.LinearOperator(A.shape, matvec=matvec, dtype=A.dtype)
        x, info = spla.gmres(op, sample.rhs, rtol=1e-10, atol=0.0, restart=LAYERS + 2)
        if info != 0:
            raise RuntimeError(f"SciPy GMRES did not converge (info={info})")
    return count


def measure(activation: str, r: int) -> list[dict]:
    """Rows for one setting and batch size."""
    system = system_for(activation, r)
    methods = ["batched-gmres", "batched-bicgstab"] + (
        ["block-gmres", "block-bicgstab"] if system.shares_matrix else [])
    exact = pp.solve(system, "substitution").x
    solutions = {m: pp.solve(system, m, rtol=1e-10, check=True) for m in methods}
    functions = {m: (lambda m=m: pp.solve(system, m, rtol=1e-10)) for m in methods}
    functions["scipy x r"] = lambda: independent(system)
    times = median_times(functions, repeats=5)
    rows = [{"activation": activation, "r": r, "method": "scipy.gmres x r",
             "seconds": times["scipy x r"], "vs_independent": 1.0,
             "applications": independent(system), "matvecs": independent(system),
             "error": 0.0}]
    for m, sol in solutions.items():
        error = float(np.linalg.norm(sol.x - exact) / np.linalg.norm(exact))
        rows.append({"activation": activation, "r": r, "method": m, "seconds": times[m],
                     "vs_independent": times[m] / times["scipy x r"],
                     "applications": sol.info["operator_applications"],
                     "matvecs": sol.info["matvecs"], "error": error})
    return rows


def main() -> None:
    """Measure, print and save the tables."""
    rows = []
    for activation, r in each([(a, r) for a in ("identity", "tanh") for r in BATCHES],
                               "block_krylov"):
        rows += measure(activation, r)
        print(rows[-1], flush=True)
    lines = ["| matrix | r | method | time [ms] | time / independent | operator applications "
             "| matvecs | error vs substitution |", "|---|---:|---|---:|---:|---:|---:|---:|"]
    for row in rows:
        kind = "one shared" if row["activation"] == "identity" else "one per sample"
        lines.append(f"| {kind} | {row['r']} | {row['method']} | {1e3 * row['seconds']:.2f} | "
                     f"{row['vs_independent']:.2f}x | {row['applications']} | "
                     f"{row['matvecs']} | {row['error']:.0e} |")
    table = "\n".join(lines) + f"\n\nl = {LAYERS}, width {WIDTH}, float64, rtol 1e-10."
    publish("block_krylov", rows, table)


if __name__ == "__main__":
    main()
