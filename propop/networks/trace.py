"""Value objects of a propagation: the forward :class:`Trace` and the :class:`Gradients`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["Trace", "Gradients"]


@dataclass(frozen=True)
class Trace:
    """Everything a forward pass computed (paper section 1).

    Attributes
    ----------
    x : array, shape (n0,) or (n0, r)
        The input ``z^(0)``.
    y : tuple of arrays
        ``y[k] = W[k] z[k] + b[k]``, the pre-activations of layers ``k = 0..l-1``.
    z : tuple of arrays
        ``z[0] = x`` and ``z[k+1] = f_k(y[k])``, ``k = 0..l-1``.
    info : dict
        How the trace was obtained (for :func:`propop.forward`: iterations,
        residuals and the solutions of the linearised systems).
    """

    x: Any
    y: tuple
    z: tuple
    info: dict = field(default_factory=dict, compare=False)

    @property
    def output(self) -> Any:
        """The network's output ``z^(l)``."""
        return self.z[-1]


@dataclass(frozen=True)
class Gradients:
    """Gradients of the loss, summed over the samples of a batch.

    Eqs. gradient_w_hidden_layer and gradient_b_hidden_layer.

    Attributes
    ----------
    W : tuple
        ``W[k] = dE/dW[k]``; for a sparse ``W[k]``, a sparse array on its pattern.
    b : tuple
        ``b[k] = dE/db[k]``.
    x : array
        ``dE/dx``, the paper's ``v^(0)``, shaped like the input.
    solution : Solution or None
        The backward solve these gradients came from, if any.
    """

    W: tuple
    b: tuple
    x: Any
    solution: Any = field(default=None, compare=False)
