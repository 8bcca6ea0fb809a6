"""Block substitution, by blocks or by topological levels (paper section 3.1).

The sequential baseline of every other method.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from ... import backend
from ..convergence import Tolerance, block_squares, finish
from ..registry import register
from ..solution import Solution, Status

__all__ = ["substitution", "level_scheduled", "substitute", "approximation_report"]


@register("substitution", kind="direct", exact=True, backends=("numpy", "cupy", "torch"))
def substitution(system: Any, *, rtol: float | None = None, atol: float = 0.0) -> Solution:
    """Block forward/back substitution: the sequential baseline.

    Eqs. def_forw_prop2 and def_back_prop2, written on the system's blocks.

    Block row ``k`` is ``x_k = (c_k + s_k * (M x_nbr)) / d_k``; one product with
    the shared coupling matrix serves all samples. ``levels`` is the number of
    blocks, each a sequential step. The true residual is computed at the end (one
    product, parallel over the blocks) and judged by ``rtol``/``atol``: rounding
    amplified beyond the tolerance is ``INACCURATE``, overflow ``NONFINITE``.

    A system with a time structure (an RNN's) is solved on its stacked arrays
    (:func:`_substitute_over_time`), never unrolled into per-block objects; so
    is a chain given by its stacked couplings (:func:`_substitute_stacked`).
    """
    return finish(system, substitute(system), tol=Tolerance.of(system, rtol, atol),
                  levels=system.nblocks, direct=True)


def substitute(system: Any) -> Any:
    """The solution by block substitution, unchecked: the kernel of :func:`substitution`.

    For solves inside other methods (preconditioners) whose results the outer
    method checks.
    """
    nonzero = _rhs_blocks(system)
    if system.structure is not None:
        return _substitute_over_time(system)
    if system.coupling_stack is not None:
        return _substitute_stacked(system, nonzero)
    return _substitute(system, system.blocks.steps, nonzero)


@register("level-scheduled", kind="direct", exact=True, backends=("numpy", "cupy"))
def level_scheduled(system: Any, *, rtol: float | None = None,
                    atol: float = 0.0) -> Solution:
    """Substitution by topological levels: the classic parallel sparse triangular solve.

    The blocks of a level (:attr:`Blocks.levels`) read only earlier levels, so
    each level is one parallel step: ``levels`` is the longest chain of
    couplings (``l + 1`` for an FNN, ``tau + l`` for an RNN, the depth of a
    graph) against substitution's one step per block. On a CPU the blocks of a
    level still run one after another; ``info["level_sizes"]`` gives the
    parallelism each level offers.
    """
    if system.coupling_stack is not None:  # a chain: one block per level
        x, sizes = _substitute_stacked(system, _rhs_blocks(system)), [1] * system.nblocks
    else:
        levels = system.blocks.levels
        x = _substitute(system, [step for level in levels for step in level],
                        _rhs_blocks(system))
        sizes = [len(level) for level in levels]
    return finish(system, x, tol=Tolerance.of(system, rtol, atol), levels=len(sizes),
                  info={"level_sizes": sizes}, direct=True)


def _rhs_blocks(system: Any) -> Any:
    """Which blocks of the right-hand side are non-zero (a host array of booleans).

    From :attr:`TriangularSystem.rhs_support` where the builder knows it (no look
    at the zeros), else from one pass over the right-hand side.
    """
    if system.rhs_support is None:
        return (block_squares(system, system.rhs) > 0).any(axis=1)
    nonzero = np.zeros(system.nblocks, dtype=bool)
    nonzero[sorted(system.rhs_support)] = True
    return nonzero


def _substitute(system: Any, steps: Any, nonzero: Any) -> Any:
    """Solve block by block, ``steps`` in an order that respects the dependencies.

    The right-hand side's zero blocks (``nonzero`` is ``False``) are not added.
    """
    xp = system.backend.xp
    x = xp.empty_like(system.rhs)
    xs, cs = system.split(x), system.split(system.rhs)
    with backend.quiet(xp):  # overflow is reported by finish()
        for step in steps:
            _step(xp, step, xs, cs[step.block] if nonzero[step.block] else None)
    return x


def _substitute_stacked(system: Any, nonzero: Any) -> Any:
    """Substitution on a chain's :attr:`~propop.TriangularSystem.coupling_stack`.

    The scaled form's rows ``x_k = c_k + s_k * (M_j x_nbr)`` (the paper form has
    the same solution), written into one ``(nb, n[, r])`` array: coupling ``j``
    reads block ``j`` into block ``j + 1`` (lower) or block ``j + 1`` into block
    ``j`` (upper); row 0 is unscaled. The blocks are walked in solve order as
    views made one at a time, so a solve holds nothing per block but its output.
    """
    xp, nb, S = system.backend.xp, system.nblocks, system.scale_stack
    M = system.coupling_stack
    C = system._scaled_rhs.reshape((nb, system.sizes[0]) + tuple(system.rhs.shape[1:]))
    X = xp.empty_like(C)
    lower = system.lower
    first = 0 if lower else nb - 1
    X[first] = C[first]
    per_sample = system.per_sample_couplings  # M[j] is (r, n, n): columns as a batch axis
    with backend.quiet(xp):  # overflow is reported by finish()
        for k in (range(1, nb) if lower else range(nb - 2, -1, -1)):
            x, core, source = X[k], M[k - 1] if lower else M[k], X[k - 1] if lower else X[k + 1]
            if per_sample:
                columns = (core @ xp.matrix_transpose(source)[..., None])[..., 0]  # (r, n)
                x[...] = xp.matrix_transpose(columns)
            else:
                xp.matmul(core, source, out=x)
            scale = (S[k - 1] if k else None) if S is not None else system._row_scale[k]
            if scale is not None:
                x *= scale
            if nonzero[k]:
                x += C[k]
    return X.reshape(system.rhs.shape)


def _step(xp: Any, step: Any, xs: list, c: Any) -> None:
    """Block row ``x_k = (c_k + s_k * sum_e M_e x_e) / d_k``, in place in ``xs``.

    ``c`` is the block's right-hand side, ``None`` where it is zero.
    """
    out, sources, scale = xs[step.block], step.sources, step.scale
    if not sources:
        out[...] = 0 if c is None else c
    else:
        col, M, sparse = sources[0]
        if sparse and len(sources) == 1 and scale is not None:  # one pass fewer
            xp.multiply(M @ xs[col], scale, out=out)
        else:
            backend.matmul_into(out, M, xs[col], sparse)
            for col, M, _ in sources[1:]:
                out += M @ xs[col]
            if scale is not None:
                out *= scale
        if c is not None:
            out += c
    if step.diagonal is not None:
        out /= step.diagonal


def _substitute_over_time(system: Any) -> Any:
    """Substitution on a time structure, on its stacked arrays.

    Step by step on the layers the recurrence involves, and all steps at once
    for the layers before and after them:
    ``x[s, k] = c[s, k] + s[s, k] * sum_t M_t x[s + offset_t, col_t]`` over the
    templates ``t`` into layer ``k`` (the scaled form's rows, whatever the form:
    both have the same solution). Layers that no recurrent coupling touches and
    that only read earlier layers of their own step (the input layer, say) need
    no sweep: one product over all steps (eqs. back_prop_sys_rnn, forw_prop_sys_rnn).
    """
    structure, xp = system.structure, system.backend.xp
    sizes, tau = structure.sizes, structure.tau
    batch = system.rhs.shape[1:]
    starts = [sum(sizes[:k]) for k in range(len(sizes))]
    C = system._scaled_rhs.reshape((tau, sum(sizes)) + batch)
    X = xp.empty_like(C)
    x = [X[:, o: o + n] for o, n in zip(starts, sizes)]
    c = [C[:, o: o + n] for o, n in zip(starts, sizes)]
    scales = system.periodic_scales(len(sizes))
    into: dict[int, list] = {k: [] for k in range(len(sizes))}
    for t in structure.templates:
        into[t.row].append((t.offset, t.col, t.M, backend.is_sparse(t.M)))
    order = sorted(range(len(sizes)), reverse=not system.lower)
    involved = [i for i, k in enumerate(order)
                if any(t.offset != 0 and k in (t.row, t.col) for t in structure.templates)]
    first, last = (involved[0], involved[-1] + 1) if involved else (len(order), len(order))
    with backend.quiet(xp):  # overflow is reported by finish()
        for k in order[:first]:
            _layer_at_once(x, c, scales, into[k], k)
        steps = range(tau) if system.lower else range(tau - 1, -1, -1)
        for s in steps:
            for k in order[first:last]:
                out = x[k][s]
                terms = [(x[col][s + offset], M, sparse) for offset, col, M, sparse in into[k]
                         if 0 <= s + offset < tau]
                if not terms:
                    out[...] = c[k][s]
                    continue
                backend.matmul_into(out, terms[0][1], terms[0][0], terms[0][2])
                for source, M, _ in terms[1:]:
                    out += M @ source
                if scales[k] is not None:
                    out *= scales[k][s]
                out += c[k][s]
        for k in order[last:]:
            _layer_at_once(x, c, scales, into[k], k)
    return X.reshape(system.rhs.shape)


def _layer_at_once(x: list, c: list, scales: list, incoming: list, k: int) -> None:
    """``x_k = c_k + s_k * sum_t M_t x_col`` for every step at once (within-step couplings)."""
    if not incoming:
        x[k][...] = c[k]
        return
    total = sum(backend.over_time(M, x[col]) for _, col, M, _ in incoming)
    x[k][...] = (total if scales[k] is None else scales[k] * total) + c[k]


def approximation_report(system: Any, solution: Solution) -> Solution:
    """Mark a ``shared_diagonal="mean"`` answer approximate, with its error against the exact."""
    exact = substitute(system)
    xp = system.backend.xp
    scale = max(float(xp.linalg.norm(exact)), 1e-300)
    error = float(xp.linalg.norm(solution.x - exact)) / scale
    info = dict(solution.info, approximation_error=error)
    if solution.converged:
        return replace(solution, info=info)
    return replace(solution, status=Status.APPROXIMATE, info=info, message=(
        f"shared_diagonal='mean' is approximate: relative error {error:.2e} against the "
        "exact solution; use shared_diagonal=None (the default) for the exact answer"))
