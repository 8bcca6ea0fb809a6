"""NumPy/SciPy, CuPy/cupyx and PyTorch dispatch: the only module that imports CuPy.

Arrays decide the backend (docs/index.md, "Backends: NumPy, PyTorch, CuPy, one code
path"): NumPy arrays and ``scipy.sparse``
arrays run on the CPU, CuPy arrays and ``cupyx.scipy.sparse`` arrays on the GPU,
PyTorch tensors (dense, on any device) through ``array_api_compat.torch``, the
array API namespace that array-api-compat gives them; all through the same code.
``array_api_strict`` arrays (the standard's strict namespace, a test dependency)
run the same code too: what passes there uses nothing beyond the standard but
the few primitives below that the standard lacks (:func:`matmul_into`'s ``out=``,
:func:`walk`), each written once per backend here.
Core code asks ``be = backend.of(*objects)`` and then calls ``be.xp``,
``be.sparse`` and ``be.spla`` only.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import importlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from . import memory

__all__ = ["Backend", "of", "namespace", "is_sparse", "all_finite", "is_real_floating",
           "matmul_into",
           "outer_on_pattern", "over_time", "adopt", "walk", "matmul_out", "DENSE_ONLY",
           "kept_on", "kept_for",
           "take_rows",
           "subtract_rows", "itemsize", "like", "device", "take_columns", "spread_columns",
           "matmul_writer", "matmul_adder", "kind", "dtype_name", "stack_of", "astype",
           "contiguous", "block_matmul", "scaled_block_matmul", "outer_products",
           "indices", "eps", "to_host",
           "quiet", "erf",
           "is_matrix_like", "convert", "KINDS"]


@dataclass(frozen=True)
class Backend:
    """The array, sparse and sparse-linalg modules of one backend.

    Attributes
    ----------
    name : {"numpy", "cupy", "torch", "array_api_strict"}
        The backend's name, as declared by solvers in ``backends=``.
    xp : module
        ``numpy``, ``array_api_compat.cupy``, ``array_api_compat.torch`` or
        ``array_api_strict``: NumPy 2 is an array API namespace itself; CuPy's and
        PyTorch's come with array-api-compat's standard names.
    sparse : module
        ``scipy.sparse``, ``cupyx.scipy.sparse`` or, for PyTorch, the CSR tensors
        of :mod:`propop.torch_sparse` (the strict namespace: none, every
        ``issparse`` is false).
    """

    name: str
    xp: ModuleType
    sparse: ModuleType

    @property
    def spla(self) -> ModuleType:
        """``scipy.sparse.linalg`` or ``cupyx.scipy.sparse.linalg``, imported when first asked.

        Slow to import and needed only by the methods and views that use it.
        """
        if self.name not in ("numpy", "cupy"):  # no SciPy-like solvers there
            return _NoSparse
        return importlib.import_module(("scipy" if self.name == "numpy" else "cupyx.scipy")
                                       + ".sparse.linalg")

    def __reduce__(self) -> tuple:
        """Pickle by name (modules do not pickle): systems can be sent to MPI ranks."""
        return (_named, (self.name,))


class _NoSparse:
    """The sparse module of a backend without sparse arrays (the strict namespace)."""

    @staticmethod
    def issparse(_: Any) -> bool:
        return False


def _load(name: str) -> Backend:
    if name == "torch":  # tensors through the array API (array-api-compat), CSR tensors
        return Backend("torch", importlib.import_module("array_api_compat.torch"),
                       importlib.import_module("propop.torch_sparse").SPARSE)
    if name == "array_api_strict":
        return Backend(name, importlib.import_module(name), _NoSparse)
    if name == "numpy":
        return Backend("numpy", importlib.import_module("numpy"),
                       importlib.import_module("scipy.sparse"))
    return Backend("cupy", importlib.import_module("array_api_compat.cupy"),
                   importlib.import_module("cupyx.scipy.sparse"))


_CACHE: dict[str, Backend] = {}


# The extra that installs each backend's package.
EXTRAS = {"cupy": "gpu", "torch": "torch", "array_api_strict": "test"}


def _named(name: str) -> Backend:
    """The backend called ``name``, loaded once; a missing package names its extra."""
    loaded = _CACHE.get(name)
    if loaded is None:
        try:
            loaded = _CACHE[name] = _load(name)
        except ModuleNotFoundError as error:
            raise ModuleNotFoundError(f"the {name} backend needs {error.name}: pip install "
                                      f'"propop[{EXTRAS[name]}]"', name=error.name) from None
    return loaded


_TYPES: dict[type, str] = {}  # the backend of each array type seen, found once


def _name_of(obj: Any) -> str:
    kind = type(obj)
    if kind not in _TYPES:
        module = kind.__module__ or ""
        top = module.split(".")[0]
        _TYPES[kind] = getattr(kind, "propop_backend", None) or (  # propop's CSR tensors
            "cupy" if top in ("cupy", "cupyx") else
            top if top in ("torch", "array_api_strict") else "numpy")
    return _TYPES[kind]


_OF_TYPE: dict[type, Backend] = {}  # the backend of each array type, once loaded


def of(*objects: Any) -> Backend:
    """Return the backend that the given arrays (dense or sparse) live on.

    ``None`` entries are ignored. Mixing CPU and GPU arrays is an error.

    Examples
    --------
    >>> import numpy as np
    >>> of(np.zeros(3)).name
    'numpy'
    """
    if len(objects) == 1:  # the common case: one dictionary look-up
        found = _OF_TYPE.get(type(objects[0]))
        if found is None and objects[0] is not None:
            found = _OF_TYPE[type(objects[0])] = _named(_name_of(objects[0]))
        if found is not None:
            return found
    names = {_name_of(obj) for obj in objects if obj is not None}
    if len(names) > 1:
        raise TypeError(f"arrays live on different backends ({', '.join(sorted(names))}); "
                        "move them to one")
    return _named(names.pop() if names else "numpy")


def adopt(kind: type, name: str, xp: Any) -> Backend:
    """The backend ``name`` (namespace ``xp``, no sparse arrays) of arrays of type ``kind``.

    For array types of propop's own (the memory guard's shape-only arrays),
    which :func:`of` cannot tell by their module.
    """
    found = _OF_TYPE[kind] = Backend(name, xp, _NoSparse)
    return found


def namespace(*arrays: Any) -> ModuleType:
    """The array module of the arrays: ``numpy``, ``cupy`` or ``array_api_compat.torch``."""
    return of(*arrays).xp


def is_sparse(matrix: Any) -> bool:
    """Whether ``matrix`` is a sparse array or matrix of its backend."""
    return bool(of(matrix).sparse.issparse(matrix))


def matmul_writer(M: Any, plain: bool = False, accumulate: bool = False) -> Any:
    """``write(x, out=y)`` storing ``M @ x`` in ``y`` (or adding it), resolved once for ``M``.

    For loops that multiply by the same matrix at every step (one step's blocks,
    vectors or matrices): a NumPy ``M`` of float32 or float64 goes to BLAS itself
    (:func:`_blas_writer`, right in any layout), another dense ``M`` is the array
    module's ``matmul`` with ``M`` bound (written in place, no dispatch per call), a
    sparse one a product then a copy. ``plain``: the caller's promise of
    :func:`matmul_out` (every ``x`` and C-ordered ``y`` of ``M``'s dtype).
    ``accumulate=True``: ``y += M @ x``, one fused call where BLAS runs it. ``x``
    must not share memory with ``y`` (BLAS reads it while writing ``y``).
    """
    sparse = is_sparse(M)
    write = None if sparse else _blas_writer(M, accumulate)
    if write is not None:
        return write
    if accumulate:
        return functools.partial(_add_product, M)
    if sparse:
        return lambda x, out: matmul_into(out, M, x, sparse=True)
    return functools.partial(matmul_out(of(M).xp, plain), M)


_BLAS = {"float64": ("dgemv", "dgemm"), "float32": ("sgemv", "sgemm")}


@functools.cache
def _blas_routines() -> dict:
    """``{dtype: (gemv, gemm)}`` of SciPy's BLAS for NumPy's float64 and float32."""
    import numpy as np

    blas = importlib.import_module("scipy.linalg.blas")
    return {np.dtype(dtype): (getattr(blas, v), getattr(blas, m))
            for dtype, (v, m) in _BLAS.items()}


def _blas_writer(M: Any, accumulate: bool) -> Any:
    """:func:`matmul_writer` of a NumPy float32 or float64 ``M`` by SciPy's BLAS, or ``None``.

    ``gemv``/``gemm`` on the transposed views (:func:`_blas_into`), ``beta = 1`` to
    add: 0.3 us a call where ``np.dot(M, x, out=y)`` then ``y += ...`` take 1.0-1.6 us
    at 8 x 8 (the per-step cost of a sequential recurrence).
    """
    pair = _blas_routines().get(M.dtype) if type(M).__module__ == "numpy" and M.ndim == 2 \
        else None
    if pair is None:
        return None
    if not M.flags.c_contiguous and not M.flags.f_contiguous:
        M = M.copy()
    A, trans = (M, 0) if M.strides[0] < M.strides[1] else (M.T, 1)  # op(A) = M, A Fortran
    return functools.partial(_blas_into, pair, trans, 1.0 if accumulate else 0.0, M.shape, A)


def matmul_adder(matrices: Sequence[Any]) -> tuple[Any, Any]:
    """``(add, operands)``: ``add(A, x, out=y)`` adds ``M @ x`` into ``y``, ``A`` from ``operands``.

    For a loop over dense matrices of one dtype and shape, one per step (an MLP's
    layers), given as a sequence or as one ``(l, m, n)`` stack:
    ``operands`` walks ``matrices`` in the form ``add`` takes. NumPy's float32 and
    float64 go to BLAS (:func:`_blas_into`, ``beta = 1``: one call where ``dot`` then
    ``+=`` are two), each ``M`` as its transpose ``M^T`` (Fortran-ordered where ``M``
    is C-ordered; any other layout is copied by BLAS's wrapper, never wrong);
    other arrays are added through a product.
    """
    first = matrices[0]
    pair = _blas_routines().get(first.dtype) if type(first).__module__ == "numpy" else None
    if pair is None:
        return _add_product, walk(matrices)
    transposed = iter(matrices.transpose(0, 2, 1)) if getattr(matrices, "ndim", 0) == 3 else \
        (M.T for M in matrices)  # a stack's walk makes the views in C
    return functools.partial(_blas_into, pair, 1, 1.0, tuple(first.shape)), transposed


def _add_product(M: Any, x: Any, out: Any) -> Any:
    out += M @ x
    return out


def _blas_into(pair: tuple, trans: int, beta: float, shape: tuple, A: Any, x: Any,
               out: Any) -> Any:
    """``out = op(A) x + beta out`` by ``gemv`` (vectors, one column) or ``gemm`` (transposes).

    ``shape`` is ``op(A)``'s, ``(m, n)``. ``y^T = x^T M^T``: C-ordered blocks are
    Fortran-ordered there, so BLAS writes ``out`` itself and copies nothing
    (``beta = 0``: ``out`` is not read). Where it cannot write in place (an ``out`` of
    another layout or dtype) its result is copied in: never a silent miss. Shapes
    that do not match raise ``ValueError`` naming them (``gemv`` alone would read a
    longer vector's head).
    """
    ndim = out.ndim
    # a vector, or one column of 32 or more entries: gemv, the column given as it is
    # (f2py reads an (n, 1) array as the vector it holds and writes it in place; the
    # views out[:, 0], x[:, 0] cost more than gemv saves). One column by gemm costs
    # 1.0-1.2x gemv's call from 32 x 32 to 256 x 256 and 1.5-2.6x from 512 up; below 32
    # gemm's call on the transposes is the cheaper (0.51 against 0.63 us, one thread)
    if ndim == 1 or (shape[1] >= 32 and ndim == 2 and out.shape[1] == 1):
        if x.ndim != ndim or len(x) != shape[1] or len(out) != shape[0] or (
                ndim == 2 and x.shape[1] != 1):
            raise _mismatch(shape, x, out)
        try:
            result = pair[0](1.0, A, x, beta, out, 0, 1, 0, 1, trans, 1)
        except Exception as error:  # f2py's own error class: an x it cannot read
            raise _mismatch(shape, x, out) from error
        if result is not out:  # an out of another layout or dtype: the result copied in
            out[...] = result.reshape(out.shape)
        return out
    if ndim > 2:  # a stack of blocks: no single BLAS call
        product = (A.T if trans else A) @ x
        out[...] = out + product if beta else product
        return out
    c = out.T
    try:
        result = pair[1](1.0, x.T, A, beta, c, 0, 1 - trans, 1)
    except Exception as error:  # f2py's own error class: shapes BLAS refused
        raise _mismatch(shape, x, out) from error
    if result is not c:
        out[...] = result.T
    return out


def _mismatch(shape: tuple, x: Any, out: Any) -> ValueError:
    return ValueError(f"matmul of a {tuple(shape)} matrix and x of shape {tuple(x.shape)} "
                      f"into out of shape {tuple(out.shape)}: the shapes do not match")


def kind(dtype: Any) -> str:
    """NumPy's one-letter kind of a NumPy, CuPy or PyTorch dtype.

    ``"f"``, ``"c"``, ``"i"``, ``"u"`` or ``"b"``; ``"O"`` for anything else.
    """
    letter = getattr(dtype, "kind", None)
    if letter is not None:
        return letter
    if type(dtype).__module__.startswith("array_api_strict"):
        return kind(_numpy_dtype(dtype))
    if getattr(dtype, "is_complex", False):
        return "c"
    if getattr(dtype, "is_floating_point", False):
        return "f"
    name = str(dtype)
    return ("b" if name == "torch.bool" else "u" if name.startswith("torch.uint") else
            "i" if name.startswith("torch.int") else "O")


def is_real_floating(array: Any) -> bool:
    """Whether ``array`` has a real floating dtype (NumPy, CuPy or PyTorch)."""
    return kind(getattr(array, "dtype", None)) == "f"


def matmul_into(out: Any, M: Any, x: Any, sparse: bool | None = None) -> Any:
    """``out[...] = M @ x``, written in place where ``M`` is dense (no temporary).

    ``sparse`` says whether ``M`` is sparse, where the caller knows it already.
    """
    if sparse if sparse is not None else is_sparse(M):
        out[...] = M @ x
    else:
        matmul_out(of(out).xp)(M, x, out=out)
    return out


def block_matmul(A: Any, B: Any) -> Any:
    """``A @ B`` over stacks of blocks; NumPy's blocks of at most 2 x 2, entry by entry.

    NumPy's ``matmul`` loops over a stack one block at a time, some 20-40 ns a block
    whatever its size: more than the arithmetic of a 2 x 2 block. Each entry of the
    product, a sum of at most two products, is then a vector operation over the whole
    stack instead (measured, 80000 blocks of 2 x 2, one thread: 3.0 against 0.67 ms
    for products of blocks, 1.6 against 0.25 ms for products with vectors). Other
    arrays (one kernel launch on a GPU, where the entries would take several) and
    larger blocks go to ``@``; where a NumPy stack ``A`` ``(..., b, n, k)`` meets
    ``B`` ``(..., 1, k, m)`` shared over ``b``, a product per group of ``A``'s blocks
    laid one under another (:func:`_shared_product`).
    """
    if (type(A).__module__ != "numpy" or type(B).__module__ != "numpy" or min(A.ndim, B.ndim) < 2
            or max(A.ndim, B.ndim) < 3 or B.shape[-2] != A.shape[-1]):
        return A @ B
    import numpy as np

    lead = np.broadcast_shapes(A.shape[:-2], B.shape[:-2])
    out = np.empty(lead + (A.shape[-2], B.shape[-1]), dtype=np.result_type(A, B))
    return _block_matmul_into(A, B, out)


def scaled_block_matmul(A: Any, s: Any, B: Any) -> Any:
    """``(A diag(s)) B`` over stacks of blocks: :func:`block_matmul` of ``A * s[..., None, :]``.

    ``A`` ``(p, ..., n, k)``, ``s`` ``(p, ..., k)``, ``B`` ``(p, ..., k, m)``, their
    other leading axes broadcast (cyclic reduction's per-sample cores, scaled by the
    next position's slopes, times a shared core). NumPy's stacks are scaled a chunk
    of ``p`` at a time (:data:`SCALED_CHUNK` bytes of scaled blocks) into one buffer
    that stays in the cache, each chunk's product written into the result: the
    scaled blocks are never a whole new stack read back from memory (a stack of one
    chunk or less is scaled at once, as the expression does; measured, one
    thread, 128 pairs of 32 per-sample 32 x 32 blocks: 11.1 against 15.0 GFLOP/s;
    16 x 16 5.9 against 9.3; 64 x 64 16.6 against 23.5; 8 x 8 4.7 against 5.2).
    Other arrays and shapes: the one expression.
    """
    if (type(A).__module__ != "numpy" or type(s).__module__ != "numpy"
            or type(B).__module__ != "numpy" or not A.ndim == B.ndim == s.ndim + 1 >= 3
            or not A.shape[0] == B.shape[0] == s.shape[0] or B.shape[-2] != A.shape[-1]
            or max(A.nbytes, s.nbytes * A.shape[-2]) <= SCALED_CHUNK):  # one chunk: at once
        return block_matmul(A * s[..., None, :], B)
    import numpy as np

    # the scaled blocks' shape after the first axis (a shape that does not broadcast is
    # the product's own error)
    scaled = tuple(map(max, A.shape[1:], s.shape[1:-1] + (1,) + s.shape[-1:]))
    step = max(1, SCALED_CHUNK // (math.prod(scaled) * max(A.itemsize, s.itemsize) or 1))
    p = A.shape[0]
    buffer = np.empty((min(step, p),) + scaled, dtype=np.result_type(A, s))
    out = None
    for start in range(0, p, step):
        part = slice(start, min(start + step, p))
        left = np.multiply(A[part], s[part][..., None, :], out=buffer[:part.stop - start])
        if out is None:  # made after the first scaling, whose ufunc buffers are then freed
            lead = tuple(map(max, scaled[:-2], B.shape[1:-2]))
            out = np.empty((p,) + lead + (A.shape[-2], B.shape[-1]),
                           dtype=np.result_type(buffer, B))
        _block_matmul_into(left, B[part], out[part])
    return out


# Scaled blocks a chunk of scaled_block_matmul holds: 256 KB to 4 MB read alike (within
# 5%) at blocks of 8 to 64 with 8 and 32 samples, one thread, an AMD EPYC; a whole stack
# at once read 10-40% slower (the scaled stack written out and read back)
SCALED_CHUNK = 1 << 20


def _block_matmul_into(A: Any, B: Any, out: Any) -> Any:
    """:func:`block_matmul` of NumPy stacks into ``out``, C-ordered, of the product's shape.

    A shared right block writes ``out`` seen as rows: a view (``copy=False``), or
    NumPy's ``ValueError`` for an ``out`` it cannot view so, never a copy written.
    """
    import numpy as np

    if max(A.shape[-2:] + B.shape[-1:]) > 2:
        if _right_is_shared(A, B):
            _shared_product(A, B[..., 0, :, :], out)
        else:
            np.matmul(A, B, out=out)
        return out
    lead = out.shape[:-2]
    A, B = (M.reshape((1,) * (len(lead) + 2 - M.ndim) + M.shape) for M in (A, B))
    step = max(1, BLOCK_CHUNK // max(1, math.prod(lead[1:])))  # along the first axis
    for start in range(0, lead[0], step):
        part = slice(start, start + step)
        _entries(A[part] if len(A) > 1 else A, B[part] if len(B) > 1 else B, out[part])
    return out


# Blocks of at most 2 x 2 multiplied a chunk at a time: an entry's vector reads every
# fourth number of its stack, and a chunk's passes stay in the cache. One thread, an
# Intel Xeon: 5000 x 16 blocks of a level's pairs (every other block) 2.9 against 1.5
# ms, 160000 blocks times vectors 1.75 against 0.87 ms; 4096 and 16384 blocks a chunk
# read 5-25% slower, 1024 50% (each entry's passes cost more calls)
BLOCK_CHUNK = 8192


def _entries(A: Any, B: Any, out: Any) -> None:
    """``out = A @ B`` over stacks of blocks, each entry a sum of vector products."""
    import numpy as np

    for i in range(A.shape[-2]):
        for j in range(B.shape[-1]):
            entry = out[..., i, j]
            np.multiply(A[..., i, 0], B[..., 0, j], out=entry)
            for k in range(1, A.shape[-1]):
                entry += A[..., i, k] * B[..., k, j]


def _right_is_shared(A: Any, B: Any) -> bool:
    """Whether ``B`` ``(..., 1, k, m)`` is shared over the ``b > 1`` blocks of ``A``.

    ``A`` ``(..., b, n, k)`` over the same leading axes, its blocks one under another
    in memory (a NumPy stack: a reshape of it copies nothing).
    """
    return (A.ndim == B.ndim >= 3 and A.shape[-3] > 1 and B.shape[-3] == 1
            and A.shape[:-3] == B.shape[:-3]
            and A.strides[-3] == A.shape[-2] * A.strides[-2])


def _shared_product(A: Any, M: Any, out: Any) -> None:
    """``out = A @ M``: ``A`` ``(..., b, n, k)``, one block ``M`` ``(..., k, m)`` for all ``b``.

    ``matmul`` broadcasting ``M`` calls BLAS once per ``n x k`` block; blocks laid one
    under another are one ``(g n) x k`` product with ``M`` instead, ``g`` of them a
    product, as many as keep ``g n k m`` within :data:`SHARED_ROWS_MNK` (a last group of
    ``b mod g`` blocks its own product). Measured, one thread, 128 pairs of 32 blocks
    of 32 x 32: 43.6 GFLOP/s at ``g = 4``, 38.8 at ``g = 1``, 22.9 at ``g = 32`` on an
    Intel Xeon with AVX-512; on an AMD EPYC 512 pairs of 32 blocks of 8 x 8 13.6 at
    ``g = 1`` against 24.1 at ``g = 32``. :func:`_right_is_shared` says when.
    """
    import numpy as np

    b, n, k = A.shape[-3:]
    g = max(1, min(b, SHARED_ROWS_MNK // max(1, n * k * M.shape[-1])))  # empty blocks: all
    whole = b - b % g
    for start, stop, size in ((0, whole, g), (whole, b, b - whole)):
        if stop > start:  # blocks start..stop-1 as groups of `size`, one under another
            rows = A[..., start:stop, :, :].reshape(
                A.shape[:-3] + ((stop - start) // size, size * n, k))
            np.matmul(rows, M[..., None, :, :], out=np.reshape(
                out[..., start:stop, :, :], rows.shape[:-1] + M.shape[-1:], copy=False))


# The most multiply-adds (M N K) of one product of shared_product's groups. OpenBLAS
# multiplies products of up to 100^3 by its small-matrix kernels where it has them
# (AVX-512), without packing; larger ones pay the packing, which at N = K = 32 halves
# the rate (one thread, an Intel Xeon: 41-44 GFLOP/s up to 2^19, 23 at 2^20)
SHARED_ROWS_MNK = 1 << 19


def matmul_out(xp: ModuleType, plain: bool = False) -> Any:
    """``matmul(M, x, out=y)`` of namespace ``xp``, written in place.

    Through ``y[...] =`` where the namespace has no ``out=`` (the array API
    standard has none). ``plain=True`` is the caller's promise that every call
    multiplies a matrix by a vector or matrix of its own dtype into a C-ordered
    ``out`` of that dtype: NumPy's ``dot`` is then returned itself, without the
    wrapper that checks each call (half of the call's cost on small blocks).
    """
    name = getattr(xp, "__name__", "")
    if name == "array_api_strict":
        return _matmul_by_setitem
    if name == "array_api_compat.cupy":  # CuPy's own matmul takes out=
        return importlib.import_module("cupy").matmul
    if name == "numpy":
        return xp.dot if plain else _dot_or_matmul(xp)
    return xp.matmul


def _dot_or_matmul(np: ModuleType) -> Any:
    """NumPy's ``dot`` where it computes ``matmul`` (2-D, and an ``out`` it accepts).

    ``dot`` costs half of ``matmul``'s call on small blocks (0.9 against 1.7 us at
    8 x 8), which a loop over thousands of narrow layers pays at every step;
    stacks and mixed dtypes go to ``matmul``, steps of one column ``(tau, n, 1)`` to
    one ``matmul`` of ``(tau, n)`` rows (2.85 against 0.61 ms at 65536 steps of 8).
    """
    dot, matmul = np.dot, np.matmul

    def product(M: Any, x: Any, out: Any) -> Any:
        if M.ndim == 2 and x.ndim <= 2:
            try:
                return dot(M, x, out=out)
            except ValueError:  # an out= dot refuses (strided, or of another dtype)
                pass
        elif M.ndim == 2 and x.ndim == 3 and x.shape[2] == 1:  # steps of one column
            matmul(x[..., 0], M.T, out=out[..., 0])  # one GEMM, not a product a step
            return out
        return matmul(M, x, out=out)

    return product


def _matmul_by_setitem(M: Any, x: Any, out: Any) -> Any:
    out[...] = M @ x
    return out


def walk(array: Any, reverse: bool = False) -> Any:
    """The views ``array[i]`` along the first axis, last first if ``reverse``, made as reached.

    An iterator, as ``iter(array)`` (a list or tuple walks its items); PyTorch
    tensors have no negative strides, so their reversed walk indexes instead of
    slicing ``[::-1]``.
    """
    if isinstance(array, (list, tuple, range)):
        return reversed(array) if reverse else iter(array)
    name = _name_of(array)
    if name == "array_api_strict":  # no iteration: views by index, all axes named
        n = array.shape[0]
        return (array[i, ...] for i in (range(n - 1, -1, -1) if reverse else range(n)))
    if not reverse:
        return iter(array)
    if name == "torch":
        return map(array.__getitem__, range(len(array) - 1, -1, -1))
    return iter(array[::-1])


def unstack(array: Any) -> tuple:
    """The views ``array[i]`` along the first axis: the standard's ``unstack``, cheaper.

    NumPy's moves the axis first (17 views of a small stack: 4.7 against 1.3 us).
    """
    return tuple(walk(array))


def device(array: Any) -> Any:
    """The device ``array`` lives on, to make new arrays there (``xp.zeros(..., device=)``).

    The standard's ``array.device`` (NumPy 2: ``"cpu"``); ``None`` for an object
    without one (the memory guard's shape-only arrays).
    """
    try:
        return getattr(array, "device", None)
    except NotImplementedError:  # a cupyx.scipy.sparse matrix: CuPy's current device
        return None


def like(values: Any, array: Any) -> Any:
    """``values`` (host numbers, a NumPy array) as an array of ``array``'s backend and device.

    Reads the device of PyTorch's tensors only: a ``cupyx.scipy.sparse`` matrix raises
    ``NotImplementedError`` for its ``device``, and CuPy makes arrays on its current one.
    """
    if _name_of(array) == "torch":
        return of(array).xp.asarray(values, device=array.device)
    return of(array).xp.asarray(values)


def matrix_on(M: Any, array: Any) -> Any:
    """The shared matrix ``M`` (dense or sparse, any backend) on ``array``'s backend and device.

    ``M`` itself where it is there already; a sparse one stays sparse on CuPy
    (``cupyx.scipy.sparse``) and PyTorch (:class:`~propop.torch_sparse.CSRTensor`)
    and is expanded on the strict namespace, which has no sparse arrays; in
    ``array``'s dtype. For a layer's fixed structure (a selection, a
    concatenation's placement, a sum's identity), made on the host.
    """
    kind = _name_of(array)
    if _name_of(M) == kind and (kind != "torch" or M.device == array.device):
        return M
    host = to_host(M)
    if kind in DENSE_ONLY and is_sparse(host):
        rows, cols = host.shape
        memory.require(rows * cols * itemsize(array.dtype), f"a sparse {rows} x {cols} matrix "
                       f"(a layer's structure) as a dense {kind} array",
                       "keep the network on 'numpy', 'cupy' or 'torch', which have sparse "
                       "arrays")
        host = host.toarray()
    return astype(convert(host, kind, getattr(array, "device", None)), array.dtype)


def kept_on(owner: Any, name: str, host: Any, array: Any) -> Any:
    """``host``, a fixed array made on the host, on ``array``'s backend, device and dtype.

    An index array (a gather's rows, :func:`like`) or a structural matrix (a sum's, a
    selection's: :func:`matrix_on`, in ``array``'s dtype) that ``owner`` (a layer, a
    layout) reads at every call, copied there once and kept in ``owner`` while
    ``host`` is the same object: on a GPU a copy made at every call is a transfer and
    a synchronisation. ``name`` tells the owner's arrays apart.
    """
    kept = owner.__dict__.setdefault("_kept_on", {})  # a layer's to() copies share it
    key = (name, _name_of(array), str(device(array)), str(array.dtype))
    hit = kept.get(key)
    if hit is None or hit[0] is not host:
        moved = matrix_on(host, array) if is_sparse(host) or is_real_floating(host) \
            else like(host, array)
        hit = kept[key] = (host, moved)
    return hit[1]


# (key, backend, device) -> an index array there, a function of the key alone: the last
# 256 kept (a system's layout is made at every call, its indices are the same each time)
_KEPT_FOR: collections.OrderedDict = collections.OrderedDict()


def kept_for(key: tuple, host: Callable[[], Any], array: Any) -> Any:
    """``host()``, a host index array that ``key`` alone decides, on ``array``'s device.

    Made and copied there once per key, backend and device (the last 256 kept): the
    indices of a layout that every call's system rebuilds, which on a GPU would be a
    transfer and a synchronisation each time.
    """
    full = (key, _name_of(array), str(device(array)))
    index = _KEPT_FOR.pop(full, None)
    if index is None:
        index = like(host(), array)
    _KEPT_FOR[full] = index
    if len(_KEPT_FOR) > 256:
        _KEPT_FOR.popitem(last=False)
    return index


def take_rows(array: Any, index: Any) -> Any:
    """``array[index]`` for an integer array ``index`` of any shape over the first axis."""
    if _name_of(array) != "array_api_strict":
        return array[index]
    xp = of(array).xp  # the standard's gather: take along an axis with a 1-D index
    flat = xp.take(array, xp.reshape(index, (-1,)), axis=0)
    return xp.reshape(flat, tuple(index.shape) + tuple(array.shape[1:]))


def take_columns(array: Any, index: Any) -> Any:
    """``array[:, index]`` for an integer array ``index`` of the array's backend."""
    return of(array).xp.take(array, index, axis=1)


def spread_columns(part: Any, index: Any, columns: int) -> Any:
    """An array of ``columns`` columns with ``part``'s at the host integers ``index``, else 0.

    The standard's scatter is a product with the ``(k, columns)`` selection matrix.
    """
    import numpy

    select = numpy.zeros((len(index), columns))
    select[numpy.arange(len(index)), index] = 1
    return part @ of(part).xp.astype(like(select, part), part.dtype)


def subtract_rows(out: Any, index: Any, values: Any) -> Any:
    """``out[index] -= values`` in place, ``index`` an integer array with no entry twice.

    The standard has no scatter: there it is one slice per row of ``index`` whose
    entries are consecutive (a block's), else one entry at a time.
    """
    if _name_of(out) != "array_api_strict":
        out[index] -= values
        return out
    xp, host = of(out).xp, to_host(index)
    if host.ndim == 2 and (host == host[:, :1] + importlib.import_module("numpy").arange(
            host.shape[1])).all():
        for i, start in enumerate(host[:, 0].tolist()):
            out[start:start + host.shape[1], ...] -= values[i, ...]
        return out
    rows = host.reshape(-1)
    flat = xp.reshape(values, (len(rows),) + tuple(values.shape[index.ndim:]))
    for i, row in enumerate(rows):
        out[int(row), ...] -= flat[i, ...]
    return out


_LIMITS: dict[tuple[type, Any], tuple[float, float, tuple[float, float], int]] = {}


def eps(dtype: Any) -> float:
    """The machine epsilon of a floating ``dtype`` (NumPy, CuPy or PyTorch), looked up once.

    Remembered by the dtype's type and the dtype: dtypes of two libraries are never
    compared (their types differ first; the strict namespace warns where they are),
    and no name is formatted (``str`` of a NumPy dtype costs 5 us a call).
    """
    return _limits(dtype)[0]


def safe_norms(dtype: Any) -> tuple[float, float]:
    """``(low, high)``: the norms whose sums of squares ``dtype`` holds to its precision.

    ``low = sqrt(tiny / eps)`` (``1e-146`` in float64, ``3e-16`` in float32), ``high =
    1 / low`` (under ``sqrt`` of the largest float); looked up once (see :func:`eps`).
    """
    return _limits(dtype)[2]


def binary_exponents(largest: Any, dtype: Any) -> Any:
    """The exponents ``e`` of ``largest`` (host numbers) as ``largest = m 2^e``, ``m < 1``.

    Clipped so that ``2^-e`` and ``2^e`` are normal numbers of ``dtype``: scaling an
    array of ``dtype`` by ``2^-e`` is exact, and brings its largest entry near one
    (zeros give ``e = 1``). What :func:`norm` and the convergence checks' norms scale by.
    """
    import numpy as np

    bound = _limits(dtype)[3]
    return np.clip(np.frexp(np.where(np.asarray(largest) > 0, largest, 1.0))[1], -bound, bound)


def tiny(dtype: Any) -> float:
    """The smallest positive normal number of a floating ``dtype``, looked up once.

    The floor of a norm that divides, in the array's own dtype: ``1e-300`` is zero in
    float32 (``1.2e-38`` is its ``tiny``), and a zero over it is NaN.
    """
    return _limits(dtype)[1]


def _limits(dtype: Any) -> tuple[float, float, tuple[float, float], int]:
    """``(eps, tiny, safe norms, exponent bound)`` of ``dtype``, remembered (see :func:`eps`)."""
    key = (type(dtype), dtype)
    if key not in _LIMITS:
        if getattr(dtype, "is_floating_point", None) is not None:  # a torch.dtype
            info = importlib.import_module("torch").finfo(dtype)
        else:
            info = importlib.import_module("numpy").finfo(_numpy_dtype(dtype))
        unit, smallest = float(info.eps), float(info.tiny)
        low = math.sqrt(smallest / unit)
        bound = int(math.log2(1 / smallest)) - 1  # 2^bound stays a normal number
        _LIMITS[key] = (unit, smallest, (low, 1.0 / low), bound)
    return _LIMITS[key]


def itemsize(dtype: Any) -> int:
    """Bytes per entry of ``dtype`` (NumPy, CuPy, PyTorch or the strict namespace's)."""
    size = getattr(dtype, "itemsize", None)
    return int(size) if size is not None else int(_numpy_dtype(dtype).itemsize)


def dtype_name(dtype: Any) -> str:
    """A dtype's name, ``"float64"``, for NumPy's, PyTorch's and the strict namespace's."""
    return str(dtype).rpartition(".")[2]


def _numpy_dtype(dtype: Any) -> Any:
    """NumPy's dtype of the same name (a strict namespace's dtype is its own object)."""
    if type(dtype).__module__.startswith("array_api_strict"):
        return importlib.import_module("numpy").dtype(str(dtype).rpartition(".")[2])
    return dtype


def astype(array: Any, dtype: Any) -> Any:
    """``array`` in ``dtype``, itself where it already is (NumPy, CuPy or PyTorch)."""
    if array.dtype == dtype:
        return array
    name = _name_of(array)
    if name == "array_api_strict":
        return of(array).xp.astype(array, dtype)
    return array.to(dtype) if name == "torch" else array.astype(dtype)


def stack_of(arrays: Sequence[Any]) -> Any:
    """The C-ordered stack whose entries ``arrays`` are, in order, or ``None``.

    ``arrays[k]`` must be the view ``stack[k]`` (NumPy's ``base``, PyTorch's
    ``_base``, and the data pointer and strides of that entry): then the stack
    *is* the arrays' memory, never a stale copy of it. Other namespaces: ``None``.
    """
    name = _name_of(arrays[0])
    if name not in ("numpy", "torch"):
        return None
    base = _layout(arrays[0], name)[0]
    if base is None or base.ndim != arrays[0].ndim + 1 or base.shape[0] != len(arrays):
        return None
    _, start, steps, contiguous_ = _layout(base, name)
    if not contiguous_:
        return None
    for k, a in enumerate(arrays):
        owner, address, own_steps, _ = _layout(a, name)
        if owner is not base or address != start + k * steps[0] or \
                own_steps != steps[1:] or tuple(a.shape) != tuple(base.shape[1:]):
            return None
    return base


def _layout(a: Any, name: str) -> tuple:
    """``(base, address, strides in bytes, C-contiguous)`` of a NumPy array or tensor."""
    if name == "numpy":
        return a.base, a.__array_interface__["data"][0], a.strides, a.flags.c_contiguous
    size = a.element_size()
    return (a._base, a.data_ptr(), tuple(size * k for k in a.stride()), a.is_contiguous())


def contiguous(array: Any) -> Any:
    """``array`` in C order (row-major), itself where it already is: BLAS's fast layout."""
    name = _name_of(array)
    if name == "torch":
        return array.contiguous()
    if name == "array_api_strict":  # no memory layout in the standard
        return array
    return of(array).xp.ascontiguousarray(array)


def indices(values: Any, like: Any) -> Any:
    """The integers ``values`` as an index array on the device of the array ``like``."""
    be = of(like)
    if be.name == "torch":
        return be.xp.asarray(values, device=like.device)
    return be.xp.asarray(values)


def is_matrix_like(obj: Any) -> bool:
    """Whether ``obj`` is a NumPy array or a ``scipy.sparse`` matrix (a plain matrix)."""
    import numpy
    import scipy.sparse

    return scipy.sparse.issparse(obj) or isinstance(obj, numpy.ndarray)


KINDS = ("numpy", "torch", "cupy", "array_api_strict")
DENSE_ONLY = ("array_api_strict",)  # backends without sparse arrays


def convert(array: Any, kind: str, device: Any = None) -> Any:
    """``array`` (dense or sparse) on backend ``kind``; ``None`` stays ``None``.

    ``device`` is a PyTorch device (``"cuda"``, say) for ``kind="torch"``; CuPy
    arrays live on the current CUDA device. Sparse arrays move between
    ``scipy.sparse``, ``cupyx.scipy.sparse`` and PyTorch's CSR tensors
    (:class:`~propop.torch_sparse.CSRTensor`); the strict namespace has no sparse
    arrays.
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if array is None:
        return None
    host = to_host(array)  # dense or sparse: CuPy's .get() serves both
    if kind == "numpy":
        return host
    if is_sparse(host):
        if kind in DENSE_ONLY:
            raise TypeError(f"{kind} is dense here: a network or system with sparse "
                            "weights moves to 'numpy', 'cupy' or 'torch' only")
        if kind == "torch":
            return _named("torch").sparse.csr_matrix(host, device=device)
        return _named("cupy").sparse.csr_matrix(host)
    if kind == "array_api_strict":
        return _named(kind).xp.asarray(host)
    if kind == "cupy":
        return _named("cupy").xp.asarray(host)
    return _named("torch").xp.asarray(host, device=device)


def torch_device(kind: str, device: Any = None) -> Any:
    """The PyTorch device that computes for arrays of backend ``kind``.

    ``device`` for PyTorch's own; CuPy's current CUDA device; else the CPU.
    """
    import torch

    if kind == "cupy":
        _named("cupy")  # a missing CuPy names its extra
        return torch.device("cuda", importlib.import_module("cupy").cuda.Device().id)
    return torch.device(device or "cpu") if kind == "torch" else torch.device("cpu")


def to_torch(array: Any, dtype: Any, device: Any) -> Any:
    """``array`` of any backend as a PyTorch tensor of ``dtype`` on ``device``.

    CuPy's arrays by DLPack (no copy on their device), the strict namespace's
    through the host; a view with a negative stride (a reversed time order, say),
    which PyTorch cannot describe, as a copy.
    """
    import torch

    name = _name_of(array)
    if any(stride < 0 for stride in getattr(array, "strides", ())):
        array = array.copy()
    if name == "cupy":
        return torch.from_dlpack(array).to(dtype=dtype, device=device)
    return torch.as_tensor(to_host(array) if name == "array_api_strict" else array,
                           dtype=dtype, device=device)


def from_torch(tensor: Any, kind: str) -> Any:
    """A PyTorch tensor as an array of backend ``kind`` (to CuPy by DLPack, no copy)."""
    if kind == "torch":
        return tensor
    if kind == "cupy":
        return importlib.import_module("cupy").from_dlpack(tensor.detach())
    host = tensor.detach().cpu().numpy()
    return host if kind == "numpy" else convert(host, kind)


def dense(array: Any) -> Any:
    """``array`` as a dense array of its backend (sparse arrays expanded)."""
    return array.toarray() if is_sparse(array) else array


def to_host(array: Any) -> Any:
    """Return ``array`` as a NumPy array (a no-op for NumPy input)."""
    name = _name_of(array)
    if name == "torch":  # a CSR tensor as SciPy's CSR array
        return array.to_host() if is_sparse(array) else array.detach().cpu().numpy()
    if name == "array_api_strict":
        return importlib.import_module("numpy").asarray(array)
    return array.get() if name == "cupy" else array


def erf(x: Any) -> Any:
    """The error function, elementwise, from the special functions of ``x``'s backend."""
    name = _name_of(x)
    if name == "torch":
        import torch

        return torch.special.erf(x)
    module = "cupyx.scipy.special" if name == "cupy" else "scipy.special"
    if name == "array_api_strict":  # the standard has no erf: SciPy's, on the host
        return like(importlib.import_module(module).erf(to_host(x)), x)
    return importlib.import_module(module).erf(x)


def norms(A: Any) -> Any:
    """Euclidean norms over the last axis of ``A``, an array of its backend.

    ``einsum`` where the namespace has one: NumPy's ``vector_norm`` over a short last
    axis is 5x slower (160000 pairs: 4.9 against 0.9 ms); the standard's elsewhere.
    Neither scales against overflow.
    """
    xp = namespace(A)
    if hasattr(xp, "einsum"):
        return xp.sqrt(xp.einsum("...i,...i->...", A, A))
    return xp.linalg.vector_norm(A, axis=-1)


def norm(a: Any) -> float:
    """The Euclidean norm of all of ``a``'s entries, as a host float.

    NumPy's ``vector_norm`` of 10000 x 8 entries takes 80 us, 297 for a strided
    view (one thread, an Intel Xeon): a contiguous array here is one ``dot`` of
    itself (20 us), a strided one one ``einsum`` over its axes, with no copy (110
    us). Other backends: the standard's ``vector_norm``. Where the squares under- or
    overflow (a norm below ``sqrt(tiny / eps)`` of the dtype or above its inverse: a
    layer of ``1e-277`` read as norm zero), the norm is taken again of ``a`` scaled by
    the power of two of its largest entry (one reduction, only then).
    """
    value = _fast_norm(a)
    low, high = safe_norms(a.dtype)
    if low <= value <= high or math.isnan(value) or math.prod(a.shape) == 0:
        return value
    xp = namespace(a)
    largest = float(xp.max(xp.abs(a)))
    if largest == 0 or not math.isfinite(largest):
        return value
    exponent = int(binary_exponents(largest, a.dtype))
    return _fast_norm(a * math.ldexp(1.0, -exponent)) * math.ldexp(1.0, exponent)


def _fast_norm(a: Any) -> float:
    """``sqrt`` of the sum of squares of ``a``'s entries, unscaled (see :func:`norm`)."""
    import numpy as np

    if not isinstance(a, np.ndarray):
        return float(namespace(a).linalg.vector_norm(a))
    with np.errstate(over="ignore", under="ignore"):  # the caller rescales
        if a.flags.c_contiguous:
            flat = a.reshape(-1)
            return math.sqrt(float(np.dot(flat, flat)))
        axes = list(range(a.ndim))
        return math.sqrt(float(np.einsum(a, axes, a, axes, [])))


def all_finite(a: Any, xp: Any = None) -> bool:
    """Whether every entry of ``a`` is finite: one sum first, each entry only if it is not.

    NaN and Inf survive a sum, and a sum makes no array of flags (PyTorch's
    ``isfinite`` on the CPU costs ten times a sum); a sum of large finite values
    can overflow, and then the entries decide. A small NumPy array's entries are
    read at once (:data:`SMALL_FINITE`). ``xp`` is ``a``'s namespace (found if not
    given; the shape-only arrays of the memory guard give theirs).
    """
    if type(a).__module__ == "numpy" and a.size < SMALL_FINITE and a.dtype.kind in "biufc":
        import numpy  # a small array's flags: no floating-point state to enter

        return bool(a.dtype.kind in "biu" or numpy.isfinite(a).all())
    xp = namespace(a) if xp is None else xp
    with quiet(xp):
        if math.isfinite(float(xp.sum(a))):
            return True
    return bool(xp.all(xp.isfinite(a)))


# Below this many entries a NumPy array's flags cost less than the sum's floating-point
# state (0.9 against 3.0 us at 256 entries, 2.1 against 4.3 at 8192; equal near 2^18)
SMALL_FINITE = 1 << 16


def quiet(xp: ModuleType) -> contextlib.AbstractContextManager:
    """Silence NumPy's floating-point warnings where they are expected and handled.

    A namespace without ``errstate`` gets NumPy's: the strict namespace computes with
    NumPy underneath, and elsewhere it changes nothing.
    """
    errstate = getattr(xp, "errstate", None) or importlib.import_module("numpy").errstate
    return errstate(divide="ignore", invalid="ignore", over="ignore")


def outer_products(V: Any, Z: Any) -> Any:
    """``V[k] Z[k]^T`` for every ``k``: stacks of vectors ``(l, m)``, ``(l, n)`` -> ``(l, m, n)``.

    NumPy's ``einsum`` writes each product in one pass, where broadcasting
    ``V[:, :, None] * Z[:, None, :]`` (every other namespace's form) walks two
    broadcast operands: one thread, l = 1024 blocks of 8 x 8 118 against 160 us,
    of 32 x 32 0.92 against 2.1 ms, 256 of 32 x 32 326 against 451 us, 64 of
    128 x 128 alike.
    """
    if type(V).__module__ == "numpy" and type(Z).__module__ == "numpy":
        import numpy as np

        return np.einsum("ki,kj->kij", V, Z)
    return V[:, :, None] * Z[:, None, :]


def outer_on_pattern(Wk: Any, vk: Any, zk: Any) -> Any:
    """``sum_i v_i z_i^T`` over samples, on the pattern of ``Wk`` if it is sparse.

    On a pattern, one sample's entries are gathered products; with several samples
    either each stored entry's row of ``v`` and of ``z`` is gathered and their
    products summed (``nnz x r`` temporaries), or, for a pattern of at least 1/64 of
    a matrix of at most ``2^22`` entries whose gathered temporaries would hold
    ``2^18`` products or more, the dense product ``v z^T`` is read at the pattern
    (one GEMM). Measured in backpropagation, one thread: 16 layers of 512 x 512 at
    density 0.05, 32 samples, 45-46 against 21-23 ms; an RNN of 256 at density 0.05,
    4 samples, 1000 steps (the steps are the columns) 123-124 against 81-86 ms. Below
    ``2^18`` products the gathers' temporaries are the smaller fresh memory (64 layers
    of 256 x 256 at density 0.05: 3145 page faults a call gathering, 6380 with
    ``v z^T``, and 4% slower).
    """
    be = of(Wk)
    if not be.sparse.issparse(Wk):
        return vk[:, None] * zk[None, :] if vk.ndim == 1 else vk @ zk.T
    rows = be.xp.repeat(be.xp.arange(Wk.shape[0], device=device(Wk.indptr)),
                        be.xp.diff(Wk.indptr))
    size = Wk.shape[0] * Wk.shape[1]
    if vk.ndim == 2 and 64 * Wk.nnz >= size and size <= 2**22 and \
            Wk.nnz * vk.shape[1] >= 2**18:
        data = (vk @ zk.T)[rows, Wk.indices]
    else:
        products = vk[rows] * zk[Wk.indices]
        data = products if vk.ndim == 1 else products.sum(axis=1)
    return type(Wk)((data, be.xp.asarray(Wk.indices, copy=True),
                     be.xp.asarray(Wk.indptr, copy=True)), shape=Wk.shape)


def over_time(M: Any, Z: Any) -> Any:
    """``M @ Z[s]`` for every time step ``s`` as one product; ``Z`` is ``(tau, n, ...)``.

    A dense ``M`` broadcasts over the steps (one batched ``matmul``; one GEMM
    ``Z M^T`` for vectors, and for one sample kept as a column: 0.43 against 0.08 ms
    at 10000 steps of 8, NumPy's batched product being one small product a step),
    with no transposed copy of ``Z``; a sparse one multiplies the steps laid side by
    side.
    """
    xp = namespace(Z)
    if not is_sparse(M):
        if Z.ndim == 3 and Z.shape[2] == 1:
            return (Z[..., 0] @ M.T)[..., None]
        return M @ Z if Z.ndim == 3 else Z @ M.T
    tau, n = Z.shape[:2]
    flat = xp.moveaxis(Z, 0, 1).reshape(n, -1)
    return xp.moveaxis(xp.asarray(M @ flat).reshape((M.shape[0], tau) + Z.shape[2:]), 1, 0)
