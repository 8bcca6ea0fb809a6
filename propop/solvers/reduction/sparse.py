"""Cyclic reduction with sparse blocks: one sparse product per level, fill-in reported.

The chain ``x_k = diag(L_k) C_k x_{k-1} + G_k`` of :mod:`propop.solvers.reduction.chain`
with lists instead of padded stacks: ``C[k]`` holds one shared sparse core or one
per sample. A level multiplies the block-diagonal matrix of all left factors by
that of all right factors in one sparse product and splits the block-diagonal
result; right-hand-side updates and back-substitutions are one sparse-times-dense
product each, the same way. Assembling and splitting the block-diagonal
matrices is bookkeeping over blocks; the arithmetic of a level is one product.

Products of sparse matrices fill in. :func:`sparse_factor` hands the remaining
levels to the dense padded chain once the reduced blocks pass a density threshold;
:func:`sparse_substitute` takes each right-hand side through the levels.
SciPy only: CuPy systems take the dense path.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp

from .chain import Chain, Counter, chain_rows
from .footprint import odd_even

__all__ = ["SparseChain", "SparseLevels", "sparse_factor", "sparse_substitute",
           "block_diagonal", "nbytes"]


@dataclass
class SparseChain:
    """A chain as lists, one entry per position.

    ``L[k]`` is ``(n_k, bl)``, ``C[k]`` a list of sparse cores (empty for
    position 0), ``G[k]`` is ``(n_k, r)``.
    """

    L: list
    C: list
    G: list
    order: list
    sizes: tuple

    @classmethod
    def of(cls, system: Any, shared_diagonal: str | None = None) -> SparseChain:
        """The chain of a system whose couplings are ``scipy.sparse``."""
        rows = chain_rows(system, shared_diagonal)
        return cls([row.L for row in rows],
                   [[] if row.M is None else [sp.csr_array(row.M)] for row in rows],
                   [row.G for row in rows], [row.block for row in rows],
                   tuple(row.G.shape[0] for row in rows))

    def cores(self) -> list:
        """All cores, flattened."""
        return [c for cs in self.C for c in cs]

    def density(self) -> float:
        """Non-zeros over entries of all cores."""
        cores = self.cores()
        return sum(c.nnz for c in cores) / max(sum(c.shape[0] * c.shape[1] for c in cores), 1)

    def nnz_per_core(self) -> float:
        """Average non-zeros of one core."""
        cores = self.cores()
        return sum(c.nnz for c in cores) / max(len(cores), 1)

    def take(self, positions: Any) -> SparseChain:
        """The sub-chain at ``positions`` (cores and all)."""
        pick = list(positions)
        return SparseChain([self.L[k] for k in pick], [self.C[k] for k in pick],
                           [self.G[k] for k in pick], [self.order[k] for k in pick],
                           tuple(self.sizes[k] for k in pick))

    def to_dense(self, r: int) -> Chain:
        """The cores as padded dense stacks (``b`` per position), ``G`` zero with ``r`` columns."""
        n, m, dtype = max(self.sizes), len(self.sizes), self.L[0].dtype
        b = max(len(cs) for cs in self.C)
        L = np.zeros((m, max(x.shape[1] for x in self.L), n), dtype=dtype)
        C = np.zeros((m, b, n, n), dtype=dtype)
        G = np.zeros((m, r, n), dtype=dtype)
        for k, size in enumerate(self.sizes):
            L[k, :, :size] = self.L[k].T
            for i, core in enumerate(self.C[k]):
                C[k, i, :size, : core.shape[1]] = core.toarray()
        return Chain(L, C[1:], G, self.order, self.sizes)


def _column(a: Any, i: int) -> Any:
    return a[:, i if a.shape[1] > 1 else 0]


def _pick(cores: list, i: int) -> Any:
    return cores[i if len(cores) > 1 else 0]


def _split(matrix: Any, rows: list, cols: list) -> list:
    """The diagonal blocks of a block-diagonal matrix."""
    r0, c0 = np.cumsum([0] + rows), np.cumsum([0] + cols)
    return [matrix[r0[t]: r0[t + 1], c0[t]: c0[t + 1]] for t in range(len(rows))]


def nbytes(matrix: Any) -> int:
    """Bytes of a CSR matrix's arrays (or a dense array's)."""
    if not sp.issparse(matrix):
        return int(matrix.nbytes)
    return int(matrix.data.nbytes + matrix.indices.nbytes + matrix.indptr.nbytes)


def block_diagonal(blocks: list) -> Any:
    """The CSR block-diagonal matrix of CSR ``blocks``: their arrays concatenated, shifted.

    Written for propop: SciPy's ``block_diag`` goes through COO triplets, three
    times the memory of the result.
    """
    rows = np.cumsum([0] + [m.shape[0] for m in blocks])
    cols = np.cumsum([0] + [m.shape[1] for m in blocks])
    starts = np.cumsum([0] + [m.nnz for m in blocks])
    index = np.int32 if max(rows[-1], cols[-1], starts[-1]) < 2**31 else np.int64
    indptr = np.concatenate([(m.indptr[:-1] + s).astype(index) for m, s in zip(blocks, starts)]
                            + [starts[-1:].astype(index)])
    indices = np.concatenate([(m.indices + c).astype(index) for m, c in zip(blocks, cols)])
    data = np.concatenate([m.data for m in blocks])
    return sp.csr_array((data, indices, indptr), shape=(int(rows[-1]), int(cols[-1])))


def products(chain: SparseChain, ks: list, counter: Counter) -> list:
    """Cores ``C_k diag(L_{k-1}) C_{k-1}`` for each ``k`` in ``ks``: one sparse product.

    The counter holds what the product leaves (the new cores) and records the
    peak of the temporaries on the way (the scaled left factors, both
    block-diagonal matrices and their product).
    """
    if not ks:
        return []
    b = max(max(len(chain.C[k]), len(chain.C[k - 1]), chain.L[k - 1].shape[1]) for k in ks)
    lefts = [_pick(chain.C[k], i).multiply(_column(chain.L[k - 1], i)[None, :]).tocsr()
             for k in ks for i in range(b)]
    rights = [_pick(chain.C[k - 1], i) for k in ks for i in range(b)]
    temporary = counter.hold(sum(nbytes(m) for m in lefts))
    left, right = block_diagonal(lefts), block_diagonal(rights)
    temporary += counter.hold(nbytes(left) + nbytes(right))
    product = left @ right
    temporary += counter.hold(nbytes(product))
    counter.flops += 2 * sum(int(np.diff(right.indptr)[left.indices].sum())
                             for left, right in zip(lefts, rights))
    blocks = _split(product, [m.shape[0] for m in lefts], [m.shape[1] for m in rights])
    counter.hold(sum(nbytes(m) for m in blocks))
    counter.release(temporary)
    return [blocks[j * b: (j + 1) * b] for j in range(len(ks))]


def apply(chain: SparseChain, ks: list, X: list, counter: Counter) -> list:
    """``diag(L_k) C_k X_j`` for ``k`` in ``ks`` and ``X_j`` ``(n, r)``: one product."""
    if not ks:
        return []
    r = X[0].shape[1]
    if all(len(chain.C[k]) == 1 for k in ks):  # shared cores act on all columns at once
        blocks, vectors = [chain.C[k][0] for k in ks], X
    else:  # per-sample cores act on their own column
        blocks = [_pick(chain.C[k], i) for k in ks for i in range(r)]
        vectors = [x[:, i: i + 1] for x in X for i in range(r)]
    Y = block_diagonal(blocks) @ np.concatenate(vectors)
    counter.flops += 2 * sum(block.nnz for block in blocks) * vectors[0].shape[1]
    parts = np.split(Y, np.cumsum([block.shape[0] for block in blocks])[:-1])
    if len(parts) > len(ks):
        parts = [np.concatenate(parts[j * r: (j + 1) * r], axis=1) for j in range(len(ks))]
    return [chain.L[k] * part for k, part in zip(ks, parts)]


@dataclass
class SparseLevels:
    """The matrix half of the sparse reduction: every sparse level's chain, the dense rest.

    ``levels[t]`` is the chain reduced at sparse level ``t`` (its ``L`` and ``C``;
    right-hand sides are a solve's); ``dense`` the padded chain that the
    remaining levels reduce, with ``factored`` their reduced blocks, or ``None``.
    """

    levels: list
    dense: Chain | None
    factored: Any
    info: dict


def sparse_factor(chain: SparseChain, counter: Counter, dense_factor: Callable,
                  dense_threshold: float, check: Callable) -> SparseLevels:
    """Odd-even reduction of the cores, sparse until ``dense_threshold``: once per matrix.

    ``info["fill_in"]`` is the nnz per reduced core relative to the original
    cores, per level that formed products; ``info["sparse_levels"]`` counts the
    levels done sparse. Once the density passes ``dense_threshold``,
    ``dense_factor`` reduces the padded dense chain of the rest. The counter
    holds the reduced cores alive, level by level, and walks the dense
    remainder (:func:`.footprint.odd_even`): its ``peak_bytes`` is known only as
    the fill-in happens.
    """
    base, r = max(chain.nnz_per_core(), 1.0), chain.G[0].shape[1]
    levels, fill = [], []
    while len(chain.L) > 1 and chain.density() <= dense_threshold:
        m = len(chain.L)
        evens = list(range(2, m, 2))
        cores = products(chain, evens, counter)
        check(cores, len(levels) + 1, [(chain.order[k], chain.order[k - 2]) for k in evens])
        levels.append(chain)
        chain = SparseChain([chain.L[0]] + [chain.L[k] for k in evens], [[]] + cores, [],
                            [chain.order[0]] + [chain.order[k] for k in evens],
                            (chain.sizes[0],) + tuple(chain.sizes[k] for k in evens))
        if cores:
            fill.append(chain.nnz_per_core() / base)
    dense, factored = None, []
    if len(chain.L) > 1:  # dense from here on
        dense = chain.to_dense(r)
        counter.hold(dense.L.nbytes + dense.C.nbytes)
        odd_even(counter, dense.L.shape[0], dense.C.shape[2], r, 1, dense.L.shape[1],
                 dense.C.shape[1], dense.L.dtype.itemsize)
        factored = dense_factor(dense, counter)
    return SparseLevels(levels, dense, factored,
                        {"fill_in": fill, "sparse_levels": len(levels)})


def sparse_substitute(factor: SparseLevels, G: list, counter: Counter,
                      dense_substitute: Callable) -> tuple[list, int]:
    """A right-hand side through the factored levels: down, the dense rest, back up.

    ``G`` is a list of ``(n_k, r)`` blocks in chain order; returns the solution
    the same way, and the number of levels.
    """
    eliminated = []
    for chain in factor.levels:
        evens = list(range(2, len(chain.L), 2))
        rhs = [G[k] + a for k, a in zip(evens, apply(chain, evens, [G[k - 1] for k in evens],
                                                     counter))]
        counter.hold(sum(nbytes(g) for g in rhs))
        eliminated.append(G[1::2])
        G = [G[0]] + rhs
    X, levels = G, len(factor.levels)
    if factor.dense is not None:
        n, sizes = factor.dense.C.shape[2], factor.dense.sizes
        padded = np.zeros((len(G), G[0].shape[1], n), dtype=G[0].dtype)
        for k, g in enumerate(G):
            padded[k, :, : g.shape[0]] = g.T
        counter.hold(padded.nbytes)
        X_dense = dense_substitute(factor.factored, padded, counter)
        X = [X_dense[k, :, :size].T for k, size in enumerate(sizes)]
        levels += len(factor.factored)
    for chain, odd in zip(reversed(factor.levels), reversed(eliminated)):  # x_k, k odd
        ks = list(range(1, len(chain.L), 2))
        updates = apply(chain, ks, X[: len(ks)], counter)
        full = [None] * (len(X) + len(odd))
        full[0::2] = X
        full[1::2] = [u + g for u, g in zip(updates, odd)]
        X = full
    return X, levels
