"""Systems of feedforward networks: eqs. forw_prop_sys and back_prop_sys, row-scaled."""

from __future__ import annotations

from typing import Any

from ..networks.fnn import FNN, column
from ..networks.trace import Trace
from .builders import backward_system, forward_system
from .triangular import TriangularSystem

__all__: list[str] = []


def _names(letter: str, depth: int) -> list[str]:
    return [f"{letter}[0] (input)"] + [
        f"{letter}[{k}] (layer {k - 1}, W[{k - 1}])" for k in range(1, depth + 1)]


@backward_system.register
def _fnn_backward(net: FNN, trace: Trace, eps: Any, *, form: str = "scaled") -> TriangularSystem:
    """Unit-diagonal rows ``v_k - f'_k * (W[k]^T v_{k+1}) = 0``, ``v_l = f'_l * eps``."""
    xp = net.backend.xp
    eps = net.check_eps(trace, eps)
    slopes = net.slopes(trace)
    rhs = xp.zeros((sum(net.sizes),) + eps.shape[1:], dtype=net.dtype)
    xp.multiply(slopes[-1], eps, out=rhs[-net.sizes[-1]:])
    return TriangularSystem(
        list(net.WT), [None] + slopes, rhs,
        lower=False, sizes=net.sizes, form=form, names=_names("v", net.depth),
        paper_hint=", where f'(y) = 0 so that E = 1/f'(y) does not exist",
        rhs_support=[net.depth], coupling_stack=net.stacked.get("WT"),
    )


def _points(net: FNN, x: Any, around: Any) -> list[Any]:
    """The linearisation points ``y[0..l-1]``, checked against the input's batch shape."""
    xp = net.backend.xp
    batch = x.shape[1:]
    if around is None:
        return [xp.zeros((n,) + batch, dtype=net.dtype) for n in net.sizes[1:]]
    ys = list(around.y if isinstance(around, Trace) else around)
    if len(ys) != net.depth:
        raise ValueError(f"around has {len(ys)} layers, expected {net.depth}")
    for k, (y, n) in enumerate(zip(ys, net.sizes[1:])):
        if tuple(y.shape) != (n,) + batch:
            raise ValueError(f"layer {k}: around.y[{k}] has shape {tuple(y.shape)}, "
                             f"expected {(n,) + batch} to match the layer and x")
    return [xp.asarray(y, dtype=net.dtype) for y in ys]


@forward_system.register
def _fnn_forward(net: FNN, x: Any, around: Any = None, *, linearization: str = "secant",
                 form: str = "scaled") -> TriangularSystem:
    """Unit-diagonal rows ``z_0 = x``, ``z_k - a_k * (W[k-1] z_{k-1}) = a_k * b + beta_k``."""
    xp = net.backend.xp
    x = net.check_input(x)
    scales, rhs = [None], [x]
    for act, bk, y in zip(net.activations, net.b, _points(net, x, around)):
        a, beta = act.linearize(y, linearization)
        scales.append(a)
        rhs.append(a * column(bk, x) + beta)
    hint = (", where f'(y) = 0" if linearization == "newton" else
            ", where f(y)/y = 0 (f(y) = 0 at y != 0, or y = 0 with f(0) != 0)")
    return TriangularSystem(
        list(net.W), scales, xp.concatenate(rhs), lower=True, sizes=net.sizes,
        form=form, names=_names("z", net.depth), paper_hint=hint + " so that D does not exist",
        coupling_stack=net.stacked.get("W"),
    )
