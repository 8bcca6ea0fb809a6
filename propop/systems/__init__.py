"""Triangular systems of forward and backward propagation, and their builders."""

from . import fnn as _fnn  # noqa: F401  (registers the FNN builders)
from . import graph as _graph  # noqa: F401  (registers the Graph builders)
from . import recurrence as _recurrence  # noqa: F401  (registers the Recurrence builders)
from . import rnn as _rnn  # noqa: F401  (registers the RNN builders)
from .builders import backward_system, forward_system
from .triangular import FORMS, Blocks, TriangularSystem

__all__ = ["TriangularSystem", "Blocks", "FORMS", "backward_system", "forward_system"]
