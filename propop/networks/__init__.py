"""Network kinds with their sequential reference propagation."""

from .fnn import FNN
from .gated import GRU, LSTM
from .graph import Graph, GraphGradients
from .recurrence import Recurrence, RecurrenceGradients
from .rnn import RNN, RNNGradients
from .trace import Gradients, Trace

__all__ = ["FNN", "RNN", "Graph", "Trace", "Gradients", "RNNGradients", "GraphGradients",
           "Recurrence", "RecurrenceGradients", "GRU", "LSTM"]
