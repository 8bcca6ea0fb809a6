"""One long-sequence backpropagation, for peak-memory measurements of the whole process.

Run: ``/usr/bin/time -v python -m benchmarks.long_sequence METHOD TAU HIDDEN BATCH``,
e.g. ``cyclic-reduction 100000 8 1``; "Maximum resident set size" is the peak.
Prints the status, levels, seconds and the reduction's own count of live blocks.
"""

from __future__ import annotations

import sys
import time

import numpy as np

import propop as pp


def main(argv: list[str]) -> None:
    """Backpropagate a random 1-layer tanh RNN over ``TAU`` steps with ``METHOD``."""
    method, tau, hidden, batch = argv[0], int(argv[1]), int(argv[2]), int(argv[3])
    rnn = pp.RNN.random([hidden, hidden], activation="tanh", seed=0)
    rng = np.random.default_rng(1)
    shape = (tau, hidden) + ((batch,) if batch > 1 else ())
    xs, targets = rng.standard_normal(shape), rng.standard_normal(shape)
    start = time.perf_counter()
    g = pp.backprop(rnn, xs, targets, method=method)
    seconds = time.perf_counter() - start
    counted = g.solution.info.get("peak_bytes", 0) / 1e6
    print(f"{method}: tau {tau}, hidden {hidden}, batch {batch}: {g.solution.status.name}, "
          f"{g.solution.levels} levels, {seconds:.2f} s, {counted:.0f} MB estimated peak")


if __name__ == "__main__":
    main(sys.argv[1:])
