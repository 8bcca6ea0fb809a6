"""PyTorch import: :func:`from_torch` turns a module into a propop network (optional: torch).

Supported: ``nn.Sequential`` (nested too) of ``Linear``, ``Conv1d``, ``Conv2d``,
``AvgPool2d``, ``MaxPool2d`` (non-overlapping), ``Flatten``, the activations propop
has (``ReLU``, ``LeakyReLU(0.01)``, ``Tanh``, ``Sigmoid``, ``ELU(1.0)``,
``GELU(approximate="tanh")``, ``Identity``), and :class:`Residual` blocks
(``x + body(x)``); and ``nn.RNN`` (tanh or relu, unidirectional). Weights are copied
as float64 NumPy arrays; anything else is named in a ``ValueError``.

Imported graphs take inputs flattened in PyTorch's C order ``(channels, height,
width)`` with samples as columns: ``x.reshape(r, -1).T``. Nodes carry the torch
module's qualified name, so ``g.parameters["0"]["W"]`` is the gradient of
``module[0].weight``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from . import layers as L
from .networks.graph import Graph
from .networks.rnn import RNN

__all__ = ["from_torch", "Residual"]


class Residual(nn.Module):
    """``x + body(x)``: the residual block :func:`from_torch` recognises."""

    def __init__(self, body: nn.Module) -> None:
        super().__init__()
        self.body = body

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x + body(x)``."""
        return x + self.body(x)


ACTIVATIONS = {nn.ReLU: "relu", nn.Tanh: "tanh", nn.Sigmoid: "sigmoid", nn.Identity: "identity",
               nn.ELU: "elu", nn.LeakyReLU: "leaky_relu", nn.GELU: "gelu"}


def from_torch(module: nn.Module, input_shape: Sequence[int] | None = None) -> Graph | RNN:
    """A :class:`~propop.Graph` (or :class:`~propop.RNN`) with ``module``'s weights.

    Parameters
    ----------
    module : torch.nn.Module
        ``nn.Sequential``, :class:`Residual`, a single supported layer, or ``nn.RNN``.
    input_shape : sequence of int, optional
        The shape of one input sample, ``(C, H, W)`` or ``(C, L)``; needed when the
        first layer is a convolution or pooling, else the ``Linear``'s input size.
    """
    _require_plain(module, "")
    if isinstance(module, nn.RNN):
        return _rnn(module)
    shape = tuple(input_shape) if input_shape is not None else _first_linear_input(module)
    graph = Graph(int(np.prod(shape)))
    _add(graph, module, "input", shape, "")
    return graph


def _numpy(t: torch.Tensor | None) -> Any:
    return None if t is None else t.detach().to(torch.float64).cpu().numpy().copy()


def _first_linear_input(module: nn.Module) -> tuple:
    for m in module.modules():
        if isinstance(m, nn.Linear):
            return (m.in_features,)
        if isinstance(m, (nn.Conv1d, nn.Conv2d, nn.AvgPool2d, nn.MaxPool2d)):
            break
    raise ValueError(f"input_shape is needed: {type(module).__name__} does not start with "
                     "nn.Linear")


def _add(graph: Graph, module: nn.Module, source: str, shape: tuple, path: str
         ) -> tuple[str, tuple]:
    """Add ``module`` (qualified name ``path``) reading node ``source`` of ``shape``.

    Nodes are named by the torch module's qualified name (``"0"``, ``"1.body.0"``),
    a residual sum by its block's name plus ``".add"``. Returns the last node and
    its shape.
    """
    def child(name: str) -> str:
        return f"{path}.{name}" if path else name

    _require_plain(module, path)
    if isinstance(module, nn.Sequential):
        for name, sub in module.named_children():
            source, shape = _add(graph, sub, source, shape, child(name))
        return source, shape
    if isinstance(module, Residual):
        body, body_shape = _add(graph, module.body, source, shape, child("body"))
        if int(np.prod(body_shape)) != int(np.prod(shape)):
            raise ValueError(f"Residual {path or 'at the top'}: the body maps {shape} to "
                             f"{body_shape}")
        graph.add(child("add"), L.Add(), [source, body])
        return child("add"), shape
    layer, out_shape = _layer(module, shape, path)
    if layer is None:  # Flatten: nothing to compute in the flattened layout
        return source, out_shape
    name = path or type(module).__name__.lower()
    graph.add(name, layer, source)
    return name, out_shape


KNOWN = (nn.Sequential, Residual, nn.Linear, nn.Conv1d, nn.Conv2d, nn.AvgPool2d, nn.MaxPool2d,
         nn.Flatten, nn.RNN, *ACTIVATIONS)


def _require_plain(module: nn.Module, where: str) -> None:
    """Refuse a module whose ``forward()`` is not its supported base class's, or has hooks.

    The importer reads a module by its class; a subclass that overrides
    ``forward()`` (or a forward hook) computes something the class does not say,
    and importing it as the base class would give a silently different network.
    """
    base = next((k for k in KNOWN if isinstance(module, k)), None)
    name = where or "the top"
    if base is not None and type(module).forward is not base.forward:
        raise ValueError(f"{type(module).__name__} at {name} overrides forward() of "
                         f"{base.__name__}: from_torch reads modules by their class and cannot "
                         "know what your forward() computes; build the network from the "
                         f"supported modules ({base.__name__} as it is, Residual for x + f(x))")
    if module._forward_hooks or module._forward_pre_hooks:
        raise ValueError(f"{type(module).__name__} at {name} has forward hooks, which may "
                         "change what it computes: remove them before from_torch")


def _layer(module: nn.Module, shape: tuple, where: str) -> tuple[Any, tuple]:
    """The propop layer for one torch layer, and its output shape."""
    if isinstance(module, nn.Flatten):
        return None, (int(np.prod(shape)),)
    if type(module) in ACTIVATIONS:
        _check_activation(module, where)
        return L.Activation(ACTIVATIONS[type(module)]), shape
    if isinstance(module, nn.Linear):
        return L.Dense(_numpy(module.weight), _numpy(module.bias)), (module.out_features,)
    if isinstance(module, (nn.Conv1d, nn.Conv2d)):
        return _conv(module, shape, where)
    if isinstance(module, (nn.AvgPool2d, nn.MaxPool2d)):
        return _pool(module, shape, where)
    raise ValueError(f"unsupported module {type(module).__name__} at {where or 'the top'}; "
                     f"supported: Sequential, Residual, Linear, Conv1d, Conv2d, AvgPool2d, "
                     f"MaxPool2d, Flatten, {', '.join(t.__name__ for t in ACTIVATIONS)}, RNN")


def _check_activation(module: nn.Module, where: str) -> None:
    settings = {nn.LeakyReLU: ("negative_slope", 0.01), nn.ELU: ("alpha", 1.0),
                nn.GELU: ("approximate", "tanh")}
    if type(module) in settings:
        attribute, value = settings[type(module)]
        if getattr(module, attribute) != value:
            raise ValueError(f"{type(module).__name__} at {where or 'the top'} needs "
                             f"{attribute}={value!r}, got {getattr(module, attribute)!r}")


def _conv(module: nn.Module, shape: tuple, where: str) -> tuple[Any, tuple]:
    one_d = isinstance(module, nn.Conv1d)
    if module.groups != 1 or set(module.dilation) != {1} or isinstance(module.padding, str) \
            or module.padding_mode != "zeros":
        raise ValueError(f"{type(module).__name__} at {where or 'the top'}: only groups=1, "
                         "dilation 1 and numeric zero padding are supported")
    if len(shape) != (2 if one_d else 3):
        raise ValueError(f"{type(module).__name__} at {where or 'the top'} needs an input "
                         f"shape {'(C, L)' if one_d else '(C, H, W)'}, got {shape}")
    W, b = _numpy(module.weight), _numpy(module.bias)
    if one_d:
        layer = L.Conv1d(W, b, input_shape=shape, stride=module.stride[0],
                         padding=module.padding[0])
        return layer, (layer.output_shape[0], layer.output_shape[2])
    layer = L.Conv2d(W, b, input_shape=shape, stride=module.stride, padding=module.padding)
    return layer, layer.output_shape


def _pool(module: nn.Module, shape: tuple, where: str) -> tuple[Any, tuple]:
    if module.ceil_mode or len(shape) != 3:
        raise ValueError(f"{type(module).__name__} at {where or 'the top'}: needs "
                         f"ceil_mode=False and an input shape (C, H, W), got {shape}")
    if isinstance(module, nn.AvgPool2d):
        if not module.count_include_pad or module.divisor_override is not None:
            raise ValueError(f"AvgPool2d at {where or 'the top'}: needs count_include_pad="
                             "True and no divisor_override")
        layer = L.AvgPool2d(module.kernel_size, module.stride, module.padding, input_shape=shape)
    else:
        if module.dilation not in (1, (1, 1)):
            raise ValueError(f"MaxPool2d at {where or 'the top'}: needs dilation 1")
        layer = L.MaxPool2d(module.kernel_size, module.stride, module.padding,
                            input_shape=shape)
    return layer, layer.output_shape


def _rnn(module: nn.RNN) -> RNN:
    if module.bidirectional:
        raise ValueError("nn.RNN: bidirectional RNNs are not supported")
    layers = range(module.num_layers)
    W = [_numpy(getattr(module, f"weight_ih_l{k}")) for k in layers]
    U = [_numpy(getattr(module, f"weight_hh_l{k}")) for k in layers]
    if module.bias:
        b = [_numpy(getattr(module, f"bias_ih_l{k}")) + _numpy(getattr(module, f"bias_hh_l{k}"))
             for k in layers]
    else:
        b = [np.zeros(module.hidden_size) for _ in layers]
    return RNN(W, U, b, activation=module.nonlinearity)
