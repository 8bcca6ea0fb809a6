"""Forward propagation by iterated linearised systems: Newton's method on the network.

:func:`forward` (eq. forw_prop_sys): each iteration linearises every activation at
the current iterate, solves the forward system with any registered method and
recomputes the pre-activations; for a recurrence also the Newton family (DEER,
quasi-DEER, block-diagonal, and ELK's damped steps, :mod:`.damped`).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
import warnings
from collections.abc import Callable
from dataclasses import replace
from typing import Any


from .. import backend
from .._checks import require_finite, worst
from ..networks.trace import Trace, first_nonfinite, require_backend_of
from ..progress import bar
from ..solvers.convergence import Tolerance, default_rtol, finish, unchecked
from ..solvers.options import check_options
from ..solvers.plan import agreed, check_keywords, solve
from ..solvers.registry import info
from ..solvers.solution import ConvergenceError, Solution, Status
from ..systems import forward_system
from .damped import DAMPED, damped_newton

__all__ = ["forward"]

STOPS = ("residual", "change")
# A nonlinear residual at or below this many eps is f(y)'s own rounding: no polishing step
# then. Float32 GRUs and Elman RNNs of 20 to 2000 steps whose first passing residual lay
# between 2 and 10 eps were left at up to 38x the sequential pass's own error from
# float64's (10 eps here); one more step took them to 0.97-1.8x
POLISHED = 2
# The tightest linear tolerance the stalled iteration asks of an iterative method, in eps
FORCING_FLOOR = 10
# Iterations past the longest chain of dependencies that an iterative linear method gets
# by default: its solves' error, amplified, can leave the last exact-by-depth iterate above
# rtol (6.2e-10 against 1e-10: an FNN of 3 layers, 3 samples, secant steps by BiCGStab on
# PyTorch), and the forcing tightens that error tenfold a stalled iteration
INEXACT_STEPS = 4


def forward(net: Any, x: Any, method: str = "substitution", *,
            linearization: str = "newton", rtol: float | None = None,
            maxiter: int | None = None,
            around: Trace | None = None, check: bool = True, linear_rtol: float | None = None,
            progress: bool | str = False, stop: str = "residual", polish: bool = True,
            **options: Any) -> Trace:
    """Forward propagation by iterated linearised systems (eq. forw_prop_sys).

    Each iteration linearises every activation at the current ``y``, solves
    the forward system with ``method``, and recomputes every ``y_k = W_k z_k + b_k``
    from the new ``z`` (all layers at once). With ``linearization="newton"`` this
    is Newton's method on the whole network; the first ``k`` layers are exact
    after ``k`` iterations, so at most ``l`` iterations give the exact pass
    (``tau + l - 1`` for an RNN, whose dependencies also run along time).

    A recurrence (:class:`~propop.Recurrence`, :class:`~propop.GRU`,
    :class:`~propop.LSTM`) also takes ``linearization="quasi"`` (the Jacobian's
    diagonal: quasi-DEER), ``"block-diagonal"`` (its diagonal blocks) and the
    Levenberg-Marquardt steps ``"damped"`` (ELK)
    and ``"quasi-damped"`` (quasi-ELK), starting from ``damping`` (``lambda``,
    default 1) on Marquardt's schedule (:mod:`propop.newton.damped`);
    ``info`` then holds each step's ``damping`` and ``accepted``, and always the
    estimated largest Lyapunov exponent ``lyapunov``, with a ``RuntimeWarning``
    when it is positive.

    Stops when the nonlinear residual ``max_k ||z_{k+1} - f(y_k)|| / ||f(y_k)||``
    (and the input block's ``||z_0 - x|| / ||x||``) is at most ``rtol``
    (``stop="residual"``), or when the relative change of the states between
    two iterations is (``stop="change"``, as DEER does); both
    are recorded, in ``info["residuals"]`` and ``info["changes"]``. With ``polish``
    (the default), Newton's method (``linearization="newton"``, ``stop="residual"``)
    takes one more step once the test passes, unless the residual is the rounding of
    ``f(y)`` itself already (:data:`POLISHED`, ``2 eps``), and keeps it if its residual
    is no larger
    (``info["polished"]``): the states' error is about the residual times the
    recurrence's amplification, and Newton's quadratic convergence takes it to
    rounding level in that step (float32, an Elman RNN of 10000 steps: 2.4e-4 to
    3.7e-7 from float64's states, the sequential pass's own 2.9e-7).
    ``trace.info`` also holds ``iterations`` and the linear ``solutions`` (a direct
    method's ``UNCHECKED``: each iterate is judged by its nonlinear residual, the
    true residual of the system Newton solves, rather than each linear solve by
    its own; when the iteration fails, the last solve is judged too and its miss
    named).
    ``around`` starts the iteration from a trace (default: all states zero);
    ``rtol`` defaults by dtype (``1e-10`` in float64, ``1.2e-5`` in float32);
    ``linear_rtol`` is the tolerance of each linear solve (default the smaller
    of ``rtol`` and the dtype's default; divided by ten where an iterative method's
    error stalls the residual above ``rtol``, ``info["linear_rtol"]`` the last used);
    ``progress`` shows a bar over the Newton iterations
    (:mod:`propop.progress`); other options go to the solver.

    An iterate that overflows where the sequential pass does not (a graph's node
    linearised far from where its input settles: a LayerNorm's variance at the zero
    start) is restarted where the network offers it (``net.restarted``, a graph's): the
    nodes that overflow their readers start again from zeros, the nodes already exact
    stay, so the exact front still advances a node an iteration; ``info["restarts"]``
    lists those iterations.

    A run that does not converge returns (``check=False``) its best iterate, the
    one with the smallest nonlinear residual, with ``info["converged"]`` false,
    ``info["best_iteration"]`` and ``info["message"]``.

    Raises
    ------
    ConvergenceError
        If ``check`` and the iteration did not converge within ``maxiter``
        (default: the number of blocks less one, always enough with exact linear
        solves; one more for ``stop="change"``, which needs an iterate that no longer
        changes; :data:`INEXACT_STEPS` more for an iterative ``method``, whose solves'
        error the forcing tightens; ``2 tau + 10`` quasi-Newton or damped steps, which
        are not exact after ``tau``).
    """
    check_options(rtol, 0.0, maxiter)
    if stop not in STOPS:
        raise ValueError(f"stop must be one of {STOPS}, got {stop!r}")
    damping = _damping(net, linearization, options)
    rtol = default_rtol(net.dtype) if rtol is None else rtol
    polish = polish and damping is None and linearization == "newton" and stop == "residual"
    polished = None  # (residual, trace, iterate) where the test passed, if polishing
    linear_rtol = min(rtol, default_rtol(net.dtype)) if linear_rtol is None else linear_rtol
    check_keywords(forward, method, options)
    x = agreed(method, options, lambda: net.check_input(x))
    trace = _start(net, x, around)
    residual = _quiet(_residual(net, rtol), backend.namespace(x))  # overflow: the status's
    deviation = getattr(net, "input_deviation", None) or (  # the input block's error
        lambda states, x: _relative(states[0] if isinstance(states, (list, tuple))
                                    else states[0, ...], x))  # a list, or a stack
    reusing = getattr(net, "reusing_steps", contextlib.nullcontext)  # F once per iterate
    with bar(progress, maxiter, f"{linearization} forward") as shown, reusing():
        residuals, solutions, changes, steps = [residual(trace)], [], [float("inf")], []
        restarts: list = []
        sequential: dict = {}  # whether net.forward(x) is finite, once asked
        best = (residuals[0], 0, trace)
        horizon = None  # the default maxiter's chain of dependencies, once known
        measure = residuals if stop == "residual" else changes
        while not measure[-1] <= rtol or (polish and polished is None and residuals[-1]
                                          > POLISHED * backend.eps(net.dtype)):
            previous = trace
            if measure[-1] <= rtol:
                polished = (residuals[-1], trace, len(residuals))
            if damping is not None:  # Levenberg-Marquardt on a recurrence (ELK)
                if maxiter is None:
                    maxiter = shown.total = 2 * x.shape[0] + 10
                if len(steps) >= maxiter:
                    break
                trace, step = damped_newton(net, x, trace, linearization, damping)
                damping = step["damping"]
                steps.append(step)
            else:
                system = agreed(method, options, functools.partial(
                    forward_system, net, x, around=trace, linearization=linearization))
                if maxiter is None:  # the longest chain of dependencies is shorter than this
                    exact = linearization == "newton" or not hasattr(net, "merit")
                    steps = system.nblocks - getattr(net, "input_blocks", 1)
                    horizon = max(steps, 1) + (stop == "change") if exact else None
                    maxiter = shown.total = (horizon + INEXACT_STEPS * _inexact(method)
                                             if exact else 2 * system.nblocks + 10)
                if len(solutions) >= maxiter or (polished is not None and
                                                 len(solutions) >= (horizon or maxiter)):
                    break  # the extra steps reach rtol: polishing ends at the horizon
                with unchecked():  # every iterate is judged by its nonlinear residual below
                    solution = solve(system, method, rtol=linear_rtol, **options)
                if check and not solution.usable:
                    raise ConvergenceError(solution)
                solutions.append(solution)
                states = net.unstack(system, solution.x)
                trace = net.trace_from_states(x, states)
            value = worst([residual(trace), 0.0 if damping is not None
                           else deviation(states, x)])
            if not math.isfinite(value) and damping is None:  # overshot, or overflowing?
                again = _restarted(net, x, trace, sequential)
                if again is not None:
                    restarts.append(len(solutions))
                    trace, value = again, worst([residual(again), deviation(states, x)])
            residuals.append(value)
            linear_rtol = _forcing(linear_rtol, residuals, rtol, solutions, net.dtype)
            changes.append(_change(previous, trace))
            if residuals[-1] < best[0]:
                best = (residuals[-1], len(residuals) - 1, trace)
            shown.update()
            shown.set_postfix_str(f"residual {residuals[-1]:.1e}")
            if not math.isfinite(residuals[-1]) and restarts[-1:] != [len(solutions)]:
                break  # overflow: no later iterate recovers (a restarted one is finite)
    final = measure[-1]
    if polished is not None:
        kept = len(residuals) > polished[2] and residuals[-1] <= polished[0]
        if not kept:  # no step (maxiter) or one lost to rounding: the iterate that passed
            final, trace = polished[0], polished[1]
    iterations = len(steps) if damping is not None else len(solutions)
    finite = math.isfinite(final)
    info = {"iterations": iterations, "residuals": residuals, "changes": changes[1:],
            "solutions": solutions, "converged": finite and final <= rtol,
            "restarts": restarts, "linear_rtol": linear_rtol}
    if polished is not None:
        info["polished"] = kept
    if damping is not None:
        info["damping"] = [s["damping"] for s in steps]
        info["accepted"] = [s["accepted"] for s in steps]
    if not info["converged"]:  # the best iterate, said so
        failure = _failed(solutions[-1] if solutions else None, iterations, stop, final,
                          rtol, None if finite else (first_nonfinite(net, trace),
                                                     _sequential_finite(net, x, sequential)))
        last = _last_solve(system, solutions[-1], linear_rtol, options) if solutions else ""
        info["best_iteration"], trace = best[1], best[2]
        info["message"] = failure.message + last + (
            f"; returned the best iterate (iteration {best[1]}, nonlinear residual "
            f"{best[0]:.2e})")
        if check:
            raise ConvergenceError(replace(failure, message=info["message"]))
    newton = damping is None and linearization == "newton" and solutions  # full Jacobians
    _diagnose(net, trace, info, system.coupling_stack if newton else None)
    return Trace(x=trace.x, y=trace.y, z=trace.z, info=info, stacked=trace.stacked,
                 outputs=trace.outputs)


def _last_solve(system: Any, solution: Solution, rtol: float, options: dict) -> str:
    """What the last linear solve's true residual says, where it ran unchecked and missed.

    A direct method's solves run under :func:`~propop.solvers.convergence.unchecked`
    (each iterate is judged by its nonlinear residual); when the iteration fails,
    the last one is judged as any solve is, for the message: ``""`` if it meets
    the tolerance (or was judged already).
    """
    if solution.status is not Status.UNCHECKED:
        return ""
    judged = finish(system, solution.x, direct=True, levels=solution.levels,
                    tol=Tolerance.of(system, rtol, options.get("atol", 0.0)))
    return "" if judged.converged else f"; the last linear solve: {judged.message}"


def _damping(net: Any, linearization: str, options: dict) -> Any:
    """The starting ``lambda`` of a damped linearization (``None`` for the others)."""
    if linearization not in DAMPED:
        if "damping" in options:
            raise ValueError(f"damping is an option of linearization='damped' or "
                             f"'quasi-damped', not of {linearization!r}")
        return None
    if not hasattr(net, "merit"):
        raise ValueError(f"linearization={linearization!r} (Levenberg-Marquardt, ELK) takes a "
                         "recurrence (pp.Recurrence, pp.GRU, pp.LSTM); use 'newton' here")
    damping = float(options.pop("damping", 1.0))
    if not damping >= 0:
        raise ValueError(f"damping must be >= 0, got {damping}")
    return damping


def _diagnose(net: Any, trace: Trace, info: dict, jacobians: Any) -> None:
    """What the network says about its trajectory (a recurrence: its Lyapunov exponent).

    ``jacobians``: the last Newton system's couplings, passed on rather than recomputed.
    """
    diagnose = getattr(net, "forward_diagnostics", None)
    if diagnose is None:
        return
    info.update(diagnose(trace, jacobians))
    if info.get("lyapunov", -1.0) > 0:
        warnings.warn(f"the largest Lyapunov exponent along the trajectory is "
                      f"{info['lyapunov']:+.3f} > 0: the recurrence is chaotic here, and "
                      "Newton-type parallel evaluation may need up to tau iterations "
                      "(Gonzalez et al., 2025)", RuntimeWarning, stacklevel=3)


def _relative(a: Any, b: Any) -> float:
    """``||a - b|| / ||b||``: how far a solution's input block is from the input."""
    return backend.norm(a - b) / max(backend.norm(b), 1e-300)


def _change(before: Trace, after: Trace) -> float:
    """``max_k ||z_k - z_k'|| / ||z_k'||`` between two iterates."""
    return worst(0.0 if a is b else backend.norm(a - b) / max(backend.norm(a), 1e-300)
                 for a, b in zip(after.z, before.z))  # the input is one array in both


def _quiet(function: Callable[[Trace], float], xp: Any) -> Callable[[Trace], float]:
    """``function`` with the array library's floating-point warnings off while it runs.

    An iterate that overflows is the iteration's to report (its status and message),
    not NumPy's ``RuntimeWarning`` from inside the residual.
    """
    def quiet(trace: Trace) -> float:
        with backend.quiet(xp):
            return function(trace)

    return quiet


def _residual(net: Any, rtol: float) -> Any:
    """The iterates' nonlinear residual, a function of the trace.

    The network's own (told ``rtol`` where it takes it: a recurrence's floor), else
    every layer's (:func:`_nonlinear_residual`).
    """
    own = getattr(net, "nonlinear_residual", None)
    if own is None:
        return lambda t: _nonlinear_residual(net, t)
    return functools.partial(own, rtol=rtol) if "rtol" in inspect.signature(own).parameters \
        else own


def _nonlinear_residual(net: Any, trace: Trace) -> float:
    """``max_k ||z_{k+1} - f_k(y_k)|| / max(||f_k(y_k)||, tiny)``: zero at the true pass."""
    gaps = []
    for act, y, z in zip(net.activations, trace.y, trace.z[1:]):
        fy = act(y)
        gaps.append(backend.norm(z - fy) / max(backend.norm(fy), 1e-300))
    return worst(gaps)


def _start(net: Any, x: Any, around: Trace | None) -> Trace:
    """The first iterate: zeros, or the states of ``around`` with this input ``x``.

    ``around`` may come from another input (a previous batch, a warm start), but
    its states must have this input's shapes and be finite; its pre-activations
    are recomputed from ``x``, so the first residual judges it for this input.
    """
    if around is None:
        return net.trace_from_states(x, None)
    if not isinstance(around, Trace):
        raise TypeError(f"around must be a propop Trace, got {type(around).__name__}")
    require_backend_of(x, around.z[1:], "around")
    want = [tuple(shape) for shape in net.state_shapes(x)[0]]
    have = [tuple(getattr(z, "shape", ())) for z in around.z]
    if have != want:
        bad = next(k for k in range(max(len(have), len(want)))
                   if k >= len(have) or k >= len(want) or have[k] != want[k])
        raise ValueError(f"around does not fit this input: its z[{bad}] has shape "
                         f"{have[bad] if bad < len(have) else 'none'}, this x needs "
                         f"{want[bad] if bad < len(want) else 'none'} ({len(want)} states; "
                         "the batch size and sequence length must be x's)")
    for k, z in enumerate(around.z[1:], start=1):
        require_finite(z, f"around.z[{k}]")
    states = net.states_of(around) if hasattr(net, "states_of") else around.z
    return net.trace_from_states(x, states)


def _inexact(method: Any) -> bool:
    """Whether ``method`` is a registered iterative one: its solves stop at a tolerance."""
    try:
        return isinstance(method, str) and not info(method).exact
    except (KeyError, ValueError):  # unknown or refused: the solve names it
        return False


def _forcing(linear_rtol: float, residuals: list, rtol: float, solutions: list,
             dtype: Any) -> float:
    """The next linear solves' tolerance: a tenth of it where an iterative one set the floor.

    Inexact Newton: an iterative method stops its solve once every block meets
    ``linear_rtol``, and that error, amplified, is the nonlinear residual's floor
    (a float32 FNN by Jacobi stalled at 1.6x ``rtol`` however many iterations). Where
    the residual above ``rtol`` did not halve and the last solve was iterative (a
    direct one runs ``UNCHECKED``, exact to rounding), the tolerance is divided by ten,
    to ``FORCING_FLOOR`` eps at least.
    """
    stalled = len(residuals) > 2 and rtol < residuals[-1] and \
        residuals[-1] > 0.5 * residuals[-2]
    if not stalled or not solutions or solutions[-1].status is Status.UNCHECKED:
        return linear_rtol
    return max(linear_rtol / 10, FORCING_FLOOR * backend.eps(dtype))


def _sequential_finite(net: Any, x: Any, known: dict) -> bool:
    """Whether the sequential pass of ``x`` is finite (kept in ``known``: one pass a call).

    What tells an iteration that overshot from a network that overflows itself.
    """
    if "finite" not in known:
        with backend.quiet(backend.namespace(x)):
            try:
                trace = net.forward(x)
                known["finite"] = all(backend.all_finite(z) for z in trace.z)
            except (ValueError, ArithmeticError):  # a pass that checks its states itself
                known["finite"] = False
    return known["finite"]


def _restarted(net: Any, x: Any, trace: Trace, known: dict) -> Trace | None:
    """The iterate with its overshooting states started again (``net.restarted``), or ``None``.

    Only where the network offers it and its sequential pass is finite: an iterate of a
    network that overflows itself stops the iteration, as one that zeros cannot mend.
    """
    restart = getattr(net, "restarted", None)
    if restart is None or not _sequential_finite(net, x, known):
        return None
    return restart(trace)


def _failed(solution: Solution | None, iterations: int, stop: str, value: float, rtol: float,
            nonfinite: tuple | None = None) -> Solution:
    """The failed iteration's status and message; ``nonfinite``: ``(where, sequential finite)``."""
    base = solution or Solution(x=None, status=Status.MAX_ITER)
    if nonfinite is not None:
        where, sequential = nonfinite
        why = ("net.forward(x) is finite: the iteration overshot (an early iterate "
               "linearises a layer far from where its inputs settle, the zero start's); start "
               "nearer (around=a trace of a similar input), use the sequential pass, or on a "
               "recurrence a damped linearization" if sequential else
               "net.forward(x) overflows as well: check the weights' scale and the input")
        return replace(base, status=Status.NONFINITE, message=(
            f"forward iteration {iterations} gave non-finite values, first in {where}: "
            f"{why}"))
    measure = "nonlinear residual" if stop == "residual" else "relative change of the states"
    return replace(base, status=Status.MAX_ITER, message=(
        f"forward iteration stopped after {iterations} iterations with {measure} "
        f"{value:.2e} > rtol={rtol:g}; raise maxiter (in exact arithmetic the number of "
        "layers is enough, one more for stop='change'), raise rtol to what the dtype and "
        "the linear solves reach, or use linearization='newton'"))
