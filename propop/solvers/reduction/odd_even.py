"""Odd-even reduction of a chain, split in two: the matrix's levels, then a right-hand side.

Written for propop. The one loop of each reduction of :mod:`.cyclic`, on the chain
``x_k = diag(L_k) C_k x_{k-1} + G_k`` through a kernels protocol: :class:`DenseKernels`
(the padded :class:`~.chain.Chain` and its :func:`~.chain.product` and
:func:`~.chain.apply`, on any array namespace ``xp``: NumPy, CuPy, PyTorch's, the
standard's, or the shape-only arrays of :mod:`.shapes`, on which the memory guard
(:mod:`.footprint`) runs these same loops), or the sparse kernels of :mod:`.sparse`
(lists of sparse cores), which hand the remaining levels to dense ones once the
fill-in passes their threshold (a :class:`Switch` among the levels), or
:class:`DiagonalKernels` (diagonal cores stored as their diagonals, whose products
are entrywise: a diagonal linear recurrence in ``O(tau n)``), or
:class:`SharedCoreKernels` (one core at every position, a recurrence over time,
whose first level's right-hand sides are one product with it). Dense kernels hand
NumPy's cores of at most 3 x 3 to :mod:`.entrywise`'s kernels (entries first, each
entry of a product a whole vector) before the first level.

- :func:`factor` / :func:`substitute`: odd-even (work-efficient) cyclic
  reduction, eq. def_back_prop2_even's pairing: the cores of every level once,
  then each right-hand side down the levels and back up.
- :func:`parallel_factor` / :func:`parallel_substitute`: parallel cyclic
  reduction (eqs. forw_prop_sys_reordered, back_prop_sys_reordered).

A non-finite reduced core (a long product of Jacobians that overflowed) raises
:class:`ReductionOverflow`, naming the level and the blocks.
"""

from __future__ import annotations


from collections.abc import Callable
from typing import Any

import numpy as np

from ... import backend
from . import entrywise
from .chain import Chain, Counter, apply, product

__all__ = ["ReductionOverflow", "DenseKernels", "DiagonalKernels", "SharedCoreKernels",
           "Switch", "depth", "factor", "substitute", "parallel_factor", "parallel_substitute"]


class ReductionOverflow(Exception):  # noqa: N818 (a failed solve's reason, reported)
    """A reduced block that is not finite: the reduction's solve is reported NONFINITE."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    @classmethod
    def between(cls, level: int, a: int, b: int, dtype: Any) -> ReductionOverflow:
        """The error for the reduced block coupling blocks ``a`` and ``b`` at ``level``.

        Its advice names float64 only for blocks narrower than it (``dtype``).
        """
        wider = " or float64" if backend.eps(dtype) > float(np.finfo(np.float64).eps) else ""
        return cls(f"level {level}: the reduced block coupling blocks {a} and {b} is not "
                   "finite: a long product of Jacobians overflowed; use 'substitution' "
                   f"(it multiplies vectors only){wider}")


class DenseKernels:
    """The kernels of a padded dense chain on namespace ``xp``: stacks, positions first.

    A chain without scalings (every ``L`` one: the chain over segments of
    :mod:`.segments`) gives ``L = None``, and no pass multiplies by it.
    """

    def __init__(self, xp: Any) -> None:
        self.xp = xp

    @staticmethod
    def rows(A: Any, positions: slice) -> Any:
        """The entries of ``positions`` (``None``, the scalings of an unscaled chain, stays)."""
        return None if A is None else A[positions, ...]

    @staticmethod
    def count(A: Any) -> int:
        """How many positions ``A`` holds."""
        return A.shape[0]

    def join(self, first: Any, rest: Any) -> Any:
        """``first`` then ``rest`` along positions (``None`` and ``None``: still none)."""
        return None if first is None else self.xp.concat([first, rest])

    @staticmethod
    def product(L1: Any, C1: Any, L2: Any, C2: Any, counter: Counter) -> Any:
        """The cores of ``diag(L1) C1 diag(L2) C2`` (:func:`~.chain.product`)."""
        return product(L1, C1, L2, C2, counter)

    def apply(self, L: Any, C: Any, X: Any, counter: Counter) -> Any:
        """``diag(L) C X`` (:func:`~.chain.apply`)."""
        return apply(L, C, X, counter, self.xp)

    @staticmethod
    def add(A: Any, B: Any) -> Any:
        """``A + B`` written into ``A``: always :meth:`apply`'s new array, of the sum's shape."""
        A += B
        return A

    def interleave(self, even: Any, odd: Any) -> Any:
        """Positions ``even[0], odd[0], even[1], ...``."""
        full = self.xp.empty((even.shape[0] + odd.shape[0],) + tuple(even.shape[1:]),
                             dtype=even.dtype, device=backend.device(even))
        full[0::2, ...] = even
        full[1::2, ...] = odd
        return full

    def first_nonfinite(self, cores: Any) -> int | None:
        """The first core with a NaN or Inf entry, or ``None`` (``backend.all_finite`` first)."""
        xp = self.xp
        if cores.shape[0] == 0 or backend.all_finite(cores, xp):
            return None
        finite = xp.all(xp.reshape(xp.isfinite(cores), (cores.shape[0], -1)), axis=1)
        if bool(xp.all(finite)):
            return None
        return int(np.argmin(backend.to_host(finite)))  # on the host: an error path

    def densify(self, L: Any, C: Any, counter: Counter) -> Switch | None:
        """Dense kernels stay dense; NumPy's cores of at most 3 x 3 go entries first.

        (:mod:`.entrywise`: one copy of the cores, every level's products then
        whole planes of entries.)
        """
        if not entrywise.suits(C):
            return None
        kernels = entrywise.EntrywiseKernels(self.xp)
        return Switch(kernels, *kernels.cores(L, C), kernels.to_entries, kernels.from_entries)


class DiagonalKernels(DenseKernels):
    """Dense kernels whose cores are diagonal, stored as diagonals ``C`` ``(m - 1, b, n)``.

    ``diag(L1) diag(C1) diag(L2) diag(C2)`` and ``diag(L) diag(C) X`` are
    entrywise products: ``n`` flops a block where dense cores take ``n^3``. A
    chain without scalings (a diagonal recurrence's own coefficients as its cores)
    gives ``L = None``, as dense kernels take it.
    """

    @staticmethod
    def product(L1: Any, C1: Any, L2: Any, C2: Any, counter: Counter) -> Any:
        """The diagonal of ``diag(C1) diag(L2) diag(C2)`` (the left scaling stays ``L1``)."""
        wide = C1.shape[1] if L2 is None else max(C1.shape[1], L2.shape[1])
        counter.flops += 2 * C1.shape[0] * wide * C1.shape[2]
        out = C1 * C2 if L2 is None else C1 * L2  # the wider (shared or per sample) first
        if L2 is not None:
            out *= C2
        return out

    @staticmethod
    def apply(L: Any, C: Any, X: Any, counter: Counter) -> Any:
        """``diag(L) diag(C) X`` for ``X`` ``(p, r, n)``: one new array, scaled in place."""
        counter.flops += 2 * X.shape[0] * X.shape[1] * X.shape[2]
        out = C * X
        if L is not None:
            out *= L
        return out


class SharedCoreKernels(DenseKernels):
    """Dense kernels of a chain whose every core is one matrix ``M``: ``diag(L_k) M``.

    The chain over time of an RNN of one layer, ``A_s = diag(f'(y_s)) U``: ``C`` is
    the broadcast view of ``M`` (no memory), ``positions`` how many cores it has.
    The first level's right-hand sides of one sample, ``diag(L) M X``, are then one
    product ``X M^T`` for all positions (one GEMM, where the dense kernels' ``einsum``
    multiplies a small block at a time: 5000 blocks of 8 x 8, one thread, an Intel
    Xeon, 70 against 460 us); its products ``M diag(L) M`` are new cores a pair, so
    the next levels are the dense kernels' (a :class:`Switch` with nothing to move),
    their left scalings multiplied into them: the unscaled chain of the products
    ``A_k A_{k-1}``, as if the blocks had been dense from the start.
    """

    def __init__(self, xp: Any, core: Any, positions: int) -> None:
        super().__init__(xp)
        self.core, self.positions = core, positions

    def product(self, L1: Any, C1: Any, L2: Any, C2: Any, counter: Counter) -> Any:
        """The cores ``M diag(L2) M`` of the pairs: one product of the scalings, if ``n <= 32``.

        ``(M diag(l) M)_ab = sum_j l_j M_aj M_jb`` is linear in ``l``: the scalings
        ``(p r, n)`` times the ``n`` outer products ``M_{:,j} M_{j,:}`` as an ``n x n^2``
        matrix, one GEMM of the dense kernels' flops (5000 pairs of 8 x 8, one thread,
        an Intel Xeon: 0.44 ms, against 0.66 for the dense blocks' products and 1.7
        for the scaled ones). Wider cores (``n^3`` entries for the outer products):
        the dense kernels' scaled products.
        """
        n = self.core.shape[-1]
        if L2 is None or n > SHARED_OUTER_MAX:
            return super().product(L1, C1, L2, C2, counter)
        xp, M = self.xp, self.core
        p, bl = L2.shape[:2]
        counter.flops += 2 * p * bl * n**3
        outer = xp.reshape(xp.matrix_transpose(M)[:, :, None] * M[:, None, :], (n, n * n))
        return xp.reshape(xp.reshape(L2, (p * bl, n)) @ outer, (p, bl, n, n))

    def apply(self, L: Any, C: Any, X: Any, counter: Counter) -> Any:
        """``diag(L) M X``: one product with ``M`` for one sample's vectors, else the dense one."""
        if X.ndim != 3 or X.shape[1] != 1:  # samples or columns: the dense kernels' products
            return super().apply(L, C, X, counter)
        p, _, n = X.shape
        counter.flops += (2 * n * n + (0 if L is None else n)) * p
        CX = (X[:, 0, :] @ self.xp.matrix_transpose(self.core))[:, None, :]
        if L is not None:
            CX *= L
        return CX

    def densify(self, L: Any, C: Any, counter: Counter) -> Switch | None:
        """The dense kernels once the cores are the first level's products (fewer of them).

        ``diag(L_k) C_k`` becomes the core: no later level scales its products again.
        """
        if C.shape[0] == self.positions:
            return None
        if L is not None:
            counter.flops += C.shape[0] * C.shape[1] * C.shape[2] * C.shape[3]
            C *= L[1:, ..., None]  # in place: the new products, as wide as their scalings
        same = lambda G: G  # noqa: E731 (the right-hand sides keep their layout)
        return Switch(DenseKernels(self.xp), None, C, same, same)


# The widest core whose first products SharedCoreKernels forms from the outer products
# (n^3 entries: 256 KB at 32 in float64); at 32 one GEMM of them 2.3 ms against 2.8 for
# the dense blocks' products (1000 pairs, one thread, an Intel Xeon)
SHARED_OUTER_MAX = 32


class Switch:
    """A level boundary where the chain changed kernels (sparse to dense, say).

    ``kernels``, ``L`` and ``C`` go on from here; ``down(G)`` takes a right-hand
    side into the new layout, ``up(X)`` a solution back.
    """

    def __init__(self, kernels: Any, L: Any, C: Any, down: Callable, up: Callable) -> None:
        self.kernels, self.L, self.C, self.down, self.up = kernels, L, C, down, up


def depth(levels: list) -> int:
    """How many levels of reduction ``levels`` holds (a :class:`Switch` is none)."""
    return sum(not isinstance(level, Switch) for level in levels)


def _kernels(kernels: Any) -> Any:
    """A kernels object: itself, or the dense kernels of an array namespace.

    Told by ``densify``, which no array namespace has (CuPy's has a ``product``).
    """
    return kernels if hasattr(kernels, "densify") else DenseKernels(kernels)


def _dtype(cores: Any, bad: int) -> Any:
    """The dtype of a level's cores: a stack's, or pair ``bad``'s sparse cores' (a list)."""
    return cores.dtype if hasattr(cores, "dtype") else cores[bad][0].dtype


def factor(chain: Chain, counter: Counter, kernels: Any) -> list:
    """The matrix half of odd-even reduction: every level's blocks, right-hand sides aside.

    Level ``t`` keeps ``(kernels, L, C)`` of its chain, ``C`` the cores of
    positions ``1..m-1`` (position 0 has none), and reduces to the chain of the
    even positions, ``A_k A_{k-1}`` for even ``k`` (eq. def_back_prop2_even's
    pairing). ``kernels`` is a kernels object or an array namespace (dense).
    """
    kernels = _kernels(kernels)
    L, C = chain.L, chain.C
    levels: list = []
    while kernels.count(C) > 0:
        switch = kernels.densify(L, C, counter)
        if switch is not None:
            levels.append(switch)
            kernels, L, C = switch.kernels, switch.L, switch.C
            continue
        pairs = kernels.count(C) // 2  # even positions 2..2 pairs, each with the one before
        levels.append((kernels, L, C))
        rows = kernels.rows
        even, odd = slice(2, 2 * pairs + 1, 2), slice(1, 2 * pairs, 2)
        cores = kernels.product(rows(L, even), rows(C, odd), rows(L, odd),
                                rows(C, slice(0, 2 * pairs - 1, 2)), counter)
        bad = kernels.first_nonfinite(cores)
        if bad is not None:
            level = depth(levels)
            span = 2 ** level
            a = span * (bad + 1)  # core ``bad`` couples chain positions a and a - span
            raise ReductionOverflow.between(level, chain.order[a], chain.order[a - span],
                                            _dtype(cores, bad))
        L, C = kernels.join(rows(L, slice(0, 1)), rows(L, even)), cores
    return levels


def substitute(levels: list, G: Any, counter: Counter, kernels: Any = None) -> Any:
    """The right-hand-side half: reduce ``G`` level by level, then back-substitute.

    ``x_k = A_k x_{k-1} + G_k``: the even positions' right-hand sides gather
    their odd neighbours' going down, the odd unknowns follow from their even
    neighbours coming back up (one whole-level operation each way). The levels
    carry their kernels; a :class:`Switch` takes ``G`` into its layout going
    down and the solution back coming up.
    """
    eliminated: list = []
    for level in levels:
        if isinstance(level, Switch):
            G = level.down(G)
            eliminated.append(None)
            continue
        kernels, L, C = level
        rows, pairs = kernels.rows, kernels.count(C) // 2
        even, before = slice(2, 2 * pairs + 1, 2), slice(1, 2 * pairs, 2)
        rhs = kernels.add(kernels.apply(rows(L, even), rows(C, before), rows(G, before),
                                        counter), rows(G, even))
        eliminated.append(rows(G, slice(1, None, 2)))
        G = kernels.join(rows(G, slice(0, 1)), rhs)
        del rhs
    X = G
    for level, G_odd in zip(reversed(levels), reversed(eliminated)):
        if isinstance(level, Switch):
            X = level.up(X)
            continue
        kernels, L, C = level
        rows, odd = kernels.rows, kernels.count(G_odd)
        X = kernels.interleave(X, kernels.add(kernels.apply(
            rows(L, slice(1, None, 2)), rows(C, slice(0, None, 2)), rows(X, slice(0, odd)),
            counter), G_odd))
    return X


def parallel_factor(chain: Chain, counter: Counter, xp: Any) -> list[tuple]:
    """The matrix half of parallel cyclic reduction: the cores of every level.

    At level ``t`` (shift ``s = 2^(t-1)``) every position ``k >= s`` reads ``k - s``:
    ``x_k = A_k x_{k-s} + G_k``, the cores combining as ``A_k A_{k-s}`` for the next
    level. ``C[i]`` is the core of position ``first + i``; each level keeps
    ``(L, C, first)``.
    """
    L, C, first = chain.L, chain.C, 1
    m, shift, levels = chain.C.shape[0] + 1, 1, []
    kernels = DenseKernels(xp)
    rows = kernels.rows  # L = None (every scaling one) stays None
    while shift < m:
        levels.append((L, C, first))
        if 2 * shift < m:
            cores = product(rows(L, slice(2 * shift, None)), C[2 * shift - first:, ...],
                            rows(L, slice(shift, m - shift)),
                            C[shift - first: m - shift - first, ...], counter)
            bad = kernels.first_nonfinite(cores)
            if bad is not None:  # core ``bad`` couples positions a and a - 2 shift
                a = 2 * shift + bad
                raise ReductionOverflow.between(len(levels), chain.order[a],
                                                chain.order[a - 2 * shift], cores.dtype)
            C, first = cores, 2 * shift
        shift *= 2
    return levels


def parallel_substitute(levels: list[tuple], G: Any, counter: Counter, xp: Any) -> Any:
    """The right-hand-side half: ``G_k <- A_k G_{k-s} + G_k`` at every level, no way back."""
    m, shift = G.shape[0], 1
    for L, C, first in levels:
        rhs = apply(DenseKernels.rows(L, slice(shift, None)), C[shift - first:, ...],
                    G[: m - shift, ...], counter, xp) + G[shift:, ...]
        G = xp.concat([G[:shift, ...], rhs])
        del rhs
        shift *= 2
    return G
