"""Block substitution, by blocks or by topological levels (paper section 3.1).

The sequential baseline of every other method.
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any

import numpy as np

from ... import backend
from ...systems.triangular import TriangularSystem
from ..convergence import Tolerance, block_squares, finish
from ..method import Method
from ..registry import register
from ..solution import Solution, Status
from ...systems.coefficients import DENSE, PER_SAMPLE, SPARSE

__all__ = ["Substitution", "LevelScheduled", "substitute", "sweep", "row",
           "approximation_report"]


@register("substitution", kind="direct", exact=True, native=True)
class Substitution(Method):
    """Block forward/back substitution: the sequential baseline.

    Eqs. def_forw_prop2 and def_back_prop2, written on the system's blocks.

    Block row ``k`` is ``x_k = c_k + s_k * (M x_nbr)`` in the scaled form (the
    paper's form has the same solution); one product with the shared coupling
    matrix serves all samples. ``levels`` is the number of
    blocks, each a sequential step. Each block is its row evaluated at final
    blocks, so the true residual with the same products is zero wherever the
    result is finite: what is checked is that every block is finite (overflow is
    ``NONFINITE``, naming the first block), and the loop costs what a hand-written
    one does. ``recheck=True`` computes ``c - A x`` with a second product, the
    operator's own (as many flops again), and judges it by ``rtol``/``atol``:
    a check of the loop itself, where rounding between the two kernels' sums
    beyond ``rtol`` is ``INACCURATE``.

    One loop for every layout (:func:`substitute`): a chain's blocks, a graph's
    in topological order, an RNN's layers step by step on their stacked arrays,
    never unrolled into per-block objects.
    """

    def init(self, operator: Any, *, rtol: float | None = None, atol: float = 0.0,
             recheck: bool = False) -> dict:
        """The options: substitution has no per-matrix work of its own."""
        return dict(rtol=rtol, atol=atol, recheck=recheck)

    def applies(self, state: dict) -> bool:
        """Only ``recheck`` applies the operator: the rows are evaluated, not multiplied again."""
        return state["recheck"]

    def compute(self, state: dict, system: Any) -> Solution:
        """The blocks by :func:`substitute`, each checked finite (``recheck``: the residual)."""
        return finish(system, substitute(system),
                      tol=Tolerance.of(system, state["rtol"], state["atol"]),
                      levels=system.nblocks, direct=True, evaluated=not state["recheck"])


def substitute(system: Any, order: Any = None) -> Any:
    """The solution by block substitution, unchecked: the kernel of :func:`substitution`.

    :func:`sweep` over the rows the system's layout gives (:func:`_rows`).
    ``order`` is the order of a graph's blocks (any topological order; the
    layout's by default). For solves inside other methods (preconditioners)
    whose results the outer method checks.
    """
    op, C = system.operator_of, system._scaled_rhs
    X = op.backend.xp.empty_like(C)
    plain = op.layout.kind != "time" and op.coupling_stack is not None and \
        op.coupling_stack.dtype == X.dtype  # C-ordered blocks of one dtype: NumPy's dot
    sweep(op.backend.xp, _rows(op, X, C, _rhs_blocks(system), order), plain)
    return X


# Row kinds of the sweep alone: the coupling is the identity, its term the block it reads;
# or the row's "M" is a writer of one matrix's product (backend.matmul_writer), resolved once
# for the rows of every step of a layer that the matrix couples.
IDENTITY = "identity"
WRITER = "writer"


def sweep(xp: Any, rows: Any, plain: bool = False) -> None:
    """Block substitution: the one loop, over ``rows`` in solve order.

    Each row ``(out, M, x, kind, more, scale, c)`` is
    ``x_k = c_k + s_k * (M x + sum over more)`` (eqs. def_forw_prop2 and
    def_back_prop2 in the scaled form), written into the view ``out``: ``M x``
    the first product (``M`` is ``None`` for a row that reads no block), ``more``
    the other terms ``(M_e, x_e, kind)`` (kinds of :mod:`propop.systems.coefficients`;
    a dense ``M_e`` broadcasts over leading axes of ``x_e``), ``scale`` and ``c``
    ``None`` where they are one and zero; a row of kind :data:`IDENTITY` copies
    ``x`` (identity couplings), one of kind :data:`WRITER` calls ``M(x, out=out)``.
    The first product is written into ``out`` directly. The rows are made as the
    loop reaches them, so they may read what earlier rows wrote. ``plain``: every
    dense product is of one dtype into a C-ordered block
    (:func:`~propop.backend.matmul_out`).
    """
    matmul = backend.matmul_out(xp, plain)
    with backend.quiet(xp):  # overflow is reported by finish()
        for out, M, x, kind, more, scale, c in rows:
            if M is None:
                out[...] = 0 if c is None else c
                continue
            if kind is DENSE:
                matmul(M, x, out=out)
            elif kind is WRITER:
                M(x, out=out)
            elif kind is IDENTITY:
                out[...] = x
            else:
                out[...] = _product(xp, M, x, kind)
            for term in more:
                out += _product(xp, *term)
            if scale is not None:
                out *= scale
            if c is not None:
                out += c


def row(out: Any, terms: list, scale: Any, c: Any) -> tuple:
    """A row of :func:`sweep` from its list of terms ``(M_e, x_e, kind)`` (maybe empty)."""
    if not terms:
        return out, None, None, None, (), scale, c
    return (out, *terms[0], terms[1:], scale, c)


@register("level-scheduled", kind="direct", exact=True, native=True)
class LevelScheduled(Method):
    """Substitution by topological levels: the classic parallel sparse triangular solve.

    The blocks of a level (:attr:`Layout.levels`) read only earlier levels, so
    each level is one parallel step: ``levels`` is the longest chain of
    couplings (``l + 1`` for an FNN, ``tau + l`` for an RNN, the depth of a
    graph) against substitution's one step per block. On a CPU the blocks of a
    level still run one after another; ``info["level_sizes"]`` gives the
    parallelism each level offers. ``init`` finds the levels (an RNN's
    unrolled into its blocks).
    """

    def init(self, operator: Any, *, rtol: float | None = None, atol: float = 0.0) -> dict:
        """The levels, and the operator whose blocks they order."""
        unrolled = operator if operator.layout.kind == "chain" else operator.unstructured()
        levels = unrolled.layout.levels
        return dict(rtol=rtol, atol=atol, unrolled=unrolled,
                    order=None if unrolled is operator else [k for lv in levels for k in lv],
                    sizes=[len(level) for level in levels])

    def applies(self, state: dict) -> bool:
        """No: every block is its row evaluated, as :class:`Substitution`'s."""
        return False

    def compute(self, state: dict, system: Any) -> Solution:
        """Substitution in the levels' order."""
        unrolled = TriangularSystem.of(state["unrolled"], system._scaled_rhs,
                                       system.rhs_support, check=False)
        x = substitute(unrolled, state["order"])
        return finish(system, x, tol=Tolerance.of(system, state["rtol"], state["atol"]),
                      levels=len(state["sizes"]), info={"level_sizes": state["sizes"]},
                      direct=True, evaluated=True)


def _rhs_blocks(system: Any) -> frozenset | None:
    """Which blocks of the right-hand side are non-zero, a set of their indices, or ``None``.

    :attr:`TriangularSystem.rhs_support` itself where the builder knows it (no look
    at the zeros), else from one pass over the right-hand side. ``None``: every
    block is read (found non-zero: no Python object per block), and for a time
    layout, whose rows are steps of layers.
    """
    if system.layout.kind == "time":
        return None
    if system.rhs_support is None:
        c = system._scaled_rhs  # counted, not squared: a block of 1e-200 squares to zero
        found = (block_squares(system, backend.astype(c != 0, c.dtype)) > 0).any(axis=1)
        return None if found.all() else frozenset(np.flatnonzero(found).tolist())
    return system.rhs_support


def _product(xp: Any, M: Any, x: Any, kind: str) -> Any:
    """``M x`` for a coupling of ``kind``; ``x`` may carry time steps first, ``(tau, n, c)``."""
    if kind is DENSE or kind is SPARSE:  # a dense M broadcasts over time steps
        return backend.over_time(M, x) if x.ndim == 3 else M @ x
    return xp.matrix_transpose((M @ xp.matrix_transpose(x)[..., None])[..., 0])  # (r, m, n)


def _rows(op: Any, X: Any, C: Any, nonzero: frozenset | None, order: Any) -> Any:
    """The rows of substitution in solve order, ``(out, terms, scale, c)``: views of X, C."""
    if op.layout.kind == "time":
        return _time_rows(op, X, C)
    xp = op.backend.xp
    if op.coupling_stack is not None:  # the blocks as one stack: a view per row, when made
        shape = (op.nblocks, op.sizes[0]) + tuple(X.shape[1:])
        xs, cs = xp.reshape(X, shape), xp.reshape(C, shape)
    else:
        xs, cs = op.split(X), op.split(C)
    if op.layout.kind == "chain" and order is None:
        return _chain_rows(op, xs, cs, nonzero)
    return _graph_rows(op, xs, cs, nonzero, op.layout.order() if order is None else order)


def _chain_rows(op: Any, xs: Any, cs: Any, nonzero: frozenset | None) -> Any:
    """A chain's rows: block ``k`` reads the block before it in solve order.

    Lower: row ``k`` reads block ``k - 1`` through coupling ``k - 1``; upper: block
    ``k + 1`` through coupling ``k``. Every part walks its stack in that order and
    ``zip`` makes the rows, so the views are made as the rows reach them: no
    Python work and no object per block beyond them.
    """
    up = not op.lower
    outs, sources, rhs = (backend.walk(a, up) for a in (xs, xs, cs))
    if nonzero is not None and len(nonzero) < op.nblocks:  # zero blocks are not added
        given = {k: cs[k] if isinstance(cs, list) else cs[k, ...] for k in nonzero}
        rhs = map(given.get, backend.walk(range(op.nblocks), up))
    stack = op.couplings.stack if not op.couplings.sparse else None
    if op.couplings.identity or stack is not None:  # one kind for all: no list of them
        kinds = itertools.repeat(IDENTITY if op.couplings.identity else
                                 PER_SAMPLE if stack.ndim == 4 else DENSE)
    else:
        kinds = reversed(op.couplings.kinds) if up else iter(op.couplings.kinds)
    scales = op.scalings.in_order(reverse=up)
    first = (next(outs), None, None, None, (), next(scales), next(rhs))
    return itertools.chain((first,), zip(outs, op.couplings.in_order(up), sources, kinds,
                                         itertools.repeat(()), scales, rhs))


def _graph_rows(op: Any, xs: Any, cs: Any, nonzero: frozenset | None, order: Any) -> Any:
    """A graph's rows in ``order``, each reading the couplings into its block.

    A graph has a Python object per block anyway (its layout's edges): the
    couplings' and scalings' views are read from their tuples, made once.
    """
    couplings, kinds, scales = op.couplings.matrices, op.couplings.kinds, op.scalings.blocks
    into = op.layout.into
    for k in order:
        yield row(xs[k], [(couplings[j], xs[col], kinds[j]) for col, j in into.get(k, ())],
                  scales[k], cs[k] if nonzero is None or k in nonzero else None)


def _time_rows(op: Any, X: Any, C: Any) -> Any:
    """A time layout's rows: whole layers where they read their own step, else step by step.

    Layers that no recurrent coupling touches and that only read earlier layers of
    their own step (the input layer, say) need no sweep: one row over all steps
    (eqs. back_prop_sys_rnn, forw_prop_sys_rnn); the recurrent layers take one
    row per step and layer.
    """
    layout = op.layout
    sizes, tau, batch = layout.step_sizes, layout.tau, tuple(X.shape[1:])
    starts = op.offsets[:layout.per]
    xp = op.backend.xp
    steps, rhs = (xp.reshape(a, (tau, sum(sizes)) + batch) for a in (X, C))
    x = [steps[:, o: o + n, ...] for o, n in zip(starts, sizes)]
    c = [rhs[:, o: o + n, ...] for o, n in zip(starts, sizes)]
    scales = op.periodic_scales(layout.per)
    matrices, kinds = op.couplings.matrices, op.couplings.kinds
    into: dict[int, list] = {k: [] for k in range(layout.per)}
    for t in layout.templates:
        into[t.row].append((t.offset, t.col, matrices[t.coupling], kinds[t.coupling]))
    order = layout.step_order()
    first, last = layout.recurrent
    for k in order[:first]:
        yield row(x[k], [(M, x[col], kind) for _, col, M, kind in into[k]], scales[k],
                  _unless_zero(xp, c[k]))
    recurrent, s = order[first:last], 0 if layout.lower else tau - 1  # the first step solved
    for k in recurrent:  # the first step reads no other step
        yield row(x[k][s, ...], [(M, x[col][s + offset, ...], kind)
                                for offset, col, M, kind in into[k] if 0 <= s + offset < tau],
                  None if scales[k] is None else scales[k][s, ...], c[k][s, ...])
    yield from itertools.chain.from_iterable(zip(*(  # the other steps: one row a layer
        _later_steps(x, c, scales[k], k, into[k], layout.lower) for k in recurrent)))
    for k in order[last:]:
        yield row(x[k], [(M, x[col], kind) for _, col, M, kind in into[k]], scales[k],
                  _unless_zero(xp, c[k]))


def _unless_zero(xp: Any, c: Any) -> Any:
    """A whole layer's right-hand side, ``None`` where it is zero at every step.

    One read (a backward system's input layer: 0.9 ms at 10000 steps of 20 x 16)
    spares adding the zeros (5.8 ms).
    """
    return c if bool(xp.any(c)) else None


def _later_steps(x: list, c: list, scale: Any, k: int, terms: list, lower: bool) -> Any:
    """Layer ``k``'s rows at every step but the first, in solve order, zipped from walks.

    Every term is in range there (a template reads at most one step away), so each
    row's views come from one walk per part, made as the sweep reaches them: no
    Python work per step beyond the row itself (as :func:`_chain_rows`).
    """
    def at(a: Any, offset: int = 0) -> Any:  # a's steps s + offset, s over the later steps
        tau = a.shape[0]
        return backend.walk(a[1 + offset: tau + offset, ...] if lower else
                            a[offset: tau - 1 + offset, ...], not lower)

    none = itertools.repeat(None)
    parts = [(itertools.repeat(M), at(x[col], offset), itertools.repeat(kind))
             for offset, col, M, kind in terms] or [(none, none, none)]
    if terms and terms[0][3] is DENSE:  # the first product: one matrix's writer for every step
        parts[0] = (itertools.repeat(backend.matmul_writer(terms[0][2])),
                    parts[0][1], itertools.repeat(WRITER))
    more = zip(*(zip(*part) for part in parts[1:])) if len(parts) > 1 else itertools.repeat(())
    return zip(at(x[k]), *parts[0], more, none if scale is None else at(scale), at(c[k]))


def approximation_report(system: Any, solution: Solution) -> Solution:
    """Mark a ``shared_diagonal="mean"`` answer approximate, with its error against the exact."""
    exact = substitute(system)
    xp = system.backend.xp
    scale = max(float(xp.linalg.vector_norm(exact)), 1e-300)
    error = float(xp.linalg.vector_norm(solution.x - exact)) / scale
    info = dict(solution.info, approximation_error=error)
    if solution.usable:  # met the tolerance, or its caller judges it (unchecked())
        return replace(solution, info=info)
    return replace(solution, status=Status.APPROXIMATE, info=info, message=(
        f"shared_diagonal='mean' is approximate: relative error {error:.2e} against the "
        "exact solution; use shared_diagonal=None (the default) for the exact answer"))
