"""A plain triangular matrix and right-hand side as a :class:`TriangularSystem`.

For ``pp.solve(A, method, b=b)`` with ``A`` a ``scipy.sparse`` (or dense NumPy)
triangular matrix, as ``scipy.sparse.linalg.spsolve_triangular`` takes it: every
unknown is a block of size one, row ``k`` of the paper form is
``a_kk x_k + sum_j a_kj x_j = b_k``, and its scaled form divides by ``a_kk``.
Lower or upper is read from the pattern. One Python object per entry: meant for
matrices of up to some ``10^5`` entries; a network's own systems are built
stacked, and ``scipy.sparse.linalg.spsolve_triangular`` serves larger plain ones.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp

from .._checks import real_array, require_finite
from .triangular import TriangularSystem

__all__ = ["as_system"]


def as_system(A: Any, b: Any) -> TriangularSystem:
    """``A`` (square, triangular, non-zero diagonal) and ``b`` (``(N,)`` or ``(N, r)``)."""
    if b is None:
        raise ValueError("a plain matrix needs its right-hand side: pp.solve(A, method, b=b) "
                         "(or build a pp.TriangularSystem)")
    A = sp.csr_array(A if sp.issparse(A) else real_array(A, "A", np.float64))
    if A.ndim != 2 or A.shape[0] != A.shape[1]:
        raise ValueError(f"A must be a square matrix, got shape {A.shape}")
    b = real_array(b, "b", np.float64)
    if b.ndim not in (1, 2) or b.shape[0] != A.shape[0]:
        raise ValueError(f"b has shape {b.shape}, expected ({A.shape[0]},) or "
                         f"({A.shape[0]}, r)")
    require_finite(A.data, "A")
    coo = A.tocoo()
    below, above = (coo.row > coo.col) & (coo.data != 0), (coo.row < coo.col) & (coo.data != 0)
    if below.any() and above.any():
        raise ValueError("A is neither lower nor upper triangular: it has non-zeros on both "
                         "sides of the diagonal")
    d = A.diagonal()
    if not np.all(d != 0):
        raise ValueError(f"A has a zero on its diagonal (row {int(np.argmin(d != 0))}): the "
                         "triangular system is singular")
    off = below | above
    edges = [(int(i), int(j), np.array([[-v]])) for i, j, v in
             zip(coo.row[off], coo.col[off], coo.data[off])]
    scale = 1 / d
    scales = [np.array([s]) if b.ndim == 1 else np.array([[s]]) for s in scale]
    rhs = b * (scale if b.ndim == 1 else scale[:, None])
    return TriangularSystem(None, scales, rhs, lower=not above.any(), sizes=[1] * A.shape[0],
                            form="paper", edges=edges, names=lambda k: f"row {k}")
