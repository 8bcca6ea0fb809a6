"""Multi-layer Elman RNNs (paper section 2.2) and their sequential reference propagation.

Layer ``k = 0..l-1`` at time step ``s = 0..tau-1`` computes
``y[k][s] = W[k] z[k][s] + U[k] z[k+1][s-1] + b[k]`` and ``z[k+1][s] = f_k(y[k][s])``
with ``z[k+1][-1] = 0`` and ``z[0] = x`` (the paper's theta_k, indices from 0).
Time is the leading axis: ``xs`` is ``(tau, n_in)`` or ``(tau, n_in, r)``.
"""

from __future__ import annotations

import math

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import backend, memory
from .._checks import (float_dtype, positive_sizes, real_array, require_finite, require_samples,
                      require_shape)
from ..activations import Activation, get_activation
from ..losses import loss_gradient, require_steps_target
from .fnn import _as_biases, _as_weight, _float_dtype, transposed
from .trace import Trace

__all__ = ["RNN", "RNNGradients"]


def _kernel_states(W: Any, U: Any, b: Any, activation: str, inputs: Any) -> Any:
    """A tanh or ReLU layer's states by PyTorch's recurrent kernel, or ``None``.

    ``torch.rnn_tanh``/``rnn_relu`` (cuDNN's fused kernel on CUDA, one C++ loop on the
    CPU: 1.9x propop's loop of three tensor operations a step at hidden size 8, 16
    samples, 10000 steps) for dense tensors; ``None`` for other backends and
    activations, which the loop runs. ``inputs`` ``(tau, n[, r])``, states alike.
    """
    if (activation not in ("tanh", "relu") or backend.of(inputs).name != "torch"
            or backend.is_sparse(W) or backend.is_sparse(U)):
        return None
    import torch

    from .gated import elman_kernel

    X = inputs[:, :, None] if inputs.ndim == 2 else inputs
    first = torch.zeros((X.shape[2], U.shape[0]), dtype=X.dtype, device=X.device)
    states = elman_kernel(activation, X.permute(0, 2, 1).contiguous(), first,
                          [W, U, b, torch.zeros_like(b)])  # (tau, r, h): features last
    states = states.permute(0, 2, 1).contiguous()
    return states[:, :, 0] if inputs.ndim == 2 else states


@dataclass(frozen=True)
class RNNGradients:
    """Gradients of an RNN, summed over time steps and samples.

    Attributes
    ----------
    W, U, b : tuple
        Per layer, ``dE/dW[k]``, ``dE/dU[k]``, ``dE/db[k]``; a sparse weight's
        gradient is sparse on its pattern.
    x : array
        ``dE/dx``, shaped like the input sequence.
    solution : Solution or None
        The backward solve these came from, if any.
    """

    W: tuple
    U: tuple
    b: tuple
    x: Any
    solution: Any = field(default=None, compare=False)

    def named_parameters(self) -> Any:
        """``(name, gradient)`` under ``torch.nn.RNN``'s names, as its ``named_parameters()``.

        propop's one bias ``b`` is ``bias_ih + bias_hh``: both get its gradient.
        """
        for k, (dW, dU, db) in enumerate(zip(self.W, self.U, self.b)):
            yield from ((f"weight_ih_l{k}", dW), (f"weight_hh_l{k}", dU),
                        (f"bias_ih_l{k}", db), (f"bias_hh_l{k}", db))


class RNN:
    """A multi-layer Elman RNN ``z[k,s] = f(W_k z[k-1,s] + U_k z[k,s-1] + b_k)``.

    Parameters
    ----------
    W, U : sequences of arrays
        ``W[k]`` is ``(h_{k+1}, h_k)`` (``h_0`` the input width), ``U[k]`` is
        ``(h_{k+1}, h_{k+1})``; dense or sparse.
    b : sequence of arrays, optional
        ``b[k]`` is ``(h_{k+1},)``; for ``torch.nn.RNN`` use ``b_ih + b_hh``.
    activation : str, Activation or sequence of them

    Examples
    --------
    >>> import numpy as np
    >>> rnn = RNN.random([3, 5, 4], activation="tanh", seed=0)
    >>> rnn.forward(np.ones((7, 3))).output.shape
    (7, 4)
    """

    def __init__(self, W: Sequence[Any], U: Sequence[Any], b: Sequence[Any] | None = None,
                 activation: str | Activation | Sequence[Any] = "tanh") -> None:
        if isinstance(W, (str, bytes)) or not isinstance(W, Sequence) or len(W) == 0:
            raise ValueError("W must be a non-empty sequence of weight matrices")
        if isinstance(U, (str, bytes)) or not isinstance(U, Sequence):
            raise ValueError("U must be a sequence of recurrent weight matrices")
        if len(U) != len(W):
            raise ValueError(f"got {len(W)} input weights W but {len(U)} recurrent weights U")
        weights = [_as_weight(Wk, f"layer {k}: W[{k}]") for k, Wk in enumerate(W)]
        recurrent = [_as_weight(Uk, f"layer {k}: U[{k}]") for k, Uk in enumerate(U)]
        be = backend.of(*weights, *recurrent)
        biases = _as_biases(b, weights, be.xp)
        self.dtype = _float_dtype(weights + recurrent + biases)
        self.W = tuple(backend.astype(Wk, self.dtype) for Wk in weights)
        self.U = tuple(backend.astype(Uk, self.dtype) for Uk in recurrent)
        self.b = tuple(backend.astype(bk, self.dtype) for bk in biases)
        spec = activation
        self.activations = ((get_activation(spec),) * len(W) if isinstance(spec, (str, Activation))
                            else tuple(get_activation(a) for a in spec))
        if len(self.activations) != len(W):
            raise ValueError(f"got {len(self.activations)} activations for {len(W)} layers")
        self.backend = be
        self._validate()

    def _validate(self) -> None:
        for k, (Wk, Uk, bk) in enumerate(zip(self.W, self.U, self.b)):
            if k > 0 and Wk.shape[1] != self.W[k - 1].shape[0]:
                n = self.W[k - 1].shape[0]
                raise ValueError(f"layer {k}: W[{k}] has shape {Wk.shape}, expected "
                                 f"({Wk.shape[0]}, {n}) to follow layer {k - 1}'s width {n}")
            h = Wk.shape[0]
            require_shape(Uk, (h, h), f"layer {k}: U[{k}]", f" (square, W[{k}] has {h} rows)")
            require_shape(bk, (h,), f"layer {k}: b[{k}]", f" to match W[{k}]")
            for name, a in (("W", Wk), ("U", Uk), ("b", bk)):
                require_finite(a, f"layer {k}: {name}[{k}]")

    @property
    def sizes(self) -> tuple[int, ...]:
        """Widths ``(n_in, h_1, ..., h_l)``."""
        return (self.W[0].shape[1],) + tuple(Wk.shape[0] for Wk in self.W)

    @property
    def depth(self) -> int:
        """Number of layers ``l``."""
        return len(self.W)

    @property
    def WT(self) -> tuple:
        """The transposed input weights, made per call (in-place changes to ``W`` are seen)."""
        return tuple(transposed(Wk) for Wk in self.W)

    @property
    def UT(self) -> tuple:
        """The transposed recurrent weights, made per call."""
        return tuple(transposed(Uk) for Uk in self.U)

    def __repr__(self) -> str:
        return f"RNN(sizes={self.sizes}, dtype={self.dtype})"

    @classmethod
    def random(cls, sizes: Sequence[int], activation: str | Activation = "tanh",
               seed: int | None = 0, dtype: Any = "float64") -> RNN:
        """Weights uniform in ``(-1/sqrt(h), 1/sqrt(h))``, as ``torch.nn.RNN`` initialises them."""
        sizes, dtype = positive_sizes(sizes), float_dtype(dtype)
        memory.require_arrays(sum((m + n) * n for m, n in zip(sizes, sizes[1:])),
                              dtype.itemsize, f"RNN.random of {len(sizes) - 1} "
                              f"layers of widths up to {max(sizes)}",
                              "use fewer or narrower layers")
        rng = np.random.default_rng(seed)
        W, U, b = [], [], []
        for n_in, h in zip(sizes[:-1], sizes[1:]):
            bound = 1 / np.sqrt(h)
            W.append(rng.uniform(-bound, bound, (h, n_in)).astype(dtype))
            U.append(rng.uniform(-bound, bound, (h, h)).astype(dtype))
            b.append(rng.uniform(-bound, bound, h).astype(dtype))
        return cls(W, U, b, activation)

    def to(self, kind: str, device: Any = None) -> RNN:
        """The same network with its arrays on backend ``kind``.

        ``kind`` is ``"numpy"``, ``"torch"``, ``"cupy"`` or ``"array_api_strict"``;
        ``device`` a PyTorch device such as ``"cuda"``. Sparse weights move to
        ``"numpy"`` or ``"cupy"`` only.
        """
        return RNN(*([backend.convert(a, kind, device) for a in arrays]
                     for arrays in (self.W, self.U, self.b)), self.activations)

    def check_input(self, xs: Any) -> Any:
        """Return ``xs`` as an array of the network's dtype, or raise naming the problem."""
        xs = real_array(xs, "xs", self.dtype)
        if xs.ndim not in (2, 3) or xs.shape[1] != self.sizes[0] or xs.shape[0] < 1:
            raise ValueError(f"xs has shape {xs.shape}, expected (tau, {self.sizes[0]}) or "
                             f"(tau, {self.sizes[0]}, r) with tau >= 1: time first, then "
                             "features")
        require_samples(xs, "xs")
        require_finite(xs, "xs")
        return xs

    def check_eps(self, trace: Trace, eps: Any) -> Any:
        """``eps`` as an array of the output's shape ``(tau, h[, r])`` and dtype, or raise."""
        eps = real_array(eps, "eps", self.dtype)
        require_shape(eps, trace.output.shape, "eps", " (the output's shape: time, "
                                                      "features[, samples])")
        require_finite(eps, "eps")
        return eps

    def forward(self, xs: Any) -> Trace:
        """Sequential reference forward pass; ``trace.y[k]``/``trace.z[k]`` are ``(tau, h, [r])``.

        Each layer's input projection ``W[k] z[k][s]`` is one product over all time
        steps; the recurrence over time is the sequential part.
        """
        xp = self.backend.xp
        z = [self.check_input(xs)]
        tau, batch = z[0].shape[0], z[0].shape[2] if z[0].ndim == 3 else 1
        memory.require_arrays(2 * tau * sum(self.sizes) * batch, backend.itemsize(self.dtype),
                              f"the forward pass of {tau} steps",
                              "use a shorter sequence, a smaller batch or float32")
        y = []
        for Wk, Uk, bk, f in zip(self.W, self.U, self.b, self.activations):
            inputs = backend.over_time(Wk, z[-1]) + (bk[:, None] if z[-1].ndim == 3 else bk)
            zk = _kernel_states(Wk, Uk, bk, f.name, z[-1])
            if zk is not None:  # y from the states: one product over all steps
                before = xp.concat([xp.zeros_like(zk[:1, ...]), zk[:-1, ...]])
                y.append(inputs + backend.over_time(Uk, before))
                z.append(zk)
                continue
            yk = backend.contiguous(inputs)  # y_s = W z_s + b, then U z_(s-1) added in place
            zk = xp.empty(inputs.shape, dtype=self.dtype, device=backend.device(inputs))
            one = yk.ndim == 3 and yk.shape[2] == 1  # one sample: vectors, BLAS's gemv
            ys, zs = (backend.unstack(a[..., 0] if one else a) for a in (yk, zk))  # the steps
            write = f.writer(xp)
            write(ys[0], out=zs[0])
            recur = backend.matmul_writer(Uk, plain=True, accumulate=True)
            for y_s, z_before, z_s in zip(ys[1:], zs, zs[1:]):
                recur(z_before, out=y_s)
                write(y_s, out=z_s)
            y.append(yk)
            z.append(zk)
        return Trace(x=z[0], y=tuple(y), z=tuple(z), info={"sequential": True})

    def slopes(self, trace: Trace) -> list[Any]:
        """``f'_k(y_k)`` of every layer, ``(tau, h[, r])`` each.

        From the states where this network's sequential pass made them (``z = f(y)``:
        tanh's ``1 - z^2``, no second ``tanh``, as autograd takes it), else from ``y``.
        """
        own = trace.info.get("sequential", False)
        return [act.df_of_output(z) if own and act.df_of_output is not None else act.df(y)
                for act, y, z in zip(self.activations, trace.y, trace.z[1:])]

    def loss_gradient(self, trace: Trace, target: Any, loss: str = "mse",
                      reduction: str = "sum") -> Any:
        """``eps = dE/dz`` of the top layer at every step; features are axis 1.

        ``target`` is shaped like the output, or integer labels ``(tau[, r])`` for
        ``"cross_entropy"`` (softmax over the features of each step). For a loss at
        the last step only, pass an ``eps`` with zeros elsewhere to
        :func:`propop.backward_system` directly.
        """
        xp = self.backend.xp
        require_steps_target(trace.output, target, loss)
        out = xp.moveaxis(trace.output, 1, 0)
        if tuple(np.shape(target)) == tuple(trace.output.shape):  # steps first: moved
            target = xp.moveaxis(real_array(target, "target", out.dtype), 1, 0)
        return xp.moveaxis(loss_gradient(out, target, loss, reduction), 0, 1)

    def backward(self, trace: Trace, eps: Any) -> list[Any]:
        """Sequential backpropagation through time; returns ``v[0..l]``, each ``(tau, h, [r])``.

        ``v[k+1][s] = f'(y[k][s]) * (W[k+1]^T v[k+2][s] + U[k]^T v[k+1][s+1])`` with
        ``eps`` in place of the first term at the top layer, and
        ``v[0][s] = W[0]^T v[1][s]`` (eq. back_prop_sys_rnn's recursion).
        """
        xp = self.backend.xp
        v = [None] * (self.depth + 1)
        above = self.check_eps(trace, eps)
        for k in range(self.depth - 1, -1, -1):
            slope = self.activations[k].df(trace.y[k])
            vk = xp.empty_like(above)
            for s in range(above.shape[0] - 1, -1, -1):
                total = above[s, ...] if s == above.shape[0] - 1 else above[s, ...] + \
                    self.U[k].T @ vk[s + 1, ...]
                vk[s, ...] = slope[s, ...] * total
            v[k + 1] = vk
            above = backend.over_time(self.W[k].T, vk)
        v[0] = above
        return v

    def gradients(self, trace: Trace, v: Sequence[Any]) -> RNNGradients:
        """``dW``, ``dU``, ``db`` summed over time and samples, and ``dx = v[0]``."""
        if len(v) != self.depth + 1:
            raise ValueError(f"v has {len(v)} entries, expected {self.depth + 1} (v[0..l])")
        dW, dU, db = [], [], []
        for k in range(self.depth):
            vk, zin, zk = v[k + 1], trace.z[k], trace.z[k + 1]
            if _by_steps(self.W[k], vk):  # read three times: a layer of a time-major
                vk = backend.contiguous(vk)  # solution, once in C order (H 20, r 16: 32 -> 22 ms)
            dW.append(_outer_over_steps(self.W[k], vk, zin))
            dU.append(_outer_over_steps(self.U[k], vk[1:, ...], zk[:-1, ...]))
            db.append(_summed_over_steps(vk))
        return RNNGradients(tuple(dW), tuple(dU), tuple(db), v[0])

    def state_shapes(self, xs: Any) -> tuple[list, list]:
        """Shapes of ``z[0..l]`` and ``y[0..l-1]``, each ``(tau, h[, r])``, of a pass of ``xs``."""
        z = [(xs.shape[0], n) + xs.shape[2:] for n in self.sizes]
        return z, z[1:]

    def trace_from_states(self, xs: Any, z: Sequence[Any] | None) -> Trace:
        """The trace whose ``y[k][s] = W z[k][s] + U z[k+1][s-1] + b`` comes from states ``z``.

        All layers and time steps at once; ``z = None`` means zeros.
        """
        xp = self.backend.xp
        xs = self.check_input(xs)
        tau, batch = xs.shape[0], xs.shape[2:]
        z = [xs] + (list(z[1:]) if z is not None else
                    [xp.zeros((tau, h) + tuple(batch), dtype=self.dtype, device=backend.device(xs))
                     for h in self.sizes[1:]])
        y = []
        for k, (Wk, Uk, bk) in enumerate(zip(self.W, self.U, self.b)):
            yk = backend.over_time(Wk, z[k])  # new: the steps' U z[s-1] added in place
            yk[1:, ...] += backend.over_time(Uk, z[k + 1][:-1, ...])  # (step 0 reads zeros)
            yk += bk[:, None] if batch else bk
            y.append(yk)
        return Trace(x=xs, y=tuple(y), z=tuple([xs] + list(z[1:])))

    def unstack(self, system: Any, x: Any) -> list[Any]:
        """Per-layer arrays (``v`` or ``z``, each ``(tau, h, [r])``) of a time-major solution.

        Views of ``x`` seen as ``(tau, sum h)``: no per-block work.
        """
        sizes = self.sizes
        X = self.backend.xp.reshape(x, (x.shape[0] // sum(sizes), sum(sizes)) + tuple(x.shape[1:]))
        starts = [sum(sizes[:k]) for k in range(len(sizes))]
        return [X[:, o: o + n, ...] for o, n in zip(starts, sizes)]


def _summed_over_steps(V: Any) -> Any:
    """``V`` ``(tau, h[, r])`` summed over steps, then samples (steps first: 2x faster)."""
    xp = backend.namespace(V)
    total = xp.sum(V, axis=0)
    return total if total.ndim == 1 else xp.sum(total, axis=1)


def _outer_over_steps(M: Any, V: Any, Z: Any) -> Any:
    """``sum_s V[s] Z[s]^T`` over steps (and samples), on the pattern of ``M`` if it is sparse.

    ``V``, ``Z``: ``(tau, h[, r])``. Laid side by side as columns (one GEMM after
    both stacks are copied), or, with 4 or more samples and a dense ``M``, each
    step's ``(h, r) (r, h')`` product, batched and summed a chunk of steps at a time
    (about 1M entries), which copies nothing but writes ``h h'`` entries a step.
    Measured, 10000 steps, one thread: h 20, r 16: 16 against 27 ms; h 32, r 8: 17
    against 38; h 64, r 4: 44 against 35; h 8, r 1: 13 against 0.7 (hence ``r``
    at least 4 and ``16 r > h``).
    """
    if not _by_steps(M, V):
        return backend.outer_on_pattern(M, _steps_as_columns(V), _steps_as_columns(Z))
    xp = backend.namespace(V)
    chunk = max(1, 2**20 // (V.shape[1] * Z.shape[1]))
    total = xp.zeros((V.shape[1], Z.shape[1]), dtype=V.dtype, device=backend.device(V))
    tau = V.shape[0]
    for start in range(0, tau, chunk):
        steps = slice(start, min(start + chunk, tau))  # in bounds: the standard's slices
        part = V[steps, ...] @ xp.permute_dims(Z[steps, ...], (0, 2, 1))
        total += xp.sum(part, axis=0)
    return total


def _by_steps(M: Any, V: Any) -> bool:
    """Whether :func:`_outer_over_steps` takes per-step products (else steps as columns)."""
    return V.ndim == 3 and V.shape[2] >= 4 and 16 * V.shape[2] > V.shape[1] and \
        not backend.is_sparse(M)


def _steps_as_columns(A: Any) -> Any:
    """``(tau, h[, r])`` as ``(h, tau r)``: every step and sample a column (``tau`` may be 0).

    Then ``sum_s V[s] Z[s]^T`` over steps and samples is one outer product of columns.
    """
    xp = backend.namespace(A)
    h = A.shape[1]
    return xp.reshape(xp.moveaxis(A, 1, 0), (h, math.prod(A.shape) // h))
