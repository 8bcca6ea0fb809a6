"""A computation graph that is a chain of dense layers is an FNN (eq. def_forw_prop2).

An imported ``nn.Sequential`` of ``nn.Linear`` layers, each followed by at most one
elementwise activation, is a :class:`~propop.Graph` whose systems give every
activation its own block, coupled to its dense node's block by an identity (one
sparse matrix per edge, built at every call): ``2 l + 1`` blocks and ``2 l`` couplings
of which ``l`` are identities. The same network as an :class:`~propop.FNN` has
``l + 1`` blocks, its couplings the weights themselves (stacked where the widths are
equal), and the same solution: the activation blocks of the graph's backward system
are the FNN's ``v_k`` and its dense blocks ``W^T v_k``. :func:`as_fnn` finds the
FNN a graph is, on the graph's own arrays (parameters written into the graph in
place are the FNN's: nothing is copied or kept beside them), so that a caller
(:func:`propop.torch.parallelize`) can compute with the smaller systems and report
the gradients under the graph's names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .. import backend
from ..layers import Activation, Dense
from .fnn import FNN
from .graph import INPUT, Graph, GraphGradients
from .trace import Gradients, Trace

__all__ = ["GraphFNN", "as_fnn"]


@dataclass(frozen=True)
class GraphFNN:
    """A graph and the FNN it is: layer ``k`` is the graph's node ``dense[k]``.

    Attributes
    ----------
    graph : Graph
    net : FNN
        On the graph's weight and bias arrays (a dense node without a bias gets
        zeros of its own, which no parameter writes).
    dense : tuple of str
        The dense node of each layer, in order.
    names : dict
        The graph's public names and ties of its parameters (:meth:`Graph.named_gradients`),
        read when the FNN was found: :meth:`current` finds it anew if a parameter is rebound.
    """

    graph: Graph
    net: FNN
    dense: tuple
    names: dict = field(repr=False, compare=False)  # GraphGradients.names of the graph

    def current(self) -> GraphFNN | None:
        """Itself while its FNN holds the graph's parameter arrays, else :func:`as_fnn` anew.

        Values written into those arrays are the FNN's already; a parameter the graph
        rebinds (``set_parameter``) is not, and the FNN would compute with the old one.
        Identity checks only: nothing is compared entry by entry.
        """
        layers = self.graph.layers
        if all(self.net.W[k] is layers[node].W and (
                layers[node].bias is None or self.net.b[k] is layers[node].bias)
               for k, node in enumerate(self.dense)):
            return self
        return as_fnn(self.graph)

    def output_values(self, trace: Trace) -> list:
        """The graph's one output, the FNN's: ``[z_l]`` of the FNN's trace."""
        return [trace.output]

    def gradients(self, trace: Trace, v: Any) -> GraphGradients:
        """The FNN's gradients from its backward blocks ``v``, as the graph's (:meth:`named`)."""
        return self.named(self.net.gradients(trace, v))

    def named(self, gradients: Gradients) -> GraphGradients:
        """The FNN's gradients as the graph's: per dense node, under its parameters' names."""
        parameters = {}
        for k, node in enumerate(self.dense):
            own = self.graph.layers[node].parameters()
            parameters[node] = {"W": gradients.W[k], **({"b": gradients.b[k]} if "b" in own
                                                        else {})}
        return GraphGradients(parameters=parameters, x=gradients.x, names=self.names)


def as_fnn(graph: Graph) -> GraphFNN | None:
    """The FNN ``graph`` is, or ``None`` where it is not a chain of dense layers.

    A chain: every node reads the one before it in order, from the input to the
    graph's one output; each :class:`~propop.layers.Dense` node is followed by at
    most one :class:`~propop.layers.Activation` (none: the identity), and nothing
    else appears. Layer ``k`` of the FNN is ``W_k``, ``b_k`` and the activation of the
    ``k``-th dense node.
    """
    nodes, previous = graph.order[1:], INPUT
    if len(graph.outputs) != 1 or not nodes or graph.outputs[0] != nodes[-1]:
        return None
    weights, biases, activations, dense = [], [], [], []
    i = 0
    while i < len(nodes):
        node, layer = nodes[i], graph.layers[nodes[i]]
        if type(layer) is not Dense or graph.inputs[node] != (previous,):
            return None
        previous, activation = node, "identity"
        following = nodes[i + 1] if i + 1 < len(nodes) else None
        if following is not None and type(graph.layers[following]) is Activation \
                and graph.inputs[following] == (node,):
            previous, activation, i = following, graph.layers[following].f, i + 1
        weights.append(layer.W)
        biases.append(layer.bias if layer.bias is not None else _zeros(graph, layer.W))
        activations.append(activation)
        dense.append(node)
        i += 1
    return GraphFNN(graph, FNN(weights, biases, activations), tuple(dense),
                    graph.named_gradients({}, None).names)


def _zeros(graph: Graph, W: Any) -> Any:
    """A zero bias for ``W``'s rows, of the graph's backend, dtype and device."""
    device = None if backend.is_sparse(W) else backend.device(W)
    return graph.backend.xp.zeros(W.shape[0], dtype=graph.dtype, device=device)
