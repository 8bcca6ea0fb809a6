"""A loop that calls propop alone: its time, page faults and kernel time, by glibc setting.

``benchmarks.peers`` interleaves the contenders, whose allocations change what the heap
holds between propop's calls. A user's loop calls propop again and again, and then
glibc's defaults decide: memory freed at the end of a call goes back to the system once
enough of it is free at the top of the heap (``M_TRIM_THRESHOLD``, adjusted as arrays
are freed), and arrays over ``M_MMAP_THRESHOLD`` (at most 32 MiB) are mapped fresh; the
next call faults all of it in again. Each case runs in its own process, under glibc's
defaults, under

    MALLOC_TRIM_THRESHOLD_=4000000000 MALLOC_MMAP_THRESHOLD_=33554432

(nothing given back; arrays to 32 MiB from the heap), and under glibc's defaults with
``pp.allocator.keep_freed()`` called first (the same thresholds, set in the running
process), in alternating rounds: the median
time of a call (each result held until the next call returns, as a loop's
``g = pp.backprop(...)`` holds it), the page faults (``ru_minflt``) and the system time
a call; the tight NumPy loop (:mod:`benchmarks.baselines`, which writes into arrays it
made once) runs in the same process for scale.

Run: ``python -m benchmarks.fresh_memory [--save]`` (about three minutes).
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import propop as pp

from .baselines import TightMLP, TightRNN, TightRNNForward
from .common import arguments, each, publish, threads

KEEP = {"MALLOC_TRIM_THRESHOLD_": "4000000000", "MALLOC_MMAP_THRESHOLD_": "33554432"}
CASES = ("mlp l=256 n=32 r=32", "mlp l=64 n=128 r=32", "rnn H=20 r=16 tau=10000",
         "newton H=8 tau=10000", "train l=256 n=32 batch=32")
SETTINGS = ("default", "kept", "keep_freed")  # glibc's; the variables; the function
ROUNDS = 3  # processes per setting, alternating
CALLS = 15  # timed calls per process, after two untimed ones


def _sizes(case: str) -> list[int]:
    """The numbers of a case's name: ``"mlp l=256 n=32 r=32"`` -> ``[256, 32, 32]``."""
    return [int(part.split("=")[1]) for part in case.split()[1:]]


def jobs(case: str) -> tuple[Callable[[], Any], Callable[[], Any] | None]:
    """``(propop's call, the tight loop's or None)`` for ``case``."""
    rng = np.random.default_rng(1)
    if case.startswith("mlp"):
        layers, width, r = _sizes(case)
        net = pp.FNN.random([width] * (layers + 1), activation="tanh", seed=0, bias=0.1)
        x, t = rng.standard_normal((2, width, r))
        loop = TightMLP(net.W, net.b, r)
        return (lambda: pp.backprop(net, x, t)), (lambda: loop(x, t))
    if case.startswith("rnn"):
        hidden, r, tau = _sizes(case)
        rnn = pp.RNN.random([hidden, hidden], activation="tanh", seed=0)
        xs, t = rng.standard_normal((2, tau, hidden, r))
        loop = TightRNN(rnn.W[0], rnn.U[0], rnn.b[0], tau, r)
        return (lambda: pp.backprop(rnn, xs, t)), (lambda: loop(xs, t))
    if case.startswith("newton"):  # the Newton forward of benchmarks.newton's Elman case
        hidden, tau = _sizes(case)
        rnn = pp.RNN.random([hidden, hidden], activation="tanh", seed=0)
        xs = rng.standard_normal((tau, hidden))
        forward = TightRNNForward(rnn.W[0], rnn.U[0], rnn.b[0], tau)
        return (lambda: pp.forward(rnn, xs, method="cyclic-reduction")), (lambda: forward(xs))
    layers, width, batch = _sizes(case)
    net = pp.FNN.random([width] * (layers + 1), activation="tanh", seed=0, bias=0.1)
    x, y = rng.standard_normal((2, width, batch * 8))  # eight steps a call
    return (lambda: pp.train(net, x, y, batch_size=batch, loss="mse", lr=1e-3,
                             progress=False)), None


def measure(job: Callable[[], Any], calls: int = CALLS) -> dict[str, float]:
    """Median seconds a call over ``calls`` calls, and faults and system seconds a call.

    Each result is held until the next call returns, as ``g = pp.backprop(...)`` in a
    loop holds it (a result dropped at once leaves the whole heap free to be trimmed:
    at l = 256, n = 32, r = 32 12.6 against 8.5 ms a call).
    """
    result = [job() for _ in range(2)][-1]
    times, before = [], resource.getrusage(resource.RUSAGE_SELF)
    for _ in range(calls):
        start = time.perf_counter()
        result = job()
        times.append(time.perf_counter() - start)
    del result
    after = resource.getrusage(resource.RUSAGE_SELF)
    return {"median": statistics.median(times),
            "faults": (after.ru_minflt - before.ru_minflt) / calls,
            "system": (after.ru_stime - before.ru_stime) / calls}


def child(case: str, keep_freed: bool = False) -> dict[str, Any]:
    """One process's measurement of ``case``: propop's loop, then the tight loop's.

    ``keep_freed``: :func:`propop.allocator.keep_freed` first.
    """
    threads()
    if keep_freed and not pp.allocator.keep_freed():
        raise SystemExit("pp.allocator.keep_freed(): this C library is not glibc")
    propop, loop = jobs(case)
    out = {"propop": measure(propop)}
    if loop is not None:
        out["loop"] = measure(loop)
    return out


def row(case: str, rounds: int = ROUNDS) -> dict[str, Any]:
    """``case`` in ``rounds`` processes per setting, the settings alternating."""
    runs: dict[str, list] = {setting: [] for setting in SETTINGS}
    for _ in range(rounds):
        for setting in runs:
            env = {k: v for k, v in os.environ.items() if k not in KEEP}  # glibc's defaults
            env.update(KEEP if setting == "kept" else {})
            done = subprocess.run([sys.executable, "-m", "benchmarks.fresh_memory",
                                   "--child", case] + ["--keep-freed"] * (
                                       setting == "keep_freed"), env=env,
                                  capture_output=True, text=True, check=True)
            runs[setting].append(json.loads(done.stdout.strip().splitlines()[-1]))
    return {"case": case, "runs": runs}


def _summary(runs: list[dict], who: str) -> tuple[float, float, float, float, float]:
    """Median, fastest and slowest of the processes' medians [ms]; faults; system [ms]."""
    medians = [1e3 * run[who]["median"] for run in runs]
    return (statistics.median(medians), min(medians), max(medians),
            statistics.median(run[who]["faults"] for run in runs),
            1e3 * statistics.median(run[who]["system"] for run in runs))


def table(rows: list[dict]) -> str:
    """One line per case: propop under each setting, and the tight loop for scale."""
    out = ["**A loop that calls propop alone**: median time of a call [ms] (the processes' "
           "range), page faults and system time [ms] a call; glibc's defaults against "
           "`MALLOC_TRIM_THRESHOLD_=4000000000 MALLOC_MMAP_THRESHOLD_=33554432` and "
           "against `pp.allocator.keep_freed()` called in the process", "",
           "| case | propop, glibc defaults | faults, system | propop, memory kept | "
           "faults, system | propop, keep_freed() | faults, system | tight loop |",
           "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        cells = []
        for setting in SETTINGS:
            med, low, high, faults, system = _summary(r["runs"][setting], "propop")
            cells += [f"{med:.1f} ({low:.1f}-{high:.1f})", f"{faults:.0f}, {system:.1f}"]
        loop = ("-" if "loop" not in r["runs"]["default"][0] else
                f"{_summary(r['runs']['default'], 'loop')[0]:.1f}")
        out.append(f"| {r['case']} | " + " | ".join(cells) + f" | {loop} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    """Every case (``--child CASE``: one process's measurement, printed as JSON)."""
    parser = arguments("fresh_memory")
    parser.add_argument("--child", choices=CASES)
    parser.add_argument("--keep-freed", action="store_true")
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.keep_freed)))
        return
    rows = [row(case) for case in each(CASES, "fresh memory")]
    publish("fresh_memory", rows, table(rows))


if __name__ == "__main__":
    main()
