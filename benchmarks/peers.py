"""propop against its peers on one machine: the whole job, ratios to the tight NumPy loop.

Every contender does the whole job from the inputs: the forward pass, the backward
pass and every gradient of the summed squared error (the loss at every step of an
RNN), in float64, checked against the tight NumPy loop (1.0 in the tables). The
contenders (:mod:`benchmarks.baselines`), all on the same number of threads (one,
unless ``OMP_NUM_THREADS`` says otherwise):

- **the tight NumPy loop**: preallocated arrays, transposes made once, ``np.dot(...,
  out=)``, slopes computed once; the floor of sequential NumPy code. Like propop (whose
  solution holds it) it also returns the input gradient ``dx``; PyTorch and JAX, as
  their users write them, the weights' gradients only; ``loop.blas`` is the same
  loop with every product a call of SciPy's BLAS that adds into its output where
  the loop adds, as propop's own sequential loops call it; ``loop.forward`` is its
  forward pass alone (no gradient, no error given): the sequential part that every
  method solving only the backward system runs too (propop's calls BLAS as
  ``loop.blas`` does: as fast on MLPs, faster on RNNs), which bounds such a
  method's ratio from below;
- **PyTorch** written idiomatically: ``nn.Sequential`` of ``nn.Linear`` and ``nn.Tanh``,
  ``nn.RNN``, ``loss.backward()``;
- **JAX** under ``jit``: ``jax.grad`` of a ``lax.scan`` forward, and the BPPSA backward
  (an associative scan over the transposed Jacobians);
- the **Newton forward** of an RNN: propop's ``pp.forward`` against the tight
  sequential loop and a JAX DEER with as many iterations as propop takes.

propop: ``pp.backprop(net, x, t, method=...)`` with substitution, cyclic
reduction, PCR (MLPs) and ``"auto"``. One run: a warm-up (JAX compiles there),
then interleaved rounds (``benchmarks.common.timings``); each cell is the median
time over the loop's median, with the contender's fastest and slowest round.

Run: ``python -m benchmarks.peers [--save]`` (about ten minutes on 2 cores; JAX from
the ``bench`` extra, PyTorch from ``torch``). ``--quick`` runs the smallest point of
each kind.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import propop as pp

from .baselines import (TightMLP, TightRNN, TightRNNForward, jax_deer, jax_mlp_bppsa,
                        jax_mlp_grad, jax_modules, jax_rnn_bppsa, jax_rnn_grad, torch_mlp,
                        torch_rnn)
from .common import arguments, each, publish, threads, timings

MLP = [(16, 128, 32), (64, 128, 32), (256, 32, 32), (256, 32, 1), (1024, 32, 1),
       (1024, 8, 1)]  # (layers, width, samples)
RNN = [(20, 16, 10000), (8, 1, 65536)]  # (hidden, samples, steps)
NEWTON = [(8, 10000)]  # (hidden, steps), one sample
PROPOP_MLP = ("substitution", "cyclic-reduction", "parallel-cyclic-reduction", "auto")
PROPOP_RNN = ("substitution", "cyclic-reduction", "auto")
REPEATS = 7


# -- the measurements -------------------------------------------------------------------
def _relative(a: Any, b: np.ndarray) -> float:
    return float(np.abs(np.asarray(a) - b).max() / max(np.abs(b).max(), 1e-300))


def mlp_row(layers: int, width: int, r: int) -> dict:
    """Every contender on one MLP, times relative to the loop and errors of ``dW``."""
    import torch

    jax, jnp = jax_modules()
    net = pp.FNN.random([width] * (layers + 1), activation="tanh", seed=0, bias=0.1)
    rng = np.random.default_rng(1)
    x, t = rng.standard_normal((width, r)), rng.standard_normal((width, r))
    loop, loop_blas = TightMLP(net.W, net.b, r), TightMLP(net.W, net.b, r, blas=True)
    dW = np.stack(loop(x, t)[0])
    W, b = np.stack(net.W), np.stack(net.b)
    Wj, bj, xj, tj = (jnp.asarray(a) for a in (W, b, x, t))
    X, T = torch.tensor(x.T.copy()), torch.tensor(t.T.copy())  # PyTorch: samples are rows
    grad, bppsa, autograd = jax_mlp_grad(), jax_mlp_bppsa(), torch_mlp(net.W, net.b)
    jobs = {"loop": lambda: loop(x, t), "loop.forward": lambda: loop.forward(x),
            "loop.blas": lambda: loop_blas(x, t), "torch": lambda: autograd(X, T),
            "jax.grad": lambda: jax.block_until_ready(grad(Wj, bj, xj, tj)),
            "jax.bppsa": lambda: jax.block_until_ready(bppsa(Wj, bj, xj, tj))}
    jobs.update({m: (lambda m=m: pp.backprop(net, x, t, method=m)) for m in PROPOP_MLP})
    errors = {"loop.blas": _relative(np.stack(loop_blas(x, t)[0]), dW),
              "torch": _relative(np.stack([g.numpy() for g in autograd(X, T)]), dW),
              "jax.grad": _relative(grad(Wj, bj, xj, tj)[0], dW),
              "jax.bppsa": _relative(bppsa(Wj, bj, xj, tj)[0], dW)}
    errors.update({m: _relative(np.stack(pp.backprop(net, x, t, method=m).W), dW)
                   for m in PROPOP_MLP})
    times = timings(jobs, repeats=REPEATS)
    chosen = pp.backprop(net, x, t, method="auto").solution.info["auto"]["method"]
    return _row("mlp", f"l={layers} n={width} r={r}", times, errors, auto=chosen)


def rnn_row(hidden: int, r: int, tau: int) -> dict:
    """Every contender on one RNN's backpropagation through time."""
    import torch

    jax, jnp = jax_modules()
    rnn = pp.RNN.random([hidden, hidden], activation="tanh", seed=0)
    rng = np.random.default_rng(1)
    xs, t = rng.standard_normal((tau, hidden, r)), rng.standard_normal((tau, hidden, r))
    W, U, b = rnn.W[0], rnn.U[0], rnn.b[0]
    loop, loop_blas = TightRNN(W, U, b, tau, r), TightRNN(W, U, b, tau, r, blas=True)
    dW = loop(xs, t)[0].copy()
    args = tuple(jnp.asarray(a) for a in (W, U, b, xs, t))
    X = torch.tensor(xs).permute(0, 2, 1).contiguous()
    T = torch.tensor(t).permute(0, 2, 1).contiguous()
    grad, bppsa, autograd = jax_rnn_grad(), jax_rnn_bppsa(), torch_rnn(W, U, b)
    jobs = {"loop": lambda: loop(xs, t), "loop.forward": lambda: loop.forward(xs),
            "loop.blas": lambda: loop_blas(xs, t), "torch": lambda: autograd(X, T),
            "jax.grad": lambda: jax.block_until_ready(grad(*args)),
            "jax.bppsa": lambda: jax.block_until_ready(bppsa(*args))}
    jobs.update({m: (lambda m=m: pp.backprop(rnn, xs, t, method=m)) for m in PROPOP_RNN})
    errors = {"loop.blas": _relative(loop_blas(xs, t)[0], dW),
              "torch": _relative(autograd(X, T).numpy(), dW),
              "jax.grad": _relative(grad(*args)[0], dW),
              "jax.bppsa": _relative(bppsa(*args)[0], dW)}
    errors.update({m: _relative(pp.backprop(rnn, xs, t, method=m).W[0], dW)
                   for m in PROPOP_RNN})
    times = timings(jobs, repeats=REPEATS)
    chosen = pp.backprop(rnn, xs, t, method="auto").solution.info["auto"]["method"]
    return _row("rnn", f"H={hidden} r={r} tau={tau}", times, errors, auto=chosen)


def newton_row(hidden: int, tau: int) -> dict:
    """The Newton forward of an RNN: propop, the tight sequential loop and a JAX DEER."""
    jax, jnp = jax_modules()
    rnn = pp.RNN.random([hidden, hidden], activation="tanh", seed=0)
    xs = np.random.default_rng(1).standard_normal((tau, hidden))
    W, U, b = rnn.W[0], rnn.U[0], rnn.b[0]
    loop = TightRNNForward(W, U, b, tau)
    states = loop(xs).copy()
    iterations = pp.forward(rnn, xs, method="cyclic-reduction").info["iterations"]
    deer, args = jax_deer(iterations), tuple(jnp.asarray(a) for a in (W, U, b, xs))
    jobs = {"loop": lambda: loop(xs),
            "jax.deer": lambda: jax.block_until_ready(deer(*args))}
    methods = ("cyclic-reduction", "substitution", "auto")
    jobs.update({m: (lambda m=m: pp.forward(rnn, xs, method=m)) for m in methods})
    errors = {"jax.deer": _relative(deer(*args), states)}
    errors.update({m: _relative(pp.forward(rnn, xs, method=m).output, states)
                   for m in methods})
    times = timings(jobs, repeats=REPEATS)
    return _row("newton", f"H={hidden} tau={tau} ({iterations} iterations)", times, errors)


def _row(kind: str, case: str, times: dict, errors: dict, **extra: Any) -> dict:
    loop = times["loop"]["median"]
    return {"kind": kind, "case": case, "loop_s": loop, "seconds": dict(times),
            "vs_loop": {k: v["median"] / loop for k, v in times.items()},
            "spread": {k: (v["min"] / loop, v["max"] / loop) for k, v in times.items()},
            "errors": errors, **extra}


def table(rows: list[dict]) -> str:
    """One Markdown table per kind: the loop's time, then every contender's ratio to it."""
    out = []
    titles = {"mlp": "MLP backpropagation (tanh, MSE)", "rnn": "RNN backpropagation through "
              "time (tanh, MSE at every step)", "newton": "RNN Newton forward"}
    for kind, title in titles.items():
        mine = [r for r in rows if r["kind"] == kind]
        if not mine:
            continue
        names = [k for k in mine[0]["vs_loop"] if k != "loop"]
        what = "the states" if kind == "newton" else "dW"
        out += [f"**{title}**: median time / the tight NumPy loop's (lower is better), the "
                f"fastest and slowest round below it; worst relative error of {what} "
                "against the loop in brackets", "",
                "| case | loop [ms] | " + " | ".join(names) + " |",
                "|---|---:|" + "---:|" * len(names)]
        for r in mine:
            cells = [f"{r['vs_loop'][k]:.2f}x<br>{r['spread'][k][0]:.2f}-"
                     f"{r['spread'][k][1]:.2f}" + (f" ({r['errors'][k]:.0e})" if k in
                                                   r["errors"] else "") for k in names]
            label = r["case"] + (f", auto: {r['auto']}" if "auto" in r else "")
            out.append(f"| {label} | {1e3 * r['loop_s']:.1f} | " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    """Measure the grid (``--quick``: one point of each kind), print and save the tables."""
    parser = arguments("peers")
    parser.add_argument("--quick", action="store_true")
    quick = parser.parse_args(argv).quick
    threads()
    cases = ([(mlp_row, c) for c in (MLP[-1:] if quick else MLP)]
             + [(rnn_row, c) for c in ([(8, 1, 4096)] if quick else RNN)]
             + [(newton_row, c) for c in ([(8, 2000)] if quick else NEWTON)])
    rows = []
    for measure, case in each(cases, "peers"):
        rows.append(measure(*case))
        print(rows[-1]["case"], {k: f"{v:.2f}x" for k, v in rows[-1]["vs_loop"].items()},
              flush=True)
    publish("peers_quick" if quick else "peers", rows, table(rows))


if __name__ == "__main__":
    main()
