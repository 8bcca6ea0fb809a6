"""Sparse matrices of the PyTorch backend: CSR tensors with SciPy's interface.

``scipy.sparse`` serves NumPy and ``cupyx.scipy.sparse`` serves CuPy with the same
interface. PyTorch has CSR tensors (``torch.sparse_csr_tensor``, on the CPU and
on CUDA) but none of that interface, so :class:`CSRTensor` wraps one with the
part of it that propop's algorithms read: ``shape``, ``dtype``, ``nnz``, ``data``,
``indices``, ``indptr``, ``T``, ``@`` with dense tensors of one or two axes,
``toarray()``, ``astype()`` and ``tocoo()`` (an error path's index, on the host).
The module :data:`SPARSE` is the backend's ``sparse`` module (``issparse``,
``csr_matrix``) as SciPy's is NumPy's.

A layer's structure (a convolution's Jacobian, a concatenation's placement, a
broadcast) or a sparse weight thus stays sparse on PyTorch's devices, where it
was expanded to a dense matrix before (an attention layer's broadcasts were
8192 x 16384 dense tensors). Every matrix made here is canonical: sorted
indices, no duplicates, as :func:`propop._checks.canonical_matrix` makes SciPy's.
"""

from __future__ import annotations

import functools
import warnings
from types import SimpleNamespace
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch

__all__ = ["CSRTensor", "SPARSE"]


def _csr(indptr: Any, indices: Any, data: Any, shape: tuple) -> Any:
    """``torch.sparse_csr_tensor`` without its one-time "beta" warning (the layout is used)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Sparse CSR tensor support is in beta")
        warnings.filterwarnings("ignore", "Sparse invariant checks are implicitly disabled")
        return torch.sparse_csr_tensor(indptr, indices, data, size=shape, device=data.device)


def _canonical(M: Any) -> Any:
    """SciPy's canonical CSR array of ``M``: duplicates summed, indices sorted (a copy)."""
    host = sp.csr_array(M, copy=True)
    host.sum_duplicates()
    host.sort_indices()
    return host


def _from_triplets(data: Any, row: Any, col: Any, shape: tuple | None) -> tuple:
    """``(data, indices, indptr)`` of the entries ``(row[k], col[k]) = data[k]``, summed.

    SciPy's ``(data, (row, col))`` form, on the tensors' device: PyTorch's
    ``coalesce`` sums duplicates and sorts the entries row by row.
    """
    if shape is None or len(shape) != 2:
        raise ValueError("CSRTensor((data, (row, col))) needs shape=(m, n)")
    if not all(isinstance(a, torch.Tensor) and a.ndim == 1 for a in (data, row, col)) or \
            data.shape != row.shape or row.shape != col.shape:
        raise ValueError("CSRTensor((data, (row, col))) needs 1-D tensors of one length; got "
                         "shapes " + ", ".join(str(tuple(getattr(a, "shape", ())))
                                               for a in (data, row, col)))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Sparse CSR tensor support is in beta")
        warnings.filterwarnings("ignore", "Sparse invariant checks are implicitly disabled")
        csr = torch.sparse_coo_tensor(torch.stack([row, col]), data, size=tuple(shape)
                                      ).coalesce().to_sparse_csr()
    return csr.values(), csr.col_indices(), csr.crow_indices()


def _require_fit(data: Any, indices: Any, indptr: Any, shape: tuple | None) -> None:
    """The tuple form's arrays: 1-D tensors, as many entries as indices, ``m + 1`` pointers."""
    if shape is None or len(shape) != 2:
        raise ValueError("CSRTensor((data, indices, indptr)) needs shape=(m, n)")
    if not all(isinstance(a, torch.Tensor) and a.ndim == 1 for a in (data, indices, indptr)) \
            or data.shape != indices.shape or indptr.shape[0] != int(shape[0]) + 1:
        raise ValueError(f"CSRTensor((data, indices, indptr), shape={tuple(shape)}) needs 1-D "
                         f"tensors, as many entries as indices and m + 1 = {int(shape[0]) + 1} "
                         "pointers; got shapes " + ", ".join(
                             str(tuple(getattr(a, "shape", ()))) for a in (data, indices,
                                                                           indptr)))


class CSRTensor:
    """A canonical CSR matrix of PyTorch tensors on one device.

    Parameters
    ----------
    arg : tuple or CSRTensor or scipy.sparse matrix
        ``(data, indices, indptr)`` tensors (SciPy's constructor's form, the
        pattern sorted and free of duplicates: the caller's promise), ``(data,
        (row, col))`` tensors (SciPy's triplets, duplicates summed), another
        ``CSRTensor``, or a SciPy sparse matrix of any format (made canonical on
        the host).
    shape : tuple, optional
        ``(m, n)``; required with the tuple form.
    dtype : torch.dtype, optional
    device : torch.device or str, optional
        For a SciPy matrix; default the CPU. As ``torch.as_tensor`` does, a
        canonical SciPy matrix's entries on the CPU are shared, not copied (a dense
        array's move to PyTorch's CPU shares its memory too); no method here
        writes them.

    Raises
    ------
    TypeError
        For anything but the three forms.
    ValueError
        For a tuple form whose arrays do not fit each other or ``shape`` (the
        indices' values are not read: that would synchronise a GPU).
    """

    format = "csr"
    has_canonical_format = True
    ndim = 2
    propop_backend = "torch"  # what propop.backend.of reads: this type's backend

    def __init__(self, arg: Any, shape: tuple | None = None, dtype: Any = None,
                 device: Any = None) -> None:
        if isinstance(arg, CSRTensor):
            data, indices, indptr, shape = arg.data, arg.indices, arg.indptr, arg.shape
        elif sp.issparse(arg):
            host = arg if arg.format == "csr" and arg.has_canonical_format else _canonical(arg)
            device = torch.device(device or "cpu")
            data, indices, indptr = (torch.as_tensor(a, device=device) for a in (
                host.data if host.data.flags.writeable else host.data.copy(),  # read-only
                host.indices.astype(np.int64), host.indptr.astype(np.int64)))  # (shared)
            shape = host.shape
        elif isinstance(arg, tuple) and len(arg) == 3:
            data, indices, indptr = arg
            _require_fit(data, indices, indptr, shape)
        elif isinstance(arg, tuple) and len(arg) == 2 and isinstance(arg[1], tuple):
            data, indices, indptr = _from_triplets(arg[0], *arg[1], shape)
        else:
            raise TypeError(f"CSRTensor takes (data, indices, indptr) or (data, (row, col)) "
                            f"tensors, a CSRTensor or a scipy.sparse matrix, got "
                            f"{type(arg).__name__}")
        if dtype is not None and data.dtype != dtype:
            data = data.to(dtype)
        self.shape = (int(shape[0]), int(shape[1]))
        self.tensor = _csr(indptr, indices, data, self.shape)

    # -- what the algorithms read --------------------------------------------------------
    @property
    def data(self) -> Any:
        """The stored entries, in row order."""
        return self.tensor.values()

    @property
    def indices(self) -> Any:
        """Each stored entry's column."""
        return self.tensor.col_indices()

    @property
    def indptr(self) -> Any:
        """Row ``i``'s entries are ``data[indptr[i]:indptr[i + 1]]``."""
        return self.tensor.crow_indices()

    @property
    def dtype(self) -> Any:
        """The entries' ``torch.dtype``."""
        return self.tensor.dtype

    @property
    def device(self) -> Any:
        """The ``torch.device`` the tensors live on."""
        return self.tensor.device

    @property
    def nnz(self) -> int:
        """How many entries are stored."""
        return int(self.tensor.values().shape[0])

    @property
    def T(self) -> CSRTensor:  # noqa: N802 (SciPy's name)
        """The transpose as a canonical CSR matrix, its entries the current ones.

        Its pattern is made once on the device and kept (:attr:`_transposed`: a
        matrix's pattern never changes here); its entries are gathered from this
        matrix's at each call, so entries written in place (``M.data.mul_(2)``) are
        read. PyTorch's own transpose to CSR (``t().to_sparse_csr()``) took about
        half of a sparse FNN's backprop on the CPU (8 layers of 512, density 0.1).
        """
        order, indices, indptr = self._transposed
        out = CSRTensor.__new__(CSRTensor)
        out.shape = (self.shape[1], self.shape[0])
        out.tensor = _csr(indptr, indices, self.data[order], out.shape)
        return out

    @functools.cached_property
    def _transposed(self) -> tuple:
        """``(order, indices, indptr)`` of the transpose: entry ``k`` is ``data[order[k]]``."""
        m, n = self.shape
        indptr = self.indptr
        rows = torch.repeat_interleave(torch.arange(m, device=indptr.device),
                                       indptr[1:] - indptr[:-1])
        cols = self.indices
        order = torch.argsort(cols, stable=True)  # by column, rows ascending: they are sorted
        counts = torch.bincount(cols, minlength=n)
        pointers = torch.zeros(n + 1, dtype=indptr.dtype, device=indptr.device)
        pointers[1:] = torch.cumsum(counts, 0)
        return order, rows[order], pointers

    def __matmul__(self, x: Any) -> Any:
        """``M @ x`` for a dense tensor of one or two axes (PyTorch's CSR product)."""
        if not isinstance(x, torch.Tensor):
            return NotImplemented
        if x.ndim not in (1, 2) or x.shape[0] != self.shape[1]:
            raise ValueError(f"matmul of a sparse {self.shape} matrix and x of shape "
                             f"{tuple(x.shape)}: x must be ({self.shape[1]},) or "
                             f"({self.shape[1]}, k)")
        if x.dtype != self.dtype:
            x = x.to(self.dtype)
        return self.tensor @ x

    def __rmatmul__(self, x: Any) -> Any:
        """``x @ M`` for a dense tensor: ``(M^T x^T)^T``."""
        if not isinstance(x, torch.Tensor):
            return NotImplemented
        return (self.T @ x.T).T if x.ndim == 2 else self.T @ x

    def toarray(self) -> Any:
        """The dense tensor."""
        return self.tensor.to_dense()

    def astype(self, dtype: Any) -> CSRTensor:
        """The same pattern with entries in ``dtype``."""
        return self if dtype == self.dtype else self.with_data(self.data.to(dtype))

    def with_data(self, data: Any) -> CSRTensor:
        """The same pattern with the entries ``data``: its transpose's pattern comes along.

        An optimiser's step on a sparse weight (:func:`propop.train`) keeps the pattern
        and so the transpose's, made once for all the steps.
        """
        out = CSRTensor((data, self.indices, self.indptr), shape=self.shape)
        if "_transposed" in self.__dict__:
            out.__dict__["_transposed"] = self.__dict__["_transposed"]
        return out

    def tocsr(self) -> CSRTensor:
        """Itself: it is canonical CSR."""
        return self

    def tocoo(self) -> Any:
        """The matrix on the host as SciPy's COO (for error messages' indices)."""
        return self.to_host().tocoo()

    def to_host(self) -> Any:
        """SciPy's CSR array of the same entries."""
        return sp.csr_array((self.data.cpu().numpy(), self.indices.cpu().numpy(),
                             self.indptr.cpu().numpy()), shape=self.shape)

    def to(self, where: Any) -> CSRTensor:
        """The same matrix in dtype ``where`` or on device ``where`` (``Tensor.to``'s two)."""
        if isinstance(where, torch.dtype):
            return self.astype(where)
        return CSRTensor((self.data.to(where), self.indices.to(where),
                          self.indptr.to(where)), shape=self.shape)

    def __repr__(self) -> str:
        return (f"<CSRTensor {self.shape[0]} x {self.shape[1]}, {self.nnz} stored entries, "
                f"{self.dtype} on {self.device}>")


def _issparse(obj: Any) -> bool:
    return isinstance(obj, CSRTensor)


def _csr_matrix(arg: Any, shape: tuple | None = None, dtype: Any = None,
                device: Any = None) -> CSRTensor:
    return CSRTensor(arg, shape=shape, dtype=dtype, device=device)


# the backend's sparse module: SciPy's two names that propop calls on any backend
SPARSE = SimpleNamespace(issparse=_issparse, csr_matrix=_csr_matrix, csr_array=_csr_matrix)
