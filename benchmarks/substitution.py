"""Sequential ``substitution`` through propop against a hand-written NumPy loop.

The target (issue 28, docs/measurements.md): <= 1.0x the tight loop. The loop is
``v = f'(y) * (W^T v)``
(eq. def_back_prop2) written tight (:class:`benchmarks.baselines.TightBackward`:
preallocated blocks, transposes made once, ``np.dot(..., out=)``).
Two comparisons with the same inputs on both sides: the solve on a built system
against the loop given the derivatives ``f'(y)``, and building the system plus
solving against the loop that computes ``f'(y)`` itself.

Run: ``python -m benchmarks.substitution``
"""

from __future__ import annotations

import numpy as np

import propop as pp

from .baselines import TightBackward
from .common import each, median_times, publish

CASES = [(64, 256, 32, 1.0), (64, 256, 1, 1.0), (256, 64, 16, 1.0), (64, 256, 32, 0.05)]


def derivatives(net: pp.FNN, trace: pp.Trace) -> list[np.ndarray]:
    """``f'(y)`` of every layer: what both the loop and the system need."""
    return [act.df(y) for act, y in zip(net.activations, trace.y)]


def backward_case(layers: int, width: int, batch: int, density: float = 1.0) -> tuple:
    """``(net, trace, eps, system, slopes, loop)``: a tanh MLP's backward system and loop."""
    net = pp.FNN.random([width] * (layers + 1), activation="tanh", density=density, seed=0)
    rng = np.random.default_rng(1)
    trace = net.forward(rng.standard_normal((width, batch)))
    eps = rng.standard_normal((width, batch))
    return (net, trace, eps, pp.backward_system(net, trace, eps), derivatives(net, trace),
            TightBackward(net.W, batch))


def measure(layers: int, width: int, batch: int, density: float) -> dict:
    """Times of the loop, of the solve, and of building plus solving, in one run."""
    net, trace, eps, system, slopes, loop = backward_case(layers, width, batch, density)
    reference = np.concatenate(loop(slopes, eps))
    error = np.abs(pp.solve(system).x - reference).max()
    t = median_times({
        "loop": lambda: loop(slopes, eps),
        "solve": lambda: pp.solve(system, "substitution"),
        "loop_with_slopes": lambda: loop(derivatives(net, trace), eps),
        "both": lambda: pp.solve(pp.backward_system(net, trace, eps), "substitution"),
    }, repeats=9)
    loop, solve, both = t["loop"], t["solve"], t["both"]
    return {"layers": layers, "width": width, "batch": batch, "density": density,
            "loop_ms": 1e3 * loop, "solve_ms": 1e3 * solve, "build_solve_ms": 1e3 * both,
            "loop_with_slopes_ms": 1e3 * t["loop_with_slopes"],
            "solve_ratio": solve / loop, "build_solve_ratio": both / t["loop_with_slopes"],
            "max_abs_difference": float(error)}


def main() -> None:
    """Measure every case, print the Markdown table and save the results."""
    rows = [measure(*case) for case in each(CASES, "substitution")]
    lines = ["| l | n | r | density | NumPy loop [ms] | solve [ms] | solve / loop "
             "| build + solve / loop with f' |", "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['layers']} | {r['width']} | {r['batch']} | {r['density']} | "
                     f"{r['loop_ms']:.3f} | {r['solve_ms']:.3f} | {r['solve_ratio']:.2f}x | "
                     f"{r['build_solve_ratio']:.2f}x |")
    table = "\n".join(lines)
    publish("substitution", rows, table)


if __name__ == "__main__":
    main()
