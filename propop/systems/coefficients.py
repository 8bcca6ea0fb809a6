"""The coefficients of an operator: couplings and row scalings, stored stacked.

An operator (:mod:`.operator`) is a :mod:`.layout` plus these arrays. Couplings
come in one of three storages behind one interface (``len``, ``[j]``, ``shape(j)``,
:meth:`~DenseCouplings.map`):

- :class:`DenseCouplings`: dense stacks, ``(g, m, n)`` shared by every sample or
  ``(g, r, m, n)`` per sample (a recurrence's Jacobians); coupling ``j`` is the
  ``j``-th of their concatenation. A chain of one width is one stack, a network's
  own array (:meth:`FNN.stacks`); blocks of other widths are stacks of one, views
  of the weights, never copies.
- :class:`IdentityCouplings`: dense stacks of the identity (a stride-zero view),
  for chains whose scalings carry all: diagonal linear recurrences.
- :class:`SparseCouplings`: a list of matrices, sparse (``scipy.sparse``,
  ``cupyx.scipy.sparse``) or dense: the storage of any system with a sparse
  coupling (a convolution's Jacobian, pruned weights).

Row scalings (:class:`Scalings`) are block-indexed stacks over a period: the
per-sample slopes of the paper's shifted systems (eq. forw_prop_sys_shifted)
for all blocks of a chain in one array, for all steps of an RNN's layer in one
array, or one array per block where blocks differ.
"""

from __future__ import annotations

import bisect
import functools
import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from .. import backend

__all__ = ["DenseCouplings", "IdentityCouplings", "SparseCouplings", "Scalings", "couplings_of",
           "DENSE", "SPARSE", "PER_SAMPLE"]

# What a coupling is, as a product with it needs to know (:attr:`DenseCouplings.kinds`):
DENSE = "dense"  # one dense matrix (m, n) for every sample: ``M @ x`` broadcasts
SPARSE = "sparse"  # a sparse matrix (m, n)
PER_SAMPLE = "per-sample"  # one dense matrix per sample, (r, m, n)


class DenseCouplings:
    """Dense couplings in stacks; coupling ``j`` is the ``j``-th of their concatenation.

    Parameters
    ----------
    stacks : sequence of arrays
        Each ``(g, m, n)`` (one matrix for all samples) or ``(g, r, m, n)`` (one
        per sample), all of one backend.
    """

    sparse = False
    identity = False  # :class:`IdentityCouplings` are

    def __init__(self, stacks: Sequence[Any]) -> None:
        self.stacks = tuple(stacks)
        self._starts = tuple(itertools.accumulate((s.shape[0] for s in self.stacks), initial=0))

    def __len__(self) -> int:
        return self._starts[-1]

    def _where(self, j: int) -> tuple[int, int]:
        if not 0 <= j < len(self):
            raise IndexError(f"coupling {j} of {len(self)}")
        i = bisect.bisect_right(self._starts, j) - 1
        return i, j - self._starts[i]

    def __getitem__(self, j: int) -> Any:
        """Coupling ``j``: ``(m, n)``, or ``(r, m, n)`` per sample (a view)."""
        if len(self.stacks) == 1:
            return self.stacks[0][j, ...]
        i, p = self._where(j)
        return self.stacks[i][p, ...]

    def shape(self, j: int) -> tuple[int, int]:
        """``(m, n)`` of coupling ``j``."""
        return tuple(self.stacks[self._where(j)[0]].shape[-2:])

    @functools.cached_property
    def matrices(self) -> tuple:
        """Every coupling, a view, made once (every variant of an operator shares them)."""
        return tuple(M for stack in self.stacks for M in backend.walk(stack))

    @functools.cached_property
    def kinds(self) -> tuple:
        """Every coupling's kind: :data:`DENSE`, or :data:`PER_SAMPLE` in a 4-axis stack."""
        return tuple(kind for stack in self.stacks
                     for kind in (PER_SAMPLE if stack.ndim == 4 else DENSE,) * stack.shape[0])

    @property
    def stack(self) -> Any:
        """The one stack holding every coupling, or ``None`` where there are several."""
        return self.stacks[0] if len(self.stacks) == 1 else None

    @property
    def per_sample(self) -> bool:
        """Whether each sample has its own couplings (stacks ``(g, r, m, n)``)."""
        return any(s.ndim == 4 for s in self.stacks)

    def arrays(self) -> tuple:
        """The arrays stored."""
        return self.stacks

    def in_order(self, reverse: bool = False) -> Iterator:
        """The couplings one after another (or last first).

        One stack's views are made as they are reached; several stacks' are
        :attr:`matrices`, made once.
        """
        if len(self.stacks) == 1:
            return backend.walk(self.stacks[0], reverse)
        return reversed(self.matrices) if reverse else iter(self.matrices)

    def map(self, f: Callable[[Any], Any]) -> DenseCouplings:
        """The couplings with ``f`` applied to every stack."""
        return DenseCouplings([f(s) for s in self.stacks])


class IdentityCouplings(DenseCouplings):
    """Couplings that are all the identity: a chain ``x_k = c_k + s_k * x_{k-1}``.

    A diagonal linear recurrence (quasi-Newton's linearisation, an LSTM's cell
    states) stored as its row scalings alone. The stack is the ``n x n``
    identity broadcast over the couplings (a view with stride zero, no memory),
    so a method that reads it as dense matrices is exact; :attr:`identity` lets
    substitution, the operator's product and cyclic reduction work entrywise,
    ``O(nb n)`` a sample where dense couplings take ``O(nb n^2)`` and more.

    Parameters
    ----------
    eye : array, shape (n, n)
        The identity, of the operator's backend, dtype and device.
    count : int
        How many couplings (``nb - 1``).
    """

    identity = True

    def __init__(self, eye: Any, count: int) -> None:
        self.eye, self.count = eye, int(count)
        n = eye.shape[0]
        super().__init__([backend.namespace(eye).broadcast_to(eye[None, ...],
                                                              (self.count, n, n))])

    def map(self, f: Callable[[Any], Any]) -> IdentityCouplings:
        """The identity with ``f`` applied to its one ``n x n`` matrix (moved, not expanded)."""
        return IdentityCouplings(f(self.eye), self.count)


class SparseCouplings:
    """Couplings as a list of matrices, each sparse (``scipy.sparse``, ``cupyx``) or dense.

    Sparse matrices are canonical CSR arrays, each distinct matrix converted once
    (:func:`~propop._checks.as_coupling`: an RNN's edges share their templates).
    """

    sparse = True
    identity = False
    per_sample = False
    stack = None

    def __init__(self, matrices: Sequence[Any]) -> None:
        self.matrices = tuple(matrices)

    def __len__(self) -> int:
        return len(self.matrices)

    def __getitem__(self, j: int) -> Any:
        """Coupling ``j``."""
        return self.matrices[j]

    def shape(self, j: int) -> tuple[int, int]:
        """``(m, n)`` of coupling ``j``."""
        return tuple(self.matrices[j].shape)

    @functools.cached_property
    def kinds(self) -> tuple:
        """Every coupling's kind: :data:`SPARSE` or :data:`DENSE`."""
        return tuple(SPARSE if backend.is_sparse(M) else DENSE for M in self.matrices)

    def arrays(self) -> tuple:
        """The matrices stored."""
        return self.matrices

    def in_order(self, reverse: bool = False) -> Iterator:
        """The couplings one after another (or last first)."""
        return reversed(self.matrices) if reverse else iter(self.matrices)

    def map(self, f: Callable[[Any], Any]) -> SparseCouplings:
        """The couplings with ``f`` applied to every matrix (a shared one once)."""
        done: dict[int, Any] = {}
        for M in self.matrices:
            if id(M) not in done:
                done[id(M)] = f(M)
        return SparseCouplings([done[id(M)] for M in self.matrices])


def couplings_of(matrices: Sequence[Any], where: Callable[[int], str]) -> Any:
    """The storage of a list of matrices: :class:`SparseCouplings` if one is sparse.

    Dense ones become stacks of one (views); every matrix is checked (real,
    finite, canonical: :func:`~propop._checks.as_coupling`, ``where(j)`` naming it).
    """
    from .._checks import as_coupling

    done: dict[int, Any] = {}
    checked = []
    for j, M in enumerate(matrices):
        if id(M) not in done:
            done[id(M)] = as_coupling(M, where(j))
        checked.append(done[id(M)])
    if any(backend.is_sparse(M) for M in checked):
        return SparseCouplings(checked)
    return DenseCouplings([M[None, ...] for M in checked])


class Scalings:
    """Row scalings ``s_k`` of the blocks, stacked over a period.

    Block ``k >= first`` is entry ``(k - first) // per`` of stack
    ``(k - first) % per``; blocks before ``first`` are unscaled, and so are the
    blocks of a stack that is ``None``. Each stack is ``(count, n)`` for one
    vector, or ``(count, n, c)`` with ``c`` the samples or ``1`` (one column
    shared by every sample).

    - a chain of one width: ``first = 1``, one stack ``(nb - 1, n[, c])`` (the
      input block is unscaled);
    - a time layout: ``per`` = the layers of a step, stack ``k`` ``(tau, n_k[, c])``;
    - any other: one stack ``(1, n_k[, c])`` per block (``per = nb``).
    """

    def __init__(self, stacks: Sequence[Any], first: int, nblocks: int) -> None:
        self.stacks = tuple(stacks)
        self.first = int(first)
        self.nblocks = int(nblocks)

    @classmethod
    def per_block(cls, scales: Sequence[Any]) -> Scalings:
        """One stack per block, from ``None`` or ``(n_k[, c])`` arrays (views)."""
        return cls([None if s is None else s[None, ...] for s in scales], 0, len(scales))

    @classmethod
    def unscaled(cls, nblocks: int) -> Scalings:
        """No block scaled."""
        return cls((), nblocks, nblocks)

    @property
    def per(self) -> int:
        """The period: how many stacks."""
        return len(self.stacks)

    def __getitem__(self, k: int) -> Any:
        """Block ``k``'s scaling (a view), or ``None``."""
        if k < self.first or not self.stacks:
            return None
        p, q = divmod(k - self.first, self.per)
        stack = self.stacks[q]
        return None if stack is None else stack[p, ...]

    @functools.cached_property
    def blocks(self) -> tuple:
        """Every block's scaling, ``None`` or a view, made once."""
        return tuple(self[k] for k in range(self.nblocks))

    def in_order(self, reverse: bool = False) -> Iterator:
        """Every block's scaling in block order (or last first), views made as reached."""
        if self.per != 1:  # one stack per block: their views, made once
            return reversed(self.blocks) if reverse else iter(self.blocks)
        stack = self.stacks[0]
        rows = (itertools.repeat(None, self.nblocks - self.first) if stack is None
                else backend.walk(stack, reverse))
        head = itertools.repeat(None, self.first)
        return itertools.chain(rows, head) if reverse else itertools.chain(head, rows)

    @property
    def none(self) -> bool:
        """Whether no block is scaled."""
        return all(s is None for s in self.stacks)

    def arrays(self) -> tuple:
        """The stacks that are arrays."""
        return tuple(s for s in self.stacks if s is not None)

    def map(self, f: Callable[[Any], Any]) -> Scalings:
        """The scalings with ``f`` applied to every stack that is an array."""
        return Scalings([None if s is None else f(s) for s in self.stacks], self.first,
                        self.nblocks)
