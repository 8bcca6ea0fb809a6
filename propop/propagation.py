"""Backpropagation through a chosen solver: :func:`backprop` (eq. back_prop_sys)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from . import backend
from .networks.trace import Trace, first_nonfinite, require_trace
from .solvers.plan import agreed, check_keywords, solve
from .solvers.solution import ConvergenceError, Status
from .systems import backward_system

__all__ = ["backprop"]


def backprop(net: Any, x: Any, target: Any, loss: str = "mse",
             method: str = "substitution", *, rtol: float | None = None,
             check: bool | None = None, trace: Trace | None = None, reduction: str = "sum",
             **options: Any) -> Any:
    """Gradients of the loss by solving the backward system (eq. back_prop_sys).

    The forward pass is the sequential reference unless ``trace`` is given (for
    instance from :func:`forward`); the backward pass is
    ``solve(backward_system(...), method, ...)``.

    Parameters
    ----------
    net : network
    x : array, shape (n0,) or (n0, r)
    target : array
        See :func:`propop.loss_gradient`.
    loss : {"mse", "cross_entropy"}
    method : str
        Any registered solver (:func:`propop.solvers.available`).
    rtol : float, optional
        Every block of the gradients to this relative accuracy (the accuracy
        contract of :mod:`propop.solvers.convergence`); default by dtype,
        ``1e-10`` in float64: exact gradients unless the caller asks for less.
    check : bool, optional
        Raise :class:`~propop.ConvergenceError` if the solve fails (``True``), or
        return the solution as it is with ``g.solution`` saying why (``False``).
        ``None`` (default): raise, except when the solve ran out of a ``maxiter``
        you gave, which is a truncation asked for (as in :func:`propop.train`).
    trace : Trace, optional
        The forward pass of ``x`` to linearise around (default ``net.forward(x)``),
        for instance from :func:`forward`; checked to be of this ``x`` and network.
    reduction : {"sum", "mean"}
        ``"sum"``: gradients summed over samples (the paper's); ``"mean"``:
        PyTorch's default losses (``nn.MSELoss()``, ``nn.CrossEntropyLoss()``),
        see :mod:`propop.losses`.
    **options
        Passed to the solver.

    Returns
    -------
    Gradients or RNNGradients
        ``g.W``, ``g.b`` (and ``g.U`` for an RNN), ``g.x``, summed over samples
        (and time steps) or their mean, and ``g.solution``.

    Examples
    --------
    >>> import numpy as np, propop as pp
    >>> net = pp.FNN.random([3, 5, 2], activation="tanh", seed=0)
    >>> g = pp.backprop(net, np.ones((3, 4)), np.zeros((2, 4)), method="jacobi")
    >>> g.W[0].shape, g.solution.converged
    ((5, 3), True)
    """
    def prepare(trace: Trace | None = trace) -> tuple[Trace, Any]:
        if trace is None:
            trace = net.forward(x)
        else:
            checked = net.check_input(x)
            require_trace(trace, checked, net.state_shapes(checked))
        outputs = trace.output if isinstance(trace.output, tuple) else (trace.output,)
        xp = backend.namespace(outputs[0])
        if not all(backend.all_finite(out, xp) for out in outputs):  # a sum, no flags' array
            raise ValueError(f"the forward pass gave non-finite values, first in "
                             f"{first_nonfinite(net, trace)}: no gradient exists there; "
                             "check the weights' scale and the input")
        return trace, backward_system(net, trace, net.loss_gradient(trace, target, loss,
                                                                    reduction))

    check_keywords(backprop, method, options)
    trace, system = agreed(method, options, prepare)
    if rtol is not None:
        options["rtol"] = rtol
    solution = solve(system, method, **options)
    asked = check is None and "maxiter" in options and solution.status is Status.MAX_ITER
    if not solution.converged and check is not False and not asked:
        more = _TAKE_IT if solution.status is Status.MAX_ITER else ""  # truncated, not wrong
        raise ConvergenceError(replace(solution, message=solution.message + more))
    return replace(net.gradients(trace, net.unstack(system, solution.x)), solution=solution)


_TAKE_IT = ("; to take these gradients as they are, pass check=False (a maxiter you give to "
            "backprop or train is a truncation asked for, and does not raise)")
