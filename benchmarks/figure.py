"""The README's figure: parallel steps and measured time against depth, deep narrow MLPs.

Left: ``Solution.levels`` of substitution (``l + 1`` sequential steps) and cyclic
reduction (``ceil(log2(l + 1))``) on tanh MLPs of width 8. Right: the time of the
whole job (forward, backward, every gradient of an MSE loss) with
``pp.backprop(..., method=...)`` against the tight NumPy loop of
``benchmarks.baselines``, width 8, one sample, measured in the same run (warm-up,
median of 5): with depth, cyclic reduction closes on the loop but does not reach it
on this CPU.

Run: ``python -m benchmarks.figure [--save]`` (about 30 s); writes ``figure.png``.
"""

from __future__ import annotations

import numpy as np

import propop as pp
from propop import plot

from .common import destination, each, median_times, publish, pyplot
from .baselines import TightMLP

DEPTHS = (64, 256, 1024, 4096)
METHODS = ("substitution", "cyclic-reduction")


def row(layers: int, width: int = 8) -> dict:
    """Times of the loop and of each method on one MLP, and their ratios."""
    net = pp.FNN.random([width] * (layers + 1), activation="tanh", seed=0, bias=0.1)
    rng = np.random.default_rng(1)
    x, t = rng.standard_normal((width, 1)), rng.standard_normal((width, 1))
    loop = TightMLP(net.W, net.b, 1)
    jobs = {"loop": lambda: loop(x, t)}
    jobs.update({m: (lambda m=m: pp.backprop(net, x, t, method=m)) for m in METHODS})
    times = median_times(jobs, repeats=5)
    return {"layers": layers, "width": width, "loop_s": times["loop"],
            "vs_loop": {m: times[m] / times["loop"] for m in METHODS}}


def main() -> None:
    """Measure, draw and save the figure and its table."""
    rows = [row(layers) for layers in each(DEPTHS, "figure")]
    lines = ["| layers | loop [ms] | " + " | ".join(METHODS) + " |",
             "|---:|---:|" + "---:|" * len(METHODS)]
    lines += [f"| {r['layers']} | {1e3 * r['loop_s']:.1f} | "
              + " | ".join(f"{r['vs_loop'][m]:.2f}x" for m in METHODS) + " |" for r in rows]
    table = ("**Deep narrow MLPs (width 8, one sample)**: time of the whole job / NumPy loop\n\n"
             + "\n".join(lines))
    plt = pyplot()
    if plt is not None:
        fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
        plot.plot_levels(depths=DEPTHS, ax=left, width=8)
        for method, (marker, line) in zip(METHODS, [("o", "-"), ("s", "--")]):
            right.semilogx([r["layers"] for r in rows], [r["vs_loop"][method] for r in rows],
                           marker=marker, linestyle=line, label=method, base=2)
        right.axhline(1.0, color="gray", linewidth=1, label="the NumPy loop")
        right.set_xlabel("layers l")
        right.set_ylabel("time / NumPy loop (lower is better)")
        right.set_title("Measured on this CPU (2 cores)")
        right.legend()
        fig.tight_layout()
        folder = destination()
        folder.mkdir(parents=True, exist_ok=True)
        fig.savefig(folder / "figure.png", dpi=90)
    publish("figure", rows, table)


if __name__ == "__main__":
    main()
