"""The accuracy contract: one stopping rule for every method, block by block.

The user's side of it: docs/index.md, "What CONVERGED promises".

A column (sample) of ``x`` has converged when every block row of the
unit-diagonal system holds to relative accuracy ``rtol``::

    ||r_k|| <= rtol (||x_k|| + ||c_k||) + eps^2 (||x|| + ||c||)   for every block k,
    or    ||c - A x|| <= atol

with ``r = D^{-1}(c - A x)`` the residual of the unit-diagonal form (the scaled
form's own; the paper form's rows divided by its diagonal) and ``c`` that
form's right-hand side. This is the blockwise backward error of the solve: the
answer is the exact solution of a system whose every block row is perturbed by
at most ``rtol`` relative to its own size, so a layer whose gradient is ``1e-12``
in absolute terms is held to ``rtol`` relative to ``1e-12``, not to the norm of
the whole vector. A global rule (SciPy's ``||r|| <= rtol ||c||``) is met while
the lowest layers of a network with vanishing gradients are still zero; this
one is not. The ``eps^2`` term (``5e-32`` of the column in float64) only lets a
block that is exactly zero carry rounding from its neighbours. ``atol`` keeps
SciPy's meaning: an absolute bound on the norm of the whole residual of a sample.

The forward error of each block is then at most ``rtol`` times the amplification
with which back-propagation itself carries perturbations from layer to layer,
the same factor that turns rounding into the error of exact substitution.

``rtol=None`` (every method's default) is :func:`default_rtol` of the system's
dtype: ``1e-10`` in float64, ``100 eps`` in lower precisions (``1.2e-5`` in
float32), so that float32 works out of the box.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import backend
from .solution import Solution, Status

__all__ = [
    "Tolerance", "initial_guess", "finish", "column_norms", "default_maxiter",
    "default_rtol", "block_norms", "block_squares",
]


def default_rtol(dtype: Any) -> float:
    """``max(1e-10, 100 eps)`` of ``dtype``: ``1e-10`` in float64, ``1.2e-5`` in float32."""
    return max(1e-10, 100 * backend.eps(dtype))


def attainable(dtype: Any) -> float:
    """The smallest ``rtol`` a solve in ``dtype`` can be expected to reach (``10 eps``)."""
    return 10 * backend.eps(dtype)


def default_maxiter(system: Any) -> int:
    """``2 nblocks + 10``: room for rounding beyond the exact ``nblocks`` steps.

    Krylov methods are exact after ``nblocks`` steps in exact arithmetic: the
    off-diagonal part is nilpotent.
    """
    return 2 * system.nblocks + 10


def column_norms(R: Any) -> np.ndarray:
    """Euclidean norm of each column (one entry for a vector), as host floats."""
    return _unscaled(lambda A: np.sqrt(_column_squares(A)), R)


def _unscaled(norms_of: Any, A: Any, scale: np.ndarray | None = None) -> np.ndarray:
    """``norms_of(A)``, taken again of ``A``'s columns scaled by powers of two where it fails.

    Sums of squares underflow for entries below ``sqrt(tiny / eps)`` of the dtype
    (``1e-146`` in float64, ``3e-16`` in float32) and overflow above its inverse: a
    right-hand side of ``1e-200`` read as zero let Jacobi stop at ``x0 = 0`` and call
    it converged. Where a column's norms all lie below that range, or some above it,
    the column is scaled by the power of two of its largest entry (one reduction, only
    then) and its norms are those of the scaled column times that power: exact. Blocks
    tiny only against a larger one of their column keep their fast norms (the bound's
    ``eps^2`` floor of the column holds them). ``norms_of`` keeps the columns last.
    ``scale``: per column, a size that ``A``'s norms are measured against (a
    residual's bound): where it is well scaled, norms that underflow are below its
    rounding, and no column is read again (an exact residual of zeros, say).
    """
    norms = norms_of(A)
    low, high = backend.safe_norms(A.dtype)
    top = norms if norms.ndim == 1 else norms.max(axis=0, initial=0.0)  # per column
    if top.size == 0:
        return norms
    least, most = (float(top[0]),) * 2 if top.size == 1 else (float(top.min()),
                                                               float(top.max()))
    if low <= least and most <= high:  # the common case
        return norms
    small = top < low if scale is None else (top < low) & (scale < low)
    if not (small | (top > high)).any() or not math.isfinite(most):
        return norms  # well scaled where it matters, or not finite (the caller names that)
    xp = backend.namespace(A)
    columns = A if A.ndim == 2 else A[:, None]
    largest = np.asarray(backend.to_host(xp.max(xp.abs(columns), axis=0)), dtype=float)
    if not ((largest > 0) & ((largest < low) | (largest > high))).any():
        return norms  # zero columns, and blocks small against their column's largest
    exponent = backend.binary_exponents(largest, A.dtype)
    scale = backend.astype(backend.like(np.ldexp(1.0, -exponent), A), A.dtype)
    scaled = columns * scale[None, :]
    return norms_of(scaled if A.ndim == 2 else scaled[:, 0]) * np.ldexp(1.0, exponent)


def _column_squares(R: Any) -> np.ndarray:
    xp = backend.namespace(R)
    squares = _squares(xp, R, "ij,ij->j") if R.ndim == 2 else (R @ R)[None]
    return np.asarray(backend.to_host(squares), dtype=float)


def rhs_column_norms(system: Any) -> np.ndarray:
    """``||c||`` of each column of a system's right-hand side, as host floats.

    Where the system names its support (:attr:`TriangularSystem.rhs_support`) and
    is in the scaled form, from the support's blocks alone: the others are zeros
    that no pass reads (a backward system's are pages never touched).
    """
    support, c = system.rhs_support, system._scaled_rhs
    if support is None or system.form != "scaled":
        return column_norms(system.rhs)
    o = system.offsets
    return _combined(np.stack([column_norms(c[o[k]:o[k + 1], ...]) for k in sorted(support)]))


def block_norms(system: Any, A: Any, scale: np.ndarray | None = None) -> np.ndarray:
    """``||A_k||`` per block ``k`` and column: a host array ``(nblocks, columns)``.

    ``A`` is stacked like the system's right-hand side, ``(N,)`` or ``(N, c)``;
    no column's norms under- or overflow (:func:`_unscaled`, with its ``scale``).
    """
    return _unscaled(lambda B: np.sqrt(block_squares(system, B)), A, scale)


def _combined(norms: np.ndarray) -> np.ndarray:
    """``sqrt(sum_k norms_k^2)`` per column, scaled by the largest where squares would fail."""
    whole = np.sqrt(np.einsum("kc,kc->c", norms, norms))
    if 1e-150 < float(whole.min(initial=1.0)) and float(whole.max(initial=0.0)) < 1e150:
        return whole  # host float64: no square that matters underflowed
    top = norms.max(axis=0, initial=0.0)
    safe = np.where(top > 0, top, 1.0)
    return top * np.sqrt(((norms / safe) ** 2).sum(axis=0))


def block_squares(system: Any, A: Any) -> np.ndarray:
    """``||A_k||^2`` per block and column, as host floats (one reduction for all blocks)."""
    A = A if A.ndim == 2 else A[:, None]
    xp, sizes = system.backend.xp, system.sizes
    if system.equal_sizes:
        stacked = xp.reshape(A, (len(sizes), sizes[0], A.shape[1]))
        squares = _squares(xp, stacked, "knc,knc->kc")
    elif system.backend.name == "numpy":  # NumPy's reduceat sums each block by itself
        squares = np.add.reduceat(A * A, system.offsets[:-1], axis=0)
    else:  # the blocks padded into one stack; CuPy's reduceat differences a running sum,
        # which loses a small block after large ones (a gradient that vanishes)
        zero = xp.zeros((1, A.shape[1]), dtype=A.dtype, device=backend.device(A))
        rows = backend.kept_for(("padded rows", tuple(sizes)), lambda: system.layout.padded_rows,
                                A)
        padded = xp.take(xp.concat([A, zero]), rows, axis=0)
        squares = _squares(xp, xp.reshape(padded, (len(sizes), -1, A.shape[1])),
                           "knc,knc->kc")
    return np.asarray(backend.to_host(squares), dtype=float)


def _squares(xp: Any, A: Any, subscripts: str) -> Any:
    """Sums of squares over the second-last axis of ``A``, with no temporary.

    ``einsum`` where the namespace has it (NumPy's ``vecdot`` over a non-last axis
    walks the array with a stride, 5x slower); the standard's ``vecdot`` elsewhere.
    """
    if hasattr(xp, "einsum"):
        return xp.einsum(subscripts, A, A)
    return xp.vecdot(A, A, axis=-2)


@dataclass(frozen=True)
class Tolerance:
    """The accuracy contract of the module docstring for one system.

    Attributes
    ----------
    rtol, atol : float
        The tolerances (``rtol`` resolved from the dtype when ``None`` was given).
    system : TriangularSystem
        Whose blocks the rule runs over.
    rhs_norms : ndarray, shape (nblocks, columns)
        ``||c_k||`` of the unit-diagonal form's right-hand side (computed when first read).
    """

    rtol: float
    atol: float
    system: Any = field(repr=False)

    @classmethod
    def of(cls, system: Any, rtol: float | None, atol: float) -> Tolerance:
        """The contract for ``system``; ``rtol=None`` is :func:`default_rtol` of its dtype."""
        rtol = default_rtol(system.dtype) if rtol is None else float(rtol)
        return cls(rtol, float(atol), system)

    @functools.cached_property
    def rhs_norms(self) -> np.ndarray:
        """``||c_k||`` per block and column of the unit-diagonal form's right-hand side."""
        return block_norms(self.system, self.system.scaled().rhs)

    def block_ratios(self, R: Any, X: Any, columns: Any = None) -> np.ndarray:
        """``||r_k||`` over its bound, per block and column (0 where ``r_k = 0``).

        The bound is ``rtol (||x_k|| + ||c_k||)`` plus ``eps^2 (||x|| + ||c||)`` of
        the whole column: a block that is zero, or below the square of the unit
        roundoff of the solution, is numerically zero. ``R`` is a residual of the
        system's own form; ``columns`` picks the columns of the right-hand side
        that ``R`` and ``X`` hold (default: all).
        """
        return self.assess(R, X, columns)[0]

    def assess(self, R: Any, X: Any, columns: Any = None) -> tuple[np.ndarray, tuple]:
        """``(block ratios, floored blocks)`` of a residual ``R`` at ``X``, in one pass.

        The floored blocks meet the contract only through the absolute floor: their
        residual exceeds ``rtol (||x_k|| + ||c_k||)`` in some column but not the
        bound. Such a block is below ``eps^2`` of its column, numerically zero at
        the column's scale: it may come back as zero, or with a relative error of
        any size, its absolute error under that floor. Named in block order.
        """
        relative = block_norms(self.system, X)  # ||x_k||, made the bound in place:
        c = self.rhs_norms if columns is None else self.rhs_norms[:, columns]
        whole = _combined(relative) + _combined(c)
        r = block_norms(self.system, self.system.unit_rows(R), whole)
        relative += c
        relative *= self.rtol  # rtol (||x_k|| + ||c_k||)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            floored = r > relative
            ratios = relative + self.floor_factor * whole  # the bound
            floored &= r <= ratios
            ratios = np.divide(r, ratios, out=ratios)  # 0/0 (a zero block): made 0 below
        ratios[r == 0] = 0.0
        ratios[np.isnan(ratios)] = np.inf
        names = tuple(self.system.names[k] for k in np.flatnonzero(floored.any(axis=1)))
        return ratios, names

    @property
    def floor_factor(self) -> float:
        """``eps^2`` of the system's dtype: the numerically-zero floor of a block."""
        return backend.eps(self.system.dtype) ** 2

    def ratios(self, R: Any, X: Any, columns: Any = None) -> np.ndarray:
        """The worst block's ratio per column: the column meets ``rtol`` where it is <= 1."""
        return self.block_ratios(R, X, columns).max(axis=0)

    def met(self, ratios: np.ndarray, norms: np.ndarray) -> np.ndarray:
        """Which columns meet the contract, from their :meth:`ratios` and residual norms."""
        return (ratios <= 1) | (norms <= self.atol)

    def floor(self, X: Any, columns: Any = None) -> np.ndarray:
        """Per column, a residual norm below which every block surely meets ``rtol``.

        ``||r_k|| <= ||r||``, so a residual norm under the smallest block's bound
        (divided by the largest row scaling of the paper form) meets the rule: an
        early stop inside a Krylov cycle, before the true residual confirms it.
        """
        size = block_norms(self.system, X) + (self.rhs_norms if columns is None
                                              else self.rhs_norms[:, columns])
        return np.maximum(self.atol, self.rtol * size.min(axis=0) / self.system.row_scale_max)


def initial_guess(system: Any, x0: Any) -> Any:
    """Zeros like the right-hand side, or ``x0`` (checked and copied by ``make_system``)."""
    return system.backend.xp.zeros_like(system.rhs) if x0 is None else x0


def _first_nonfinite(system: Any, x: Any) -> str:
    xs = system.split(x)
    for k in system.blocks.order():
        if not bool(system.backend.xp.all(system.backend.xp.isfinite(xs[k]))):
            return system.names[k]
    return "the solution"


_UNCHECKED = contextvars.ContextVar("propop_unchecked", default=False)


@contextlib.contextmanager
def unchecked() -> Iterator[None]:
    """Direct methods' finite results come back ``UNCHECKED``, their true residual not computed.

    For a caller that judges every result itself: Newton's forward pass
    (:func:`propop.forward`) measures the nonlinear residual of each iterate, the
    true residual of the system it solves, so a linear solve's own check (a
    product with the whole system and a pass over every block, about a fifth of
    an Elman RNN's Newton iteration) would be computed twice. Nothing is claimed
    ``CONVERGED`` without its check: a result inside is ``UNCHECKED``; one that is
    not finite, a breakdown, and every iterative method's result (whose status
    says whether its iteration met the tolerance) are judged as always, and so is
    substitution's (its rows evaluated in place: the check is the finiteness).
    The setting is the context's (:mod:`contextvars`), undone on leaving.

    Examples
    --------
    >>> import numpy as np, propop as pp
    >>> net = pp.FNN.random([3, 4, 2], activation="tanh", seed=0)
    >>> trace = net.forward(np.ones(3))
    >>> B = pp.backward_system(net, trace, trace.output)
    >>> with unchecked():
    ...     pp.solve(B, "cyclic-reduction").status.name
    'UNCHECKED'
    >>> pp.solve(B, "cyclic-reduction").status.name
    'CONVERGED'
    """
    token = _UNCHECKED.set(True)
    try:
        yield
    finally:
        _UNCHECKED.reset(token)


def finish(system: Any, x: Any, *, tol: Tolerance, iterations: int = 0,
           history: Sequence[float] = (), levels: int = 0, info: dict | None = None,
           maxiter: int | None = None, breakdown: str = "", estimates: bool = False,
           direct: bool = False, evaluated: bool = False) -> Solution:
    """Build the :class:`Solution`: status from the true residual, block by block, never silent.

    Every method ends here, direct ones included: the true residual ``c - A x``
    costs one product and is the only ground for CONVERGED. ``history`` holds
    the residual norms the method recorded (initial first); with
    ``estimates=True`` its last entry is replaced by the true final norm.
    ``direct=True``: a result that misses the tolerance is ``INACCURATE`` (rounding
    amplified beyond ``rtol``), not ``MAX_ITER``. ``info["block_ratios"]`` holds
    each sample's worst block ratio (the contract holds where it is at most 1),
    ``info["floored"]`` the blocks held only to the absolute floor (see
    :meth:`Tolerance.assess`).

    ``evaluated=True`` says that every block of ``x`` *is* its scaled row
    evaluated at the final blocks it reads, ``x_k = c_k + s_k (M x)``, as
    substitution computes it: the residual of that row, computed with the same
    products in the same order, is exactly zero wherever ``x`` is finite (a second
    product would measure only two kernels' rounding). The check is then that
    every block is finite; a non-finite ``x`` takes the full path for its message.
    """
    info = dict(info or {}, verified=True)
    xp = system.backend.xp
    if evaluated and backend.all_finite(x, xp):
        return _evaluated(system, x, tol, iterations, history, levels, info)
    if direct and not breakdown and _UNCHECKED.get() and backend.all_finite(x, xp):
        return Solution(x=x, status=Status.UNCHECKED, iterations=iterations, levels=levels,
                        info=dict(info, verified=False), message=(
                            "finite; its true residual not computed (unchecked(): the "
                            "caller judges it)"))
    with backend.quiet(xp):
        R = system.residual(x)
        norms = column_norms(R)
        ratios, floored = tol.assess(R, x)
    history = [float(h) for h in history] or [float(rhs_column_norms(system).max())]
    final = float(norms.max())
    if estimates and len(history) > 1:
        history[-1] = final
    elif history[-1] != final or len(history) == 1:
        history.append(final)
    worst = ratios.max(axis=0)
    info.update(residual_estimates=estimates, sample_residuals=norms, block_ratios=worst,
                rtol=tol.rtol, atol=tol.atol, floored=floored)
    met = tol.met(worst, norms)
    finite = bool(np.isfinite(norms).all()) and backend.all_finite(x, system.backend.xp)
    if met.all() and finite:
        status, message = Status.CONVERGED, (
            f"converged in {iterations} iterations, residual {final:.2e}, every block "
            f"within rtol={tol.rtol:.1e}" + (
                f"; {len(floored)} blocks below eps^2 of their column held to the absolute "
                f"floor only, first {_first_in_solve_order(system, floored)}: it and the "
                "blocks solved after it are accurate to that absolute level, not to rtol"
                if floored else ""))
    elif breakdown:
        status, message = Status.BREAKDOWN, breakdown
    elif not finite:
        status, message = Status.NONFINITE, _nonfinite_message(system, x, direct)
    elif direct:
        status, message = Status.INACCURATE, _inaccurate_message(system, tol, ratios, met)
    else:
        status, message = Status.MAX_ITER, _max_iter_message(system, tol, ratios, met, maxiter)
    return Solution(x=x, status=status, message=message, iterations=iterations,
                    residuals=tuple(history), levels=levels, info=info)


def _evaluated(system: Any, x: Any, tol: Tolerance, iterations: int,
               history: Sequence[float], levels: int, info: dict) -> Solution:
    """The :class:`Solution` of finite rows evaluated in place (:func:`finish`'s ``evaluated``)."""
    columns = x.shape[1] if x.ndim == 2 else 1
    norms = np.zeros(columns)
    first = [float(h) for h in history[:1]] or [float(rhs_column_norms(system).max())]
    info.update(residual_estimates=False, sample_residuals=norms, block_ratios=norms,
                rtol=tol.rtol, atol=tol.atol, floored=(), residual="rows evaluated")
    return Solution(x=x, status=Status.CONVERGED, iterations=iterations,
                    residuals=(*first, 0.0), levels=levels, info=info, message=(
                        f"converged in {iterations} iterations: every block its row "
                        "evaluated at the final blocks (residual 0 with the same products), "
                        "all finite"))


def _nonfinite_message(system: Any, x: Any, direct: bool = False) -> str:
    """Where the first non-finite block is, and why it may be (a direct method's: overflow)."""
    where = f"non-finite values, first in {_first_nonfinite(system, x)} in solve order: "
    if direct:
        return where + ("a long product of Jacobians overflowed; check the weights' scale "
                        "(training: the learning rate) or use float64")
    return where + ("a long product of Jacobians overflowed or the iteration diverged; "
                    "check the weights' scale, use float64, or a direct method such as "
                    "'substitution'")


def _first_in_solve_order(system: Any, names: tuple) -> str:
    """The first of the named blocks in solve order."""
    index = {system.names[k]: i for i, k in enumerate(system.blocks.order())} if \
        system.structure is None and system.coupling_stack is None else None
    if index is None:  # a chain or time structure: solve order is block order or its reverse
        return names[0] if system.lower else names[-1]
    return min(names, key=index.__getitem__)


def _inaccurate_message(system: Any, tol: Tolerance, ratios: np.ndarray, met: np.ndarray
                        ) -> str:
    """A direct method's result that misses the tolerance: where, by how much, what to do."""
    short = np.where(met[None, :], 0, ratios)
    block, sample = np.unravel_index(int(np.argmax(short)), short.shape)
    where = "" if met.size == 1 else f" of sample {sample}"
    return (f"the result misses the tolerance: {system.label(block)}{where} has a "
            f"residual {short[block, sample]:.1e} times rtol={tol.rtol:.1e} relative to its "
            f"own size; rounding was amplified beyond rtol ({backend.dtype_name(system.dtype)}): "
            "use float64, raise rtol, or 'substitution' if this was another method")


def _max_iter_message(system: Any, tol: Tolerance, ratios: np.ndarray, met: np.ndarray,
                      maxiter: int | None) -> str:
    """Which block of which sample misses the contract, by how much, and what to do."""
    short = np.where(met[None, :], 0, ratios)
    block, sample = np.unravel_index(int(np.argmax(short)), short.shape)
    where = "" if met.size == 1 else f" of sample {sample} ({int((~met).sum())} of " \
                                     f"{met.size} samples short)"
    text = (f"reached maxiter={maxiter}: {system.label(block)}{where} has a residual "
            f"{short[block, sample]:.1e} times rtol={tol.rtol:.1e} relative to its own size "
            "(every block is held to rtol, so tiny gradients are as accurate as large ones); ")
    floor = attainable(system.dtype)
    if tol.rtol < floor:
        return text + (f"rtol is below what {backend.dtype_name(system.dtype)} can reach (about "
                       f"{floor:.0e}): raise rtol (the default follows the dtype) or use float64")
    return text + (f"raise maxiter (the off-diagonal part is nilpotent: {system.nblocks} Jacobi "
                   "sweeps are exact) or use a direct method such as 'substitution'")
