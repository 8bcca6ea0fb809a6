"""The baselines every benchmark measures propop against: the strongest code users write.

- **The tight NumPy loop** (:class:`TightMLP`, :class:`TightRNN`,
  :class:`TightRNNForward`): every array preallocated once, the transposed
  weights made once outside the timing (a training loop would keep them),
  ``np.dot(..., out=)`` into those arrays, the slopes ``f'(y)`` computed once for
  all layers, the gradients written into preallocated stacks. Nothing is
  recomputed or reallocated per call. With ``blas=True`` (:class:`TightMLP`,
  :class:`TightRNN`) each product calls BLAS through SciPy instead, adding into its
  output where the loop adds (``y = b`` first, then ``y += W z`` in one call), as
  propop's sequential loops do (:func:`propop.backend.matmul_writer`): the loop
  as one would write it knowing that ``np.dot`` costs three times BLAS's own call
  on small blocks.
- **PyTorch written idiomatically** (:func:`torch_mlp`, :func:`torch_rnn`): an
  ``nn.Sequential`` of ``nn.Linear`` and ``nn.Tanh`` with samples as rows, one
  parameter tensor per layer; ``nn.RNN``; ``loss.backward()``.
- **JAX under** ``jit`` (:func:`jax_mlp_grad`, :func:`jax_rnn_grad`): ``jax.grad``
  of a ``lax.scan`` forward; and the BPPSA backward (Wang et al., 2020) and DEER
  (Lim et al., 2024) by ``lax.associative_scan`` over affine maps.

All compute the same job in float64: the forward pass, the backward pass and the
gradients of ``E = 0.5 ||z - t||^2`` summed over samples (and time steps), with the
tanh activation; :mod:`benchmarks.peers` checks every contender's gradients against
the tight loop's. Thread counts are set for every library alike
(:mod:`benchmarks`: one thread unless the environment says otherwise).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from propop.backend import matmul_writer
from propop.networks.gated import KERNEL_STEPS


class TightMLP:
    """The tanh MLP's whole job, ``__call__(x, t) -> (dW, db, dx)``, in preallocated arrays.

    ``W`` and ``b`` are one array per layer (as a network keeps them); ``x`` and ``t``
    are ``(n, r)`` with samples as columns, of the shape given here. Where all
    widths are equal the states and errors live in two stacks, so that the
    gradients of all layers are one batched product after the backward loop
    (fewer NumPy calls per layer than any per-layer form).
    """

    def __init__(self, W: Sequence[np.ndarray], b: Sequence[np.ndarray], r: int,
                 blas: bool = False) -> None:
        self.W = [np.ascontiguousarray(Wk) for Wk in W]
        self.WT = [np.ascontiguousarray(Wk.T) for Wk in W]  # made once, kept
        self.b = [bk[:, None].copy() for bk in b]
        self.blas = blas
        # the products' writers, made once: y += W z, v = W^T v
        self.adds = [matmul_writer(Wk, plain=True, accumulate=True) for Wk in self.W]
        self.backs = [matmul_writer(WTk, plain=True) for WTk in self.WT]
        sizes = [W[0].shape[1]] + [Wk.shape[0] for Wk in W]
        self.stacked = len(set(sizes)) == 1
        self.B = np.stack(self.b) if self.stacked else None  # the biases' columns, stacked
        if self.stacked:  # views of two stacks, and the slopes as one array
            self.Z, self.V = (np.empty((len(sizes), sizes[0], r)) for _ in range(2))
            self.z, self.v = list(self.Z), list(self.V)
            self.S = np.empty((len(W), sizes[0], r))
            self.slope = list(self.S)
            self.dW, self.db = np.empty((len(W), sizes[0], sizes[0])), np.empty((len(W),
                                                                                  sizes[0]))
        else:
            self.z = [np.empty((n, r)) for n in sizes]
            self.slope = [np.empty((n, r)) for n in sizes[1:]]
            self.v = [np.empty((n, r)) for n in sizes]
            self.dW = [np.empty_like(Wk) for Wk in W]
            self.db = [np.empty(Wk.shape[0]) for Wk in W]

    def forward(self, x: np.ndarray) -> list:
        """The forward pass alone, ``z[0..l]`` in this object's arrays.

        The sequential part of the job, which every method that solves only the
        backward system runs as well: the floor of its time.
        """
        z = self.z
        z[0][...] = x
        if self.blas:
            self._forward_by_blas()
        else:
            for k, (Wk, bk) in enumerate(zip(self.W, self.b)):  # z_(k+1) = tanh(W z + b)
                np.dot(Wk, z[k], out=z[k + 1])
                z[k + 1] += bk
                np.tanh(z[k + 1], out=z[k + 1])
        return z

    def __call__(self, x: np.ndarray, t: np.ndarray) -> tuple[Any, Any, np.ndarray]:
        """``(dW, db, dx)``, in this object's arrays (overwritten by the next call)."""
        z, v, slope = self.forward(x), self.v, self.slope
        if self.stacked:  # f'(y) = 1 - z^2, once for all layers
            np.multiply(self.Z[1:], self.Z[1:], out=self.S)
            np.subtract(1.0, self.S, out=self.S)
        else:
            for k, s in enumerate(slope):
                np.multiply(z[k + 1], z[k + 1], out=s)
                np.subtract(1.0, s, out=s)
        depth = len(self.W)
        np.subtract(z[depth], t, out=v[depth])
        v[depth] *= slope[depth - 1]
        for k in range(depth - 1, -1, -1):  # backward: v_k = f'_(k-1) (W_k^T v_(k+1))
            if not self.stacked:
                np.dot(v[k + 1], z[k].T, out=self.dW[k])
                np.sum(v[k + 1], axis=1, out=self.db[k])
            if self.blas:
                self.backs[k](v[k + 1], out=v[k])
            else:
                np.dot(self.WT[k], v[k + 1], out=v[k])
            if k > 0:
                v[k] *= slope[k - 1]
        if self.stacked:  # every layer's gradients in one batched product
            if self.V.shape[2] == 1:  # outer products: einsum 0.6-0.85x broadcasting's
                # time at widths 8 to 128 (alike at l = 1024, n = 64; one thread)
                np.einsum("ki,kj->kij", self.V[1:, :, 0], self.Z[:-1, :, 0], out=self.dW)
            else:
                np.matmul(self.V[1:], self.Z[:-1].transpose(0, 2, 1), out=self.dW)
            np.sum(self.V[1:], axis=2, out=self.db)
        return self.dW, self.db, v[0]

    def _forward_by_blas(self) -> None:
        """``z_(k+1) = b_k`` (all layers in one copy where stacked), then ``W_k z_k`` added."""
        z = self.z
        if self.stacked:
            np.copyto(self.Z[1:], self.B)
        else:
            for zk, bk in zip(z[1:], self.b):
                zk[...] = bk
        for k, add in enumerate(self.adds):
            add(z[k], out=z[k + 1])
            np.tanh(z[k + 1], out=z[k + 1])


class TightBackward:
    """The backward pass alone, given the slopes: ``v_k = f'_(k-1) (W_k^T v_(k+1))``.

    ``__call__(slopes, eps) -> v[0..l]`` into preallocated blocks, the transposed
    weights made once (contiguous dense, or CSR); what a backward system's solve
    is compared with when both get ``f'(y)`` ready.
    """

    def __init__(self, W: Sequence[Any], r: int) -> None:
        self.WT = [Wk.T.tocsr() if hasattr(Wk, "tocsr") else np.ascontiguousarray(Wk.T)
                   for Wk in W]
        sizes = [W[0].shape[1]] + [Wk.shape[0] for Wk in W]
        self.v = [np.empty((n, r)) for n in sizes]

    def __call__(self, slopes: Sequence[np.ndarray], eps: np.ndarray) -> list:
        """``v[0..l]``, in this object's arrays."""
        v = self.v
        np.multiply(slopes[-1], eps, out=v[-1])
        for k in range(len(self.WT) - 1, -1, -1):
            if hasattr(self.WT[k], "tocsr"):
                v[k][...] = self.WT[k] @ v[k + 1]
            else:
                np.dot(self.WT[k], v[k + 1], out=v[k])
            if k > 0:
                v[k] *= slopes[k - 1]
        return v


class TightRNN:
    """A one-layer tanh RNN's backpropagation, ``__call__(xs, t) -> (dW, dU, db, dx)``.

    ``xs`` and ``t`` are ``(tau, h, r)`` (``xs`` ``(tau, m, r)``). The input
    projections of all steps are one batched product, and so is ``dx = W^T v``, the
    input gradient that propop's solution holds too (as the MLP loop's ``dx``); the
    recurrence is the sequential part, written in place.
    """

    def __init__(self, W: np.ndarray, U: np.ndarray, b: np.ndarray, tau: int, r: int,
                 blas: bool = False) -> None:
        h = U.shape[0]
        self.blas = blas  # z_(s+1) += U z_s and v_s += U^T v_(s+1), one BLAS call each
        self.add_U, self.add_UT = (matmul_writer(np.ascontiguousarray(M), plain=True,
                                                 accumulate=True) for M in (U, U.T))
        self.W, self.U, self.UT = W, U, np.ascontiguousarray(U.T)
        self.b = b[:, None].copy()
        self.inputs = np.empty((tau, h, r))
        self.z = np.zeros((tau + 1, h, r))  # z[0] = 0, z[s + 1] the state at step s
        self.slope = np.empty((tau, h, r))
        self.v = np.empty((tau + 1, h, r))
        self.v[tau] = 0
        self.carry = np.empty((h, r))
        self.WT, self.dx = np.ascontiguousarray(W.T), np.empty((tau, W.shape[1], r))
        self.products = {m: np.empty((max(1, min(tau, 2**20 // (h * m))), h, m))
                         for m in {h, W.shape[1]}}  # per-step products, by width read

    def forward(self, xs: np.ndarray) -> np.ndarray:
        """The forward pass alone, the states ``z[1..tau]`` in this object's array.

        The sequential part of the job, which every method that solves only the
        backward system runs as well: the floor of its time.
        """
        z = self.z
        np.matmul(self.W, xs, out=self.inputs)  # W x_s for every step at once
        self.inputs += self.b
        if self.blas:
            self._forward_by_blas()
        else:
            for s in range(xs.shape[0]):
                np.dot(self.U, z[s], out=z[s + 1])
                z[s + 1] += self.inputs[s]
                np.tanh(z[s + 1], out=z[s + 1])
        return z[1:]

    def __call__(self, xs: np.ndarray, t: np.ndarray) -> tuple:
        """``(dW, dU, db, dx)``; ``dx`` in this object's array."""
        z, v, tau = self.z, self.v, xs.shape[0]
        self.forward(xs)
        np.multiply(z[1:], z[1:], out=self.slope)
        np.subtract(1.0, self.slope, out=self.slope)
        np.subtract(z[1:], t, out=v[:tau])  # dE/dz, then the recurrence adds U^T v
        if self.blas:
            self._backward_by_blas()
        else:
            for s in range(tau - 1, -1, -1):
                np.dot(self.UT, v[s + 1], out=self.carry)
                v[s] += self.carry
                v[s] *= self.slope[s]
        np.matmul(self.WT, v[:tau], out=self.dx)
        return (self._summed_products(v[:tau], xs), self._summed_products(v[1:tau], z[1:tau]),
                v[:tau].sum(axis=0).sum(axis=1), self.dx)

    def _steps(self, a: np.ndarray) -> np.ndarray:
        """``a``'s steps as BLAS takes them: vectors (``gemv``) for one sample, else blocks."""
        return a[..., 0] if a.shape[2] == 1 else a

    def _forward_by_blas(self) -> None:
        """``z_(s+1) = W x_s + b``, then ``U z_s`` added by one BLAS call a step."""
        z = self._steps(self.z)
        z[1:] = self._steps(self.inputs)
        for s in range(len(z) - 1):
            self.add_U(z[s], out=z[s + 1])
            np.tanh(z[s + 1], out=z[s + 1])

    def _backward_by_blas(self) -> None:
        """``v_s = f'_s (dE/dz_s + U^T v_(s+1))``, the product added by one BLAS call."""
        v, slope = self._steps(self.v), self._steps(self.slope)
        for s in range(len(slope) - 1, -1, -1):
            self.add_UT(v[s + 1], out=v[s])
            v[s] *= slope[s]

    def _summed_products(self, V: np.ndarray, Z: np.ndarray) -> np.ndarray:
        """``sum_s V[s] Z[s]^T``, the faster of two forms for the shape.

        The steps side by side as columns (both stacks copied, one GEMM), or with 4
        or more samples (``16 r > h``) each step's product, a chunk of steps at a
        time, summed (H 20, 16 samples, 10000 steps: 7 against 31 ms).
        """
        h, r = V.shape[1], V.shape[2]
        if r < 4 or 16 * r <= h:
            return _steps_as_columns(V) @ _steps_as_columns(Z).T
        products = self.products[Z.shape[1]]
        total, chunk = np.zeros((h, Z.shape[1])), products.shape[0]
        for start in range(0, V.shape[0], chunk):
            stop = min(start + chunk, V.shape[0])
            part = products[: stop - start]
            np.matmul(V[start:stop], Z[start:stop].transpose(0, 2, 1), out=part)
            total += part.sum(axis=0)
        return total


class TightRNNForward:
    """The sequential forward pass of a tanh RNN over one sequence ``xs`` ``(tau, h)``."""

    def __init__(self, W: np.ndarray, U: np.ndarray, b: np.ndarray, tau: int) -> None:
        self.W, self.U, self.b = W, U, b
        self.inputs = np.empty((tau, U.shape[0]))
        self.states = np.empty((tau, U.shape[0]))

    def __call__(self, xs: np.ndarray) -> np.ndarray:
        """The states ``(tau, h)``, in this object's array."""
        np.dot(xs, self.W.T, out=self.inputs)
        self.inputs += self.b
        h, out = np.zeros(self.U.shape[0]), self.states
        for s in range(xs.shape[0]):
            np.dot(self.U, h, out=out[s])
            out[s] += self.inputs[s]
            np.tanh(out[s], out=out[s])
            h = out[s]
        return out


def _steps_as_columns(a: np.ndarray) -> np.ndarray:
    """``(tau, h, r)`` as ``(h, tau r)``: every step and sample a column."""
    return a.transpose(1, 0, 2).reshape(a.shape[1], -1)


# -- PyTorch, as its users write it ----------------------------------------------------------
def torch_mlp(W: Sequence[np.ndarray], b: Sequence[np.ndarray], dtype: str = "float64",
              device: str = "cpu") -> Callable:
    """``nn.Sequential(nn.Linear, nn.Tanh, ...)``; returns ``job(X, T) -> dW`` (rows samples).

    On PyTorch device ``device`` in ``dtype``.
    """
    import torch
    from torch import nn

    layers = []
    for Wk, bk in zip(W, b):
        linear = nn.Linear(Wk.shape[1], Wk.shape[0], dtype=getattr(torch, dtype), device=device)
        with torch.no_grad():
            linear.weight.copy_(torch.tensor(Wk, device=device))
            linear.bias.copy_(torch.tensor(bk, device=device))
        layers += [linear, nn.Tanh()]
    model = nn.Sequential(*layers)

    def job(X: Any, T: Any) -> Any:
        model.zero_grad(set_to_none=True)
        loss = 0.5 * ((model(X) - T) ** 2).sum()
        loss.backward()
        return [m.weight.grad for m in model if isinstance(m, nn.Linear)]

    return job


def torch_rnn(W: np.ndarray, U: np.ndarray, b: np.ndarray, dtype: str = "float64",
              device: str = "cpu") -> Callable:
    """Autograd through ``torch.nn.RNN``; returns ``job(X, T) -> dW`` (batch second).

    On PyTorch device ``device`` in ``dtype``; sequences longer than cuDNN takes
    (pytorch/pytorch#133751) in consecutive calls from the last state, as a user
    must write it on a GPU (autograd through all of them: the same gradient).
    """
    import torch

    module = torch.nn.RNN(W.shape[1], U.shape[0], nonlinearity="tanh",
                          dtype=getattr(torch, dtype), device=device)
    with torch.no_grad():
        module.weight_ih_l0.copy_(torch.tensor(W, device=device))
        module.weight_hh_l0.copy_(torch.tensor(U, device=device))
        module.bias_ih_l0.copy_(torch.tensor(b, device=device))
        module.bias_hh_l0.zero_()

    def job(X: Any, T: Any) -> Any:
        module.zero_grad(set_to_none=True)
        outs, h = [], None
        for start in range(0, X.shape[0], KERNEL_STEPS):  # what cuDNN takes in one call
            out, h = module(X[start: start + KERNEL_STEPS], h)
            outs.append(out)
        (0.5 * ((torch.cat(outs) - T) ** 2).sum()).backward()
        return module.weight_ih_l0.grad

    return job


# -- JAX under jit ---------------------------------------------------------------------------
def jax_modules() -> tuple:
    """``(jax, jax.numpy)`` in float64."""
    import jax
    import jax.numpy as jnp

    jax.config.update("jax_enable_x64", True)
    return jax, jnp


def affine_scan(A: Any, c: Any, reverse: bool = False) -> Any:
    """``x_k = A_k x_(k-1) + c_k`` (``x_k = A_k x_(k+1) + c_k`` if ``reverse``) for all k.

    ``lax.associative_scan`` over the affine maps ``x -> A x + c``: ``O(log m)``
    depth, the BPPSA backward and the DEER forward. ``A`` is ``(m, ..., n, n)``.
    """
    jax, _ = jax_modules()

    def compose(first: tuple, second: tuple) -> tuple:
        (A, c), (B, d) = first, second  # x -> B (A x + c) + d
        return B @ A, (B @ c[..., None])[..., 0] + d

    return jax.lax.associative_scan(compose, (A, c), reverse=reverse)[1]


def jax_mlp_forward(W: Any, b: Any, x: Any) -> Any:
    """``z_1..z_l`` by ``lax.scan`` over the stacked layers."""
    jax, jnp = jax_modules()

    def layer(z: Any, params: tuple) -> tuple:
        out = jnp.tanh(params[0] @ z + params[1][:, None])
        return out, out

    return jax.lax.scan(layer, x, (W, b))[1]


def jax_mlp_grad() -> Callable:
    """``jit(grad)`` of the loss through the scanned MLP."""
    jax, jnp = jax_modules()

    def loss(W: Any, b: Any, x: Any, t: Any) -> Any:
        return 0.5 * jnp.sum((jax_mlp_forward(W, b, x)[-1] - t) ** 2)

    return jax.jit(jax.grad(loss, argnums=(0, 1)))


def jax_mlp_bppsa() -> Callable:
    """The BPPSA backward: ``v_k = diag(f'_(k-1)) W_k^T v_(k+1)`` by an associative scan."""
    jax, jnp = jax_modules()

    def job(W: Any, b: Any, x: Any, t: Any) -> tuple:
        z = jax_mlp_forward(W, b, x)  # (l, n, r): the outputs of layers 0..l-1
        slope = jnp.transpose(1 - z**2, (0, 2, 1))  # (l, r, n), samples leading
        # v_k = A_k v_(k+1) + c_k: A_k = diag(f'_k) W_(k+1)^T, c = f'_(l-1) (z_(l-1) - t) last
        A = slope[:-1, :, :, None] * jnp.transpose(W[1:], (0, 2, 1))[:, None]
        A = jnp.concatenate([A, jnp.zeros_like(A[:1])])  # the last map reads nothing
        c = jnp.zeros_like(slope).at[-1].set(slope[-1] * (z[-1] - t).T)
        v = jnp.transpose(affine_scan(A, c, reverse=True), (0, 2, 1))  # (l, n, r)
        inputs = jnp.concatenate([x[None], z[:-1]])
        return jnp.einsum("kir,kjr->kij", v, inputs), v.sum(axis=2)

    return jax.jit(job)


def jax_rnn_forward(W: Any, U: Any, b: Any, xs: Any) -> Any:
    """The states ``h_1..h_tau`` (``(tau, h, r)``) by ``lax.scan``."""
    jax, jnp = jax_modules()

    def step(h: Any, x: Any) -> tuple:
        out = jnp.tanh(W @ x + U @ h + b[:, None])
        return out, out

    return jax.lax.scan(step, jnp.zeros((U.shape[0], xs.shape[2]), dtype=xs.dtype), xs)[1]


def jax_rnn_grad() -> Callable:
    """``jit(grad)`` of the summed loss through the scanned RNN."""
    jax, jnp = jax_modules()

    def loss(W: Any, U: Any, b: Any, xs: Any, t: Any) -> Any:
        return 0.5 * jnp.sum((jax_rnn_forward(W, U, b, xs) - t) ** 2)

    return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))


def jax_rnn_bppsa() -> Callable:
    """BPPSA through time: ``v_s = f'_s (z_s - t_s + U^T v_(s+1))`` by an associative scan."""
    jax, jnp = jax_modules()

    def job(W: Any, U: Any, b: Any, xs: Any, t: Any) -> tuple:
        z = jax_rnn_forward(W, U, b, xs)  # (tau, h, r)
        slope = jnp.transpose(1 - z**2, (0, 2, 1))  # (tau, r, h)
        A = slope[..., None] * U.T  # v_s = diag(f'_s) U^T v_(s+1) + c_s
        v = affine_scan(A, slope * jnp.transpose(z - t, (0, 2, 1)), reverse=True)
        previous = jnp.concatenate([jnp.zeros_like(z[:1]), z[:-1]])
        return (jnp.einsum("sri,sjr->ij", v, xs), jnp.einsum("sri,sjr->ij", v, previous),
                v.sum(axis=(0, 1)))

    return jax.jit(job)


def jax_deer(iterations: int) -> Callable:
    """DEER: ``iterations`` Newton steps, each linearised recurrence by an associative scan."""
    jax, jnp = jax_modules()

    def job(W: Any, U: Any, b: Any, xs: Any) -> Any:
        inputs = xs @ W.T + b  # (tau, h)
        h = jnp.zeros_like(inputs)
        for _ in range(iterations):
            previous = jnp.concatenate([jnp.zeros_like(h[:1]), h[:-1]])
            value = jnp.tanh(inputs + previous @ U.T)
            J = (1 - value**2)[:, :, None] * U  # d h_s / d h_(s-1)
            c = value - (J @ previous[..., None])[..., 0]
            h = affine_scan(J, c)
        return h

    return jax.jit(job)
