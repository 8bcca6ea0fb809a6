"""Per-sample blocks: cyclic reduction's memory and time against the loop, in chunks of samples.

A batch whose samples have their own slopes gives every pair of layers ``r``
reduced blocks of ``n x n``: cyclic reduction's memory grows as ``l r n^2`` where
the backward loop's grows as ``l r n``. ``chunk_size`` reduces that many samples at
a time (their systems are independent), each chunk's blocks freed before the next.
For the backward system of an MLP (l = 256, n = 32, r = 32 by default): the time of
the solve against the tight backward loop (:class:`~benchmarks.baselines.TightBackward`,
given the slopes, as the solve is), and the peak memory against the loop's, both
counting the weights and the system's own arrays (the slopes and the right-hand
side), the solve's allocations measured by tracemalloc. One run: warm-up, then
interleaved rounds.

Run: ``python -m benchmarks.chunks [--save]`` (under a minute on 2 cores).
"""

from __future__ import annotations

import tracemalloc
from typing import Any

import numpy as np

import propop as pp

from .common import median_times, publish
from .substitution import backward_case

CASE = (256, 32, 32)  # layers, width, samples
CHUNKS = (None, 16, 4, 2, 1)


def _peak(job: Any) -> int:
    """Bytes allocated at the peak of ``job()`` (tracemalloc)."""
    tracemalloc.start()
    job()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak


def rows(layers: int = CASE[0], width: int = CASE[1], r: int = CASE[2]) -> list[dict]:
    """The loop, substitution and cyclic reduction at every chunk size on one system."""
    net, _, eps, system, slopes, loop = backward_case(layers, width, r)
    held = sum(Wk.nbytes for Wk in net.W) + sum(s.nbytes for s in slopes) + eps.nbytes
    loop_bytes = held + sum(v.nbytes for v in loop.v) + _peak(lambda: loop(slopes, eps))
    system_bytes = held + system.rhs.nbytes  # the slopes are the system's scalings
    jobs = {"loop": lambda: loop(slopes, eps),
            "substitution": lambda: pp.solve(system, "substitution")}
    jobs.update({f"cyclic-reduction, chunk_size={c}": (
        lambda c=c: pp.solve(system, "cyclic-reduction", chunk_size=c)) for c in CHUNKS})
    times = median_times(jobs, repeats=5)
    reference = np.concatenate(loop(slopes, eps))
    out = []
    for name, job in jobs.items():
        bytes_ = loop_bytes if name == "loop" else system_bytes + _peak(job)
        error = 0.0 if name == "loop" else float(
            np.linalg.norm(job().x - reference) / np.linalg.norm(reference))
        out.append({"case": f"l={layers} n={width} r={r}", "contender": name,
                    "ms": 1e3 * times[name], "vs_loop": times[name] / times["loop"],
                    "mib": bytes_ / 2**20, "memory_vs_loop": bytes_ / loop_bytes,
                    "error": error})
    return out


def table(rows: list[dict]) -> str:
    """The rows as a Markdown table."""
    lines = [f"**Per-sample blocks, {rows[0]['case']}**: time and peak memory (weights, "
             "slopes and the solve's arrays) against the tight backward loop's", "",
             "| contender | time [ms] | vs loop | peak [MiB] | vs loop | error |",
             "|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['contender']} | {r['ms']:.1f} | {r['vs_loop']:.2f}x | {r['mib']:.1f} | "
              f"{r['memory_vs_loop']:.1f}x | {r['error']:.0e} |" for r in rows]
    return "\n".join(lines)


def main() -> None:
    """Measure, print and save (``--save``: into ``benchmarks/results``)."""
    measured = rows()
    publish("chunks", measured, table(measured))


if __name__ == "__main__":
    main()
