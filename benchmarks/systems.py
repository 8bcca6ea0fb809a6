"""One system of every layout, built in NumPy: what every backend must solve alike.

A chain of unequal widths, a stacked chain, a chain with per-sample couplings (a
recurrence's), an RNN's time layout, a GRU's (per-sample Jacobians over time), a
residual graph, a diagonal recurrence (quasi-Newton's: identity couplings), a
linear network's batch (one matrix for every sample: the block methods' case),
and two of sparse couplings: an MLP of sparse weights and a convolutional graph
(each backend's sparse matrices: SciPy's, CuPy's, PyTorch's CSR tensors). ``tests/test_backends.py``
solves them on every backend with every native method; ``python -m benchmarks.gpu
--record`` does the same on a GPU.
"""

from __future__ import annotations

import numpy as np

import propop as pp

__all__ = ["SYSTEMS"]


def fnn_unequal(r: int) -> pp.TriangularSystem:
    """The backward system of an MLP of widths 5, 7, 4, 6, 3."""
    net = pp.FNN.random([5, 7, 4, 6, 3], activation="tanh", seed=0, bias=0.1)
    trace = net.forward(np.random.default_rng(1).standard_normal((5, r)))
    return pp.backward_system(net, trace, np.ones((3, r)))


def fnn_stacked(r: int) -> pp.TriangularSystem:
    """The forward system of an MLP of one width, its couplings one stack."""
    net = pp.FNN.random([5] * 9, activation="tanh", seed=0, bias=0.1)
    x = np.random.default_rng(2).standard_normal((5, r))
    return pp.forward_system(net, x, around=net.forward(x))


def per_sample(r: int) -> pp.TriangularSystem:
    """A chain whose every sample has its own couplings, ``(nb - 1, r, n, n)``."""
    rng = np.random.default_rng(3)
    stack = rng.standard_normal((6, r, 4, 4)) * 0.4
    return pp.TriangularSystem(None, None, rng.standard_normal((28, r)), lower=True,
                               sizes=[4] * 7, coupling_stack=stack)


def rnn(r: int) -> pp.TriangularSystem:
    """The backward system of a 2-layer RNN over 6 steps: a time layout."""
    net = pp.RNN.random([3, 4, 5], activation="tanh", seed=0)
    trace = net.forward(np.random.default_rng(4).standard_normal((6, 3, r)))
    return pp.backward_system(net, trace, np.ones_like(trace.output))


def gru(r: int) -> pp.TriangularSystem:
    """The backward system of a 2-layer GRU over 6 steps: per-sample Jacobians in time."""
    net = pp.GRU(3, 4, num_layers=2, seed=0)
    trace = net.forward(np.random.default_rng(8).standard_normal((6, 3, r)))
    return pp.backward_system(net, trace, net.loss_gradient(
        trace, np.zeros(net.outputs(trace).shape)))


def graph(r: int) -> pp.TriangularSystem:
    """The backward system of a residual MLP: a graph with identity (sparse) couplings."""
    net = pp.Graph.residual_mlp(4, 3, seed=0)
    trace = net.forward(np.random.default_rng(5).standard_normal((4, r)))
    return pp.backward_system(net, trace, net.loss_gradient(trace, np.zeros((4, r))))


def diagonal(r: int) -> pp.TriangularSystem:
    """Quasi-Newton's forward system of a GRU over 9 steps: identity couplings, diagonals."""
    net = pp.GRU(3, 4, num_layers=2, seed=0)
    xs = np.random.default_rng(9).standard_normal((9, 3, r))
    return pp.forward_system(net, xs, around=net.forward(xs), linearization="quasi")


def linear(r: int) -> pp.TriangularSystem:
    """A linear network's batch: every sample has the same matrix."""
    net = pp.FNN.random([4, 5, 5, 3], activation="identity", seed=0, bias=0.1)
    trace = net.forward(np.random.default_rng(6).standard_normal((4, r)))
    return pp.backward_system(net, trace, np.random.default_rng(7).standard_normal((3, r)))


def sparse(r: int) -> pp.TriangularSystem:
    """The backward system of an MLP of sparse weights (density 0.4): CSR couplings."""
    net = pp.FNN.random([6, 8, 8, 5], activation="tanh", seed=0, bias=0.1, density=0.4)
    trace = net.forward(np.random.default_rng(10).standard_normal((6, r)))
    return pp.backward_system(net, trace, np.ones((5, r)))


def conv(r: int) -> pp.TriangularSystem:
    """The backward system of a convolution, tanh and a dense layer: a convolution's Jacobian."""
    rng = np.random.default_rng(11)
    graph = pp.Graph(2 * 4 * 4).add(
        "conv", pp.layers.Conv2d(rng.standard_normal((3, 2, 3, 3)) * 0.3, np.full(3, 0.1),
                                 input_shape=(2, 4, 4), padding=1)).add(
        "act", pp.layers.Activation("tanh")).add(
        "fc", pp.layers.Dense(rng.standard_normal((5, 3 * 4 * 4)) * 0.2, np.zeros(5)))
    trace = graph.forward(rng.standard_normal((2 * 4 * 4, r)))
    return pp.backward_system(graph, trace, graph.loss_gradient(trace, np.zeros((5, r))))


SYSTEMS = {"fnn-unequal": fnn_unequal, "fnn-stacked": fnn_stacked, "per-sample": per_sample,
           "rnn": rnn, "gru": gru, "graph": graph, "diagonal": diagonal, "linear": linear,
           "sparse": sparse, "conv": conv}
