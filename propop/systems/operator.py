"""The operator of a triangular system: structure and coefficients, no right-hand side.

An :class:`Operator` with blocks ``k = 0..nb-1`` is stored in its **row-scaled**
(unit-diagonal) form, the paper's eqs. bicgstab_scaled_forw_sys and
bicgstab_scaled_back_sys::

    x_k - s_k * (sum_e M_e x_col(e)) = c_k

over the edges ``e`` into block row ``k``, where ``M_e`` is a coupling matrix
(``W_k`` for the forward system, ``W_{k+1}^T`` for the backward one, shared by
all samples or one per sample) and ``s_k`` the per-sample row scaling (the
activation's secant or derivative). The paper's form
``(1/s_k) * x_k - sum_e M_e x_col(e) = c_k / s_k`` (diagonal blocks ``D``/``E``)
is the same operator with every row divided by ``s_k``; it exists only where no
``s_k`` is zero.

A batch of ``r`` samples has per-sample scalings (``samples = r``): the paper's
shifted systems (eqs. forw_prop_sys_shifted, back_prop_sys_shifted), one operator
for ``r`` right-hand sides. As lineax's operators, it never holds a vector: a
:class:`~propop.TriangularSystem` is an operator and a right-hand side, and every
system of one operator shares what the operator derived once (its blocks, edge
groups, explicit matrices), the work a :class:`~propop.Plan` does not repeat.

An operator is three things (docs/architecture.md): a :mod:`.layout` (a chain, a
time structure, a graph), its couplings in one of the two storages of
:mod:`.coefficients` (dense stacks, or a sparse list), and its scalings,
block-indexed stacks. The tags that methods ask about (:attr:`tags`) are
computed from them once; every other view (the blocks, edge groups, explicit
matrices, variants) is derived when first asked for and kept.
"""

from __future__ import annotations

import math
import functools
import numbers
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .. import backend, memory
from .blocks import NOT_A_CHAIN, Blocks, Edge
from .coefficients import DenseCouplings, Scalings
from .edge_groups import EdgeGroups
from .layout import Layout

__all__ = ["Operator", "FORMS", "TAGS"]

FORMS = ("scaled", "paper")

TAGS = ("chain", "time", "graph", "equal-widths", "stacked", "sparse", "per-sample",
        "shared-matrix", "diagonal")


class Operator:
    """A block lower or upper triangular operator ``A``: a layout, couplings and scalings.

    Made by :class:`~propop.TriangularSystem` from any of its constructor's
    forms (:func:`propop.systems.arguments.read`), and by the operator's own
    variants; not meant to be built by hand.

    Parameters
    ----------
    layout : Layout
        The blocks and the edges between them (:mod:`.layout`).
    couplings : DenseCouplings or SparseCouplings
        The matrix of each coupling the layout's edges name.
    scalings : Scalings
        The row scaling of each block.
    form : {"scaled", "paper"}
        Which of the two equivalent forms its views show.
    samples : int or None
        The number of samples the scalings describe (``None``: one vector).
    dtype, be
        The floating type and the :class:`~propop.backend.Backend`.
    names, paper_hint
        As for :class:`~propop.TriangularSystem`.
    """

    # The true operator of a batch-mean one (shared("mean")); False where a right-hand
    # side of another number of columns was given to it (set by the systems).
    approximates: Operator | None | bool = None

    def __init__(self, layout: Layout, couplings: Any, scalings: Scalings, *, dtype: Any,
                 be: backend.Backend, form: str = "scaled", samples: int | None = None,
                 names: Sequence[str] | Callable[[int], str] | None = None,
                 paper_hint: str = "") -> None:
        if form not in FORMS:
            raise ValueError(f"unknown form {form!r}; choose one of {FORMS}")
        self.layout, self.couplings, self.scalings = layout, couplings, scalings
        self.form = form
        self.samples = None if samples is None else int(samples)
        self._dtype, self.backend = dtype, be
        self._names, self._paper_hint = names, paper_hint
        if names is not None and not callable(names) and len(names) != self.nblocks:
            raise ValueError(f"{self.nblocks} blocks need {self.nblocks} names; got "
                             f"{len(names)}")
        if form == "paper":
            self._require_paper_form()

    @classmethod
    def of(cls, coupling: Sequence[Any] | None, row_scale: Sequence[Any] | None, *,
           lower: bool, sizes: Sequence[int], form: str = "scaled",
           names: Sequence[str] | Callable[[int], str] | None = None, paper_hint: str = "",
           edges: Sequence[tuple[int, int, Any]] | None = None, structure: Any = None,
           layer_scales: Sequence[Any] | None = None, coupling_stack: Any = None,
           scale_stack: Any = None, samples: int | None = None, like: Any = None) -> Operator:
        """The operator of :class:`~propop.TriangularSystem`'s constructor arguments, checked.

        ``like`` is an array of the operator's backend and dtype (a right-hand
        side), read for those two facts where the coefficients do not tell them.
        """
        from .arguments import read

        if form not in FORMS:
            raise ValueError(f"unknown form {form!r}; choose one of {FORMS}")
        # with a structure the sizes are its step's repeated (read checks it): no int()
        # for each of tau * layers blocks, 0.9 ms at tau = 10000
        sizes = tuple(sizes) if structure is not None else _int_sizes(sizes)
        if names is not None and not callable(names) and len(names) != len(sizes):
            raise ValueError(f"{len(sizes)} blocks need {len(sizes)} names; got {len(names)}")
        name = names if callable(names) else (
            (lambda k: names[k]) if names is not None else (lambda k: f"block {k}"))
        layout, couplings, scalings = read(
            coupling, row_scale, lower=bool(lower), sizes=sizes, edges=edges,
            structure=structure, layer_scales=layer_scales, coupling_stack=coupling_stack,
            scale_stack=scale_stack, samples=samples, name=name)
        be = backend.of(like, *couplings.arrays(), *scalings.arrays())  # mixed ones named
        return cls(layout, couplings, scalings, dtype=getattr(like, "dtype", None), be=be,
                   form=form, samples=samples, names=names, paper_hint=paper_hint)

    def _with(self, **changes: Any) -> Operator:
        """An operator like this one with ``changes`` to its parts."""
        args = dict(layout=self.layout, couplings=self.couplings, scalings=self.scalings,
                    dtype=self.dtype, be=self.backend, form=self.form, samples=self.samples,
                    names=self._names, paper_hint=self._paper_hint)
        args.update(changes)
        return Operator(**args)

    @functools.cached_property
    def names(self) -> tuple[str, ...]:
        """A name per block row for messages (made when first asked for)."""
        if callable(self._names):
            return tuple(self._names(k) for k in range(self.nblocks))
        if self._names is not None:
            return tuple(self._names)
        return tuple(f"block {k}" for k in range(self.nblocks))

    def label(self, k: int) -> str:
        """``"block <name>"`` of block row ``k`` for messages (the name alone if it says block)."""
        name = self._names(k) if callable(self._names) else self.names[k]
        return name if name.startswith("block ") else f"block {name}"

    # -- structure: the layout's --------------------------------------------------
    @property
    def lower(self) -> bool:
        """Lower (forward propagation) or upper (backward propagation) triangular."""
        return self.layout.lower

    @property
    def sizes(self) -> tuple[int, ...]:
        """The block sizes."""
        return self.layout.sizes

    @property
    def nblocks(self) -> int:
        """Number of diagonal blocks ``nb`` (``l + 1`` for an ``l``-layer FNN)."""
        return self.layout.nblocks

    @property
    def offsets(self) -> tuple[int, ...]:
        """Start of each block in the stacked vector, and ``N`` last (the layout's)."""
        return self.layout.offsets

    @property
    def is_chain(self) -> bool:
        """Whether the operator is block bi-diagonal, told from its layout alone."""
        return self.layout.is_chain

    def require_chain(self) -> None:
        """Raise ``ValueError`` unless the operator is block bi-diagonal (a chain)."""
        if not self.is_chain:
            raise ValueError(NOT_A_CHAIN)

    @property
    def width(self) -> int:
        """The widest block's size, ``max(sizes)`` (what padded stacks are as wide as)."""
        return self.layout.width

    @property
    def equal_sizes(self) -> bool:
        """Whether every block has the same size (then blocks reshape to a stack)."""
        return self.layout.equal_sizes

    @functools.cached_property
    def tags(self) -> frozenset:
        """What methods ask of an operator, computed once (a subset of :data:`TAGS`).

        ``"chain"``, ``"time"`` or ``"graph"`` (the layout; a graph that is block
        bi-diagonal is tagged ``"chain"`` too); ``"equal-widths"``; ``"stacked"``
        (a chain of one width whose couplings are one stack); ``"sparse"`` (some
        coupling is a sparse matrix); ``"per-sample"`` (each sample has its own
        couplings); ``"shared-matrix"`` (one matrix stored for every sample: no
        per-sample scaling or coupling); ``"diagonal"`` (no coupling at all). Told
        from the storage's shapes, never its values: a batch whose columns happen
        to be equal is found by :attr:`shares_matrix`, which reads them.
        """
        tags = {self.layout.kind}
        facts = {"chain": self.is_chain, "equal-widths": self.equal_sizes,
                 "stacked": self.coupling_stack is not None,
                 "sparse": self.sparse_couplings, "per-sample": self.per_sample_couplings,
                 "shared-matrix": self._scaled_once, "diagonal": not self.layout.coupled()}
        return frozenset(tags | {tag for tag, holds in facts.items() if holds})

    @property
    def size(self) -> int:
        """``N``, the number of unknowns of one sample (the layout's)."""
        return self.layout.size

    @property
    def device(self) -> Any:
        """The device of the stored arrays, where new ones are made (``None``: none stored)."""
        stored = self.couplings.arrays() + self.scalings.arrays()
        return backend.device(stored[0]) if stored else None

    @property
    def dtype(self) -> Any:
        """The floating type of the operator."""
        return self._dtype

    @property
    def nrhs(self) -> int | None:
        """The samples its scalings are for (:attr:`samples`): what shape-only questions ask."""
        return self.samples

    def __repr__(self) -> str:
        kind = "lower" if self.lower else "upper"
        samples = "" if self.samples is None else f", samples={self.samples}"
        return (f"Operator({kind}, nblocks={self.nblocks}, N={self.size}{samples}, "
                f"form={self.form!r}, dtype={self.dtype})")

    # -- the coefficients, as the methods read them --------------------------------
    @functools.cached_property
    def coupling_stack(self) -> Any:
        """A chain of one width's couplings: one ``(nb - 1[, r], n, n)`` stack, else ``None``."""
        if self.layout.kind != "chain" or not self.equal_sizes:
            return None
        return self.couplings.stack

    @functools.cached_property
    def scale_stack(self) -> Any:
        """A stacked chain's scalings of blocks ``1..nb-1`` (block 0 unscaled), or ``None``."""
        S = self.scalings
        if self.coupling_stack is None or S.first != 1 or S.per != 1:
            return None
        return S.stacks[0]

    @functools.cached_property
    def unscaled_stack(self) -> bool:
        """A chain given by its couplings alone: unit diagonal and no row scalings."""
        return self.coupling_stack is not None and self.scalings.none

    @property
    def per_sample_couplings(self) -> bool:
        """Whether each sample has its own couplings: a ``(nb - 1, r, n, n)`` stack."""
        return self.couplings.per_sample

    @functools.cached_property
    def structure(self) -> Any:
        """A time layout's :class:`~.time_structure.TimeStructure` with matrices, or ``None``."""
        if self.layout.kind != "time":
            return None
        from .time_structure import Template, TimeStructure

        L = self.layout
        return TimeStructure(L.tau, L.step_sizes, tuple(
            Template(t.row, t.col, t.offset, self.couplings[t.coupling]) for t in L.templates))

    @functools.cached_property
    def _edges(self) -> tuple:
        """``(row, col, matrix)`` per edge, unrolled (a view of the storage)."""
        if self.per_sample_couplings:
            raise ValueError(_PER_SAMPLE)
        matrices = self.couplings.matrices
        return tuple((row, col, matrices[c]) for row, col, c in self.layout.edges())

    @functools.cached_property
    def _row_scale(self) -> tuple:
        """The row scaling of every block, ``None`` or a view of its stack."""
        return self.scalings.blocks

    @property
    def _layer_scales(self) -> tuple | None:
        """A time layout's scalings stored per layer of a step, ``(tau, n_k[, c])``."""
        S = self.scalings
        if self.layout.kind != "time" or S.first != 0 or S.per != self.layout.per:
            return None
        return S.stacks

    # -- validation, once ---------------------------------------------------------
    def _require_paper_form(self) -> None:
        xp = self.backend.xp
        for stack in self.scalings.arrays():
            if bool(xp.all(stack != 0)):
                continue
            for k, s in enumerate(self._row_scale):
                if s is None or bool(xp.all(s != 0)):
                    continue
                flat = int(np.argmin(backend.to_host(s).reshape(-1) != 0))  # on the host
                index = [int(i) for i in np.unravel_index(flat, tuple(s.shape))]
                where = f"entry {index[0]}" + (f" of sample {index[1]}" if len(index) > 1
                                               else "")
                raise ValueError(f"{self.names[k]}: form='paper' needs the diagonal 1/s, "
                                 f"but s = 0 at {where}{self._paper_hint}; use "
                                 "form='scaled' (the default), which never divides")

    # -- variants -----------------------------------------------------------------
    def scaled(self) -> Operator:
        """The operator in the unit-diagonal form (itself if it is already)."""
        return self if self.form == "scaled" else self._variant("scaled", form="scaled")

    def paper(self) -> Operator:
        """The operator in the paper's form with diagonal blocks ``D``/``E``."""
        return self if self.form == "paper" else self._variant("paper", form="paper")

    def unstructured(self) -> Operator:
        """The same operator without its time :attr:`structure`: products edge by edge."""
        if self.layout.kind != "time":
            return self
        return self._variant("unstructured", layout=self.layout.unrolled())

    def within_steps(self) -> Operator:
        """A time layout's block diagonal over steps: the layers of each step, no recurrence.

        The diagonal blocks ``L^(s)``/``R^(s)`` of eqs. forw_prop_sub_sys_rnn and
        back_prop_sub_sys_rnn, for every step at once.
        """
        if self.layout.kind != "time":
            raise ValueError("within_steps() needs a system with a time structure (an RNN's)")
        return self._variant("within steps", layout=self.layout.within_steps())

    @functools.cached_property
    def _variants(self) -> dict:
        return {}

    def _variant(self, key: Any, **changes: Any) -> Operator:
        """``self._with(**changes)``, made once: a plan's solves reuse its views."""
        if key not in self._variants:
            self._variants[key] = self._with(**changes)
        return self._variants[key]

    @functools.cached_property
    def blocks(self) -> Blocks:
        """The structured view (:class:`Blocks`) that structure-aware solvers use."""
        paper = self.form == "paper"
        layout = self.layout.unrolled() if self.layout.kind == "time" else self.layout
        return Blocks(
            lower=self.lower,
            sizes=self.sizes,
            diagonal=tuple(None if not paper or s is None else 1 / s for s in self._row_scale),
            edges=tuple(Edge(row, col, M, None if paper else self._row_scale[row])
                        for row, col, M in self._edges),
            layout=layout,
        )

    def split(self, x: Any) -> list[Any]:
        """Views of the blocks ``x_0..x_{nb-1}`` of a stacked ``(N,)`` or ``(N, r)`` array."""
        if x.shape[0] != self.size:
            raise ValueError(f"x has {x.shape[0]} rows, expected N = {self.size}")
        o = self.offsets
        return [x[o[k]:o[k + 1], ...] for k in range(self.nblocks)]

    def sample(self, i: int) -> Operator:
        """The operator of sample ``i`` of a batch (views, no copies)."""
        r = self.samples
        if r is None:
            raise ValueError("sample(i) needs a batch system; this one has a single rhs")
        i = _integer(i, "sample(i)")
        if not -r <= i < r:
            raise IndexError(f"sample {i} out of range for a batch of {r}")
        i %= r
        couplings = (self.couplings.map(lambda C: C[:, i, ...] if C.ndim == 4 else C)
                     if self.per_sample_couplings else self.couplings)
        scalings = self.scalings.map(lambda s: s[..., i if s.shape[-1] > 1 else 0])
        return self._variant(("sample", i), couplings=couplings, scalings=scalings,
                             samples=None)

    def columns(self, start: int, stop: int) -> Operator:
        """The operator of samples ``start..stop-1`` of a batch (views, no copies)."""
        r = self.samples
        if r is None:
            raise ValueError("columns(start, stop) needs a batch system; this one has one "
                             "matrix for all its right-hand sides")
        start, stop = _integer(start, "columns(start, stop)"), _integer(stop,
                                                                     "columns(start, stop)")
        if not 0 <= start < stop <= r:
            raise IndexError(f"samples {start}..{stop - 1} out of range for a batch of {r}")
        couplings = (self.couplings.map(lambda C: C[:, start:stop, ...] if C.ndim == 4 else C)
                     if self.per_sample_couplings else self.couplings)
        scalings = self.scalings.map(lambda s: s[..., start:stop] if s.shape[-1] > 1 else s)
        return self._variant(("columns", start, stop), couplings=couplings, scalings=scalings,
                             samples=stop - start)

    @functools.cached_property
    def shares_matrix(self) -> bool:
        """Whether every sample of a batch has the same matrix (equal scaling columns).

        Each stack's first entry is compared first: a batch whose samples differ
        (a network's slopes) is told from one block, not the whole stack.
        """
        xp = self.backend.xp

        def equal(a: Any, axis: int) -> bool:  # every sample (along axis) as the first
            column = (lambda b: b[:, :1, ...]) if axis == 1 else (lambda b: b[..., :1])
            return all(bool(xp.all(b == column(b))) for b in (a[:1, ...], a))

        couplings = not self.per_sample_couplings or all(
            C.ndim == 3 or equal(C, 1) for C in self.couplings.arrays())
        return couplings and (self.samples is None or all(
            s.shape[-1] == 1 or equal(s, -1) for s in self.scalings.arrays()))

    @property
    def _scaled_once(self) -> bool:
        """Whether the matrix is stored once for all columns (scalings ``None`` or ``(n_k, 1)``)."""
        return not self.per_sample_couplings and self._scaled_once_scalings

    @property
    def _scaled_once_scalings(self) -> bool:
        return self.samples is None or all(s.shape[-1] == 1 for s in self.scalings.arrays())

    def shared(self, how: str = "exact") -> Operator:
        """The operator with one matrix for all samples (see :meth:`TriangularSystem.shared`)."""
        if how not in ("exact", "mean"):
            raise ValueError(f"how must be one of ('exact', 'mean'), got {how!r}")
        if self._scaled_once:
            return self
        if ("shared", how) not in self._variants:
            shared = self._shared(how)
            if how == "mean" and not self.shares_matrix:
                shared.approximates = self
            self._variants["shared", how] = shared
        return self._variants["shared", how]

    def _shared(self, how: str) -> Operator:
        """:meth:`shared`'s operator, without saying whether it approximates this one."""
        xp, exact = self.backend.xp, how == "exact"
        if exact and not self.shares_matrix:
            raise ValueError(_NOT_SHARED.format(where=self._first_differing()))
        couplings = self.couplings
        if self.per_sample_couplings:
            couplings = couplings.map(lambda C: C if C.ndim == 3 else (
                C[:, 0, ...] if exact else xp.mean(C, axis=1)))
        scalings = self.scalings
        if self.samples is not None:
            scalings = scalings.map(lambda s: s if s.shape[-1] == 1 else (
                s[..., :1] if exact else xp.mean(s, axis=-1, keepdims=True)))
        return self._with(couplings=couplings, scalings=scalings)

    def _first_differing(self) -> str:
        """What differs between samples, for :meth:`shared`'s message: a coupling or a block."""
        xp = self.backend.xp
        if any(C.ndim == 4 and not bool(xp.all(C == C[:, :1, ...]))
               for C in self.couplings.arrays()):
            return "a coupling"
        S = self.scalings
        first = self.nblocks
        for q, s in enumerate(S.stacks):
            if s is None or s.ndim < 3 or s.shape[-1] == 1:
                continue
            same = xp.all(xp.reshape(s == s[..., :1], (s.shape[0], -1)), axis=1)
            if not bool(xp.all(same)):
                first = min(first, S.first + q + S.per * int(np.argmin(backend.to_host(same))))
        return f"{self.names[first]}: the row scaling"

    def to(self, kind: str, device: Any = None) -> Operator:
        """The same operator with its arrays on backend ``kind`` (:meth:`TriangularSystem.to`).

        The backend without sparse arrays (the strict namespace) takes sparse
        couplings as dense ones, within the memory budget.
        """
        move = functools.partial(backend.convert, kind=kind, device=device)
        like = move(self.backend.xp.zeros(1, dtype=self.dtype))
        source, couplings = self, self.couplings
        if couplings.sparse and kind in backend.DENSE_ONLY:
            shapes = [couplings.shape(j) for j in range(len(couplings))]
            memory.require(sum(m * n for m, n in shapes) * backend.itemsize(self.dtype),
                           f"the sparse couplings of {self!r} as dense {kind} arrays",
                           "keep the system on 'numpy' or 'cupy', which have sparse arrays")
            source = self._with(couplings=DenseCouplings(
                [backend.dense(M)[None, ...] for M in couplings.matrices]))
        return source.mapped(move, backend.of(like), like.dtype)

    def mapped(self, f: Callable[[Any], Any], be: backend.Backend, dtype: Any) -> Operator:
        """The same operator with ``f`` applied to every stored array, now on ``be``.

        :meth:`to` moves the arrays; the memory guard makes shape-only ones.
        """
        return self._with(couplings=self.couplings.map(f), scalings=self.scalings.map(f),
                          dtype=dtype, be=be)

    @property
    def batch(self) -> Operator:
        """The operator for 2-D right-hand sides: itself, or a vector's with one column.

        A single-vector operator's scalings ``(n,)`` become ``(n, 1)`` (views), so
        that methods see every right-hand side as ``(N, c)`` (:mod:`.make_system`).
        Itself is not cached: an operator holding itself would be a reference
        cycle, its arrays freed only by the cyclic garbage collector (fresh pages
        at every call of a loop, the memory of several systems at once).
        """
        return self if self.samples is not None else self._one_column

    @functools.cached_property
    def _one_column(self) -> Operator:
        """A single-vector operator with its scalings as ``(n, 1)`` views (:attr:`batch`)."""
        return self._with(scalings=self.scalings.map(lambda s: s[..., None]), samples=1)

    def restricted(self, keep: Callable[[int, int], bool]) -> Operator:
        """The operator with only the couplings ``(row, col)`` for which ``keep`` holds."""
        return self._with(layout=self.layout.restricted(keep))

    def subsystem(self, blocks: Sequence[int]) -> Operator:
        """The operator of ``blocks`` alone (sorted), with the couplings among them only."""
        keep = sorted(int(k) for k in blocks)
        return self._with(layout=self.layout.subset(keep),
                          scalings=Scalings.per_block([self._row_scale[k] for k in keep]),
                          names=[self.names[k] for k in keep])

    # -- products -----------------------------------------------------------------
    @functools.cached_property
    def _periodic(self) -> dict:
        return {}

    def periodic_scales(self, period: int) -> list:
        """Row scalings of blocks ``k, k + period, ...`` stacked, for each ``k < period``.

        The per-layer, all-steps view of a time-major operator (cached).
        """
        S = self.scalings
        if S.first == 0 and S.per == period:
            return list(S.stacks)  # stored that way
        if period not in self._periodic:
            xp, rows = self.backend.xp, self._row_scale
            self._periodic[period] = [None if rows[k] is None else xp.stack(rows[k::period])
                                      for k in range(period)]
        return self._periodic[period]

    def ready(self, transpose: bool = False) -> Operator:
        """Build what :meth:`apply` needs (its edge groups), once: a plan's solves then don't.

        ``transpose``: what ``apply(x, transpose=True)`` needs too. Returns the operator.
        """
        if self.layout.kind != "time" and not self._applies_stacked:
            self._forward_groups  # noqa: B018 (a cached property, built here)
            if transpose:
                self._transposed_groups  # noqa: B018
        return self

    @property
    def _applies_stacked(self) -> bool:
        """Whether :meth:`apply` multiplies the stacks as they are (no edge groups)."""
        return self.coupling_stack is not None and (self.scale_stack is not None
                                                    or self.unscaled_stack)

    def accepts(self, x: Any) -> bool:
        """Whether ``x`` is a vector this operator applies to: ``(N,)`` or ``(N, columns)``.

        A batch's own number of columns, or any number where the matrix is shared.
        """
        if self.samples is None:
            return tuple(x.shape) == (self.size,)
        return x.ndim == 2 and x.shape[0] == self.size and (
            x.shape[1] == self.samples or self._scaled_once)

    def apply(self, x: Any, transpose: bool = False) -> Any:
        """``A x`` (or ``A^T x``) for ``x`` of :meth:`accepts`, sample by sample.

        One product with each coupling matrix for all samples at once
        (eqs. forw_prop_matvec, back_prop_matvec); the matrix is never assembled.
        With a :attr:`structure`, one product per repeated coupling for all
        time steps at once.
        """
        if not self.accepts(x):
            expected = (self.size,) if self.samples is None else (self.size, self.samples)
            raise ValueError(f"x has shape {tuple(x.shape)}, expected {expected}")
        if self.layout.kind == "time":
            return self.structure.apply(self, x, transpose)
        if self._applies_stacked:
            return self._apply_stacked(x, transpose)
        D = self._diagonal
        out = x * 1 if D is None else (D[:, 0] if x.ndim == 1 else D) * x
        groups = self._transposed_groups if transpose else self._forward_groups
        return groups.subtract_from(out, x)

    @functools.cached_property
    def _forward_groups(self) -> EdgeGroups:
        """The couplings grouped by shape for :meth:`apply` (built once)."""
        return EdgeGroups(self.blocks, self.offsets, self.backend, transpose=False)

    @functools.cached_property
    def _transposed_groups(self) -> EdgeGroups:
        """The couplings grouped by shape for :meth:`apply` with ``transpose``."""
        return EdgeGroups(self.blocks, self.offsets, self.backend, transpose=True)

    @functools.cached_property
    def _diagonal(self) -> Any:
        """The diagonal of this form as one ``(N, c)`` array; ``None`` if it is the identity."""
        diagonal, xp = self.blocks.diagonal, self.backend.xp
        if all(d is None for d in diagonal):
            return None
        c = max(1 if d is None or d.ndim == 1 else d.shape[1] for d in diagonal)
        return xp.concat([xp.ones((n, c), dtype=self.dtype) if d is None else
                               xp.broadcast_to(xp.reshape(d, (n, -1)), (n, c))
                               for n, d in zip(self.sizes, diagonal)])

    def _apply_stacked(self, x: Any, transpose: bool) -> Any:
        """:meth:`apply` of a chain given by its stacks: one batched product for all blocks.

        Block rows ``out_k = d_k x_k - s_k M_j x_nbr`` (scaled form: ``d = 1``;
        paper form: ``d = 1/s`` and no ``s`` on the coupling); the transpose
        moves each coupling's term to its column block. Identity couplings
        (:class:`~.coefficients.IdentityCouplings`) take no product at all.
        """
        xp, nb = self.backend.xp, self.nblocks
        X = xp.reshape(x, (nb, self.sizes[0]) + tuple(x.shape[1:]))
        rows, cols = (slice(1, None), slice(0, -1)) if self.lower else (slice(0, -1),
                                                                       slice(1, None))
        paper = self.form == "paper" and self.scale_stack is not None  # d = 1/s, unscaled M
        scales = None if paper or self.scale_stack is None else self._coupling_scales
        out = X / self._block_scales if paper else X * 1
        inner = (lambda v: v[..., None]) if x.ndim == 1 else (lambda v: v)
        outer = (lambda v: v[..., 0]) if x.ndim == 1 else (lambda v: v)
        M = self.coupling_stack
        if self.per_sample_couplings:  # columns as a batch axis: (nb - 1, r, n, 1)
            inner = lambda v: xp.permute_dims(v, (0, 2, 1))[..., None]  # noqa: E731
            outer = lambda v: xp.permute_dims(v[..., 0], (0, 2, 1))  # noqa: E731
        identity = self.couplings.identity
        if transpose:
            source = X[rows, ...] if scales is None else scales * X[rows, ...]
            out[cols, ...] -= source if identity else outer(
                backend.block_matmul(xp.matrix_transpose(M), inner(source)))
        else:  # a new array, scaled in place
            product = X[cols, ...] * 1 if identity else outer(
                backend.block_matmul(M, inner(X[cols, ...])))
            if scales is not None:
                product *= scales
            out[rows, ...] -= product
        return xp.reshape(out, tuple(x.shape))

    @functools.cached_property
    def _coupling_scales(self) -> Any:
        """The row scaling of each coupling of :attr:`scale_stack`'s chain, stacked like them."""
        S = self.scale_stack
        if self.lower:
            return S
        return self.backend.xp.concat([self.backend.xp.ones_like(S[:1, ...]), S[:-1, ...]])

    @functools.cached_property
    def _block_scales(self) -> Any:
        """Every block's scaling (row 0's is one), ``(nb, n[, c])``: the paper form's ``1/d``."""
        S = self.scale_stack
        return self.backend.xp.concat([self.backend.xp.ones_like(S[:1, ...]), S])

    def unit_rows(self, R: Any) -> Any:
        """``D^{-1} R``: a residual of this form as the unit-diagonal form's (``R`` if scaled).

        ``R`` is ``(N,)`` or ``(N, c)``; the accuracy contract
        (:mod:`propop.solvers.convergence`) judges this residual.
        """
        if self.form == "scaled":
            return R
        parts = [r if s is None else (s if s.ndim == r.ndim else s[:, None]) * r
                 for r, s in zip(self.split(R), self._row_scale)]
        return self.backend.xp.concat(parts)

    def to_form(self, rhs: Any) -> Any:
        """A scaled right-hand side as this form's: each block divided by its scaling."""
        if self.form == "scaled":
            return rhs
        return self.backend.xp.concat(
            [c if s is None else c / (s if s.ndim == c.ndim else s[:, None])
             for c, s in zip(self.split(rhs), self._row_scale)])

    def from_form(self, rhs: Any) -> Any:
        """A right-hand side of this form as the scaled form's (:meth:`to_form` undone)."""
        if self.form == "scaled":
            return rhs
        return self.backend.xp.concat(
            [c if d is None else c / (d if d.ndim == c.ndim else d[:, 0])
             for c, d in zip(self.split(rhs), self.blocks.diagonal)])

    @functools.cached_property
    def row_scale_max(self) -> float:
        """``max |s|`` over the paper form's row scalings (``1`` for the scaled form)."""
        if self.form == "scaled":
            return 1.0
        xp = self.backend.xp
        return max([1.0] + [float(xp.max(xp.abs(s))) for s in self._row_scale
                            if s is not None and math.prod(s.shape)])

    @functools.cached_property
    def sparse_couplings(self) -> bool:
        """Whether some coupling is a sparse matrix (told without unrolling a structure)."""
        if not self.couplings.sparse:
            return False
        return any(self.backend.sparse.issparse(self.couplings[c]) for c in self.layout.used())

    @functools.cached_property
    def _views(self) -> dict:
        """The explicit matrices and operators built per number of columns (:mod:`.assemble`)."""
        return {}

    def view(self, kind: str, columns: int | None, build: Callable[[], Any]) -> Any:
        """``build()``'s view of kind ``kind`` for ``columns`` right-hand sides, built once."""
        key = (kind, columns)
        if key not in self._views:
            self._views[key] = build()
        return self._views[key]


_NOT_SHARED = ("{where} differs between samples, so each sample has its own matrix and "
               "this needs one shared matrix; use a batched method ('batched-gmres', "
               "'batched-bicgstab'), or the batch-mean matrix (how='mean'; "
               "shared_diagonal='mean' in the block methods), an approximation")
_PER_SAMPLE = ("each sample of this system has its own couplings (a per-sample "
               "coupling_stack), so it has no shared edges or blocks: solve it with a method "
               "for stacked chains (substitution, cyclic-reduction, parallel-cyclic-reduction, "
               "jacobi, batched-gmres, batched-bicgstab, the scipy.* methods), or take one "
               "sample's system with sample(i)")


def _integer(value: Any, where: str) -> int:
    """``value`` as an index, or ``TypeError`` naming ``where``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{where} takes an integer index, got {value!r}")
    return int(value)


def _int_sizes(sizes: Sequence[Any]) -> tuple[int, ...]:
    """The block sizes as Python ints, or ``ValueError`` naming one that is not an integer.

    Equal ones are one int repeated (``map(int)`` cost 40 us at 1025 blocks); the
    others are compared with their ints at once (a size of 2.5 is not a block of 2).
    """
    sizes = tuple(sizes)
    equal = bool(sizes) and sizes.count(sizes[0]) == len(sizes)
    try:
        ints = (int(sizes[0]),) * len(sizes) if equal else tuple(map(int, sizes))
    except (TypeError, ValueError):
        ints = ()
    if ints != sizes:
        k = next((k for k, n in enumerate(sizes) if not _is_integer(n)), 0)
        raise ValueError(f"block sizes must be integers, got {sizes[k]!r} for block {k}")
    return ints


def _is_integer(n: Any) -> bool:
    try:
        return int(n) == n
    except (TypeError, ValueError):
        return False
