"""Sequential ``substitution`` through propop against a hand-written NumPy loop.

DESIGN section 7 target: <= 1.15x the loop for an FNN with l = 64, n = 256,
r = 32. Both start from the same trace and ``eps``; the loop is the textbook
``v = f'(y) * (W^T v)`` (eq. def_back_prop2). propop's time is given for the
solve alone and for building the system plus solving.

Run: ``python -m benchmarks.substitution``
"""

from __future__ import annotations

import numpy as np

import propop as pp

from .common import median_times, save

CASES = [(64, 256, 32, 1.0), (64, 256, 1, 1.0), (256, 64, 16, 1.0), (64, 256, 32, 0.05)]


def numpy_loop(net: pp.FNN, trace: pp.Trace, eps: np.ndarray) -> list[np.ndarray]:
    """The hand-written baseline: the backward pass as one would type it."""
    v = [None] * (net.depth + 1)
    v[-1] = net.activations[-1].df(trace.y[-1]) * eps
    for k in range(net.depth - 1, 0, -1):
        v[k] = net.activations[k - 1].df(trace.y[k - 1]) * (net.W[k].T @ v[k + 1])
    v[0] = net.W[0].T @ v[1]
    return v


def measure(layers: int, width: int, batch: int, density: float) -> dict:
    """Times of the loop, of the solve, and of building plus solving, in one run."""
    net = pp.FNN.random([width] * (layers + 1), activation="tanh", density=density, seed=0)
    rng = np.random.default_rng(1)
    trace = net.forward(rng.standard_normal((width, batch)))
    eps = rng.standard_normal((width, batch))
    system = pp.backward_system(net, trace, eps)
    error = np.abs(pp.solve(system).x - np.concatenate(numpy_loop(net, trace, eps))).max()
    t = median_times({
        "loop": lambda: numpy_loop(net, trace, eps),
        "solve": lambda: pp.solve(system, "substitution"),
        "both": lambda: pp.solve(pp.backward_system(net, trace, eps), "substitution"),
    }, repeats=9)
    loop, solve, both = t["loop"], t["solve"], t["both"]
    return {"layers": layers, "width": width, "batch": batch, "density": density,
            "loop_ms": 1e3 * loop, "solve_ms": 1e3 * solve, "build_solve_ms": 1e3 * both,
            "solve_ratio": solve / loop, "build_solve_ratio": both / loop,
            "max_abs_difference": float(error)}


def main() -> None:
    """Measure every case, print the Markdown table and save the results."""
    rows = [measure(*case) for case in CASES]
    lines = ["| l | n | r | density | NumPy loop [ms] | solve [ms] | solve / loop "
             "| build + solve / loop |", "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['layers']} | {r['width']} | {r['batch']} | {r['density']} | "
                     f"{r['loop_ms']:.3f} | {r['solve_ms']:.3f} | {r['solve_ratio']:.2f}x | "
                     f"{r['build_solve_ratio']:.2f}x |")
    table = "\n".join(lines)
    print(table)
    print(f"written to {save('substitution', rows, table)}")


if __name__ == "__main__":
    main()
