"""``parallelize(module)``: any traceable module whose backward is propop's solve.

The module is imported once, at wrap time, by :func:`propop.from_torch` (``torch.fx``
tracing; what cannot be traced is refused there, naming the node and its source
line) into a :class:`~propop.Graph`. The returned module is the original one (the
same parameters, names, ``state_dict`` and submodules, shared, not copied) with
its ``forward`` replaced: each call writes the module's current parameters into
the graph (so an optimiser's steps are seen), computes the output by the graph's
sequential pass or a Newton-family forward (``forward=``), and, inside a
``torch.autograd.Function``, backpropagates by propop's solve of the backward
system (``method=``): ``loss.backward()`` fills the parameters' ``.grad`` under
their own names, so ``torch.optim``, clipping and hooks work unchanged.

By default (``backend="numpy"``) the graph computes in float64 NumPy arrays on
the host, where every registered method (SciPy's and PyAMG's included) and sparse
convolution Jacobians work: float32 and CUDA tensors are taken there and their
results brought back (a copy per call). With ``backend="torch"`` the graph's values
are float64 tensors on the inputs' device (:meth:`propop.Graph.to`, moved once per
device) and the passes, the solve and the gradients run there with propop's native
methods: nothing goes to the host but the layers' structure, made there once, and
a convolution's kernel, read there to fill its sparse Jacobian (a CSR tensor,
:mod:`propop.torch_sparse`), at every call.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch.autograd.function import once_differentiable

from ..backend import of as backend_of
from ..interop.torch_import import from_torch
from ..interop.torch_trace import drops_out
from ..networks.graph_fnn import GraphFNN, as_fnn
from ..newton.loop import forward as newton_forward
from ..solvers.plan import prepare, solve
from ..solvers.registry import available, info
from ..systems.builders import backward_system

__all__ = ["parallelize", "FORWARDS", "BACKENDS"]

FORWARDS = ("sequential", "newton", "secant")
BACKENDS = ("numpy", "torch")


def parallelize(module: torch.nn.Module, *, method: str = "auto", forward: str = "sequential",
                example_input: Any = None, input_shape: Sequence[int] | None = None,
                rtol: float | None = None, backend: str = "numpy",
                **options: Any) -> torch.nn.Module:
    """``module`` with propop's backward (and optionally its parallel forward).

    Parameters
    ----------
    module : torch.nn.Module
        Any module :func:`propop.from_torch` traces (BatchNorm and Dropout in
        evaluation mode: call ``module.eval()`` first).
    method : str
        The registered method of the backward solve (and of a parallel forward's).
    forward : {"sequential", "newton", "secant"}
        The graph's sequential pass, or Newton's method on the whole network
        (``"newton"``) or the paper's secant iteration, each step solved by ``method``.
    example_input : torch.Tensor, optional
        A batch of inputs, ``(N, *shape)``: its shape gives ``input_shape``, and
        the method and its options are checked on its backward system at once
        (a method that does not apply is refused here, not at the first backward).
    input_shape : sequence of int, optional
        One sample's shape, where the module does not start with ``nn.Linear``.
    rtol : float, optional
        Tolerance of the solves (default: propop's, ``1e-10`` in float64).
    backend : {"numpy", "torch"}
        Where the graph computes: float64 NumPy on the host (every registered
        method), or float64 tensors on the inputs' device (propop's native methods).
    **options
        The method's own options.

    Returns
    -------
    torch.nn.Module
        The module itself, sharing every parameter and submodule, whose calls run
        through propop; ``.propop`` holds the graph and the last call's solution.
        First derivatives only: the backward is ``once_differentiable``, so a second
        derivative through it (``create_graph=True``) raises PyTorch's error.
    """
    if forward not in FORWARDS:
        raise ValueError(f"forward must be one of {FORWARDS}, got {forward!r}")
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend not in info(method).backends:  # an unknown method is named here too
        here = [s.name for s in available() if backend in s.backends]
        raise ValueError(f"method {method!r} does not run on {backend} arrays; with "
                         f"backend={backend!r} use one of {', '.join(here)}")
    if example_input is not None and input_shape is None:
        input_shape = tuple(example_input.shape[1:])
    graph = from_torch(module, input_shape)
    if len(graph.outputs) != 1:
        raise ValueError(f"parallelize takes a module with one output; this one has "
                         f"{len(graph.outputs)} ({', '.join(graph.outputs)})")
    state = _State(graph, method, forward, rtol, options, _input_shape(graph, input_shape),
                   backend)
    if example_input is not None:  # the method and its options, checked on this graph now
        on = state.net_on(example_input.device)
        trace = _network(on).forward(state.columns(example_input))
        output = on.output_values(trace)[0]
        eps = backend_of(output).xp.ones_like(output)
        prepare(_backward_system(on, trace, eps), method, rtol=rtol, **options)
    wrapped = copy.copy(module)  # the same parameters, buffers and submodules: shared
    wrapped.__class__ = type(f"Parallel{type(module).__name__}", (_Parallelized, type(module)),
                             {})
    wrapped.propop = state
    return wrapped


class _State:
    """What a parallelized module keeps: the graph, the choices, the last call's facts."""

    def __init__(self, graph: Any, method: str, forward: str, rtol: float | None,
                 options: dict, input_shape: tuple, backend: str) -> None:
        self.graph, self.method, self.forward, self.rtol = graph, method, forward, rtol
        self.options, self.input_shape, self.backend = options, input_shape, backend
        self.names = graph.parameter_names()
        self.last: dict = {}
        self._moved: dict = {}  # device -> the graph on it (backend="torch")
        self._nets: dict = {}  # device -> what computes there (net_on)

    def graph_on(self, device: Any) -> Any:
        """The graph that computes for inputs on ``device``: the host's, or moved there."""
        if self.backend == "numpy":
            return self.graph
        key = str(device)
        if key not in self._moved:
            self._moved[key] = self.graph.to("torch", device)
        return self._moved[key]

    def net_on(self, device: Any) -> Any:
        """What computes for inputs on ``device``: the FNN the graph is, else the graph.

        A chain of dense layers and activations (an ``nn.Sequential`` MLP) is computed
        as the :class:`~propop.FNN` it is (:func:`~propop.networks.graph_fnn.as_fnn`, on
        the graph's own arrays): half the blocks, and no identity couplings built per
        call. Found once per device, and anew if the graph rebinds a parameter.
        """
        key = str(device) if self.backend == "torch" else "host"
        net = self._nets.get(key)
        if net is None or isinstance(net, GraphFNN):  # found, or checked to be current
            graph = self.graph_on(device)
            net = self._nets[key] = (as_fnn(graph) if net is None else net.current()) or graph
        return net

    def columns(self, x: Any) -> Any:
        """A batch of tensors ``(N, *shape)`` as the graph's float64 columns ``(n, N)``."""
        columns = x.detach().reshape(x.shape[0], -1).T.double()
        return columns.cpu().numpy() if self.backend == "numpy" else columns


def _input_shape(graph: Any, shape: Sequence[int] | None) -> tuple:
    return tuple(shape) if shape is not None else (graph.input_size,)


class _Parallelized:
    """The forward of a parallelized module (mixed in before the module's own class)."""

    propop: _State

    def forward(self, x: Any) -> Any:
        """The module's output for ``x`` ``(N, *shape)``, computed and differentiated by propop."""
        state = self.propop
        if tuple(x.shape[1:]) != state.input_shape or x.shape[0] == 0:
            raise ValueError(f"input has shape {tuple(x.shape)}, expected (N, "
                             f"{', '.join(map(str, state.input_shape))}) as at wrap time, "
                             "N >= 1")
        if not x.is_floating_point():  # the output is returned in the input's dtype
            raise TypeError(f"input has dtype {x.dtype}; pass floating-point inputs (the "
                            "output takes the input's dtype)")
        for path, sub in self.named_modules():
            if drops_out(sub) or (sub.training and
                                  isinstance(sub, torch.nn.modules.batchnorm._BatchNorm)):
                raise ValueError(f"{type(sub).__name__} at {path or 'the top'} is in training "
                                 "mode, which the imported graph does not compute (it takes "
                                 "running statistics, no dropout): call .eval() on the module")
        named = list(self.named_parameters())  # one walk of the module tree
        return _Graph.apply(state, [name for name, _ in named], x, *[p for _, p in named])


class _Graph(torch.autograd.Function):
    """The graph's output from the current parameters; the backward by propop's solve."""

    @staticmethod
    def forward(ctx: Any, state: _State, names: list, x: Any, *parameters: Any) -> Any:
        _load(state, state.graph_on(x.device), dict(zip(names, parameters)))
        net = state.net_on(x.device)
        columns = state.columns(x)
        if state.forward == "sequential":
            trace = _network(net).forward(columns)
        else:
            trace = newton_forward(_network(net), columns, method=state.method,
                                   linearization=state.forward, rtol=state.rtol,
                                   **state.options)
            state.last["forward"] = trace.info
        ctx.state, ctx.names, ctx.trace, ctx.x = state, names, trace, (x.shape, x.dtype,
                                                                      x.device)
        out = _rows(net.output_values(trace)[0], x.dtype, x.device)
        return out.reshape((x.shape[0], *state.graph.output_shapes[0]))  # the module's shape

    @staticmethod
    @once_differentiable  # propop's solve is not differentiated again: said so, by PyTorch
    def backward(ctx: Any, grad_output: Any) -> tuple:
        state, trace = ctx.state, ctx.trace
        net = state.net_on(grad_output.device)
        system = _backward_system(net, trace, state.columns(grad_output))
        solution = solve(system, state.method, rtol=state.rtol, **state.options)
        state.last["backward"] = solution
        gradients = net.gradients(trace, _network(net).unstack(system, solution.x))
        by_name = dict(gradients.named_parameters())
        shape, dtype, device = ctx.x
        grads = [None if by_name.get(name) is None else
                 torch.as_tensor(by_name[name], device=device).to(dtype) for name in ctx.names]
        return (None, None, _rows(gradients.x, dtype, device).reshape(shape), *grads)


def _network(net: Any) -> Any:
    """The network that computes: the FNN of a :class:`GraphFNN`, else the graph itself."""
    return net.net if isinstance(net, GraphFNN) else net


def _backward_system(net: Any, trace: Any, eps: Any) -> Any:
    """The backward system of the graph's one output's ``eps`` (the FNN's, for a chain)."""
    return backward_system(_network(net), trace, eps if isinstance(net, GraphFNN) else [eps])


def _rows(columns: Any, dtype: Any, device: Any) -> Any:
    """The graph's columns ``(n, N)`` (NumPy or a tensor) as PyTorch's rows ``(N, n)``."""
    return torch.as_tensor(columns, device=device).T.to(dtype).contiguous()


def _load(state: _State, graph: Any, parameters: dict) -> None:
    """Write the module's current parameters into ``graph``, in place (ties stay tied)."""
    done = set()
    for (node, ours), name in state.names.items():
        target = graph.layers[node].parameters()[ours]
        if id(target) in done:
            continue
        value = parameters[name].detach()
        if isinstance(target, torch.Tensor):
            target.copy_(value.reshape(target.shape))  # to its dtype, on its device
        else:
            np.copyto(target, value.double().cpu().numpy().reshape(target.shape))
        done.add(id(target))
