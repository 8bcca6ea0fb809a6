"""Strong scaling of the mpi.* methods on P = 1, 2, 4 ranks, and a model up to P = 1024.

Two systems: the backward pass of an FNN with l = 4096 layers of width 32 (one
sample), and of a 1-layer tanh RNN with hidden width 8 over tau = 65536 steps.
Methods: ``mpi.substitution`` (the pipelined baseline), ``mpi.cyclic-reduction``
and ``mpi.gmres`` for a fixed 10 iterations (``rtol=0``, ``restart=10``: it
needs ``nblocks`` iterations to be exact, far too many here, so its time per
iteration is what scales). Median of 5 after a warm-up; the slowest rank counts.

The machine has 2 cores: P = 4 is oversubscribed, two ranks share a core, and
its times show the cost of that, not of the method.

The model (``model`` rows) extrapolates from the P = 1 and P = 2 runs:
``mpi.cyclic-reduction`` does ``(1 + imports)`` local solves of ``N / P`` blocks
plus ``log2 P`` exchange-and-compose steps; ``mpi.gmres`` does ``N / P`` blocks
of products plus ``2 log2 P`` latency-bound ``Allreduce`` per iteration.

Run: ``python -m benchmarks.mpi`` (it calls ``mpiexec`` itself; several minutes).
"""

from __future__ import annotations

import json
import math
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

import propop as pp

from .common import publish

RANKS = (1, 2, 4)
METHODS = ("mpi.substitution", "mpi.cyclic-reduction", "mpi.gmres")
MODEL_RANKS = (1, 2, 4, 16, 64, 256, 1024)


def systems() -> dict:
    """The two benchmark systems, built identically on every rank."""
    rng = np.random.default_rng(0)
    fnn = pp.FNN.random([32] * 4097, activation="tanh", seed=0)
    trace = fnn.forward(rng.standard_normal(32))
    rnn = pp.RNN.random([8, 8], activation="tanh", seed=0)
    rtrace = rnn.forward(rng.standard_normal((65536, 8)))
    return {"FNN l=4096 n=32": pp.backward_system(fnn, trace, rng.standard_normal(32)),
            "RNN tau=65536 h=8": pp.backward_system(rnn, rtrace, rng.standard_normal(
                (65536, 8)))}


def worker(path: str) -> None:
    """Under mpiexec: time every method on every system; rank 0 writes the JSON."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    options = {"mpi.gmres": {"rtol": 0.0, "maxiter": 10, "restart": 10}}
    rows = []
    for label, system in systems().items():
        for method in METHODS:
            times = []
            for _ in range(6):  # a warm-up, then 5
                comm.Barrier()
                start = time.perf_counter()
                sol = pp.solve(system, method, **options.get(method, {}))
                times.append(comm.allreduce(time.perf_counter() - start, op=MPI.MAX))
            rows.append({"system": label, "method": method, "ranks": comm.Get_size(),
                         "seconds": float(np.median(times[1:])), "levels": sol.levels,
                         "status": sol.status.name, "nblocks": system.nblocks})
    if comm.Get_rank() == 0:
        pathlib.Path(path).write_text(json.dumps(rows))


def model(rows: list) -> list:
    """Predicted times for P up to 1024 from the P = 1 and P = 2 measurements."""
    out = []
    for label in sorted({r["system"] for r in rows}):
        t = {(r["method"], r["ranks"]): r["seconds"] for r in rows if r["system"] == label}
        sub1, cr1, cr2 = t["mpi.substitution", 1], t["mpi.cyclic-reduction", 1], \
            t["mpi.cyclic-reduction", 2]
        imports = max(1.0, 2 * cr2 / cr1 - 1)  # local solves per rank beyond the first
        g1, g2 = t["mpi.gmres", 1], t["mpi.gmres", 2]
        latency = max(0.0, g2 - g1 / 2) / 2  # per-iteration exchange cost at P = 2
        for p in MODEL_RANKS:
            steps = math.ceil(math.log2(p)) if p > 1 else 0
            cr = (cr1 if p == 1 else (1 + imports) * cr1 / p) + steps * 1e-4
            gm = g1 / p + steps * latency
            out.append({"system": label, "ranks": p, "substitution": sub1, "cr": cr,
                        "gmres": gm})
    return out


def main() -> None:
    """Run the workers under mpiexec, print and save the tables."""
    mpiexec = shutil.which("mpiexec", path=str(pathlib.Path(sys.executable).parent)) or \
        shutil.which("mpiexec")
    if mpiexec is None:
        raise SystemExit('mpiexec not found: pip install "propop[mpi]"')
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for p in RANKS:
            path = f"{tmp}/ranks{p}.json"
            subprocess.run([mpiexec, "-n", str(p), sys.executable, "-m", "mpi4py", "-m",
                            "benchmarks.mpi", "--worker", path], check=True, timeout=3600)
            rows += json.loads(pathlib.Path(path).read_text())
            print(rows[-len(METHODS) * 2:], flush=True)
    base = {(r["system"], r["method"]): r["seconds"] for r in rows if r["ranks"] == 1}
    lines = ["| system | method | P | time [s] | speed-up over P = 1 | levels | status |",
             "|---|---|---:|---:|---:|---:|---|"]
    for r in rows:
        speedup = base[r["system"], r["method"]] / r["seconds"]
        lines.append(f"| {r['system']} | {r['method']} | {r['ranks']} | {r['seconds']:.3f} | "
                     f"{speedup:.2f}x | {r['levels']} | {r['status']} |")
    lines += ["", "Model (from the P = 1 and 2 runs), speed-up over P = 1 "
              "(mpi.substitution does not speed up: the ranks take turns):", "",
              "| system | P | mpi.cyclic-reduction | mpi.gmres (per iteration) |",
              "|---|---:|---:|---:|"]
    predicted = model(rows)
    first = {(m["system"]): m for m in predicted if m["ranks"] == 1}
    for m in predicted:
        f = first[m["system"]]
        lines.append(f"| {m['system']} | {m['ranks']} | {f['cr'] / m['cr']:.2f}x | "
                     f"{f['gmres'] / m['gmres']:.2f}x |")
    table = "\n".join(lines) + ("\n\n2 cores: P = 4 is oversubscribed (two ranks a core). "
                                "mpi.gmres runs a fixed 10 iterations.")
    publish("mpi", rows + [{"model": predicted}], table)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        worker(sys.argv[2])
    else:
        main()
