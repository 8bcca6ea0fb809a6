"""Where the time goes at the grid points of ``benchmarks.peers`` that miss their targets.

``python -m benchmarks.profiles``: each case runs once to warm up, then under
:mod:`cProfile` (``repeats`` calls); the table lists the functions with the most
time of their own, as shares of the profiled total. cProfile slows Python code
more than compiled code, so the Python shares are upper bounds; the profile
says where the time goes, ``benchmarks.peers`` how long it takes.
"""

from __future__ import annotations

import cProfile
import pstats
from collections.abc import Callable
from typing import Any

import numpy as np

import propop as pp

from .common import arguments, each, publish

__all__ = ["CASES", "profile", "main"]


def _mlp(layers: int, width: int, r: int, method: str) -> Callable[[], Any]:
    net = pp.FNN.random([width] * (layers + 1), activation="tanh", seed=0, bias=0.1)
    rng = np.random.default_rng(1)
    x, t = rng.standard_normal((width, r)), rng.standard_normal((width, r))
    return lambda: pp.backprop(net, x, t, method=method)


def _rnn(hidden: int, r: int, tau: int, method: str) -> Callable[[], Any]:
    rnn = pp.RNN.random([hidden, hidden], activation="tanh", seed=0)
    rng = np.random.default_rng(1)
    xs, t = rng.standard_normal((tau, hidden, r)), rng.standard_normal((tau, hidden, r))
    return lambda: pp.backprop(rnn, xs, t, method=method)


def _newton(hidden: int, tau: int, method: str) -> Callable[[], Any]:
    rnn = pp.RNN.random([hidden, hidden], activation="tanh", seed=0)
    xs = np.random.default_rng(1).standard_normal((tau, hidden))
    return lambda: pp.forward(rnn, xs, method=method)


def _gru(inputs: int, hidden: int, batch: int, tau: int) -> Callable[[], Any]:
    """DEER's GRU demo setting (``benchmarks.newton``): the Newton forward with CR."""
    import torch

    torch.manual_seed(0)
    gru = pp.from_torch(torch.nn.GRU(inputs, hidden).double())
    xs = np.random.default_rng(1).standard_normal((tau, inputs, batch))
    return lambda: pp.forward(gru, xs, method="cyclic-reduction", linearization="newton")


# (the target it misses, the job): docs/measurements.md, against the tight loop
CASES: dict[str, tuple[str, Callable[[], Callable[[], Any]]]] = {
    "MLP l=1024 n=8 r=1, cyclic-reduction": (
        "cyclic reduction <= 0.6x the tight loop", lambda: _mlp(1024, 8, 1, "cyclic-reduction")),
    "MLP l=256 n=32 r=32, cyclic-reduction": (
        "per-sample CR <= 4x the loop", lambda: _mlp(256, 32, 32, "cyclic-reduction")),
    "MLP l=16 n=128 r=32, substitution": (
        "substitution <= 1.0x the tight loop", lambda: _mlp(16, 128, 32, "substitution")),
    "MLP l=1024 n=8 r=1, substitution": (
        "substitution <= 1.0x the tight loop", lambda: _mlp(1024, 8, 1, "substitution")),
    "RNN H=20 r=16 tau=10000, substitution": (
        "substitution <= 1.0x the tight loop", lambda: _rnn(20, 16, 10000, "substitution")),
    "RNN H=8 r=1 tau=65536, cyclic-reduction": (
        "cyclic reduction <= 0.6x the tight loop", lambda: _rnn(8, 1, 65536,
                                                                "cyclic-reduction")),
    "RNN Newton forward H=8 tau=10000, cyclic-reduction": (
        "at DEER's speed", lambda: _newton(8, 10000, "cyclic-reduction")),
    "GRU Newton forward in=2 H=2 batch=16 tau=10000, cyclic-reduction": (
        "at DEER's speed", lambda: _gru(2, 2, 16, 10000)),
}


def profile(job: Callable[[], Any], repeats: int, top: int) -> dict:
    """The ``top`` functions by own time over ``repeats`` calls, with their shares."""
    job()
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(repeats):
        job()
    profiler.disable()
    stats = pstats.Stats(profiler).stats  # (file, line, name) -> (cc, nc, tt, ct, callers)
    total = sum(entry[2] for entry in stats.values())
    ranked = sorted(stats.items(), key=lambda item: -item[1][2])[:top]
    return {"total_s": total / repeats,
            "functions": [{"function": _name(key), "calls": entry[1] // repeats,
                           "share": entry[2] / total} for key, entry in ranked]}


def _name(key: tuple) -> str:
    path, line, name = key
    if path == "~":
        return name  # a built-in: "<method 'matmul' ...>"
    parts = path.replace("\\", "/").split("/")
    short = "/".join(parts[parts.index("propop"):] if "propop" in parts else parts[-2:])
    return f"{name} ({short}:{line})"


def table(rows: list[dict]) -> str:
    """One Markdown table per case."""
    out = []
    for row in rows:
        out += [f"**{row['case']}** (misses: {row['target']}; {row['total_s'] * 1e3:.1f} ms "
                "per call under the profiler)", "",
                "| function | calls per job | share of own time |", "|---|---:|---:|"]
        out += [f"| `{f['function']}` | {f['calls']} | {f['share']:.0%} |"
                for f in row["functions"]]
        out.append("")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    """Profile every case of :data:`CASES`, print and save the tables."""
    parser = arguments("profiles")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--top", type=int, default=8)
    args = parser.parse_args(argv)
    rows = []
    for case in each(list(CASES), "profiles"):
        target, make = CASES[case]
        rows.append({"case": case, "target": target,
                     **profile(make(), args.repeats, args.top)})
    publish("profiles", rows, table(rows))


if __name__ == "__main__":
    main()
