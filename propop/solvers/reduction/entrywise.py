"""Odd-even reduction of a chain of tiny blocks, entries first: every entry a whole vector.

Written for propop. A chain of ``n x n`` blocks with ``n <= 3`` (DEER's GRU of
hidden 2, say) spends a reduction's time in NumPy's loop over the blocks, some
20-40 ns a block whatever its size, more than the arithmetic of the block. Laid
out entries first and positions last, ``C[i, j]`` is one contiguous ``(b, p)``
plane, and each entry of a level's product, ``sum_k A[i, k] B[k, j]``, is ``n``
products of whole planes (:class:`EntrywiseKernels`); a level's pairs are every
other position of the same planes. Measured, one thread, an AMD EPYC, a level of
5000 pairs of 16 per-sample 2 x 2 cores: 0.38 against 1.56 ms for the cores'
products (the positions-first entries of :func:`propop.backend.block_matmul`),
0.22 against 0.87 ms for their products with vectors; laying the cores out
entries first costs one copy of them (1.2 ms for all 10000 x 16).

The layout (the chain's of :mod:`.chain`, its axes moved): ``L`` ``(n, bl, m)``,
``C`` ``(n, n, b, m - 1)``, ``G`` ``(n, r, m)`` or ``(n, r, c, m)``.
:class:`~.odd_even.DenseKernels` switch to these kernels before the first level
(:func:`suits`, then an :class:`~.odd_even.Switch` whose ``down`` and ``up`` are
:meth:`~EntrywiseKernels.to_entries` and
:meth:`~EntrywiseKernels.from_entries`); the memory guard's shape-only
arrays take the same switch, so its estimate holds the copy.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ... import backend
from .chain import Counter

__all__ = ["EntrywiseKernels", "suits", "ENTRYWISE_MAX"]

# The widest blocks reduced entrywise. A level of 5000 pairs of 16 per-sample cores, one
# thread, an AMD EPYC: 3 x 3 1.85 against 6.6 ms (with vectors 0.87 against 4.1), for a
# copy into entries first of 2.8 ms (a GRU of hidden 3's Newton forward 0.875x, one
# process, alternating); 4 x 4 6.1 against 4.3 ms, and its copy 15 ms (hidden 4: 1.08x)
ENTRYWISE_MAX = 3


def suits(C: Any) -> bool:
    """Whether the cores ``C`` ``(p, b, n, n)`` are reduced entrywise: NumPy's, ``n <= 3``.

    The memory guard's shape-only arrays stand for NumPy's and answer alike.
    """
    return (backend.of(C).name in ("numpy", "shapes") and C.ndim == 4
            and max(C.shape[-2:]) <= ENTRYWISE_MAX and C.shape[0] > 0)


def _sum_of_products(out: Any, pairs: list) -> None:
    """``out = sum of a * b`` over ``pairs`` of planes, written into the view ``out``."""
    a, b = pairs[0]
    if isinstance(out, np.ndarray):  # no temporary for the first product
        np.multiply(a, b, out=out)
    else:
        out[...] = a * b
    for a, b in pairs[1:]:
        out += a * b


class EntrywiseKernels:
    """The kernels of :mod:`.odd_even`'s loops on a chain laid out entries first.

    The protocol of :class:`~.odd_even.DenseKernels`, its positions on the last
    axis: ``rows`` slices it, each product is ``n`` products of planes an entry.
    """

    def __init__(self, xp: Any) -> None:
        self.xp = xp

    def _entries_first(self, A: Any, entries: int) -> Any:
        """``A`` with its ``entries`` last axes first (in order), positions last; C-ordered."""
        ndim = A.ndim
        axes = tuple(range(ndim - entries, ndim)) + tuple(range(1, ndim - entries)) + (0,)
        return self.xp.ascontiguousarray(self.xp.permute_dims(A, axes))

    def cores(self, L: Any, C: Any) -> tuple[Any, Any]:
        """The scalings ``(m, bl, n)`` and cores ``(p, b, n, n)`` entries first."""
        return (None if L is None else self._entries_first(L, 1)), self._entries_first(C, 2)

    def to_entries(self, G: Any) -> Any:
        """A right-hand side ``(m, r, n[, c])`` entries first: ``(n, r[, c], m)``."""
        if G.ndim == 3:
            return self._entries_first(G, 1)
        return self.xp.ascontiguousarray(self.xp.permute_dims(G, (2, 1, 3, 0)))

    def from_entries(self, X: Any) -> Any:
        """A solution ``(n, r[, c], m)`` back positions first: ``(m, r, n[, c])``, a view.

        Not copied here: the chain's solution is read into the system's order anyway
        (:meth:`~.chain.Chain.solution`: one copy, not two).
        """
        return self.xp.permute_dims(X, (2, 1, 0) if X.ndim == 3 else (3, 1, 0, 2))

    @staticmethod
    def rows(A: Any, positions: slice) -> Any:
        """The entries of ``positions`` (``None``, the scalings of an unscaled chain, stays)."""
        return None if A is None else A[..., positions]

    @staticmethod
    def count(A: Any) -> int:
        """How many positions ``A`` holds."""
        return A.shape[-1]

    def join(self, first: Any, rest: Any) -> Any:
        """``first`` then ``rest`` along positions (``None`` and ``None``: still none)."""
        return None if first is None else self.xp.concat([first, rest], axis=-1)

    def _new(self, shape: tuple, *arrays: Any) -> Any:
        dtype = arrays[0].dtype if len({a.dtype for a in arrays}) == 1 else \
            np.result_type(*arrays)
        return self.xp.empty(shape, dtype=dtype, device=backend.device(arrays[0]))

    def product(self, L1: Any, C1: Any, L2: Any, C2: Any, counter: Counter) -> Any:
        """The cores of ``diag(L1) C1 diag(L2) C2``: ``(C1 diag(L2)) C2``, ``L1`` stays left."""
        n = C1.shape[0]
        left = C1 if L2 is None else C1 * L2[None, ...]  # column k of C1 times L2[k]
        lead = np.broadcast_shapes(left.shape[2:], C2.shape[2:])
        out = self._new((n, C2.shape[1]) + lead, left, C2)
        for i in range(n):
            for j in range(C2.shape[1]):
                _sum_of_products(out[i, j], [(left[i, k], C2[k, j]) for k in range(n)])
        p, b = lead[-1], lead[0]
        counter.flops += 2 * p * b * n**3 + (0 if L2 is None else p * b * n * n)
        return out

    def apply(self, L: Any, C: Any, X: Any, counter: Counter) -> Any:
        """``diag(L) C X`` for ``X`` ``(n, r, p)`` or ``(n, r, c, p)``: a new array."""
        n = X.shape[0]
        if X.ndim == 4:  # columns: the cores and scalings broadcast over them
            C, L = C[:, :, :, None, :], (None if L is None else L[:, :, None, :])
        out = self._new((C.shape[0],) + np.broadcast_shapes(C.shape[2:], X.shape[1:]), C, X)
        for i in range(C.shape[0]):
            _sum_of_products(out[i], [(C[i, k], X[k]) for k in range(n)])
        if L is not None:
            out *= L
        counter.flops += (2 * n * n + (0 if L is None else n)) * out[0].size
        return out

    @staticmethod
    def add(A: Any, B: Any) -> Any:
        """``A + B`` written into ``A``: always :meth:`apply`'s new array, of the sum's shape."""
        A += B
        return A

    def interleave(self, even: Any, odd: Any) -> Any:
        """Positions ``even[0], odd[0], even[1], ...``."""
        full = self.xp.empty(tuple(even.shape[:-1]) + (even.shape[-1] + odd.shape[-1],),
                             dtype=even.dtype, device=backend.device(even))
        full[..., 0::2] = even
        full[..., 1::2] = odd
        return full

    def first_nonfinite(self, cores: Any) -> int | None:
        """The first position whose core has a NaN or Inf entry, or ``None``."""
        xp = self.xp
        if cores.shape[-1] == 0 or backend.all_finite(cores, xp):
            return None
        finite = xp.all(xp.reshape(xp.isfinite(cores), (-1, cores.shape[-1])), axis=0)
        if bool(xp.all(finite)):
            return None
        return int(np.argmin(backend.to_host(finite)))  # on the host: an error path

    @staticmethod
    def densify(L: Any, C: Any, counter: Counter) -> None:
        """Entrywise kernels stay so."""
        return None
