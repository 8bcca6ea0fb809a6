"""Network kinds with their sequential reference propagation."""

from .fnn import FNN
from .graph import Graph, GraphGradients
from .rnn import RNN, RNNGradients
from .trace import Gradients, Trace

__all__ = ["FNN", "RNN", "Graph", "Trace", "Gradients", "RNNGradients", "GraphGradients"]
