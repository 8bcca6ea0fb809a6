"""Sparse Jacobians of a fixed pattern whose entries are linear in a layer's values.

A convolution's Jacobian, a token-wise linear map's ``kron(I_T, W)`` and a
per-feature scaling's diagonal have a pattern that the layer's shapes decide and
entries read from its weights; so does such a Jacobian times a fixed matrix (a
pooling's window sums after it in a graph), whose entries are sums of weights.
:class:`Pattern` holds the pattern in canonical CSR order, how its entries follow
from the flat values, and its transpose's (the backward couplings), all made once
on the host; it copies its index arrays once to each backend, device and dtype it
is asked for. Each call then forms the entries where the weights are: on a GPU no
copy of the weights to the host and of the matrix back (two copies and a
synchronisation per layer per call), and no transpose made on the device per call.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np
import scipy.sparse as sp

from .. import backend
from .base import Linear

__all__ = ["Pattern", "Patterned", "diagonal", "kron_identity"]


class Pattern:
    """A canonical CSR pattern ``(indices, indptr, shape)`` with entries linear in ``size`` values.

    ``source`` says how the entries follow from the flat values (C order):
    ``None``, the values in order (a diagonal's); an integer array, entry ``k`` is
    value ``source[k]`` (a gather: a convolution's kernel entries); a SciPy CSR
    array ``S`` of one row per entry, the entries ``S @ values`` (a pattern times a
    fixed matrix, :meth:`times`). Build one with :meth:`of_entries`.
    """

    def __init__(self, source: Any, indices: np.ndarray, indptr: np.ndarray,
                 shape: tuple[int, int], size: int) -> None:
        self.source, self.indices, self.indptr = source, indices, indptr
        self.shape, self.size = (int(shape[0]), int(shape[1])), int(size)
        self._there: dict[tuple, tuple] = {}  # (backend, device, dtype) -> the arrays there

    @classmethod
    def of_entries(cls, rows: np.ndarray, cols: np.ndarray, source: Any,
                   shape: tuple[int, int], size: int) -> Pattern:
        """Entries at ``(rows[k], cols[k])`` from ``source``'s row ``k``, sorted to CSR.

        ``source`` an integer array (a gather) or a CSR array of coefficients. Entries
        at one position are summed, which only coefficients can express
        (``ValueError`` for a gather that reads two values into one entry).
        """
        order = np.lexsort((cols, rows))
        rows, cols, source = rows[order], cols[order], source[order]
        first = np.ones(rows.size, dtype=bool)
        first[1:] = (rows[1:] != rows[:-1]) | (cols[1:] != cols[:-1])
        if not first.all():
            if not sp.issparse(source):
                raise ValueError("a gather's entries must have distinct positions")
            group = np.cumsum(first) - 1
            source = sp.csr_array((np.ones(rows.size), (group, np.arange(rows.size))),
                                  shape=(int(group[-1]) + 1, rows.size)) @ source
            rows, cols = rows[first], cols[first]
        indptr = np.zeros(shape[0] + 1, dtype=np.int64)
        np.cumsum(np.bincount(rows, minlength=shape[0]), out=indptr[1:])
        source = sp.csr_array(source) if sp.issparse(source) else source.astype(np.int64)
        return cls(source, cols.astype(np.int64), indptr, shape, size)

    def _rows(self) -> np.ndarray:
        """The row of every entry."""
        return np.repeat(np.arange(self.shape[0]), np.diff(self.indptr))

    def _coefficients(self) -> Any:
        """``source`` as a CSR array ``S`` of coefficients: the entries are ``S @ values``."""
        if sp.issparse(self.source):
            return self.source
        nnz = self.indices.size
        cols = np.arange(nnz) if self.source is None else self.source
        return sp.csr_array((np.ones(nnz), (np.arange(nnz), cols)), shape=(nnz, self.size))

    @functools.cached_property
    def T(self) -> Pattern:  # noqa: N802 (SciPy's name)
        """The transpose's pattern, its entries from the same values."""
        source = np.arange(self.indices.size) if self.source is None else self.source
        return Pattern.of_entries(self.indices, self._rows(), source, self.shape[::-1],
                                  self.size)

    def times(self, A: Any) -> Pattern:
        """The pattern of ``J A`` for this ``J`` and a fixed SciPy sparse ``A``.

        ``(J A)_rc = sum_j J_rj A_jc``: every entry of ``J`` meets the entries of
        ``A``'s row ``j``; their coefficients, scaled by ``A_jc``, are summed at
        ``(r, c)``.
        """
        A = sp.csr_array(A)
        if A.shape[0] != self.shape[1]:
            raise ValueError(f"a {self.shape} pattern times a {A.shape} matrix")
        counts = np.diff(A.indptr)[self.indices]  # A's entries each entry of J meets
        entry = np.repeat(np.arange(self.indices.size), counts)
        at = np.arange(entry.size) + np.repeat(A.indptr[self.indices] - np.cumsum(counts)
                                               + counts, counts)  # those entries of A
        S = sp.csr_array(sp.diags_array(A.data[at]) @ self._coefficients()[entry])
        return Pattern.of_entries(self._rows()[entry], A.indices[at].astype(np.int64), S,
                                  (self.shape[0], A.shape[1]), self.size)

    def matrix(self, values: Any) -> Any:
        """The sparse matrix of the pattern with ``values``' entries, on their backend.

        A SciPy CSR array for NumPy's values (and the strict namespace's, which has
        no sparse arrays: :func:`~propop.backend.matrix_on` expands it there within
        the memory budget); on CuPy and PyTorch the backend's own CSR matrix, its
        entries formed on the values' device.
        """
        if int(np.prod(values.shape)) != self.size:
            raise ValueError(f"a pattern of {self.size} values given {tuple(values.shape)}")
        be = backend.of(values)
        host = be.name == "numpy" or be.name in backend.DENSE_ONLY
        if host:
            values = backend.to_host(values)
        source, indices, indptr = self._on("numpy" if host else be.name, values)
        flat = np.reshape(values, (-1,)) if host else be.xp.reshape(values, (-1,))
        if source is None:  # a copy: the matrix is not a view of the layer's parameter
            data = flat.copy() if host else be.xp.asarray(flat, copy=True)
        elif backend.is_sparse(source):
            data = source @ flat
        else:
            data = flat[source] if host else backend.take_rows(flat, source)
        make = sp.csr_array if host else be.sparse.csr_matrix
        return make((data, indices, indptr), shape=self.shape)

    def _on(self, name: str, like: Any) -> tuple:
        """``(source, indices, indptr)`` on ``like``'s backend, device and dtype, made once."""
        key = (name, str(backend.device(like)) if name != "numpy" else "cpu", str(like.dtype))
        if key not in self._there:
            wide = np.int64 if name in ("numpy", "torch") else np.int32  # CSR tensors', cupyx's
            source = self.source
            if sp.issparse(source):  # coefficients in the values' dtype
                source = backend.convert(source.astype(_host_dtype(like.dtype)), name,
                                         getattr(like, "device", None))
            elif source is not None:
                source = _moved(source.astype(wide), name, like)
            self._there[key] = (source, _moved(self.indices.astype(wide), name, like),
                                _moved(self.indptr.astype(wide), name, like))
        return self._there[key]


def _moved(array: np.ndarray, name: str, like: Any) -> Any:
    """A host index array on ``like``'s backend and device (itself on the host)."""
    return array if name == "numpy" else backend.like(array, like)


def _host_dtype(dtype: Any) -> Any:
    """NumPy's dtype of the same name as ``dtype`` (NumPy's, PyTorch's, CuPy's)."""
    return np.dtype(str(dtype).removeprefix("torch."))


class Patterned(Linear):
    """A linear layer whose Jacobians are fixed patterns of its values (:meth:`patterns`)."""

    def patterns(self, sizes: Sequence[int]) -> list:
        """``(Pattern, values)`` of each ``J_i`` for inputs of ``sizes``."""
        raise NotImplementedError

    def jacobians(self, sizes: Sequence[int]) -> list:
        """The ``J_i``: each pattern with the current values, on their device."""
        return [pattern.matrix(values) for pattern, values in self.patterns(sizes)]


@functools.lru_cache(maxsize=64)
def diagonal(n: int) -> Pattern:
    """``diag(values)`` of ``n`` values: the pattern of a per-feature scaling, its own transpose."""
    steps = np.arange(n + 1, dtype=np.int64)
    pattern = Pattern(None, steps[:-1], steps, (n, n), n)
    pattern.T = pattern  # the cached property's value, set: a diagonal is symmetric
    return pattern


@functools.lru_cache(maxsize=64)
def kron_identity(tokens: int, rows: int, cols: int) -> Pattern:
    """``kron(I_tokens, W)`` of a ``rows x cols`` matrix ``W``: ``W`` in every diagonal block."""
    t, a, b = np.meshgrid(np.arange(tokens), np.arange(rows), np.arange(cols), indexing="ij")
    return Pattern.of_entries((t * rows + a).ravel(), (t * cols + b).ravel(),
                              (a * cols + b).ravel(), (tokens * rows, tokens * cols),
                              rows * cols)
