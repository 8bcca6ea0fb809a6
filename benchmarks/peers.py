"""propop against its peers on one machine: the whole job, ratios to the NumPy loop.

Every contender does the whole job from the inputs: the forward pass, the backward
pass and every gradient of the summed squared error (the loss at every step of an
RNN), in float64, checked against the hand-written NumPy loop (the sequential
floor of NumPy code, 1.0 in the tables). The peers:

- **PyTorch autograd** (CPU, its default threads): what users run.
- **JAX** under ``jit``: ``jax.grad`` of a ``lax.scan`` forward (the strongest
  CPU peer), and a BPPSA-style backward (Wang et al., 2020): the forward by
  ``lax.scan``, then the backward recurrence ``v_k = A_k v_(k+1) + c_k`` solved
  by ``lax.associative_scan`` over affine maps (transposed Jacobians), the
  gradients in one product over all layers.
- The **Newton forward** of an RNN: propop's ``pp.forward`` against the
  sequential loop and a JAX DEER (Lim et al., 2024): Newton's method whose
  linearised recurrence ``h_s = J_s h_(s-1) + c_s`` is solved by the same
  associative scan, as many iterations as propop takes.

propop: ``pp.backprop(net, x, t, method=...)`` with substitution, cyclic
reduction, PCR (MLPs) and ``"auto"``. One run: a warm-up (JAX compiles there),
then the median of 5 round-robin rounds (``benchmarks.common.median_times``).

Run: ``python -m benchmarks.peers`` (about ten minutes on 2 cores; JAX from the
``bench`` extra, PyTorch from ``torch``). ``--quick`` runs the smallest point of
each kind.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

import propop as pp

from .common import arguments, each, median_times, publish

MLP = [(16, 128, 32), (64, 128, 1), (256, 32, 32), (256, 32, 1), (1024, 32, 1),
       (1024, 8, 1)]  # (layers, width, samples)
RNN = [(20, 16, 10000), (8, 1, 65536)]  # (hidden, samples, steps)
NEWTON = [(8, 10000)]  # (hidden, steps), one sample
PROPOP_MLP = ("substitution", "cyclic-reduction", "parallel-cyclic-reduction", "auto")
PROPOP_RNN = ("substitution", "cyclic-reduction", "auto")


# -- the NumPy loops ------------------------------------------------------------------
def mlp_loop(W: np.ndarray, b: np.ndarray, x: np.ndarray, t: np.ndarray) -> tuple:
    """Forward, backward and gradients of a tanh MLP as one would type them."""
    z = [x]
    for Wk, bk in zip(W, b):
        z.append(np.tanh(Wk @ z[-1] + bk[:, None]))
    v = (1 - z[-1] ** 2) * (z[-1] - t)
    dW, db = [None] * len(W), [None] * len(W)
    for k in range(len(W) - 1, -1, -1):
        dW[k], db[k] = v @ z[k].T, v.sum(axis=1)
        v = W[k].T @ v
        if k > 0:
            v *= 1 - z[k] ** 2
    return np.stack(dW), np.stack(db), v


def rnn_loop(W: np.ndarray, U: np.ndarray, b: np.ndarray, xs: np.ndarray, t: np.ndarray
             ) -> tuple:
    """Backpropagation through time of a tanh RNN, ``xs`` of shape ``(tau, h, r)``."""
    tau = xs.shape[0]
    z = np.zeros((tau + 1,) + xs.shape[1:])
    for s in range(tau):
        z[s + 1] = np.tanh(W @ xs[s] + U @ z[s] + b[:, None])
    v = np.zeros_like(z[1:])
    carry = np.zeros_like(z[0])
    for s in range(tau - 1, -1, -1):
        v[s] = carry = (1 - z[s + 1] ** 2) * (z[s + 1] - t[s] + U.T @ carry)
    flat = lambda a: a.transpose(1, 0, 2).reshape(a.shape[1], -1)  # noqa: E731
    return flat(v) @ flat(xs).T, flat(v[1:]) @ flat(z[1:-1]).T, flat(v).sum(axis=1)


def rnn_forward_loop(W: np.ndarray, U: np.ndarray, b: np.ndarray, xs: np.ndarray
                     ) -> np.ndarray:
    """The sequential forward pass of a tanh RNN over ``xs`` ``(tau, h)``."""
    h, out = np.zeros(U.shape[0]), np.empty((xs.shape[0], U.shape[0]))
    for s in range(xs.shape[0]):
        h = out[s] = np.tanh(W @ xs[s] + U @ h + b)
    return out


# -- PyTorch ----------------------------------------------------------------------------
def torch_mlp(W: np.ndarray, b: np.ndarray) -> Callable:
    """Autograd through the MLP; returns ``job(x, t) -> dW``."""
    import torch

    Wt = torch.tensor(W, requires_grad=True)
    bt = torch.tensor(b, requires_grad=True)

    def job(x: Any, t: Any) -> Any:
        Wt.grad = bt.grad = None
        z = x
        for k in range(Wt.shape[0]):
            z = torch.tanh(Wt[k] @ z + bt[k][:, None])
        (0.5 * ((z - t) ** 2).sum()).backward()
        return Wt.grad

    return job


def torch_rnn(W: np.ndarray, U: np.ndarray, b: np.ndarray) -> Callable:
    """Autograd through ``torch.nn.RNN``; returns ``job(X, T) -> dW`` (batch second)."""
    import torch

    module = torch.nn.RNN(W.shape[1], U.shape[0], nonlinearity="tanh", dtype=torch.float64)
    with torch.no_grad():
        module.weight_ih_l0.copy_(torch.tensor(W))
        module.weight_hh_l0.copy_(torch.tensor(U))
        module.bias_ih_l0.copy_(torch.tensor(b))
        module.bias_hh_l0.zero_()

    def job(X: Any, T: Any) -> Any:
        module.zero_grad()
        out, _ = module(X)
        (0.5 * ((out - T) ** 2).sum()).backward()
        return module.weight_ih_l0.grad

    return job


# -- JAX ------------------------------------------------------------------------------
def jax_modules() -> tuple:
    """``(jax, jax.numpy)`` in float64."""
    import jax
    import jax.numpy as jnp

    jax.config.update("jax_enable_x64", True)
    return jax, jnp


def affine_scan(A: Any, c: Any, reverse: bool = False) -> Any:
    """``x_k = A_k x_(k-1) + c_k`` (``x_k = A_k x_(k+1) + c_k`` if ``reverse``) for all k.

    ``lax.associative_scan`` over the affine maps ``x -> A x + c``: ``O(log m)``
    depth, the BPPSA backward and the DEER forward. ``A`` is ``(m, ..., n, n)``.
    """
    jax, _ = jax_modules()

    def compose(first: tuple, second: tuple) -> tuple:
        (A, c), (B, d) = first, second  # x -> B (A x + c) + d
        return B @ A, (B @ c[..., None])[..., 0] + d

    return jax.lax.associative_scan(compose, (A, c), reverse=reverse)[1]


def jax_mlp_forward(W: Any, b: Any, x: Any) -> Any:
    """``z_1..z_l`` by ``lax.scan`` over the stacked layers."""
    jax, jnp = jax_modules()

    def layer(z: Any, params: tuple) -> tuple:
        out = jnp.tanh(params[0] @ z + params[1][:, None])
        return out, out

    return jax.lax.scan(layer, x, (W, b))[1]


def jax_mlp_grad() -> Callable:
    """``jit(grad)`` of the loss through the scanned MLP."""
    jax, jnp = jax_modules()

    def loss(W: Any, b: Any, x: Any, t: Any) -> Any:
        return 0.5 * jnp.sum((jax_mlp_forward(W, b, x)[-1] - t) ** 2)

    return jax.jit(jax.grad(loss, argnums=(0, 1)))


def jax_mlp_bppsa() -> Callable:
    """The BPPSA backward: ``v_k = diag(f'_(k-1)) W_k^T v_(k+1)`` by an associative scan."""
    jax, jnp = jax_modules()

    def job(W: Any, b: Any, x: Any, t: Any) -> tuple:
        z = jax_mlp_forward(W, b, x)  # (l, n, r): the outputs of layers 0..l-1
        slope = jnp.transpose(1 - z**2, (0, 2, 1))  # (l, r, n), samples leading
        # v_k = A_k v_(k+1) + c_k: A_k = diag(f'_k) W_(k+1)^T, c = f'_(l-1) (z_(l-1) - t) last
        A = slope[:-1, :, :, None] * jnp.transpose(W[1:], (0, 2, 1))[:, None]
        A = jnp.concatenate([A, jnp.zeros_like(A[:1])])  # the last map reads nothing
        c = jnp.zeros_like(slope).at[-1].set(slope[-1] * (z[-1] - t).T)
        v = jnp.transpose(affine_scan(A, c, reverse=True), (0, 2, 1))  # (l, n, r)
        inputs = jnp.concatenate([x[None], z[:-1]])
        return jnp.einsum("kir,kjr->kij", v, inputs), v.sum(axis=2)

    return jax.jit(job)


def jax_rnn_forward(W: Any, U: Any, b: Any, xs: Any) -> Any:
    """The states ``h_1..h_tau`` (``(tau, h, r)``) by ``lax.scan``."""
    jax, jnp = jax_modules()

    def step(h: Any, x: Any) -> tuple:
        out = jnp.tanh(W @ x + U @ h + b[:, None])
        return out, out

    return jax.lax.scan(step, jnp.zeros((U.shape[0], xs.shape[2])), xs)[1]


def jax_rnn_grad() -> Callable:
    """``jit(grad)`` of the summed loss through the scanned RNN."""
    jax, jnp = jax_modules()

    def loss(W: Any, U: Any, b: Any, xs: Any, t: Any) -> Any:
        return 0.5 * jnp.sum((jax_rnn_forward(W, U, b, xs) - t) ** 2)

    return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))


def jax_rnn_bppsa() -> Callable:
    """BPPSA through time: ``v_s = f'_s (z_s - t_s + U^T v_(s+1))`` by an associative scan."""
    jax, jnp = jax_modules()

    def job(W: Any, U: Any, b: Any, xs: Any, t: Any) -> tuple:
        z = jax_rnn_forward(W, U, b, xs)  # (tau, h, r)
        slope = jnp.transpose(1 - z**2, (0, 2, 1))  # (tau, r, h)
        A = slope[..., None] * U.T  # v_s = diag(f'_s) U^T v_(s+1) + c_s
        v = affine_scan(A, slope * jnp.transpose(z - t, (0, 2, 1)), reverse=True)
        previous = jnp.concatenate([jnp.zeros_like(z[:1]), z[:-1]])
        return (jnp.einsum("sri,sjr->ij", v, xs), jnp.einsum("sri,sjr->ij", v, previous),
                v.sum(axis=(0, 1)))

    return jax.jit(job)


def jax_deer(iterations: int) -> Callable:
    """DEER: ``iterations`` Newton steps, each linearised recurrence by an associative scan."""
    jax, jnp = jax_modules()

    def job(W: Any, U: Any, b: Any, xs: Any) -> Any:
        inputs = xs @ W.T + b  # (tau, h)
        h = jnp.zeros_like(inputs)
        for _ in range(iterations):
            previous = jnp.concatenate([jnp.zeros_like(h[:1]), h[:-1]])
            value = jnp.tanh(inputs + previous @ U.T)
            J = (1 - value**2)[:, :, None] * U  # d h_s / d h_(s-1)
            c = value - (J @ previous[..., None])[..., 0]
            h = affine_scan(J, c)
        return h

    return jax.jit(job)


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
    W, b = np.stack([np.asarray(w) for w in net.W]), np.stack(net.b)
    dW = mlp_loop(W, b, x, t)[0]
    Wj, bj, xj, tj = (jnp.asarray(a) for a in (W, b, x, t))
    xt, tt = torch.tensor(x), torch.tensor(t)
    grad, bppsa, autograd = jax_mlp_grad(), jax_mlp_bppsa(), torch_mlp(W, b)
    jobs = {"loop": lambda: mlp_loop(W, b, x, t),
            "torch": lambda: autograd(xt, tt),
            "jax.grad": lambda: jax.block_until_ready(grad(Wj, bj, xj, tj)),
            "jax.bppsa": lambda: jax.block_until_ready(bppsa(Wj, bj, xj, tj))}
    jobs.update({m: (lambda m=m: pp.backprop(net, x, t, method=m)) for m in PROPOP_MLP})
    errors = {"torch": _relative(autograd(xt, tt).numpy(), dW),
              "jax.grad": _relative(grad(Wj, bj, xj, tj)[0], dW),
              "jax.bppsa": _relative(bppsa(Wj, bj, xj, tj)[0], dW)}
    errors.update({m: _relative(np.stack(pp.backprop(net, x, t, method=m).W), dW)
                   for m in PROPOP_MLP})
    times = median_times(jobs, repeats=5)
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
    dW = rnn_loop(W, U, b, xs, t)[0]
    args = tuple(jnp.asarray(a) for a in (W, U, b, xs, t))
    X = torch.tensor(xs).permute(0, 2, 1).contiguous()
    T = torch.tensor(t).permute(0, 2, 1).contiguous()
    grad, bppsa, autograd = jax_rnn_grad(), jax_rnn_bppsa(), torch_rnn(W, U, b)
    jobs = {"loop": lambda: rnn_loop(W, U, b, xs, t),
            "torch": lambda: autograd(X, T),
            "jax.grad": lambda: jax.block_until_ready(grad(*args)),
            "jax.bppsa": lambda: jax.block_until_ready(bppsa(*args))}
    jobs.update({m: (lambda m=m: pp.backprop(rnn, xs, t, method=m)) for m in PROPOP_RNN})
    errors = {"torch": _relative(autograd(X, T).numpy(), dW),
              "jax.grad": _relative(grad(*args)[0], dW),
              "jax.bppsa": _relative(bppsa(*args)[0], dW)}
    errors.update({m: _relative(pp.backprop(rnn, xs, t, method=m).W[0], dW)
                   for m in PROPOP_RNN})
    times = median_times(jobs, repeats=5)
    chosen = pp.backprop(rnn, xs, t, method="auto").solution.info["auto"]["method"]
    return _row("rnn", f"H={hidden} r={r} tau={tau}", times, errors, auto=chosen)


def newton_row(hidden: int, tau: int) -> dict:
    """The Newton forward of an RNN: propop, the sequential loop and a JAX DEER."""
    jax, jnp = jax_modules()
    rnn = pp.RNN.random([hidden, hidden], activation="tanh", seed=0)
    xs = np.random.default_rng(1).standard_normal((tau, hidden))
    W, U, b = rnn.W[0], rnn.U[0], rnn.b[0]
    states = rnn_forward_loop(W, U, b, xs)
    iterations = pp.forward(rnn, xs, method="cyclic-reduction").info["iterations"]
    deer, args = jax_deer(iterations), tuple(jnp.asarray(a) for a in (W, U, b, xs))
    jobs = {"loop": lambda: rnn_forward_loop(W, U, b, xs),
            "jax.deer": lambda: jax.block_until_ready(deer(*args))}
    methods = ("cyclic-reduction", "substitution", "auto")
    jobs.update({m: (lambda m=m: pp.forward(rnn, xs, method=m)) for m in methods})
    errors = {"jax.deer": _relative(deer(*args), states)}
    errors.update({m: _relative(pp.forward(rnn, xs, method=m).output, states)
                   for m in methods})
    times = median_times(jobs, repeats=5)
    return _row("newton", f"H={hidden} tau={tau} ({iterations} iterations)", times, errors)


def _row(kind: str, case: str, times: dict, errors: dict, **extra: Any) -> dict:
    loop = times["loop"]
    return {"kind": kind, "case": case, "loop_s": loop,
            "seconds": dict(times), "vs_loop": {k: v / loop for k, v in times.items()},
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
        out += [f"**{title}**: time / NumPy loop (lower is better); worst relative error "
                f"of {what} against the loop in brackets", "",
                "| case | loop [ms] | " + " | ".join(names) + " |",
                "|---|---:|" + "---:|" * len(names)]
        for r in mine:
            cells = [f"{r['vs_loop'][k]:.2f}x ({r['errors'][k]:.0e})" for k in names]
            label = r["case"] + (f", auto: {r['auto']}" if "auto" in r else "")
            out.append(f"| {label} | {1e3 * r['loop_s']:.1f} | " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    """Measure the grid (``--quick``: one point of each kind), print and save the tables."""
    parser = arguments("peers")
    parser.add_argument("--quick", action="store_true")
    quick = parser.parse_args(argv).quick
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
