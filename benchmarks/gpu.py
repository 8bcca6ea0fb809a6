"""propop on a device against PyTorch, JAX, DEER and pararnn-torch there: four grids.

Every contender runs on one device (``--device cuda`` on a GPU machine, ``--device cpu``
anywhere) in one dtype (``--dtype float32`` and/or ``float64``):

- **backprop of deep narrow MLPs** (tanh, MSE) and **RNNs** (tanh, batch 16, the loss at
  every step): PyTorch autograd (``nn.Sequential`` of ``nn.Linear``, ``nn.RNN``) and JAX
  (``jax.grad`` of a ``lax.scan`` forward and the BPPSA backward, both under ``jit``, on
  JAX's default device) against ``pp.backprop`` of the same network moved with
  ``.to("torch", device)`` by substitution, cyclic reduction, PCR, Jacobi and batched
  GMRES;
- **Newton forward of an Elman RNN**: ``nn.RNN``'s sequential forward against DEER's own
  ``seq1d`` and ``pp.forward(..., linearization="newton")`` by each method;
- **Newton forward of a GRU** at DEER's demo setting (input 2, hidden 2, batch 16, 10000
  steps) and at hidden 64: ``nn.GRU`` (cuDNN on CUDA) against DEER's ``seq1d`` (its DEER
  method and its ``lax.scan``), pararnn-torch's ``ParaGRU`` Newton path (a diagonal
  cell: its row is for scale) and ``pp.GRU`` by Newton and quasi-Newton with cyclic
  reduction.

DEER's code is imported from the folder ``--deer PATH`` (or ``$PROPOP_DEER``) names,
never from this tree, and skipped with a note where absent. Times are medians over
interleaved rounds (``benchmarks.common.timings``) after a first run, each job ending
with a device synchronisation; a contender whose second run still takes over ``SLOW``
seconds is timed by that run alone (the table says "1 run"), one whose first run took
over ``CAP`` seconds is left out of the larger cases of its grid ("skipped"), and one
that raises is reported with its error. The deviation is the largest difference from a
float64 reference (NumPy's backprop; ``nn.GRU`` in float64), relative to the reference's
largest entry; peak device memory is PyTorch's ``max_memory_allocated`` above what was
allocated before the run (CUDA, PyTorch contenders only: JAX allocates its own).
Float32 is float32 for every contender on CUDA: cuDNN's and JAX's TensorFloat-32
defaults are switched off (:func:`_full_float32`).
``--deadline`` seconds after the start no new row begins, and the tables are written
after every row, so a run cut short keeps what it measured; ``--grid`` picks grids.

Run: ``python -m benchmarks.gpu --device cuda --deer PATH --record --save`` on a GPU
machine (about twelve minutes on an H200: the record 2-3, each grid 1-5; ``--grid``
splits it); ``python -m benchmarks.gpu --device cpu --quick`` at tiny
sizes anywhere (CI). ``--record`` first solves every layout with every native method on
CuPy and PyTorch CUDA (and the SciPy adapters with a CuPy path on CuPy) against NumPy
and writes the methods that agree, with the device, to ``propop/solvers/gpu_runs.py``
(what ``propop solvers`` reports).
"""

from __future__ import annotations

import argparse
import copy
import gc
import importlib
import importlib.util
import json
import pathlib
import textwrap
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import propop as pp

from .baselines import (jax_mlp_bppsa, jax_mlp_grad, jax_modules, jax_rnn_bppsa, jax_rnn_grad,
                        torch_mlp, torch_rnn)
from .common import arguments, by_kind, destination, publish, timings
from .newton import deer_jobs, deer_seq1d, jax_gru_step, pararnn_gru

MLP = [(256, 8, 1), (1024, 8, 1), (1024, 32, 1), (1024, 64, 32), (4096, 8, 1),
       (4096, 16, 256)]  # (layers, width, samples), in order of cost
RNN = [(8, 16, 1024), (64, 16, 4096), (32, 16, 16384), (8, 16, 65536)]  # (hidden, batch, tau)
NEWTON = [(8, 16, 10000), (64, 16, 4096)]  # (hidden, batch, tau)
GRU = [(2, 2, 16, 10000), (64, 64, 16, 10000)]  # (input, hidden, batch, tau)
QUICK = {"gru": [(2, 2, 3, 20)], "mlp": [(8, 4, 2)], "rnn": [(4, 2, 16)],
         "newton": [(4, 2, 16)]}
BACKPROP = ("substitution", "cyclic-reduction", "parallel-cyclic-reduction", "jacobi",
            "batched-gmres")
FORWARD = ("substitution", "cyclic-reduction")
REPEATS = 5
SLOW = 2.0  # seconds: a contender slower than this (its second run) is not run again
CAP = 10.0  # seconds: a contender whose first run took longer is left out of larger cases
COMPILED = ("jax", "DEER")  # contenders whose first call compiles (XLA): DEER's seq1d at
# hidden 64 took 11 s (float32) and 150 s (float64) once on an H200, its GRU 37 ms warm
SKIPPED: dict[str, set[str]] = {}  # dtype -> contenders over CAP at a smaller case


class Device:
    """A PyTorch device and dtype, with a synchronisation for timing."""

    def __init__(self, name: str, dtype: str) -> None:
        import torch

        self.torch, self.name, self.dtype = torch, name, dtype
        self.cuda = name.startswith("cuda")

    def tensor(self, a: np.ndarray) -> Any:
        """``a`` as a tensor of this device and dtype."""
        return self.torch.as_tensor(np.asarray(a, dtype=self.dtype), device=self.name)

    def jax(self, a: np.ndarray) -> Any:
        """``a`` as a JAX array of this dtype on JAX's default device."""
        _, jnp = jax_modules()
        return jnp.asarray(np.asarray(a, dtype=self.dtype))

    def synced(self, job: Callable[[], Any]) -> Callable[[], Any]:
        """``job`` followed by a wait for the device (and JAX) to finish."""
        def run() -> Any:
            out = job()
            if self.cuda:
                self.torch.cuda.synchronize()
            return out

        return run

    def peak(self, job: Callable[[], Any]) -> tuple[Any, float | None]:
        """``job()`` and the device bytes it allocated at its peak (CUDA), else ``None``.

        Above what was allocated before it, after a garbage collection: the first run's
        tables counted up to 3.4 GiB that earlier rows' arrays still held.
        """
        if not self.cuda:
            return job(), None
        gc.collect()
        before = self.torch.cuda.memory_allocated()
        self.torch.cuda.reset_peak_memory_stats()
        out = job()
        return out, float(self.torch.cuda.max_memory_allocated() - before)


def _host(a: Any) -> np.ndarray:
    """A NumPy float64 copy of a NumPy, CuPy, PyTorch or JAX array."""
    if hasattr(a, "detach"):
        return a.detach().cpu().numpy().astype(np.float64)
    if type(a).__module__.startswith("jax"):
        return np.asarray(a, dtype=np.float64)
    return np.asarray(pp.backend.to_host(a), dtype=np.float64)


def _deviation(ours: Any, reference: np.ndarray) -> float:
    ours = _host(ours).reshape(reference.shape)
    return float(np.abs(ours - reference).max() / max(np.abs(reference).max(), 1e-300))


def _jax_blocked(job: Callable[[], Any]) -> Callable[[], Any]:
    """``job`` waiting for JAX's result (JAX dispatches asynchronously)."""
    jax, _ = jax_modules()
    return lambda: jax.block_until_ready(job())


def _measure(device: Device, jobs: dict, values: dict, reference: np.ndarray
             ) -> tuple[dict, dict, dict, dict]:
    """Times, peak device bytes, deviations and errors of ``jobs``.

    ``values[name]`` maps a job's result to the array compared with ``reference`` (no
    entry: not compared). Each job runs once for its result and peak (its warm-up),
    once timed, and in interleaved rounds if that took at most ``SLOW`` seconds; one
    whose first run took over ``CAP`` seconds is timed by that run alone and left out
    of the larger cases (:data:`SKIPPED`), except a compiled one (:data:`COMPILED`),
    whose first run is its compilation: it is timed by its second.
    """
    synced = {name: device.synced(job) for name, job in jobs.items()}
    first, peaks, deviation, errors = {}, {}, {}, {}
    for name, job in synced.items():
        if name in SKIPPED.get(device.dtype, set()):
            errors[name] = f"skipped: over {CAP:.0f} s a run at a smaller case"
            continue
        try:
            start = time.perf_counter()
            out, peak = device.peak(job)
            first[name] = time.perf_counter() - start
            peaks[name] = None if name.startswith(("jax", "DEER")) else peak
            if name in values:
                deviation[name] = _deviation(values[name](out), reference)
            if first[name] <= CAP or name.startswith(COMPILED):
                start = time.perf_counter()
                job()
                first[name] = time.perf_counter() - start
            if first[name] > CAP:
                SKIPPED.setdefault(device.dtype, set()).add(name)
        except Exception as error:  # a contender that fails is reported, not fatal
            errors[name] = f"{type(error).__name__}: {error}"[:300]
            first.pop(name, None)
    fast = {name: synced[name] for name in first if first[name] <= SLOW}
    times = timings(fast, repeats=REPEATS, warmup=0, settle=False) if fast else {}
    times = {name: dict(times[name], runs=REPEATS) if name in times else
             {"median": t, "min": t, "max": t, "runs": 1} for name, t in first.items()}
    return times, peaks, deviation, errors


def mlp_row(device: Device, layers: int, width: int, r: int) -> dict:
    """Backprop of an MLP: autograd, JAX and propop's methods, on ``device``."""
    net = pp.FNN.random([width] * (layers + 1), activation="tanh", seed=0, bias=0.1)
    rng = np.random.default_rng(1)
    x, t = rng.standard_normal((width, r)), rng.standard_normal((width, r))
    reference = np.stack(pp.backprop(net, x, t, method="substitution").W)
    moved = pp.FNN([device.tensor(W) for W in net.W], [device.tensor(b) for b in net.b],
                   activation=[act.name for act in net.activations])
    xd, td = device.tensor(x), device.tensor(t)
    autograd = torch_mlp(net.W, net.b, dtype=device.dtype, device=device.name)
    X, T = device.tensor(x.T.copy()), device.tensor(t.T.copy())
    jobs: dict[str, Callable] = {"torch": lambda: autograd(X, T)}
    values: dict[str, Callable] = {"torch": lambda out: np.stack([_host(g) for g in out])}
    if importlib.util.find_spec("jax") is not None:
        args = tuple(device.jax(a) for a in (np.stack(net.W), np.stack(net.b), x, t))
        grad, bppsa = jax_mlp_grad(), jax_mlp_bppsa()
        jobs |= {"jax.grad": _jax_blocked(lambda: grad(*args)),
                 "jax.bppsa": _jax_blocked(lambda: bppsa(*args))}
        values |= {"jax.grad": lambda out: out[0], "jax.bppsa": lambda out: out[0]}
    for m in BACKPROP:
        jobs[m] = lambda m=m: pp.backprop(moved, xd, td, method=m)
        values[m] = lambda out: np.stack([_host(g) for g in out.W])
    return _row("mlp", f"l={layers} n={width} r={r}", "torch",
                *_measure(device, jobs, values, reference))


def rnn_row(device: Device, hidden: int, r: int, tau: int) -> dict:
    """Backprop through time of an Elman RNN: autograd through ``nn.RNN``, JAX, propop."""
    rnn = pp.RNN.random([hidden, hidden], activation="tanh", seed=0)
    rng = np.random.default_rng(1)
    xs, t = rng.standard_normal((tau, hidden, r)), rng.standard_normal((tau, hidden, r))
    reference = pp.backprop(rnn, xs, t, method="substitution").W[0]
    moved = pp.RNN([device.tensor(W) for W in rnn.W], [device.tensor(U) for U in rnn.U],
                   [device.tensor(b) for b in rnn.b])
    xd, td = device.tensor(xs), device.tensor(t)
    autograd = torch_rnn(rnn.W[0], rnn.U[0], rnn.b[0], dtype=device.dtype, device=device.name)
    X, T = (device.tensor(a.transpose(0, 2, 1).copy()) for a in (xs, t))
    jobs: dict[str, Callable] = {"torch": lambda: autograd(X, T)}
    values: dict[str, Callable] = {"torch": _host}
    if importlib.util.find_spec("jax") is not None:
        args = tuple(device.jax(a) for a in (rnn.W[0], rnn.U[0], rnn.b[0], xs, t))
        grad, bppsa = jax_rnn_grad(), jax_rnn_bppsa()
        jobs |= {"jax.grad": _jax_blocked(lambda: grad(*args)),
                 "jax.bppsa": _jax_blocked(lambda: bppsa(*args))}
        values |= {"jax.grad": lambda out: out[0], "jax.bppsa": lambda out: out[0]}
    for m in BACKPROP:
        if m != "parallel-cyclic-reduction":  # a chain's method: an RNN system is no chain
            jobs[m] = lambda m=m: pp.backprop(moved, xd, td, method=m)
            values[m] = lambda out: out.W[0]
    return _row("rnn", f"H={hidden} r={r} tau={tau}", "torch",
                *_measure(device, jobs, values, reference))


def newton_row(device: Device, hidden: int, r: int, tau: int, seq1d: Any = None) -> dict:
    """The Newton forward of an Elman RNN against ``nn.RNN``'s sequential forward and DEER."""
    import torch

    rnn = pp.RNN.random([hidden, hidden], activation="tanh", seed=0)
    xs = np.random.default_rng(1).standard_normal((tau, hidden, r))
    reference = rnn.forward(xs).output  # (tau, hidden, r)
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

    jobs: dict[str, Callable] = {"torch": sequential}
    values: dict[str, Callable] = {"torch": lambda out: _host(out).transpose(0, 2, 1)}
    if seq1d is not None:
        _, jnp = jax_modules()
        params = tuple(device.jax(a) for a in (rnn.W[0], rnn.U[0], rnn.b[0]))
        deer = deer_jobs(seq1d, lambda h, x, p: jnp.tanh(p[0] @ x + p[1] @ h + p[2]),
                         device.jax(np.zeros(hidden)), device.jax(xs.transpose(2, 0, 1)),
                         params, batched=True)
        jobs |= deer
        values |= {name: lambda out: _host(out).transpose(1, 2, 0) for name in deer}
    for m in FORWARD:
        jobs[m] = lambda m=m: pp.forward(moved, xd, method=m, linearization="newton")
        values[m] = lambda out: out.output
    return _row("newton", f"H={hidden} r={r} tau={tau}", "torch",
                *_measure(device, jobs, values, reference))


def gru_row(device: Device, inputs: int, hidden: int, r: int, tau: int,
            seq1d: Any = None) -> dict:
    """The Newton forward of a GRU: ``nn.GRU``, DEER, pararnn-torch and ``pp.GRU``."""
    import torch

    torch.manual_seed(0)
    exact = torch.nn.GRU(inputs, hidden).double()
    xs = np.random.default_rng(1).standard_normal((tau, inputs, r))
    with torch.no_grad():
        reference = exact(torch.tensor(xs.transpose(0, 2, 1).copy()))[0].numpy()
    module = copy.deepcopy(exact).to(device=device.name, dtype=getattr(torch, device.dtype))
    gru = pp.GRU.from_torch(exact, dtype=device.dtype).to("torch", device.name)
    X, xd = device.tensor(xs.transpose(0, 2, 1).copy()), device.tensor(xs)

    def sequential() -> Any:
        with torch.no_grad():
            return module(X)[0]

    jobs: dict[str, Callable] = {"torch.nn.GRU": sequential}
    values: dict[str, Callable] = {"torch.nn.GRU": _host}
    if seq1d is not None:
        params = {k: device.jax(v.detach().numpy()) for k, v in exact.named_parameters()}
        deer = deer_jobs(seq1d, jax_gru_step, device.jax(np.zeros(hidden)),
                         device.jax(xs.transpose(2, 0, 1)), params, batched=True)
        jobs |= deer
        values |= {name: lambda out: _host(out).transpose(1, 0, 2) for name in deer}
    if importlib.util.find_spec("pararnn") is not None:  # a diagonal cell: scale only
        jobs["pararnn ParaGRU (Newton)"] = pararnn_gru(inputs, hidden, X,
                                                       "auto" if device.cuda else "eager")
    for name, linearization in (("propop newton + CR", "newton"),
                                ("propop quasi + CR", "quasi")):
        jobs[name] = lambda lin=linearization: pp.forward(gru, xd, method="cyclic-reduction",
                                                          linearization=lin)
        values[name] = lambda out: _host(out.z[1]).transpose(0, 2, 1)
    return _row("gru", f"in={inputs} H={hidden} r={r} tau={tau}", "torch.nn.GRU",
                *_measure(device, jobs, values, reference))


def _row(kind: str, case: str, base: str, times: dict, peaks: dict, deviation: dict,
         errors: dict) -> dict:
    reference = times[base]["median"] if base in times else float("nan")
    return {"kind": kind, "case": case, "base": base, "seconds": dict(times),
            "vs_base": {k: v["median"] / reference for k, v in times.items()},
            "peak_bytes": peaks, "deviation": deviation, "errors": errors}


TITLES = (("gru", "GRU Newton forward"), ("mlp", "MLP backprop"), ("rnn", "RNN backprop"),
          ("newton", "Elman RNN Newton forward"))


def _cell(row: dict, name: str) -> str:
    if name in row["errors"]:
        return "skipped" if row["errors"][name].startswith("skipped") else "failed"
    if name not in row["seconds"]:
        return "-"
    seconds, peak = row["seconds"][name], row["peak_bytes"].get(name)
    text = f"{1e3 * seconds['median']:.2f}<br>{row['vs_base'][name]:.2f}x"
    if name in row["deviation"]:
        text += f" ({row['deviation'][name]:.0e})"
    if peak is not None:
        text += f"<br>{peak / 2**20:.0f} MiB"
    return text + ("<br>1 run" if seconds["runs"] == 1 else "")


def table(rows: list[dict], device: str, dtype: str) -> str:
    """Markdown: per case, each contender's time, ratio, deviation and peak memory.

    The ratio is to the row's baseline (PyTorch); failed contenders' errors follow.
    """
    out = []
    for title, chosen, _ in by_kind(rows, TITLES):
        names = list(dict.fromkeys(n for row in chosen for n in [*row["seconds"],
                                                                 *row["errors"]]))
        out += [f"**{title}** on {device}, {dtype}: median time [ms], / {chosen[0]['base']}'s, "
                "(largest deviation from float64, relative), peak device memory", "",
                "| case | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
        out += [f"| {row['case']} | " + " | ".join(_cell(row, n) for n in names) + " |"
                for row in chosen]
        out += [f"- {row['case']}, {n}: {e}" for row in chosen
                for n, e in row["errors"].items() if not e.startswith("skipped")]
        out.append("")
    return "\n".join(out)


def record(device: str, path: pathlib.Path | None = None) -> dict[str, str]:
    """Every method with a GPU backend on every layout, on that backend, against NumPy.

    Native methods on CuPy and PyTorch ``device``, the SciPy adapters with a CuPy
    path (``cupyx.scipy.sparse.linalg``) on CuPy. Returns the methods that agreed on
    a backend, with the device and the backends they ran on, and writes them to
    ``path`` (``propop/solvers/gpu_runs.py``); prints where each failed, and why.
    """
    import cupy
    import torch

    from .systems import SYSTEMS  # the systems of the CPU tests (tests/test_backends.py)

    versions = {"cupy": f"CuPy {cupy.__version__}",
                "torch (CUDA)": f"PyTorch {torch.__version__} CUDA"}
    passed = {}
    for spec in pp.solvers.available():
        kinds = list(versions) if spec.native else ["cupy"] * ("cupy" in spec.backends)
        if not kinds:
            continue
        failures, alike = [], {}
        for layout, build in SYSTEMS.items():
            wrong, home = _disagreements(spec, build(3), device, kinds)
            failures += [(kind, f"{layout}: {why}") for kind, why in wrong]
            if home:
                alike.setdefault(home, []).append(layout)
        if failures:
            print(f"{spec.name} failed:", "; ".join(f"{k} {w}" for k, w in failures))
        good = [kind for kind in kinds if kind not in {k for k, _ in failures}]
        if good:
            passed[spec.name] = (f"{torch.cuda.get_device_name(0)}, every layout, float64: "
                                 + ", ".join(versions[k] for k in good)
                                 + ("" if len(good) == len(kinds) else
                                    f"; {failures[0][0]} failed ({failures[0][1]})")
                                 + "".join(f"; {status} on {', '.join(layouts)}, as on NumPy"
                                           for status, layouts in alike.items()))
    path = path or pathlib.Path(pp.__file__).parent / "solvers" / "gpu_runs.py"
    text = path.read_text()
    head = text[: text.index("RUNS: dict[str, str] = ")]
    body = "".join(f"    {k!r}:\n        {_literal(v, 8)},\n" for k, v in sorted(passed.items()))
    path.write_text(head + "RUNS: dict[str, str] = {\n" + body + "}\n")
    return passed


def _literal(text: str, indent: int) -> str:
    """``text`` as Python source within 100 columns: adjacent literals, one a line."""
    parts = textwrap.wrap(text, 96 - indent, drop_whitespace=False) or [""]
    joined = f"\n{' ' * (indent + 1)}".join(repr(part) for part in parts)
    return joined if len(parts) == 1 else f"({joined})"


def _disagreements(spec: Any, system: Any, device: str, kinds: list[str]
                   ) -> tuple[list[tuple[str, str]], str]:
    """``(backend, why)`` for each of ``kinds`` where the method disagrees with NumPy's run.

    The method runs on NumPy too: where it converges there, a backend must converge
    within ``1e-9`` of the largest entry of substitution's ``x`` for an exact method,
    ``1e-6`` for an iterative one (its own tolerance is on the residual); where it
    fails there (a breakdown, ``maxiter``), a backend must report the same status.
    Also returns the NumPy status when it was a failure (``""`` when it converged).
    """
    if not spec.applies_to(system):
        return [], ""
    exact, bound = pp.solve(system, "substitution").x, 1e-9 if spec.exact else 1e-6
    home = pp.solve(system, spec.name).status
    out = []
    for kind in kinds:
        try:
            moved = system.to(kind.split()[0], None if kind == "cupy" else device)
            solution = pp.solve(moved, spec.name)
        except Exception as error:  # reported with the method and layout
            out.append((kind, f"{type(error).__name__}: {error}"[:200]))
            continue
        if solution.status is not home:
            out.append((kind, f"{solution.status.name} where NumPy's is {home.name}"))
            continue
        x = pp.backend.to_host(solution.x)
        error = float(np.abs(x - exact).max() / max(np.abs(exact).max(), 1))
        if home is pp.Status.CONVERGED and not error <= bound:
            out.append((kind, f"relative error {error:.1e}"))
    return out, "" if home is pp.Status.CONVERGED else home.name


def _full_float32() -> None:
    """float32 products in float32 for every contender: no TF32 in cuDNN or in JAX.

    Both default to TensorFloat-32 on this hardware (a 10-bit mantissa): in a first run
    ``nn.GRU`` and ``nn.RNN`` deviated by 3e-4 to 7e-4 and JAX's MLP gradients by 1e-3,
    against 3e-7 for propop and PyTorch's matmuls, which default to float32.
    """
    import torch

    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    if importlib.util.find_spec("jax") is not None:
        jax, _ = jax_modules()
        jax.config.update("jax_default_matmul_precision", "highest")


def _device_line(device: str) -> str:
    """The device, its driver's CUDA and the GPU libraries' versions, for the caption."""
    import torch

    if not device.startswith("cuda"):
        return f"Device: {device} (PyTorch {torch.__version__})"
    versions = [f"PyTorch {torch.__version__} (CUDA {torch.version.cuda})"]
    for name in ("cupy", "jax"):
        if importlib.util.find_spec(name) is not None:
            module = importlib.import_module(name)
            versions.append(f"{name} {module.__version__}")
    if importlib.util.find_spec("jax") is not None:
        versions.append(f"JAX on {importlib.import_module('jax').devices()[0]}")
    return f"Device: {torch.cuda.get_device_name(0)}; " + ", ".join(versions)


def main() -> None:
    """Measure the grids on ``--device`` in each ``--dtype``, print and save the tables."""
    parser = arguments("gpu")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a check that it runs")
    parser.add_argument("--device", default="cuda", help="a PyTorch device: cuda or cpu")
    parser.add_argument("--dtype", action="append", choices=("float32", "float64"),
                        help="repeat for both (default: both)")
    parser.add_argument("--deer", default=None,
                        help="a folder holding DEER's package (machine-discovery/deer)")
    parser.add_argument("--deadline", type=float, default=float("inf"),
                        help="seconds after the start past which no new row begins")
    parser.add_argument("--grid", action="append", choices=("gru", "mlp", "rnn", "newton"),
                        help="repeat for several (default: all four)")
    parser.add_argument("--record", action="store_true",
                        help="first record in propop/solvers/gpu_runs.py the methods that "
                             "agree with NumPy on CuPy and PyTorch CUDA")
    parser.add_argument("--case", action="append", type=_case, metavar="KIND:A,B,C[:DTYPE]",
                        help="measure only this case of a grid (e.g. rnn:8,16,65536:float64), "
                             "in the order given; repeat for several")
    parser.add_argument("--merge", action="store_true",
                        help="keep the rows of the saved table that this run does not measure")
    args = parser.parse_args()
    start = time.perf_counter()
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("--device cuda needs PyTorch with CUDA; use --device cpu here")
    if args.record:
        if not args.device.startswith("cuda"):
            raise SystemExit("--record needs --device cuda: it records runs on a GPU")
        print("recorded:", ", ".join(sorted(record(args.device))), flush=True)
    seq1d, note = deer_seq1d(args.deer)
    note = f"{_device_line(args.device)}; {note}"
    if args.device.startswith("cuda"):
        _full_float32()
    measure = {"gru": gru_row, "mlp": mlp_row, "rnn": rnn_row, "newton": newton_row}
    dtypes = args.dtype or ["float32", "float64"]
    name = "gpu" + ("_quick" if args.quick else "")
    rows, last = _saved(name) if args.merge else [], None
    for kind, case, dtype in _jobs(args, dtypes):
        if kind != last:  # contenders too slow at a smaller case of the grid
            SKIPPED.clear()
            last = kind
        if time.perf_counter() - start > args.deadline:
            print(f"deadline: {kind} {case} {dtype} not measured", flush=True)
            continue
        extra = (seq1d,) if kind in ("gru", "newton") else ()
        begun = time.perf_counter()
        row = dict(measure[kind](Device(args.device, dtype), *case, *extra), dtype=dtype)
        rows = _replaced(rows, row)
        print(f"{kind} {case} {dtype}: {time.perf_counter() - begun:.0f} s", flush=True)
        shown = dict.fromkeys([*dtypes, *(r["dtype"] for r in rows)])
        tables = [table([r for r in rows if r["dtype"] == d], args.device, d) for d in shown]
        publish(name, rows, "\n".join(tables) + f"\n{note}.")


def _case(text: str) -> tuple[str, tuple[int, ...], str | None]:
    """``KIND:A,B,C[:DTYPE]`` of ``--case`` as ``(kind, sizes, dtype or None)``."""
    kind, sizes, *dtype = text.split(":")
    if kind not in ("gru", "mlp", "rnn", "newton") or len(dtype) > 1 or not set(dtype) <= {
            "float32", "float64"}:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected KIND:A,B,C[:DTYPE], KIND one of gru, mlp, rnn, newton and "
            "DTYPE float32 or float64")
    try:
        numbers = tuple(int(size) for size in sizes.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: sizes must be integers") from None
    wanted = len(GRU[0]) if kind == "gru" else 3  # (input, hidden, batch, tau), else three
    if len(numbers) != wanted:
        raise argparse.ArgumentTypeError(f"{text!r}: a {kind} case has {wanted} sizes")
    return kind, numbers, (dtype or [None])[0]


def _jobs(args: argparse.Namespace, dtypes: list[str]) -> list[tuple[str, tuple, str]]:
    """``(kind, case, dtype)`` to measure: ``--case`` in its order, else the grids'."""
    if args.case:
        return [(kind, case, dtype) for kind, case, only in args.case
                for dtype in ([only] if only else dtypes)]
    grids = QUICK if args.quick else {"gru": GRU, "mlp": MLP, "rnn": RNN, "newton": NEWTON}
    chosen = args.grid or list(grids)
    return [(kind, case, dtype) for kind in chosen for case in grids[kind]
            for dtype in dtypes]


def _saved(name: str) -> list[dict]:
    """The rows of the table ``name`` saved where this run saves (none if there is none)."""
    path = destination() / f"{name}.json"
    return json.loads(path.read_text())["rows"] if path.exists() else []


def _replaced(rows: list[dict], row: dict) -> list[dict]:
    """``rows`` with ``row`` in place of the one of its kind, case and dtype, else added."""
    key = (row["kind"], row["case"], row["dtype"])
    if key not in {(r["kind"], r["case"], r["dtype"]) for r in rows}:
        return [*rows, row]
    return [row if (r["kind"], r["case"], r["dtype"]) == key else r for r in rows]

if __name__ == "__main__":
    main()
