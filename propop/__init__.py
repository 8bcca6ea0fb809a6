"""propop: forward and backward propagation as block bi-diagonal triangular solves.

After M. Naumov, "Parallel Complexity of Forward and Backward Propagation".
The public API is DESIGN section 6; everything is re-exported here.
"""

from typing import Any

from . import data, layers, memory, solvers, sparsity
from .activations import Activation, available_activations, get_activation, register_activation
from .losses import loss_gradient, loss_value
from .memory import MemoryBudgetError
from .networks import (FNN, GRU, LSTM, RNN, Gradients, Graph, GraphGradients, Recurrence,
                       RecurrenceGradients, RNNGradients, Trace)
from .propagation import backprop, forward
from .solvers import ConvergenceError, Plan, Solution, Status, prepare, solve
from .training import History, train
from .systems import Blocks, TriangularSystem, backward_system, forward_system
from .distributed import krylov as _mpi_krylov  # noqa: F401  (registers mpi.gmres, ...)
from .distributed import solvers as _mpi_solvers  # noqa: F401  (registers mpi.*)

__version__ = "0.1.0"


def from_torch(module: Any, input_shape: Any = None) -> Any:
    """A propop network with a PyTorch module's weights (:mod:`propop.torch_interop`).

    Needs PyTorch (``pip install "propop[torch]"``).
    """
    from .torch_interop import from_torch as convert

    return convert(module, input_shape)


def state_dict(network: Any) -> Any:
    """A network's parameters under PyTorch's names (:func:`propop.torch_interop.state_dict`).

    ``module.load_state_dict(pp.state_dict(net), strict=False)`` writes them back
    into the module ``net`` came from. Needs PyTorch.
    """
    from .torch_interop import state_dict as convert

    return convert(network)


__all__ = [
    "FNN", "RNN", "Graph", "Trace", "Gradients", "RNNGradients", "GraphGradients", "layers",
    "Recurrence", "RecurrenceGradients", "GRU", "LSTM",
    "Activation", "register_activation", "get_activation", "available_activations",
    "loss_gradient", "loss_value",
    "TriangularSystem", "Blocks", "backward_system", "forward_system",
    "solve", "prepare", "Plan", "solvers", "Solution", "Status", "ConvergenceError",
    "backprop", "forward", "from_torch", "state_dict", "train", "History", "data", "sparsity",
    "memory", "MemoryBudgetError",
]
