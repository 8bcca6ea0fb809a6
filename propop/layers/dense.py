"""Layers on flat features: dense maps, elementwise activations, sums and concatenations."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import scipy.sparse as sp

from ..activations import Activation as _Function
from ..activations import get_activation
from .base import Diagonal, Linear, _one_input, _weight

__all__ = ["Activation", "Dense", "Add", "Concat"]


class Activation(Diagonal):
    """An elementwise activation (any name of :func:`propop.available_activations`)."""

    def __init__(self, f: str | _Function) -> None:
        self.f = get_activation(f) if isinstance(f, str) else f

    def __repr__(self) -> str:
        return f"Activation({self.f.name!r})"

    def output_size(self, sizes: Sequence[int]) -> int:
        """The output size; ``ValueError`` if the inputs do not fit."""
        _one_input(self, sizes)
        return sizes[0]

    def forward(self, inputs: Sequence[Any]) -> Any:
        """The output for ``inputs``."""
        (x,) = inputs
        return self.f(x)

    def slope(self, x: Any) -> Any:
        """``d(x)`` with ``dz/dx = A diag(d(x))``."""
        return self.f.df(x)

    def linearize(self, x: Any, linearization: str) -> tuple[Any, Any]:
        """``(a, beta)`` with ``z ~ A (a * x + beta)`` near ``x``."""
        return self.f.linearize(x, linearization)


class Dense(Linear):
    """``z = W x + b``, ``W`` dense or ``scipy.sparse``; sparse ``dW`` on its pattern."""

    def __init__(self, W: Any, b: Any = None) -> None:
        self.W = _weight(W, "Dense: W")
        self.bias = None if b is None else _weight(b, "Dense: b", ndim=1)
        if b is not None and tuple(self.bias.shape) != (self.W.shape[0],):
            raise ValueError(f"Dense: b has shape {tuple(self.bias.shape)}, expected "
                             f"({self.W.shape[0]},)")

    def __repr__(self) -> str:
        return f"Dense({self.W.shape[1]} -> {self.W.shape[0]})"

    def output_size(self, sizes: Sequence[int]) -> int:
        """The output size; ``ValueError`` if the inputs do not fit."""
        _one_input(self, sizes)
        if sizes[0] != self.W.shape[1]:
            raise ValueError(f"Dense with W of shape {tuple(self.W.shape)} takes an input of "
                             f"size {self.W.shape[1]}, got {sizes[0]}")
        return self.W.shape[0]

    def jacobians(self, sizes: Sequence[int]) -> list:
        """The shared Jacobians ``J_i``."""
        return [self.W]

    def set_parameter(self, name: str, value: Any) -> None:
        """Replace ``W`` or ``b``."""
        if name not in self.parameters():
            super().set_parameter(name, value)
        if name == "W":
            self.W = _weight(value, "Dense: W")
        else:
            self.bias = _weight(value, "Dense: b", ndim=1)

    def parameters(self) -> dict:
        """Trainable arrays by name."""
        return {"W": self.W} if self.bias is None else {"W": self.W, "b": self.bias}

    def gradients(self, inputs: Sequence[Any], grad: Any) -> dict:
        """``dE/dparameter`` from the inputs and ``grad = dE/dz``, summed over samples."""
        from ..networks.fnn import _outer

        out = {"W": _outer(self.W, grad, inputs[0])}
        if self.bias is not None:
            out["b"] = grad if grad.ndim == 1 else grad.sum(axis=1)
        return out


class Add(Linear):
    """The sum of its inputs (a residual connection)."""

    def __repr__(self) -> str:
        return "Add()"

    def output_size(self, sizes: Sequence[int]) -> int:
        """The output size; ``ValueError`` if the inputs do not fit."""
        if len(sizes) < 1 or len(set(sizes)) != 1:
            raise ValueError(f"Add needs inputs of one size, got sizes {list(sizes)}")
        return sizes[0]

    def jacobians(self, sizes: Sequence[int]) -> list:
        """The shared Jacobians ``J_i``."""
        return [sp.eye_array(n, format="csr") for n in sizes]


class Concat(Linear):
    """Its inputs stacked (DenseNet-style concatenation), in the order given."""

    def __repr__(self) -> str:
        return "Concat()"

    def output_size(self, sizes: Sequence[int]) -> int:
        """The output size; ``ValueError`` if the inputs do not fit."""
        if len(sizes) < 1:
            raise ValueError("Concat needs at least one input")
        return int(sum(sizes))

    def jacobians(self, sizes: Sequence[int]) -> list:
        """The shared Jacobians ``J_i``."""
        total, start, out = int(sum(sizes)), 0, []
        for n in sizes:
            out.append(sp.csr_array((np.ones(n), (np.arange(start, start + n), np.arange(n))),
                                    shape=(total, n)))
            start += n
        return out


