"""A triangular system: an :class:`~propop.systems.operator.Operator` and a right-hand side.

``TriangularSystem`` is what ``pp.backward_system`` and ``pp.forward_system``
return and ``pp.solve`` takes: the operator (structure and coefficients, every
view of them built once and shared by every system of that operator) and one
right-hand side, stored in the scaled form and shown in the system's own form
(:attr:`rhs`). Matrix attributes (``blocks``, ``sizes``, ``apply``, ...) are the
operator's; :meth:`with_rhs` gives another system of the same operator for
nothing but the new vector.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .. import backend
from .._checks import real_array, require_finite
from . import assemble
from .blocks import Blocks, Edge, Step
from .arguments import one_dtype
from .operator import FORMS, Operator

__all__ = ["TriangularSystem", "Blocks", "Edge", "Step", "FORMS"]


def _require_support(op: Operator, rhs: Any, support: list[int], zeros: bool = True) -> None:
    """``rhs`` finite on its support and exactly zero elsewhere, or ``ValueError`` naming the block.

    Substitution skips the blocks outside the support; a caller's support that
    left out a non-zero block would make it solve another system, so the zeros
    are read too (one comparison over the runs between support blocks), unless
    ``zeros`` is false: the caller made them (``check_zeros=False``).
    """
    xp, o, start = backend.namespace(rhs), op.offsets, 0
    if support and not 0 <= support[0] <= support[-1] < op.nblocks:
        raise ValueError(f"rhs_support {support} names blocks outside 0..{op.nblocks - 1}")
    for k in support + [op.nblocks]:
        if zeros and k > start and bool(xp.any(rhs[o[start]:o[k], ...] != 0)):
            j = next(j for j in range(start, k) if bool(xp.any(rhs[o[j]:o[j + 1], ...] != 0)))
            raise ValueError(f"rhs is non-zero in {op.label(j)}, outside rhs_support "
                             f"{support}: give every block where it is non-zero")
        if k < op.nblocks and not backend.all_finite(rhs[o[k]:o[k + 1], ...], xp):
            require_finite(rhs[o[k]:o[k + 1], ...], f"rhs ({op.label(k)})")  # names it
        start = k + 1


class TriangularSystem:
    """A block lower or upper triangular system ``A x = c``, block bi-diagonal or general.

    Parameters
    ----------
    coupling : sequence of matrices, or None
        For a block bi-diagonal system (a chain): ``nb - 1`` shared coupling
        matrices; ``coupling[j]`` has shape ``(n_{j+1}, n_j)`` for a lower system
        and ``(n_j, n_{j+1})`` for an upper one. ``None`` when ``edges`` is given.
    row_scale : sequence or None
        ``nb`` row scalings ``s_k``: ``None`` (one) or an array of shape
        ``(n_k,)``, or ``(n_k, r)`` / ``(n_k, 1)`` for a batch. ``None`` for
        all: every row unscaled (with a ``structure``, give ``layer_scales``).
    rhs : array, shape (N,) or (N, r)
        The right-hand side of the scaled form, blocks stacked.
    lower : bool
        Lower (forward propagation) or upper (backward propagation).
    sizes : sequence of int
        Block sizes.
    form : {"scaled", "paper"}
        Which of the two equivalent forms ``matrix``, ``operator``, ``rhs`` and
        ``blocks`` show. ``"paper"`` raises ``ValueError`` where a scaling is zero.
    names : sequence of str, optional
        A name per block row for messages, e.g. ``"v[2] (layer 2)"``.
    paper_hint : str
        Why a zero scaling happens, appended to the ``form="paper"`` error.
    edges : sequence of ``(row, col, matrix)``, optional
        A general block triangular structure (RNNs, computation graphs): block
        row ``row`` reads ``matrix @ x_col``, all of a row's edges scaled by its
        ``s_row``. Lower systems need ``row > col``, upper ones ``row < col``.
    structure : TimeStructure, optional
        The same blocks repeated over time steps (RNNs): the couplings are the
        structure's templates, never unrolled unless a method asks for the
        block view (:attr:`blocks`); give it instead of ``coupling`` and ``edges``.
    layer_scales : sequence, optional
        With ``structure``: per layer of a step, ``None`` or the scalings of all
        steps stacked, ``(tau, n_k)`` or ``(tau, n_k, r)``; instead of ``row_scale``.
    rhs_support : sequence of int, optional
        The blocks where ``rhs`` may be non-zero (the output layer of a backward
        system): methods then skip the others without looking at them.
    check_zeros : bool
        With ``rhs_support``: whether the blocks outside it are read here to be
        exactly zero (``ValueError`` naming the first that is not). ``False`` is the
        caller's promise, as SciPy's ``check_finite=False``: the network builders
        give it for the right-hand sides they make from zeros, which then no pass
        reads (a wrong support would make substitution solve another system).
        The support's own blocks are checked to be finite either way.
    coupling_stack : array, optional
        For a chain of blocks of one width ``n`` with dense couplings: the
        couplings as one ``(nb - 1, n, n)`` array (:meth:`FNN.stacks`), instead
        of ``coupling``; checked once, not per block, and read by reductions
        with one index. ``"identity"``: every coupling is the identity and
        ``scale_stack`` holds the diagonals, ``x_k = c_k + s_k * x_{k-1}`` (a
        diagonal linear recurrence, quasi-Newton's): stored as the scalings alone
        (:class:`~propop.systems.coefficients.IdentityCouplings`), solved
        entrywise by substitution and cyclic reduction.
    scale_stack : array, optional
        For a chain of blocks of one width whose first block is unscaled (the
        input): the row scalings of blocks ``1..nb-1`` as one ``(nb - 1, n)``,
        ``(nb - 1, n, r)`` or ``(nb - 1, n, 1)`` array, instead of ``row_scale``.
    """

    def __init__(self, coupling: Sequence[Any] | None, row_scale: Sequence[Any] | None,
                 rhs: Any, *, lower: bool, sizes: Sequence[int], form: str = "scaled",
                 names: Sequence[str] | Callable[[int], str] | None = None,
                 paper_hint: str = "", edges: Sequence[tuple[int, int, Any]] | None = None,
                 structure: Any = None, layer_scales: Sequence[Any] | None = None,
                 rhs_support: Sequence[int] | None = None, coupling_stack: Any = None,
                 scale_stack: Any = None, check_zeros: bool = True) -> None:
        named = coupling_stack if isinstance(coupling_stack, str) else None  # "identity"
        coupling, row_scale, rhs, edges, structure, layer_scales, coupling_stack, \
            scale_stack = one_dtype(coupling, row_scale, rhs, edges, structure, layer_scales,
                                    None if named else coupling_stack, scale_stack)
        coupling_stack = named or coupling_stack
        if not backend.is_real_floating(rhs):
            raise ValueError(f"rhs has dtype {getattr(rhs, 'dtype', type(rhs).__name__)}, "
                             "expected a real floating type")
        samples = None if rhs.ndim == 1 else rhs.shape[1]
        op = Operator.of(coupling, row_scale, lower=lower, sizes=sizes, form=form, names=names,
                      paper_hint=paper_hint, edges=edges, structure=structure,
                      layer_scales=layer_scales, coupling_stack=coupling_stack,
                      scale_stack=scale_stack, samples=samples, like=rhs)
        self._bind(op, rhs, rhs_support, zeros=check_zeros)

    @classmethod
    def of(cls, op: Operator, rhs: Any, rhs_support: Sequence[int] | None = None, *,
           check: bool = True) -> TriangularSystem:
        """The system of operator ``op`` with the scaled right-hand side ``rhs``.

        ``check=False`` skips the finiteness check: for a solve inside a method
        (a preconditioner's), whose outer method judges its own residual.
        """
        system = cls.__new__(cls)
        system._bind(op, rhs, rhs_support, check)
        return system

    def _bind(self, op: Operator, rhs: Any, rhs_support: Sequence[int] | None,
              check: bool = True, zeros: bool = True) -> None:
        self._op = op
        if rhs.ndim not in (1, 2) or rhs.shape[0] != op.size:
            raise ValueError(f"rhs has shape {tuple(rhs.shape)}, expected ({op.size},) or "
                             f"({op.size}, r)")
        self.rhs_support = None if rhs_support is None else frozenset(int(k)
                                                                       for k in rhs_support)
        if check and self.rhs_support is None:
            require_finite(rhs, "rhs")
        elif check:
            _require_support(op, rhs, sorted(self.rhs_support), zeros)
        self._scaled_rhs = rhs

    def __getattr__(self, name: str) -> Any:
        """The operator's attribute (matrix facts and views are the operator's)."""
        if name == "_op":
            raise AttributeError(name)
        return getattr(self._op, name)

    @property
    def operator_of(self) -> Operator:
        """The :class:`~propop.systems.operator.Operator`: this system without its rhs."""
        return self._op

    @property
    def approximates(self) -> TriangularSystem | None | bool:
        """The true system of a batch-mean one (:meth:`shared`), ``False`` if not judgeable.

        ``False`` where this system's right-hand side has another number of columns
        than the true system's samples.
        """
        exact = self._op.approximates
        if exact is None:
            return None
        if exact.samples is not None and self.nrhs != exact.samples:
            return False
        return TriangularSystem.of(exact, self._scaled_rhs)

    # -- the right-hand side ---------------------------------------------------------
    @property
    def nrhs(self) -> int | None:
        """Number of samples ``r`` of a batch system, ``None`` for a single vector."""
        return None if self._scaled_rhs.ndim == 1 else self._scaled_rhs.shape[1]

    @property
    def dtype(self) -> Any:
        """The floating type of the system."""
        return self._scaled_rhs.dtype

    @property
    def shape(self) -> tuple[int, int]:
        """Shape of :attr:`matrix` and :attr:`operator`: ``(N r, N r)`` for a batch."""
        return assemble.shape(self._op, self.nrhs)

    @property
    def rhs(self) -> Any:
        """The right-hand side in this system's form, shape ``(N,)`` or ``(N, r)``."""
        return self._op.to_form(self._scaled_rhs)

    def __repr__(self) -> str:
        kind = "lower" if self.lower else "upper"
        batch = "" if self.nrhs is None else f", r={self.nrhs}"
        approximate = ("" if self._op.approximates is None else
                       ", approximate: batch-mean scalings of a per-sample system")
        return (f"TriangularSystem({kind}, nblocks={self.nblocks}, N={self.size}{batch}, "
                f"form={self.form!r}, dtype={self.dtype}{approximate})")

    def residual(self, x: Any) -> Any:
        """``c - A x``."""
        return self.rhs - self._op.apply(x)

    def with_rhs(self, rhs: Any) -> TriangularSystem:
        """The same matrix with right-hand side ``rhs`` given in this system's form.

        ``rhs`` has shape ``(N,)`` or ``(N, r)``; a system that
        :attr:`shares_matrix` takes any number of columns. Nothing of the matrix is
        rebuilt: the new system has this one's operator.
        """
        rhs = real_array(rhs, "rhs", self.dtype)  # of this system's backend, or named
        if rhs.ndim != self._scaled_rhs.ndim or rhs.shape[0] != self.size or (
                rhs.ndim == 2 and rhs.shape[1] != self.nrhs and not self._scaled_once):
            more = (" (another number of columns needs one matrix for all samples: a system "
                    "made with .shared(), e.g. B.shared() or B.shared('mean'))"
                    if rhs.ndim == 2 and rhs.shape[0] == self.size else "")
            raise ValueError(f"rhs has shape {tuple(rhs.shape)}, expected "
                             f"{tuple(self.rhs.shape)}{more}")
        require_finite(rhs, "rhs")
        return TriangularSystem.of(self._op, self._op.from_form(rhs))

    # -- the views that depend on the number of columns ------------------------------
    @property
    def operator(self) -> Any:
        """Matrix-free ``LinearOperator`` equal to :attr:`matrix` (samples stacked)."""
        return assemble.linear_operator(self._op, self.nrhs)

    @property
    def matrix(self) -> Any:
        """The explicit sparse matrix: BSR where the blocks are dense, CSR otherwise.

        A batch gives the block diagonal of its ``r`` shifted systems, acting on
        the samples stacked one after another (``x.T.reshape(-1)``).
        """
        return assemble.matrix(self._op, self.nrhs)

    @property
    def csr(self) -> Any:
        """The explicit matrix of :attr:`matrix` as a CSR array, built once."""
        return assemble.csr(self._op, self.nrhs)

    # -- variants: the operator's, with this right-hand side -----------------------------
    def _also(self, op: Operator) -> TriangularSystem:
        """``op``'s system with this right-hand side (kept support where blocks are kept)."""
        support = self.rhs_support if op.sizes == self.sizes else None
        return TriangularSystem.of(op, self._scaled_rhs, support)

    def scaled(self) -> TriangularSystem:
        """Return the system in the unit-diagonal form (itself if it is already)."""
        return self if self.form == "scaled" else self._also(self._op.scaled())

    def paper(self) -> TriangularSystem:
        """Return the system in the paper's form with diagonal blocks ``D``/``E``."""
        return self if self.form == "paper" else self._also(self._op.paper())

    def unstructured(self) -> TriangularSystem:
        """The same system without its :attr:`structure`: products edge by edge."""
        return self if self.structure is None else self._also(self._op.unstructured())

    def restricted(self, keep: Callable[[int, int], bool]) -> TriangularSystem:
        """The system with only the couplings ``(row, col)`` for which ``keep`` holds."""
        return self._also(self._op.restricted(keep))

    def shared(self, how: str = "exact") -> TriangularSystem:
        """The system with one matrix for all samples: several right-hand sides.

        Parameters
        ----------
        how : {"exact", "mean"}
            ``"exact"``: every row scaling must be the same for all samples (a
            linear network, or one sample's trace repeated), else ``ValueError``
            names the first block that differs. A forward pass of a repeated input
            need not give equal columns: BLAS may round the columns of one product
            differently (OpenBLAS's float32 kernels do). ``"mean"``: the batch mean of each scaling,
            an approximation (the scaled right-hand side is kept). The result
            records the system it stands for in :attr:`approximates` and says so
            in its repr; :func:`propop.solve` judges its answer against that true
            system and reports ``APPROXIMATE`` unless it meets the tolerance there.
        """
        op = self._op.shared(how)
        return self if op is self._op else self._also(op)

    def sample(self, i: int) -> TriangularSystem:
        """The single-sample system ``i`` of a batch (views, no copies)."""
        op = self._op.sample(i)
        return TriangularSystem.of(op, self._scaled_rhs[:, int(i)])

    def columns(self, start: int, stop: int) -> TriangularSystem:
        """The system of samples ``start..stop-1`` of a batch (views, no copies)."""
        return TriangularSystem.of(self._op.columns(start, stop),
                                   self._scaled_rhs[:, start:stop], check=False)

    def samples(self) -> list[TriangularSystem]:
        """All single-sample systems: ``[self]`` for a single-vector system."""
        return [self] if self.nrhs is None else [self.sample(i) for i in range(self.nrhs)]

    def subsystem(self, blocks: Sequence[int]) -> TriangularSystem:
        """The system of ``blocks`` alone (sorted), with the couplings among them only.

        Couplings to other blocks are dropped: the caller moves them to the
        right-hand side (as a distributed solve does with a neighbour's blocks).
        """
        keep = sorted(int(k) for k in blocks)
        xs = self.split(self._scaled_rhs)
        rhs = self.backend.xp.concat([xs[k] for k in keep])
        return TriangularSystem.of(self._op.subsystem(keep), rhs)

    def to(self, kind: str, device: Any = None) -> TriangularSystem:
        """The same system with its arrays on backend ``kind``.

        ``kind`` is ``"numpy"``, ``"torch"``, ``"cupy"`` or ``"array_api_strict"``;
        ``device`` a PyTorch device such as ``"cuda"``. A chain given by its stacks
        moves as its stacks; sparse couplings stay sparse on CuPy and PyTorch (CSR
        tensors) and become dense on the strict namespace, which has no sparse arrays.
        """
        rhs = backend.convert(self._scaled_rhs, kind, device)
        return TriangularSystem.of(self._op.to(kind, device), rhs, self.rhs_support)
