"""propop on a device against PyTorch autograd on the same device: backprop and Newton grids.

Every contender runs on one device (``--device cuda`` on a GPU machine, ``--device cpu``
anywhere) in one dtype (``--dtype float32`` and/or ``float64``):

- **backprop of deep narrow MLPs** (tanh, MSE) and **RNNs** (tanh, batch 16, the loss at
  every step): PyTorch autograd (``nn.Sequential`` of ``nn.Linear``, ``nn.RNN``) against
  ``pp.backprop`` of the same network moved with ``.to("torch", device)`` by
  substitution, cyclic reduction, PCR, Jacobi and batched GMRES;
- **Newton forward of an Elman RNN**: ``nn.RNN``'s sequential forward against
  ``pp.forward(..., linearization="newton")`` by each method;
- **JAX** (``jax.grad`` under ``jit`` on JAX's default device) where it is installed.

Times are medians over interleaved rounds after a warm-up (``benchmarks.common.timings``),
each job ending with a device synchronisation; the deviation is the largest relative
difference of the weight gradients (the states, for the forward) from a float64 NumPy
reference; peak device memory is PyTorch's ``max_memory_allocated`` (CUDA only).
``pp.GRU``/``pp.LSTM``/``pp.Recurrence`` compute their Jacobians in NumPy arrays and do
not run on a device yet: their Newton rows are NumPy only and say so.

Run: ``python -m benchmarks.gpu --device cuda --save`` on a GPU machine (about ten
minutes); ``python -m benchmarks.gpu --device cpu --quick`` at tiny sizes anywhere (CI).
``--record`` then solves every layout with every native method on CuPy and PyTorch CUDA
against NumPy and writes the methods that agree, with the device, to
``propop/solvers/gpu_runs.py`` (what ``propop solvers`` reports).
"""

from __future__ import annotations

import importlib.util
import pathlib
from collections.abc import Callable
from typing import Any

import numpy as np

import propop as pp

from .common import arguments, by_kind, publish, timings

MLP = [(256, 8, 1), (1024, 8, 1), (4096, 8, 1), (1024, 32, 1), (1024, 64, 32),
       (4096, 16, 256)]  # (layers, width, samples)
RNN = [(8, 16, 1024), (8, 16, 65536), (32, 16, 16384), (64, 16, 4096)]  # (hidden, batch, tau)
NEWTON = [(8, 16, 10000), (64, 16, 4096)]  # (hidden, batch, tau)
QUICK = {"mlp": [(8, 4, 2)], "rnn": [(4, 2, 16)], "newton": [(4, 2, 16)]}
BACKPROP = ("substitution", "cyclic-reduction", "parallel-cyclic-reduction", "jacobi",
            "batched-gmres")
FORWARD = ("substitution", "cyclic-reduction")
REPEATS = 5


class Device:
    """A PyTorch device and dtype, with a synchronisation for timing."""

    def __init__(self, name: str, dtype: str) -> None:
        import torch

        self.torch, self.name, self.dtype = torch, name, dtype
        self.cuda = name.startswith("cuda")

    def tensor(self, a: np.ndarray) -> Any:
        """``a`` as a tensor of this device and dtype."""
        return self.torch.as_tensor(np.asarray(a, dtype=self.dtype), device=self.name)

    def synced(self, job: Callable[[], Any]) -> Callable[[], Any]:
        """``job`` followed by a wait for the device to finish."""
        def run() -> Any:
            out = job()
            if self.cuda:
                self.torch.cuda.synchronize()
            return out

        return run

    def peak(self, job: Callable[[], Any]) -> float | None:
        """Peak device bytes of one run of ``job`` (CUDA), else ``None``."""
        if not self.cuda:
            return None
        self.torch.cuda.reset_peak_memory_stats()
        job()
        self.torch.cuda.synchronize()
        return float(self.torch.cuda.max_memory_allocated())


def _deviation(ours: Any, reference: np.ndarray) -> float:
    ours = np.asarray(pp.backend.to_host(ours), dtype=np.float64)
    return float(np.abs(ours - reference).max() / max(np.abs(reference).max(), 1e-300))


def _measure(device: Device, jobs: dict) -> tuple[dict, dict]:
    """Median times (interleaved rounds) and peak device bytes of ``jobs``."""
    synced = {name: device.synced(job) for name, job in jobs.items()}
    times = timings(synced, repeats=REPEATS)
    peaks = {name: device.peak(job) for name, job in synced.items()}
    return times, peaks


def mlp_row(device: Device, layers: int, width: int, r: int) -> dict:
    """Backprop of an MLP: autograd against propop's methods, on ``device``."""
    from .baselines import torch_mlp

    net = pp.FNN.random([width] * (layers + 1), activation="tanh", seed=0, bias=0.1)
    rng = np.random.default_rng(1)
    x, t = rng.standard_normal((width, r)), rng.standard_normal((width, r))
    reference = np.stack(pp.backprop(net, x, t, method="substitution").W)
    moved = pp.FNN([device.tensor(W) for W in net.W], [device.tensor(b) for b in net.b],
                   activation=[act.name for act in net.activations])
    xd, td = device.tensor(x), device.tensor(t)
    autograd = torch_mlp(net.W, net.b, dtype=device.dtype, device=device.name)
    X, T = device.tensor(x.T.copy()), device.tensor(t.T.copy())
    jobs = {"torch": lambda: autograd(X, T)}
    jobs.update({m: (lambda m=m: pp.backprop(moved, xd, td, method=m)) for m in BACKPROP})
    deviation = {"torch": _deviation(np.stack([g.cpu().numpy() for g in autograd(X, T)]),
                                     reference)}
    deviation.update({m: _deviation(np.stack([pp.backend.to_host(g) for g in
                                              pp.backprop(moved, xd, td, method=m).W]),
                                    reference) for m in BACKPROP})
    times, peaks = _measure(device, jobs)
    return _row("mlp", f"l={layers} n={width} r={r}", times, peaks, deviation)


def rnn_row(device: Device, hidden: int, r: int, tau: int) -> dict:
    """Backprop through time of an Elman RNN: autograd through ``nn.RNN`` against propop."""
    from .baselines import torch_rnn

    rnn = pp.RNN.random([hidden, hidden], activation="tanh", seed=0)
    rng = np.random.default_rng(1)
    xs, t = rng.standard_normal((tau, hidden, r)), rng.standard_normal((tau, hidden, r))
    reference = pp.backprop(rnn, xs, t, method="substitution").W[0]
    moved = pp.RNN([device.tensor(W) for W in rnn.W], [device.tensor(U) for U in rnn.U],
                   [device.tensor(b) for b in rnn.b])
    xd, td = device.tensor(xs), device.tensor(t)
    autograd = torch_rnn(rnn.W[0], rnn.U[0], rnn.b[0], dtype=device.dtype, device=device.name)
    X, T = (device.tensor(a.transpose(0, 2, 1).copy()) for a in (xs, t))
    jobs = {"torch": lambda: autograd(X, T)}
    jobs.update({m: (lambda m=m: pp.backprop(moved, xd, td, method=m)) for m in BACKPROP
                 if m != "parallel-cyclic-reduction"})
    deviation = {"torch": _deviation(autograd(X, T).cpu().numpy(), reference)}
    deviation.update({m: _deviation(pp.backprop(moved, xd, td, method=m).W[0], reference)
                      for m in jobs if m != "torch"})
    times, peaks = _measure(device, jobs)
    return _row("rnn", f"H={hidden} r={r} tau={tau}", times, peaks, deviation)


def newton_row(device: Device, hidden: int, r: int, tau: int) -> dict:
    """The Newton forward of an Elman RNN against ``nn.RNN``'s sequential forward."""
    import torch

    rnn = pp.RNN.random([hidden, hidden], activation="tanh", seed=0)
    xs = np.random.default_rng(1).standard_normal((tau, hidden, r))
    reference = rnn.forward(xs).output
    moved = pp.RNN([device.tensor(W) for W in rnn.W], [device.tensor(U) for U in rnn.U],
                   [device.tensor(b) for b in rnn.b])
    xd = device.tensor(xs)
    module = torch.nn.RNN(hidden, hidden, nonlinearity="tanh", device=device.name,
                          dtype=getattr(torch, device.dtype))
    with torch.no_grad():
        module.weight_ih_l0.copy_(device.tensor(rnn.W[0]))
        module.weight_hh_l0.copy_(device.tensor(rnn.U[0]))
        module.bias_ih_l0.copy_(device.tensor(rnn.b[0]))
        module.bias_hh_l0.zero_()
    X = device.tensor(xs.transpose(0, 2, 1).copy())

    def sequential() -> Any:
        with torch.no_grad():
            return module(X)[0]

    jobs = {"torch": sequential}
    jobs.update({m: (lambda m=m: pp.forward(moved, xd, method=m, linearization="newton"))
                 for m in FORWARD})
    deviation = {"torch": _deviation(sequential().cpu().numpy().transpose(0, 2, 1),
                                     reference)}
    deviation.update({m: _deviation(pp.forward(moved, xd, method=m, linearization="newton")
                                    .output, reference) for m in FORWARD})
    times, peaks = _measure(device, jobs)
    return _row("newton", f"H={hidden} r={r} tau={tau}", times, peaks, deviation)


def _row(kind: str, case: str, times: dict, peaks: dict, deviation: dict) -> dict:
    base = times["torch"]["median"]
    return {"kind": kind, "case": case, "seconds": dict(times),
            "vs_torch": {k: v["median"] / base for k, v in times.items()},
            "peak_bytes": peaks, "deviation": deviation}


def table(rows: list[dict], device: str, dtype: str) -> str:
    """Markdown: per case, each contender's median time, its ratio to autograd, deviation."""
    out = []
    for title, chosen, names in by_kind(rows, (("mlp", "MLP backprop"), ("rnn", "RNN backprop"),
                        ("newton", "Elman RNN Newton forward"))):
        out += [f"**{title}** on {device}, {dtype}: median time [ms], / PyTorch's, "
                "(max relative deviation from float64 NumPy)", "",
                "| case | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
        for row in chosen:
            cells = [f"{1e3 * row['seconds'][n]['median']:.2f}<br>{row['vs_torch'][n]:.2f}x "
                     f"({row['deviation'][n]:.0e})" for n in names]
            out.append(f"| {row['case']} | " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


def record(device: str) -> dict[str, str]:
    """Every native method on every layout, on CuPy and PyTorch ``device``, against NumPy.

    Returns the methods that agreed on both, with the device they ran on.
    """
    import torch

    from .systems import SYSTEMS  # the systems of the CPU tests (tests/test_backends.py)

    name = torch.cuda.get_device_name(0)
    passed = {}
    for method in (s.name for s in pp.solvers.available() if s.native):
        ok = True
        for build in SYSTEMS.values():
            system = build(3)
            if not pp.solvers.info(method).applies_to(system):
                continue
            exact = pp.solve(system, "substitution").x
            for kind, dev in (("cupy", None), ("torch", device)):
                if kind == "cupy" and importlib.util.find_spec("cupy") is None:
                    ok = False
                    continue
                x = pp.backend.to_host(pp.solve(system.to(kind, dev), method).x)
                ok &= bool(np.abs(x - exact).max() <= 1e-9 * max(np.abs(exact).max(), 1))
        if ok:
            passed[method] = f"{name} (CuPy and PyTorch CUDA, torch {torch.__version__})"
    path = pathlib.Path(pp.__file__).parent / "solvers" / "gpu_runs.py"
    text = path.read_text()
    head = text[: text.index("RUNS: dict[str, str] = ")]
    body = "".join(f"    {k!r}: {v!r},\n" for k, v in sorted(passed.items()))
    path.write_text(head + "RUNS: dict[str, str] = {\n" + body + "}\n")
    return passed


def main() -> None:
    """Measure the grids on ``--device`` in each ``--dtype``, print and save the tables."""
    parser = arguments("gpu")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a check that it runs")
    parser.add_argument("--device", default="cuda", help="a PyTorch device: cuda or cpu")
    parser.add_argument("--dtype", action="append", choices=("float32", "float64"),
                        help="repeat for both (default: both)")
    parser.add_argument("--record", action="store_true",
                        help="record in propop/solvers/gpu_runs.py the methods that agree "
                             "with NumPy on CuPy and PyTorch CUDA")
    args = parser.parse_args()
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("--device cuda needs PyTorch with CUDA; use --device cpu here")
    grids = QUICK if args.quick else {"mlp": MLP, "rnn": RNN, "newton": NEWTON}
    rows, tables = [], []
    for dtype in args.dtype or ["float32", "float64"]:
        device = Device(args.device, dtype)
        part = ([dict(mlp_row(device, *c), dtype=dtype) for c in grids["mlp"]]
                + [dict(rnn_row(device, *c), dtype=dtype) for c in grids["rnn"]]
                + [dict(newton_row(device, *c), dtype=dtype) for c in grids["newton"]])
        rows += part
        tables.append(table(part, args.device, dtype))
    publish("gpu" + ("_quick" if args.quick else ""), rows, "\n".join(tables))
    if args.record:
        if not args.device.startswith("cuda"):
            raise SystemExit("--record needs --device cuda: it records runs on a GPU")
        print("recorded:", ", ".join(sorted(record(args.device))))


if __name__ == "__main__":
    main()
