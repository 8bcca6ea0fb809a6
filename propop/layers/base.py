"""The layer protocol: :class:`Layer`, its two kinds :class:`Linear` and :class:`Diagonal`.

A layer's values (its parameters, its constant offsets) live on one array
backend (:meth:`Layer.to`); its fixed structure (a selection, a sum's identity,
a concatenation's placement) is made on the host from shapes alone and meets
the values through :func:`propop.backend.matrix_on`.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Sequence
from typing import Any

import numpy as np
import scipy.sparse as sp

from .. import backend
from .._checks import canonical_matrix, real_array, require_finite

__all__ = ["Layer", "Linear", "Diagonal", "scaled_identity", "transposed"]

_IDENTITIES: dict[int, Any] = {}  # id -> the shared scaled identities (kept by the cache)


class Layer:
    """The protocol: sizes, the forward map, and the Jacobian for one sample."""

    linear = True
    values: tuple[str, ...] = ()  # the attributes holding arrays of values, moved by to()

    def to(self, kind: str, device: Any = None, memo: dict | None = None) -> Layer:
        """The same layer with its values on backend ``kind`` (``device``: PyTorch's).

        ``memo`` maps ``id(array)`` to its moved copy, so that an array two layers
        share (tied weights) stays one array. Sparse weights move to ``"numpy"``
        or ``"cupy"`` only (``TypeError``).
        """
        memo = {} if memo is None else memo
        moved = copy.copy(self)
        for name in self.values:
            value = getattr(self, name)
            if value is not None and id(value) not in memo:
                memo[id(value)] = backend.convert(value, kind, device)
            setattr(moved, name, None if value is None else memo[id(value)])
        return moved

    def output_size(self, sizes: Sequence[int]) -> int:
        """The output size for inputs of ``sizes``; ``ValueError`` if they do not fit."""
        raise NotImplementedError

    def forward(self, inputs: Sequence[Any]) -> Any:
        """The output for ``inputs`` (one array per input)."""
        raise NotImplementedError

    def jacobian(self, inputs: Sequence[Any]) -> list:
        """``dz/dx_i`` at ``inputs`` (one sample each), one sparse array per input."""
        raise NotImplementedError


class Linear(Layer):
    """``z = sum_i J_i x_i + bias`` with shared ``J_i``."""

    bias: Any = None
    # Whether jacobians() is the layer's structure alone, fixed when it is made (a
    # selection, a sum, a constant map), never its values: a graph's systems then make
    # its couplings once (propop.systems.graph). A layer with weights keeps False.
    structural = False

    def jacobians(self, sizes: Sequence[int]) -> list:
        """The shared ``J_i`` for inputs of ``sizes``."""
        raise NotImplementedError

    def patterns(self, sizes: Sequence[int]) -> list | None:
        """``(Pattern, values)`` of each ``J_i`` if fixed patterns of values (:mod:`.patterns`).

        ``None`` here: a layer whose Jacobians are its values themselves (a dense
        weight) or its structure alone.
        """
        return None

    def forward(self, inputs: Sequence[Any]) -> Any:
        """The output for ``inputs``."""
        shared = self.jacobians([x.shape[0] for x in inputs])
        out = sum((backend.kept_on(self, f"J{i}", J, x) if self.structural else
                   backend.matrix_on(J, x)) @ x for i, (J, x) in enumerate(zip(shared, inputs)))
        if self.bias is None:
            return out
        return out + (self.bias if out.ndim == 1 else self.bias[:, None])

    def jacobian(self, inputs: Sequence[Any]) -> list:
        """``dz/dx_i`` for one sample, one sparse array per input."""
        shared = self.jacobians([x.shape[0] for x in inputs])
        return [sp.csr_array(backend.to_host(J)) for J in shared]

    def parameters(self) -> dict:
        """Trainable arrays by name (none by default)."""
        return {}

    def gradients(self, inputs: Sequence[Any], grad: Any) -> dict:
        """``dE/dparameter`` from the inputs and ``grad = dE/dz``, summed over samples."""
        return {}

    def set_parameter(self, name: str, value: Any) -> None:
        """Replace parameter ``name`` (a key of :meth:`parameters`), e.g. in training."""
        raise ValueError(f"{self!r} has no parameter {name!r}")


class Diagonal(Layer):
    """``z = A (d(x) * x)`` locally: one input, a per-sample diagonal, a shared ``A``."""

    linear = False

    def selection(self, size: int) -> Any:
        """The shared ``A`` for an input of ``size`` (``None``: the identity)."""
        return None

    def slope(self, x: Any) -> Any:
        """``d(x)`` with ``dz/dx = A diag(d(x))``."""
        raise NotImplementedError

    def linearize(self, x: Any, linearization: str) -> tuple[Any, Any]:
        """``(a, beta)`` with ``z ~ A (a * x + beta)`` near ``x``."""
        raise NotImplementedError

    def forward(self, inputs: Sequence[Any]) -> Any:
        """The output for ``inputs``."""
        (x,) = inputs
        a, beta = self.linearize(x, "secant")
        t = a * x + beta
        A = self.selection(x.shape[0])
        return t if A is None else backend.kept_on(self, "selection", A, t) @ t

    def jacobian(self, inputs: Sequence[Any]) -> list:
        """``dz/dx_i`` for one sample, one sparse array per input."""
        (x,) = inputs
        A = self.selection(x.shape[0])
        D = sp.diags_array(backend.to_host(self.slope(x)))
        return [sp.csr_array(D if A is None else A @ D)]


def _weight(a: Any, what: str, ndim: int = 2) -> Any:
    """A parameter as a finite float64 array of its backend (``ndim`` dimensions).

    Matrices may be sparse; PyTorch tensors stay tensors (a moved layer's).
    """
    dtype = backend.namespace(a).float64 if hasattr(a, "dtype") and \
        backend.of(a).name != "numpy" else np.float64  # its backend's: a set_parameter's too
    a = canonical_matrix(a, what, dtype) if ndim == 2 else real_array(a, what, dtype)
    if a.ndim != ndim:
        raise ValueError(f"{what} has {a.ndim} dimensions, expected {ndim}")
    require_finite(a, what)
    return a


def _one_input(layer: Layer, sizes: Sequence[int], size: int | None = None) -> None:
    """``ValueError`` unless ``sizes`` is one input (of ``size`` entries, if given)."""
    if len(sizes) != 1:
        raise ValueError(f"{layer!r} takes one input, got {len(sizes)}")
    if size is not None and sizes[0] != size:
        raise ValueError(f"{layer!r} takes an input of size {size}, got {sizes[0]}")




@functools.lru_cache(maxsize=512)
def scaled_identity(n: int, w: float = 1.0) -> Any:
    """``w I`` of size ``n``: a canonical CSR array made once, shared and read-only.

    The structural couplings of a graph (an activation's input, a residual sum's
    terms) are identities whose size is all that changes; made at every call they
    cost more than the products they take part in. Shared, they are never written:
    their arrays are read-only, so a caller that tried would raise, not corrupt them.
    """
    eye = sp.eye_array(int(n), format="csr", dtype=np.float64)
    if w != 1.0:
        eye = (float(w) * eye).tocsr()
    for part in (eye.data, eye.indices, eye.indptr):
        part.flags.writeable = False
    _IDENTITIES[id(eye)] = eye
    return eye


def transposed(M: Any) -> Any:
    """``M^T``: a shared scaled identity is its own (no transposed copy to make canonical)."""
    return M if _IDENTITIES.get(id(M)) is M else M.T
