"""Sparse kernels of the one odd-even loop: one sparse product per level, fill-in reported.

The chain ``x_k = diag(L_k) C_k x_{k-1} + G_k`` of :mod:`propop.solvers.reduction.chain`
as lists instead of padded stacks: ``C[k]`` (positions ``1..m-1``) holds one shared
sparse core or one per sample. :class:`SparseKernels` give :mod:`.odd_even`'s loop its
operations on them: a level multiplies the block-diagonal matrix of all left factors
by that of all right factors in one sparse product and splits the block-diagonal
result; right-hand-side updates and back-substitutions are one sparse-times-dense
product each, the same way. Assembling and splitting the block-diagonal matrices is
bookkeeping over blocks; the arithmetic of a level is one product.

Products of sparse matrices fill in. Before each level the kernels look at the
cores' density: past ``dense_threshold`` they hand the remaining levels to
:class:`~.odd_even.DenseKernels` on the padded dense chain (an
:class:`~.odd_even.Switch` among the levels, which moves each right-hand side into
the padded layout and its solution back). SciPy only: CuPy systems take the dense path.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp

from .chain import Chain, Counter, chain_rows
from .footprint import odd_even
from .odd_even import DenseKernels, Switch

__all__ = ["sparse_chain", "SparseKernels", "block_diagonal", "nbytes"]


def sparse_chain(system: Any, shared_diagonal: str | None = None) -> Chain:
    """The chain of a system whose couplings are ``scipy.sparse``, as lists.

    ``L[k]`` is ``(n_k, bl)``; ``C[k]`` (positions ``1..m-1``) a list of sparse cores.
    """
    rows = chain_rows(system, shared_diagonal)
    return Chain([row.L for row in rows], [[sp.csr_array(row.M)] for row in rows[1:]], None,
                 system.layout.order(), tuple(row.G.shape[0] for row in rows))


class SparseKernels:
    """:mod:`.odd_even`'s kernels on lists of sparse cores, dense past ``threshold``.

    ``fill_in`` records the nnz per reduced core relative to the original cores,
    per level that formed products; ``levels`` counts the levels done sparse.
    The counter holds the reduced cores and the right-hand sides' updates as they
    are made: a sparse reduction's peak is known only as the fill-in happens.
    """

    def __init__(self, chain: Chain, threshold: float, xp: Any, r: int) -> None:
        self.threshold, self.dense, self.r = threshold, DenseKernels(xp), r
        self.base = max(_nnz_per_core(chain.C), 1.0)
        self.fill_in: list = []
        self.levels = 0

    rows = staticmethod(lambda A, positions: A[positions])
    count = staticmethod(len)
    join = staticmethod(lambda first, rest: first + rest)

    @staticmethod
    def add(A: list, B: list) -> list:
        """Blockwise ``A + B``."""
        return [a + b for a, b in zip(A, B)]

    @staticmethod
    def interleave(even: list, odd: list) -> list:
        """Positions ``even[0], odd[0], even[1], ...``."""
        full = [None] * (len(even) + len(odd))
        full[0::2], full[1::2] = even, odd
        return full

    def product(self, L1: list, C1: list, L2: list, C2: list, counter: Counter) -> list:
        """Cores ``C1_j diag(L2_j) C2_j`` for each pair ``j``: one sparse product.

        The counter holds what the product leaves (the new cores) and records the
        peak of the temporaries on the way (the scaled left factors, both
        block-diagonal matrices and their product).
        """
        self.levels += 1  # once per level, a level of no pair included
        if not C1:
            return []
        b = max(max(len(c1), len(c2), s2.shape[1]) for c1, c2, s2 in zip(C1, C2, L2))
        lefts = [_pick(c1, i).multiply(_column(s2, i)[None, :]).tocsr()
                 for c1, s2 in zip(C1, L2) for i in range(b)]
        rights = [_pick(c2, i) for c2 in C2 for i in range(b)]
        temporary = counter.hold(sum(nbytes(m) for m in lefts))
        left, right = block_diagonal(lefts), block_diagonal(rights)
        temporary += counter.hold(nbytes(left) + nbytes(right))
        product = left @ right
        temporary += counter.hold(nbytes(product))
        counter.flops += 2 * sum(int(np.diff(b_.indptr)[a_.indices].sum())
                                 for a_, b_ in zip(lefts, rights))
        blocks = _split(product, [m.shape[0] for m in lefts], [m.shape[1] for m in rights])
        counter.hold(sum(nbytes(m) for m in blocks))
        counter.release(temporary)
        cores = [blocks[j * b: (j + 1) * b] for j in range(len(C1))]
        self.fill_in.append(_nnz_per_core(cores) / self.base)
        return cores

    def apply(self, L: list, C: list, X: list, counter: Counter) -> list:
        """``diag(L_j) C_j X_j`` for ``X_j`` ``(n, r)``: one product."""
        if not C:
            return []
        r = X[0].shape[1]
        if all(len(c) == 1 for c in C):  # shared cores act on all columns at once
            blocks, vectors = [c[0] for c in C], X
        else:  # per-sample cores act on their own column
            blocks = [_pick(c, i) for c in C for i in range(r)]
            vectors = [x[:, i: i + 1] for x in X for i in range(r)]
        Y = block_diagonal(blocks) @ np.concatenate(vectors)
        counter.flops += 2 * sum(block.nnz for block in blocks) * vectors[0].shape[1]
        parts = np.split(Y, np.cumsum([block.shape[0] for block in blocks])[:-1])
        if len(parts) > len(C):
            parts = [np.concatenate(parts[j * r: (j + 1) * r], axis=1) for j in range(len(C))]
        out = [scale * part for scale, part in zip(L, parts)]
        counter.hold(sum(nbytes(o) for o in out))
        return out

    @staticmethod
    def first_nonfinite(cores: list) -> int | None:
        """The first pair whose reduced core has a NaN or Inf, or ``None``."""
        for j, group in enumerate(cores):
            if not all(np.isfinite(core.data).all() for core in group):
                return j
        return None

    def densify(self, L: list, C: list, counter: Counter) -> Switch | None:
        """The dense kernels for the remaining levels, once the cores are dense enough."""
        cores = [c for cs in C for c in cs]
        entries = sum(c.shape[0] * c.shape[1] for c in cores)
        if entries == 0 or sum(c.nnz for c in cores) / entries <= self.threshold:
            return None
        sizes = tuple(scale.shape[0] for scale in L)
        n, dtype = max(sizes), L[0].dtype
        Ld = np.zeros((len(L), max(scale.shape[1] for scale in L), n), dtype=dtype)
        Cd = np.zeros((len(C), max(len(cs) for cs in C), n, n), dtype=dtype)
        for k, size in enumerate(sizes):
            Ld[k, :, :size] = L[k].T
        for k, cs in enumerate(C):
            for i, core in enumerate(cs):
                Cd[k, i, : core.shape[0], : core.shape[1]] = core.toarray()
        counter.hold(Ld.nbytes + Cd.nbytes)
        odd_even(counter, Ld.shape[0], n, self.r, 1, Ld.shape[1], Cd.shape[1],
                 Ld.dtype.itemsize)  # the dense rest's memory, walked on shapes

        def down(G: list) -> Any:
            padded = np.zeros((len(G), G[0].shape[1], n), dtype=G[0].dtype)
            for k, g in enumerate(G):
                padded[k, :, : g.shape[0]] = g.T
            counter.hold(padded.nbytes)
            return padded

        def up(X: Any) -> list:
            return [X[k, :, :size].T for k, size in enumerate(sizes)]

        return Switch(self.dense, Ld, Cd, down, up)


def _nnz_per_core(C: list) -> float:
    """Average non-zeros of one core."""
    cores = [c for cs in C for c in cs]
    return sum(c.nnz for c in cores) / max(len(cores), 1)


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
