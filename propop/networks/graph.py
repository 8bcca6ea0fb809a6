"""General computation graphs: a DAG of :mod:`~propop.layers` with named nodes.

The paper, end of section 2: "a similar formulation can be written for an
arbitrary compute graph".

One input node (``"input"``), any number of layer nodes each reading one or more
earlier nodes (skip connections, residual sums, concatenations), one or more
outputs. Nodes are kept in a topological order; the triangular systems have one
block per node in that order and one off-diagonal block per edge.

Each node's **block** holds, for a linear layer, its output (forward) or the
gradient with respect to its output (backward); for a diagonal layer (an
activation, max pooling), the quantity on its input side, ``t = a * x + beta``
(forward) or ``u = dE/dx`` (backward). :meth:`Graph.unstack` turns a solution into
those blocks and :meth:`Graph.gradients` into parameter gradients.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import backend
from .._checks import real_array, require_finite, require_samples, worst
from ..layers import Layer
from ..losses import loss_gradient
from .trace import Trace

__all__ = ["Graph", "GraphGradients"]

INPUT = "input"
REPR_ROWS = 12  # a longer graph shows its first and last this many nodes


@dataclass(frozen=True)
class GraphGradients:
    """Gradients of a graph, summed over samples.

    Attributes
    ----------
    parameters : dict
        ``parameters[node][name]``, e.g. ``g.parameters["fc1"]["W"]``: each node's
        own part (a parameter tied to another node's has its part there too).
    x : array
        ``dE/dx`` for the input.
    solution : Solution or None
    names : dict
        ``(node, name) -> (public name, the tie's first (node, name))``, from
        :meth:`Graph.parameter_names` and :meth:`Graph.ties`.
    """

    parameters: dict
    x: Any
    solution: Any = field(default=None, compare=False)
    names: dict = field(default_factory=dict, compare=False, repr=False)

    def named_parameters(self) -> Any:
        """``(name, gradient)`` per parameter, as ``module.named_parameters()`` yields them.

        The names are the PyTorch module's for an imported graph (``"fc1.weight"``),
        else ``"node.W"``; a parameter tied to several nodes comes once, under its
        first name, with the parts of every node summed.
        """
        total: dict = {}
        for node, grads in self.parameters.items():
            for name, value in grads.items():
                first = self.names.get((node, name), (f"{node}.{name}", (node, name)))[1]
                total[first] = value if first not in total else total[first] + value
        for first, value in total.items():
            yield self.names.get(first, (f"{first[0]}.{first[1]}",))[0], value


class Graph:
    """A DAG of layers with named nodes.

    Parameters
    ----------
    input_size : int
        Size of the (flattened) input; the input node is called ``"input"``.
    nodes : sequence of ``(name, layer, inputs)``, optional
        In any order; ``inputs`` is a name or a list of names.
    outputs : sequence of str, optional
        The output nodes (default: the last node added).

    Examples
    --------
    >>> import numpy as np, propop as pp
    >>> from propop import layers as L
    >>> rng = np.random.default_rng(0)
    >>> g = pp.Graph(4)
    >>> g = g.add("fc", L.Dense(rng.standard_normal((4, 4)))).add("act", L.Activation("tanh"))
    >>> g = g.add("res", L.Add(), ["input", "act"])
    >>> g.order, g.sizes
    (('input', 'fc', 'act', 'res'), (4, 4, 4, 4))
    """

    def __init__(self, input_size: int, nodes: Sequence[tuple] = (),
                 outputs: Sequence[str] | None = None) -> None:
        self.input_size = int(input_size)
        self.layers: dict[str, Layer] = {}
        self.inputs: dict[str, tuple] = {}
        self._outputs = None if outputs is None else tuple(outputs)
        self._order: list[str] = [INPUT]
        self._size = {INPUT: self.input_size}
        self._like = np.zeros(0)  # where a graph of no values computes (set by to())
        for name, layer, inputs in _topological(list(nodes)):
            self.add(name, layer, inputs)

    def __repr__(self) -> str:
        """One line per node: name, layer, the nodes it reads, output size (as ``nn.Module``)."""
        rows = [(n, repr(self.layers[n]), ", ".join(self.inputs[n]), self._size[n])
                for n in self._order[1:]]
        if len(rows) > 2 * REPR_ROWS:  # the first and last nodes, as a long nn.Module prints
            hidden = len(rows) - 2 * REPR_ROWS
            rows = rows[:REPR_ROWS] + [(f"... {hidden} more", "", "", "")] + rows[-REPR_ROWS:]
        width = [max([len(r[i]) for r in rows] + [4]) for i in range(3)]
        lines = [f"Graph(input {self.input_size}, {len(self._order) - 1} nodes, outputs "
                 f"{list(self._outputs or self._order[-1:])})"]
        lines += [f"  {n:<{width[0]}}  {layer:<{width[1]}}  <- {reads:<{width[2]}}  {size}"
                  if layer else f"  {n}" for n, layer, reads, size in rows]
        return "\n".join(lines)

    @classmethod
    def residual_mlp(cls, width: int, blocks: int, activation: str = "tanh",
                     seed: int | None = 0) -> Graph:
        """A random ResNet-style MLP: ``blocks`` times ``x + W2 f(W1 x + b1)`` then ``f``.

        Nodes ``fc{k}a, act{k}, fc{k}b, add{k}, out{k}``; weights scaled by
        ``0.5 / sqrt(width)`` so that the signal stays of order one.
        """
        from .. import memory
        from ..layers import Activation, Add, Dense

        memory.require_arrays(2 * blocks * width * width, 8, f"Graph.residual_mlp of {blocks} "
                              f"blocks of width {width}", "use fewer or narrower blocks")
        rng = np.random.default_rng(seed)
        graph, source = cls(width), INPUT
        for k in range(blocks):
            W1, W2 = (0.5 * rng.standard_normal((width, width)) / np.sqrt(width)
                      for _ in range(2))
            graph.add(f"fc{k}a", Dense(W1, 0.1 * rng.standard_normal(width)), source)
            graph.add(f"act{k}", Activation(activation)).add(f"fc{k}b", Dense(W2))
            graph.add(f"add{k}", Add(), [source, f"fc{k}b"]).add(f"out{k}",
                                                                 Activation(activation))
            source = f"out{k}"
        return graph

    # -- building ---------------------------------------------------------------------
    def add(self, name: str, layer: Layer, inputs: str | Sequence[str] | None = None
            ) -> Graph:
        """Add node ``name`` reading ``inputs`` (default: the last node); returns ``self``."""
        if name in self._size:
            raise ValueError(f"node {name!r} already exists")
        inputs = (self._order[-1],) if inputs is None else (
            (inputs,) if isinstance(inputs, str) else tuple(inputs))
        unknown = [i for i in inputs if i not in self._size]
        if unknown:
            raise KeyError(f"node {name!r} reads unknown node(s) {unknown}; known: "
                           f"{self._order}")
        try:
            size = layer.output_size([self._size[i] for i in inputs])
        except ValueError as error:
            raise ValueError(f"node {name!r} ({layer!r}): {error}") from None
        if not layer.linear and len(inputs) != 1:
            raise ValueError(f"node {name!r}: {layer!r} takes one input")
        self.layers[name], self.inputs[name], self._size[name] = layer, inputs, size
        self._order.append(name)
        return self

    # -- structure --------------------------------------------------------------------
    @property
    def order(self) -> tuple:
        """Node names in topological order, the input first."""
        return tuple(self._order)

    @property
    def outputs(self) -> tuple:
        """The output nodes: those given as ``outputs``, else the last node added.

        Without ``outputs``, nodes that no node reads (other than the last) are
        computed and their parameters' gradients are zero, which is exact but seldom
        meant (a second head left out of the outputs): a ``UserWarning`` says so, once
        for each such set of nodes.
        """
        if self._outputs is None and self.__dict__.get("_unread_checked") != len(self._order):
            self.__dict__["_unread_checked"] = len(self._order)  # nodes only grow by add()
            read = {name for reads in self.inputs.values() for name in reads}
            unread = tuple(n for n in self._order[1:-1] if n not in read)
            if unread:
                warnings.warn(f"node(s) {list(unread)} feed no node and are not outputs (the "
                              f"last node added, {self._order[-1]!r}, is the one output by "
                              "default): they are computed and their parameters get zero "
                              "gradients; name every output with outputs=(...), or remove "
                              "them", UserWarning, stacklevel=3)
        outputs = self._outputs or (self._order[-1],)
        unknown = [o for o in outputs if o not in self._size]
        if unknown:
            raise KeyError(f"unknown output node(s) {unknown}; known: {self._order}")
        return outputs

    @property
    def sizes(self) -> tuple:
        """Output size of every node, in :attr:`order`."""
        return tuple(self._size[n] for n in self._order)

    @property
    def block_sizes(self) -> tuple:
        """Size of every node's block: a diagonal layer's block is input-sized."""
        return tuple(self._size[n] if self.is_linear(n) else self._size[self.inputs[n][0]]
                     for n in self._order)

    @property
    def backend(self) -> backend.Backend:
        """The array backend of the layers' values (a graph of none: where :meth:`to` put it)."""
        values = self._values()
        return backend.of(*values) if values else backend.of(self._like)

    @property
    def dtype(self) -> Any:
        """float64 of :attr:`backend` (the layers' arrays are float64; inputs are cast)."""
        return self.backend.xp.float64

    def _values(self) -> list:
        """Every array of values the layers hold (parameters, constant offsets)."""
        return [getattr(layer, name) for layer in self.layers.values() for name in layer.values
                if getattr(layer, name) is not None]

    def to(self, kind: str, device: Any = None) -> Graph:
        """The same graph with its layers' values on backend ``kind``.

        ``kind`` is ``"numpy"``, ``"torch"``, ``"cupy"`` or ``"array_api_strict"``;
        ``device`` a PyTorch device such as ``"cuda"``. Parameters shared by several
        nodes (tied) stay one array; the layers' structure (selections, placements)
        stays on the host and meets the values where they are. ``TypeError``
        naming the node whose layer cannot move (sparse weights to a backend
        without sparse arrays).
        """
        memo: dict = {}
        moved = Graph(self.input_size, outputs=self._outputs)
        for name in self._order[1:]:
            try:
                layer = self.layers[name].to(kind, device, memo)
            except TypeError as error:
                raise TypeError(f"node {name!r}: {error}") from None
            moved.add(name, layer, self.inputs[name])
        for imported in ("origins", "output_shapes"):  # from_torch's: names, module shapes
            if hasattr(self, imported):
                setattr(moved, imported, getattr(self, imported))
        moved._like = backend.convert(self._like, kind, device)
        return moved

    def parameter_names(self) -> dict:
        """``(node, name) -> public name`` of every parameter, in node order.

        An imported graph's are the PyTorch module's (``"layer1.0.conv1.weight"``,
        from ``origins``); others are ``"node.name"``.
        """
        origins = getattr(self, "origins", None) or {}
        out = {}
        for node in self._trainable():
            path, theirs = origins.get(node, ("", {}))
            for ours in self.layers[node].parameters():
                name = theirs.get(ours)
                out[(node, ours)] = (f"{path}.{name}" if path else name) if name else \
                    f"{node}.{ours}"
        return out

    def ties(self) -> dict:
        """``(node, name) -> (node, name)`` of the first parameter holding the same array.

        Parameters are tied when two nodes hold the same array object (an imported
        module's tied weights, or the same array given to two layers): their
        gradients add up and training keeps them one. Untied parameters map to
        themselves.
        """
        first: dict[int, tuple] = {}
        out = {}
        for node in self._trainable():
            for ours, value in self.layers[node].parameters().items():
                out[(node, ours)] = first.setdefault(id(value), (node, ours))
        return out

    def _trainable(self) -> list:
        """The nodes that may hold parameters: the linear layers, in order."""
        return [n for n in self._order[1:] if self.layers[n].linear]

    def is_linear(self, name: str) -> bool:
        """Whether node ``name`` is the input or a linear layer (its block is its output)."""
        return name == INPUT or self.layers[name].linear

    def selection(self, name: str) -> Any:
        """The shared ``A`` of a diagonal node (``None``: identity or a linear node)."""
        if self.is_linear(name):
            return None
        return self.layers[name].selection(self._size[self.inputs[name][0]])

    def edges(self) -> list[tuple[str, int, str]]:
        """``(predecessor, input index, node)`` for every edge, in node order."""
        return [(p, i, n) for n in self._order[1:] for i, p in enumerate(self.inputs[n])]

    # -- the sequential reference -------------------------------------------------------
    def check_input(self, x: Any) -> Any:
        """``x`` as a float array of shape ``(input_size,)`` or ``(input_size, r)``."""
        x = real_array(x, "x", self.dtype)
        if x.ndim not in (1, 2) or x.shape[0] != self.input_size:
            raise ValueError(f"x has shape {x.shape}, expected ({self.input_size},) or "
                             f"({self.input_size}, r)")
        require_samples(x, "x")
        require_finite(x, "x")
        return x

    def forward(self, x: Any) -> Trace:
        """Every node's output, node by node; ``y`` holds diagonal nodes' inputs."""
        z = {INPUT: self.check_input(x)}
        with backend.quiet(backend.namespace(z[INPUT])):  # what is not finite is named below
            for name in self._order[1:]:
                z[name] = self.layers[name].forward([z[p] for p in self.inputs[name]])
                if not backend.all_finite(z[name]):  # from finite inputs: this node's doing
                    raise ValueError(
                        f"node {name!r} ({self.layers[name]!r}) gives non-finite values from "
                        f"finite inputs ({_nonfinite(z[name])}): a power of a negative "
                        "number, a logarithm of one outside its domain, or an overflow")
        return self._trace(z)

    def _trace(self, z: dict) -> Trace:
        y = tuple(None if self.is_linear(n) else z[self.inputs[n][0]] for n in self._order)
        return Trace(x=z[INPUT], y=y, z=tuple(z[n] for n in self._order),
                     outputs=tuple(self._order.index(o) for o in self.outputs))

    def output_values(self, trace: Trace) -> list:
        """The outputs' values in :attr:`outputs` order."""
        return [trace.z[self._order.index(o)] for o in self.outputs]

    def loss_gradient(self, trace: Trace, target: Any, loss: str = "mse",
                      reduction: str = "sum") -> list:
        """``dE/dz`` at each output; ``target`` is an array (one output) or a list."""
        outputs = self.output_values(trace)
        targets = [target] if len(outputs) == 1 and not isinstance(target, list) else target
        if len(targets) != len(outputs):
            raise ValueError(f"{len(outputs)} outputs need {len(outputs)} targets, got "
                             f"{len(targets)}")
        return [loss_gradient(z, t, loss, reduction) for z, t in zip(outputs, targets)]

    def backward(self, trace: Trace, eps: Sequence[Any]) -> list:
        """The backward blocks node by node, in reverse order (the sequential reference)."""
        grads = {n: None for n in self._order}
        for o, e in zip(self.outputs, eps):
            grads[o] = e if grads[o] is None else grads[o] + e
        blocks: dict[str, Any] = {}
        for k, name in reversed(list(enumerate(self._order))):
            g = grads[name] if grads[name] is not None else _zeros_like(trace.z[k],
                                                                        self._size[name])
            if self.is_linear(name):
                blocks[name] = g
                if name == INPUT:
                    continue
                J = self.layers[name].jacobians([self._size[p] for p in self.inputs[name]])
                contributions = [backend.matrix_on(Ji, g).T @ g for Ji in J]
            else:
                A = self.selection(name)
                blocks[name] = self.layers[name].slope(trace.y[k]) * (
                    g if A is None else backend.matrix_on(A, g).T @ g)
                contributions = [blocks[name]]
            for p, c in zip(self.inputs[name], contributions):
                grads[p] = c if grads[p] is None else grads[p] + c
        return [blocks[n] for n in self._order]

    def gradients(self, trace: Trace, blocks: Sequence[Any]) -> GraphGradients:
        """Parameter gradients of every linear node and ``dE/dx`` from the backward blocks."""
        z = dict(zip(self._order, trace.z))
        out = {}
        for name, block in zip(self._order[1:], blocks[1:]):
            if self.is_linear(name):
                grads = self.layers[name].gradients([z[p] for p in self.inputs[name]], block)
                if grads:
                    out[name] = grads
        return self.named_gradients(out, blocks[0])

    def named_gradients(self, parameters: dict, x: Any) -> GraphGradients:
        """``GraphGradients`` of per-node gradients ``{node: {name: array}}`` and ``dE/dx``.

        Named as :meth:`parameter_names` and tied as :meth:`ties` say.
        """
        names, ties = self.parameter_names(), self.ties()
        return GraphGradients(parameters=parameters, x=x,
                              names={key: (names[key], ties[key]) for key in names})

    # -- systems ------------------------------------------------------------------------
    def unstack(self, system: Any, x: Any) -> list:
        """A solution of one of this graph's systems as per-node blocks."""
        return list(system.split(x))

    def state_shapes(self, x: Any) -> tuple[list, list]:
        """Shapes of every node's output ``z`` and diagonal node's input ``y`` (else ``None``)."""
        z = [(self._size[n],) + x.shape[1:] for n in self._order]
        y = [None if self.is_linear(n) else (self._size[self.inputs[n][0]],) + x.shape[1:]
             for n in self._order]
        return z, y

    def trace_from_states(self, x: Any, states: Sequence[Any] | None) -> Trace:
        """The trace whose forward blocks are ``states`` (zeros when ``None``)."""
        x = self.check_input(x)
        z = {INPUT: x}
        for k, name in enumerate(self._order[1:], start=1):
            if states is None:
                z[name] = _zeros_like(x, self._size[name])
                continue
            A = self.selection(name)
            z[name] = states[k] if A is None else backend.matrix_on(A, states[k]) @ states[k]
        return self._trace(z)

    def nonlinear_residual(self, trace: Trace) -> float:
        """``max_k ||z_k - layer_k(inputs)|| / ||layer_k(inputs)||``: zero at the true pass."""
        z = dict(zip(self._order, trace.z))
        gaps = []
        for name in self._order[1:]:
            want = self.layers[name].forward([z[p] for p in self.inputs[name]])
            norm = backend.namespace(want).linalg.vector_norm
            scale = max(float(norm(want, axis=None)), 1e-300)
            gaps.append(float(norm(z[name] - want, axis=None)) / scale)
        return worst(gaps)

    def first_overflow(self, trace: Trace) -> str | None:
        """The first node whose layer gives NaN or Inf from the trace's finite inputs, named."""
        name = self._overflowing(dict(zip(self._order, trace.z)), backend.namespace(trace.x))
        return None if name is None else (
            f"node {name!r} ({self.layers[name]!r} overflows at the iterate's inputs)")

    def restarted(self, trace: Trace) -> Trace | None:
        """``trace`` with the states that overflow their readers, or are not finite, zeroed.

        A Newton iterate past the exact front can overshoot (a node linearised where
        its inputs have not settled); those nodes start again from the zero start's
        values, while the nodes already exact read only exact inputs, overflow nothing,
        and stay. ``None`` where zeros do not mend it: a node that overflows at its
        inputs' zeros, or at the input itself (the sequential pass overflows there).
        """
        xp = backend.namespace(trace.x)
        z = {name: value if backend.all_finite(value) else
             _zeros_like(trace.x, self._size[name]) for name, value in zip(self._order, trace.z)}
        z[INPUT] = trace.x
        overflowing = self._overflowing(z, xp)
        while overflowing is not None:  # each pass zeros a node more: at most one a node
            inputs = [p for p in self.inputs[overflowing] if p != INPUT and bool(xp.any(z[p]))]
            if not inputs:
                return None
            for p in inputs:
                z[p] = _zeros_like(trace.x, self._size[p])
            overflowing = self._overflowing(z, xp)
        return self._trace(z)

    def _overflowing(self, z: dict, xp: Any) -> str | None:
        """The first node whose layer gives NaN or Inf at the values ``z``, or ``None``."""
        for name in self._order[1:]:
            with backend.quiet(xp):
                want = self.layers[name].forward([z[p] for p in self.inputs[name]])
            if not backend.all_finite(want):
                return name
        return None

    def states_of(self, trace: Trace) -> list:
        """The forward blocks of ``trace``: outputs of linear nodes, ``a y + beta`` of others.

        The inverse of :meth:`trace_from_states` at a trace (``a, beta`` the secant
        linearization at the node's input, which reproduces the node exactly).
        """
        blocks = []
        for k, name in enumerate(self._order):
            if self.is_linear(name):
                blocks.append(trace.z[k])
            else:
                a, beta = self.layers[name].linearize(trace.y[k], "secant")
                blocks.append(a * trace.y[k] + beta)
        return blocks


def _nonfinite(z: Any) -> str:
    """``"2 of 12 entries, first at row 3"`` of an array with non-finite entries."""
    bad = ~np.isfinite(backend.to_host(z))  # on the host: an error path
    return f"{int(bad.sum())} of {bad.size} entries, first at row {int(np.argwhere(bad)[0][0])}"


def _zeros_like(z: Any, size: int) -> Any:
    """Zeros of ``size`` rows shaped like the batch of ``z``, on its backend and device."""
    return backend.namespace(z).zeros((size,) + tuple(z.shape[1:]), dtype=z.dtype,
                                      device=backend.device(z))


def _topological(nodes: list) -> list:
    """``nodes`` reordered so that every node follows the nodes it reads; cycles named."""
    names = {n for n, _, _ in nodes}
    reads = {n: ((i,) if isinstance(i, str) else tuple(i)) for n, _, i in nodes}
    done, order = {INPUT}, []
    pending = list(nodes)
    while pending:
        ready = [node for node in pending
                 if all(i in done or i not in names for i in reads[node[0]])]
        if not ready:
            raise ValueError(f"the graph has a cycle through nodes "
                             f"{sorted(n for n, _, _ in pending)}")
        for node in ready:
            order.append(node)
            done.add(node[0])
            pending.remove(node)
    return order
