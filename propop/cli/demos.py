"""``propop demo``'s sections, and :func:`run`, which prints each as it starts and ends.

The opening tables (:mod:`.tables`), then one storage, plans, auto, backends,
PyTorch in the loop, models, trust, training.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .. import memory, solvers
from ..memory import MemoryBudgetError
from ..networks.fnn import FNN
from ..networks.rnn import RNN
from ..propagation import backprop
from ..solvers.plan import solve
from ..solvers.solution import Solution, Status
from ..systems import backward_system, forward_system
from .experiments import problem, report
from .tables import FULL, QUICK, Table

__all__ = ["run", "sections", "DEMO_TRAINING", "QUICK_TRAINING"]


def auto() -> None:
    """The demo's method='auto': what it takes where depth dominates and where width does."""
    from ..solvers.selection.auto import choose

    print("method='auto' picks the exact method its cost model predicts fastest (propop "
          "calibrate measures the constants on this machine; propop explain shows the "
          "choice for any network):\n")
    for layers, width, batch in ((1024, 8, 1), (6, 256, 32)):
        net, trace, eps = problem("fnn", layers, width, batch, "tanh", 1.0, "float64", 0, 1)
        print(f"- FNN, {layers} layers of width {width}, batch {batch}: "
              f"{choose(backward_system(net, trace, eps)).reason}")
    print()


def storage() -> None:
    """One storage: whatever network made a system, a layout plus stacked coefficients."""
    from ..networks.graph import Graph

    rng = np.random.default_rng(0)
    fnn = FNN.random([6, 9, 5, 7], activation="tanh", seed=0)
    square = FNN.random([8] * 5, activation="tanh", seed=0)
    rnn = RNN.random([3, 4, 4], activation="tanh", seed=0)
    graph = Graph.residual_mlp(4, 3, seed=0)
    systems = {"FNN of widths 6-9-5-7": backward_system(fnn, fnn.forward(
                   rng.standard_normal((6, 2))), np.ones((7, 2))),
               "FNN of width 8": backward_system(square, square.forward(
                   rng.standard_normal((8, 2))), np.ones((8, 2))),
               "2-layer RNN, 10 steps": backward_system(rnn, rnn.forward(
                   rng.standard_normal((10, 3, 2))), np.ones((10, 4, 2))),
               "residual MLP graph": backward_system(graph, graph.forward(np.ones((4, 2))),
                                                     np.ones((4, 2)))}
    print("One storage: every system is a layout (which blocks couple) plus couplings in "
          "dense stacks or a sparse list, and block-indexed stacks of scalings; methods ask "
          "its tags, computed once, and never see how it was given:\n")
    print("| system | layout | couplings stored | tags |\n|---|---|---|---|")
    for name, B in systems.items():
        op = B.operator_of
        stored = (f"{len(op.couplings.stacks)} dense stack(s)" if not op.couplings.sparse
                  else f"sparse list of {len(op.couplings)}")
        print(f"| {name} | {op.layout.kind} ({op.nblocks} blocks) | {stored} | "
              f"{', '.join(sorted(B.tags))} |")
    print()


def _gpu_runs() -> str:
    """How many methods a recorded GPU run covered, and where (``gpu_runs``)."""
    from ..solvers.gpu_runs import RUNS

    if not RUNS:
        return "not yet run on a GPU"
    device = next(iter(RUNS.values())).split(",")[0]
    adapters = sum(name.startswith("scipy.") for name in RUNS)
    return (f"{len(RUNS) - adapters} native methods" + (
        f" and {adapters} SciPy adapters (CuPy's namesakes)" if adapters else "")
        + f" ran on an {device} and agreed with NumPy")


def backends() -> None:
    """The demo's PyTorch tensors: every layout, every native method, the same code as NumPy's."""
    try:
        import torch
    except ImportError:
        print("PyTorch tensors: skipped, torch is not installed (pip install propop[torch]).\n")
        return
    from ..interop.torch_import import from_torch
    from ..networks.gated import GRU
    from ..networks.graph import Graph

    rng = np.random.default_rng(1)
    fnn = FNN.random([6, 9, 5, 7], activation="tanh", seed=0)
    sparse = FNN.random([6, 9, 5, 7], activation="tanh", seed=0, density=0.4)
    rnn = RNN.random([3, 4, 4], activation="tanh", seed=0)
    gru = GRU(3, 4, num_layers=2, seed=0)
    graph = Graph.residual_mlp(6, 2)
    nn = torch.nn
    cnn = from_torch(nn.Sequential(nn.Conv2d(1, 2, 3, padding=1), nn.BatchNorm2d(2).eval(),
                                   nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                                   nn.Linear(18, 3)).double(), input_shape=(1, 6, 6))
    x, xs = rng.standard_normal((6, 3)), rng.standard_normal((12, 3, 3))
    cases = {"FNN 6-9-5-7": (fnn, x, rng.standard_normal((7, 3)),
                             lambda: FNN([torch.from_numpy(W) for W in fnn.W],
                                         [torch.from_numpy(b) for b in fnn.b])),
             "FNN of sparse weights (40%)": (sparse, x, rng.standard_normal((7, 3)),
                                             lambda: sparse.to("torch")),
             "RNN, 12 steps": (rnn, xs, rng.standard_normal((12, 4, 3)),
                               lambda: RNN([torch.from_numpy(W) for W in rnn.W],
                                           [torch.from_numpy(U) for U in rnn.U],
                                           [torch.from_numpy(b) for b in rnn.b])),
             "2-layer GRU, 12 steps": (gru, xs, rng.standard_normal((12, 4, 3)),
                                       lambda: gru.to("torch")),
             "residual graph, 2 blocks": (graph, x, rng.standard_normal((6, 3)),
                                          lambda: graph.to("torch")),
             "CNN: conv, batch norm, max pool": (cnn, rng.standard_normal((36, 3)),
                                                 rng.standard_normal((3, 3)),
                                                 lambda: cnn.to("torch"))}
    print("PyTorch tensors, one code path: networks of tensors (any widths, sparse weights as "
          "CSR tensors, RNNs, GRUs, graphs) backpropagate with every propop-native method on "
          "the same code as NumPy's "
          f"(CuPy and PyTorch CUDA too, {_gpu_runs()}; propop solvers says where each "
          "method has run):\n")
    print("| network | method | returns | max relative difference from NumPy |\n"
          "|---|---|---|---:|")
    for name, (net, inputs, target, moved) in cases.items():
        reference = backprop(net, inputs, target, method="substitution")
        ours = moved()
        for method in ("cyclic-reduction", "batched-gmres"):
            options = {"groups": True} if name.startswith("residual") and \
                method == "cyclic-reduction" else {}  # a block per residual unit
            g = backprop(ours, torch.from_numpy(inputs), torch.from_numpy(target),
                         method=method, **options)
            raw = _first_gradient(g, host=False)
            mine, theirs = _first_gradient(g), _first_gradient(reference)
            difference = float(np.abs(mine - theirs).max() / np.abs(theirs).max())
            print(f"| {name} | {method} | {type(raw).__module__}.{type(raw).__name__} | "
                  f"{difference:.1e} |")
    print("\n(the CNN's Jacobians, its kernel's entries and the batch norm's scaling, are "
          "formed on the tensors' device from patterns made once, and the dense layer's weight "
          "times the pooling's selection there too: after its first call a graph there sends "
          "no array to the device)")
    _trained_there(fnn, torch)


def _trained_there(fnn: FNN, torch: Any) -> None:
    """``pp.train`` of the demo's FNN on PyTorch tensors against the same run on NumPy."""
    from .. import backend
    from ..training import train

    rng = np.random.default_rng(2)
    x, labels = rng.standard_normal((6, 40)), rng.integers(0, 7, 40)
    options = dict(epochs=2, batch_size=10, optimizer="adam", lr=0.01, progress=False)
    host, _ = train(fnn, x, labels, **options)
    there, history = train(fnn.to("torch"), torch.from_numpy(x), torch.from_numpy(labels),
                           **options)
    difference = max(float(np.abs(backend.to_host(a) - b).max()) for a, b in zip(there.W,
                                                                                 host.W))
    print(f"pp.train on PyTorch tensors (2 epochs of Adam, labels as a tensor): loss "
          f"{history.epochs[-1]['loss']:.4f}, weights {difference:.1e} from the NumPy run's "
          "(the command line's: propop train --backend torch, pruning included).\n")


def _first_gradient(g: Any, host: bool = True) -> Any:
    """The first weight's gradient of any network's gradients (on the host if ``host``)."""
    from .. import backend

    value = g.W[0] if hasattr(g, "W") else next(iter(g.parameters.values()))
    value = next(iter(value.values())) if isinstance(value, dict) else value  # a graph's node
    return backend.dense(backend.to_host(value)) if host else value


def torch_loop() -> None:
    """PyTorch in the loop: a drop-in GRU and a parallelized module, trained with Adam."""
    try:
        import torch
    except ImportError:
        print("PyTorch in the loop: skipped, torch is not installed "
              "(pip install propop[torch]).\n")
        return
    import copy

    from .. import torch as ptorch

    torch.manual_seed(0)
    plain = torch.nn.GRU(3, 8, num_layers=2, dtype=torch.float64)
    ours = ptorch.from_module(plain, mode="newton", method="cyclic-reduction")
    mlp = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.LeakyReLU(0.2),
                              torch.nn.Linear(16, 3)).double()  # any activation's settings
    reference = copy.deepcopy(mlp)
    parallel = ptorch.parallelize(mlp, method="cyclic-reduction")
    xs, x = torch.randn(40, 4, 3, dtype=torch.float64), torch.randn(32, 6, dtype=torch.float64)
    print("PyTorch in the loop: one line changes (nn.GRU -> propop.torch.GRU, or "
          "model = propop.torch.parallelize(model)); torch.optim.Adam trains as before:\n")
    print("| model | forward | backward | max parameter difference after 3 Adam steps |\n"
          "|---|---|---|---:|")
    for name, a, b, data, how in (("2-layer GRU, 40 steps", ours, plain, xs, "newton (DEER)"),
                                  ("MLP 6-16-3, LeakyReLU(0.2)", parallel, reference, x,
                                   "sequential")):
        for module in (a, b):
            optimiser = torch.optim.Adam(module.parameters(), lr=0.01)
            for _ in range(3):
                optimiser.zero_grad()
                out = module(data)
                ((out[0] if isinstance(out, tuple) else out) ** 2).sum().backward()
                optimiser.step()
        worst = max(float((p - q).detach().abs().max())
                    for p, q in zip(a.parameters(), b.parameters()))
        print(f"| {name} | {how} | propop cyclic-reduction | {worst:.1e} |")
    print(f"\n(the GRU's last forward took {ours.last['iterations']} Newton iterations; the "
          f"MLP, a chain of dense layers, was solved as the FNN it is: "
          f"{parallel.propop.last['backward'].x.shape[0]} rows in its backward system, "
          f"{sum(parallel.propop.graph.block_sizes)} in the traced graph's, one block per "
          "node)\n")


def models() -> None:
    """The demo's own models: a module traced by torch.fx, and a GRU's Newton family."""
    try:
        import torch
    except ImportError:
        print("Your own models: skipped, torch is not installed (pip install propop[torch]).\n")
        return
    from ..newton.loop import forward
    from ..interop.torch_import import from_torch

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1, self.fc2 = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)
            self.ln, self.gate, self.up = (torch.nn.LayerNorm(8), torch.nn.Linear(8, 16),
                                           torch.nn.Linear(8, 16))
            self.down = torch.nn.Linear(16, 8, bias=False)
            self.norm, self.head = torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = x + self.fc2(torch.nn.functional.silu(self.fc1(x)))  # a residual, as written
            y = self.ln(h)  # a pre-norm SwiGLU unit, a transformer's MLP half
            h = h + self.down(torch.nn.functional.silu(self.gate(y)) * self.up(y))
            return torch.softmax(self.head(self.norm(h)), dim=-1)

    torch.manual_seed(0)
    module = Block().double().eval()
    x = np.random.default_rng(2).standard_normal((8, 5))
    X = torch.tensor(x.T, requires_grad=True)
    (0.5 * (module(X) ** 2).sum()).backward()
    graph = from_torch(module)
    errors = {}
    for method in ("substitution", "jacobi"):
        g = backprop(graph, x, np.zeros((3, 5)), method=method)
        theirs = dict(module.named_parameters())
        errors[method] = max([float(np.abs(g.x - X.grad.numpy().T).max())] + [
            float(np.abs(value - theirs[name].grad.numpy()).max())
            for name, value in g.named_parameters()])
    print(f"Your own models. A module whose forward() writes a residual sum, SiLU, a "
          f"pre-norm SwiGLU unit (LayerNorm, a product of two tensors), BatchNorm (eval) and "
          f"a softmax, traced by torch.fx into {len(graph.order) - 1} nodes; dE/dx and every "
          "parameter's gradient against autograd, largest difference: "
          + ", ".join(f"{m} {e:.0e}" for m, e in errors.items()) + ".")
    newton = forward(graph, x, method="substitution")  # from zero states
    restarted = ", ".join(map(str, newton.info["restarts"]))
    print(f"Newton's forward of that graph from zero states: {newton.info['iterations']} "
          f"iterations for {len(graph.order) - 1} nodes, "
          + (f"iterates {restarted} restarted where they overshot (the LayerNorm's rsqrt "
             "linearised at a zero variance), " if restarted else "")
          + f"{np.abs(newton.output - module(X).detach().numpy().T).max():.0e} from "
          "PyTorch's output.\n")
    _attention(torch)
    _hand_written(torch)
    gru = from_torch(torch.nn.GRU(4, 8, num_layers=2).double())
    xs = np.random.default_rng(3).standard_normal((200, 4, 4))
    exact = gru.forward(xs).z[1]
    print("A 2-layer GRU (hidden 8, from nn.GRU) over 200 steps, batch 4, evaluated in "
          "parallel: Newton-type iterations, each a cyclic reduction over time (ELK's "
          "damped steps a block tridiagonal one):\n")
    print("| linearization | iterations | max state error | Lyapunov exponent |\n"
          "|---|---:|---:|---:|")
    for name in ("newton", "quasi", "block-diagonal", "damped"):
        f = forward(gru, xs, method="cyclic-reduction", linearization=name)
        print(f"| {name} | {f.info['iterations']} | {np.abs(f.z[1] - exact).max():.1e} | "
              f"{f.info['lyapunov']:+.3f} |")
    quasi, newton = (forward_system(gru, xs, around=f, linearization=name)
                     for name in ("quasi", "newton"))
    shared = quasi.coupling_stack.strides[0] == 0  # one identity, broadcast over the steps
    print(f"\nQuasi-Newton's system stores the Jacobians' diagonals alone, "
          f"{quasi.scale_stack.nbytes / 1e3:.0f} kB, its couplings "
          f"{'one identity for every step' if shared else 'stored'}, where Newton's holds "
          f"{newton.coupling_stack.nbytes / 1e3:.0f} kB of full blocks: O(tau r n) an "
          "iteration, solved entrywise by cyclic reduction.\n")
    _own_cell(torch)


def _attention(torch: Any) -> None:
    """Self-attention over tokens, traced: its gradients against autograd, Newton's forward."""
    from ..newton.loop import forward

    F = torch.nn.functional

    class Attention(torch.nn.Module):  # as nanoGPT writes it, a causal mask buffer
        def __init__(self, d: int = 8, heads: int = 2, T: int = 6) -> None:
            super().__init__()
            self.qkv, self.out = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
            self.norm, self.heads = torch.nn.RMSNorm(d), heads
            self.wpe = torch.nn.Embedding(T, d)  # learned positions
            self.register_buffer("mask", torch.tril(torch.ones(T, T)).view(1, 1, T, T))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            B, T, d = x.size()
            pos = torch.arange(0, T, dtype=torch.long, device=x.device)
            q, k, v = self.qkv(self.norm(x + self.wpe(pos))).split(d, dim=2)
            q, k, v = (t.view(B, T, self.heads, d // self.heads).transpose(1, 2)
                       for t in (q, k, v))
            att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
            att = F.softmax(att.masked_fill(self.mask == 0, float("-inf")), dim=-1)
            return x + self.out((att @ v).transpose(1, 2).contiguous().view(B, T, d))

    torch.manual_seed(1)
    module = Attention().double()
    x = np.random.default_rng(4).standard_normal((3, 6, 8))
    graph, worst, X = _against_autograd(torch, module, x)
    flat = x.reshape(3, -1).T
    newton = forward(graph, flat, method="substitution")
    output = module(X).detach().numpy().reshape(3, -1).T
    print(f"Self-attention over 6 tokens as nanoGPT writes it (nn.Embedding of the "
          f"positions, RMSNorm, qkv split apart, causal masked_fill(-inf) and a softmax "
          f"over 2 heads, a residual), traced into "
          f"{len(graph.order) - 1} nodes (per-token Linear, permutations, products of two "
          f"tensors, a softmax): every gradient {worst:.0e} from autograd's; Newton's forward "
          f"{newton.info['iterations']} "
          f"iterations, {np.abs(newton.output - output).max():.0e} from PyTorch's output.\n")


def _against_autograd(torch: Any, module: Any, x: np.ndarray) -> tuple[Any, float, Any]:
    """``(graph, largest gradient difference, X)`` of a traced module against autograd.

    The loss is ``|module(X)|^2 / 2`` for the batch ``X`` made from ``x``; propop's
    gradients are by substitution.
    """
    from ..interop.torch_import import from_torch

    X = torch.tensor(x, requires_grad=True)
    out = module(X)
    (0.5 * (out ** 2).sum()).backward()
    graph = from_torch(module, input_shape=x.shape[1:])
    r = x.shape[0]
    g = backprop(graph, x.reshape(r, -1).T, np.zeros((out[0].numel(), r)),
                 method="substitution")
    theirs = dict(module.named_parameters())
    worst = max([float(np.abs(g.x - X.grad.numpy().reshape(r, -1).T).max())] + [
        float(np.abs(value - theirs[name].grad.numpy()).max())
        for name, value in g.named_parameters()])
    return graph, worst, X


def _hand_written(torch: Any) -> None:
    """Operations users write by hand: their gradients against autograd's."""
    class Mixer(torch.nn.Module):  # the Annotated Transformer's LayerNorm, and more
        def __init__(self, d: int = 6) -> None:
            super().__init__()
            self.fc, self.head = torch.nn.Linear(d, d), torch.nn.Linear(d, d)
            self.a_2, self.b_2 = torch.nn.Parameter(torch.randn(d)), torch.nn.Parameter(
                torch.zeros(d))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.fc(x)
            mean, std = h.mean(-1, keepdim=True), h.std(-1, keepdim=True)
            h = self.a_2 * (h - mean) / (std + 1e-6) + self.b_2
            h = h * 0.5 * (1.0 + torch.erf(h / math.sqrt(2.0)))  # BERT's GELU
            h = h - torch.log(torch.exp(h).sum(-1, keepdim=True))  # a log-softmax
            shifted = torch.roll(h, 1, dims=1) + torch.nn.functional.pad(h, (1, 1))[..., 2:]
            pooled = torch.relu(h).amax(dim=1, keepdim=True)  # ties among the zeros split
            return self.head(torch.maximum(shifted, pooled) + h.flip(1))

    torch.manual_seed(2)
    graph, worst, _ = _against_autograd(torch, Mixer().double(),
                                        np.random.default_rng(5).standard_normal((3, 5, 6)))
    print(f"Operations written by hand (the Annotated Transformer's LayerNorm from mean and "
          f"std, BERT's GELU from erf, a log-softmax from exp and log, torch.roll, F.pad, "
          f"amax with ties, torch.maximum, flip), traced into {len(graph.order) - 1} nodes: "
          f"every gradient {worst:.0e} from autograd's.\n")


def _own_cell(torch: Any) -> None:
    """A user's cell written for one sample: pp.Recurrence against the loop a user writes."""
    from ..networks.recurrence import TRACED_STEPS, Recurrence

    rng = np.random.default_rng(4)
    p = {"W": 0.4 * rng.standard_normal((8, 8)), "U": 0.4 * rng.standard_normal((8, 8))}
    tau, r = 2 * TRACED_STEPS, 8
    xs = rng.standard_normal((tau, 8, r))

    def cell(p: dict, h: Any, x: Any) -> Any:  # one sample's vectors
        return torch.tanh(p["W"] @ h + p["U"] @ x)

    net = Recurrence(cell, p, state_size=8, input_size=8)
    start = time.perf_counter()
    ours = net.forward(xs).z[1]
    took = time.perf_counter() - start
    P, loop = {k: torch.tensor(v) for k, v in p.items()}, np.empty_like(ours)
    start = time.perf_counter()
    with torch.no_grad():
        for i in range(r):  # the loop a user writes for a one-sample cell
            h = torch.zeros(8, dtype=torch.float64)
            for s in range(tau):
                h = cell(P, h, torch.tensor(xs[s, :, i]))
                loop[s, :, i] = h.numpy()
    theirs = time.perf_counter() - start
    print(f"Your own cell, written for one sample (tanh(W h + U x)): pp.Recurrence runs "
          f"{tau} steps of {r} samples as one graph of its batched operations, recorded "
          f"once (torch.fx's make_fx, its first step checked against vmap's): "
          f"{1e6 * took / tau:.0f} us a step, recording included, against "
          f"{1e6 * theirs / tau:.0f} us for the loop over samples and steps; largest "
          f"difference {np.abs(ours - loop).max():.0e}.\n")


def trust() -> None:
    """The demo's accuracy and memory checks: what CONVERGED means, and N/A before OOM."""
    net = FNN.random([16] * 21, activation="sigmoid", seed=0)
    rng = np.random.default_rng(1)
    x, t = rng.standard_normal((16, 4)), rng.standard_normal((16, 4))
    exact = backprop(net, x, t)
    ratio = np.linalg.norm(exact.W[0]) / np.linalg.norm(exact.W[-1])
    print(f"Vanishing gradients: 20 sigmoid layers of width 16, batch 4; the first layer's "
          f"gradient is {ratio:.0e} of the last one's. CONVERGED means every layer meets "
          "rtol = 1e-10 relative to its own size; errors are relative to substitution.\n")
    print("| method | status | iterations | worst layer error | first layer error |\n"
          "|---|---|---:|---:|---:|")
    import scipy.sparse.linalg

    for name in ("jacobi", "bicgstab", "batched-gmres", "scipy.gmres", "pyamg.gmres",
                 scipy.sparse.linalg.gcrotmk, "scipy.bicgstab"):
        g = backprop(net, x, t, method=name, check=False)
        errors = [np.linalg.norm(a - b) / np.linalg.norm(b) for a, b in zip(g.W, exact.W)]
        shown = name if isinstance(name, str) else "scipy.sparse.linalg.gcrotmk (the function)"
        print(f"| {shown} | {g.solution.status.name} | {g.solution.iterations} | "
              f"{max(errors):.1e} | {errors[0]:.1e} |")
    _nothing_unchecked(net, x, t)
    rnn = RNN.random([256] * 7, activation="tanh", seed=0)
    trace = rnn.forward(rng.standard_normal((100, 256, 32)))
    try:  # 16 GiB at most: never attempted, even where more memory is available
        with memory.limit(min(memory.budget(), 2**34)):
            solvers.solve(backward_system(rnn, trace, trace.output), "cyclic-reduction")
    except MemoryBudgetError as error:
        print(f"\nMemory guard: cyclic-reduction on a 6-layer width-256 tanh RNN over 100 "
              f"steps, batch 32 (propop run --network rnn), would need about "
              f"{error.estimate / 2**30:.0f} GiB; it raised MemoryBudgetError before "
              f"allocating (budget {error.budget / 2**30:.1f} GiB), and propop run marks it "
              "N/A.")
    _chunks()


def _chunks() -> None:
    """A per-sample batch over a small budget: the error's ``chunk_size``, then that run."""
    net = FNN.random([32] * 257, activation="tanh", seed=0)
    rng = np.random.default_rng(2)
    system = backward_system(net, net.forward(rng.standard_normal((32, 32))),
                             rng.standard_normal((32, 32)))
    with memory.limit(2**24):
        try:
            solvers.solve(system, "cyclic-reduction")
        except MemoryBudgetError as error:
            chunk = error.advice["chunk_size"]
            solution = solvers.solve(system, "cyclic-reduction", chunk_size=chunk)
            exact = solvers.solve(system, "substitution").x
            print(f"Per-sample blocks: cyclic reduction of 32 samples through 256 layers of "
                  f"width 32 would need {error.estimate / 2**20:.0f} MiB, over a 16 MiB "
                  f"budget; the error proposes chunk_size={chunk}, which runs in "
                  f"{solution.info['peak_bytes'] / 2**20:.0f} MiB, {solution.status.name}, "
                  f"{np.linalg.norm(solution.x - exact) / np.linalg.norm(exact):.0e} from "
                  "substitution.\n")


def _nothing_unchecked(net: FNN, x: Any, t: Any) -> None:
    """Weights updated in place, a method that lies, an approximate system: none slips by."""
    W = [Wk.copy() for Wk in net.W]
    net = FNN(W, net.b, net.activations)
    backprop(net, x, t, method="cyclic-reduction")
    g = backprop(net, x, t)
    for Wk, dW in zip(W, g.W):  # a hand-written SGD step, in place
        Wk -= 0.5 * dW
    fresh = backprop(FNN([Wk.copy() for Wk in W], net.b, net.activations), x, t)
    again = backprop(net, x, t, method="cyclic-reduction")
    drift = max(float(np.abs(a - b).max()) for a, b in zip(again.W, fresh.W))
    B = backward_system(net, net.forward(x), net.loss_gradient(net.forward(x), t))
    lie = solvers.solve(B, lambda s, **o: Solution(x=0 * s.rhs, status=Status.CONVERGED))
    mean = solvers.solve(B.shared("mean"), "substitution")
    print(f"\nNothing unchecked: after an in-place SGD step (W[k] -= lr * dW) the next "
          f"gradients equal a fresh network's to {drift:.0e}; a method that returns zeros "
          f"and claims CONVERGED is judged {lie.status.name} by its true residual; the "
          f"batch-mean system B.shared('mean') solves {mean.status.name}: its worst layer "
          f"misses the true system's bound {mean.info['true_block_ratio']:.0e} times.")


DEMO_TRAINING = (("substitution", None, 1.0), ("cyclic-reduction", None, 1.0),
                 ("jacobi", 1, 1.0), ("jacobi", 3, 1.0), ("jacobi", 6, 1.0),
                 ("batched-gmres", 3, 1.0), ("substitution", None, 0.1),
                 ("cyclic-reduction", None, 0.1))
QUICK_TRAINING = (("substitution", None, 1.0), ("cyclic-reduction", None, 1.0),
                  ("jacobi", 1, 1.0), ("jacobi", 6, 1.0))


def training(runs: Sequence[tuple] = DEMO_TRAINING, epochs: int = 4) -> None:
    """The demo's training table: exact, truncated and pruned runs on the digits.

    ``runs`` holds ``(method, maxiter, density)``: ``maxiter=None`` solves exactly,
    ``density < 1`` prunes by magnitude in ``epochs`` stages of one epoch.
    """
    from ..data import digits
    from ..sparsity import density_of, prune_gradually
    from ..training import train

    try:
        xtr, ytr, xte, yte = digits()
    except ImportError as error:
        print(f"Training on the digits skipped: {error}\n")
        return
    base = FNN.random([64] + [32] * 5 + [10], activation="tanh", seed=0)
    net = FNN(base.W, base.b, activation=["tanh"] * 5 + ["identity"])
    print(f"Training a 6-layer tanh MLP (64-32x5-10) on the digits, {epochs} epochs of SGD "
          f"(lr 0.2, batch 32) with each backward method"
          + (f"; density 0.1: magnitude pruning in {epochs} stages of one epoch (cubic "
             "schedule)" if any(d < 1 for _, _, d in runs) else "")
          + "; seconds: the whole run, with the exact reference solves that measure a "
          "truncated run's gradient error.\n")
    print("| backward method | maxiter | density | test accuracy | mean gradient error "
          "| seconds |\n|---|---:|---:|---:|---:|---:|")
    for method, maxiter, density in runs:
        options = dict(batch_size=32, lr=0.2, method=method, x_test=xte, y_test=yte,
                       solver_options={} if maxiter is None else {"maxiter": maxiter},
                       gradient_error=maxiter is not None, progress="auto")
        start = time.perf_counter()
        if density < 1:
            model, histories = prune_gradually(net, xtr, ytr, density, epochs, 1, **options)
        else:
            model, histories = train(net, xtr, ytr, epochs=epochs, **options)
            histories = [histories]
        errors = [s["gradient_error"] for h in histories for s in h.steps
                  if "gradient_error" in s] or [0.0]
        label = "exact" if maxiter is None else maxiter
        print(f"| {method} | {label} | {density_of(model):.2f} | "
              f"{histories[-1].epochs[-1]['test_accuracy']:.3f} | {np.mean(errors):.1e} | "
              f"{time.perf_counter() - start:.2f} |")
    print("\nk < l Jacobi sweeps give the top k layers' errors exactly and none below; "
          "l = 6 sweeps are exact for every weight.\n")


def plans() -> None:
    """Plan once, solve many: every method's matrix work in ``init``, done once."""
    from ..solvers.plan import prepare

    rnn = RNN.random([8, 16, 16], activation="tanh", seed=0)
    xs = np.random.default_rng(1).standard_normal((100, 8, 4))
    B = backward_system(rnn, rnn.forward(xs), np.ones((100, 16, 4)))
    rng = np.random.default_rng(2)
    rhs = [rng.standard_normal(B.rhs.shape) for _ in range(20)]
    print("Plan once, solve many: 20 right-hand sides of one 2-layer tanh RNN system (100 "
          "steps, width 16, batch 4). prepare() does a method's matrix work once (reduced "
          "blocks, preconditioners, library operators); each solve does the rest.\n")
    print("| method | prepare (s) | 20 plan.solve (s) | 20 pp.solve (s) | all converged |\n"
          "|---|---|---|---|---|")
    for name, options in (("cyclic-reduction", {}),
                          ("cyclic-reduction", {"within": "substitution"}),
                          ("scipy.spsolve_triangular", {})):
        solvers.info(name)  # its module imported before the clock starts
        start = time.perf_counter()
        plan = prepare(B, name, **options)
        prepared = time.perf_counter() - start
        start = time.perf_counter()
        planned = [plan.solve(c) for c in rhs]
        through_plan = time.perf_counter() - start
        start = time.perf_counter()
        for c in rhs:
            solve(B.with_rhs(c), name, **options)
        each = time.perf_counter() - start
        ok = all(s.converged for s in planned)
        label = name + "".join(f", {k}={v!r}" for k, v in options.items())
        print(f"| {label} | {prepared:.3f} | {through_plan:.3f} | {each:.3f} | {ok} |")
    print("\n(pp.solve on B.with_rhs(c) reuses what the operator keeps, its explicit matrix "
          "for one; a method's state, the reduced blocks for one, is the plan's.)\n")


def _table(table: Table) -> None:
    """One opening table, then the sentence that reads it."""
    rows = report(table.settings)
    why = table.why({row.method: row for row in rows})
    if why:
        print(f"{why}\n")


def sections(full: bool = False) -> list[tuple[str, Callable[[], None]]]:
    """The demo's sections in order, ``(title, function)``; ``full`` runs the long tables."""
    tables = [(t.title, functools.partial(_table, t)) for t in (FULL if full else QUICK)]
    learn = functools.partial(training, DEMO_TRAINING, 4) if full else functools.partial(
        training, QUICK_TRAINING, 2)
    return tables + [
        ("One storage for every network", storage),
        ("Plan once, solve many", plans),
        ("method='auto'", auto),
        ("PyTorch tensors, one code path", backends),
        ("PyTorch in the loop", torch_loop),
        ("Your own models, and the Newton family", models),
        ("What CONVERGED means, and why nothing slips by", trust),
        ("Training on the digits", learn),
    ]


def run(full: bool = False) -> None:
    """``propop demo``: each section announced as it starts and timed as it ends."""
    chosen = sections(full)
    start = time.perf_counter()
    for k, (title, show) in enumerate(chosen, start=1):
        print(f"[{k}/{len(chosen)}] {title}\n", flush=True)
        began = time.perf_counter()
        show()
        print(f"[{k}/{len(chosen)}] done in {time.perf_counter() - began:.1f} s\n", flush=True)
    print(f"propop demo{' --full' if full else ''}: {len(chosen)} sections in "
          f"{time.perf_counter() - start:.1f} s"
          + ("" if full else "; propop demo --full runs every registered method on four "
             "networks (minutes)") + ".")
