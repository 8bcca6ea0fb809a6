"""RNN backpropagation with weight gradients: propop against a NumPy BPTT loop and PyTorch.

A 1-layer tanh RNN, hidden 20, batch 16, tau in {1000, 10000, 30000} (BPPSA's
setting) and hidden 8, batch 1, tau = 65536. Each contender does the whole job
from the inputs: forward pass, backward pass, gradients of W, U, b and x, with
the summed squared-error loss at every step. propop: ``pp.backprop(rnn, xs, t,
method=...)``; the loop: the textbook BPTT in NumPy; PyTorch: ``torch.nn.RNN``
with autograd on the CPU (float64, like the others). One run, warm-up, median of 5.

``cyclic-reduction`` is the two-level reduction (over the layers of a step, then
over time with dense per-step blocks): ``O(log tau)`` levels but ``O(tau r h^3)``
work against the loop's ``O(tau r h^2)``, so on 2 cores it is expected to lose
at hidden 20; peak memory is its estimate from the shapes (within 20% of the measured peak).

Run: ``python -m benchmarks.rnn`` (several minutes on 2 cores)
"""

from __future__ import annotations

import numpy as np

import propop as pp

from .common import each, median_times, publish

CASES = [(20, 16, 1000), (20, 16, 10000), (20, 16, 30000), (8, 1, 65536)]


def numpy_bptt(W, U, b, xs, t):
    """Forward, backward through time and weight gradients, as one would type them."""
    tau = xs.shape[0]
    z = np.zeros((tau + 1,) + (W.shape[0],) + xs.shape[2:])
    bias = b[:, None] if xs.ndim == 3 else b
    for s in range(tau):
        z[s + 1] = np.tanh(W @ xs[s] + U @ z[s] + bias)
    v = np.zeros_like(z[1:])
    carry = np.zeros_like(z[0])
    for s in range(tau - 1, -1, -1):
        v[s] = (1 - z[s + 1] ** 2) * (z[s + 1] - t[s] + U.T @ carry)
        carry = v[s]
    flat = (lambda a: a.transpose(1, 0, 2).reshape(a.shape[1], -1)) if xs.ndim == 3 else \
        (lambda a: a.T)
    return flat(v) @ flat(xs).T, flat(v[1:]) @ flat(z[1:-1]).T, flat(v).sum(axis=1), \
        np.einsum("ij,sj...->si...", W.T, v)


def torch_bptt(module, X, T):
    """Autograd through torch.nn.RNN."""
    module.zero_grad()
    X.grad = None
    out, _ = module(X)
    (0.5 * ((out - T) ** 2).sum()).backward()
    return module.weight_ih_l0.grad


def measure(hidden: int, batch: int, tau: int) -> dict:
    """Times of the contenders on one setting."""
    import torch

    rnn = pp.RNN.random([hidden, hidden], activation="tanh", seed=0)
    rng = np.random.default_rng(1)
    xs = rng.standard_normal((tau, hidden, batch)) if batch > 1 else \
        rng.standard_normal((tau, hidden))
    t = rng.standard_normal(xs.shape)
    W, U, b = rnn.W[0], rnn.U[0], rnn.b[0]
    module = torch.nn.RNN(hidden, hidden, nonlinearity="tanh", dtype=torch.float64)
    with torch.no_grad():
        module.weight_ih_l0.copy_(torch.tensor(W))
        module.weight_hh_l0.copy_(torch.tensor(U))
        module.bias_ih_l0.copy_(torch.tensor(b))
        module.bias_hh_l0.zero_()
    as3 = (lambda a: a) if batch > 1 else (lambda a: a[:, :, None])
    X = torch.tensor(as3(xs)).permute(0, 2, 1).contiguous().requires_grad_(True)
    T = torch.tensor(as3(t)).permute(0, 2, 1).contiguous()
    g = pp.backprop(rnn, xs, t, method="substitution")
    error = np.abs(g.W[0] - numpy_bptt(W, U, b, xs, t)[0]).max() / np.abs(g.W[0]).max()
    torch_error = np.abs(g.W[0] - torch_bptt(module, X, T).numpy()).max() / \
        np.abs(g.W[0]).max()
    times = median_times({
        "loop": lambda: numpy_bptt(W, U, b, xs, t),
        "substitution": lambda: pp.backprop(rnn, xs, t, method="substitution"),
        "cr": lambda: pp.backprop(rnn, xs, t, method="cyclic-reduction"),
        "torch": lambda: torch_bptt(module, X, T),
    }, repeats=5)
    cr = pp.backprop(rnn, xs, t, method="cyclic-reduction")
    return {"hidden": hidden, "batch": batch, "tau": tau,
            **{f"{k}_s": v for k, v in times.items()},
            "vs_loop": times["substitution"] / times["loop"],
            "speedup_vs_torch": times["torch"] / times["substitution"],
            "cr_vs_loop": times["cr"] / times["loop"],
            "cr_speedup_vs_torch": times["torch"] / times["cr"],
            "cr_levels": cr.solution.levels, "cr_peak_mb": cr.solution.info["peak_bytes"] / 1e6,
            "cr_error_vs_loop": float(np.abs(cr.W[0] - g.W[0]).max() / np.abs(g.W[0]).max()),
            "error_vs_loop": float(error), "error_vs_torch": float(torch_error),
            "torch_threads": torch.get_num_threads()}


def main() -> None:
    """Measure, print and save the table."""
    rows = []
    for case in each(CASES, "rnn"):
        rows.append(measure(*case))
        print(rows[-1], flush=True)
    lines = ["| hidden | batch | tau | NumPy loop [s] | PyTorch [s] | substitution [s] "
             "| substitution / loop | substitution speed-up over PyTorch | CR [s] | CR / loop "
             "| CR speed-up over PyTorch | CR levels | CR peak [MB] | error vs PyTorch |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['hidden']} | {r['batch']} | {r['tau']} | {r['loop_s']:.3f} | "
                     f"{r['torch_s']:.3f} | {r['substitution_s']:.3f} | {r['vs_loop']:.2f}x | "
                     f"{r['speedup_vs_torch']:.1f}x | {r['cr_s']:.3f} | {r['cr_vs_loop']:.2f}x | "
                     f"{r['cr_speedup_vs_torch']:.2f}x | {r['cr_levels']} | "
                     f"{r['cr_peak_mb']:.0f} | {r['error_vs_torch']:.0e} |")
    table = "\n".join(lines) + f"\n\nPyTorch threads: {rows[0]['torch_threads']}."
    publish("rnn", rows, table)


if __name__ == "__main__":
    main()
