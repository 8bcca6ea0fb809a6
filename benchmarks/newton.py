"""The Newton forward against DEER's own code, PyTorch and the sequential loops, in one run.

Two of DEER's settings on this machine's CPU, one thread per library:

- an **Elman RNN**, hidden 8, one sequence of 10000 steps, float64: the tight NumPy
  loop (:class:`benchmarks.baselines.TightRNNForward`) is the baseline;
- DEER's **GRU demo** setting, input 2, hidden 2, batch 16, 10000 steps, in float64
  and in float32 (DEER's own: its paper's deviation, 2.4e-7, is of float32):
  ``torch.nn.GRU`` (PyTorch's C++ loop) of that dtype is the baseline.

Contenders: DEER's own ``seq1d`` (machine-discovery/deer; its DEER method and its
``Sequential`` ``lax.scan``), imported from the folder ``--deer PATH`` or
``$PROPOP_DEER`` names, never from this tree (its code is not committed), and
skipped with a note where it is absent or does not import; ``pararnn-torch``'s
``ParaGRU`` with its Newton solver where it is installed (GRU case; a diagonal
cell, so its row is for scale only); propop's ``pp.forward`` with Newton's
linearisation solved by cyclic reduction and by substitution, and quasi-Newton.
Every contender's states are compared with the float64 sequential pass's
(largest absolute difference; in float32 the baseline's own deviation too, against
which issue 28 judges the others: at most twice it); times are medians over
interleaved rounds after a warm-up (:func:`benchmarks.common.timings`), as multiples
of the baseline's.

Run: ``python -m benchmarks.newton [--deer PATH] [--save]`` (about two minutes);
``--quick`` at tiny sizes.
"""

from __future__ import annotations

import copy
import functools
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

import propop as pp

from .baselines import TightRNNForward, jax_modules
from .common import arguments, by_kind, publish, timings

ELMAN = [(8, 10000)]  # (hidden, tau)
GRU = [(2, 2, 16, 10000, "float64"), (2, 2, 16, 10000, "float32")]  # (input, hidden,
# batch, tau, dtype)
QUICK = {"elman": [(3, 20)], "gru": [(2, 2, 3, 20, "float64"), (2, 2, 3, 20, "float32")]}
REPEATS = 5


def deer_seq1d(folder: str | None) -> tuple[Any, str]:
    """DEER's ``seq1d`` from ``folder`` (``None``: ``$PROPOP_DEER``), or ``None`` and why."""
    folder = folder or os.environ.get("PROPOP_DEER")
    if not folder:
        return None, "DEER's code not given (--deer PATH or $PROPOP_DEER)"
    sys.path.insert(0, folder)
    try:
        jax_modules()  # float64 before DEER's module makes its arrays
        return importlib.import_module("deer.fseq1d").seq1d, f"DEER from {folder}"
    except ImportError as error:
        return None, f"DEER did not import from {folder}: {error}"
    finally:
        sys.path.remove(folder)


def deer_jobs(seq1d: Any, step: Callable, y0: Any, xs: Any, params: Any,
              batched: bool) -> dict[str, Callable]:
    """DEER's method and its sequential scan, jitted (vmapped over a batch).

    On JAX's default device; ``y0``, ``xs`` and ``params`` of one dtype (float32 stays
    float32: the float64 mode :func:`~benchmarks.baselines.jax_modules` sets only
    changes JAX's defaults).
    """
    jax, _ = jax_modules()

    def solver(method: Any) -> Callable:
        def one(x: Any) -> Any:
            return seq1d(step, y0, x, params, method=method).value

        return jax.jit(jax.vmap(one) if batched else one)

    deer, scan = solver(seq1d.DEER()), solver(seq1d.Sequential())
    return {"DEER seq1d": lambda: deer(xs).block_until_ready(),
            "DEER Sequential (lax.scan)": lambda: scan(xs).block_until_ready()}


def elman_row(seq1d: Any, hidden: int, tau: int) -> dict:
    """An Elman RNN of one sequence: the tight loop, DEER, propop's Newton family."""
    rnn = pp.RNN.random([hidden, hidden], activation="tanh", seed=0)
    xs = np.random.default_rng(1).standard_normal((tau, hidden))
    W, U, b = rnn.W[0], rnn.U[0], rnn.b[0]
    loop = TightRNNForward(W, U, b, tau)
    states = loop(xs).copy()
    jobs: dict[str, Callable] = {"tight NumPy loop": lambda: loop(xs)}
    outputs: dict[str, Callable] = {}
    if seq1d is not None:
        _, jnp = jax_modules()
        params = tuple(jnp.asarray(a) for a in (W, U, b))
        deer = deer_jobs(seq1d, lambda h, x, p: jnp.tanh(p[0] @ x + p[1] @ h + p[2]),
                          jnp.zeros(hidden), jnp.asarray(xs), params, batched=False)
        jobs |= deer
        outputs |= {name: (lambda job=job: np.asarray(job())) for name, job in deer.items()}
    for name, (method, linearization) in PROPOP.items():
        if linearization == "newton":  # quasi-Newton is a recurrence's (pp.RNN's is exact)
            job = functools.partial(pp.forward, rnn, xs, method=method)
            jobs[name] = job
            outputs[name] = lambda job=job: job().output
    return _row("elman", f"H={hidden} tau={tau}", jobs, outputs, states, "tight NumPy loop")


def gru_row(seq1d: Any, inputs: int, hidden: int, batch: int, tau: int,
            dtype: str = "float64") -> dict:
    """DEER's GRU demo setting: torch.nn.GRU, DEER, pararnn's ParaGRU, propop, in ``dtype``.

    One float64 module's weights; in float32 every contender's rounded from them, and
    the states compared with the float64 module's (the sequential pass, exact).
    """
    import torch

    torch.manual_seed(0)
    exact = torch.nn.GRU(inputs, hidden).double()
    module = copy.deepcopy(exact).to(getattr(torch, dtype))  # .to() changes it in place
    gru = pp.GRU.from_torch(exact, dtype=dtype)
    xs = np.random.default_rng(1).standard_normal((tau, inputs, batch)).astype(dtype)
    X = torch.tensor(xs.transpose(0, 2, 1).copy())
    with torch.no_grad():
        states = exact(X.double())[0].numpy()  # (tau, batch, hidden)
    jobs: dict[str, Callable] = {"torch.nn.GRU": lambda: _no_grad(module, X)}
    outputs: dict[str, Callable] = {} if dtype == "float64" else {  # its own rounding
        "torch.nn.GRU": lambda: _no_grad(module, X)[0].numpy()}
    if seq1d is not None:
        _, jnp = jax_modules()
        params = {k: jnp.asarray(v.detach().numpy()) for k, v in module.named_parameters()}
        deer = deer_jobs(seq1d, jax_gru_step, jnp.zeros(hidden, dtype=dtype),
                          jnp.asarray(xs.transpose(2, 0, 1)), params, batched=True)
        jobs |= deer
        outputs |= {name: (lambda job=job: np.asarray(job()).transpose(1, 0, 2))
                    for name, job in deer.items()}
    if importlib.util.find_spec("pararnn") is not None:  # a diagonal cell: scale only
        jobs["pararnn ParaGRU (Newton)"] = pararnn_gru(inputs, hidden, X)
    for name, (method, linearization) in PROPOP.items():
        job = functools.partial(pp.forward, gru, xs, method=method, linearization=linearization)
        jobs[name] = job
        outputs[name] = lambda job=job: np.asarray(job().z[1]).transpose(0, 2, 1)
    return _row("gru", f"in={inputs} H={hidden} batch={batch} tau={tau} {dtype}", jobs,
                outputs, states, "torch.nn.GRU")


PROPOP = {"propop newton + CR": ("cyclic-reduction", "newton"),
          "propop newton + substitution": ("substitution", "newton"),
          "propop quasi + CR": ("cyclic-reduction", "quasi")}


def _no_grad(module: Any, X: Any) -> Any:
    import torch

    with torch.no_grad():
        return module(X)


def jax_gru_step(h: Any, x: Any, p: dict) -> Any:
    """``torch.nn.GRU``'s cell (one layer, PyTorch's parameter names) in JAX."""
    _, jnp = jax_modules()
    gi = p["weight_ih_l0"] @ x + p["bias_ih_l0"]
    gh = p["weight_hh_l0"] @ h + p["bias_hh_l0"]
    (i_r, i_z, i_n), (h_r, h_z, h_n) = jnp.split(gi, 3), jnp.split(gh, 3)
    r = 1 / (1 + jnp.exp(-(i_r + h_r)))
    z = 1 / (1 + jnp.exp(-(i_z + h_z)))
    n = jnp.tanh(i_n + r * h_n)
    return (1 - z) * n + z * h


def pararnn_gru(inputs: int, hidden: int, X: Any, scan: str = "eager") -> Callable:
    """pararnn-torch's ParaGRU forward by its Newton solver (no gradients), like ``X``.

    ``scan`` is its ``scan_backend``: ``"eager"`` (PyTorch operations, the CPU's) or
    ``"auto"`` (its fused kernels where it has them, on CUDA).
    """
    import pararnn

    model = pararnn.ParaRNN(pararnn.ParaGRU(inputs, hidden, dtype=X.dtype, device=X.device),
                            solver="newton", batch_first=False,
                            config=pararnn.NewtonConfig(scan_backend=scan),
                            dtype=X.dtype, device=X.device)
    return lambda: _no_grad(model, X)


def _row(kind: str, case: str, jobs: dict, outputs: dict, states: np.ndarray,
         base: str) -> dict:
    times = timings(jobs, repeats=REPEATS)
    reference = times[base]["median"]
    deviation = {name: float(np.abs(np.asarray(output()).reshape(states.shape)
                                    - states).max()) for name, output in outputs.items()}
    return {"kind": kind, "case": case, "base": base, "seconds": dict(times),
            "vs_base": {k: v["median"] / reference for k, v in times.items()},
            "deviation": deviation}


def table(rows: list[dict], note: str) -> str:
    """Markdown: per case, each contender's time / the baseline's and its deviation."""
    out = []
    for title, chosen, names in by_kind(rows, (("elman", "Elman RNN forward"),
                                               ("gru", "GRU forward"))):
        out += [f"**{title}** (CPU): median time / {chosen[0]['base']}'s of the row's dtype "
                "(lower is better); largest deviation of the states from the float64 "
                "sequential pass's in brackets", "",
                "| case | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
        for row in chosen:
            cells = [f"{row['vs_base'][n]:.2f}x" + (f" ({row['deviation'][n]:.0e})"
                                                    if n in row["deviation"] else "")
                     for n in names]
            reference = 1e3 * row["seconds"][row["base"]]["median"]
            out.append(f"| {row['case']} ({row['base']} {reference:.1f} ms) | "
                       + " | ".join(cells) + " |")
        out.append("")
    out.append(note + ("" if importlib.util.find_spec("pararnn") else
                       "; pararnn-torch is not installed (pip install pararnn-torch)") + ".")
    return "\n".join(out)


def main() -> None:
    """Measure, print and save the tables."""
    parser = arguments("newton")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a check that it runs")
    parser.add_argument("--deer", default=None,
                        help="a folder holding DEER's package (machine-discovery/deer)")
    args = parser.parse_args()
    seq1d, note = deer_seq1d(args.deer)
    grids = QUICK if args.quick else {"elman": ELMAN, "gru": GRU}
    rows = ([elman_row(seq1d, *case) for case in grids["elman"]]
            + [gru_row(seq1d, *case) for case in grids["gru"]])
    publish("newton" + ("_quick" if args.quick else ""), rows, table(rows, note))


if __name__ == "__main__":
    main()
