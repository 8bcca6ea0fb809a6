"""PyTorch modules as propop graphs by symbolic tracing (``torch.fx``; optional: torch).

``torch.fx`` traces the module's ``forward()`` into a graph of operations, and
``ShapeProp`` runs it once on an example batch to give every value its shape.
Each operation becomes zero or more :mod:`~propop.layers` nodes of a
:class:`~propop.Graph`:

- modules: ``Linear``; ``Conv1d``/``Conv2d`` (stride, padding, dilation, groups);
  ``AvgPool1d/2d``, ``MaxPool1d/2d`` (overlapping windows too, :func:`~propop.layers.max_pool`),
  ``AdaptiveAvgPool1d/2d`` and ``AdaptiveMaxPool1d/2d`` (output sizes dividing the input);
  ``GroupNorm`` and ``InstanceNorm1d/2d``; ``PReLU``; ``GLU`` (and ``F.glu``);
  ``MultiheadAttention`` as self-attention with ``batch_first=True`` (its averaged or
  per-head weights too; no key_padding_mask, bias_kv, zero_attn or training dropout);
  ``TransformerEncoderLayer`` and
  ``TransformerEncoder`` (from their parts, in evaluation mode); ``BatchNorm1d/2d`` in
  evaluation mode (an affine map); ``LayerNorm`` and ``RMSNorm``
  (:func:`~propop.layers.layer_norm_over`: exact, its Jacobian per sample built from
  products); ``Dropout`` in evaluation mode or with ``p=0``, ``Identity``,
  ``Flatten``, ``Unflatten`` (nothing to compute); the activations below, as modules;
- functions and methods: ``+``, ``-``, ``*``, ``/`` of two tensors (broadcast as
  PyTorch does; a product is a :class:`~propop.layers.Multiply`) or with a constant
  (``c / x`` too), negation, powers by a number (``**``, ``pow``, ``sqrt``, ``rsqrt``,
  ``square``), ``sum`` and ``mean`` over feature dimensions, ``F.layer_norm``,
  ``F.rms_norm``, ``torch.cat``, ``torch.stack``, ``cumsum`` (a linear map), operations
  that move, copy or zero-pad a sample's entries (``flip``, ``roll``, ``repeat``,
  ``tile``, ``expand``, ``narrow``, ``movedim``, ``index_select`` and
  ``repeat_interleave`` with constant indices, ``tril``/``triu``, ``diagonal``,
  ``F.pad`` with zeros or reflected/replicated/circular, indexing with ``...``, steps or
  constant index tensors: a :class:`~propop.layers.Windows` selection, found by running
  the operation on numbered probe samples and refused where it is no such selection),
  ``zeros_like``/``ones_like``/``full_like`` (constants), ``var`` and ``std`` (``unbiased``
  or ``correction``), the 2-norm of entries (``x.norm``, ``torch.norm``,
  ``torch.linalg.vector_norm``/``norm``), ``F.normalize`` and ``torch.logsumexp`` over
  feature dimensions (:func:`~propop.layers.moments_over`, a hand-written LayerNorm's
  ``(x - mean) / (std + eps)`` among them), ``max(dim)``/``min(dim)`` values (each
  group's first extreme, PyTorch's index) and ``amax``/``amin`` (the gradient split
  among ties, as PyTorch's) by :class:`~propop.layers.WindowMaximum`, and so
  ``torch.maximum``/``minimum`` of two tensors or one and a constant (each pair),
  ``x.new_tensor``/``new_zeros``/``new_ones``/``new_full`` (constants),
  ``flatten``/``reshape``/``view``/
  ``squeeze``/``unsqueeze``/``contiguous`` (keeping the batch dimension), ``transpose``,
  ``permute``, ``swapaxes`` of a sample's axes, matrix products of two tensors (``@``,
  ``matmul``, ``bmm``: :func:`~propop.layers.matmul_of`), ``torch.einsum`` of one or
  two traced tensors whose subscripts start with the batch's
  (:func:`~propop.layers.einsum_of`),
  ``F.scaled_dot_product_attention`` (``is_causal`` or a constant ``attn_mask``; no
  dropout), ``masked_fill`` with a constant mask (``-inf`` read by a softmax: its kept
  entries), ``split``/``chunk``/``unbind`` of a feature dimension, arithmetic with
  constants (buffers and tensors made from shapes and numbers, computed once by PyTorch),
  ``x + p``, ``x - p``, ``p - x``, ``x * p`` and ``x / p`` with a trainable ``p`` (an
  :class:`~propop.layers.ElementwiseAffine` of ``p``'s shape) or with an ``nn.Embedding``
  of constant indices (``wpe(torch.arange(T))``: the table's rows read, their gradients
  summed into the table; a frozen table is a constant),
  ``F.linear``
  with the module's own parameters (``Linear`` on tokens ``(..., d)``:
  :class:`~propop.layers.TokenDense`), ``F.dropout`` in evaluation mode or with ``p=0``,
  ``F.avg_pool2d``/``F.max_pool2d``; ``x.shape``, ``x.size()`` and the numbers computed
  from them (the batch size stays unknown: arithmetic with it is refused);
- activations, as modules or functions, at their settings: ReLU, LeakyReLU
  (``negative_slope``), Tanh, Sigmoid, ELU and CELU (``alpha``), SELU, SiLU, Mish,
  Softplus (``beta``, ``threshold``), Hardtanh (``min_val``, ``max_val``), ReLU6,
  Hardsigmoid, Hardswish, Softsign, Tanhshrink, LogSigmoid, GELU (exact, and
  ``approximate="tanh"``), ``exp``, ``sin``, ``cos``, ``abs``, ``erf``, ``clamp``/``clip``
  with constant bounds (:data:`propop.activations.FAMILIES`), ``log`` and ``log1p``
  (:data:`propop.activations.PARTIAL`: out of their domain the forward names the node),
  Softmax and LogSoftmax over any dimension (:func:`~propop.layers.softmax_over`).

Values are flat per sample in PyTorch's C order, samples as columns, so a
reshape that keeps the batch dimension is free. Graph nodes carry the traced
names: a module's qualified name (``"layer1.0.conv1"``), otherwise the traced
node's (``"add_1"``); an operation that takes several nodes adds suffixes
(``"pool.windows"``, ``"softmax.lse"``). Anything else raises a ``ValueError``
naming the traced node and the line of ``forward()`` it comes from.
"""

from __future__ import annotations

import math
import operator
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch
import torch.nn.functional as F
from torch import fx, nn
from torch.fx.passes.shape_prop import ShapeProp

from .. import layers as L
from ..activations import FAMILIES, PARTIAL, get_activation
from ..networks.graph import INPUT, Graph

__all__ = ["trace", "to_numpy", "ACTIVATIONS"]

ACTIVATIONS = {nn.ReLU: "relu", nn.Tanh: "tanh", nn.Sigmoid: "sigmoid", nn.SiLU: "silu",
               nn.ELU: "elu", nn.CELU: "celu", nn.SELU: "selu", nn.LeakyReLU: "leaky_relu",
               nn.GELU: "gelu_erf", nn.Softplus: "softplus", nn.Hardtanh: "hardtanh",
               nn.ReLU6: "relu6", nn.Mish: "mish", nn.Softsign: "softsign",
               nn.Hardsigmoid: "hardsigmoid", nn.Hardswish: "hardswish",
               nn.Tanhshrink: "tanhshrink", nn.LogSigmoid: "logsigmoid"}
_FUNCTIONS = {torch.relu: "relu", F.relu: "relu", torch.tanh: "tanh", F.tanh: "tanh",
              torch.sigmoid: "sigmoid", F.sigmoid: "sigmoid", F.silu: "silu", F.elu: "elu",
              F.celu: "celu", F.selu: "selu", torch.selu: "selu",
              F.leaky_relu: "leaky_relu", F.gelu: "gelu_erf", torch.exp: "exp",
              F.softplus: "softplus", F.hardtanh: "hardtanh", F.relu6: "relu6",
              F.mish: "mish", F.softsign: "softsign", F.hardsigmoid: "hardsigmoid",
              F.hardswish: "hardswish", F.tanhshrink: "tanhshrink", F.logsigmoid: "logsigmoid",
              torch.sin: "sin", torch.cos: "cos", torch.abs: "abs", torch.clamp: "clamp",
              torch.clip: "clamp", torch.erf: "erf", torch.special.erf: "erf",
              torch.log: "log", torch.log1p: "log1p", torch.special.log1p: "log1p"}
_METHODS = {name: name for name in ("relu", "tanh", "sigmoid", "exp", "sin", "cos", "abs",
                                    "clamp", "erf", "log", "log1p")} | {"clip": "clamp"}
# the settings of propop's activation families (PyTorch's names and defaults), in the
# functions' positional order after the input
_SETTINGS = {name: tuple(defaults) for name, (_, defaults) in FAMILIES.items()}
_RESHAPES = {"view", "reshape", "flatten", "squeeze", "unsqueeze", "contiguous", "unflatten"}
_IDENTITY_MODULES = (nn.Identity, nn.Flatten, nn.Unflatten)


@dataclass(frozen=True)
class Value:
    """A traced tensor as a graph node: its node name and one sample's shape."""

    node: str
    shape: tuple

    @property
    def size(self) -> int:
        return int(np.prod(self.shape))


class _Parameter:
    """A module attribute read by ``get_attr`` (``F.linear``'s weight, say)."""

    def __init__(self, target: str, tensor: torch.Tensor) -> None:
        self.target, self.tensor = target, tensor


class _Rows:
    """An ``nn.Embedding`` of constant indices: rows of a trainable table, ``wpe(pos)``.

    Read only by ``x + rows`` or ``x * rows`` (an :class:`ElementwiseAffine` with ``rows``).
    """

    def __init__(self, target: str, tensor: torch.Tensor, rows: np.ndarray) -> None:
        self.target, self.tensor, self.rows = target, tensor, rows

    @property
    def shape(self) -> tuple:
        """The shape of the rows read: the indices' then the table's rows'."""
        return (*self.rows.shape, *self.tensor.shape[1:])

    def refusal(self) -> str:
        """Why it cannot be read here."""
        return (f"the rows of {self.target!r} at constant indices (an nn.Embedding of "
                "positions) are read only as x + rows or x * rows, with x traced")


@dataclass(frozen=True)
class _Extremes:
    """``x.max(dim)``'s ``(values, indices)``: the values a node, the indices refused."""

    values: Value

    def part(self, which: Any) -> Value:
        """``[0]`` or ``.values``; ``[1]`` or ``.indices`` (integers) is refused."""
        if which in (0, "values"):
            return self.values
        raise _UnsupportedError("the indices of a maximum or minimum (integers, no gradient): "
                                "a propop graph's values are floating point")


class _Constant:
    """A tensor computed from constants alone (buffers, shapes, numbers).

    The same for every sample and call: ``torch.tril(torch.ones((T, T)))``, ``mask == 0``.
    """

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor


@dataclass(frozen=True)
class _Masked:
    """``scores.masked_fill(mask, -inf)``: only a softmax may read it, as ``keep = ~mask``."""

    scores: Value
    keep: Any  # a boolean array of a sample's shape


class _Whole(nn.Module):
    """A module whose own ``forward`` fx cannot trace, as one call (a leaf) of a container."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.module(x)


_WHOLE = (nn.TransformerEncoderLayer, nn.TransformerEncoder)


def _runs_on(module: nn.Module, example: torch.Tensor) -> None:
    """``ValueError`` naming the sample's shape where ``module`` fails on ``example``.

    Run before ``ShapeProp``, which prints the traceback of a failing node first.
    """
    try:
        with torch.no_grad():
            module(example)
    except Exception as error:
        raise ValueError(f"from_torch: {type(module).__name__} fails on a batch of samples of "
                         f"shape {tuple(example.shape[1:])} ({type(error).__name__}: {error}): "
                         "check input_shape, one sample's shape (it is needed where the "
                         "module does not start with nn.Linear)") from error


def trace(module: nn.Module, example: torch.Tensor) -> tuple[Graph, dict]:
    """The graph of ``module`` traced on ``example`` (a batch), and where its weights came from.

    Returns ``(graph, origins)``; ``origins[node]`` is ``(module path, {propop name:
    torch name})`` for every node holding a module's parameters.
    """
    if isinstance(module, _WHOLE):  # its forward() branches on shapes: one call instead
        graph, origins = trace(_Whole(module), example)
        return graph, {node: (path.removeprefix("module").lstrip("."), names)
                       for node, (path, names) in origins.items()}
    tracer = fx.Tracer()
    tracer.record_stack_traces = True
    try:
        graph = tracer.trace(module)
    except fx.proxy.TraceError as error:
        raise ValueError(f"from_torch: {_traced_frame(module, error)}: data-dependent control "
                         "flow (an if, a loop or a bool() on a tensor's values) cannot be "
                         "traced: propop imports one fixed graph; write it with tensor "
                         f"operations (torch.where) instead ({error})") from None
    except Exception as error:  # torch.fx's proxies where real values were needed
        raise ValueError(f"from_torch: {_traced_frame(module, error)}: torch.fx cannot trace "
                         f"this line ({type(error).__name__}: {error}); numbers read from "
                         "x.shape are traced: a factory takes them as one tuple "
                         "(torch.ones((T, T))), and a buffer cannot be sliced by them (slice "
                         "it to its size in __init__)") from error
    graph_module = fx.GraphModule(module, graph)
    saved = [(b, b.detach().clone()) for b in module.buffers()]
    try:  # one run for the shapes, which must leave the module as it was
        _runs_on(module, example)
        ShapeProp(graph_module).propagate(example)
    finally:  # a BatchNorm in training mode updates its running statistics
        with torch.no_grad():
            for b, before in saved:
                b.copy_(before)
    return _Translator(graph_module, module).run()


class _Translator:
    """Walks the traced nodes in order, adding propop nodes to one :class:`Graph`."""

    def __init__(self, graph_module: fx.GraphModule, original: nn.Module) -> None:
        self.module = graph_module
        self.arrays: dict[int, Any] = {}  # one array per parameter: tied ones stay one
        self.values: dict[fx.Node, Any] = {}
        self.graph: Graph | None = None
        self.origins: dict[str, tuple] = {}
        self.used: set[str] = set()

    def run(self) -> tuple[Graph, dict]:
        outputs: list[str] = []
        for node in self.module.graph.nodes:
            try:
                if node.op == "output":
                    outputs = self._outputs(node)
                else:
                    _require_safe_in_place(self.module, node)
                    self.values[node] = getattr(self, f"_{node.op}")(node)
            except _UnsupportedError as why:
                raise ValueError(f"from_torch: {_where(node)}: {why}") from None
        assert self.graph is not None
        self.graph._outputs = tuple(outputs)
        self.graph.output_shapes = self.output_shapes  # a sample's, as the module returns it
        return self.graph, self.origins

    # -- the kinds of traced node -----------------------------------------------------
    def _placeholder(self, node: fx.Node) -> Value:
        if self.graph is not None:
            raise _UnsupportedError("a second input; propop graphs take one input tensor")
        shape = _shape(node)
        self.graph = Graph(int(np.prod(shape)))
        return Value(INPUT, shape)

    def _get_attr(self, node: fx.Node) -> _Parameter:
        return _Parameter(node.target, _attribute(self.module, node.target))

    def _call_module(self, node: fx.Node) -> Any:
        module = self.module.get_submodule(node.target)
        if module._forward_hooks or module._forward_pre_hooks:
            raise _UnsupportedError(f"{type(module).__name__} has forward hooks, which may change "
                               "what it computes: remove them before from_torch")
        index = self.values.get(node.args[0])
        if isinstance(module, nn.Embedding) and (isinstance(index, _Constant) or isinstance(
                index, _Parameter) and not index.tensor.requires_grad):  # torch.tensor([..])
            return _embedding_rows(node.target, module, index.tensor)
        (x,) = self._tensors(node.args[:1], masked=isinstance(module, nn.Softmax))
        name = self._name(node.target, node)
        for kind, convert in _MODULES:
            if isinstance(module, kind):
                return convert(self, module, x, name, node)
        raise _UnsupportedError(f"unsupported module {type(module).__name__}"
                           + (" (recurrent modules are imported on their own: "
                              "pp.from_torch(the RNN, GRU or LSTM))"
                              if isinstance(module, nn.RNNBase) else "")
                           + f"; supported: {_supported()}")

    def _call_function(self, node: fx.Node) -> Any:
        target = node.target
        if target is getattr and node.args[1] in ("shape", "dtype", "device"):
            return self._attribute_of(node)
        if target in (getattr, operator.getitem) and isinstance(self.values.get(node.args[0]),
                                                                _Extremes):
            return self.values[node.args[0]].part(node.args[1])
        if target in _NUMBER_FUNCTIONS and all(  # shape arithmetic: numbers alone
                isinstance(self.values.get(a), (int, float, _Batch))
                for a in node.args if isinstance(a, fx.Node)):
            return _number(target, [self.values.get(a, a) if isinstance(a, fx.Node) else a
                                    for a in node.args])
        folded = self._folded(node)
        if folded is not None:
            return folded
        if target in _LIKE:
            return self._like(node)
        if target in _FUNCTIONS:
            return self._activation(_FUNCTIONS[target], node, node.kwargs)
        handler = _FUNCTION_HANDLERS.get(target)
        if handler is None:
            raise _UnsupportedError(f"unsupported function {_callable_name(target)}")
        return handler(self, node)

    def _attribute_of(self, node: fx.Node) -> Any:
        """``x.shape``, ``x.dtype``, ``x.device`` of a traced tensor (or of a constant).

        Constants are made alike: ``torch.ones((T, T), device=x.device)``.
        """
        source, what = node.args
        if isinstance(self.values.get(source), (_Parameter, _Constant)):
            return getattr(self.values[source].tensor, what)
        if what == "shape":
            return self._shape_of(source)
        meta = source.meta["tensor_meta"]
        return meta.dtype if what == "dtype" else self._device

    @property
    def _device(self) -> torch.device:
        """Where the module's tensors are (a constant made there is read as an array)."""
        tensors = [*self.module.parameters(), *self.module.buffers()]
        return tensors[0].device if tensors else torch.device("cpu")

    def _folded(self, node: fx.Node) -> Any:
        """The value of a node that reads no traced tensor: computed now, by PyTorch.

        Buffers, shapes, numbers and tensors made from them are the same for every
        sample and call, so ``torch.tril(torch.ones(T, T))`` or ``self.mask[:T, :T] == 0``
        is one constant. ``None`` where the node reads a traced tensor or the batch size;
        refused where it reads a trainable parameter (its gradient would be lost) or
        draws random numbers (a constant would draw them once).
        """
        read: list = []

        def value(a: Any) -> Any:
            if not isinstance(a, fx.Node):
                return a
            read.append(self.values.get(a))
            v = read[-1]
            return v.tensor if isinstance(v, (_Parameter, _Constant)) else v

        args, kwargs = fx.node.map_aggregate((node.args, dict(node.kwargs)), value)
        if not all(isinstance(v, (_Parameter, _Constant, int, float, bool, torch.device,
                                  torch.dtype))
                   or isinstance(v, tuple) and all(isinstance(e, int) for e in v)
                   for v in read) or None in read:
            return None
        trained = [v.target for v in read if isinstance(v, _Parameter) and v.tensor.requires_grad]
        if trained:
            raise _UnsupportedError(f"computes with the parameter {trained[0]!r} outside the "
                                    "operations propop imports: its gradient would be lost")
        if node.target in _RANDOM or node.target in ("random_", "normal_", "uniform_",
                                                     "bernoulli", "bernoulli_"):
            raise _UnsupportedError("random numbers (a constant would draw them once)")
        with torch.no_grad():
            out = node.target(*args, **kwargs) if node.op == "call_function" else \
                getattr(args[0], node.target)(*args[1:], **kwargs)
        return _Constant(out) if isinstance(out, torch.Tensor) else out

    def _shape_of(self, source: Any) -> tuple:
        """A traced tensor's shape, its batch size :data:`BATCH` (any batch may come)."""
        (x,) = self._tensors([source])
        return (BATCH, *x.shape)

    def _call_method(self, node: fx.Node) -> Any:
        name = node.target
        if name in ("size", "dim"):  # numbers: reshapes take their shapes from the trace
            shape = self._shape_of(node.args[0])
            return len(shape) if name == "dim" else (
                shape[node.args[1]] if len(node.args) > 1 else shape)
        folded = self._folded(node)
        if folded is not None:
            return folded
        if name in _RESHAPES:
            return self._reshape(node)
        if name == "masked_fill":
            return self._masked_fill(node)
        if name in ("split", "chunk", "unbind"):
            return self._pieces(node)
        if name in _METHODS:
            return self._activation(_METHODS[name], node, node.kwargs)
        if name in ("softmax", "log_softmax"):
            return self._softmax(node, log=name == "log_softmax")
        if name in ("add", "sub", "mul", "div"):
            return self._arithmetic(node, _OPERATORS[name])
        if name in ("sum", "mean"):
            return self._reduction(node, mean=name == "mean")
        if name in ("var", "std", "norm"):
            return self._moments(node, name)
        if name == "logsumexp":
            return self._logsumexp(node)
        if name in ("maximum", "minimum"):
            return self._pairwise(node, maximum=name == "maximum")
        if name == "cumsum":
            return self._cumsum(node)
        if name in ("new_tensor", "new_zeros", "new_ones", "new_full"):
            return self._new(node)
        if name in ("max", "min", "amax", "amin"):
            return self._extreme(node, maximum=name in ("max", "amax"), split=name[0] == "a")
        if name in _POWERS:
            return self._power(node, _POWERS[name])
        if name in ("transpose", "permute", "swapaxes"):
            return self._permute(node)
        if name in ("matmul", "bmm"):
            return self._matmul(node)
        if name in _SELECTIONS:
            return self._selected(node)
        if name in ("gt", "lt", "ge", "le", "eq", "ne", "__gt__", "__lt__"):
            return self._compared(node)
        raise _UnsupportedError(f"unsupported method .{name}()")

    def _outputs(self, node: fx.Node) -> list[str]:
        """The returned tensors' nodes; their per-sample shapes kept as ``output_shapes``."""
        returned = node.args[0]
        values = self._tensors(returned if isinstance(returned, (tuple, list)) else [returned])
        self.output_shapes = tuple(v.shape for v in values)
        return [v.node for v in values]

    # -- adding nodes -----------------------------------------------------------------
    def array(self, tensor: torch.Tensor | None) -> Any:
        """``tensor`` as a float64 array, the same array each time: tied weights stay tied."""
        if tensor is None:
            return None
        if id(tensor) not in self.arrays:
            self.arrays[id(tensor)] = (tensor, to_numpy(tensor))  # the tensor kept alive
        return self.arrays[id(tensor)][1]

    def _name(self, wanted: str, node: fx.Node) -> str:
        """``wanted`` the first time, the traced node's unique name after (a reused module)."""
        name = wanted if wanted not in self.used else node.name
        self.used.add(name)
        return name

    def _add(self, name: str, layer: Any, inputs: Sequence[Value], shape: tuple) -> Value:
        self.graph.add(name, layer, [v.node for v in inputs])
        return Value(name, tuple(shape))

    def _tensors(self, args: Sequence[Any], masked: bool = False) -> list[Value]:
        """The traced tensors ``args`` are (a softmax's input may be ``_Masked``)."""
        out = []
        for a in args:
            value = self.values.get(a) if isinstance(a, fx.Node) else a
            if isinstance(value, _Masked) and not masked:
                raise _UnsupportedError(f"{a!r} is a masked_fill with -inf, which only a "
                                        "softmax may read (its -inf is no number)")
            if isinstance(value, (_Parameter, _Constant)):
                raise _UnsupportedError(f"{a!r} is a constant (a buffer, or made from "
                                        "constants) where a traced tensor is needed")
            if isinstance(value, _Rows):
                raise _UnsupportedError(value.refusal())
            if not isinstance(value, (Value, _Masked)):
                raise _UnsupportedError(f"expected a tensor, got {a!r}")
            out.append(value)
        return out

    def _activation(self, name: str, node: fx.Node, options: dict) -> Value:
        (x,) = self._tensors(node.args[:1])
        if name == "gelu_erf" and options.get("approximate", "none") == "tanh":
            name = "gelu"
        elif name == "gelu_erf" and options.get("approximate", "none") != "none":
            raise _UnsupportedError(f"GELU approximate={options['approximate']!r}")
        settings = {key: node.args[position] for position, key in
                    enumerate(_SETTINGS.get(name, ()), start=1) if len(node.args) > position}
        settings |= {key: options[key] for key in _SETTINGS.get(name, ()) if key in options}
        if name == "clamp":  # None is an open side; a tensor bound is no constant
            if any(isinstance(v, fx.Node) for v in settings.values()):
                raise _UnsupportedError("clamp with a tensor as a bound")
            settings = {k: v for k, v in settings.items() if v is not None}
        return self._add(self._name(node.name, node), L.Activation(_member(name, settings)),
                         [x], x.shape)

    def _permute(self, node: fx.Node) -> Value:
        """``x.transpose(d0, d1)``, ``x.permute(*dims)`` of a sample's axes (dim 0 stays)."""
        (x,) = self._tensors(node.args[:1])
        rank = len(x.shape) + 1  # with the batch
        given = [a for a in node.args[1:]] or list(node.kwargs.values())
        if node.target in ("transpose", torch.transpose, "swapaxes", torch.swapaxes):
            d0, d1 = (d % rank for d in given[:2])
            order = list(range(rank))
            order[d0], order[d1] = order[d1], order[d0]
        else:
            dims = given[0] if len(given) == 1 and isinstance(given[0], (tuple, list)) else given
            order = [d % rank for d in dims]
        if order[0] != 0:
            raise _UnsupportedError(f"moves the batch dimension (order {order}); propop keeps "
                                    "samples apart")
        return self._permuted(self._name(node.name, node), x, [d - 1 for d in order[1:]])

    def _permuted(self, name: str, x: Value, order: Sequence[int]) -> Value:
        """``x`` with a sample's axes in ``order`` (:func:`~propop.layers.permutation`)."""
        return self._add(name, L.permutation(x.shape, order), [x],
                         tuple(x.shape[d] for d in order))

    def _matmul(self, node: fx.Node) -> Value:
        """``a @ b`` of two traced tensors, each a matrix (or a stack of them) per sample."""
        args = [self.values.get(a) if isinstance(a, fx.Node) else a for a in node.args[:2]]
        if not all(isinstance(a, Value) for a in args):
            raise _UnsupportedError("a matrix product with a parameter or a constant: write "
                                    "it as nn.Linear (or F.linear with a module's weight)")
        return self._product(self._name(node.name, node), *args)

    def _einsum(self, node: fx.Node) -> Value:
        """``torch.einsum(equation, a[, b])`` of traced tensors, the batch's subscript first.

        Each operand's and the output's first subscript is the batch's, which no other
        place uses; the rest is :func:`~propop.layers.einsum_of`.
        """
        equation, *operands = node.args
        if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
            operands = list(operands[0])
        values = [self.values.get(a) if isinstance(a, fx.Node) else a for a in operands]
        if not 1 <= len(values) <= 2 or not all(isinstance(v, Value) for v in values):
            raise _UnsupportedError("einsum of one or two traced tensors is supported (with a "
                                    "parameter: nn.Linear, or F.linear with a module's weight)")
        spec = equation.replace(" ", "")
        inputs, arrow, output = spec.partition("->")
        inputs = inputs.split(",")
        if not arrow or "." in spec:
            raise _UnsupportedError(f"einsum {equation!r}: give the output (->) and no '...'")
        batch = output[:1]
        if any(s[:1] != batch or batch in s[1:] for s in [*inputs, output]):
            raise _UnsupportedError(f"einsum {equation!r}: every operand and the output must "
                                    "start with the batch's subscript, used nowhere else")
        try:
            shape, parts = L.einsum_of([s[1:] for s in inputs], output[1:],
                                       [v.shape for v in values])
        except ValueError as error:
            raise _UnsupportedError(str(error)) from None
        return self._expand(self._name(node.name, node),
                            {str(i): v for i, v in enumerate(values)}, parts, shape)

    def _product(self, name: str, a: Value, b: Value) -> Value:
        """The nodes of ``a @ b`` (:func:`~propop.layers.matmul_of`)."""
        if len(a.shape) < 2 or len(b.shape) < 2:
            raise _UnsupportedError(f"a matrix product of per-sample shapes {a.shape} and "
                                    f"{b.shape}: each factor needs two dimensions")
        shape, parts = L.matmul_of(a.shape, b.shape)
        return self._expand(name, {"a": a, "b": b}, parts, shape)

    def _reshape(self, node: fx.Node) -> Value:
        (x,) = self._tensors(node.args[:1])
        meta = node.meta["tensor_meta"]
        if meta.shape[0] != self._batch:
            raise _UnsupportedError(f"reshapes the batch dimension ({self._batch} -> "
                               f"{meta.shape[0]}); propop keeps samples apart")
        return Value(x.node, tuple(meta.shape[1:]))

    @property
    def _batch(self) -> int:
        first = next(iter(self.module.graph.nodes))
        return int(first.meta["tensor_meta"].shape[0])

    def _arithmetic(self, node: fx.Node, op: str) -> Value:
        """``a + b``, ``a - b``, ``a * c``, ``a / c``, ``-a`` with tensors or constants."""
        args = [self.values.get(a, a) if isinstance(a, fx.Node) else a for a in node.args]
        alpha = node.kwargs.get("alpha", 1)
        tensors = [a for a in args if isinstance(a, Value)]
        if any(a is BATCH for a in args):
            raise _UnsupportedError(f"{op} with the batch size (x.shape[0]): a propop graph "
                                    "computes each sample alone, for any batch")
        constants = [a for a in args if isinstance(a, (int, float, _Parameter, _Constant,
                                                       _Rows))]
        name = self._name(node.name, node)
        shape = _shape(node)
        if len(tensors) == 2 and len(args) == 2:
            return self._of_two(name, op, alpha, tensors, shape)
        if len(tensors) != 1 or len(constants) != len(args) - 1:
            raise _UnsupportedError(f"{op} of {len(tensors)} tensors and {len(constants)} "
                                    "constants; supported: +, -, *, / of two tensors "
                                    "(broadcast as PyTorch does), or one tensor with a "
                                    "constant (a number, a buffer, a tensor made from them)")
        if constants and isinstance(constants[0], (_Parameter, _Rows)) and \
                constants[0].tensor.requires_grad:
            if op not in ("add", "mul", "sub", "div") or alpha != 1 or \
                    op == "div" and not isinstance(args[0], Value):
                raise _UnsupportedError(f"{op} with the trainable parameter "
                                        f"{constants[0].target!r}: x + p, x - p, p - x, "
                                        "x * p and x / p are supported")
            if op == "sub":  # p - x = (-x) + p; x - p = -((-x) + p), exact by symmetry
                return self._subtracted(name, tensors[0], constants[0], shape,
                                        isinstance(args[0], Value))
            return self._with_parameter(name, op, tensors[0], constants[0], shape)
        c = self._sample_constant(constants[0], shape, f"{op}'s constant") if constants and \
            not isinstance(constants[0], (int, float)) else float(constants[0] if constants else 0)
        x = self._broadcast(f"{name}.x", tensors[0], shape)
        first = isinstance(args[0], Value)
        if op == "div" and not first:  # c / x = c * x^-1
            x = self._add(f"{name}.reciprocal", L.Power(-1.0), [x], shape)
            op = "mul"
        slope, shift = {"add": (1.0, alpha * c), "sub": ((1.0, -alpha * c) if first else
                                                        (-alpha, c)),
                        "mul": (c, 0.0), "div": (None, 0.0), "neg": (-1.0, 0.0)}[op]
        if op == "div":
            if np.any(c == 0):
                raise _UnsupportedError("a division by zero")
            slope = 1.0 / c
        size = int(np.prod(shape))
        slope, shift = (np.broadcast_to(np.asarray(a, dtype=float), shape).reshape(size)
                        for a in (slope, shift))
        layer = L.LinearMap([sp.diags_array(slope, format="csr")],
                            None if not shift.any() else shift.copy(),
                            name=f"Constant{op.title()}")
        return self._add(name, layer, [x], shape)

    def _with_parameter(self, name: str, op: str, x: Value, p: _Parameter | _Rows,
                        shape: tuple) -> Value:
        """``x * p``, ``x / p`` or ``x + p`` with a trainable ``p``: an :class:`ElementwiseAffine`.

        ``p`` broadcasts over a sample's leading dimensions (``repeats``) and its
        trailing ones (``spread``) and keeps its own shape (a ``(1, T, d)`` position
        embedding, a ``(d,)`` layer scale, a ``(C, 1, 1)`` per-channel shift); rows
        of an embedding table (:class:`_Rows`) are the parameter read at those rows.
        """
        rows = p.rows if isinstance(p, _Rows) else None
        dims = tuple(p.shape) if rows is not None else tuple(p.tensor.shape)
        if len(dims) > len(shape) and dims[0] == 1:
            dims = dims[1:]  # the batch's dimension, one
        padded = (1,) * (len(shape) - len(dims)) + dims
        varied = [i for i, n in enumerate(padded) if n != 1] or [len(shape)]
        a, b = varied[0], varied[-1] + 1
        if x.shape != shape or len(padded) != len(shape) or padded[a:b] != shape[a:b]:
            raise _UnsupportedError(f"{op} with the parameter {p.target!r} of shape "
                                    f"{dims} on a sample of shape {x.shape}: "
                                    "it may repeat over leading and trailing dimensions only")
        path, _, own = p.target.rpartition(".")
        kind = "bias" if op == "add" else "weight"
        self.origins[name] = (path, {kind: own})
        array = self.array(p.tensor)
        layer = L.ElementwiseAffine(None if op == "add" else array,
                                    array if op == "add" else None,
                                    int(np.prod(shape[:a])), int(np.prod(shape[b:])),
                                    rows=rows, divides=op == "div")
        return self._add(name, layer, [x], shape)

    def _subtracted(self, name: str, x: Value, p: _Parameter | _Rows, shape: tuple,
                    first: bool) -> Value:
        """``x - p`` (``first``) or ``p - x`` with a trainable ``p``: negations around ``+ p``.

        ``fl(-x + p) = fl(p - x) = -fl(x - p)``: each exactly PyTorch's.
        """
        negated = self._add(f"{name}.negated", _negation(x.size), [x], x.shape)
        if not first:
            return self._with_parameter(name, "add", negated, p, shape)
        shifted = self._with_parameter(f"{name}.shifted", "add", negated, p, shape)
        return self._add(name, _negation(shifted.size), [shifted], shape)

    def _of_two(self, name: str, op: str, alpha: float, tensors: list, shape: tuple) -> Value:
        """``a + b``, ``a - b``, ``a * b``, ``a / b`` of two tensors, broadcast to ``shape``."""
        a, b = (self._broadcast(f"{name}.{side}", t, shape) for side, t in zip("ab", tensors))
        if op in ("add", "sub"):
            sign = alpha if op == "add" else -alpha
            return self._add(name, L.Add(None if sign == 1 else (1, sign)), [a, b], shape)
        if op == "div":  # a * b^-1
            b = self._add(f"{name}.reciprocal", L.Power(-1.0), [b], shape)
        return self._expand(name, {"a": a, "b": b}, L.product_of("a", "b"), shape)

    def _broadcast(self, name: str, x: Value, shape: tuple) -> Value:
        """``x`` copied to ``shape`` as PyTorch broadcasts (itself where it has that shape)."""
        if x.shape == tuple(shape):
            return x
        return self._add(name, L.broadcast_to(x.shape, shape), [x], shape)

    def _power(self, node: fx.Node, exponent: float | None = None) -> Value:
        """``x ** p``, ``torch.pow(x, p)``, ``torch.sqrt``, ``torch.rsqrt`` (``p`` a number)."""
        (x,) = self._tensors(node.args[:1])
        if exponent is None:
            exponent = node.args[1] if len(node.args) > 1 else node.kwargs.get("exponent")
        if not isinstance(exponent, (int, float)):
            raise _UnsupportedError("a power whose exponent is not a number")
        return self._add(self._name(node.name, node), L.Power(exponent), [x], x.shape)

    def _reduction(self, node: fx.Node, mean: bool) -> Value:
        """``x.sum(dim)``, ``x.mean(dim)`` over feature dimensions (``keepdim`` or not)."""
        (x,) = self._tensors(node.args[:1])
        dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
        dims = _reduced(dim, x, "mean" if mean else "sum")
        return self._add(self._name(node.name, node), L.reduction_over(x.shape, dims, mean),
                         [x], _shape(node))

    def _moments(self, node: fx.Node, statistic: str) -> Value:
        """``x.var(dim)``, ``x.std(dim)`` (``unbiased`` or ``correction``), the 2-norm's forms.

        ``x.norm(dim=...)``, ``torch.norm``, ``torch.linalg.vector_norm`` and
        ``torch.linalg.norm`` of a vector (``p``/``ord`` 2): :func:`~propop.layers.moments_over`.
        """
        (x,) = self._tensors(node.args[:1])
        given = _arguments(node, {"var": ("dim", "unbiased", "keepdim"), "std": (
            "dim", "unbiased", "keepdim"), "norm": ("p", "dim", "keepdim")}[statistic])
        if statistic == "norm":
            order = given.get("p", given.get("ord", 2))
            dim = given.get("dim")
            matrix = node.target is torch.linalg.norm and order is not None and \
                isinstance(dim, (tuple, list)) and len(dim) == 2  # a matrix norm
            if order not in (2, 2.0, "fro", None) or matrix:
                raise _UnsupportedError(f"a norm of order {order!r}"
                                        + (" over two dimensions (a matrix norm)" if matrix
                                           else "") + "; the 2-norm of entries is supported")
        if isinstance(given.get("dim"), bool):  # x.var(True): PyTorch's unbiased, no dim
            given["unbiased"], given["dim"] = given.pop("dim"), None
        dims = _reduced(given.get("dim"), x, statistic)
        correction = given.get("correction", 1.0 if given.get("unbiased", True) else 0.0)
        try:
            parts = L.moments_over(x.shape, dims, statistic, float(correction))
        except ValueError as error:
            raise _UnsupportedError(str(error)) from None
        return self._expand(self._name(node.name, node), x, parts, _shape(node))

    def _normalize(self, node: fx.Node) -> Value:
        """``F.normalize(x, p=2, dim, eps)``: ``x / max(||x||, eps)`` over ``dim``."""
        (x,) = self._tensors(node.args[:1])
        given = _arguments(node, ("p", "dim", "eps"))
        if given.get("p", 2.0) != 2:
            raise _UnsupportedError(f"F.normalize with p={given['p']}; p=2 is supported")
        dims = _reduced(given.get("dim", 1), x, "F.normalize")
        S = L.reduction_over(x.shape, dims, mean=False).matrices[0]
        clamp = L.Activation(_member("clamp", {"min": float(given.get("eps", 1e-12))}))
        parts = [(".norm" + s, layer, [".norm" + r if r else r for r in reads])
                 for s, layer, reads in L.moments_over(x.shape, dims, "norm")]
        parts += [(".clamped", clamp, [".norm"]), (".reciprocal", L.Power(-1.0), [".clamped"]),
                  (".spread", L.LinearMap([S.T.tocsr()], name="Broadcast"), [".reciprocal"]),
                  *L.product_of(None, ".spread")]
        return self._expand(self._name(node.name, node), x, parts, _shape(node))

    def _extreme(self, node: fx.Node, maximum: bool, split: bool = False) -> Any:
        """``x.max(dim)``, ``x.min(dim)``, ``amax``, ``amin`` over feature dimensions.

        A :class:`~propop.layers.WindowMaximum` over each group's entries (of ``-x``,
        negated back, for a minimum): ``max(dim)`` reads each group's first extreme
        entry (PyTorch's index, :class:`_Extremes`), ``amax`` splits the gradient among
        ties (``split``). An elementwise ``max(x, y)`` and ``max`` over all are refused.
        """
        given = _arguments(node, ("dim", "keepdim"))
        if isinstance(given.get("dim"), fx.Node) or "other" in given:  # max(x, y)
            return self._pairwise(node, maximum)
        (x,) = self._tensors(node.args[:1])
        if not split and isinstance(given.get("dim"), (tuple, list)):
            raise _UnsupportedError("max(dim) or min(dim) over several dimensions (amax and "
                                    "amin take several)")
        dims = _reduced(given.get("dim"), x, "a maximum or minimum")
        groups = L.entry_groups(x.shape, dims)
        windows = np.argsort(groups, kind="stable").reshape(groups.max() + 1, -1)
        pick = L.WindowMaximum(windows, x.size, ties="split" if split else "first")
        parts = [("", pick, [None])] if maximum else [
            (".negated", _negation(x.size), [None]), (".maximum", pick, [".negated"]),
            ("", _negation(windows.shape[0]), [".maximum"])]
        meta = node.meta["tensor_meta"] if split else node.meta["tensor_meta"][0]  # values
        made = self._expand(self._name(node.name, node), x, parts,
                            tuple(int(n) for n in meta.shape[1:]))
        return made if split else _Extremes(made)

    def _pairwise(self, node: fx.Node, maximum: bool) -> Value:
        """``torch.maximum(x, y)``/``minimum`` (``torch.max(x, y)``): each pair's extreme.

        ``x`` and ``y`` (a traced tensor or a constant, broadcast) side by side, and a
        :class:`~propop.layers.WindowMaximum` of each pair with ties split, as PyTorch
        splits the gradient of equal entries (of ``-x`` and ``-y``, negated back, for
        the minimum).
        """
        name, shape = self._name(node.name, node), _shape(node)
        size = int(np.prod(shape))
        operands = node.args[:2] if len(node.args) > 1 else (node.args[0], node.kwargs["other"])
        values = [self.values.get(a) if isinstance(a, fx.Node) else a for a in operands]
        traced = next(v for v in values if isinstance(v, Value))  # a constant is made from it
        sides = []
        for side, a, value in zip("xy", operands, values):
            if isinstance(value, Value):
                sides.append(self._broadcast(f"{name}.{side}", value, shape))
                continue
            c = np.full(shape, float(a)) if isinstance(a, (int, float)) else \
                self._sample_constant(a, shape, "the other operand")
            sides.append(self._add(f"{name}.{side}", L.LinearMap(
                [sp.csr_array((size, traced.size))], c.reshape(-1).copy(), name="Constant"),
                [traced], shape))
        pairs = np.arange(2 * size).reshape(2, size).T
        pick = L.WindowMaximum(pairs, 2 * size, ties="split")
        parts = [(".pairs", L.Concat(), [None, "y"]), ("", pick, [".pairs"])] if maximum else [
            (".pairs", L.Concat(), [None, "y"]), (".negated", _negation(2 * size), [".pairs"]),
            (".maximum", pick, [".negated"]), ("", _negation(size), [".maximum"])]
        return self._expand(name, {None: sides[0], "y": sides[1]}, parts, shape)

    def _cumsum(self, node: fx.Node) -> Value:
        """``x.cumsum(dim)``, ``torch.cumsum(x, dim)`` along a feature dimension."""
        (x,) = self._tensors(node.args[:1])
        given = _arguments(node, ("dim",))
        if given.get("dtype") is not None:
            raise _UnsupportedError("cumsum with a dtype: propop keeps the traced dtype")
        d = _feature_dim(given.get("dim"), x)
        return self._add(self._name(node.name, node), L.cumsum_over(x.shape, d), [x],
                         _shape(node))

    def _glu(self, node: fx.Node) -> Value:
        """``F.glu(x, dim)``: :meth:`_glu_of`."""
        (x,) = self._tensors(node.args[:1])
        return self._glu_of(self._name(node.name, node), x,
                            _arguments(node, ("dim",)).get("dim", -1), _shape(node))

    def _glu_of(self, name: str, x: Value, dim: int, shape: tuple) -> Value:
        """``a * sigmoid(b)`` of ``x``'s two halves along ``dim`` (``nn.GLU``, ``F.glu``)."""
        d = _feature_dim(dim, x)  # of an even size: PyTorch's own run checked it
        index, half = np.arange(x.size).reshape(x.shape), x.shape[d] // 2
        a, b = (np.take(index, np.arange(k * half, (k + 1) * half), axis=d) for k in (0, 1))
        parts = [(".a", L.Windows(a, x.size), [None]), (".b", L.Windows(b, x.size), [None]),
                 (".gate", L.Activation(_member("sigmoid", {})), [".b"]),
                 *L.product_of(".a", ".gate")]
        return self._expand(name, x, parts, shape)

    def _logsumexp(self, node: fx.Node) -> Value:
        """``torch.logsumexp(x, dim)`` over feature dimensions: one :class:`LogSumExp` node."""
        (x,) = self._tensors(node.args[:1])
        dims = _reduced(_arguments(node, ("dim", "keepdim")).get("dim"), x, "logsumexp")
        return self._add(self._name(node.name, node), L.LogSumExp(L.entry_groups(x.shape, dims)),
                         [x], _shape(node))

    def _layer_norm(self, name: str, x: Value, shape: Sequence[int], eps: float | None,
                    weight: Any, bias: Any, node: fx.Node, centred: bool = True) -> Value:
        """``F.layer_norm`` over the last ``len(shape)`` dimensions (:func:`layer_norm_over`).

        ``centred=False`` is ``F.rms_norm``, whose ``eps`` of ``None`` is the dtype's.
        """
        shape = tuple(int(n) for n in shape)  # the sample's last dimensions (torch checked)
        W = None if weight is None else self.array(weight)  # one array: ties stay ties
        b = None if bias is None else self.array(bias)
        if eps is None:
            eps = float(torch.finfo(node.meta["tensor_meta"].dtype).eps)
        parts = L.layer_norm_over(x.shape, len(shape), eps, W, b, centred)
        return self._expand(name, x, parts, x.shape)

    def _softmax(self, node: fx.Node, log: bool) -> Value:
        (x,) = self._tensors(node.args[:1], masked=not log)
        dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
        if dim is None:
            raise _UnsupportedError("softmax needs dim")
        return self._softmax_of(self._name(node.name, node), x, dim, log)

    def _softmax_of(self, name: str, x: Value | _Masked, dim: int, log: bool = False,
                    keep: Any = None) -> Value:
        """The softmax nodes over ``dim`` (a torch dim) of ``x``.

        Of its kept entries alone where ``x`` is masked with ``-inf`` or ``keep`` is given.
        """
        if isinstance(x, _Masked):
            x, keep = x.scores, x.keep
        d = _feature_dim(dim, x)
        if keep is not None and not np.broadcast_to(keep, x.shape).any(axis=d).all():
            raise _UnsupportedError("a softmax whose mask leaves a group no entry (PyTorch's "
                                    "softmax of -inf alone is NaN)")
        return self._expand(name, x, L.softmax_over(x.shape, d, log, keep=keep), x.shape)

    def _masked_fill(self, node: fx.Node) -> Value | _Masked:
        """``x.masked_fill(mask, value)`` with a constant ``mask``: ``x`` where it is false.

        A number is an affine node (the masked entries that constant); ``-inf`` is
        :class:`_Masked`, which a softmax reads as its kept entries (:meth:`_softmax_of`).
        """
        given = dict(zip(("input", "mask", "value"), node.args)) | dict(node.kwargs)
        (x,) = self._tensors([given["input"]])
        mask = self._sample_constant(given["mask"], x.shape, "masked_fill's mask")
        value = self.values.get(given["value"], given["value"]) if isinstance(
            given["value"], fx.Node) else given["value"]
        if isinstance(value, _Constant) and value.tensor.numel() == 1:
            value = value.tensor.item()
        if not isinstance(value, (int, float)) or math.isnan(value) or value == math.inf:
            raise _UnsupportedError(f"masked_fill with the value {value!r} (a number, or "
                                    "-inf read by a softmax)")
        if value == -math.inf:
            return _Masked(x, ~mask)
        flat = mask.reshape(-1)
        layer = L.LinearMap([sp.diags_array((~flat).astype(float), format="csr")],
                            np.where(flat, float(value), 0.0), name="MaskedFill")
        return self._add(self._name(node.name, node), layer, [x], x.shape)

    def _sample_constant(self, arg: Any, shape: tuple, what: str) -> Any:
        """A constant tensor as one sample's array of ``shape`` (broadcast as PyTorch does).

        Refused where it is a traced tensor or differs between samples (a leading
        dimension over the batch that is not 1).
        """
        value = self.values.get(arg) if isinstance(arg, fx.Node) else arg
        if isinstance(value, _Parameter) and value.tensor.requires_grad:
            raise _UnsupportedError(f"{what} is the trainable parameter {value.target!r}")
        if not isinstance(value, (_Parameter, _Constant)):
            raise _UnsupportedError(f"{what} is computed from the input: a propop graph "
                                    "takes masks that are constants (a buffer, torch.tril...)")
        a = value.tensor.detach().cpu().numpy()
        if a.ndim > len(shape) and (a.ndim > len(shape) + 1 or a.shape[0] != 1):
            raise _UnsupportedError(f"{what} of shape {tuple(a.shape)} differs between the "
                                    f"samples of a batch (a sample's shape {shape})")
        a = a.reshape(a.shape[1:]) if a.ndim > len(shape) else a
        try:
            return np.broadcast_to(a, shape)
        except ValueError:
            raise _UnsupportedError(f"{what} of shape {tuple(a.shape)} does not broadcast to a "
                                    f"sample's shape {shape}") from None

    def _pieces(self, node: fx.Node) -> tuple[Value, ...]:
        """``split``, ``chunk``, ``unbind`` along a feature dimension: one selection each."""
        (x,) = self._tensors(node.args[:1])
        names = {"split": ("split_size", "dim"), "chunk": ("chunks", "dim"),
                 "unbind": ("dim",)}[getattr(node.target, "__name__", node.target)]
        given = dict(zip(names, node.args[1:])) | dict(node.kwargs)
        d = _feature_dim(given.get("dim", 0), x)
        index = np.arange(x.size).reshape(x.shape)
        pieces, start = [], 0
        for i, meta in enumerate(node.meta["tensor_meta"]):
            piece = tuple(int(n) for n in meta.shape[1:])
            width = 1 if len(piece) < len(x.shape) else piece[d]
            chosen = np.take(index, np.arange(start, start + width), axis=d)
            pieces.append(self._add(self._name(f"{node.name}.{i}", node),
                                    L.Windows(chosen, x.size), [x], piece))
            start += width
        return tuple(pieces)

    def _index(self, node: fx.Node) -> Value | None:
        """``x[:, ...]`` keeping the batch: a selection (:class:`~propop.layers.Windows`).

        Indexing a shape (``x.size()[0]``) gives its number; slices may be bounded by
        numbers computed from shapes (``h[..., :d]``).
        """
        source, index = node.args
        x = self.values.get(source) if isinstance(source, fx.Node) else None
        if isinstance(x, tuple):  # a shape
            return x[index]
        if not isinstance(x, Value):
            return None
        index = tuple(self._number_of(i) for i in (index if isinstance(index, tuple) else
                                                   (index,)))
        bounds = [e for i in index for e in ((i.start, i.stop, i.step) if isinstance(
            i, slice) else (i,))]
        if not index or index[0] != slice(None) or any(
                isinstance(e, (fx.Node, _Batch)) or hasattr(e, "shape") for e in bounds):
            return self._selected(node)  # x[..., ::2], a constant index tensor: probed
        chosen = np.arange(x.size).reshape(x.shape)[index[1:]]
        return self._add(self._name(node.name, node), L.Windows(chosen, x.size), [x],
                         _shape(node))

    def _number_of(self, i: Any) -> Any:
        """An index with the numbers its traced nodes hold (slices' bounds too)."""
        if isinstance(i, slice):
            return slice(*(self._number_of(e) for e in (i.start, i.stop, i.step)))
        value = self.values.get(i, i) if isinstance(i, fx.Node) else i
        return i if isinstance(value, Value) else value

    def _expand(self, name: str, x: Value | dict, parts: list, shape: tuple) -> Value:
        """Add the nodes ``[(suffix, layer, reads)]`` that one operation becomes.

        ``reads`` name the suffixes made before, or the inputs: ``None`` for ``x``, or
        the keys of ``x`` where it is a dict of inputs by name.
        """
        made = dict(x) if isinstance(x, dict) else {None: x}
        for suffix, layer, reads in parts:
            made[suffix] = self._add(name + suffix, layer, [made[r] for r in reads], ())
        return Value(name, tuple(shape))

    def _selected(self, node: fx.Node) -> Value:
        """An operation that moves, copies or zero-pads one sample's entries: a selection.

        Found by PyTorch, which runs it on a probe batch of :data:`_PROBE` samples, the
        entries of sample ``s`` numbered ``s N + 1 .. (s + 1) N``: every output entry
        must read one entry of its own sample, the same in every sample, or be a zero
        of padding (:class:`~propop.layers.Windows`); otherwise it is refused by name
        (it mixes samples, pads with another value, or computes).
        """
        (x,) = self._tensors(node.args[:1])
        shape, n = _shape(node), x.size
        probe = torch.arange(1, _PROBE * n + 1, dtype=torch.float64).reshape((_PROBE, *x.shape))
        args, kwargs = fx.node.map_aggregate(
            (node.args, dict(node.kwargs)),
            lambda a: probe if a is node.args[0] else self._probe_argument(a))
        with torch.no_grad():
            out = node.target(*args, **kwargs) if node.op == "call_function" else \
                getattr(args[0], node.target)(*args[1:], **kwargs)
        what = _callable_name(node.target) if node.op == "call_function" else f".{node.target}()"
        if tuple(out.shape) != (_PROBE, *shape) or self._batch != node.meta[
                "tensor_meta"].shape[0]:
            raise _UnsupportedError(f"{what} changes the batch dimension or depends on the "
                                    "batch size; propop keeps samples apart")
        read = out.reshape(_PROBE, -1)
        pad = read[0] == 0
        offsets = torch.arange(_PROBE, dtype=torch.float64)[:, None] * n
        if not bool(torch.all(torch.where(pad, read == 0, read == read[0] + offsets))) or \
                bool(torch.any(read[0] != read[0].round())) or bool(torch.any(read[0] > n)):
            raise _UnsupportedError(f"{what} is not a selection of a sample's own entries "
                                    "(it mixes the samples, pads with a value other than "
                                    "zero, or computes)")
        index = torch.where(pad, 0, read[0] - 1).to(torch.int64).numpy()
        index[pad.numpy()] = -1
        return self._add(self._name(node.name, node), L.Windows(index, n), [x], shape)

    def _probe_argument(self, a: Any) -> Any:
        """An argument of a probed operation: its number, with :data:`_PROBE` for the batch."""
        if not isinstance(a, fx.Node):
            return a
        value = self.values.get(a)
        if isinstance(value, (Value, _Masked, _Rows)):
            raise _UnsupportedError(f"{a!r} is a second traced tensor; a selection reads one")
        if isinstance(value, (_Parameter, _Constant)):
            if getattr(value.tensor, "requires_grad", False):
                raise _UnsupportedError(f"{a!r} is a trainable parameter")
            return value.tensor
        return tuple(_PROBE if v is BATCH else v for v in value) if isinstance(value, tuple) \
            else _PROBE if value is BATCH else value

    def _stacked(self, node: fx.Node) -> Value:
        """``torch.stack(tensors, dim)``: each given a new dimension of one, concatenated."""
        tensors = self._tensors(node.args[0])
        dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
        if dim < 0:
            dim += len(tensors[0].shape) + 2
        if dim == 0:
            raise _UnsupportedError("torch.stack along the batch dimension")
        grown = [Value(t.node, t.shape[:dim - 1] + (1,) + t.shape[dim - 1:]) for t in tensors]
        layer = L.Concat(dim=dim - 1, shapes=[t.shape for t in grown]) if dim > 1 else L.Concat()
        return self._add(self._name(node.name, node), layer, grown, _shape(node))

    def _like(self, node: fx.Node) -> _Constant:
        """``torch.zeros_like(x)``, ``ones_like``, ``full_like``: a constant of a sample's shape."""
        (x,) = self._tensors(node.args[:1])
        rest = [self._constant_argument(a) for a in node.args[1:]]
        kwargs = {k: self._constant_argument(v) for k, v in node.kwargs.items()}
        made = node.target(torch.empty((1, *x.shape), dtype=node.meta["tensor_meta"].dtype,
                                        device=self._device), *rest, **kwargs)
        return _Constant(made)

    def _new(self, node: fx.Node) -> _Constant:
        """``x.new_tensor(data)``, ``x.new_zeros(size)``, ...: a constant of ``x``'s dtype."""
        self._tensors(node.args[:1])
        args, kwargs = fx.node.map_aggregate((node.args[1:], dict(node.kwargs)),
                                             self._constant_argument)
        like = torch.empty((), dtype=node.meta["tensor_meta"].dtype, device=self._device)
        return _Constant(getattr(like, node.target)(*args, **kwargs))

    def _constant_argument(self, a: Any) -> Any:
        """A node's value where a constant is made from it: numbers, shapes, constants."""
        if not isinstance(a, fx.Node):
            return a
        value = self.values.get(a)
        if value is BATCH or isinstance(value, tuple) and BATCH in value:
            raise _UnsupportedError("a constant the size of the batch: propop computes each "
                                    "sample alone")
        return self._probe_argument(a)

    def _compared(self, node: fx.Node) -> None:
        """A comparison of a traced tensor: a mask that depends on the values is refused."""
        raise _UnsupportedError(f"{_callable_name(node.target)} of a traced tensor: a mask "
                                "that depends on the input's values (torch.where(x > 0, ...)) "
                                "is no fixed function of it; write it as an activation (relu, "
                                "leaky_relu, clamp) or with a constant mask")

    def _concatenate(self, node: fx.Node) -> Value:
        tensors = self._tensors(node.args[0])
        dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
        d = _feature_dim(dim, tensors[0])
        layer = L.Concat() if d == 0 else L.Concat(dim=d, shapes=[t.shape for t in tensors])
        return self._add(self._name(node.name, node), layer, tensors, _shape(node))


    def _pool(self, name: str, x: Value, one_d: bool, maximum: bool, options: dict,
              shape: tuple) -> Value:
        """A pooling node (two for overlapping max pooling) on ``(C, H, W)`` or ``(C, L)``."""
        if options.pop("ceil_mode"):
            raise _UnsupportedError("ceil_mode=True")
        if not maximum and (not options.pop("count_include_pad")
                            or options.pop("divisor_override") is not None):
            raise _UnsupportedError("average pooling needs count_include_pad=True and no "
                               "divisor_override")
        if len(x.shape) != (2 if one_d else 3):
            raise _UnsupportedError(f"pooling on an input of shape {x.shape}")
        plane = (x.shape[0], 1, x.shape[1]) if one_d else x.shape
        if one_d:  # (C, L) as (C, 1, L): one row
            options = {k: None if v is None else (0 if k == "padding" else 1,
                                                  v if np.isscalar(v) else v[0])
                       for k, v in options.items()}
        if maximum:
            parts = L.max_pool(input_shape=plane, **options)
            return self._expand(name, x, [(s, layer, [None if i == 0 else parts[0][0]])
                                          for i, (s, layer) in enumerate(parts)], shape)
        return self._add(name, L.AvgPool2d(input_shape=plane, **options), [x], shape)


class _UnsupportedError(Exception):
    """What the translator cannot import, turned into a ``ValueError`` naming the node."""


# -- modules ------------------------------------------------------------------------------
def to_numpy(t: torch.Tensor | None) -> Any:
    """A tensor as a float64 NumPy array of its own (``None`` stays ``None``)."""
    return None if t is None else t.detach().to(torch.float64).cpu().numpy().copy()


def _linear(self: _Translator, module: nn.Linear, x: Value, name: str, node: fx.Node) -> Value:
    return _linear_of(self, module, x, name, node.target)


def _linear_of(self: _Translator, module: nn.Linear, x: Value, name: str, path: str) -> Value:
    """``module(x)``, the parameters those of the module at ``path``."""
    self.origins[name] = (path, _names(module, W="weight", b="bias"))
    return self._add(name, _dense(x, self.array(module.weight), self.array(module.bias)), [x],
                     (*x.shape[:-1], module.out_features))


def _dense(x: Value, W: Any, b: Any) -> Any:
    """``nn.Linear``'s layer: a :class:`~propop.layers.Dense` on features.

    On each token of a ``(..., features)`` sample, a :class:`~propop.layers.TokenDense`.
    """
    if len(x.shape) == 1:
        return L.Dense(W, b)
    return L.TokenDense(W, b, tokens=int(np.prod(x.shape[:-1])))


def _convolution(self: _Translator, module: Any, x: Value, name: str, node: fx.Node) -> Value:
    one_d = isinstance(module, nn.Conv1d)
    if module.padding_mode != "zeros":
        raise _UnsupportedError(f"padding_mode={module.padding_mode!r} (zeros only)")
    if len(x.shape) != (2 if one_d else 3):
        raise _UnsupportedError(f"{type(module).__name__} on an input of shape {x.shape}")
    padding = _padding(module)
    W, b = self.array(module.weight), self.array(module.bias)
    options = dict(stride=module.stride, padding=padding, dilation=module.dilation,
                   groups=module.groups)
    if one_d:
        options = {k: (v[0] if isinstance(v, tuple) else v) for k, v in options.items()}
        layer = L.Conv1d(W, b, input_shape=x.shape, **options)
    else:
        layer = L.Conv2d(W, b, input_shape=x.shape, **options)
    self.origins[name] = (node.target, _names(module, W="weight", b="bias"))
    return self._add(name, layer, [x], _shape(node))


def _padding(module: Any) -> Any:
    """Numeric padding; ``"same"`` only where it is symmetric."""
    if module.padding == "valid":
        return 0
    if module.padding != "same":
        return module.padding
    total = [d * (k - 1) for d, k in zip(module.dilation, module.kernel_size)]
    if any(t % 2 for t in total):
        raise _UnsupportedError("padding='same' with an even (dilated) kernel pads unevenly")
    return tuple(t // 2 for t in total)


def _pooling(self: _Translator, module: Any, x: Value, name: str, node: fx.Node) -> Value:
    one_d = isinstance(module, (nn.AvgPool1d, nn.MaxPool1d))
    options = {k: getattr(module, k) for k in ("kernel_size", "stride", "padding")}
    options["ceil_mode"] = module.ceil_mode
    if isinstance(module, nn.MaxPool1d | nn.MaxPool2d):
        options["dilation"] = module.dilation
    else:
        options["count_include_pad"] = module.count_include_pad
        options["divisor_override"] = getattr(module, "divisor_override", None)
    return self._pool(name, x, one_d, isinstance(module, nn.MaxPool1d | nn.MaxPool2d),
                      options, _shape(node))


def _adaptive(self: _Translator, module: Any, x: Value, name: str, node: fx.Node) -> Value:
    """Adaptive average and max pooling (1-D, 2-D) whose output sizes divide the input's.

    Pooling with kernel and stride ``input // output``.
    """
    one_d = isinstance(module, nn.AdaptiveAvgPool1d | nn.AdaptiveMaxPool1d)
    maximum = isinstance(module, nn.AdaptiveMaxPool1d | nn.AdaptiveMaxPool2d)
    kind = type(module).__name__
    if maximum and module.return_indices:
        raise _UnsupportedError(f"{kind} with return_indices=True")
    out = _shape(node)[1:]
    if len(x.shape) != (2 if one_d else 3) or any(n % o for n, o in zip(x.shape[1:], out)):
        raise _UnsupportedError(f"{kind} from {x.shape[1:]} to {out}: the output sizes "
                                "must divide the input's")
    kernel = tuple(n // o for n, o in zip(x.shape[1:], out))
    options = dict(kernel_size=kernel, stride=kernel, padding=0, ceil_mode=False) | (
        dict(dilation=1) if maximum else dict(count_include_pad=True, divisor_override=None))
    return self._pool(name, x, one_d, maximum, options, _shape(node))


def _group_norm(self: _Translator, module: nn.GroupNorm | Any, x: Value, name: str,
                node: fx.Node) -> Value:
    """``GroupNorm``, and ``InstanceNorm1d/2d`` (a group per channel) on its own statistics.

    The ``C`` channels of a ``(C, ...)`` sample in ``G`` groups are, flat in C order, a
    ``(G, C / G * spatial)`` array normalised over its last axis (:func:`layer_norm_over`),
    then the per-channel affine map (a :class:`~propop.layers.BatchNorm` of mean 0 and
    variance 1: ``weight_c x + bias_c`` exactly).
    """
    instance = not isinstance(module, nn.GroupNorm)
    if instance and module.track_running_stats and not module.training:
        return _batch_norm(self, module, x, name, node)  # the running statistics: affine
    C = x.shape[0]
    groups = C if instance else module.num_groups
    size = C // groups * int(np.prod(x.shape[1:]))
    parts = L.layer_norm_over((groups, size), 1, module.eps)
    if not module.affine:
        return self._expand(name, x, parts, x.shape)
    self.origins[name] = (node.target, {"weight": "weight", "bias": "bias"})
    rename = {"": ".normalised"}
    parts = [(rename.get(s, s), layer, [rename.get(r, r) for r in reads])
             for s, layer, reads in parts]
    affine = L.BatchNorm(np.zeros(C), np.ones(C), eps=0.0, input_shape=x.shape,
                         weight=self.array(module.weight), bias=self.array(module.bias))
    return self._expand(name, x, parts + [("", affine, [".normalised"])], x.shape)


def _batch_norm(self: _Translator, module: Any, x: Value, name: str, node: fx.Node) -> Value:
    if module.training or module.running_mean is None:
        raise _UnsupportedError(f"{type(module).__name__} in training mode (or without running "
                           "statistics): call module.eval() first, propop imports the affine "
                           "map of evaluation mode")
    layer = L.BatchNorm(to_numpy(module.running_mean), to_numpy(module.running_var),
                        eps=module.eps, input_shape=x.shape, weight=self.array(module.weight),
                        bias=self.array(module.bias))
    if module.affine:
        self.origins[name] = (node.target, {"weight": "weight", "bias": "bias"})
    return self._add(name, layer, [x], x.shape)


def _prelu(self: _Translator, module: nn.PReLU, x: Value, name: str, node: fx.Node) -> Value:
    """``relu(x) + a min(x, 0)``, with ``min(x, 0) = x - relu(x)``.

    The slopes ``a`` (one, or one per channel of a ``(C, ...)`` sample) are a linear
    node's parameter, their gradient ``sum grad min(x, 0)``; the slope at 0 is ``a``,
    as PyTorch's backward takes it.
    """
    slopes = self.array(module.weight)
    if slopes.shape[0] not in (1, x.shape[0]):
        raise _UnsupportedError(f"PReLU of {slopes.shape[0]} slopes on a sample of shape "
                                f"{x.shape}")
    self.origins[name + ".scaled"] = (node.target, {"weight": "weight"})
    scaled = L.ElementwiseAffine(slopes, spread=x.size // slopes.shape[0])
    return self._expand(name, x, [(".positive", L.Activation("relu"), [None]),
                                  (".negative", L.Add((1, -1)), [None, ".positive"]),
                                  (".scaled", scaled, [".negative"]),
                                  ("", L.Add(), [".positive", ".scaled"])], x.shape)


def drops_out(module: nn.Module) -> bool:
    """Whether ``module`` is a dropout that zeroes entries at random now (training, ``p > 0``)."""
    return isinstance(module, nn.modules.dropout._DropoutNd) and module.training and \
        module.p > 0


def _embedding_rows(path: str, module: nn.Embedding, index: torch.Tensor) -> Any:
    """``module(index)`` at constant indices: :class:`_Rows` of a trainable table, else a constant.

    The options that change the gradient (``scale_grad_by_freq``, ``sparse``, a
    ``padding_idx`` read) or the weights (``max_norm``) are refused.
    """
    if index.dtype not in (torch.int32, torch.int64):
        raise _UnsupportedError(f"Embedding at {path} reads indices of dtype {index.dtype}")
    rows = index.detach().cpu().numpy()
    if not module.weight.requires_grad:
        with torch.no_grad():
            return _Constant(module(index))
    refused = {"max_norm (it renormalises the table in place)": module.max_norm is not None,
               "scale_grad_by_freq": module.scale_grad_by_freq, "sparse=True": module.sparse,
               f"padding_idx={module.padding_idx} among the indices (no gradient there)":
               module.padding_idx is not None and bool(np.any(rows == module.padding_idx))}
    for what, set_ in refused.items():
        if set_:
            raise _UnsupportedError(f"Embedding at {path} with {what}")
    return _Rows(f"{path}.weight", module.weight, rows)


def _dropout(self: _Translator, module: Any, x: Value, name: str, node: fx.Node) -> Value:
    if drops_out(module):
        raise _UnsupportedError(f"{type(module).__name__}(p={module.p}) in training mode: "
                                "call module.eval() first (in evaluation mode, or with p=0, "
                                "it is the identity)")
    return x


def _identity(self: _Translator, module: Any, x: Value, name: str, node: fx.Node) -> Value:
    return Value(x.node, _shape(node))


def _activation_module(self: _Translator, module: Any, x: Value, name: str, node: fx.Node
                       ) -> Value:
    kind = ACTIVATIONS[type(module)]
    if kind == "gelu_erf" and module.approximate == "tanh":
        kind = "gelu"
    settings = {key: getattr(module, key) for key in _SETTINGS.get(kind, ())}
    return self._add(name, L.Activation(_member(kind, settings)), [x], x.shape)


def _member(kind: str, settings: dict) -> Any:
    """The activation ``kind`` at a module's or call's ``settings``, or the refusal naming one."""
    if kind in PARTIAL:
        return PARTIAL[kind]
    try:
        return get_activation(kind, **settings)
    except (TypeError, ValueError) as error:
        raise _UnsupportedError(str(error)) from None


def _softmax_module(self: _Translator, module: Any, x: Value | _Masked, name: str,
                    node: fx.Node) -> Value:
    if module.dim is None:
        raise _UnsupportedError(f"{type(module).__name__} needs dim")
    return self._softmax_of(name, x, module.dim, isinstance(module, nn.LogSoftmax))


def _layer_norm_module(self: _Translator, module: nn.LayerNorm | nn.RMSNorm, x: Value,
                       name: str, node: fx.Node) -> Value:
    return _norm_of(self, module, x, name, node.target, node)


def _norm_of(self: _Translator, module: nn.LayerNorm | nn.RMSNorm, x: Value, name: str,
             path: str, node: fx.Node) -> Value:
    """``module(x)``, the parameters those of the module at ``path``."""
    bias = getattr(module, "bias", None)  # an RMSNorm has none
    if module.elementwise_affine:
        self.origins[name] = (path, {"weight": "weight"} | (
            {} if bias is None else {"bias": "bias"}))
    return self._layer_norm(name, x, module.normalized_shape, module.eps, module.weight,
                            bias, node, centred=isinstance(module, nn.LayerNorm))


def _multihead(self: _Translator, module: nn.MultiheadAttention, x: Value, name: str,
               node: fx.Node) -> tuple:
    """``nn.MultiheadAttention`` as self-attention (``batch_first``): ``(output, weights)``.

    The weights (averaged over heads unless ``average_attn_weights=False``) are built
    only where the module's second output is read (:func:`_self_attention`).
    """
    names = ("query", "key", "value", "key_padding_mask", "need_weights", "attn_mask",
             "average_attn_weights", "is_causal")
    given = dict(zip(names, node.args)) | dict(node.kwargs)
    if not given["query"] is given.get("key") is given.get("value"):
        raise _UnsupportedError("MultiheadAttention with cross-attention (query, key and "
                                "value differ): self-attention is supported")
    read = any(u.target is operator.getitem and u.args[1] == 1 for u in node.users)
    weights = None if not (read and given.get("need_weights", True)) else (
        "average" if given.get("average_attn_weights", True) else "heads")
    return _self_attention(self, module, x, name, node.target, given.get("attn_mask"),
                           given.get("key_padding_mask"), weights)


def _self_attention(self: _Translator, module: nn.MultiheadAttention, x: Value, name: str,
                    path: str, mask: Any, padding: Any, weights: str | None) -> tuple:
    """The nodes of ``module(x, x, x, attn_mask=mask)``: ``(output, weights or None)``.

    The packed ``in_proj_weight`` is one per-token projection to ``[q; k; v]``, sliced
    apart, the heads a view and a permutation, :func:`_attend`, ``out_proj``;
    ``weights`` is ``"average"`` (over heads), ``"heads"`` or ``None`` (not built).
    """
    refused = {"batch_first=False (the batch would not come first)": not module.batch_first,
               "add_bias_kv=True": module.bias_k is not None,
               "add_zero_attn=True": module.add_zero_attn,
               "dropout in training mode": module.dropout > 0 and module.training,
               "a key_padding_mask (one per sample)": padding is not None,
               "an attn_mask per sample and head (N * heads, T, S)":
               getattr(self.values.get(mask), "tensor", np.empty(0)).ndim == 3}
    for what, why in refused.items():
        if why:
            raise _UnsupportedError(f"MultiheadAttention with {what}: self-attention with "
                                    "batch_first=True is supported")
    E, H = module.embed_dim, module.num_heads
    T = x.shape[0]
    self.origins[f"{name}.in_proj"] = (path, _names(module, W="in_proj_weight",
                                                    b="in_proj_bias"))
    qkv = self._add(f"{name}.in_proj", L.TokenDense(self.array(module.in_proj_weight),
                                                    self.array(module.in_proj_bias), T),
                    [x], (T, 3 * E))
    heads = []
    for part, start in zip("qkv", (0, E, 2 * E)):
        index = np.arange(qkv.size).reshape(T, 3 * E)[:, start:start + E]
        sliced = self._add(f"{name}.{part}", L.Windows(index, qkv.size), [qkv], (T, E))
        heads.append(self._permuted(f"{name}.{part}.heads", Value(sliced.node, (T, H, E // H)),
                                    [1, 0, 2]))
    attended, each = _attend(self, f"{name}.attention", *heads, None, mask, blocked=True)
    merged = self._permuted(f"{name}.merged", attended, [1, 0, 2])
    out = _linear_of(self, module.out_proj, Value(merged.node, (T, E)), name,
                     f"{path}.out_proj")
    if weights != "average":
        return out, each if weights else None
    return out, self._add(f"{name}.weights", L.reduction_over(each.shape, [0], True),
                          [each], each.shape[1:])


def _encoder_layer(self: _Translator, module: nn.TransformerEncoderLayer, x: Value,
                   name: str, node: fx.Node) -> Value:
    """``nn.TransformerEncoderLayer(src, src_mask)`` (:func:`_encoder_block`)."""
    given = dict(zip(("src", "src_mask", "src_key_padding_mask"), node.args)) | \
        dict(node.kwargs)
    return _encoder_block(self, module, x, name, node.target, given.get("src_mask"),
                          given.get("src_key_padding_mask"), node)


def _encoder(self: _Translator, module: nn.TransformerEncoder, x: Value, name: str,
             node: fx.Node) -> Value:
    """``nn.TransformerEncoder(src, mask)``: its layers in turn, then its ``norm``."""
    given = dict(zip(("src", "mask", "src_key_padding_mask"), node.args)) | dict(node.kwargs)
    for i, layer in enumerate(module.layers):
        last = i == len(module.layers) - 1 and module.norm is None
        x = _encoder_block(self, layer, x, name if last else f"{name}.layers.{i}",
                           f"{node.target}.layers.{i}", given.get("mask"),
                           given.get("src_key_padding_mask"), node)
    if module.norm is None:
        return x
    return _norm_of(self, module.norm, x, name, f"{node.target}.norm", node)


def _encoder_block(self: _Translator, layer: nn.TransformerEncoderLayer, x: Value, name: str,
                   path: str, mask: Any, padding: Any, node: fx.Node) -> Value:
    """One encoder layer's nodes, PyTorch's ``forward`` (evaluation mode: no dropout).

    ``norm_first``: ``x + sa(norm1(x))``, then ``+ ff(norm2(.))``; otherwise
    ``norm1(x + sa(x))``, then ``norm2(. + ff(.))``, with ``sa`` the self-attention
    and ``ff`` ``linear2(activation(linear1(.)))``. The last node is ``name``.
    """
    if layer.training and layer.dropout.p > 0:
        raise _UnsupportedError("TransformerEncoderLayer in training mode (dropout): call "
                                "module.eval() first")
    activation = _FUNCTIONS.get(layer.activation) or ACTIVATIONS.get(type(layer.activation))
    if activation is None:
        raise _UnsupportedError(f"TransformerEncoderLayer with the activation "
                                f"{layer.activation!r}")

    def norm(i: int, h: Value, last: bool) -> Value:
        return _norm_of(self, getattr(layer, f"norm{i}"), h, name if last else f"{name}.norm{i}",
                        f"{path}.norm{i}", node)

    def add(i: int, a: Value, b: Value, last: bool) -> Value:
        return self._add(name if last else f"{name}.add{i}", L.Add(), [a, b], a.shape)

    def block(h: Value, i: int) -> Value:
        if i == 1:
            return _self_attention(self, layer.self_attn, h, f"{name}.self_attn",
                                   f"{path}.self_attn", mask, padding, None)[0]
        h = _linear_of(self, layer.linear1, h, f"{name}.linear1", f"{path}.linear1")
        h = _activation_module(self, layer.activation, h, f"{name}.activation", node) if \
            isinstance(layer.activation, nn.Module) else self._add(
                f"{name}.activation", L.Activation(_member(activation, {})), [h], h.shape)
        return _linear_of(self, layer.linear2, h, f"{name}.linear2", f"{path}.linear2")

    for i in (1, 2):
        if layer.norm_first:
            x = add(i, x, block(norm(i, x, False), i), i == 2)
        else:
            x = norm(i, add(i, x, block(x, i), False), i == 2)
    return x


_MODULES: list[tuple[Any, Callable]] = [
    (nn.Linear, _linear), (nn.Conv1d | nn.Conv2d, _convolution),
    (nn.AvgPool1d | nn.AvgPool2d | nn.MaxPool1d | nn.MaxPool2d, _pooling),
    (nn.AdaptiveAvgPool1d | nn.AdaptiveAvgPool2d | nn.AdaptiveMaxPool1d | nn.AdaptiveMaxPool2d,
     _adaptive),
    (nn.GroupNorm | nn.InstanceNorm1d | nn.InstanceNorm2d, _group_norm),
    (nn.BatchNorm1d | nn.BatchNorm2d, _batch_norm),
    (nn.Dropout | nn.Dropout1d | nn.Dropout2d, _dropout),
    (_IDENTITY_MODULES, _identity), (tuple(ACTIVATIONS), _activation_module),
    (nn.PReLU, _prelu), (nn.MultiheadAttention, _multihead),
    (nn.GLU, lambda self, module, x, name, node: self._glu_of(name, x, module.dim,
                                                              _shape(node))),
    (nn.TransformerEncoderLayer, _encoder_layer), (nn.TransformerEncoder, _encoder),
    (nn.Softmax | nn.LogSoftmax, _softmax_module), (nn.LayerNorm | nn.RMSNorm, _layer_norm_module),
]


def _supported() -> str:
    names = ["Linear", "Conv1d", "Conv2d", "AvgPool1d", "AvgPool2d", "MaxPool1d", "MaxPool2d",
             "AdaptiveAvgPool1d/2d", "AdaptiveMaxPool1d/2d", "BatchNorm1d", "BatchNorm2d (eval)",
             "GroupNorm", "InstanceNorm1d/2d", "PReLU", "MultiheadAttention (self-attention)",
             "TransformerEncoderLayer", "TransformerEncoder",
             "Dropout (eval)",
             "Identity", "Flatten", "Unflatten", "Softmax", "LogSoftmax", "LayerNorm",
             "RMSNorm", "GLU"]
    return ", ".join(names + [k.__name__ for k in ACTIVATIONS])


# -- functions ------------------------------------------------------------------------------
_OPERATORS = {"add": "add", "sub": "sub", "mul": "mul", "div": "div"}


class _Batch:
    """The batch size in a traced shape: any batch may come, so no number."""

    def __repr__(self) -> str:
        return "batch"


BATCH = _Batch()
_NUMBER_FUNCTIONS = {operator.add: operator.add, operator.sub: operator.sub,
                     operator.mul: operator.mul, operator.floordiv: operator.floordiv,
                     operator.truediv: operator.truediv, math.sqrt: math.sqrt}


def _number(f: Callable, args: list) -> Any:
    """Shape arithmetic (``d // heads``, ``math.sqrt(d)``); with the batch size, :data:`BATCH`."""
    return BATCH if any(a is BATCH for a in args) else _NUMBER_FUNCTIONS[f](*args)


def _f_linear(self: _Translator, node: fx.Node) -> Value:
    x, weight = self._tensors(node.args[:1])[0], node.args[1]
    bias = node.args[2] if len(node.args) > 2 else node.kwargs.get("bias")
    W, b = (self.values.get(a) if isinstance(a, fx.Node) else a for a in (weight, bias))
    if not isinstance(W, _Parameter) or not (b is None or isinstance(b, _Parameter)):
        raise _UnsupportedError("F.linear with weights that are not a module's parameters")
    path = W.target.rpartition(".")[0]
    name = self._name(path or node.name, node)
    self.origins[name] = (path, {"W": W.target.rpartition(".")[2]} | (
        {} if b is None else {"b": b.target.rpartition(".")[2]}))
    layer = _dense(x, self.array(W.tensor), None if b is None else self.array(b.tensor))
    return self._add(name, layer, [x], _shape(node))


def _attention(self: _Translator, node: fx.Node) -> Value:
    """``F.scaled_dot_product_attention(q, k, v, scale=...)``: ``softmax(q k^T scale) v``.

    Built from its pieces (:meth:`_Translator._product`, a softmax over the keys), every
    one exact; ``is_causal`` softmaxes each query's keys up to its own (the masked
    weights exact zeros); a given mask, dropout and grouped heads are refused by name.
    """
    names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale",
             "enable_gqa")
    given = dict(zip(names, node.args)) | dict(node.kwargs)
    for key, default in (("dropout_p", 0.0), ("enable_gqa", False)):
        if given.get(key, default) != default:
            raise _UnsupportedError(f"scaled_dot_product_attention with {key}="
                                    f"{given[key]!r} (only {key}={default!r})")
    q, k, v = self._tensors([given["query"], given["key"], given["value"]])
    mask = given.get("attn_mask")
    if given.get("is_causal"):  # query i sees keys j <= i (PyTorch refuses a mask too)
        mask = np.tril(np.ones((q.shape[-2], k.shape[-2]), dtype=bool))
    return _attend(self, self._name(node.name, node), q, k, v, given.get("scale"),
                   mask, blocked=False)[0]


def _attend(self: _Translator, name: str, q: Value, k: Value, v: Value, scale: Any,
            mask: Any = None, blocked: bool = False) -> tuple[Value, Value]:
    """``softmax(q k^T scale + mask) v`` over a sample's heads, and the weights.

    A boolean ``mask`` (an array, or a traced constant) keeps the entries where it is
    true (``blocked``: where it is false, as ``nn.MultiheadAttention`` reads it); a float
    one is added, its ``-inf`` entries dropped from the softmax (their weights exact
    zeros: :func:`~propop.layers.softmax_over`'s ``keep``).
    """
    scale = scale or 1 / math.sqrt(q.shape[-1])
    keys = self._permuted(f"{name}.keys", k, [*range(len(k.shape) - 2), len(k.shape) - 1,
                                              len(k.shape) - 2])
    scores = self._product(f"{name}.scores", q, keys)
    keep, shift = None, None
    if mask is not None:
        m = mask if isinstance(mask, np.ndarray) else self._sample_constant(
            mask, scores.shape, "attn_mask")
        if m.dtype == bool:
            keep = ~m if blocked else m
        elif np.isnan(m).any() or (m == np.inf).any():
            raise _UnsupportedError("an attn_mask with NaN or +inf entries")
        else:
            finite = np.isfinite(m)
            keep = None if finite.all() else finite
            shift = np.broadcast_to(np.where(finite, m, 0.0), scores.shape).reshape(-1)
    scaled = self._add(f"{name}.scaled", L.LinearMap(
        [float(scale) * sp.eye_array(scores.size, format="csr")],
        None if shift is None else np.array(shift, dtype=float), name="ConstantMul"),
        [scores], scores.shape)
    weights = self._softmax_of(f"{name}.weights", scaled, -1, keep=keep)
    return self._product(name, weights, v), weights


def _f_dropout(self: _Translator, node: fx.Node) -> Value:
    p = node.args[1] if len(node.args) > 1 else node.kwargs.get("p", 0.5)
    training = node.args[2] if len(node.args) > 2 else node.kwargs.get("training", True)
    if training and p > 0:
        raise _UnsupportedError(f"F.dropout(p={p}) with training=True: pass "
                                "training=self.training and call module.eval() first")
    return self._tensors(node.args[:1])[0]


def _f_pool(maximum: bool) -> Callable:
    def convert(self: _Translator, node: fx.Node) -> Value:
        (x,) = self._tensors(node.args[:1])
        names = ["kernel_size", "stride", "padding"] + (["dilation"] if maximum else [])
        options = dict(zip(names, node.args[1:])) | {k: v for k, v in node.kwargs.items()}
        options.setdefault("stride", None)
        options.setdefault("padding", 0)
        options.setdefault("ceil_mode", False)
        if maximum:
            options.setdefault("dilation", 1)
            if options.pop("return_indices", False):
                raise _UnsupportedError("return_indices=True")
        else:
            options.setdefault("count_include_pad", True)
            options.setdefault("divisor_override", None)
        if options["stride"] is None or options["stride"] == []:
            options["stride"] = options["kernel_size"]
        return self._pool(self._name(node.name, node), x, False, maximum, options, _shape(node))

    return convert


def _f_norm(centred: bool) -> Callable:
    return lambda self, node: _f_layer_norm(self, node, centred)


def _f_layer_norm(self: _Translator, node: fx.Node, centred: bool = True) -> Value:
    """``F.layer_norm(x, shape, weight, bias, eps)``, or ``F.rms_norm(x, shape, weight, eps)``."""
    (x,) = self._tensors(node.args[:1])
    names = ("normalized_shape", "weight", "bias", "eps") if centred else (
        "normalized_shape", "weight", "eps")
    given = dict(zip(names, node.args[1:])) | dict(node.kwargs)
    tensors = [self.values.get(given.get(k)) if isinstance(given.get(k), fx.Node) else
               given.get(k) for k in ("weight", "bias")]
    if not all(t is None or isinstance(t, _Parameter) for t in tensors):
        raise _UnsupportedError(f"F.{'layer' if centred else 'rms'}_norm with a weight or "
                                "bias that is not a module's parameter")
    name = self._name(node.name, node)
    weight, bias = (None if t is None else t.tensor for t in tensors)
    present = [t for t in tensors if t is not None]
    if present:
        path = present[0].target.rpartition(".")[0]
        if any(t.target.rpartition(".")[0] != path for t in present):
            raise _UnsupportedError(f"F.{'layer' if centred else 'rms'}_norm with a weight "
                                    "and a bias of different modules")
        self.origins[name] = (path, {k: t.target.rpartition(".")[2]
                                     for k, t in zip(("weight", "bias"), tensors)
                                     if t is not None})
    return self._layer_norm(name, x, given["normalized_shape"],
                            given.get("eps", 1e-5 if centred else None), weight, bias, node,
                            centred)


def _softmax_function(log: bool) -> Callable:
    return lambda self, node: self._softmax(node, log)


def _arithmetic_function(op: str) -> Callable:
    return lambda self, node: self._arithmetic(node, op)


# operations that move, copy or pad a sample's entries (found by probing: _selected)
_SELECTIONS = {"flip", "fliplr", "flipud", "roll", "rot90", "repeat", "tile", "expand",
               "narrow", "movedim", "moveaxis", "index_select", "repeat_interleave", "t",
               "diagonal", "tril", "triu"}
_PROBE = 3  # the probe batch's samples (the traced example has 2)
_LIKE = {torch.zeros_like, torch.ones_like, torch.full_like}
_FUNCTION_HANDLERS: dict[Any, Callable] = {
    operator.add: _arithmetic_function("add"), torch.add: _arithmetic_function("add"),
    operator.sub: _arithmetic_function("sub"), torch.sub: _arithmetic_function("sub"),
    operator.mul: _arithmetic_function("mul"), torch.mul: _arithmetic_function("mul"),
    operator.truediv: _arithmetic_function("div"), torch.div: _arithmetic_function("div"),
    operator.neg: _arithmetic_function("neg"), torch.neg: _arithmetic_function("neg"),
    torch.cat: _Translator._concatenate, torch.concat: _Translator._concatenate,
    torch.flatten: _Translator._reshape, torch.reshape: _Translator._reshape,
    F.linear: _f_linear, F.dropout: _f_dropout,
    F.max_pool2d: _f_pool(True), F.avg_pool2d: _f_pool(False),
    F.softmax: _softmax_function(False), torch.softmax: _softmax_function(False),
    F.log_softmax: _softmax_function(True), torch.log_softmax: _softmax_function(True),
    operator.getitem: _Translator._index, F.layer_norm: _f_norm(True),
    F.rms_norm: _f_norm(False),
    torch.sum: lambda self, node: self._reduction(node, mean=False),
    torch.mean: lambda self, node: self._reduction(node, mean=True),
    operator.pow: _Translator._power, torch.pow: _Translator._power,
    torch.sqrt: lambda self, node: self._power(node, 0.5),
    torch.rsqrt: lambda self, node: self._power(node, -0.5),
    torch.transpose: _Translator._permute, torch.permute: _Translator._permute,
    torch.swapaxes: _Translator._permute,
    operator.matmul: _Translator._matmul, torch.matmul: _Translator._matmul,
    torch.bmm: _Translator._matmul, F.scaled_dot_product_attention: _attention,
    torch.masked_fill: _Translator._masked_fill, torch.split: _Translator._pieces,
    torch.chunk: _Translator._pieces, torch.unbind: _Translator._pieces,
    torch.square: lambda self, node: self._power(node, 2.0), torch.stack: _Translator._stacked,
    torch.var: lambda self, node: self._moments(node, "var"),
    torch.std: lambda self, node: self._moments(node, "std"),
    torch.norm: lambda self, node: self._moments(node, "norm"),
    torch.linalg.vector_norm: lambda self, node: self._moments(node, "norm"),
    torch.linalg.norm: lambda self, node: self._moments(node, "norm"),
    F.normalize: _Translator._normalize, torch.logsumexp: _Translator._logsumexp,
    F.glu: _Translator._glu, torch.einsum: _Translator._einsum,
    torch.cumsum: _Translator._cumsum,
    torch.max: lambda self, node: self._extreme(node, maximum=True),
    torch.min: lambda self, node: self._extreme(node, maximum=False),
    torch.maximum: lambda self, node: self._pairwise(node, maximum=True),
    torch.minimum: lambda self, node: self._pairwise(node, maximum=False),
    torch.amax: lambda self, node: self._extreme(node, maximum=True, split=True),
    torch.amin: lambda self, node: self._extreme(node, maximum=False, split=True),
    F.pad: _Translator._selected,
    **{getattr(torch, name): _Translator._selected for name in _SELECTIONS
       if hasattr(torch, name)},
    **{f: _Translator._compared for f in (operator.gt, operator.lt, operator.ge, operator.le,
                                          operator.eq, operator.ne, torch.gt, torch.lt,
                                          torch.ge, torch.le, torch.eq, torch.ne)},
}
_RANDOM = {torch.rand, torch.randn, torch.randint, torch.rand_like, torch.randn_like,
           torch.randint_like, torch.randperm, torch.bernoulli, torch.normal,
           torch.multinomial, torch.poisson}
_POWERS = {"pow": None, "sqrt": 0.5, "rsqrt": -0.5, "square": 2.0}



# -- helpers --------------------------------------------------------------------------------
def _shape(node: fx.Node) -> tuple:
    """One sample's shape of a traced tensor (its batch dimension dropped)."""
    meta = node.meta.get("tensor_meta")
    if meta is None or not hasattr(meta, "shape"):
        raise _UnsupportedError("the operation does not give one tensor")
    return tuple(int(n) for n in meta.shape[1:])


def _negation(size: int) -> Any:
    """``-x`` of ``size`` entries, a linear map."""
    return L.LinearMap([-sp.eye_array(size, format="csr")], name="Negate")


def _arguments(node: fx.Node, names: Sequence[str]) -> dict:
    """A call's arguments after the input, by ``names`` in positional order, and its keywords."""
    return dict(zip(names, node.args[1:])) | dict(node.kwargs)


def _reduced(dim: Any, x: Value, what: str) -> list[int]:
    """The sorted feature dimensions ``dim`` names (one or several); the batch's refused."""
    if dim is None:
        raise _UnsupportedError(f"{what} over every dimension, the batch's included: propop "
                                "keeps samples apart; give dim")
    return sorted(_feature_dim(d, x) for d in (dim if isinstance(dim, (tuple, list))
                                               else (dim,)))


def _feature_dim(dim: int, x: Value) -> int:
    """A torch dimension of the batch (``dim`` counts the batch) as an index into ``x.shape``."""
    d = dim if dim >= 0 else dim + len(x.shape) + 1
    if d == 0 or not 0 < d <= len(x.shape):
        raise _UnsupportedError(f"dim={dim} for a batch of shape (batch, *{x.shape}): propop "
                           "keeps samples apart, so dim 0 is not a feature dimension")
    return d - 1


def _attribute(module: nn.Module, target: str) -> torch.Tensor:
    owner, _, name = target.rpartition(".")
    return getattr(module.get_submodule(owner) if owner else module, name)


def _callable_name(target: Any) -> str:
    module = getattr(target, "__module__", None) or ""
    return f"{module}.{getattr(target, '__name__', repr(target))}".lstrip(".")


def _names(module: nn.Module, **ours: str) -> dict:
    """``{propop name: torch name}`` of the parameters ``module`` has (a bias may be None)."""
    return {k: theirs for k, theirs in ours.items() if getattr(module, theirs) is not None}


_IN_PLACE = {operator.iadd: "+=", operator.isub: "-=", operator.imul: "*=",
             operator.itruediv: "/="}


def _overwrites(module: fx.GraphModule, node: fx.Node) -> str | None:
    """How ``node`` overwrites its first input in place (``None`` if it does not)."""
    if node.op == "call_module":
        sub = module.get_submodule(node.target)
        return f"{type(sub).__name__}(inplace=True)" if getattr(sub, "inplace", False) else None
    if node.op == "call_function":
        if node.target in _IN_PLACE:
            return _IN_PLACE[node.target]
        if node.kwargs.get("inplace") or (getattr(node.target, "__name__", "").endswith("_")
                                          and not node.target.__name__.startswith("_")):
            return f"{_callable_name(node.target)}(inplace)"
    if node.op == "call_method" and node.target.endswith("_") and \
            not node.target.startswith("_"):
        return f".{node.target}()"
    return None


def _require_safe_in_place(module: fx.GraphModule, node: fx.Node) -> None:
    """An in-place operation is its out-of-place twin only if nothing else reads the input.

    PyTorch overwrites the tensor (and every view of it): a node that reads it,
    or a tensor it is a view of, would see the new values, which a propop graph
    (one value per node) cannot say. Refused by name, with its readers.
    """
    how = _overwrites(module, node)
    if how is None or not node.args or not isinstance(node.args[0], fx.Node):
        return
    aliases, current = [], node.args[0]
    while isinstance(current, fx.Node):  # the tensor and what it is a view of
        aliases.append(current)
        views = current.op == "call_method" and current.target in _RESHAPES or (
            current.op == "call_function" and current.target in (torch.flatten, torch.reshape))
        current = current.args[0] if views and current.args else None
    readers = sorted({user.name for alias in aliases for user in alias.users
                      if user is not node and user not in aliases})
    if readers:
        raise _UnsupportedError(f"{how} overwrites {node.args[0].name!r}, which "
                                f"{', '.join(map(repr, readers))} also read: the imported "
                                "graph would give them the old values; use the out-of-place "
                                "operation (inplace=False, or x = x + y)")


def _traced_frame(module: nn.Module, error: BaseException) -> str:
    """``Block.forward (module 'layer1') at model.py:12: if x.sum() > 0:`` of a tracing error.

    The innermost frame of the error's traceback outside PyTorch and propop, and
    the module whose ``forward`` it is (by its ``self``).
    """
    import traceback

    paths = {id(m): path for path, m in module.named_modules()}
    ours = (os.path.dirname(torch.__file__), os.path.dirname(__file__))
    found = "forward()"
    frames = traceback.walk_tb(error.__traceback__)
    for (frame, _), summary in zip(frames, traceback.extract_tb(error.__traceback__)):
        if summary.filename.startswith(ours):
            continue
        owner = frame.f_locals.get("self")
        where = f"{type(owner).__name__}.{summary.name}"
        if id(owner) in paths:
            where += f" (module {paths[id(owner)] or 'the top'!r})"
        found = f"{where} at {summary.filename}:{summary.lineno}: {(summary.line or '').strip()}"
    return found


def _where(node: fx.Node) -> str:
    """``node 'add_1' (call_function add) at model.py:12: h = h + ...``."""
    target = node.target if isinstance(node.target, str) else _callable_name(node.target)
    where = f"node {node.name!r} ({node.op} {target})"
    for line, following in zip((node.stack_trace or "").splitlines(),
                                (node.stack_trace or "").splitlines()[1:]):
        if line.strip().startswith("File ") and "/torch/" not in line:
            file, _, rest = line.strip()[5:].partition(", line ")
            number = rest.partition(",")[0]
            return f"{where} at {file.strip(chr(34))}:{number}: {following.strip()}"
    return where

