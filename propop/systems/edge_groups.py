"""The couplings of a system grouped by shape: one batched product per group.

Written for propop. A system given edge by edge (a computation graph's, eqs.
forw_prop_sys_jacobian and back_prop_sys_jacobian) has one coupling ``M_e`` per
edge ``e = (row, col)``, so a product ``A x`` (eqs. forw_prop_matvec and
back_prop_matvec) is a sum over edges:

    ``(A x)_k = d_k x_k - sum_{e: row = k} s_k * (M_e x_col)``
    ``(A^T x)_p = d_p x_p - sum_{e: col = p} M_e^T (s_row * x_row)``

Edges whose couplings have the same shape and kind (dense, or sparse), whose
scalings have the same shape, and which are the ``j``-th edge to write their
target block, form one group: their sources are gathered with one index array,
multiplied in one batched ``matmul`` (dense: a stacked ``(g, t, u)`` array;
sparse: one block-diagonal CSR matrix), and written with one indexed
subtraction, which is exact because no two edges of a group write the same
entries. The Python work of a product is then per group, not per edge: a
residual network of any depth has a handful of groups.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import backend

__all__ = ["EdgeGroups"]


@dataclass(frozen=True)
class _Group:
    """Edges of one shape: targets ``(g, t)`` and sources ``(g, u)`` as entry indices."""

    target: Any
    source: Any
    coupling: Any  # dense (g, t, u), or sparse (g t, g u) block diagonal
    scale: Any  # (g, t or u, c) or None: scales the product (forward) or the source
    scale_first: bool


class EdgeGroups:
    """The edges of ``blocks`` (:class:`~propop.systems.triangular.Blocks`) grouped for products.

    Parameters
    ----------
    blocks : Blocks
        The system's structured view (its form's scalings on the edges).
    offsets : sequence of int
        Where each block starts in the stacked vector.
    be : Backend
        The arrays' backend.
    transpose : bool
        Group for ``A^T x`` (targets are the edges' columns) instead of ``A x``.
    """

    def __init__(self, blocks: Any, offsets: Any, be: backend.Backend, transpose: bool) -> None:
        self.be, self.transpose = be, transpose
        keyed: dict[tuple, list] = {}
        written: dict[int, int] = {}
        for e in blocks.edges:
            target = e.col if transpose else e.row
            j = written[target] = written.get(target, -1) + 1
            scale = None if e.scale is None else (e.scale[:, None] if e.scale.ndim == 1
                                                  else e.scale)
            key = (e.matrix.shape, be.sparse.issparse(e.matrix),
                   None if scale is None else scale.shape, j)
            keyed.setdefault(key, []).append((e, scale))
        self.groups = [self._group(edges, offsets) for edges in keyed.values()]

    def _group(self, edges: list, offsets: Any) -> _Group:
        xp, t = self.be.xp, self.transpose
        first, (rows, cols) = edges[0][0], edges[0][0].matrix.shape
        target = [e.col if t else e.row for e, _ in edges]
        source = [e.row if t else e.col for e, _ in edges]
        size_t, size_u = (cols, rows) if t else (rows, cols)
        if self.be.sparse.issparse(first.matrix):
            coupling = _block_diagonal(self.be, [(e.matrix.T if t else e.matrix).tocsr()
                                                 for e, _ in edges])
        else:
            M = xp.stack([e.matrix for e, _ in edges])
            coupling = xp.permute_dims(M, (0, 2, 1)) if t else M
        scale = None if edges[0][1] is None else xp.stack([s for _, s in edges])
        return _Group(_entries(first.matrix, offsets, target, size_t),
                      _entries(first.matrix, offsets, source, size_u), coupling, scale, t)

    def subtract_from(self, out: Any, x: Any) -> Any:
        """``out - (sum over edges)`` in place: ``out`` and ``x`` are ``(N,)`` or ``(N, c)``."""
        xp = self.be.xp
        for g in self.groups:
            X = backend.take_rows(x, g.source)  # (g, u[, c])
            X = X[..., None] if X.ndim == 2 else X
            if g.scale is not None and g.scale_first:
                X = g.scale * X
            if self.be.sparse.issparse(g.coupling):
                n, c = X.shape[0] * X.shape[1], X.shape[2]
                P = xp.reshape(g.coupling @ xp.reshape(X, (n, c)), (X.shape[0], -1, c))
            else:
                P = g.coupling @ X
            if g.scale is not None and not g.scale_first:
                P = g.scale * P
            backend.subtract_rows(out, g.target, P[..., 0] if x.ndim == 1 else P)
        return out


def _entries(like: Any, offsets: Any, blocks: list, size: int) -> Any:
    """The entry indices of ``blocks`` (``size`` entries each), ``(g, size)``, beside ``like``.

    Made once for a layout's signature and device (:func:`~propop.backend.kept_for`).
    """
    starts = tuple(int(offsets[k]) for k in blocks)
    return backend.kept_for(("edge entries", starts, size), lambda: np.asarray(starts)[
        :, None] + np.arange(size)[None, :], like)


def _block_diagonal(be: backend.Backend, matrices: list) -> Any:
    """One CSR matrix with ``matrices`` (canonical CSR, equal shapes) on its diagonal."""
    xp = be.xp
    rows, cols = matrices[0].shape
    counts = [int(M.indptr[-1]) for M in matrices]
    starts = [0]
    for c in counts:
        starts.append(starts[-1] + c)
    indptr = xp.concat([M.indptr[:-1] + s for M, s in zip(matrices, starts)]
                       + [backend.like(np.asarray([starts[-1]]), matrices[0].indptr)])
    indices = xp.concat([M.indices + i * cols for i, M in enumerate(matrices)])
    data = xp.concat([M.data for M in matrices])
    cls = getattr(be.sparse, "csr_array", None) or be.sparse.csr_matrix
    return cls((data, indices, indptr), shape=(rows * len(matrices), cols * len(matrices)))
