"""The explicit views of an operator: its sparse matrix and a SciPy ``LinearOperator``.

For ``columns`` right-hand sides (``None``: one vector) the matrix is the block
diagonal of the columns' shifted systems, acting on the samples stacked one after
another (``x.T.reshape(-1)``). Each view is built once per operator and number of
columns (:meth:`Operator.view`). On PyTorch the matrix is a CSR tensor
(:class:`~propop.torch_sparse.CSRTensor`), made on the operator's device; the
``LinearOperator`` is SciPy's (CuPy's) alone.
"""

from __future__ import annotations

import math
from typing import Any

from .. import backend
from .operator import Operator

__all__ = ["csr", "matrix", "linear_operator", "shape"]


def shape(op: Operator, columns: int | None) -> tuple[int, int]:
    """``(N c, N c)``: the shape of the views for ``columns`` right-hand sides."""
    n = op.size * (columns or 1)
    return (n, n)


def _require_scipy_interface(op: Operator) -> None:
    if op.backend.name == "torch":
        raise TypeError("operator is a SciPy (cupyx on a GPU) LinearOperator, which PyTorch "
                        "tensors do not have; the explicit matrix (system.matrix, "
                        "system.csr) is a CSR tensor there, and system.apply the product")


def linear_operator(op: Operator, columns: int | None) -> Any:
    """Matrix-free ``LinearOperator`` equal to :func:`matrix` (samples stacked)."""
    _require_scipy_interface(op)

    def build() -> Any:
        r, n = columns or 1, op.size

        def unstack(v: Any) -> Any:
            v = v.reshape(-1)
            return v if columns is None else v.reshape(r, n).T

        def stack(X: Any) -> Any:
            return X if columns is None else X.T.reshape(-1)

        return op.backend.spla.LinearOperator(
            shape(op, columns), dtype=op.dtype,
            matvec=lambda v: stack(op.apply(unstack(v))),
            rmatvec=lambda v: stack(op.apply(unstack(v), transpose=True)))

    return op.view("operator", columns, build)


def matrix(op: Operator, columns: int | None) -> Any:
    """The explicit sparse matrix: BSR where the blocks are dense, CSR otherwise."""

    def build() -> Any:
        explicit = csr(op, columns)
        blocksize = math.gcd(*op.sizes)
        if not op.sparse_couplings and blocksize > 1 and hasattr(explicit, "tobsr"):
            return explicit.tobsr(blocksize=(blocksize, blocksize))
        return explicit

    return op.view("matrix", columns, build)


def csr(op: Operator, columns: int | None) -> Any:
    """The explicit matrix of :func:`matrix` as a CSR array, built once."""

    def build() -> Any:
        xp = op.backend.xp
        if columns is None:
            singles = [op]
        elif op._scaled_once:  # one matrix for every column
            singles = [op.sample(0) if op.samples is not None else op] * columns
        else:
            singles = [op.sample(i) for i in range(columns)]
        parts = [_triplets(s, i * op.size) for i, s in enumerate(singles)]
        rows, cols, vals = (xp.concat([p[q] for p in parts]) for q in range(3))
        del parts
        make = getattr(op.backend.sparse, "csr_array", None) or op.backend.sparse.csr_matrix
        return make((vals, (rows, cols)), shape=shape(op, columns))

    return op.view("csr", columns, build)


def _triplets(op: Operator, shift: int) -> tuple[Any, Any, Any]:
    """``(rows, cols, values)`` of one sample's matrix, indices shifted by ``shift``."""
    xp, device = op.backend.xp, op.device
    B, o = op.blocks, op.offsets
    rows, cols, vals = [], [], []
    for k, d in enumerate(B.diagonal):
        idx = xp.arange(o[k] + shift, o[k + 1] + shift, device=device)
        rows.append(idx)
        cols.append(idx)
        vals.append(xp.ones(B.sizes[k], dtype=op.dtype, device=device) if d is None
                    else xp.reshape(d, (-1,)))
    for e in B.edges:
        coo = _coo(op.backend, e.matrix)
        scale = None if e.scale is None else xp.reshape(e.scale, (-1,))
        rows.append(coo[0] + (o[e.row] + shift))
        cols.append(coo[1] + (o[e.col] + shift))
        vals.append(-backend.astype(coo[2] if scale is None else
                                    backend.take_rows(scale, coo[0]) * coo[2], op.dtype))
    return xp.concat(rows), xp.concat(cols), xp.concat(vals)


def _coo(be: backend.Backend, M: Any) -> tuple[Any, Any, Any]:
    """``(rows, cols, values)`` of a dense or sparse matrix, on its device."""
    xp = be.xp
    if be.name == "torch" and be.sparse.issparse(M):  # its tocoo is the host's (error paths)
        rows = xp.repeat(xp.arange(M.shape[0], device=M.device), xp.diff(M.indptr))
        return rows, M.indices, M.data
    if be.sparse.issparse(M):
        coo = M.tocoo()
        return coo.row, coo.col, coo.data
    rows, cols = xp.nonzero(xp.ones(M.shape, dtype=xp.bool, device=backend.device(M)))
    return rows, cols, xp.reshape(M, (-1,))
