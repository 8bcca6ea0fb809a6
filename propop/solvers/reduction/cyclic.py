"""Cyclic reduction: exact solves in O(log nblocks) parallel levels (paper section 3.1).

Written for propop: no maintained library reduces block bi-diagonal systems with
per-sample blocks. Both methods work on the :class:`~propop.solvers.reduction.chain.Chain`
``x_k = A_k x_{k-1} + G_k`` with ``A_k = diag(L_k) C_k``:

- ``cyclic-reduction`` (odd-even, work-efficient): eliminate every odd unknown,
  ``x_k = (A_k A_{k-1}) x_{k-2} + (A_k G_{k-1} + G_k)`` for even ``k``, recurse
  on the half-size chain, then back-substitute the odd unknowns level by level.
- ``parallel-cyclic-reduction`` (the paper's reordering, eqs.
  forw_prop_sys_reordered and back_prop_sys_reordered): every unknown is reduced
  at every level, ``x_k = A_k x_{k-2^t} + G_k``, until all chains reach a solved
  unknown; no back-substitution, ``log2`` more work.

Mini-batch cost, honestly (docs/index.md, "Cyclic reduction"): the reduced blocks
``diag(L_k) C_k diag(L_{k-1}) C_{k-1}`` depend on the sample through
``L_{k-1}``, so a batch of ``r`` costs ``r`` block products per pair,
``O(r l n^3)`` work, not the paper's ``O(l n^3)``. ``shared_diagonal="mean"``
uses the batch mean of the scalings instead: shared blocks, ``O(l n^3)`` work,
and an approximate answer whose error is reported.

Both detect overflow of the long Jacobian products (non-finite reduced blocks)
and return a failed :class:`~propop.Solution` naming the level and the blocks.

References
----------
R. W. Hockney, "A fast direct solution of Poisson's equation using Fourier
analysis", J. ACM 12 (1965); B. L. Buzbee, G. H. Golub, C. W. Nielson, "On direct
methods for solving Poisson's equations", SIAM J. Numer. Anal. 7 (1970).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Literal


from ... import backend, memory
from . import footprint
from . import odd_even, plans
from .chain import Counter, in_system_order
from .sparse import SparseKernels, sparse_chain
from .over_time import WITHIN
from ..convergence import Tolerance, finish
from ..options import OptionError
from ..direct.substitution import approximation_report
from ..method import Method
from ..registry import register
from ..solution import Solution, Status

__all__ = ["CyclicReduction", "ParallelCyclicReduction"]

# Below this width padded dense blocks beat sparse products on a CPU, even for
# sparse weights (measured: width 128 at density 0.05, dense 2x faster; width
# 512 at density 0.01, sparse 2x faster); ``sparse=True`` overrides.
SPARSE_MIN_WIDTH = 256


def _sparse(system: Any, sparse: bool | None) -> bool:
    """Whether to reduce with sparse products (``sparse=None``: wide sparse couplings)."""
    be = system.backend
    if sparse and be.name != "numpy":
        raise OptionError("sparse=True needs scipy.sparse couplings on the CPU")
    if sparse is None:
        return (be.name == "numpy" and system.width >= SPARSE_MIN_WIDTH
                and system.sparse_couplings)
    return sparse


def _sparse_factored(dense_threshold: float) -> Callable:
    """Cyclic reduction on sparse cores (:mod:`.sparse`), split as :func:`_factored`."""
    if not 0 <= dense_threshold <= 1:
        raise OptionError(f"dense_threshold must lie in [0, 1], got {dense_threshold}")

    def prepare(system: Any, shared_diagonal: str | None, counter: Counter) -> Callable:
        xp = system.backend.xp
        chain = sparse_chain(system, shared_diagonal)
        counter.hold(sum(L.nbytes for L in chain.L))
        kernels = SparseKernels(chain, dense_threshold, xp, system.nrhs or 1)
        levels = odd_even.factor(chain, counter, kernels)
        info = {"fill_in": kernels.fill_in, "sparse_levels": kernels.levels,
                "dense_threshold": dense_threshold}

        def solve(s: Any, counter: Counter) -> tuple[Any, int, dict]:
            blocks = s.split(s.rhs)  # canonical: the scaled form's rows are the chain's G
            G = [blocks[k] for k in chain.order]
            counter.hold(sum(g.nbytes for g in G))
            X = odd_even.substitute(levels, G, counter)
            x = in_system_order(chain.order, X)
            counter.hold(x.nbytes)
            depth = odd_even.depth(levels)
            return x, depth, dict(info, peak_bytes=counter.peak_bytes)

        return solve

    return prepare


def _plan(system: Any, factor: Callable, rtol: float | None, atol: float,
          shared_diagonal: str | None, peak: int) -> Callable[..., Solution]:
    """The memory guard, then ``factor``'s work on the matrix; returns the per-rhs solve.

    ``factor(system, shared_diagonal, counter)`` returns ``substitute(s, counter)
    -> (x, levels, info)`` for systems ``s`` with the same matrix. ``peak`` is
    the reduction's peak in bytes estimated from the shapes (:mod:`.footprint`),
    an upper bound where fill-in decides it (the sparse reduction, which then
    counts its true peak as it runs and reports that).
    """
    if not memory.fits(peak):  # the error, with the chunk_size that would fit
        chunk = _fitting_chunk(system.operator_of, peak)
        memory.require(peak, f"cyclic reduction of this {system.nrhs or 1}-sample system",
                       "use 'substitution', which needs the system's memory alone, or "
                       "fewer samples per solve" + (f" (chunk_size={chunk}: that many "
                                                    "samples reduced at a time)" if chunk
                                                    else ""),
                       {"chunk_size": chunk} if chunk else None)
    xp = system.backend.xp
    made = Counter()
    try:
        with backend.quiet(xp):  # overflow is detected level by level and reported
            substitute, failure = factor(system, shared_diagonal, made), None
    except odd_even.ReductionOverflow as overflow:
        substitute, failure = None, overflow

    def solve(s: Any, **extra: Any) -> Solution:  # the plan's memory, then the solve's
        counter = Counter(flops=made.flops, peak_bytes=made.peak_bytes,
                          live_bytes=made.live_bytes)
        try:
            if failure is not None:
                raise failure
            with backend.quiet(xp):
                x, levels, info = substitute(s, counter)
        except odd_even.ReductionOverflow as overflow:
            expected = math.ceil(math.log2(s.nblocks)) if s.nblocks > 1 else 0
            return Solution(x=xp.full_like(s.rhs, xp.nan), status=Status.NONFINITE,
                            message=overflow.message, levels=expected,
                            info={"flops": counter.flops})
        info.update(flops=counter.flops, peak_bytes=info.get("peak_bytes", peak))
        solution = finish(s, x, tol=Tolerance.of(s, rtol, atol), levels=levels, info=info,
                          direct=True)
        return approximation_report(s, solution) if shared_diagonal is not None else solution

    return solve


def _fitting_chunk(operator: Any, peak: int) -> int | None:
    """The ``chunk_size`` that would fit the budget with the solution, if some does."""
    r = operator.samples or 1
    whole = 2 * operator.size * r * backend.itemsize(operator.dtype)  # its parts, then x
    fits = int(r * (memory.budget() - whole) / peak)
    return fits if 1 <= fits < r else None


def _chunked(operator: Any, chunk_size: int, rtol: float | None, atol: float,
             options: dict) -> Callable[[Any], Solution]:
    """Cyclic reduction ``chunk_size`` samples at a time, each chunk's levels freed after it.

    The samples' systems are independent (a matrix each): the peak memory is one
    chunk's, and nothing of the matrix is kept between right-hand sides. The answer
    is checked against the whole system's true residual.
    """
    def solve(system: Any) -> Solution:
        xp, r = system.backend.xp, system.nrhs
        parts, flops, peak, last = [], 0, 0, None
        for start in range(0, r, chunk_size):
            part = system.columns(start, min(start + chunk_size, r))
            last = _prepare_cyclic_reduction(plans.standing(part.operator_of), rtol=rtol,
                                             atol=atol, **options)(part)
            if not last.usable:  # its samples named; the chunks after it not solved
                rest = xp.full((system.rhs.shape[0], r - start - part.nrhs), xp.nan,
                               dtype=system.dtype, device=backend.device(system.rhs))
                return replace(last, x=xp.concat(parts + [last.x, rest], axis=1),
                               message=f"samples {start}..{start + part.nrhs - 1}: "
                                       f"{last.message}")
            parts.append(last.x)
            flops, peak = flops + last.info["flops"], max(peak, last.info["peak_bytes"])
        info = {k: v for k, v in last.info.items() if k in ("levels", "within", "width",
                                                              "fill_in", "carried")}
        x = xp.concat(parts, axis=1)
        held = math.prod(x.shape) * backend.itemsize(x.dtype)  # the parts, then x
        info.update(flops=flops, peak_bytes=peak + held, chunk_size=chunk_size)
        return finish(system, x, tol=Tolerance.of(system, rtol, atol), levels=last.levels,
                      info=info, direct=True)

    return solve


def _chunk_size(operator: Any, chunk_size: Any, shared_diagonal: str | None) -> int | None:
    """``chunk_size`` checked: ``None`` where one chunk holds every sample."""
    if chunk_size is None:
        return None
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise OptionError(f"chunk_size must be a positive integer, got {chunk_size!r}")
    if shared_diagonal is not None:
        raise OptionError("chunk_size and shared_diagonal exclude each other: the batch "
                          "mean of a chunk is not the batch's")
    return chunk_size if chunk_size < (operator.samples or 1) else None


def _applies(option: str, value: Any, where: str) -> None:
    """An option given for a system it does not apply to is an error, not ignored."""
    if value is not None:
        raise OptionError(f"{option} applies to {where} only; this system is not one")


def _prepare_cyclic_reduction(system: Any, *, rtol: float | None = None, atol: float = 0.0,
                              shared_diagonal: str | None = None,
                              sparse: bool | None = None, dense_threshold: float | None = None,
                              within: str | None = None, groups: bool = False) -> Callable:
    """The matrix work of ``cyclic-reduction`` (its plan): the per-rhs solve it returns.

    On a dense chain the reduced blocks are formed here, once; the other
    variants (over time, over groups, sparse) still reduce per solve.
    """
    shared = shared_diagonal is not None
    if system.structure is not None:
        _applies("sparse", sparse, "chains")
        _applies("dense_threshold", dense_threshold, "chains")
        within = within or WITHIN[0]
        return _plan(system, plans.time_factored(within), rtol, atol, shared_diagonal,
                     footprint.time_cyclic_reduction(system, within))
    _applies("within", within, "RNN systems")
    if groups and not system.is_chain:
        _applies("sparse", sparse, "chains")
        _applies("dense_threshold", dense_threshold, "chains")
        return _plan(system, plans.groups_factored, rtol, atol, shared_diagonal,
                     footprint.groups(system))
    if not system.is_chain:
        raise ValueError("this system is not block bi-diagonal (a chain): each block row "
                         "must have at most one neighbour; for a graph with skip "
                         "connections pass groups=True (each residual block becomes one "
                         f"node, {len(system.blocks.groups)} groups here), or use "
                         "'substitution', 'level-scheduled' or a Krylov method")
    if system.couplings.identity and not sparse:  # a diagonal recurrence: O(nb n) a sample
        _applies("dense_threshold", dense_threshold, "sparse reductions (sparse=True)")
        diagonal = plans.factored(odd_even.factor, odd_even.substitute, diagonal=True)
        return _plan(system, diagonal, rtol, atol, shared_diagonal, footprint.reduction(
            diagonal, system, shared_diagonal, name=("diagonal",)))
    dense_peak = footprint.dense_cyclic_reduction(system, shared, parallel_form=False)
    if _sparse(system, sparse):  # fill-in decides; a level's product and its split, at
        # worst dense, in CSR (12 bytes an entry): 3 times the dense path bounds it
        factored = _sparse_factored(0.25 if dense_threshold is None else dense_threshold)
        return _plan(system, factored, rtol, atol, shared_diagonal, 3 * dense_peak)
    _applies("dense_threshold", dense_threshold, "sparse reductions (sparse=True)")
    dense = plans.factored(odd_even.factor, odd_even.substitute)
    return _plan(system, dense, rtol, atol, shared_diagonal, dense_peak)


@register("cyclic-reduction", kind="direct", exact=True, native=True,
          requires=("reducible",))
class CyclicReduction(Method):
    """Odd-even cyclic reduction: ceil(log2 nblocks) levels, exact.

    On a block bi-diagonal system (FNN) it reduces the chain of blocks. On an
    RNN system it is two-level (:mod:`propop.solvers.reduction.over_time`): over the
    layers of every step, then over time with dense per-step blocks;
    ``levels = ceil(log2(l + 1)) + ceil(log2 tau)`` and ``info["levels"]``
    gives both parts. Other systems raise ``ValueError`` unless ``groups=True``.

    Parameters
    ----------
    shared_diagonal : {None, "mean"}
        ``"mean"``: one reduced block per pair for the whole batch, from the
        batch-mean scalings. Approximate; ``info["approximation_error"]`` holds
        its error against the exact solution and the status is ``APPROXIMATE``
        unless it meets ``rtol``.
    sparse : bool or None
        Chains: reduce with sparse products. Default: where the couplings are
        ``scipy.sparse`` and some block is at least ``SPARSE_MIN_WIDTH`` (256)
        wide; narrower blocks are faster dense. ``info["fill_in"]`` then lists,
        per level, the non-zeros of a reduced block relative to an original one
        (a dense reduction says there that it did not follow them).
    dense_threshold : float, optional
        Chains: density of the reduced blocks beyond which the remaining levels
        run dense (padded stacks, one batched ``matmul`` a level); default 0.25.
    within : {"cyclic-reduction", "substitution"}, optional
        RNN systems: how the layers of each step are solved, in
        ``ceil(log2(l + 1))`` levels (the default) or ``l`` cheaper ones.
    groups : bool
        Graphs with skip connections: reduce over :attr:`~propop.Blocks.groups`
        of consecutive blocks, each residual block one node
        (:mod:`propop.solvers.reduction.over_groups`); ``info["levels"]`` splits the
        levels into the dense solves within groups and the reduction over them.
    chunk_size : int, optional
        A batch with a matrix per sample (a network's slopes): reduce this many
        samples at a time, each chunk's reduced blocks formed, used and freed before
        the next (as ``torch.func.vmap``'s ``chunk_size``). The peak memory is one
        chunk's and the solution's parts, the work the same and the answer to
        rounding (other batch sizes, other kernels' sums), and the plan keeps
        nothing of the matrix for another right-hand side. The memory guard checks
        each chunk; its error for the whole batch says which ``chunk_size`` would
        fit with the solution.

    Notes
    -----
    ``levels`` is the number of reduction levels; back-substitution takes as many
    again. ``info["flops"]`` counts the floating-point operations executed
    (padded widths). ``info["peak_bytes"]`` is the peak memory, within 20% of
    the measured one: estimated from the shapes before anything is allocated
    (:mod:`.footprint`), or, for the sparse reduction, whose fill-in decides it,
    counted as it runs (the guard then uses an upper bound, three times the
    dense path's). Above the memory budget (:mod:`propop.memory`) the method raises
    :class:`~propop.memory.MemoryBudgetError` before allocating.
    An option for another kind of system (``within`` on a chain, ``sparse`` on
    an RNN system) raises ``ValueError``.
    """

    def init(self, operator: Any, *, rtol: float | None = None, atol: float = 0.0,
             shared_diagonal: Literal["mean"] | None = None, sparse: bool | None = None,
             dense_threshold: float | None = None,
             within: Literal["cyclic-reduction", "substitution"] | None = None,
             groups: bool = False, chunk_size: int | None = None
             ) -> Callable[[Any], Solution]:
        """The reduction's work on the matrix; returns the solve of a right-hand side."""
        chunk_size = _chunk_size(operator, chunk_size, shared_diagonal)
        if chunk_size is not None:
            return _chunked(operator, chunk_size, rtol, atol,
                            dict(sparse=sparse, dense_threshold=dense_threshold,
                                 within=within, groups=groups))
        return _prepare_cyclic_reduction(
            plans.standing(operator), rtol=rtol, atol=atol, shared_diagonal=shared_diagonal,
            sparse=sparse, dense_threshold=dense_threshold, within=within, groups=groups)

    def compute(self, state: Callable[[Any], Solution], system: Any) -> Solution:
        """The right-hand side's substitution through the reduced levels."""
        return state(system)


@register("parallel-cyclic-reduction", kind="direct", exact=True,
          native=True, requires=("chain",))
class ParallelCyclicReduction(Method):
    """Parallel cyclic reduction (the paper's form): ceil(log2 nblocks) levels.

    Options as for ``cyclic-reduction``, except that sparse couplings are
    densified (no sparse PCR). Work is ``O(nblocks log nblocks)``
    block products against cyclic reduction's ``O(nblocks)``; in exchange there
    is no back-substitution phase. ``init`` keeps every level's cores (``log2``
    times one level's memory) so that each right-hand side is ``log2 nblocks``
    batched products.
    """

    def init(self, operator: Any, *, rtol: float | None = None, atol: float = 0.0,
             shared_diagonal: Literal["mean"] | None = None) -> Callable[[Any], Solution]:
        """Every level's cores; returns the solve of a right-hand side."""
        operator.require_chain()  # a clear error for systems that are not block bi-diagonal
        standing = plans.standing(operator)
        peak = footprint.dense_cyclic_reduction(standing, shared_diagonal is not None,
                                                parallel_form=True)
        parallel = plans.factored(odd_even.parallel_factor, odd_even.parallel_substitute)
        return _plan(standing, parallel, rtol, atol, shared_diagonal, peak)

    def compute(self, state: Callable[[Any], Solution], system: Any) -> Solution:
        """The right-hand side through every level."""
        return state(system)
