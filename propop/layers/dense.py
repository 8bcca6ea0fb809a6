"""Layers on flat features: dense maps, elementwise activations, sums and concatenations."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np
import scipy.sparse as sp

from .. import backend
from ..activations import Activation as _Function
from ..activations import get_activation
from .base import Diagonal, Linear, _one_input, _weight, scaled_identity
from .patterns import Patterned, diagonal, kron_identity

__all__ = ["Activation", "Dense", "TokenDense", "Add", "Concat", "LinearMap", "BatchNorm",
           "LogSumExp", "softmax_over"]


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

    values = ("W", "bias")

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
        out = {"W": backend.outer_on_pattern(self.W, grad, inputs[0])}
        if self.bias is not None:
            out["b"] = grad if grad.ndim == 1 else backend.namespace(grad).sum(grad, axis=1)
        return out


class TokenDense(Patterned):
    """``nn.Linear`` on each of a sample's ``tokens`` rows: ``z_t = W x_t + b``.

    A sample ``(..., in)`` flat in C order is ``tokens`` consecutive inputs of ``in``
    features (a sequence's positions, a transformer's). Its Jacobian is
    ``kron(I_tokens, W)``, made from the current ``W`` each time; ``dW`` sums
    ``grad_t x_t^T`` over tokens and samples.
    """

    values = ("W", "b")

    def __init__(self, W: Any, b: Any = None, tokens: int = 1) -> None:
        self.W, self.tokens = _weight(W, "TokenDense: W"), int(tokens)
        if sp.issparse(self.W):
            raise ValueError("TokenDense: W must be dense (an imported nn.Linear's)")
        self.b = None if b is None else _weight(b, "TokenDense: b", ndim=1)

    def __repr__(self) -> str:
        return f"TokenDense({self.tokens} x {self.W.shape[1]} -> {self.W.shape[0]})"

    @property
    def bias(self) -> Any:
        """Every token's bias."""
        return None if self.b is None else backend.namespace(self.b).tile(self.b, (self.tokens,))

    def output_size(self, sizes: Sequence[int]) -> int:
        """The output size; ``ValueError`` if the inputs do not fit."""
        _one_input(self, sizes, self.tokens * self.W.shape[1])
        return self.tokens * self.W.shape[0]

    def patterns(self, sizes: Sequence[int]) -> list:
        """``kron(I_tokens, W)``: ``W`` in every diagonal block, its pattern made once a shape.

        The entries the current ``W``'s, gathered on its device.
        """
        return [(kron_identity(self.tokens, *self.W.shape), self.W)]

    def forward(self, inputs: Sequence[Any]) -> Any:
        """``z_t = W x_t + b``, every token's in one batched product (no Kronecker matrix)."""
        (x,) = inputs
        xp = backend.namespace(x)
        z = xp.matmul(self.W, xp.reshape(x, (self.tokens, self.W.shape[1], -1)))
        if self.b is not None:
            z = z + self.b[:, None]
        return xp.reshape(z, (-1,) if x.ndim == 1 else (-1, x.shape[1]))

    def parameters(self) -> dict:
        """``W`` and ``b`` (as PyTorch's ``weight`` and ``bias``)."""
        return {"W": self.W} if self.b is None else {"W": self.W, "b": self.b}

    def set_parameter(self, name: str, value: Any) -> None:
        """Replace ``W`` or ``b``."""
        if name not in self.parameters():
            super().set_parameter(name, value)
        setattr(self, name, _weight(value, f"TokenDense: {name}", 2 if name == "W" else 1))

    def gradients(self, inputs: Sequence[Any], grad: Any) -> dict:
        """``dW = sum grad_t x_t^T`` and ``db = sum grad_t``, over tokens and samples."""
        xp = backend.namespace(grad)
        x = inputs[0] if inputs[0].ndim == 2 else inputs[0][:, None]
        g = grad if grad.ndim == 2 else grad[:, None]
        g = xp.reshape(g, (self.tokens, self.W.shape[0], -1))
        x = xp.reshape(x, (self.tokens, self.W.shape[1], -1))
        out = {"W": xp.tensordot(g, x, axes=([0, 2], [0, 2]))}
        return out | ({} if self.b is None else {"b": xp.sum(g, axis=(0, 2))})


class Add(Linear):
    """The sum of its inputs (a residual connection), each times its weight (default 1).

    ``Add(weights=(1, -1))`` is a difference.
    """

    structural = True

    def __init__(self, weights: Sequence[float] | None = None) -> None:
        self.weights = None if weights is None else tuple(float(w) for w in weights)

    def __repr__(self) -> str:
        return "Add()" if self.weights is None else f"Add(weights={self.weights})"

    def output_size(self, sizes: Sequence[int]) -> int:
        """The output size; ``ValueError`` if the inputs do not fit."""
        if len(sizes) < 1 or len(set(sizes)) != 1:
            raise ValueError(f"Add needs inputs of one size, got sizes {list(sizes)}")
        if self.weights is not None and len(self.weights) != len(sizes):
            raise ValueError(f"Add with {len(self.weights)} weights takes {len(self.weights)} "
                             f"inputs, got {len(sizes)}")
        return sizes[0]

    def jacobians(self, sizes: Sequence[int]) -> list:
        """The shared Jacobians ``J_i = w_i I`` (:func:`~.base.scaled_identity`: made once)."""
        weights = self.weights or (1.0,) * len(sizes)
        return [scaled_identity(n, w) for w, n in zip(weights, sizes)]

    def forward(self, inputs: Sequence[Any]) -> Any:
        """``sum_i w_i x_i``: what ``sum_i (w_i I) x_i`` gives, with no product."""
        weights = self.weights or (1.0,) * len(inputs)
        return sum(x if w == 1.0 else w * x for w, x in zip(weights, inputs))


class Concat(Linear):
    """Its inputs stacked (DenseNet-style concatenation), in the order given.

    By default the flat inputs one after another (``torch.cat`` along the first
    feature dimension, channels). With ``shapes`` (each input's shape without
    the batch) and ``dim`` (an index into them), ``torch.cat`` along that
    dimension, whose flat output interleaves the inputs.
    """

    structural = True

    def __init__(self, dim: int | None = None, shapes: Sequence[Sequence[int]] | None = None
                 ) -> None:
        self.dim = dim
        self.shapes = None if shapes is None else [tuple(int(n) for n in s) for s in shapes]

    def __repr__(self) -> str:
        return "Concat()" if self.dim is None else f"Concat(dim={self.dim})"

    def output_size(self, sizes: Sequence[int]) -> int:
        """The output size; ``ValueError`` if the inputs do not fit."""
        if len(sizes) < 1:
            raise ValueError("Concat needs at least one input")
        if self.shapes is not None and [int(np.prod(s)) for s in self.shapes] != list(sizes):
            raise ValueError(f"Concat of shapes {self.shapes} takes inputs of sizes "
                             f"{[int(np.prod(s)) for s in self.shapes]}, got {list(sizes)}")
        return int(sum(sizes))

    def jacobians(self, sizes: Sequence[int]) -> list:
        """The shared Jacobians ``J_i``."""
        total, out = int(sum(sizes)), []
        for n, rows in zip(sizes, self._positions(sizes)):
            out.append(sp.csr_array((np.ones(n), (rows, np.arange(n))), shape=(total, n)))
        return out

    def forward(self, inputs: Sequence[Any]) -> Any:
        """The inputs where :meth:`jacobians` places them, concatenated (no product)."""
        xp, batch = backend.namespace(inputs[0]), tuple(inputs[0].shape[1:])
        if self.dim is None or self.shapes is None:
            return xp.concat(list(inputs), axis=0)
        parts = [xp.reshape(x, s + batch) for x, s in zip(inputs, self.shapes)]
        return xp.reshape(xp.concat(parts, axis=self.dim % len(self.shapes[0])), (-1,) + batch)

    def _positions(self, sizes: Sequence[int]) -> list:
        """Where each input's entries land in the flat output."""
        starts = np.cumsum([0] + list(sizes))
        if self.dim is None or self.shapes is None:
            return [np.arange(a, b) for a, b in zip(starts, starts[1:])]
        d = self.dim
        shape = list(self.shapes[0])
        shape[d] = sum(s[d] for s in self.shapes)
        out, offset = [], 0
        for s in self.shapes:
            index = np.indices(s).reshape(len(s), -1)
            index[d] += offset
            out.append(np.ravel_multi_index(tuple(index), shape))
            offset += s[d]
        return out


class LinearMap(Linear):
    """``z = sum_i M_i x_i + bias`` with given shared matrices and no parameters.

    For what a traced model computes with constants: ``c * x``, ``x + c``, a
    difference, a softmax's centring (:class:`LogSumExp`). The matrices are
    structure, kept on the host; the bias moves with :meth:`to`.
    """

    structural = True

    values = ("bias",)

    def __init__(self, matrices: Sequence[Any], bias: Any = None, name: str = "LinearMap"
                 ) -> None:
        self.matrices = [sp.csr_array(M) if sp.issparse(M) else _weight(M, f"{name}: M")
                         for M in matrices]
        self.bias = None if bias is None else _weight(bias, f"{name}: bias", ndim=1)
        self.name = name

    def __repr__(self) -> str:
        sizes = [M.shape[1] for M in self.matrices]
        return f"{self.name}({' + '.join(map(str, sizes))} -> {self.matrices[0].shape[0]})"

    def output_size(self, sizes: Sequence[int]) -> int:
        """The output size; ``ValueError`` if the inputs do not fit."""
        expected = [M.shape[1] for M in self.matrices]
        if list(sizes) != expected:
            raise ValueError(f"{self!r} takes inputs of sizes {expected}, got {list(sizes)}")
        return self.matrices[0].shape[0]

    def jacobians(self, sizes: Sequence[int]) -> list:
        """The shared Jacobians ``J_i``."""
        return list(self.matrices)


class BatchNorm(Patterned):
    """Batch normalisation in evaluation mode (``torch.nn.BatchNorm1d/2d`` after ``eval()``).

    ``z = weight_c (x - mean_c) / sqrt(var_c + eps) + bias_c`` for channel ``c``
    of a ``(C, ...)`` input: an affine map with the running statistics fixed.
    ``weight`` and ``bias`` are its parameters (``None``: ``affine=False``).
    """

    values = ("mean", "var", "weight", "b")

    def __init__(self, mean: Any, var: Any, *, eps: float, input_shape: Sequence[int],
                 weight: Any = None, bias: Any = None) -> None:
        self.mean, self.var = _weight(mean, "BatchNorm: mean", 1), _weight(var, "BatchNorm: var", 1)
        self.eps, self.input_shape = float(eps), tuple(int(n) for n in input_shape)
        self.weight = None if weight is None else _weight(weight, "BatchNorm: weight", 1)
        self.b = None if bias is None else _weight(bias, "BatchNorm: bias", 1)
        if self.input_shape[0] != self.mean.shape[0]:
            raise ValueError(f"BatchNorm of {self.mean.shape[0]} channels needs an input "
                             f"shape (C, ...) with C = {self.mean.shape[0]}, got "
                             f"{self.input_shape}")

    def __repr__(self) -> str:
        return f"BatchNorm({self.input_shape})"

    @property
    def _spread(self) -> int:
        return int(np.prod(self.input_shape[1:]))

    @property
    def _inverse_std(self) -> Any:
        return 1 / backend.namespace(self.var).sqrt(self.var + self.eps)

    @property
    def scale(self) -> Any:
        """The slope of every feature, ``weight / sqrt(var + eps)`` per channel, repeated."""
        w = self._inverse_std if self.weight is None else self.weight * self._inverse_std
        return backend.namespace(w).repeat(w, self._spread)

    @property
    def bias(self) -> Any:
        """The offset of every feature, ``bias - mean * weight / sqrt(var + eps)``."""
        w = self._inverse_std if self.weight is None else self.weight * self._inverse_std
        b = -self.mean * w + (0 if self.b is None else self.b)
        return backend.namespace(b).repeat(b, self._spread)

    def output_size(self, sizes: Sequence[int]) -> int:
        """The output size; ``ValueError`` if the inputs do not fit."""
        _one_input(self, sizes, int(np.prod(self.input_shape)))
        return sizes[0]

    def patterns(self, sizes: Sequence[int]) -> list:
        """The Jacobian: the diagonal of :attr:`scale`."""
        return [(diagonal(int(np.prod(self.input_shape))), self.scale)]

    def parameters(self) -> dict:
        """Trainable arrays by name: ``weight`` and ``bias`` (as PyTorch's)."""
        return {} if self.weight is None else {"weight": self.weight, "bias": self.b}

    def set_parameter(self, name: str, value: Any) -> None:
        """Replace ``weight`` or ``bias``."""
        if name not in self.parameters():
            super().set_parameter(name, value)
        value = _weight(value, f"BatchNorm: {name}", 1)
        setattr(self, "weight" if name == "weight" else "b", value)

    def gradients(self, inputs: Sequence[Any], grad: Any) -> dict:
        """``dE/dweight = sum grad * x_hat``, ``dE/dbias = sum grad``, per channel."""
        if self.weight is None:
            return {}
        x = inputs[0] if inputs[0].ndim == 2 else inputs[0][:, None]
        xp = backend.namespace(x)
        g = xp.reshape(grad if grad.ndim == 2 else grad[:, None],
                       (self.mean.shape[0], -1, x.shape[1]))
        x_hat = (xp.reshape(x, g.shape) - self.mean[:, None, None]) * \
            self._inverse_std[:, None, None]
        return {"weight": xp.sum(g * x_hat, axis=(1, 2)), "bias": xp.sum(g, axis=(1, 2))}


class LogSumExp(Diagonal):
    """``z_g = log sum_{i in g} exp(x_i)`` over groups of entries: a softmax's normaliser.

    ``groups[i]`` is entry ``i``'s group. ``dz/dx = A diag(softmax(x))``, ``A``
    summing each group, so with :class:`LinearMap` (``x - A^T z``, the log-softmax)
    and the ``exp`` activation it builds ``torch.softmax`` exactly
    (:func:`softmax_over`).
    """

    def __init__(self, groups: Any) -> None:
        self.groups = np.asarray(groups, dtype=np.int64).reshape(-1)
        self.count = int(self.groups.max()) + 1 if self.groups.size else 0

    def __repr__(self) -> str:
        return f"LogSumExp({self.groups.size} -> {self.count})"

    def output_size(self, sizes: Sequence[int]) -> int:
        """The output size; ``ValueError`` if the inputs do not fit."""
        _one_input(self, sizes, self.groups.size)
        return self.count

    def selection(self, size: int) -> Any:
        """The shared ``A`` that sums each group."""
        return self._sums

    @functools.cached_property
    def _sums(self) -> Any:
        n = self.groups.size
        return sp.csr_array((np.ones(n), (self.groups, np.arange(n))), shape=(self.count, n))

    @functools.cached_property
    def _slots(self) -> Any:
        """``(count, widest group)`` entry indices per group, padded with ``n`` (a -inf row)."""
        order = np.argsort(self.groups, kind="stable")
        starts = np.searchsorted(self.groups[order], np.arange(self.count + 1))
        sizes = np.diff(starts)
        slots = np.full((self.count, int(sizes.max(initial=0))), self.groups.size)
        for g in range(self.count):
            slots[g, :sizes[g]] = order[starts[g]:starts[g + 1]]
        return slots

    def _parts(self, x: Any) -> tuple[Any, Any]:
        """``(softmax(x), log-sum-exp per group)`` of columns ``x``, stable (maxima removed)."""
        xp = backend.namespace(x)
        padded = xp.concat([x, xp.full((1, x.shape[1]), -xp.inf, dtype=x.dtype,
                                       device=backend.device(x))])
        slots = backend.kept_on(self, "slots", self._slots, x)
        top = xp.max(backend.take_rows(padded, slots), axis=1)
        groups = backend.kept_on(self, "groups", self.groups, x)
        e = xp.exp(x - backend.take_rows(top, groups))
        total = backend.kept_on(self, "sums", self._sums, e) @ e
        return e / backend.take_rows(total, groups), xp.log(total) + top

    def forward(self, inputs: Sequence[Any]) -> Any:
        """The output for ``inputs``."""
        (x,) = inputs
        lse = self._parts(x if x.ndim == 2 else x[:, None])[1]
        return lse if x.ndim == 2 else lse[:, 0]

    def slope(self, x: Any) -> Any:
        """``d(x) = softmax(x)`` within each group."""
        s = self._parts(x if x.ndim == 2 else x[:, None])[0]
        return s if x.ndim == 2 else s[:, 0]

    def linearize(self, x: Any, linearization: str) -> tuple[Any, Any]:
        """The tangent, exact at ``x``: ``a = softmax(x)``, ``A beta = lse(x) - a . x``."""
        columns = x if x.ndim == 2 else x[:, None]
        s, lse = self._parts(columns)
        a, beta = s, s * (backend.take_rows(lse, backend.kept_on(self, "groups", self.groups, x))
                          - columns)
        return (a, beta) if x.ndim == 2 else (a[:, 0], beta[:, 0])


def softmax_over(shape: Sequence[int], dim: int, log: bool = False, keep: Any = None
                 ) -> list[tuple[str, Any]]:
    """The layers of ``torch.softmax`` (``log``: ``log_softmax``) over ``dim`` of ``shape``.

    ``shape`` is one sample's, ``dim`` an index into it. Returns ``[(suffix,
    layer, reads)]`` with ``reads`` the inputs by suffix (``None``: the node's input):
    ``.lse`` (:class:`LogSumExp`), ``.log`` (``x - lse``) and, for the softmax,
    the ``exp`` activation (suffix ``""``). ``keep``, a boolean array of ``shape``
    (a causal mask), softmaxes the kept entries of each group alone, as a ``-inf``
    score would: they are gathered first (``.kept``), and the weights scattered back
    among exact zeros (``.exp``, then ``""``); every group keeps an entry.
    """
    shape = tuple(int(n) for n in shape)
    index = np.indices(shape).reshape(len(shape), -1)
    rest = [n for i, n in enumerate(shape) if i != dim]
    groups = np.ravel_multi_index(tuple(np.delete(index, dim, axis=0)), rest) if rest \
        else np.zeros(index.shape[1], dtype=np.int64)
    kept = None if keep is None else np.flatnonzero(np.broadcast_to(keep, shape))
    if kept is not None and (log or np.unique(groups[kept]).size != np.unique(groups).size):
        raise ValueError("softmax_over: keep must leave every group an entry, and a "
                         "log-softmax none out (its -inf is no number)")
    x = None if kept is None else ".kept"
    lse = LogSumExp(groups if kept is None else groups[kept])
    n = lse.groups.size
    center = LinearMap([sp.eye_array(n, format="csr"), -lse.selection(n).T.tocsr()],
                       name="LogSoftmax")
    layers = [(".lse", lse, [x]), ("" if log else ".log", center, [x, ".lse"])]
    if kept is None:
        return layers if log else layers + [("", Activation("exp"), [".log"])]
    gather = sp.csr_array((np.ones(n), (np.arange(n), kept)), shape=(n, groups.size))
    return [(".kept", LinearMap([gather], name="Keep"), [None]), *layers,
            (".exp", Activation("exp"), [".log"]),
            ("", LinearMap([gather.T.tocsr()], name="Scatter"), [".exp"])]
