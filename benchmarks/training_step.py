"""A PyTorch training step with propop inside it, against plain autograd: the whole step.

One step is what a training loop repeats: ``zero_grad``, the forward pass, the loss,
``loss.backward()`` and ``optimizer.step()`` (Adam). Contenders, in float64 on the
CPU (``--device cuda`` on a GPU machine), on one thread unless ``OMP_NUM_THREADS``
says otherwise:

- a **2-layer GRU language model**: ``torch.nn.GRU`` (PyTorch's C++ loop and
  autograd) against ``propop.torch.GRU`` with the sequential forward and with
  Newton's forward (DEER), each solved by substitution and by cyclic reduction, the
  backward always propop's solve by the same method; ``pararnn-torch``'s ``ParaGRU`` (its Newton +
  eager scan, its defaults: at most 3 Newton iterations, a residual gate at 1e-5)
  where it is installed, a different cell (diagonal recurrent weights, so each
  Newton step is a diagonal scan, ``O(tau H)`` against the dense GRU's
  ``O(tau H^3)`` reduction), so its row is for scale only;
- an **MLP** (``nn.Sequential`` of ``nn.Linear`` and ``nn.Tanh``, computed as the FNN
  it is) and a **residual MLP** (residual blocks: a graph): plain autograd against
  ``propop.torch.parallelize`` with substitution and cyclic reduction;
- a **transformer encoder layer** (``nn.TransformerEncoderLayer``, post-norm, no
  dropout, its attention imported as a graph of products, softmaxes and norms):
  plain autograd against ``parallelize`` with substitution, on the host (NumPy and
  SciPy's sparse couplings) and with ``backend="torch"`` (on the inputs' device, the
  couplings PyTorch's CSR tensors).

Times are medians over interleaved rounds after a warm-up
(``benchmarks.common.timings``); ratios are to plain autograd.

Run: ``python -m benchmarks.training_step [--save]`` (a few minutes);
``--quick`` at tiny sizes.
"""

from __future__ import annotations

import copy
import importlib.util
from collections.abc import Callable
from typing import Any

from .common import arguments, by_kind, publish, timings

GRU = [(16, 32, 2, 8, 256)]  # (input, hidden, layers, batch, tau)
MLP = [(64, 8, 32, False), (64, 8, 32, True)]  # (width, layers, batch, residual)
ATTENTION = [(32, 4, 64, 16, 16)]  # (d_model, heads, feed-forward width, tokens, batch)
QUICK = {"gru": [(3, 4, 2, 2, 8)], "mlp": [(4, 3, 2, False), (4, 3, 2, True)],
         "attention": [(4, 2, 8, 3, 2)]}
REPEATS = 7


def _step(model: Any, loss: Callable[[Any], Any]) -> Callable[[], float]:
    """One training step of ``model`` with Adam: the callable a timing repeats."""
    import torch

    optimiser = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step() -> float:
        optimiser.zero_grad()
        value = loss(model)
        value.backward()
        optimiser.step()
        return float(value.detach())

    return step


def gru_row(device: str, inputs: int, hidden: int, layers: int, batch: int, tau: int) -> dict:
    """A GRU language model's step: torch.nn.GRU, propop.torch.GRU's modes, pararnn."""
    import torch

    import propop.torch as ptorch

    torch.manual_seed(0)
    x = torch.randn(tau, batch, inputs, dtype=torch.float64, device=device)
    target = torch.randn(tau, batch, hidden, dtype=torch.float64, device=device)

    def loss(model: Any) -> Any:
        return ((model(x)[0] - target) ** 2).mean()

    plain = torch.nn.GRU(inputs, hidden, num_layers=layers, dtype=torch.float64, device=device)
    models = {"torch.nn.GRU": plain,
              "propop sequential + substitution": ptorch.from_module(
                  plain, mode="sequential", method="substitution"),
              "propop sequential + CR": ptorch.from_module(plain, mode="sequential",
                                                           method="cyclic-reduction"),
              "propop newton + CR": ptorch.from_module(plain, mode="newton",
                                                       method="cyclic-reduction"),
              "propop newton + substitution": ptorch.from_module(plain, mode="newton",
                                                                 method="substitution")}
    if importlib.util.find_spec("pararnn") is not None:  # a different cell: for scale only
        import pararnn

        models["pararnn ParaGRU (Newton, eager scan)"] = pararnn.ParaRNN(
            pararnn.ParaGRU(inputs, hidden, dtype=torch.float64, device=device),
            num_layers=layers, solver="newton", batch_first=False, return_hidden=True,
            config=pararnn.NewtonConfig(scan_backend="eager"), dtype=torch.float64)
    jobs = {name: _step(copy.deepcopy(model), loss) for name, model in models.items()}
    return _row("gru", f"in={inputs} H={hidden} layers={layers} batch={batch} tau={tau}",
                *_timed(jobs), "torch.nn.GRU")


def mlp_row(device: str, width: int, layers: int, batch: int, residual: bool = False) -> dict:
    """An MLP's step: plain autograd against parallelize's backward solves.

    ``residual``: after a first layer, ``layers`` residual blocks ``x + tanh(W x + b)``
    (a graph, not a chain: cyclic reduction over its groups); else ``layers`` of
    ``Linear`` and ``Tanh`` (a chain, computed as the FNN it is).
    """
    import torch

    import propop.torch as ptorch
    from propop.interop.torch_import import Residual

    torch.manual_seed(0)
    parts = [torch.nn.Linear(width, width), torch.nn.Tanh()] if residual else []
    for _ in range(layers):
        layer = [torch.nn.Linear(width, width), torch.nn.Tanh()]
        parts += [Residual(torch.nn.Sequential(*layer))] if residual else layer
    plain = torch.nn.Sequential(*parts).to(device=device, dtype=torch.float64)
    x = torch.randn(batch, width, dtype=torch.float64, device=device)

    def loss(model: Any) -> Any:
        return (model(x) ** 2).mean()

    models = {"torch autograd": plain}
    for method in ("substitution", "cyclic-reduction"):
        groups = {"groups": True} if residual and method == "cyclic-reduction" else {}
        models[f"parallelize {method}"] = ptorch.parallelize(copy.deepcopy(plain),
                                                             method=method, **groups)
    jobs = {name: _step(model if name != "torch autograd" else copy.deepcopy(model), loss)
            for name, model in models.items()}
    case = (f"residual width={width} blocks={layers} batch={batch}" if residual else
            f"width={width} layers={layers} batch={batch}")
    return _row("mlp", case, *_timed(jobs), "torch autograd")


def attention_row(device: str, d_model: int, heads: int, ff: int, tokens: int,
                  batch: int) -> dict:
    """A transformer encoder layer's step: plain autograd against parallelize's solve."""
    import torch

    import propop.torch as ptorch

    torch.manual_seed(0)
    plain = torch.nn.TransformerEncoderLayer(d_model, heads, ff, dropout=0.0,
                                             batch_first=True).to(device=device,
                                                                  dtype=torch.float64)
    x = torch.randn(batch, tokens, d_model, dtype=torch.float64, device=device)

    def loss(model: Any) -> Any:
        return (model(x) ** 2).mean()

    parallel, on_device = (ptorch.parallelize(copy.deepcopy(plain), method="substitution",
                                              example_input=x, backend=kind)
                           for kind in ("numpy", "torch"))
    jobs = {"torch autograd": _step(copy.deepcopy(plain), loss),
            "parallelize substitution": _step(parallel, loss),  # on the host, SciPy's
            "parallelize substitution, backend=torch": _step(on_device, loss)}  # CSR tensors
    return _row("attention", f"d={d_model} heads={heads} ff={ff} tokens={tokens} "
                f"batch={batch}", *_timed(jobs), "torch autograd")


def _timed(jobs: dict[str, Callable]) -> tuple[dict, dict]:
    """``(times, errors)``: each job's first step tried alone, the ones that ran timed.

    A contender that raises (pararnn-torch's CUDA kernels take no float64) is left out
    of the timing with its error, instead of ending the whole run.
    """
    errors = {}
    for name, job in jobs.items():
        try:
            job()
        except Exception as error:  # reported in the table, with the contender's name
            errors[name] = f"{type(error).__name__}: {error}"[:200]
    ran = {name: job for name, job in jobs.items() if name not in errors}
    return timings(ran, repeats=REPEATS), errors


def _row(kind: str, case: str, times: dict, errors: dict, base: str) -> dict:
    reference = times[base]["median"]
    return {"kind": kind, "case": case, "seconds": dict(times), "errors": errors,
            "vs_plain": {k: v["median"] / reference for k, v in times.items()}}


def table(rows: list[dict]) -> str:
    """Markdown: per case, each contender's median step time and its ratio to plain."""
    out = []
    for title, chosen, names in by_kind(rows, (("gru", "GRU language model"), ("mlp", "MLP"),
                                                   ("attention", "transformer encoder layer"))):
        names += [n for row in chosen for n in row.get("errors", {}) if n not in names]
        out += [f"**One training step, {title}** (Adam, float64): median [ms], / plain "
                "autograd's", "", "| case | " + " | ".join(names) + " |",
                "|---|" + "---:|" * len(names)]
        for row in chosen:
            out.append(f"| {row['case']} | " + " | ".join(
                f"{1e3 * row['seconds'][n]['median']:.2f} ({row['vs_plain'][n]:.2f}x)"
                if n in row["seconds"] else "failed" for n in names) + " |")
        out += [f"- {row['case']}, {name}: {why}" for row in chosen
                for name, why in row.get("errors", {}).items()]
        out.append("")
    if not any("pararnn" in name for row in rows
               for name in [*row["seconds"], *row.get("errors", {})]):
        out.append("pararnn-torch is not installed here (pip install pararnn-torch; it needs "
                   "triton on Linux): no ParaGRU row.")
    return "\n".join(out)


def main() -> None:
    """Measure, print and save the table."""
    parser = arguments("training_step")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a check that it runs")
    parser.add_argument("--device", default="cpu", help="a PyTorch device: cpu or cuda")
    args = parser.parse_args()
    grids = QUICK if args.quick else {"gru": GRU, "mlp": MLP, "attention": ATTENTION}
    rows = ([gru_row(args.device, *case) for case in grids["gru"]]
            + [mlp_row(args.device, *case) for case in grids["mlp"]]
            + [attention_row(args.device, *case) for case in grids["attention"]])
    publish("training_step" + ("_quick" if args.quick else ""), rows, table(rows))


if __name__ == "__main__":
    main()
