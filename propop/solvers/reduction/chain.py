"""A block bi-diagonal system as a chain ``x_k = diag(L_k) C_k x_{k-1} + G_k``, ``x_0 = G_0``.

The common form of cyclic reduction and parallel cyclic reduction (paper section
3.1). A lower system reads this way directly; an upper one with its blocks in
reverse order. Each coupling is kept factored as a left row scaling ``L_k`` and a
core ``C_k``: at the start ``L_k = s_k / d_k`` (per sample) and ``C_k`` the shared
weight matrix, so the first reduction never materialises per-sample blocks.

Blocks of unequal widths are zero-padded to the widest, which keeps every level a
single batched ``matmul`` over stacked blocks and is exact. Stacks:

- ``L``: ``(m, bl, n)``, ``bl`` is 1 (shared) or ``r``; ``None`` where every scaling
  is one (a chain given by its couplings' stack: a recurrence's Jacobians);
- ``C``: ``(m - 1, b, n, n)``, the cores of positions ``1..m-1`` (position 0 has
  none), ``b`` is 1 (shared) or ``r``; a stacked chain's are its couplings
  themselves, a view;
- ``G``: ``(m, r, n)``.

Sparse couplings are densified here: no sparse cyclic reduction is implemented.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ... import backend

__all__ = ["Chain", "product", "apply", "Counter", "chain_rows", "in_system_order"]


@dataclass
class Counter:
    """Work of a reduction counted as it runs, and memory as :mod:`.footprint` walks it."""

    flops: int = 0
    peak_bytes: int = 0
    live_bytes: int = 0

    def hold(self, nbytes: int) -> int:
        """Record ``nbytes`` more alive now; returns ``nbytes``."""
        self.live_bytes += int(nbytes)
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        return int(nbytes)

    def release(self, nbytes: int) -> None:
        """Record ``nbytes`` freed."""
        self.live_bytes -= int(nbytes)

    def passing(self, nbytes: int) -> None:
        """Record a temporary of ``nbytes``: held, then freed."""
        self.release(self.hold(nbytes))


@dataclass
class Chain:
    """Stacks ``L``, ``C``, ``G`` of a chain in padded form (see the module docstring)."""

    L: Any
    C: Any
    G: Any
    order: Any  # chain position -> block index of the system (a range for a system's chain)
    sizes: tuple  # block sizes in chain order

    @classmethod
    def of(cls, system: Any, shared_diagonal: str | None = None, diagonal: bool = False
           ) -> Chain:
        """The padded chain of a :class:`~propop.TriangularSystem` (any form, batch or not).

        ``shared_diagonal="mean"`` replaces every per-sample scaling by its batch
        mean: an approximation that makes all cores shared. Equal block sizes
        take a stacked path with no per-block Python work. ``diagonal``: the
        couplings are the identity, and the cores are kept as their diagonals,
        ``C`` ``(m - 1, 1, n)`` of ones (for :class:`~.odd_even.DiagonalKernels`).
        """
        stacked = _stacked(system, shared_diagonal, diagonal)
        if stacked is not None:
            return stacked
        if diagonal:
            raise ValueError("diagonal cores need a chain given by its stacks")
        xp = system.backend.xp
        rows = chain_rows(system, shared_diagonal)
        n, m, dtype = system.width, len(rows), system.dtype
        r, bl = rows[0].G.shape[1], max(row.L.shape[1] for row in rows)
        device = backend.device(rows[0].G)
        L = xp.zeros((m, bl, n), dtype=dtype, device=device)
        C = xp.zeros((m, 1, n, n), dtype=dtype, device=device)  # row 0 (no core) dropped
        G = xp.zeros((m, r, n), dtype=dtype, device=device)
        for i, row in enumerate(rows):
            size = row.G.shape[0]
            G[i, :, :size] = row.G.T
            L[i, :, :size] = row.L.T
            if row.M is not None:
                M = backend.dense(row.M)
                C[i, 0, : M.shape[0], : M.shape[1]] = M
        return cls(L, C[1:, ...], G, system.layout.order(),
                   tuple(system.sizes[row.block] for row in rows))

    def rhs_of(self, system: Any) -> Any:
        """``G`` for ``system``'s right-hand side (same matrix): ``(m, r, n)``, chain order.

        Each block divided by its diagonal (the paper form's), zero-padded.
        """
        xp, n = system.backend.xp, self.C.shape[2]
        rhs = system.rhs if system.nrhs is not None else system.rhs[:, None]
        if len(set(system.sizes)) == 1:
            G = _ordered(xp, xp.reshape(rhs, (len(self.order), n, -1)), self.order)
            if system.form == "paper" and not system.unscaled_stack:
                diagonal = system.blocks.diagonal
                G = G / _stack_columns(xp, [diagonal[k] for k in self.order], n, G.dtype)
            return xp.permute_dims(G, (0, 2, 1))
        B = system.blocks
        G = xp.zeros((len(self.order), rhs.shape[1], n), dtype=rhs.dtype,
                     device=backend.device(rhs))
        blocks = system.split(rhs)
        for i, k in enumerate(self.order):
            d = B.diagonal[k]
            G[i, :, : self.sizes[i]] = (blocks[k] if d is None else blocks[k] / _columns(d)).T
        return G

    def solution(self, X: Any, system: Any) -> Any:
        """Scatter chain-ordered ``X`` of shape ``(m, r, n)`` back into ``system.rhs``'s shape."""
        xp = backend.namespace(X)
        if len(set(self.sizes)) == 1:  # equal widths: one permutation, no padding
            ordered = _ordered(xp, X, _inverse(self.order))  # system order from chain's
            x = xp.reshape(xp.permute_dims(ordered, (0, 2, 1)), (-1, X.shape[1]))
        else:
            x = in_system_order(self.order, [X[i, :, :n].T for i, n in enumerate(self.sizes)])
        return x[:, 0] if system.nrhs is None else x


@dataclass(frozen=True)
class Row:
    """One chain position: ``x = diag(L) M x_prev + G`` with ``L`` ``(n, bl)``, ``G`` ``(n, r)``."""

    block: int
    L: Any
    M: Any
    G: Any


def _ordered(xp: Any, A: Any, order: Any) -> Any:
    """``A[order]`` along the first axis: itself, flipped (a range either way), or gathered."""
    if isinstance(order, range) and len(order) == A.shape[0]:
        if order.step == 1 and order.start == 0:
            return A
        if order.step == -1 and order.stop == -1:
            return xp.flip(A, axis=0)
    return backend.take_rows(A, backend.like(np.asarray(order), A))


def _inverse(order: Any) -> Any:
    """The permutation that undoes ``order`` (a full range, forwards or back, undoes itself)."""
    if isinstance(order, range) and (order.step, order.start if order.step == 1
                                     else order.stop) in ((1, 0), (-1, -1)):
        return order
    return np.argsort(order)


def in_system_order(order: list, blocks: list) -> Any:
    """Concatenate chain-ordered ``(n_k, r)`` blocks in the system's block order."""
    parts = [None] * len(order)
    for block, values in zip(order, blocks):
        parts[block] = values
    return backend.namespace(blocks[0]).concat(parts)


def chain_rows(system: Any, shared_diagonal: str | None = None) -> list[Row]:
    """The rows of a system in chain order, divided by their diagonals.

    ``L = s / d`` is per sample (``bl = r``) only if some scaling is and
    ``shared_diagonal`` is ``None``; with ``"mean"`` it is the batch mean.
    """
    xp = system.backend.xp
    B = system.blocks
    rhs = system.split(system.rhs if system.nrhs is not None else system.rhs[:, None])
    r = rhs[0].shape[1]
    scales, couplings = B.scale, B.coupling  # each a tuple made per access: once
    per_sample = any(a is not None and a.ndim == 2 and a.shape[1] > 1
                     for a in scales + B.diagonal)
    bl = r if per_sample and shared_diagonal is None else 1
    rows = []
    for k in B.order():
        d = 1 if B.diagonal[k] is None else _columns(B.diagonal[k])
        j = B.incoming(k)
        s = 1 if j is None or scales[j] is None else _columns(scales[j])
        ratio = s / d  # a host number where both are one: the system's dtype, not Python's
        ratio = backend.like(ratio, rhs[k]) if not hasattr(ratio, "shape") else ratio
        scale = xp.broadcast_to(xp.astype(ratio, system.dtype), (B.sizes[k], r))
        L = xp.mean(scale, axis=1, keepdims=True) if bl == 1 else scale
        rows.append(Row(k, L, None if j is None else couplings[j], rhs[k] / d))
    return rows


def _stack_columns(xp: Any, arrays: list, n: int, dtype: Any) -> Any:
    """Stack scalings (``None`` is one) into ``(m, n, c)``; ``None`` if shapes differ."""
    shapes = {a.shape for a in arrays if a is not None}
    if len(shapes) > 1:
        return None
    shape = shapes.pop() if shapes else (n,)
    device = next((backend.device(a) for a in arrays if a is not None), None)
    if not arrays:  # a chain of one block has no couplings
        return xp.ones((0,) + shape + ((1,) if len(shape) == 1 else ()), dtype=dtype)
    ones = xp.ones(shape, dtype=dtype, device=device)
    flat = xp.concat([ones if a is None else a for a in arrays])  # one copy, no per-block
    out = backend.astype(xp.reshape(flat, (len(arrays),) + shape), dtype)
    return out[:, :, None] if out.ndim == 2 else out


def _stacked(system: Any, shared_diagonal: str | None, diagonal: bool = False
             ) -> Chain | None:
    """The chain of an equal-width system by whole-array operations (``None`` otherwise)."""
    if len(set(system.sizes)) != 1:
        return None
    xp, dtype = system.backend.xp, system.dtype
    m, n = system.nblocks, system.sizes[0]
    order = system.layout.order()
    rhs = system.rhs if system.nrhs is not None else system.rhs[:, None]
    G = _ordered(xp, xp.reshape(rhs, (m, n, -1)), order)
    couplings = list(range(m - 1)) if system.lower else list(range(m - 2, -1, -1))
    unscaled = system.unscaled_stack  # the couplings are the stack itself: L is None
    S = None if unscaled else _coupling_scales(system, couplings)
    if system.form == "paper" and not unscaled:  # divided by the diagonal
        D = _stack_columns(xp, [system.blocks.diagonal[k] for k in order], n, dtype)
        if D is None or S is None:
            return None
        G, S = G / D, S / D[1:, ...]
    if S is None and not unscaled:  # ragged scalings
        return None
    if S is not None and shared_diagonal is not None:
        S = xp.mean(S, axis=2, keepdims=True)
    L = None
    if S is not None:  # samples first; row 0 (no coupling) one
        L = xp.ones((m, S.shape[2], n), dtype=dtype, device=backend.device(S))
        L[1:, ...] = xp.permute_dims(S, (0, 2, 1))
    if diagonal:  # identity couplings: the diagonals of their cores, ones
        C = xp.ones((m - 1, 1, n), dtype=dtype, device=backend.device(G))
    elif system.coupling_stack is not None:  # the network's stack itself: no copy
        stack = backend.astype(system.coupling_stack, dtype)
        C = stack if system.lower else xp.flip(stack, axis=0)
        if L is not None and L.shape[1] > 1 and not system.per_sample_couplings:  # per-sample
            C = backend.contiguous(C)  # products run 1.2x faster on C-ordered cores than on W^T's
        C = C if system.per_sample_couplings else C[:, None, ...]
    else:
        matrices = system.blocks.coupling
        C = _stack_matrices(system.backend, [matrices[j] for j in couplings], n,
                            dtype, backend.device(system.rhs))[:, None, ...]
    return Chain(L, C, xp.permute_dims(G, (0, 2, 1)), order, system.sizes)


def _coupling_scales(system: Any, couplings: list) -> Any:
    """The row scalings of the couplings in chain order, ``(m - 1, n, c)``; ``None`` if ragged.

    A system given by its :attr:`~propop.TriangularSystem.scale_stack` (rows
    ``1..m-1``, row 0 unscaled) is read without a per-block gather: in the
    scaled form a lower chain's coupling ``j`` sits in row ``j + 1``, an upper
    chain's in row ``j``.
    """
    xp = system.backend.xp
    if system.scale_stack is None or system.form != "scaled":
        scales = system.blocks.scale  # a tuple made per access: once
        return _stack_columns(xp, [scales[j] for j in couplings], system.sizes[0],
                              system.dtype)
    S = system._coupling_scales  # in coupling order: reversed for an upper chain
    S = S if system.lower else xp.flip(S, axis=0)
    return S[:, :, None] if S.ndim == 2 else S


def _stack_matrices(be: backend.Backend, matrices: list, n: int, dtype: Any,
                    device: Any) -> Any:
    """Dense ``(m, n, n)`` stack of ``n x n`` matrices on ``device``, sparse ones scattered."""
    xp = be.xp
    if not matrices:  # a chain of one block
        return xp.zeros((0, n, n), dtype=dtype, device=device)
    if not all(be.sparse.issparse(M) for M in matrices):  # dense, or dense and sparse mixed
        return backend.astype(xp.stack([backend.dense(M) for M in matrices]), dtype)
    # canonical CSR (TriangularSystem makes them so): no duplicates, one scatter
    counts = xp.reshape(xp.diff(xp.reshape(xp.concat([M.indptr for M in matrices]),
                                           (-1, n + 1)), axis=1), (-1,))
    rows = xp.repeat(xp.tile(xp.arange(n, device=device), (len(matrices),)), counts)
    block = xp.repeat(xp.arange(len(matrices), device=device),
                      xp.sum(xp.reshape(counts, (-1, n)), axis=1))
    out = xp.zeros((len(matrices), n, n), dtype=dtype, device=device)
    out[block, rows, xp.concat([M.indices for M in matrices])] = xp.concat(
        [M.data for M in matrices])
    return out


def _columns(a: Any) -> Any:
    """A scaling as ``(n, 1)`` or ``(n, r)`` columns."""
    return a[:, None] if a.ndim == 1 else a


def product(L1: Any, C1: Any, L2: Any, C2: Any, counter: Counter) -> Any:
    """The core of ``diag(L1) C1 diag(L2) C2``, i.e. ``(C1 diag(L2)) C2``, per sample.

    Its left scaling stays ``L1``. One batched product over all stacked pairs, the
    scaling ``L2`` applied a chunk of pairs at a time (:func:`~propop.backend.scaled_block_matmul`);
    ``L2 = None`` (an unscaled chain: every scaling one) multiplies by nothing.
    """
    out = backend.block_matmul(C1, C2) if L2 is None else \
        backend.scaled_block_matmul(C1, L2, C2)
    p, b, n = out.shape[:3]
    counter.flops += 2 * p * b * n**3 + (0 if L2 is None else p * b * n * n)
    return out


def apply(L: Any, C: Any, X: Any, counter: Counter, xp: Any = None) -> Any:
    """``diag(L) C X`` for stacked ``X`` of shape ``(p, r, n)`` or ``(p, r, n, c)``.

    The second form carries ``c`` columns per sample (a matrix right-hand side).
    ``xp`` is the arrays' namespace (found from ``X`` if not given; shape-only
    arrays of :mod:`.shapes` give theirs). ``L = None``: an unscaled chain, ``C X``.
    """
    p, r, n = X.shape[:3]
    columns = X.shape[3] if X.ndim == 4 else 1
    counter.flops += (2 * n * n + (0 if L is None else n)) * p * r * columns
    xp = backend.namespace(X) if xp is None else xp
    if X.ndim == 4:
        CX = backend.block_matmul(C, X)
        if L is not None:
            CX *= L[..., None]  # in place: the product is new, and scaling it is half the time
        return CX
    if n <= 2 and isinstance(X, np.ndarray):  # entry by entry (backend.block_matmul)
        CX = backend.block_matmul(C, X[..., None])[..., 0]
    elif C.shape[1] == 1 and r == 1 and hasattr(xp, "einsum"):  # einsum reads strided cores
        CX = xp.einsum("pij,pj->pi", C[:, 0, ...], X[:, 0, ...])[:, None, :]  # 3x matmul here
    elif C.shape[1] == 1:  # one shared core per block: a matrix-matrix product
        CX = xp.permute_dims(C[:, 0, ...] @ xp.permute_dims(X, (0, 2, 1)), (0, 2, 1))
    else:
        CX = (C @ X[..., None])[..., 0]
    if L is not None:
        CX *= L
    return CX
