"""Network kinds with their sequential reference propagation."""

from .fnn import FNN
from .trace import Gradients, Trace

__all__ = ["FNN", "Trace", "Gradients"]
