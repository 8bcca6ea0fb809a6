"""Shape-only arrays: a reduction's own code, run without data, counts its memory.

Written for propop. The memory guard (:mod:`.footprint`) needs a reduction's peak
before anything is allocated. Instead of a walk kept in step with the code by
hand, the code itself runs on :class:`ShapeArray` s: arrays with a shape, a
dtype, strides and no data. Every operation NumPy would allocate for (a product,
a sum, a concatenation, a new array, a reshape that cannot be a view) holds its
bytes in a :class:`~.chain.Counter`, and the array gives them back when it is
garbage-collected, which CPython's reference counting does exactly when NumPy
would free the real array; views (slices, transposes, reshapes NumPy's strides
allow) hold only an array object's header and keep their base alive. So
``counter.peak_bytes`` after a run on shape arrays is the peak of the real run,
temporaries included.

:func:`namespace` is what the loops receive in place of NumPy: the functions
the reductions call (``zeros``, ``concat``, ``matmul``, ...), their new
arrays counted in one counter. :func:`system` makes a system's shape-only twin
(its operator on a backend of its own, ``"shapes"``), on which whole plans run
within :func:`counting`; :func:`signature` is what the twin is made from.
"""

from __future__ import annotations

import math
import contextlib
import dataclasses
import itertools
import weakref
import contextvars
from collections.abc import Iterator, Sequence
from types import SimpleNamespace
from typing import Any

import numpy as np

from ... import backend
from ...systems.triangular import TriangularSystem
from .chain import Counter

__all__ = ["ShapeArray", "namespace", "array", "counting", "system", "signature"]

DTYPES = {4: np.float32, 8: np.float64}  # by item size: what the shape runs model
HEADER = 112  # bytes of a NumPy array object itself, a view's included (measured)


def _probe(shape: tuple) -> Any:
    """A zero-stride NumPy array of ``shape`` (no memory): indexing it tells shapes."""
    return np.broadcast_to(np.empty((), dtype=np.int8), shape)


_BYTE = np.zeros(1, dtype=np.int8)


def _strided(shape: tuple, strides: tuple | None = None) -> Any:
    """A C-ordered array of ``shape`` that owns no memory: its strides tell views from copies.

    One byte an entry over a one-byte buffer: views of it (slices, transposes,
    ``reshape(copy=False)``) compute NumPy's strides and never read an entry.
    """
    if strides is None:
        strides = tuple(math.prod(shape[i + 1:]) for i in range(len(shape)))
    return np.lib.stride_tricks.as_strided(_BYTE, shape, strides, writeable=False)


def _shape_of(value: Any) -> tuple:
    return tuple(getattr(value, "shape", ()))


class ShapeArray:
    """An array of ``shape`` and ``dtype`` without data, its bytes held in ``counter``.

    ``owned=False`` (arrays that exist already: a chain's given arrays, a twin's
    coefficients) holds nothing; a view (``base``) holds its header only.
    """

    __slots__ = ("shape", "dtype", "counter", "base", "_owned", "_layout")

    def __init__(self, shape: tuple, dtype: Any, counter: Counter, base: Any = None,
                 owned: bool = True, layout: Any = None) -> None:
        self.shape = tuple(int(s) for s in shape)
        self.dtype = np.dtype(dtype)
        self.counter, self.base = counter, base
        self._layout = layout  # a new array's C layout is made when a view first asks
        self._owned = counter.hold(HEADER + (self.nbytes if base is None else 0)) if owned else 0

    @property
    def layout(self) -> Any:
        """A zero-memory NumPy array with this array's shape and strides (:func:`_strided`)."""
        if self._layout is None:
            self._layout = _strided(self.shape)
        return self._layout

    def __del__(self) -> None:
        if self._owned:
            self.counter.release(self._owned)

    # -- what NumPy arrays tell ------------------------------------------------------
    @property
    def ndim(self) -> int:
        """Number of axes."""
        return len(self.shape)

    @property
    def size(self) -> int:
        """Number of entries."""
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes the array's entries would take."""
        return self.size * self.dtype.itemsize

    def __len__(self) -> int:
        return self.shape[0]

    def __iter__(self) -> Any:
        return (self[i] for i in range(self.shape[0]))

    def __bool__(self) -> bool:  # a finiteness check passes: the loop takes its usual path
        return True

    def __float__(self) -> float:  # a finite sum: the loop takes its usual path
        return 0.0

    def __array_namespace__(self, api_version: str | None = None) -> Any:
        return namespace(self.counter)

    def __array__(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("a shape-only array has no values")

    # -- new arrays and views --------------------------------------------------------
    def _new(self, shape: tuple, dtype: Any = None) -> ShapeArray:
        return ShapeArray(shape, self.dtype if dtype is None else dtype, self.counter)

    def _view(self, layout: Any) -> ShapeArray:
        """A view with ``layout`` (a view of :attr:`layout`, computed by NumPy)."""
        return ShapeArray(layout.shape, self.dtype, self.counter, base=self.base or self,
                          layout=layout)

    def __getitem__(self, index: Any) -> ShapeArray:
        parts = index if isinstance(index, tuple) else (index,)
        if all(isinstance(p, _BASIC) for p in parts):  # a view: NumPy's, of the layout
            return self._view(self.layout[index])
        probe = _probe(self.shape)[tuple(_probe(_shape_of(p)) if isinstance(p, ShapeArray)
                                         else p for p in parts)]
        return self._new(probe.shape)  # advanced indexing copies

    def __setitem__(self, index: Any, value: Any) -> None:
        """Writing into an array allocates nothing."""

    def reshape(self, *shape: Any) -> ShapeArray:
        """A view of another shape (NumPy's, for a contiguous array)."""
        shape = list(shape[0] if len(shape) == 1 and isinstance(shape[0], tuple) else shape)
        if -1 in shape:  # the one free axis takes what the others leave
            shape[shape.index(-1)] = self.size // max(math.prod(k for k in shape if k != -1), 1)
        if math.prod(shape) != self.size:
            raise ValueError(f"cannot reshape {self.shape} into {tuple(shape)}")
        try:  # a view where NumPy's strides allow one, else a copy
            return self._view(np.reshape(self.layout, tuple(shape), copy=False))
        except ValueError:
            return self._new(tuple(shape))

    @property
    def T(self) -> ShapeArray:  # noqa: N802 (NumPy's name)
        """The transposed view."""
        return self._view(self.layout.T)

    def copy(self) -> ShapeArray:
        """A new array of the same shape."""
        return self._new(self.shape)

    def astype(self, dtype: Any, copy: bool = True) -> ShapeArray:
        """A new array of ``dtype`` (itself where no copy is asked for nor needed)."""
        return self._new(self.shape, dtype) if copy or np.dtype(dtype) != self.dtype else self

    def all(self, axis: Any = None) -> ShapeArray:
        """The booleans reduced over ``axis``."""
        return self._reduced(axis, bool)

    def any(self, axis: Any = None) -> ShapeArray:
        """The booleans reduced over ``axis``."""
        return self._reduced(axis, bool)

    def sum(self, axis: Any = None) -> ShapeArray:
        """The sum over ``axis``."""
        return self._reduced(axis, None)

    def _reduced(self, axis: Any, dtype: Any, keepdims: bool = False) -> ShapeArray:
        axes = set(range(self.ndim)) if axis is None else {
            a % self.ndim for a in (axis if isinstance(axis, tuple) else (axis,))}
        return self._new(tuple(1 if i in axes else k for i, k in enumerate(self.shape)
                               if keepdims or i not in axes), dtype)

    # -- arithmetic --------------------------------------------------------------------
    def _binary(self, other: Any, dtype: Any = None) -> ShapeArray:
        return self._new(_broadcast(self.shape, _shape_of(other)), dtype)

    def _inplace(self, other: Any) -> ShapeArray:
        return self

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _binary
    __truediv__ = __rtruediv__ = _binary
    __iadd__ = __isub__ = __imul__ = __itruediv__ = _inplace

    def __neg__(self) -> ShapeArray:
        return self._new(self.shape)

    def __eq__(self, other: Any) -> ShapeArray:  # type: ignore[override]
        return self._binary(other, bool)

    __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __eq__
    __hash__ = object.__hash__

    def __matmul__(self, other: Any) -> ShapeArray:
        return self._new(_matmul_shape(self.shape, _shape_of(other)))

    def __rmatmul__(self, other: Any) -> ShapeArray:
        return self._new(_matmul_shape(_shape_of(other), self.shape))


_BASIC = (int, slice, type(None), type(Ellipsis))


def _broadcast(a: tuple, b: tuple) -> tuple:
    """NumPy's broadcast of two shapes."""
    if a == b:
        return a
    n = max(len(a), len(b))
    a, b = (1,) * (n - len(a)) + a, (1,) * (n - len(b)) + b
    if any(x != y and 1 not in (x, y) for x, y in zip(a, b)):
        raise ValueError(f"shapes {a} and {b} do not broadcast")
    return tuple(max(x, y) if 1 in (x, y) else x for x, y in zip(a, b))


def _matmul_shape(a: tuple, b: tuple) -> tuple:
    """The shape of ``a @ b`` (NumPy's rules, vectors included)."""
    a2, b2 = (a if len(a) > 1 else (1,) + a), (b if len(b) > 1 else b + (1,))
    if a2[-1] != b2[-2]:
        raise ValueError(f"matmul: shapes {a} and {b} do not align")
    shape = _broadcast(a2[:-2], b2[:-2]) + (a2[-2], b2[-1])
    if len(a) == 1:
        shape = shape[:-2] + shape[-1:]
    if len(b) == 1:
        shape = shape[:-1]
    return shape


def array(shape: tuple, dtype: Any, counter: Counter, owned: bool = False) -> ShapeArray:
    """A shape array: by default one whose bytes the caller has counted already."""
    return ShapeArray(shape, dtype, counter, owned=owned)


def _like(a: ShapeArray, shape: Any = None, dtype: Any = None) -> ShapeArray:
    return a._new(a.shape if shape is None else shape, dtype)


def _concatenate(arrays: Any, axis: int = 0) -> ShapeArray:
    arrays = list(arrays)
    shape = list(arrays[0].shape)
    shape[axis] = sum(a.shape[axis] for a in arrays)
    return arrays[0]._new(tuple(shape))


def _stack(arrays: Any, axis: int = 0) -> ShapeArray:
    arrays = list(arrays)
    shape = list(arrays[0].shape)
    shape.insert(axis if axis >= 0 else len(shape) + 1 + axis, len(arrays))
    return arrays[0]._new(tuple(shape))


def _einsum(subscripts: str, *operands: ShapeArray) -> ShapeArray:
    inputs, output = subscripts.replace(" ", "").split("->")
    sizes = {}
    for letters, operand in zip(inputs.split(","), operands):
        sizes.update(zip(letters, operand.shape))
    return operands[0]._new(tuple(sizes[letter] for letter in output))


def _permute_dims(a: ShapeArray, axes: tuple) -> ShapeArray:
    return a._view(np.permute_dims(a.layout, axes))


def _moveaxis(a: ShapeArray, source: int, destination: int) -> ShapeArray:
    return a._view(np.moveaxis(a.layout, source, destination))


def namespace(counter: Counter) -> SimpleNamespace:
    """The functions the reductions call, on shape arrays counted in ``counter``."""
    def new(shape: Any, dtype: Any = np.float64, device: Any = None) -> ShapeArray:
        return ShapeArray(shape if isinstance(shape, tuple) else (shape,), dtype, counter)

    return SimpleNamespace(
        empty=new, zeros=new, ones=new,
        ascontiguousarray=lambda a: a if a.layout.flags.c_contiguous else a._new(a.shape),
        eye=lambda n, dtype=np.float64, device=None: new((n, n), dtype),
        matmul=lambda a, b, out=None: a @ b if out is None else out,
        asarray=lambda values, dtype=None, device=None: new(
            np.shape(values), np.result_type(values) if dtype is None else dtype),
        full=lambda shape, fill, dtype=np.float64: new(shape, dtype),
        concat=_concatenate, stack=_stack, einsum=_einsum, permute_dims=_permute_dims,
        moveaxis=_moveaxis, matrix_transpose=lambda a: a._view(np.matrix_transpose(a.layout)),
        empty_like=_like, zeros_like=_like, ones_like=_like,
        full_like=lambda a, fill, dtype=None: _like(a, dtype=dtype),
        isfinite=lambda a: _like(a, dtype=bool), argmin=lambda a, axis=None: 0,
        sum=lambda a, axis=None: a.sum(axis),
        all=lambda a, axis=None: a.all(axis), reshape=lambda a, shape: a.reshape(shape),
        broadcast_to=lambda a, shape: a._view(np.broadcast_to(a.layout, tuple(shape))),
        flip=lambda a, axis=None: a._view(np.flip(a.layout, axis)),
        mean=lambda a, axis=None, keepdims=False: a._reduced(axis, None, keepdims),
        astype=lambda a, dtype, copy=True: a.astype(dtype, copy),
        where=lambda cond, a, b: cond._binary(a)._binary(b))


_COUNTING: contextvars.ContextVar = contextvars.ContextVar("shape namespace")


class _Counting:
    """The namespace of the run under way (:func:`counting`): the shape backend's ``xp``."""

    def __getattr__(self, name: str) -> Any:
        return getattr(_COUNTING.get(), name)


SHAPES = backend.adopt(ShapeArray, "shapes", _Counting())


@contextlib.contextmanager
def counting(counter: Counter) -> Iterator[None]:
    """Within it, the shape backend's new arrays hold their bytes in ``counter``."""
    token = _COUNTING.set(namespace(counter))
    try:
        yield
    finally:
        _COUNTING.reset(token)


def system(s: Any, counter: Counter) -> TriangularSystem:
    """A system's (or an operator's) shape-only twin: its operator's arrays and its rhs.

    The arrays stand for ones that exist already, so they hold no bytes; what a
    method run on it allocates is counted in ``counter`` (within :func:`counting`).
    An operator stands for its system with a right-hand side per sample.
    """
    dtype = DTYPES[backend.itemsize(s.dtype)]

    def shaped(a: Any) -> ShapeArray:  # NumPy's strides kept: a view of a stack is one
        steps = _steps(a)
        return ShapeArray(tuple(a.shape), dtype, counter, owned=False,
                          layout=None if steps is None else _strided(tuple(a.shape), steps))

    if isinstance(s, TriangularSystem):
        op, rhs = s.operator_of, shaped(s._scaled_rhs)
    else:
        op, rhs = s, ShapeArray((s.size, s.samples or 1), dtype, counter, owned=False)
    return TriangularSystem.of(op.mapped(shaped, SHAPES, np.dtype(dtype)), rhs, check=False)


def _steps(a: Any) -> tuple | None:
    """A NumPy array's strides in entries (``None`` for other arrays: taken as C-ordered)."""
    if not isinstance(a, np.ndarray):
        return None
    return tuple(k // a.itemsize for k in a.strides)


def signature(s: Any) -> tuple:
    """What :func:`system` makes the twin of ``s`` from: equal signatures, equal twins.

    The layout's fields, the stored arrays' shapes and NumPy strides (and which
    couplings are one matrix stored once), the scalings' placement, form, samples, item size and
    the right-hand side's shape. Values are never read: a shape-only run takes
    the same path whatever they are. The operator's part is kept while the operator
    lives (:data:`_OPERATORS`): its arrays' shapes and strides never change.
    """
    is_system = isinstance(s, TriangularSystem)
    op = s.operator_of if is_system else s
    mine = _OPERATORS.get(op)
    if mine is None:
        mine = _OPERATORS[op] = _operator_signature(op)
    return mine + (_stored([s._scaled_rhs])[0] if is_system else None,)


# an operator's signature, read once: 65536 sparse couplings and as many scalings take
# 32 ms to read, a quarter of a cyclic reduction of them (a system solved again, a plan)
_OPERATORS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _operator_signature(op: Any) -> tuple:
    """The operator's part of :func:`signature`."""
    layout, couplings, scalings = op.layout, op.couplings, op.scalings
    arrays = couplings.arrays()
    stored = tuple(map({}.setdefault, map(id, arrays), itertools.count()))
    return (type(layout), tuple(getattr(layout, f.name) for f in dataclasses.fields(layout)),
            type(couplings), _stored(arrays), stored, _stored(scalings.stacks),
            scalings.first, op.form, op.samples, backend.itemsize(op.dtype))


def _stored(arrays: Sequence[Any]) -> tuple:
    """Each array's shape and NumPy strides (in bytes: one item size throughout a system).

    Read for every stored array of a new operator, in comprehensions rather than a call
    per array (65536 sparse couplings and as many scalings: the signature in 32 against
    54 ms with :func:`_steps`' strides in entries, a call each). ``None`` stays ``None``.
    """
    ndarray = np.ndarray
    return tuple([None if a is None else (a.shape, a.strides) if isinstance(a, ndarray)
                  else (a.shape, None) for a in arrays])
