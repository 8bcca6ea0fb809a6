"""Network kinds with their sequential reference propagation."""

from .fnn import FNN
from .rnn import RNN, RNNGradients
from .trace import Gradients, Trace

__all__ = ["FNN", "RNN", "Trace", "Gradients", "RNNGradients"]
