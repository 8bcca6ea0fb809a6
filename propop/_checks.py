"""Input checks whose messages name the culprit (layer, block, argument).

Every array that enters propop passes :func:`real_array` or :func:`canonical_matrix`
once, at the front door (networks, layers, systems, losses): lists and integer
or boolean arrays become the working floating type, complex, object and string
arrays are refused, and sparse matrices of any SciPy format or class become
canonical CSR arrays (duplicates summed, indices sorted).
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any

import numpy as np

from . import backend

__all__ = ["require_finite", "require_shape", "require_density", "require_samples",
           "real_array", "canonical_matrix", "as_coupling", "worst", "positive_int",
           "positive_sizes", "float_dtype", "real_number"]


def worst(values: Any) -> float:
    """The largest of ``values`` as a float, NaN if any is NaN (Python's ``max`` drops it).

    Every convergence measure is a maximum over layers, steps or samples: a NaN
    among them must fail the test ``measure <= rtol``, never pass it unseen.
    """
    values = [float(v) for v in values]
    if any(v != v for v in values):
        return float("nan")
    return max(values, default=0.0)


def real_array(a: Any, what: str, dtype: Any = None) -> Any:
    """``a`` as a real floating array of its backend, or ``ValueError`` naming ``what``.

    Lists, integers and booleans become ``dtype`` (default: ``a``'s own floating
    type, else float64); complex numbers are refused, not silently truncated, and
    so are object and string arrays. Finiteness is checked separately.
    """
    if backend.is_sparse(a):
        raise ValueError(f"{what} is a sparse matrix; a dense array is expected here")
    if dtype is not None and _family(dtype) != _array_family(a):
        wanted = _family(dtype)
        raise ValueError(f"{what} is a {type(a).__module__}.{type(a).__name__}, but the arrays "
                         f"it meets are {_FAMILIES[wanted]}: pass it as one "
                         f"(propop.backend.convert({what}, {wanted!r}))")
    if getattr(a, "requires_grad", False):  # a torch.nn.Parameter: its data, same storage
        a = a.detach()
    xp = backend.namespace(a) if hasattr(a, "dtype") else np
    try:
        array = xp.asarray(a)
    except (ValueError, TypeError) as error:
        raise ValueError(f"{what} is not a rectangular array of numbers: {error}") from None
    kind = backend.kind(array.dtype)
    if kind == "c":
        raise ValueError(f"{what} has complex dtype {array.dtype}; propop works in real "
                         "arithmetic: pass the real part explicitly if that is what you mean")
    if kind not in "fiub":
        raise ValueError(f"{what} has dtype {array.dtype}, expected real numbers")
    if dtype is not None:
        return backend.astype(array, dtype)
    return array if kind == "f" else backend.astype(array, xp.float64)


# The backends whose dtypes tell them apart (CuPy's are NumPy's: mixed arrays of those two
# are named where they meet, by backend.of)
_FAMILIES = {"numpy": "NumPy arrays", "torch": "PyTorch tensors",
             "array_api_strict": "array_api_strict arrays"}


def _family(dtype: Any) -> str:
    """The backend whose arrays have ``dtype`` (``"numpy"`` for NumPy's and CuPy's)."""
    if getattr(dtype, "is_floating_point", None) is not None:  # a torch.dtype
        return "torch"
    return "array_api_strict" if type(dtype).__module__.startswith("array_api_strict") \
        else "numpy"


def _array_family(a: Any) -> str:
    """The :func:`_family` of ``a``'s backend; lists and scalars are NumPy's."""
    if not hasattr(a, "dtype"):
        return "numpy"
    name = backend.of(a).name
    return name if name in _FAMILIES else "numpy"


def as_coupling(M: Any, what: str) -> Any:
    """``M`` itself if already canonical, else :func:`canonical_matrix` of it.

    Canonical: a real floating array, or a canonical CSR array; what propop built
    is not copied again.
    """
    if type(M) is np.ndarray:  # the common case, without a backend look-up
        if M.dtype.kind == "f":
            return M
    elif backend.is_sparse(M):
        if M.format == "csr" and M.has_canonical_format and backend.kind(M.dtype) == "f":
            return M
    elif backend.kind(getattr(M, "dtype", None)) == "f":
        return M
    return canonical_matrix(M, what)


def canonical_matrix(M: Any, what: str, dtype: Any = None) -> Any:
    """A 2-D real matrix: sparse ones of any format as a canonical CSR array (a copy).

    Duplicate entries are summed and indices sorted, so that every algorithm
    can read ``indptr``/``indices`` as CSR and no entry counts twice; explicit
    zeros stay part of the pattern.
    """
    be = backend.of(M)
    if not be.sparse.issparse(M):
        M = real_array(M, what, dtype)
    else:
        if backend.kind(M.dtype) not in "fiub":
            raise ValueError(f"{what} has dtype {M.dtype}; propop works in real arithmetic")
        if be.name == "torch":  # CSR tensors are canonical and floating as they are made
            return M if dtype is None else backend.astype(M, dtype)
        make = getattr(be.sparse, "csr_array", None) or be.sparse.csr_matrix
        M = make(M, dtype=dtype or (M.dtype if M.dtype.kind == "f" else np.float64), copy=True)
        M.sum_duplicates()
        M.sort_indices()
    if M.ndim != 2:
        raise ValueError(f"{what} has {M.ndim} dimensions, expected a 2-D matrix")
    return M


def require_finite(array: Any, what: str) -> None:
    """Raise ``ValueError`` naming ``what`` and the first bad index if ``array`` has NaN/Inf."""
    be = backend.of(array)
    data = array.data if be.sparse.issparse(array) else array
    if backend.is_real_floating(data) and backend.all_finite(data, be.xp):
        return  # one sum; the flags below only where it is not finite (or overflowed)
    finite = be.xp.isfinite(data)
    if bool(be.xp.all(finite)):
        return
    flat = int(np.argmin(backend.to_host(finite).reshape(-1)))  # on the host: an error path
    if be.sparse.issparse(array):
        coo = array.tocoo()
        where = (int(coo.row[flat]), int(coo.col[flat]))
    else:
        where = tuple(int(i) for i in np.unravel_index(flat, tuple(array.shape)))
    raise ValueError(f"{what} contains NaN or Inf (first at index {where})")


def require_samples(x: Any, what: str, axis: int = -1) -> None:
    """Raise ``ValueError`` for a batch with no samples (``x.shape[axis] == 0``)."""
    if x.ndim > 1 and x.shape[axis] == 0:
        raise ValueError(f"{what} has shape {tuple(x.shape)}: a batch of no samples; pass at "
                         "least one sample (a column)")


def require_density(density: float) -> float:
    """``density`` as a float, or ``ValueError`` unless it lies in ``(0, 1]``."""
    if not 0 < real_number(density, "density") <= 1:
        raise ValueError(f"density must lie in (0, 1], got {density!r}")
    return float(density)


def real_number(value: Any, what: str) -> float:
    """``value`` as a float, or ``TypeError`` naming ``what`` unless a real number (no bool)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{what} must be a real number, got {value!r} "
                        f"({type(value).__name__})")
    return float(value)


def positive_int(value: Any, what: str) -> int:
    """``value`` as a Python int, ``TypeError`` unless an integer, ``ValueError`` unless >= 1.

    As ``torch.nn.GRU`` checks its sizes: ``2.5``, ``"2"`` and ``True`` are no
    width (``int()`` would make them one silently), nor is ``0``.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{what} must be an integer, got {value!r} "
                        f"({type(value).__name__})")
    if value < 1:
        raise ValueError(f"{what} must be at least 1, got {value}")
    return int(value)


def positive_sizes(sizes: Any, what: str = "sizes") -> list[int]:
    """``sizes``, a sequence of at least two widths, as ints (:func:`positive_int` each)."""
    if not isinstance(sizes, Sequence) and not (isinstance(sizes, np.ndarray) and
                                                sizes.ndim == 1) or isinstance(sizes, str):
        raise TypeError(f"{what} must be a sequence of widths such as [4, 8, 2], got "
                        f"{sizes!r}")
    if len(sizes) < 2:
        raise ValueError(f"{what} must list at least two widths, got {list(sizes)}")
    return [positive_int(n, f"{what}[{k}]") for k, n in enumerate(sizes)]


def float_dtype(dtype: Any) -> np.dtype:
    """``dtype`` as a NumPy dtype, or ``ValueError`` unless float32 or float64.

    A ``torch.dtype`` is read by its name (``torch.float32`` is float32); ``None``
    is no dtype here (NumPy would read it as float64).
    """
    name = str(dtype).removeprefix("torch.") if getattr(dtype, "is_floating_point", None) \
        is not None else dtype  # a torch.dtype by its name
    try:
        resolved = None if name is None else np.dtype(name)
    except TypeError:
        resolved = None
    if resolved is None or resolved not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise ValueError(f"dtype must be float32 or float64, got {dtype!r}")
    return resolved


def require_shape(array: Any, shape: tuple, what: str, why: str = "") -> None:
    """Raise ``ValueError`` if ``array.shape != shape``; ``None`` in ``shape`` matches any size."""
    ok = len(array.shape) == len(shape) and all(
        want is None or have == want for have, want in zip(array.shape, shape)
    )
    if not ok:
        expected = "(" + ", ".join("r" if s is None else str(s) for s in shape)
        expected += ",)" if len(shape) == 1 else ")"
        raise ValueError(f"{what} has shape {tuple(array.shape)}, expected {expected}{why}")
