"""Value objects of a propagation: the forward :class:`Trace` and the :class:`Gradients`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .. import backend

__all__ = ["Trace", "Gradients", "require_trace", "first_nonfinite"]


@dataclass(frozen=True)
class Trace:
    """Everything a forward pass computed (paper section 1).

    Attributes
    ----------
    x : array, shape (n0,) or (n0, r)
        The input ``z^(0)``.
    y : tuple of arrays
        ``y[k] = W[k] z[k] + b[k]``, the pre-activations of layers ``k = 0..l-1``.
    z : tuple of arrays
        ``z[0] = x`` and ``z[k+1] = f_k(y[k])``, ``k = 0..l-1``.
    info : dict
        How the trace was obtained (for :func:`propop.forward`: iterations,
        residuals and the solutions of the linearised systems).
    stacked : dict
        For a network of equal widths: ``{"y": (l, n[, r]), "z": (l + 1, n[, r])}``,
        the arrays whose slices ``y`` and ``z`` are (no copies), so that all
        layers can be processed in one call; empty otherwise.
    outputs : tuple of int
        Which states are the network's outputs (a graph's output nodes); empty
        means the last, ``z[-1]``.
    """

    x: Any
    y: tuple
    z: tuple
    info: dict = field(default_factory=dict, compare=False)
    stacked: dict = field(default_factory=dict, compare=False, repr=False)
    outputs: tuple = ()

    @property
    def output(self) -> Any:
        """The network's output: ``z^(l)``, a graph's output node, or a tuple of several."""
        if not self.outputs:
            return self.z[-1]
        values = tuple(self.z[k] for k in self.outputs)
        return values[0] if len(values) == 1 else values


@dataclass(frozen=True)
class Gradients:
    """Gradients of the loss, summed over the samples of a batch.

    Eqs. gradient_w_hidden_layer and gradient_b_hidden_layer.

    Attributes
    ----------
    W : tuple
        ``W[k] = dE/dW[k]``; for a sparse ``W[k]``, a sparse array on its pattern.
    b : tuple
        ``b[k] = dE/db[k]``.
    x : array
        ``dE/dx``, the paper's ``v^(0)``, shaped like the input.
    solution : Solution or None
        The backward solve these gradients came from, if any.
    """

    W: tuple
    b: tuple
    x: Any
    solution: Any = field(default=None, compare=False)


def require_trace(trace: Any, x: Any, shapes: tuple[list, list]) -> None:
    """Raise unless ``trace`` is a forward pass of input ``x`` with states of ``shapes``.

    ``shapes`` is ``(z_shapes, y_shapes)`` (``None`` where ``y`` is ``None``), as a
    network's ``state_shapes(x)`` gives them; ``x`` is the checked input.
    """
    if not isinstance(trace, Trace):
        raise TypeError(f"trace must be a propop Trace, got {type(trace).__name__}")
    require_backend_of(x, [trace.x], "trace")
    xp = backend.namespace(x)
    if tuple(getattr(trace.x, "shape", ())) != tuple(x.shape) or not bool(
            xp.all(trace.x == x)):  # array_equal is NumPy's, not the standard's
        raise ValueError("trace was computed from another input: trace.x differs from x "
                         f"(shapes {tuple(getattr(trace.x, 'shape', ()))} and {tuple(x.shape)});"
                         " pass the trace of this x, or none")
    for letter, states, want in (("z", trace.z, shapes[0]), ("y", trace.y, shapes[1])):
        have = [None if s is None else tuple(s.shape) for s in states]
        if have != [None if w is None else tuple(w) for w in want]:
            bad = next(k for k in range(max(len(have), len(want)))
                       if k >= len(have) or k >= len(want) or have[k] != want[k])
            raise ValueError(f"trace does not belong to this network: trace.{letter} has "
                             f"{len(have)} entries, {letter}[{bad}] of shape "
                             f"{have[bad] if bad < len(have) else 'none'}; expected "
                             f"{len(want)} entries, {letter}[{bad}] of shape "
                             f"{want[bad] if bad < len(want) else 'none'}")


def require_backend_of(x: Any, arrays: Sequence[Any], what: str) -> None:
    """Raise unless every array of ``arrays`` (``None`` skipped) is on ``x``'s backend.

    ``what`` names the trace they come from (``trace``, ``around``) in the message.
    """
    want = backend.of(x).name
    for a in arrays:
        if a is not None and backend.of(a).name != want:
            raise ValueError(f"{what} holds {backend.of(a).name} arrays, but x is on {want}: "
                             f"pass a trace computed there (network.to({want!r})), or none")


def first_nonfinite(net: Any, trace: Trace) -> str:
    """Where ``trace`` first holds NaN or Inf, named for a message.

    A state ``z``, a pre-activation ``y``, or an evaluation that overflows although
    what it reads is finite: a layered network's activation ``f(y)``, a graph's node
    or a recurrence's step (their ``first_overflow``).
    """
    xp = backend.namespace(trace.x)
    finite = lambda a: a is None or bool(xp.all(xp.isfinite(xp.asarray(a))))  # noqa: E731
    names = getattr(net, "order", None)
    for letter, values, shift in (("z", trace.z, 1), ("y", trace.y, 0)):
        for k, a in enumerate(values):
            if not finite(a):
                return f"node {names[k]!r}" if names else (
                    f"{letter}[{k}] (layer {k - shift}'s {'output' if shift else 'input'})")
    for k, (act, y) in enumerate(zip(getattr(net, "activations", ()), trace.y)):
        with backend.quiet(xp):
            if not finite(act(y)):
                return f"f(y[{k}]) (layer {k}'s activation overflows)"
    overflow = getattr(net, "first_overflow", None)  # a graph's node, a recurrence's step
    named = overflow(trace) if overflow is not None else None
    return named or "the nonlinear residual"
