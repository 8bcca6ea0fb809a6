"""PyTorch interoperation (optional: torch): modules in, weights back out.

:func:`from_torch` turns a module into a propop network: ``nn.RNN`` into an
:class:`~propop.RNN`; anything else is traced (:mod:`propop.interop.torch_trace`, with
``torch.fx``) into a :class:`~propop.Graph` whose nodes carry the traced names,
so ``g.parameters["0"]["W"]`` is the gradient of ``module[0].weight``.
:func:`state_dict` gives a network's parameters back under PyTorch's names, for
``module.load_state_dict(pp.state_dict(net), strict=False)``.

Weights are copied as float64 NumPy arrays. Imported graphs take inputs
flattened in PyTorch's C order ``(channels, height, width)`` with samples as
columns: ``x.reshape(r, -1).T``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from .. import backend
from ..networks.gated import GRU, LSTM
from ..networks.recurrence import Recurrence
from ..networks.rnn import RNN
from .torch_trace import to_numpy, trace

__all__ = ["from_torch", "state_dict", "Residual"]


class Residual(nn.Module):
    """``x + body(x)``: a residual block (any module that computes this traces the same)."""

    def __init__(self, body: nn.Module) -> None:
        super().__init__()
        self.body = body

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x + body(x)``."""
        return x + self.body(x)


def from_torch(module: nn.Module, input_shape: Sequence[int] | None = None) -> Any:
    """A propop network with ``module``'s weights: a Graph, RNN, GRU or LSTM.

    Parameters
    ----------
    module : torch.nn.Module
        Any module whose traced operations :mod:`propop.interop.torch_trace` supports
        (``BatchNorm`` and ``Dropout`` in evaluation mode: call ``module.eval()``),
        or an ``nn.RNN``, ``nn.GRU`` or ``nn.LSTM`` (unidirectional).
    input_shape : sequence of int, optional
        The shape of one input sample, ``(C, H, W)`` or ``(C, L)``; needed unless
        the module starts with ``nn.Linear`` (then its input size).

    Returns
    -------
    Graph, RNN, GRU or LSTM
        A graph's ``origins[node]`` says which module's parameters a node holds.
    """
    _refuse_hooks(module)
    if isinstance(module, nn.RNNBase) and module.training and module.dropout > 0 and \
            module.num_layers > 1:
        raise ValueError(f"from_torch: {type(module).__name__}(dropout={module.dropout}) in "
                         "training mode drops out between layers at random, which a propop "
                         "network does not; call module.eval() first (no dropout), or import "
                         "one with dropout=0")
    if isinstance(module, nn.RNN):
        return _rnn(module)
    if isinstance(module, (nn.GRU, nn.LSTM)):
        return (GRU if isinstance(module, nn.GRU) else LSTM).from_torch(module)
    if isinstance(module, nn.RNNBase):
        raise ValueError(f"from_torch: {type(module).__name__} is not supported; nn.RNN, "
                         "nn.GRU and nn.LSTM are")
    shape = tuple(int(n) for n in input_shape) if input_shape is not None \
        else _first_linear_input(module)
    dtype = next((p.dtype for p in module.parameters()), torch.float64)
    example = torch.randn((2,) + shape, dtype=dtype, generator=torch.Generator().manual_seed(0))
    graph, origins = trace(module, example)
    graph.origins = origins
    return graph


def state_dict(network: Any) -> OrderedDict:
    """The network's parameters as float64 tensors under the PyTorch module's names.

    For a network from :func:`from_torch`: ``module.load_state_dict(pp.state_dict(net),
    strict=False)`` writes them back (buffers such as ``BatchNorm``'s running
    statistics are not parameters here and stay as they are). An RNN's bias goes
    to ``bias_ih_l{k}`` and ``bias_hh_l{k}`` becomes zero: the same sums.
    """
    out: OrderedDict = OrderedDict()
    if isinstance(network, Recurrence):  # GRU, LSTM: PyTorch's names already
        return OrderedDict((k, _tensor(v)) for k, v in network.parameters.items())
    if isinstance(network, RNN):
        for k, (W, U, b) in enumerate(zip(network.W, network.U, network.b)):
            out[f"weight_ih_l{k}"], out[f"weight_hh_l{k}"] = _tensor(W), _tensor(U)
            out[f"bias_ih_l{k}"], out[f"bias_hh_l{k}"] = _tensor(b), torch.zeros(len(b),
                                                                               dtype=torch.float64)
        return out
    origins = getattr(network, "origins", None)
    if origins is None:
        raise ValueError("state_dict needs a network made by from_torch (it names the module "
                         "each parameter came from)")
    names, ties = network.parameter_names(), network.ties()
    for (node, ours), name in names.items():
        if ties[(node, ours)] == (node, ours):  # a tied parameter once, by its first name
            out[name] = _tensor(network.layers[node].parameters()[ours])
    return out


def _tensor(a: Any) -> torch.Tensor:
    """A parameter of any backend (sparse, on a device) as a float64 tensor on the host."""
    return torch.tensor(backend.to_host(backend.dense(a)), dtype=torch.float64)


def _refuse_hooks(module: nn.Module) -> None:
    """Tracing does not run hooks: a module with some would import as something else."""
    for path, sub in module.named_modules():
        if sub._forward_hooks or sub._forward_pre_hooks:
            raise ValueError(f"{type(sub).__name__} at {path or 'the top'} has forward hooks, "
                             "which may change what it computes: remove them before from_torch")


def _first_linear_input(module: nn.Module) -> tuple:
    """The input size of the first ``nn.Linear``, unless a convolution or pool comes first.

    A guess from the modules' registration order (their order in an ``nn.Sequential``),
    which tracing checks by running the module on it.
    """
    for m in module.modules():
        if isinstance(m, nn.Linear):
            return (m.in_features,)
        if isinstance(m, (nn.Conv1d, nn.Conv2d, nn.AvgPool1d, nn.AvgPool2d, nn.MaxPool1d,
                          nn.MaxPool2d, nn.BatchNorm1d, nn.BatchNorm2d)):
            break
    raise ValueError(f"input_shape is needed: {type(module).__name__} does not start with "
                     "nn.Linear")


def _rnn(module: nn.RNN) -> RNN:
    if module.bidirectional:
        raise ValueError("nn.RNN: bidirectional RNNs are not supported")
    layers = range(module.num_layers)
    W = [to_numpy(getattr(module, f"weight_ih_l{k}")) for k in layers]
    U = [to_numpy(getattr(module, f"weight_hh_l{k}")) for k in layers]
    if module.bias:
        b = [to_numpy(getattr(module, f"bias_ih_l{k}")) + to_numpy(getattr(module, f"bias_hh_l{k}"))
             for k in layers]
    else:
        b = [np.zeros(module.hidden_size) for _ in layers]
    return RNN(W, U, b, activation=module.nonlinearity)
