"""Where the time goes at the grid points of ``benchmarks.peers`` that miss their targets.

``python -m benchmarks.profiles`` (needs ``pyinstrument``, the ``bench`` extra): each
case runs once to warm up, then again and again for ``--seconds`` under
pyinstrument's sampling profiler (a sample a millisecond); the table lists the
functions with the most time of their own, as time per call and as shares of the
sampled total. A sampler slows the Python code it watches less than cProfile's
hooks on every call, and it charges a NumPy or PyTorch kernel to the Python
function that called it: the rows say which line of propop the time is spent
under. The profile says where the time goes,
``benchmarks.peers`` how long it takes.
"""

from __future__ import annotations

import time
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


def profile(job: Callable[[], Any], seconds: float, top: int,
            interval: float = 1e-3) -> dict:
    """The ``top`` functions by own time over calls for at least ``seconds``, with shares.

    Own time: the samples whose innermost Python frame is the function (a kernel it
    calls counts as its own), summed over every place it was called from.
    """
    from pyinstrument import Profiler

    job()
    profiler, calls = Profiler(interval=interval), 0
    profiler.start()
    start = time.perf_counter()
    while calls < 3 or time.perf_counter() - start < seconds:
        job()
        calls += 1
    profiler.stop()
    own: dict[tuple, float] = {}
    _own_times(profiler.last_session.root_frame(), own)
    total = sum(own.values())
    ranked = sorted(own.items(), key=lambda item: -item[1])[:top]
    return {"calls": calls, "total_s": total / calls,
            "functions": [{"function": _name(key), "ms_per_call": seconds / calls * 1e3,
                           "share": seconds / total} for key, seconds in ranked]}


def _own_times(frame: Any, own: dict) -> None:
    """Add each frame's own time (its ``[self]`` samples) to ``own[(file, line, name)]``."""
    if frame.is_synthetic_leaf:  # "[self]": the parent's own samples
        parent = frame.parent
        key = (parent.file_path or "~", parent.line_no or 0, parent.function)
        own[key] = own.get(key, 0.0) + frame.time
    for child in frame.children:
        _own_times(child, own)


def _name(key: tuple) -> str:
    path, line, name = key
    if path in ("~", "<built-in>"):
        return name  # a built-in, as the profiler names it
    parts = path.replace("\\", "/").split("/")
    short = "/".join(parts[parts.index("propop"):] if "propop" in parts else parts[-2:])
    return f"{name} ({short}:{line})"


def odd_even(A: np.ndarray, g: np.ndarray) -> np.ndarray:
    """``x_0 = g_0``, ``x_s = A_s x_{s-1} + g_s`` by odd-even reduction in plain NumPy.

    The arithmetic cyclic reduction must do over time, as a NumPy user would write it
    with no checks, no system and no plan: each level multiplies its pairs' blocks
    (``matmul``) and carries the right-hand sides (``einsum``), and the way back fills
    the odd positions. ``A`` ``(tau, n, n)`` (``A_0`` unread), ``g`` ``(tau, n)``.
    """
    m = g.shape[0]
    if m == 1:
        return g
    q = (m - 1) // 2  # the even positions 2, 4, .., 2q read their odd neighbours
    inner = np.concatenate([A[:1], A[2:2 * q + 1:2] @ A[1:2 * q:2]])
    rhs = np.concatenate([g[:1], np.einsum("pij,pj->pi", A[2:2 * q + 1:2], g[1:2 * q:2])
                          + g[2:2 * q + 1:2]])
    x = np.empty_like(g)
    x[0::2] = odd_even(inner, rhs)
    x[1::2] = np.einsum("pij,pj->pi", A[1::2], x[0:2 * (m // 2):2]) + g[1::2]
    return x


def reduction_floor(width: int, tau: int, iterations: int, repeats: int = 7) -> dict:
    """The Newton forward's reduction arithmetic alone: :func:`odd_even` ``iterations`` times.

    Random contractive ``width x width`` blocks over ``tau`` steps; the median of
    ``repeats``. What no NumPy code can undercut on this machine with this
    algorithm, against which the engine's per-iteration work (the system, its
    checks, the trace) is measured.
    """
    rng = np.random.default_rng(0)
    A = rng.uniform(-1, 1, (tau, width, width)) / width
    g = rng.standard_normal((tau, width))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(iterations):
            odd_even(A, g)
        times.append(time.perf_counter() - start)
    return {"width": width, "tau": tau, "iterations": iterations,
            "seconds": float(np.median(times))}


def table(rows: list[dict], floor: dict | None = None) -> str:
    """One Markdown table per case, then the Newton reduction's arithmetic floor."""
    out = []
    for row in rows:
        out += [f"**{row['case']}** (misses: {row['target']}; {row['total_s'] * 1e3:.1f} ms "
                f"per call sampled over {row['calls']} calls)", "",
                "| function | own time per call [ms] | share |", "|---|---:|---:|"]
        out += [f"| `{f['function']}` | {f['ms_per_call']:.2f} | {f['share']:.0%} |"
                for f in row["functions"]]
        out.append("")
    if floor is not None:
        out += [f"**The arithmetic floor of the Newton forward's reduction** (width "
                f"{floor['width']}, tau {floor['tau']}): odd-even reduction in plain NumPy, "
                f"{floor['iterations']} times as the Newton forward solves it, "
                f"{floor['seconds'] * 1e3:.1f} ms (`benchmarks.profiles.odd_even`: the "
                "block products and right-hand sides alone, no checks, no system)", ""]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    """Profile every case of :data:`CASES`, print and save the tables."""
    parser = arguments("profiles")
    parser.add_argument("--seconds", type=float, default=5.0,
                        help="profile each case for at least this long")
    parser.add_argument("--top", type=int, default=8)
    args = parser.parse_args(argv)
    rows = []
    for case in each(list(CASES), "profiles"):
        target, make = CASES[case]
        rows.append({"case": case, "target": target,
                     **profile(make(), args.seconds, args.top)})
    floor = reduction_floor(8, 10000, 5)  # the Elman case's five Newton iterations
    publish("profiles", rows + [dict(floor, case="floor")], table(rows, floor))


if __name__ == "__main__":
    main()
