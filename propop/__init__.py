"""propop: forward and backward propagation as block bi-diagonal triangular solves.

After M. Naumov, "Parallel Complexity of Forward and Backward Propagation".
The public API is the one docs/api.md lists. Names are resolved on first use (PEP 562),
so ``import propop`` loads no solver, no PyAMG and no ``scipy.sparse.linalg``:
each is imported when a method asks for it.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> the module that defines it
_WHERE = {
    **dict.fromkeys(("FNN", "RNN", "Graph", "Trace", "Gradients", "RNNGradients",
                     "GraphGradients", "Recurrence", "RecurrenceGradients", "GRU", "LSTM"),
                    "propop.networks"),
    **dict.fromkeys(("Activation", "register_activation", "get_activation",
                     "available_activations"), "propop.activations"),
    **dict.fromkeys(("loss_gradient", "loss_value"), "propop.losses"),
    **dict.fromkeys(("TriangularSystem", "Blocks", "backward_system", "forward_system"),
                    "propop.systems"),
    **dict.fromkeys(("solve", "prepare", "Plan"), "propop.solvers.plan"),
    **dict.fromkeys(("Solution", "Status", "ConvergenceError"), "propop.solvers.solution"),
    "backprop": "propop.propagation", "forward": "propop.newton.loop",
    "from_torch": "propop.interop", "state_dict": "propop.interop",
    **dict.fromkeys(("train", "History"), "propop.training"),
    "MemoryBudgetError": "propop.memory",
}
_MODULES = ("layers", "solvers", "data", "sparsity", "memory", "allocator", "distributed",
            "plot", "interop", "newton", "torch")

__all__ = [
    "FNN", "RNN", "Graph", "Trace", "Gradients", "RNNGradients", "GraphGradients", "layers",
    "Recurrence", "RecurrenceGradients", "GRU", "LSTM",
    "Activation", "register_activation", "get_activation", "available_activations",
    "loss_gradient", "loss_value",
    "TriangularSystem", "Blocks", "backward_system", "forward_system",
    "solve", "prepare", "Plan", "solvers", "Solution", "Status", "ConvergenceError",
    "backprop", "forward", "from_torch", "state_dict", "train", "History", "data", "sparsity",
    "memory", "MemoryBudgetError", "allocator",
]


def __getattr__(name: str) -> Any:
    """A public name, imported from its module on first use."""
    if name in _MODULES:
        return importlib.import_module(f"propop.{name}")
    if name in _WHERE:
        value = getattr(importlib.import_module(_WHERE[name]), name)
        globals()[name] = value  # the next look-up is a plain attribute
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__) | set(_MODULES))
