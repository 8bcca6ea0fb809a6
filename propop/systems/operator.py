"""The operator of a triangular system: structure and coefficients, no right-hand side.

An :class:`Operator` with blocks ``k = 0..nb-1`` is stored in its **row-scaled**
(unit-diagonal) form, the paper's eqs. bicgstab_scaled_forw_sys and
bicgstab_scaled_back_sys::

    x_k - s_k * (M_j x_nbr) = c_k

where ``M_j`` is the coupling matrix shared by all samples (``W_k`` for the
forward system, ``W_{k+1}^T`` for the backward one), ``s_k`` the per-sample row
scaling (the activation's secant or derivative) and ``nbr = k - 1`` (lower)
or ``k + 1`` (upper). The paper's form ``(1/s_k) * x_k - M_j x_nbr = c_k / s_k``
(diagonal blocks ``D``/``E``) is the same operator with every row divided by
``s_k``; it exists only where no ``s_k`` is zero.

A batch of ``r`` samples has per-sample scalings (``samples = r``): the paper's
shifted systems (eqs. forw_prop_sys_shifted, back_prop_sys_shifted), one operator
for ``r`` right-hand sides. As lineax's operators, it never holds a vector: a
:class:`~propop.TriangularSystem` is an operator and a right-hand side, and every
system of one operator shares what the operator derived once (its blocks, edge
groups, explicit matrices), the work a :class:`~propop.Plan` does not repeat.

Coefficients come in one of four representations: per-block couplings of a chain,
general edges, a time structure of repeated templates (RNNs), or stacks of equal
widths (``coupling_stack``, ``scale_stack``); the views below are the same for all.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import numbers
from collections.abc import Callable, Sequence
from typing import Any

from .. import backend
from .._checks import as_coupling, require_finite
from .blocks import NOT_A_CHAIN, Blocks, Edge
from .edge_groups import EdgeGroups

__all__ = ["Operator", "FORMS", "one_dtype"]

FORMS = ("scaled", "paper")


class Operator:
    """A block lower or upper triangular operator ``A``, block bi-diagonal or general.

    Parameters
    ----------
    coupling : sequence of matrices, or None
        For a block bi-diagonal operator (a chain): ``nb - 1`` shared coupling
        matrices; ``coupling[j]`` has shape ``(n_{j+1}, n_j)`` for a lower one
        and ``(n_j, n_{j+1})`` for an upper one. ``None`` when ``edges`` is given.
    row_scale : sequence or None
        ``nb`` row scalings ``s_k``: ``None`` (one) or an array of shape
        ``(n_k,)``, or ``(n_k, r)`` / ``(n_k, 1)`` for ``samples = r``.
    lower, sizes, form, names, paper_hint, edges, structure, layer_scales,
    coupling_stack, scale_stack
        As for :class:`~propop.TriangularSystem`.
    samples : int or None
        The number of samples the scalings describe (``None``: one vector).
    like : array
        An array of the operator's backend and dtype (a right-hand side): read
        for those two facts only, where the coefficients do not tell them.
    """

    # The true operator of a batch-mean one (shared("mean")); False where a right-hand
    # side of another number of columns was given to it (set by the systems).
    approximates: Operator | None | bool = None

    def __init__(self, coupling: Sequence[Any] | None, row_scale: Sequence[Any] | None, *,
                 lower: bool, sizes: Sequence[int], form: str = "scaled",
                 names: Sequence[str] | Callable[[int], str] | None = None,
                 paper_hint: str = "", edges: Sequence[tuple[int, int, Any]] | None = None,
                 structure: Any = None, layer_scales: Sequence[Any] | None = None,
                 coupling_stack: Any = None, scale_stack: Any = None,
                 samples: int | None = None, like: Any = None) -> None:
        if form not in FORMS:
            raise ValueError(f"unknown form {form!r}; choose one of {FORMS}")
        if backend.of(like).name == "torch" and coupling_stack is None:
            raise ValueError(_TORCH_STACKS)
        self.sizes = tuple(map(int, sizes))
        self.lower = bool(lower)
        self.form = form
        self.samples = None if samples is None else int(samples)
        self._names = names
        self._paper_hint = paper_hint
        self._dtype = getattr(like, "dtype", None)
        self.structure = structure
        self._layer_scales = None if layer_scales is None else tuple(layer_scales)
        self.coupling_stack = self._checked_stack(coupling_stack, "coupling_stack", ())
        self.scale_stack = self._checked_stack(
            scale_stack, "scale_stack", (self.samples, 1) if self.samples is not None
            else (None,))
        if coupling_stack is not None and (coupling is not None or edges is not None):
            raise ValueError("give coupling_stack instead of coupling or edges, not both")
        if scale_stack is not None and (row_scale is not None or layer_scales is not None):
            raise ValueError("give scale_stack instead of row_scale, not both")
        if structure is not None:
            if coupling is not None or edges is not None:
                raise ValueError("a structure gives the couplings: no coupling or edges too")
            if (row_scale is None) == (layer_scales is None):
                raise ValueError("give either row_scale or layer_scales with a structure")
            self.structure = structure.canonical()
            matrices = [t.M for t in self.structure.templates]
        elif coupling_stack is not None:  # its edges are views, made when asked for
            matrices = [coupling_stack]
        else:
            if (coupling is None) == (edges is None):
                raise ValueError("give either coupling (a chain) or edges, not both")
            self.__dict__["_edges"] = _canonical_edges(
                edges if edges is not None else _chain_edges(self.lower, coupling))
            matrices = [M for _, _, M in self._edges]
        if row_scale is not None or (structure is None and scale_stack is None):
            self.__dict__["_row_scale"] = (tuple(row_scale) if row_scale is not None
                                           else (None,) * len(self.sizes))
        scales = (self.scale_stack,) if scale_stack is not None else (
            layer_scales if layer_scales is not None else row_scale or ())
        self.backend = backend.of(like, *matrices, *scales)  # mixed backends are named
        self._validate()
        if form == "paper":
            self._require_paper_form()

    @functools.cached_property
    def names(self) -> tuple[str, ...]:
        """A name per block row for messages (made when first asked for)."""
        if callable(self._names):
            return tuple(self._names(k) for k in range(self.nblocks))
        if self._names is not None:
            return tuple(self._names)
        return tuple(f"block {k}" for k in range(self.nblocks))

    @functools.cached_property
    def _edges(self) -> tuple:
        """``(row, col, matrix)`` per coupling; a structure's or a stack's made when asked for."""
        if self.structure is None:
            if self.per_sample_couplings:
                raise ValueError(_PER_SAMPLE)
            return _chain_edges(self.lower, self.coupling_stack)
        return tuple(self.structure.edges())

    @functools.cached_property
    def unscaled_stack(self) -> bool:
        """A chain given by its couplings alone: unit diagonal and no row scalings.

        Cached: :meth:`apply` asks at every product, and the scalings are per block.
        """
        return (self.coupling_stack is not None and self.scale_stack is None
                and all(s is None for s in self._row_scale))

    @property
    def per_sample_couplings(self) -> bool:
        """Whether each sample has its own couplings: a ``(nb - 1, r, n, n)`` stack."""
        return self.coupling_stack is not None and self.coupling_stack.ndim == 4

    @functools.cached_property
    def _row_scale(self) -> tuple:
        """The row scaling of every block; a structure's or a stack's are views of it."""
        if self.structure is None:
            return (None,) + tuple(self.scale_stack)
        per, tau = len(self.structure.sizes), self.structure.tau
        return tuple(None if layer is None else layer[s] for s in range(tau)
                     for layer in self._layer_scales[:per])

    # -- structure ----------------------------------------------------------------
    @property
    def nblocks(self) -> int:
        """Number of diagonal blocks ``nb`` (``l + 1`` for an ``l``-layer FNN)."""
        return len(self.sizes)

    @functools.cached_property
    def offsets(self) -> tuple[int, ...]:
        """Start of each block in the stacked vector, and ``N`` last."""
        return tuple(itertools.accumulate(self.sizes, initial=0))

    @functools.cached_property
    def is_chain(self) -> bool:
        """Whether the operator is block bi-diagonal (:attr:`Blocks.is_chain`).

        A time structure over more than one step with recurrent couplings is not;
        it is told without unrolling the blocks.
        """
        if self.structure is not None and self.structure.tau > 1 and any(
                t.offset != 0 for t in self.structure.templates):
            return False
        return self.coupling_stack is not None or self.blocks.is_chain

    def require_chain(self) -> None:
        """Raise ``ValueError`` unless the operator is block bi-diagonal (a chain)."""
        if not self.is_chain:
            raise ValueError(NOT_A_CHAIN)

    @functools.cached_property
    def equal_sizes(self) -> bool:
        """Whether every block has the same size (then blocks reshape to a stack)."""
        return len(set(self.sizes)) == 1

    @functools.cached_property
    def block_starts(self) -> Any:
        """The first entry of every block, as an index array of the backend."""
        return self.backend.xp.asarray(self.offsets[:-1])

    @property
    def size(self) -> int:
        """``N``, the number of unknowns of one sample."""
        return self.offsets[-1]

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

    # -- validation, once ---------------------------------------------------------
    def _validate(self) -> None:
        nb = self.nblocks
        if self._names is not None and not callable(self._names) and len(self._names) != nb:
            raise ValueError(f"{nb} blocks need {nb} names; got {len(self._names)}")
        if min(self.sizes, default=0) < 1:
            raise ValueError(f"block sizes must be >= 1, got {self.sizes}")
        if self.structure is not None:
            self._validate_structure()
        elif self.coupling_stack is None:
            self._validate_edges()
        if "_row_scale" in self.__dict__ and self.scale_stack is None:
            self._validate_row_scales()
        self._require_finite_scales()

    def _checked_stack(self, stack: Any, what: str, columns: tuple) -> Any:
        """``stack`` checked once: couplings ``(nb - 1[, r], n, n)``, scalings ``(nb - 1, n[, c])``.

        ``columns`` are the allowed trailing sizes of a scaling (``None``: no axis).
        """
        if stack is None:
            return None
        nb, n = len(self.sizes), self.sizes[0]
        shape = tuple(getattr(stack, "shape", ()))
        want_r = True
        if not columns and len(shape) == 4 and self.samples is not None:  # per sample
            shape, want_r = shape[:1] + shape[2:], shape[1] == self.samples
        trailing = shape[2:] or (None,)
        want = (nb - 1, n) + (n,) * (not columns)
        fits = want_r and shape[:2 + (not columns)] == want and (
            len(trailing) == 1 and (trailing[0] in columns or not columns))
        if set(self.sizes) != {n} or not fits or not backend.is_real_floating(stack):
            shapes = " or ".join(str(want + ((c,) if c else ())) for c in columns) or (
                f"{want} or, per sample, ({nb - 1}, r, {n}, {n})")
            raise ValueError(f"{what} must be a real floating array of shape {shapes} for "
                             f"{nb} blocks of one width, got {getattr(stack, 'shape', None)} "
                             f"and block sizes {sorted(set(self.sizes))}")
        if not columns:  # scalings are checked with the others
            require_finite(stack, f"{what} (index (j, i, k): coupling j)")
        return stack

    def _validate_structure(self) -> None:
        """The templates and the stacked layer scalings, once per layer, not per block."""
        structure = self.structure
        per, tau = len(structure.sizes), structure.tau
        if self.sizes != tuple(structure.sizes) * tau:
            raise ValueError(f"the blocks' sizes are not the structure's {structure.sizes} "
                             f"repeated over {tau} steps")
        for t in structure.templates:
            ahead = t.offset < 0 or (t.offset == 0 and t.row > t.col)
            behind = t.offset > 0 or (t.offset == 0 and t.row < t.col)
            if not (0 <= t.row < per and 0 <= t.col < per and abs(t.offset) <= 1) or \
                    not (ahead if self.lower else behind):
                kind = "lower" if self.lower else "upper"
                raise ValueError(f"template (layer {t.row} reads layer {t.col} at step "
                                 f"offset {t.offset}) is not strictly {kind} triangular")
            want = (structure.sizes[t.row], structure.sizes[t.col])
            if tuple(t.M.shape) != want:
                raise ValueError(f"template (layer {t.row} reads layer {t.col}) has shape "
                                 f"{tuple(t.M.shape)}, expected {want}")
        if self._layer_scales is None:
            return
        if len(self._layer_scales) != per:
            raise ValueError(f"{per} layers need {per} layer scalings, got "
                             f"{len(self._layer_scales)}")
        batch = () if self.samples is None else (self.samples,)
        for k, s in enumerate(self._layer_scales):
            want = (tau, structure.sizes[k]) + batch
            if s is not None and (not backend.is_real_floating(s)
                                  or (s.shape != want and s.shape != want[:2] + (1,))):
                raise ValueError(f"layer {k}: stacked scalings have shape "
                                 f"{getattr(s, 'shape', None)}, expected {want} (time, "
                                 "features[, samples]) of a real floating type")

    def _validate_edges(self) -> None:
        nb = self.nblocks
        for j, (row, col, M) in enumerate(self._edges):
            if not (0 <= row < nb and 0 <= col < nb) or (row > col) != self.lower \
                    or row == col:
                kind = "lower" if self.lower else "upper"
                raise ValueError(f"coupling {j} sits in block row {row}, column {col}: not "
                                 f"strictly {kind} triangular in {nb} blocks")
            want = (self.sizes[row], self.sizes[col])
            if tuple(M.shape) != want:
                raise ValueError(f"coupling {j} (block row {row}, column {col}) has shape "
                                 f"{tuple(M.shape)}, expected {want}: the blocks' sizes")

    def _validate_row_scales(self) -> None:
        if len(self._row_scale) != self.nblocks:
            raise ValueError(f"{self.nblocks} blocks need {self.nblocks} row scalings; got "
                             f"{len(self._row_scale)}")
        for k, s in enumerate(self._row_scale):
            if s is None:
                continue
            if not backend.is_real_floating(s):
                raise ValueError(f"{self.names[k]}: row scaling must be a real floating array")
            want = (self.sizes[k],) if self.samples is None else (self.sizes[k], self.samples)
            if s.shape != want and not (self.samples is not None
                                        and s.shape == (self.sizes[k], 1)):
                raise ValueError(f"{self.names[k]}: row scaling has shape {s.shape}, "
                                 f"expected {want}")

    def _require_finite_scales(self) -> None:
        """One pass over all scalings; the per-block search only when one is bad."""
        xp = self.backend.xp
        scales = [s for s in self._scalings if s is not None]
        if not scales or bool(xp.isfinite(scales[0] if len(scales) == 1 else xp.concatenate(
                [s.reshape(-1) for s in scales])).all()):
            return
        for k, s in enumerate(self._row_scale):
            if s is not None:
                require_finite(s, f"{self.names[k]}: row scaling")

    def _require_paper_form(self) -> None:
        xp = self.backend.xp
        for k, s in enumerate(self._row_scale):
            if s is None or bool(xp.all(s != 0)):
                continue
            flat = int(xp.argmin((s != 0).reshape(-1)))
            index = [int(i) for i in xp.unravel_index(flat, s.shape)]
            where = f"entry {index[0]}" + (f" of sample {index[1]}" if len(index) > 1 else "")
            raise ValueError(f"{self.names[k]}: form='paper' needs the diagonal 1/s, but "
                             f"s = 0 at {where}{self._paper_hint}; use form='scaled' "
                             "(the default), which never divides")

    # -- variants -----------------------------------------------------------------
    def scaled(self) -> Operator:
        """The operator in the unit-diagonal form (itself if it is already)."""
        return self if self.form == "scaled" else self._variant("scaled", form="scaled")

    def paper(self) -> Operator:
        """The operator in the paper's form with diagonal blocks ``D``/``E``."""
        return self if self.form == "paper" else self._variant("paper", form="paper")

    def unstructured(self) -> Operator:
        """The same operator without its :attr:`structure`: products edge by edge."""
        return self if self.structure is None else self._variant("unstructured",
                                                                  structure=None)

    @functools.cached_property
    def _variants(self) -> dict:
        return {}

    def _variant(self, key: Any, **changes: Any) -> Operator:
        """``self._with(**changes)``, made once: a plan's solves reuse its views."""
        if key not in self._variants:
            self._variants[key] = self._with(**changes)
        return self._variants[key]

    def _with(self, **changes: Any) -> Operator:
        """An operator like this one with ``changes`` to its constructor's arguments."""
        args = dict(lower=self.lower, sizes=self.sizes, form=self.form, names=self._names,
                    paper_hint=self._paper_hint, samples=self.samples,
                    like=self.backend.xp.zeros(1, dtype=self.dtype))
        if self.structure is not None and changes.get("structure", True) is not None:
            args.update(structure=self.structure, layer_scales=self._layer_scales,
                        row_scale=None if self._layer_scales is not None else self._row_scale)
        else:  # stacks stay stacked; a structure is unrolled into the block view
            if self.coupling_stack is not None and "edges" not in changes:
                args["coupling_stack"] = self.coupling_stack
            else:
                args["edges"] = self._edges
            if self.scale_stack is not None and "row_scale" not in changes:
                args["scale_stack"] = self.scale_stack
            elif "scale_stack" not in changes:
                args["row_scale"] = self._row_scale
        args.update(changes)
        if args.get("structure") is None:
            args.pop("layer_scales", None)
        return Operator(args.pop("coupling", None), args.pop("row_scale", None), **args)

    @functools.cached_property
    def blocks(self) -> Blocks:
        """The structured view (:class:`Blocks`) that structure-aware solvers use."""
        paper = self.form == "paper"
        return Blocks(
            lower=self.lower,
            sizes=self.sizes,
            diagonal=tuple(None if not paper or s is None else 1 / s for s in self._row_scale),
            edges=tuple(Edge(row, col, M, None if paper else self._row_scale[row])
                        for row, col, M in self._edges),
        )

    def split(self, x: Any) -> list[Any]:
        """Views of the blocks ``x_0..x_{nb-1}`` of a stacked ``(N,)`` or ``(N, r)`` array."""
        if x.shape[0] != self.size:
            raise ValueError(f"x has {x.shape[0]} rows, expected N = {self.size}")
        o = self.offsets
        return [x[o[k]:o[k + 1]] for k in range(self.nblocks)]

    def sample(self, i: int) -> Operator:
        """The operator of sample ``i`` of a batch (views, no copies)."""
        r = self.samples
        if r is None:
            raise ValueError("sample(i) needs a batch system; this one has a single rhs")
        if isinstance(i, bool) or not isinstance(i, numbers.Integral):
            raise TypeError(f"sample(i) takes an integer index, got {i!r}")
        i = int(i)
        if not -r <= i < r:
            raise IndexError(f"sample {i} out of range for a batch of {r}")
        key = ("sample", i % r)
        if key not in self._variants:
            self._variants[key] = self._sample(i % r)
        return self._variants[key]

    def _sample(self, i: int) -> Operator:
        """:meth:`sample`'s operator, made."""
        if self._layer_scales is not None:  # stacked over time: one column of each layer
            layers = [None if s is None else s[:, :, i if s.shape[2] > 1 else 0]
                      for s in self._layer_scales]
            return self._with(layer_scales=layers, samples=None)
        if self.per_sample_couplings:  # its couplings, shared by its one column
            return self._with(coupling_stack=self.coupling_stack[:, i], samples=None)
        scales = [None if s is None else s[:, i if s.shape[1] > 1 else 0]
                  for s in self._row_scale]
        return self._with(row_scale=scales, samples=None)

    @property
    def _scalings(self) -> tuple:
        """The scalings as stored, with the samples last: stacked layers or per block."""
        if self.scale_stack is not None:
            return (self.scale_stack,)
        return self._layer_scales if self._layer_scales is not None else self._row_scale

    @functools.cached_property
    def shares_matrix(self) -> bool:
        """Whether every sample of a batch has the same matrix (equal scaling columns)."""
        if self.per_sample_couplings:
            C = self.coupling_stack
            return bool(self.backend.xp.all(C == C[:, :1])) and self._scaled_once_scalings
        return self.samples is None or all(
            s is None or s.shape[-1] == 1 or bool(self.backend.xp.all(s == s[..., :1]))
            for s in self._scalings)

    @property
    def _scaled_once(self) -> bool:
        """Whether the matrix is stored once for all columns (scalings ``None`` or ``(n_k, 1)``)."""
        return not self.per_sample_couplings and self._scaled_once_scalings

    @property
    def _scaled_once_scalings(self) -> bool:
        return self.samples is None or all(s is None or s.shape[-1] == 1
                                           for s in self._scalings)

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
        xp = self.backend.xp
        if self.per_sample_couplings:
            C = self.coupling_stack
            if how == "exact" and not self.shares_matrix:
                raise ValueError(_NOT_SHARED.format(where="a coupling"))
            return self._with(coupling_stack=C[:, 0] if how == "exact" else C.mean(axis=1))
        if self._layer_scales is not None:  # stacked over time: one layer at a time
            if how == "exact" and not self.shares_matrix:
                raise ValueError(_NOT_SHARED.format(where="a layer's scaling"))
            layers = [None if s is None else (s[..., :1] if how == "exact"
                                              else s.mean(axis=-1, keepdims=True))
                      for s in self._layer_scales]
            return self._with(layer_scales=layers)
        if self.scale_stack is not None and self.scale_stack.ndim == 3:  # one array
            S = self.scale_stack
            same = xp.all(S == S[:, :, :1], axis=(1, 2))
            if how == "exact" and not bool(same.all()):
                k = 1 + int(xp.argmin(same))  # stack row j scales block j + 1
                raise ValueError(_NOT_SHARED.format(where=f"{self.names[k]}: the row scaling"))
            return self._with(scale_stack=S[:, :, :1] if how == "exact"
                              else S.mean(axis=2, keepdims=True))
        scales = []
        for k, s in enumerate(self._row_scale):
            if s is not None and how == "exact" and not bool(xp.all(s == s[:, :1])):
                raise ValueError(_NOT_SHARED.format(where=f"{self.names[k]}: the row scaling"))
            scales.append(None if s is None else (s[:, :1] if how == "exact"
                                                  else s.mean(axis=1, keepdims=True)))
        return self._with(row_scale=scales)

    def to(self, kind: str, device: Any = None) -> Operator:
        """The same operator with its arrays on backend ``kind`` (:meth:`TriangularSystem.to`)."""
        move = functools.partial(backend.convert, kind=kind, device=device)
        like = move(self.backend.xp.zeros(1, dtype=self.dtype))
        common = dict(lower=self.lower, sizes=self.sizes, form=self.form, names=self._names,
                      paper_hint=self._paper_hint, samples=self.samples, like=like)
        if self.coupling_stack is not None:
            return Operator(None, None if self.scale_stack is not None else
                            [move(s) for s in self._row_scale],
                            coupling_stack=move(self.coupling_stack),
                            scale_stack=move(self.scale_stack), **common)
        if kind == "torch":
            raise ValueError(_TORCH_STACKS)
        unrolled = self.unstructured()
        return Operator(None, [move(s) for s in unrolled._row_scale],
                        edges=[(r, c, move(M)) for r, c, M in unrolled._edges], **common)

    @functools.cached_property
    def batch(self) -> Operator:
        """The operator for 2-D right-hand sides: itself, or a vector's with one column.

        A single-vector operator's scalings ``(n,)`` become ``(n, 1)`` (views), so
        that methods see every right-hand side as ``(N, c)`` (:mod:`.make_system`).
        """
        if self.samples is not None:
            return self
        column = (lambda s: None if s is None else s[..., None])  # noqa: E731
        if self.scale_stack is not None:
            return self._with(scale_stack=column(self.scale_stack), samples=1)
        if self._layer_scales is not None:
            return self._with(layer_scales=[column(s) for s in self._layer_scales], samples=1)
        return self._with(row_scale=[column(s) for s in self._row_scale], samples=1)

    def restricted(self, keep: Callable[[int, int], bool]) -> Operator:
        """The operator with only the couplings ``(row, col)`` for which ``keep`` holds."""
        return self._with(edges=[e for e in self._edges if keep(e[0], e[1])], structure=None)

    def subsystem(self, blocks: Sequence[int]) -> Operator:
        """The operator of ``blocks`` alone (sorted), with the couplings among them only."""
        keep = sorted(int(k) for k in blocks)
        new = {k: i for i, k in enumerate(keep)}
        edges = [(new[row], new[col], M) for row, col, M in self._edges
                 if row in new and col in new]
        return Operator(None, [self._row_scale[k] for k in keep], lower=self.lower,
                        sizes=[self.sizes[k] for k in keep], form=self.form,
                        names=[self.names[k] for k in keep], paper_hint=self._paper_hint,
                        edges=edges, samples=self.samples,
                        like=self.backend.xp.zeros(1, dtype=self.dtype))

    # -- products -----------------------------------------------------------------
    @functools.cached_property
    def _periodic(self) -> dict:
        return {}

    def periodic_scales(self, period: int) -> list:
        """Row scalings of blocks ``k, k + period, ...`` stacked, for each ``k < period``.

        The per-layer, all-steps view of a time-major operator (cached).
        """
        if self._layer_scales is not None and period == len(self.structure.sizes):
            return list(self._layer_scales)  # stored that way
        if period not in self._periodic:
            xp, rows = self.backend.xp, self._row_scale
            self._periodic[period] = [None if rows[k] is None else xp.stack(rows[k::period])
                                      for k in range(period)]
        return self._periodic[period]

    def ready(self) -> Operator:
        """Build what :meth:`apply` needs (its edge groups), once: a plan's solves then don't.

        Returns the operator.
        """
        if self.structure is None and not self._applies_stacked:
            self._forward_groups  # noqa: B018 (a cached property, built here)
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
        if self.structure is not None:
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
        return xp.concatenate([xp.ones((n, c), dtype=self.dtype) if d is None else
                               xp.broadcast_to(xp.reshape(d, (n, -1)), (n, c))
                               for n, d in zip(self.sizes, diagonal)])

    def _apply_stacked(self, x: Any, transpose: bool) -> Any:
        """:meth:`apply` of a chain given by its stacks: one batched product for all blocks.

        Block rows ``out_k = d_k x_k - s_k M_j x_nbr`` (scaled form: ``d = 1``;
        paper form: ``d = 1/s`` and no ``s`` on the coupling); the transpose
        moves each coupling's term to its column block.
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
        if transpose:
            source = X[rows] if scales is None else scales * X[rows]
            out[cols] -= outer(xp.matrix_transpose(M) @ inner(source))
        else:
            product = outer(M @ inner(X[cols]))  # a new array: scaled in place
            if scales is not None:
                product *= scales
            out[rows] -= product
        return xp.reshape(out, tuple(x.shape))

    @functools.cached_property
    def _coupling_scales(self) -> Any:
        """The row scaling of each coupling of :attr:`scale_stack`'s chain, stacked like them."""
        S = self.scale_stack
        if self.lower:
            return S
        return self.backend.xp.concatenate([self.backend.xp.ones_like(S[:1]), S[:-1]])

    @functools.cached_property
    def _block_scales(self) -> Any:
        """Every block's scaling (row 0's is one), ``(nb, n[, c])``: the paper form's ``1/d``."""
        S = self.scale_stack
        return self.backend.xp.concatenate([self.backend.xp.ones_like(S[:1]), S])

    def unit_rows(self, R: Any) -> Any:
        """``D^{-1} R``: a residual of this form as the unit-diagonal form's (``R`` if scaled).

        ``R`` is ``(N,)`` or ``(N, c)``; the accuracy contract
        (:mod:`propop.solvers.convergence`) judges this residual.
        """
        if self.form == "scaled":
            return R
        parts = [r if s is None else (s if s.ndim == r.ndim else s[:, None]) * r
                 for r, s in zip(self.split(R), self._row_scale)]
        return self.backend.xp.concatenate(parts)

    def to_form(self, rhs: Any) -> Any:
        """A scaled right-hand side as this form's: each block divided by its scaling."""
        if self.form == "scaled":
            return rhs
        return self.backend.xp.concatenate(
            [c if s is None else c / (s if s.ndim == c.ndim else s[:, None])
             for c, s in zip(self.split(rhs), self._row_scale)])

    def from_form(self, rhs: Any) -> Any:
        """A right-hand side of this form as the scaled form's (:meth:`to_form` undone)."""
        if self.form == "scaled":
            return rhs
        return self.backend.xp.concatenate(
            [c if d is None else c / (d if d.ndim == c.ndim else d[:, 0])
             for c, d in zip(self.split(rhs), self.blocks.diagonal)])

    @functools.cached_property
    def row_scale_max(self) -> float:
        """``max |s|`` over the paper form's row scalings (``1`` for the scaled form)."""
        if self.form == "scaled":
            return 1.0
        xp = self.backend.xp
        return max([1.0] + [float(xp.abs(s).max()) for s in self._row_scale
                            if s is not None and s.size])

    @functools.cached_property
    def sparse_couplings(self) -> bool:
        """Whether some coupling is a sparse matrix (told without unrolling a structure)."""
        if self.coupling_stack is not None:
            return False
        matrices = ([t.M for t in self.structure.templates] if self.structure is not None
                    else [M for _, _, M in self._edges])
        return any(self.backend.sparse.issparse(M) for M in matrices)

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
_TORCH_STACKS = ("PyTorch tensors make a system as a chain of one width given by its stacks: "
                 "TriangularSystem(None, None, rhs, coupling_stack=(nb - 1, n, n), "
                 "scale_stack=(nb - 1, n[, r]), ...), which an FNN of tensors builds when all "
                 "its widths are equal; per-block couplings (layers of different widths), "
                 "edges and time structures take NumPy or CuPy arrays")
_PER_SAMPLE = ("each sample of this system has its own couplings (a per-sample "
               "coupling_stack), so it has no shared edges or blocks: solve it with a method "
               "for stacked chains (substitution, cyclic-reduction, parallel-cyclic-reduction, "
               "jacobi, batched-gmres, batched-bicgstab, the scipy.* methods), or take one "
               "sample's system with sample(i)")


def one_dtype(coupling: Any, row_scale: Any, rhs: Any, edges: Any, structure: Any,
              layer_scales: Any, coupling_stack: Any, scale_stack: Any) -> tuple:
    """Every coefficient and the right-hand side in one floating type, the widest given.

    A float64 right-hand side with float32 couplings (or the reverse) would be
    solved in a mix of precisions and miss the float64 tolerance: the arrays are
    promoted once, here, and the system's dtype is that one type.
    """
    arrays = [rhs, coupling_stack, scale_stack, *(coupling or ()), *(row_scale or ()),
              *(layer_scales or ()), *(M for _, _, M in edges or ()),
              *(t.M for t in (structure.templates if structure is not None else ()))]
    present = [a for a in arrays if a is not None]
    backend.of(*present)  # mixed backends are named before dtypes are compared
    kinds = {a.dtype for a in present if backend.is_real_floating(a)}
    if len(kinds) <= 1:
        return (coupling, row_scale, rhs, edges, structure, layer_scales, coupling_stack,
                scale_stack)
    wide = max(kinds, key=lambda d: backend.eps(d) ** -1)

    def cast(a: Any) -> Any:
        return a if a is None or not backend.is_real_floating(a) else backend.astype(a, wide)

    def each(items: Any) -> Any:
        return None if items is None else [cast(a) for a in items]

    if structure is not None:
        structure = dataclasses.replace(structure, templates=tuple(
            dataclasses.replace(t, M=cast(t.M)) for t in structure.templates))
    return (each(coupling), each(row_scale), cast(rhs),
            None if edges is None else [(i, j, cast(M)) for i, j, M in edges], structure,
            each(layer_scales), cast(coupling_stack), cast(scale_stack))


def _chain_edges(lower: bool, coupling: Sequence[Any]) -> tuple:
    """``(row, col, M)`` of a chain: coupling ``j`` reads block ``j`` (lower) or ``j + 1``."""
    return tuple(((j + 1, j) if lower else (j, j + 1)) + (M,) for j, M in enumerate(coupling))


def _canonical_edges(edges: Sequence[tuple[int, int, Any]]) -> tuple:
    """The edges with canonical couplings (:func:`~propop._checks.canonical_matrix`).

    Sparse matrices of any format become canonical CSR arrays, each distinct
    matrix once (an RNN's edges share their templates); matrices already in that
    form, and real dense arrays, are kept as they are.
    """
    done: dict[int, Any] = {}
    out = []
    for row, col, M in edges:
        if id(M) not in done:
            done[id(M)] = as_coupling(M, f"coupling ({row}, {col})")
        out.append((int(row), int(col), done[id(M)]))
    return tuple(out)
