"""Layers on ``(C, H, W)`` or ``(C, L)`` inputs: convolutions and pooling (sparse Jacobians)."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np
import scipy.sparse as sp

from .. import backend
from .base import Diagonal, Linear, _one_input, _weight
from .patterns import Pattern, Patterned

__all__ = ["Conv1d", "Conv2d", "AvgPool2d", "MaxPool2d", "WindowMaximum", "Windows", "max_pool"]


class Conv2d(Patterned):
    """2-D convolution (cross-correlation, as ``torch.nn.Conv2d``), zero padding.

    ``W`` has shape ``(out_channels, in_channels / groups, kh, kw)``; inputs are
    ``(C, H, W)`` flattened. Output channel ``o`` reads the input channels of its
    group, ``o // (out_channels / groups)``; kernel entries are ``dilation``
    apart. The Jacobian is an explicit sparse matrix whose pattern is built once
    on the host (a CSR tensor on PyTorch, :mod:`propop.torch_sparse`).
    """

    values = ("W", "b")

    def __init__(self, W: Any, b: Any = None, *, input_shape: Sequence[int],
                 stride: int | Sequence[int] = 1, padding: int | Sequence[int] = 0,
                 dilation: int | Sequence[int] = 1, groups: int = 1) -> None:
        self.W = _weight(W, f"{type(self).__name__}: W", ndim=4)
        self.b = None if b is None else _weight(b, f"{type(self).__name__}: b", ndim=1)
        self.input_shape = tuple(int(s) for s in input_shape)
        self.stride, self.padding, self.dilation = _pair(stride), _pair(padding), _pair(dilation)
        self.groups = int(groups)
        out, per_group = self.W.shape[:2]
        if len(self.input_shape) != 3 or self.groups < 1 or out % self.groups or \
                self.input_shape[0] != per_group * self.groups:
            raise ValueError(f"W of shape {self.W.shape} needs (out, in / groups, kh, kw), "
                             f"out divisible by groups = {self.groups}, and an input_shape "
                             f"(C, H, W) with C = in; got {self.input_shape}")
        self.output_shape = (out,) + _out_hw(self.input_shape[1:], self.W.shape[2:],
                                             self.stride, self.padding, self.dilation)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.input_shape} -> {self.output_shape})"

    @property
    def bias(self) -> Any:
        """The channel biases repeated over the output positions (``None`` without)."""
        if self.b is None:
            return None
        return backend.namespace(self.b).repeat(self.b, self._columns.shape[1])

    def output_size(self, sizes: Sequence[int]) -> int:
        """The output size; ``ValueError`` if the inputs do not fit."""
        _one_input(self, sizes)
        if sizes[0] != int(np.prod(self.input_shape)):
            raise ValueError(f"{self!r} takes an input of size {int(np.prod(self.input_shape))} "
                             f"(input_shape {self.input_shape}), got {sizes[0]}")
        return int(np.prod(self.output_shape))

    @functools.cached_property
    def _columns(self) -> Any:
        """im2col of one group: input index per (channel, kernel offset) x output position.

        ``-1`` marks padding; group ``g`` adds :meth:`_group_offset` ``g``.
        """
        return _im2col((self.W.shape[1],) + self.input_shape[1:], self.W.shape[2:],
                       self.stride, self.padding, self.dilation)

    @functools.cached_property
    def _patch_rows(self) -> np.ndarray:
        """Per group, the input row of each im2col entry (padding: the row past the input)."""
        index, size = self._columns, int(np.prod(self.input_shape))
        return np.stack([np.where(index >= 0, index + self._group_offset(group), size)
                         for group in range(self.groups)])

    def _group_offset(self, group: Any) -> Any:
        """Where the input channels of ``group`` start in the flat input."""
        return group * self.W.shape[1] * int(np.prod(self.input_shape[1:]))

    def patterns(self, sizes: Sequence[int]) -> list:
        """The Jacobian's pattern and the kernel: its entries gathered per call, on its device.

        Kernels changed in place are always seen.
        """
        return [(self._pattern, self.W)]

    @functools.cached_property
    def _pattern(self) -> Pattern:
        """The CSR Jacobian's pattern, each entry a kernel entry: shapes alone decide it."""
        index = self._columns  # (C_g kh kw, P)
        out, ckk = self.W.shape[0], index.shape[0]
        positions = index.shape[1]
        o, k, p = np.meshgrid(np.arange(out), np.arange(ckk), np.arange(positions),
                              indexing="ij")
        cols = index[k, p]
        keep = cols >= 0
        cols = cols + self._group_offset(o // (out // self.groups))
        return Pattern.of_entries((o * positions + p)[keep], cols[keep], (o * ckk + k)[keep],
                                  (out * positions, int(np.prod(self.input_shape))),
                                  int(np.prod(self.W.shape)))

    def parameters(self) -> dict:
        """Trainable arrays by name."""
        return {"W": self.W} if self.b is None else {"W": self.W, "b": self.b}

    def set_parameter(self, name: str, value: Any) -> None:
        """Replace ``W`` or ``b``; the sparse Jacobian is rebuilt when next needed."""
        if name not in self.parameters():
            super().set_parameter(name, value)
        if name == "b":
            self.b = _weight(value, f"{type(self).__name__}: b", ndim=1)
            return
        xp = backend.namespace(value) if hasattr(value, "dtype") else np
        self.W = _weight(xp.reshape(xp.asarray(value), self.W.shape),
                         f"{type(self).__name__}: W", ndim=4)

    def gradients(self, inputs: Sequence[Any], grad: Any) -> dict:
        """``dE/dparameter`` from the inputs and ``grad = dE/dz``, summed over samples."""
        x = inputs[0] if inputs[0].ndim == 2 else inputs[0][:, None]
        g = grad if grad.ndim == 2 else grad[:, None]
        xp, index = backend.namespace(x), self._columns
        padded = xp.concat([x, xp.zeros((1, x.shape[1]), dtype=x.dtype,
                                        device=backend.device(x))])
        r, per = x.shape[1], self.W.shape[0] // self.groups
        G = xp.reshape(g, (self.W.shape[0], index.shape[1] * r))  # (out, P r)
        parts = []
        for group in range(self.groups):
            rows = backend.kept_on(self, "patches", self._patch_rows, x)[group, ...]
            patches = backend.take_rows(padded, rows)  # padding: the zero row
            patches = xp.reshape(patches, (index.shape[0], index.shape[1] * r))
            parts.append(G[group * per:(group + 1) * per, :] @ patches.T)  # sum over p, r
        out = {"W": xp.reshape(xp.concat(parts), self.W.shape)}
        if self.b is not None:
            out["b"] = xp.sum(xp.reshape(G, (self.W.shape[0], -1)), axis=1)
        return out


class Conv1d(Conv2d):
    """1-D convolution (``torch.nn.Conv1d``): ``W`` ``(out, in / groups, k)``, input ``(C, L)``."""

    def __init__(self, W: Any, b: Any = None, *, input_shape: Sequence[int],
                 stride: int = 1, padding: int = 0, dilation: int = 1, groups: int = 1) -> None:
        W = _weight(W, "Conv1d: W", ndim=3)
        if len(input_shape) != 2:
            raise ValueError(f"Conv1d needs W of shape (out, in, k) and input_shape (C, L); "
                             f"got {W.shape} and {tuple(input_shape)}")
        super().__init__(W[:, :, None, :], b, input_shape=(input_shape[0], 1, input_shape[1]),
                         stride=(1, int(stride)), padding=(0, int(padding)),
                         dilation=(1, int(dilation)), groups=groups)
        self.kernel_1d = W

    values = ("kernel_1d", "b")

    def to(self, kind: str, device: Any = None, memo: dict | None = None) -> Conv1d:
        """The layer with its values on ``kind``; its 2-D kernel a view of the 1-D one."""
        moved = super().to(kind, device, memo)
        moved.W = moved.kernel_1d[:, :, None, :]
        return moved

    def parameters(self) -> dict:
        """Trainable arrays by name."""
        return {"W": self.kernel_1d} if self.b is None else {"W": self.kernel_1d, "b": self.b}

    def set_parameter(self, name: str, value: Any) -> None:
        """Replace ``W`` (shape ``(out, in, k)``) or ``b``."""
        if name == "W":
            self.kernel_1d = _weight(value, "Conv1d: W", ndim=3)
        super().set_parameter(name, value)

    def gradients(self, inputs: Sequence[Any], grad: Any) -> dict:
        """``dE/dparameter`` from the inputs and ``grad = dE/dz``, summed over samples."""
        out = super().gradients(inputs, grad)
        out["W"] = out["W"][:, :, 0, :]
        return out


class AvgPool2d(Linear):
    """Average pooling as ``torch.nn.AvgPool2d`` (``count_include_pad=True``)."""

    structural = True

    def __init__(self, kernel_size: int | Sequence[int], stride: Any = None, padding: Any = 0,
                 *, input_shape: Sequence[int]) -> None:
        self.input_shape = tuple(int(s) for s in input_shape)
        self.kernel = _pair(kernel_size)
        self.stride = self.kernel if stride is None else _pair(stride)
        self.padding = _pair(padding)
        self.output_shape = (self.input_shape[0],) + _out_hw(self.input_shape[1:], self.kernel,
                                                             self.stride, self.padding)

    def __repr__(self) -> str:
        return f"AvgPool2d({self.input_shape} -> {self.output_shape})"

    def output_size(self, sizes: Sequence[int]) -> int:
        """The output size; ``ValueError`` if the inputs do not fit."""
        return _pool_size(self, sizes)

    def jacobians(self, sizes: Sequence[int]) -> list:
        """The shared Jacobians ``J_i``."""
        return [self._jacobian]

    @functools.cached_property
    def _jacobian(self) -> Any:
        return _window_matrix(self.input_shape, self.kernel, self.stride, self.padding,
                              1.0 / (self.kernel[0] * self.kernel[1]))


class WindowMaximum(Diagonal):
    """The maximum of each window of its input, ``z_w = max_{i in window w} x_i``.

    ``windows`` is ``(w, k)``: the input indices of each window, ``-1`` where a
    window reaches into padding (never its maximum). ``z = A (mask * x)``: ``A``
    sums each window, ``mask`` marks each window's maximum per sample: the first
    one on ties (``ties="first"``, as PyTorch's max pooling and ``max(dim)``), or each
    of the tied ones by ``1 / their count`` (``ties="split"``, as ``torch.amax``). That
    needs every entry in at most one window; overlapping windows are first copied
    apart by :class:`Windows` (:func:`max_pool`).
    """

    def __init__(self, windows: Any, input_size: int, ties: str = "first") -> None:
        self.windows = np.asarray(windows, dtype=np.int64)
        self.input_size = int(input_size)
        if ties not in ("first", "split"):
            raise ValueError(f"ties must be one of ('first', 'split'), got {ties!r}")
        self.ties = ties
        valid = self.windows[self.windows >= 0]
        if self.windows.ndim != 2 or valid.size and valid.max() >= self.input_size:
            raise ValueError(f"windows must be (w, k) indices below the input size "
                             f"{self.input_size}, got shape {self.windows.shape}")
        if np.unique(valid).size != valid.size:
            raise ValueError("WindowMaximum needs windows that do not overlap; copy "
                             "overlapping windows apart with Windows first (see max_pool)")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.input_size} -> {self.windows.shape[0]})"

    def output_size(self, sizes: Sequence[int]) -> int:
        """The output size; ``ValueError`` if the inputs do not fit."""
        _one_input(self, sizes, self.input_size)
        return self.windows.shape[0]

    @functools.cached_property
    def _selection(self) -> Any:
        w, valid = np.nonzero(self.windows >= 0)
        return sp.csr_array((np.ones(w.size), (w, self.windows[w, valid])),
                            shape=(self.windows.shape[0], self.input_size))

    def selection(self, size: int) -> Any:
        """The shared ``A`` that sums each window."""
        return self._selection

    @functools.cached_property
    def _slots(self) -> np.ndarray:
        """Each window's input entries, padding as the row past the input (a ``-inf`` row)."""
        return np.where(self.windows >= 0, self.windows, self.input_size)

    @functools.cached_property
    def _owners(self) -> tuple:
        """Per input entry: its window, its place in the window, and whether it has one."""
        window = np.zeros(self.input_size, dtype=np.int64)
        place = np.full(self.input_size, -1, dtype=np.int64)
        w, slot = np.nonzero(self.windows >= 0)
        window[self.windows[w, slot]], place[self.windows[w, slot]] = w, slot
        return window, place

    def slope(self, x: Any) -> Any:
        """``d(x)`` with ``dz/dx = A diag(d(x))``: one at each window's maximum (its first).

        With ``ties="split"``, ``1 / count`` at each of a window's ``count`` tied maxima.
        """
        xp = backend.namespace(x)
        columns = x if x.ndim == 2 else x[:, None]
        padded = xp.concat([columns, xp.full((1, columns.shape[1]), -xp.inf,
                                             dtype=x.dtype, device=backend.device(x))])
        slots = backend.kept_on(self, "slots", self._slots, x)
        entries = backend.take_rows(padded, slots)  # (w, k, r)
        window, place = (backend.kept_on(self, name, a, x)
                         for name, a in zip(("window", "place"), self._owners))
        if self.ties == "split":
            top = xp.max(entries, axis=1)  # (w, r)
            share = 1.0 / xp.sum(xp.astype(entries == top[:, None, :], x.dtype), axis=1)
            owned = xp.astype(place >= 0, x.dtype)[:, None]
            mask = xp.astype(columns == backend.take_rows(top, window), x.dtype) * \
                backend.take_rows(share, window) * owned
        else:
            best = xp.argmax(entries, axis=1)  # (w, r)
            mask = xp.astype(backend.take_rows(best, window) == place[:, None], x.dtype)
        return mask if x.ndim == 2 else mask[:, 0]

    def linearize(self, x: Any, linearization: str) -> tuple[Any, Any]:
        """``(a, beta)`` with ``z ~ A (a * x + beta)`` near ``x``."""
        return self.slope(x), backend.namespace(x).zeros_like(x)  # exact: piecewise linear


class MaxPool2d(WindowMaximum):
    """Max pooling as ``torch.nn.MaxPool2d`` with windows that do not overlap.

    ``stride`` equal to ``kernel_size`` (the default) and ``dilation`` 1;
    padding never wins. :func:`max_pool` handles any windows.
    """

    def __init__(self, kernel_size: int | Sequence[int], stride: Any = None, padding: Any = 0,
                 *, input_shape: Sequence[int]) -> None:
        self.input_shape = tuple(int(s) for s in input_shape)
        self.kernel = _pair(kernel_size)
        self.stride = self.kernel if stride is None else _pair(stride)
        self.padding = _pair(padding)
        if self.stride != self.kernel:
            raise ValueError(f"MaxPool2d supports non-overlapping windows only (stride = "
                             f"kernel_size); got kernel {self.kernel}, stride {self.stride}: "
                             "use max_pool for overlapping ones")
        self.output_shape = (self.input_shape[0],) + _out_hw(self.input_shape[1:], self.kernel,
                                                             self.stride, self.padding)
        super().__init__(_pool_windows(self.input_shape, self.kernel, self.stride, self.padding,
                                       (1, 1)), int(np.prod(self.input_shape)))

    def __repr__(self) -> str:
        return f"MaxPool2d({self.input_shape} -> {self.output_shape})"


class Windows(Linear):
    """Entries gathered by index, ``z_j = x_{index_j}`` (``0`` where ``index_j = -1``).

    Copies overlapping pooling windows apart (:func:`max_pool`).
    """

    structural = True

    def __init__(self, index: Any, input_size: int) -> None:
        self.index = np.asarray(index, dtype=np.int64).reshape(-1)
        self.input_size = int(input_size)

    def __repr__(self) -> str:
        return f"Windows({self.input_size} -> {self.index.size})"

    def output_size(self, sizes: Sequence[int]) -> int:
        """The output size; ``ValueError`` if the inputs do not fit."""
        _one_input(self, sizes, self.input_size)
        return self.index.size

    @functools.cached_property
    def _jacobian(self) -> Any:
        rows = np.nonzero(self.index >= 0)[0]
        return sp.csr_array((np.ones(rows.size), (rows, self.index[rows])),
                            shape=(self.index.size, self.input_size))

    def jacobians(self, sizes: Sequence[int]) -> list:
        """The shared Jacobians ``J_i``."""
        return [self._jacobian]


def max_pool(kernel_size: int | Sequence[int], stride: Any = None, padding: Any = 0,
             dilation: Any = 1, *, input_shape: Sequence[int]) -> list[tuple[str, Any]]:
    """The layers of ``torch.nn.MaxPool2d`` on ``(C, H, W)`` inputs: ``[(suffix, layer)]``.

    Windows that do not overlap: one :class:`WindowMaximum` node (suffix ``""``).
    Overlapping ones: :class:`Windows` (suffix ``".windows"``) copies every window's
    entries apart, window by window, then :class:`WindowMaximum` takes each maximum.
    Either way the output is ``(C, oh, ow)`` flattened.
    """
    shape, kernel = tuple(int(s) for s in input_shape), _pair(kernel_size)
    stride = kernel if stride is None else _pair(stride)
    windows = _pool_windows(shape, kernel, stride, _pair(padding), _pair(dilation))
    size = int(np.prod(shape))
    valid = windows[windows >= 0]
    if np.unique(valid).size == valid.size:
        return [("", WindowMaximum(windows, size))]
    apart = np.where(windows >= 0, np.arange(windows.size).reshape(windows.shape), -1)
    return [(".windows", Windows(windows, size)), ("", WindowMaximum(apart, windows.size))]


def _pool_windows(input_shape: Sequence[int], kernel: Sequence[int], stride: Sequence[int],
                  padding: Sequence[int], dilation: Sequence[int]) -> Any:
    """Input indices of every pooling window, ``(C oh ow, kh kw)`` in output order; -1 padding."""
    index = _im2col((1,) + tuple(input_shape[1:]), kernel, stride, padding, dilation)
    plane = int(np.prod(input_shape[1:]))
    channels = np.arange(input_shape[0])[:, None, None] * plane
    windows = index.T[None] + channels
    return np.where(index.T[None] >= 0, windows, -1).reshape(-1, index.shape[0])


def _pair(value: int | Sequence[int]) -> tuple[int, int]:
    return (int(value), int(value)) if np.isscalar(value) else tuple(int(v) for v in value)


def _out_hw(hw: Sequence[int], kernel: Sequence[int], stride: Sequence[int],
            padding: Sequence[int], dilation: Sequence[int] = (1, 1)) -> tuple[int, int]:
    out = tuple((n + 2 * p - d * (k - 1) - 1) // s + 1
                for n, k, s, p, d in zip(hw, kernel, stride, padding, dilation))
    if min(out) < 1:
        raise ValueError(f"kernel {tuple(kernel)} does not fit an input of {tuple(hw)} with "
                         f"padding {tuple(padding)}")
    return out


def _im2col(input_shape: Sequence[int], kernel: Sequence[int], stride: Sequence[int],
            padding: Sequence[int], dilation: Sequence[int] = (1, 1)) -> Any:
    """Flat input index of (channel, kernel row, kernel col) x output position; -1 in padding."""
    C, H, W = input_shape
    kh, kw = kernel
    oh, ow = _out_hw((H, W), kernel, stride, padding, dilation)
    c, i, j = np.meshgrid(np.arange(C), np.arange(kh), np.arange(kw), indexing="ij")
    r = np.arange(oh)[:, None] * stride[0] - padding[0]
    q = np.arange(ow)[None, :] * stride[1] - padding[1]
    rows = dilation[0] * i.reshape(-1, 1, 1) + r[None]  # (C kh kw, oh, 1)
    cols = dilation[1] * j.reshape(-1, 1, 1) + q[None]  # (C kh kw, 1, ow)
    inside = (rows >= 0) & (rows < H) & (cols >= 0) & (cols < W)
    flat = c.reshape(-1, 1, 1) * H * W + rows * W + cols
    return np.where(inside, flat, -1).reshape(C * kh * kw, oh * ow)


def _window_matrix(input_shape: Sequence[int], kernel: Sequence[int], stride: Sequence[int],
                   padding: Sequence[int], weight: float) -> Any:
    """Channel-wise pooling matrix: output (c, position) gets ``weight`` x each window entry."""
    C = input_shape[0]
    index = _im2col((1,) + tuple(input_shape[1:]), kernel, stride, padding)  # (kk, P)
    plane, positions = int(np.prod(input_shape[1:])), index.shape[1]
    c, k, p = np.meshgrid(np.arange(C), np.arange(index.shape[0]), np.arange(positions),
                          indexing="ij")
    cols = index[k, p]
    keep = cols >= 0
    rows = (c * positions + p)[keep]
    data = np.full(rows.shape, weight)
    return sp.csr_array((data, (rows, (c * plane + cols)[keep])),
                        shape=(C * positions, C * plane))


def _pool_size(layer: Any, sizes: Sequence[int]) -> int:
    _one_input(layer, sizes)
    if sizes[0] != int(np.prod(layer.input_shape)):
        raise ValueError(f"{type(layer).__name__} takes an input of size "
                         f"{int(np.prod(layer.input_shape))} (input_shape "
                         f"{layer.input_shape}), got {sizes[0]}")
    return int(np.prod(layer.output_shape))
