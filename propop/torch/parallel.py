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

The graph computes in float64 NumPy arrays on the host, where every registered
method (SciPy's and PyAMG's included) and sparse convolution Jacobians work:
float32 and CUDA tensors are taken there and their results brought back (a copy
per call). A graph moved with ``Graph.to("torch", device)`` computes on the device
itself, outside this wrapper.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ..interop.torch_import import from_torch
from ..newton.loop import forward as newton_forward
from ..solvers.plan import prepare, solve
from ..solvers.registry import info
from ..systems.builders import backward_system

__all__ = ["parallelize", "FORWARDS"]

FORWARDS = ("sequential", "newton", "secant")
_TRAINING_ONLY = (torch.nn.modules.batchnorm._BatchNorm, torch.nn.Dropout, torch.nn.Dropout1d,
                  torch.nn.Dropout2d)


def parallelize(module: torch.nn.Module, *, method: str = "auto", forward: str = "sequential",
                example_input: Any = None, input_shape: Sequence[int] | None = None,
                rtol: float | None = None, **options: Any) -> torch.nn.Module:
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
    **options
        The method's own options.

    Returns
    -------
    torch.nn.Module
        The module itself, sharing every parameter and submodule, whose calls run
        through propop; ``.propop`` holds the graph and the last call's solution.
    """
    if forward not in FORWARDS:
        raise ValueError(f"forward must be one of {FORWARDS}, got {forward!r}")
    info(method)  # an unknown method is named now
    if example_input is not None and input_shape is None:
        input_shape = tuple(example_input.shape[1:])
    graph = from_torch(module, input_shape)
    if len(graph.outputs) != 1:
        raise ValueError(f"parallelize takes a module with one output; this one has "
                         f"{len(graph.outputs)} ({', '.join(graph.outputs)})")
    if example_input is not None:  # the method and its options, checked on this graph now
        columns = example_input.detach().reshape(example_input.shape[0], -1).T
        trace = graph.forward(columns.double().cpu().numpy())
        eps = np.ones_like(graph.output_values(trace)[0])
        prepare(backward_system(graph, trace, [eps]), method, rtol=rtol, **options)
    wrapped = copy.copy(module)  # the same parameters, buffers and submodules: shared
    wrapped.__class__ = type(f"Parallel{type(module).__name__}", (_Parallelized, type(module)),
                             {})
    wrapped.propop = _State(graph, method, forward, rtol, options,
                            _input_shape(graph, input_shape))
    return wrapped


class _State:
    """What a parallelized module keeps: the graph, the choices, the last call's facts."""

    def __init__(self, graph: Any, method: str, forward: str, rtol: float | None,
                 options: dict, input_shape: tuple) -> None:
        self.graph, self.method, self.forward, self.rtol = graph, method, forward, rtol
        self.options, self.input_shape = options, input_shape
        self.names = graph.parameter_names()
        self.last: dict = {}


def _input_shape(graph: Any, shape: Sequence[int] | None) -> tuple:
    return tuple(shape) if shape is not None else (graph.input_size,)


class _Parallelized:
    """The forward of a parallelized module (mixed in before the module's own class)."""

    propop: _State

    def forward(self, x: Any) -> Any:
        """The module's output for ``x`` ``(N, *shape)``, computed and differentiated by propop."""
        state = self.propop
        if tuple(x.shape[1:]) != state.input_shape:
            raise ValueError(f"input has shape {tuple(x.shape)}, expected (N, "
                             f"{', '.join(map(str, state.input_shape))}) as at wrap time")
        for path, sub in self.named_modules():
            if isinstance(sub, _TRAINING_ONLY) and sub.training:
                raise ValueError(f"{type(sub).__name__} at {path or 'the top'} is in training "
                                 "mode, which the imported graph does not compute (it takes "
                                 "running statistics, no dropout): call .eval() on the module")
        names = [name for name, _ in self.named_parameters()]
        return _Graph.apply(state, names, x, *[p for _, p in self.named_parameters()])


class _Graph(torch.autograd.Function):
    """The graph's output from the current parameters; the backward by propop's solve."""

    @staticmethod
    def forward(ctx: Any, state: _State, names: list, x: Any, *parameters: Any) -> Any:
        graph = state.graph
        _load(state, dict(zip(names, parameters)))
        columns = x.detach().reshape(x.shape[0], -1).T.double().cpu().numpy()
        if state.forward == "sequential":
            trace = graph.forward(columns)
        else:
            trace = newton_forward(graph, columns, method=state.method,
                                   linearization=state.forward, rtol=state.rtol,
                                   **state.options)
            state.last["forward"] = trace.info
        ctx.state, ctx.names, ctx.trace, ctx.x = state, names, trace, (x.shape, x.dtype,
                                                                      x.device)
        output = graph.output_values(trace)[0]
        return torch.as_tensor(np.ascontiguousarray(output.T), dtype=x.dtype, device=x.device)

    @staticmethod
    def backward(ctx: Any, grad_output: Any) -> tuple:
        state, trace = ctx.state, ctx.trace
        graph = state.graph
        eps = grad_output.detach().reshape(grad_output.shape[0], -1).T.double().cpu().numpy()
        system = backward_system(graph, trace, [eps])
        solution = solve(system, state.method, rtol=state.rtol, **state.options)
        state.last["backward"] = solution
        gradients = graph.gradients(trace, graph.unstack(system, solution.x))
        by_name = dict(gradients.named_parameters())
        shape, dtype, device = ctx.x

        def tensor(a: Any) -> Any:
            return torch.as_tensor(np.ascontiguousarray(a), dtype=dtype, device=device)

        grads = [None if by_name.get(name) is None else tensor(by_name[name])
                 for name in ctx.names]
        return (None, None, tensor(gradients.x.T).reshape(shape), *grads)


def _load(state: _State, parameters: dict) -> None:
    """Write the module's current parameters into the graph, in place (ties stay tied)."""
    graph, done = state.graph, set()
    for (node, ours), name in state.names.items():
        target = graph.layers[node].parameters()[ours]
        if id(target) in done:
            continue
        value = parameters[name].detach().double().cpu().numpy()
        np.copyto(target, value.reshape(target.shape))
        done.add(id(target))
