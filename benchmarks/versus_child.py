"""One process of :mod:`benchmarks.versus`: a case's propop jobs, timed, as one JSON line.

Run as a script by :mod:`benchmarks.versus` with ``PYTHONPATH`` naming the propop
tree to measure (this one or an earlier checkout), so it imports nothing of the
benchmarks package and only what every propop since the issue's main has:
``FNN.random``, ``RNN.random``, ``from_torch``, ``backprop`` and ``forward``. Each
process also times a tight NumPy loop of the case's size, the same code in both
trees' processes, so that the parent can take out the machine's drift between
processes; and it prints a fingerprint of each job's answer, which both trees must
agree on (the same job, not a cheaper one).

``python benchmarks/versus_child.py CASE SECONDS`` (``CASE`` one of :data:`CASES`).
"""

from __future__ import annotations

import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import propop as pp

METHODS = ("substitution", "cyclic-reduction", "auto")


def tight_mlp(W: list, b: list, x: np.ndarray, t: np.ndarray) -> Callable[[], Any]:
    """The tanh MLP's whole job in arrays made once (``benchmarks.baselines.TightMLP``'s)."""
    WT = [np.ascontiguousarray(w.T) for w in W]
    W, b = [np.ascontiguousarray(w) for w in W], [bk[:, None].copy() for bk in b]
    depth, (n, r) = len(W), x.shape
    Z, V = np.empty((depth + 1, n, r)), np.empty((depth + 1, n, r))
    S, dW, db = np.empty((depth, n, r)), np.empty((depth, n, n)), np.empty((depth, n))

    def run() -> np.ndarray:
        Z[0] = x
        for k in range(depth):
            np.dot(W[k], Z[k], out=Z[k + 1])
            Z[k + 1] += b[k]
            np.tanh(Z[k + 1], out=Z[k + 1])
        np.multiply(Z[1:], Z[1:], out=S)
        np.subtract(1.0, S, out=S)
        np.subtract(Z[depth], t, out=V[depth])
        V[depth] *= S[depth - 1]
        for k in range(depth - 1, -1, -1):
            np.dot(WT[k], V[k + 1], out=V[k])
            if k > 0:
                V[k] *= S[k - 1]
        np.matmul(V[1:], Z[:-1].transpose(0, 2, 1), out=dW)
        np.sum(V[1:], axis=2, out=db)
        return dW

    return run


def tight_elman(hidden: int, tau: int, r: int) -> Callable[[], Any]:
    """``h_s = tanh(W x_s + U h_(s-1) + b)`` in arrays made once: a recurrence's drift meter."""
    rng = np.random.default_rng(2)
    W, U = rng.standard_normal((2, hidden, hidden)) / np.sqrt(hidden)
    b, xs = rng.standard_normal((hidden, 1)), rng.standard_normal((tau, hidden, r))
    P, states = np.empty((tau, hidden, r)), np.empty((tau + 1, hidden, r))

    def run() -> np.ndarray:
        np.matmul(W, xs, out=P)
        np.add(P, b, out=P)
        states[0] = 0.0
        for s in range(tau):
            np.dot(U, states[s], out=states[s + 1])
            states[s + 1] += P[s]
            np.tanh(states[s + 1], out=states[s + 1])
        return states

    return run


def mlp(layers: int, width: int, r: int) -> tuple[dict, Callable, Callable]:
    """``(jobs, drift meter, answer)``: the MLP's backpropagation by each method."""
    net = pp.FNN.random([width] * (layers + 1), activation="tanh", seed=0, bias=0.1)
    x, t = np.random.default_rng(1).standard_normal((2, width, r))
    jobs = {m: (lambda m=m: pp.backprop(net, x, t, method=m)) for m in METHODS}
    return jobs, tight_mlp(list(net.W), list(net.b), x, t), lambda g: g.W[0]


def rnn(hidden: int, r: int, tau: int) -> tuple[dict, Callable, Callable]:
    """``(jobs, drift meter, answer)``: the RNN's backpropagation through time by each method."""
    net = pp.RNN.random([hidden, hidden], activation="tanh", seed=0)
    xs, t = np.random.default_rng(1).standard_normal((2, tau, hidden, r))
    jobs = {m: (lambda m=m: pp.backprop(net, xs, t, method=m)) for m in METHODS}
    return jobs, tight_elman(hidden, tau, r), lambda g: g.W[0]


def newton_elman(hidden: int, tau: int) -> tuple[dict, Callable, Callable]:
    """``(jobs, drift meter, answer)``: the Elman RNN's Newton forward (``benchmarks.newton``)."""
    net = pp.RNN.random([hidden, hidden], activation="tanh", seed=0)
    xs = np.random.default_rng(1).standard_normal((tau, hidden))
    jobs = {"newton + cyclic-reduction": lambda: pp.forward(net, xs, method="cyclic-reduction")}
    return jobs, tight_elman(hidden, tau, 1), lambda trace: trace.z[-1]


def newton_gru(inputs: int, hidden: int, batch: int,
               tau: int) -> tuple[dict, Callable, Callable]:
    """``(jobs, drift meter, answer)``: DEER's GRU setting, Newton and quasi-Newton forward."""
    import os

    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))  # as every contender
    torch.manual_seed(0)
    gru = pp.from_torch(torch.nn.GRU(inputs, hidden).double())
    xs = np.random.default_rng(1).standard_normal((tau, inputs, batch))
    jobs = {f"{how} + cyclic-reduction": (lambda how=how: pp.forward(
        gru, xs, method="cyclic-reduction", linearization=how)) for how in ("newton", "quasi")}
    return jobs, tight_elman(hidden, tau, batch), lambda trace: trace.z[-1]


# the grid of issue 28's table, and DEER's two settings (benchmarks.newton)
CASES: dict[str, Callable[[], tuple[dict, Callable, Callable]]] = {
    "MLP l=1024 n=8 r=1": lambda: mlp(1024, 8, 1),
    "MLP l=256 n=32 r=32": lambda: mlp(256, 32, 32),
    "MLP l=64 n=128 r=32": lambda: mlp(64, 128, 32),
    "RNN H=20 r=16 tau=10000": lambda: rnn(20, 16, 10000),
    "RNN H=8 r=1 tau=65536": lambda: rnn(8, 1, 65536),
    "Elman Newton forward H=8 tau=10000": lambda: newton_elman(8, 10000),
    "GRU Newton forward in=2 H=2 batch=16 tau=10000": lambda: newton_gru(2, 2, 16, 10000),
    "quick MLP l=3 n=4 r=2": lambda: mlp(3, 4, 2),
    "quick Elman Newton forward H=3 tau=9": lambda: newton_elman(3, 9),
}


def measure(case: str, seconds: float, repeats: int = 5) -> dict[str, Any]:
    """Each job's and the loop's median seconds over interleaved, shuffled rounds.

    At least ``repeats`` rounds, more while ``seconds`` last; ``fingerprint`` is each
    job's answer's sum of squares and first entry (``answer`` of the job's result).
    """
    jobs, loop, answer = CASES[case]()
    jobs = {**jobs, "loop": loop}
    prints = {}
    for name, job in jobs.items():  # the warm-up, and what each job answers
        if name != "loop":
            a = np.asarray(answer(job()), dtype=float)
            prints[name] = [float(np.sum(a * a)), float(a.reshape(-1)[0])]
    times: dict[str, list[float]] = {name: [] for name in jobs}
    order, shuffle, start = list(jobs.items()), random.Random(0).shuffle, time.perf_counter()
    while len(times["loop"]) < repeats or time.perf_counter() - start < seconds:
        shuffle(order)
        for name, job in order:
            begin = time.perf_counter()
            job()
            times[name].append(time.perf_counter() - begin)
    return {"propop": pp.__file__, "medians": {k: statistics.median(v) for k, v in times.items()},
            "rounds": len(times["loop"]), "fingerprints": prints}


if __name__ == "__main__":
    print(json.dumps(measure(sys.argv[1], float(sys.argv[2]))))
