"""The RNN system's Kronecker-structured operator against the explicit matrix and a per-step loop.

A 1-layer tanh RNN with hidden width 20, batch 1 and 16, tau in {64, 1024, 16384}:
time of ``system.apply(v)`` (one product per repeated coupling over all steps),
of ``system.matrix @ v`` (prebuilt CSR/BSR), and of the same system without its
time structure (a loop over the time steps' couplings), in one run, median of 7.

Run: ``python -m benchmarks.rnn_operator``
"""

from __future__ import annotations

import numpy as np

import propop as pp

from .common import each, median_times, publish

TAUS = (64, 1024, 16384)


def measure(tau: int, batch: int) -> dict:
    """Times of the three products for one sequence length and batch."""
    rnn = pp.RNN.random([20, 20], activation="tanh", seed=0)
    rng = np.random.default_rng(1)
    xs = rng.standard_normal((tau, 20, batch))
    trace = rnn.forward(xs)
    system = pp.backward_system(rnn, trace, rng.standard_normal(trace.output.shape))
    looped = system.unstructured()
    v = rng.standard_normal(system.rhs.shape)
    flat = v.T.reshape(-1)
    matrix = system.matrix
    assert np.allclose(system.apply(v), looped.apply(v))
    t = median_times({"structured": lambda: system.apply(v),
                      "matrix": lambda: matrix @ flat,
                      "per-step loop": lambda: looped.apply(v)})
    return {"tau": tau, "batch": batch, **{f"{k}_ms": 1e3 * s for k, s in t.items()},
            "matrix_ratio": t["matrix"] / t["structured"],
            "loop_ratio": t["per-step loop"] / t["structured"]}


def main() -> None:
    """Measure, print and save the table."""
    rows = [measure(tau, batch)
            for batch, tau in each([(b, t) for b in (1, 16) for t in TAUS], "rnn_operator")]
    lines = ["| tau | batch | structured [ms] | matrix @ v [ms] | per-step loop [ms] "
             "| matrix / structured | loop / structured |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['tau']} | {r['batch']} | {r['structured_ms']:.2f} | "
                     f"{r['matrix_ms']:.2f} | {r['per-step loop_ms']:.2f} | "
                     f"{r['matrix_ratio']:.1f}x | {r['loop_ratio']:.1f}x |")
    table = "\n".join(lines)
    publish("rnn_operator", rows, table)


if __name__ == "__main__":
    main()
