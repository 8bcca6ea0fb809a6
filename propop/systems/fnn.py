"""Systems of feedforward networks: eqs. forw_prop_sys and back_prop_sys, row-scaled."""

from __future__ import annotations

import functools
from typing import Any

from .. import backend, memory
from ..networks.fnn import FNN, column
from ..networks.trace import Trace
from .builders import backward_system, forward_system
from .triangular import TriangularSystem

__all__: list[str] = []


def _name(letter: str, k: int) -> str:
    """Block ``k``'s name in messages: the input, or layer ``k - 1``'s output."""
    return f"{letter}[0] (input)" if k == 0 else f"{letter}[{k}] (layer {k - 1}, W[{k - 1}])"


@backward_system.register
def _fnn_backward(net: FNN, trace: Trace, eps: Any, *, form: str = "scaled") -> TriangularSystem:
    """Unit-diagonal rows ``v_k - f'_k * (W[k]^T v_{k+1}) = 0``, ``v_l = f'_l * eps``."""
    xp = net.backend.xp
    eps = net.check_eps(trace, eps)
    _require_memory(net, eps)
    slopes = net.slopes(trace)
    rhs = xp.zeros((sum(net.sizes),) + tuple(eps.shape[1:]), dtype=net.dtype,
                   device=backend.device(eps))
    last = slopes[-1] if isinstance(slopes, list) else slopes[-1, ...]  # list or stack
    rhs[-net.sizes[-1]:, ...] = last * eps
    coupling, row_scale, stacks = _coefficients(net, net.WT if not net.equal_widths else (),
                                                slopes, "WT")
    return TriangularSystem(
        coupling, row_scale, rhs, lower=False, sizes=net.sizes, form=form,
        names=functools.partial(_name, "v"),
        paper_hint=", where f'(y) = 0 so that E = 1/f'(y) does not exist",
        rhs_support=[net.depth], check_zeros=False, **stacks,  # made from zeros here
    )


def _require_memory(net: FNN, like: Any) -> None:
    """A system's right-hand side, scalings and (equal widths) stacked couplings, estimated."""
    columns = like.shape[1] if like.ndim == 2 else 1
    stacks = net.depth * net.sizes[0] ** 2 if net.equal_widths else 0
    memory.require_arrays(2 * sum(net.sizes) * columns + stacks, backend.itemsize(net.dtype),
                          f"the system of {net.depth} layers and {columns} samples",
                          "use a smaller batch or fewer layers")


def _coefficients(net: FNN, couplings: Any, scales: Any, key: str) -> tuple[Any, Any, dict]:
    """``coupling, row_scale`` of a chain, or for equal widths the stacked arrays as keywords."""
    if not net.equal_widths:
        return list(couplings), [None] + list(scales), {}
    scales = scales if not isinstance(scales, (list, tuple)) else net.backend.xp.stack(scales)
    return None, None, {"coupling_stack": net.weight_stack(transposed=key == "WT"),
                        "scale_stack": scales}


def _points(net: FNN, x: Any, around: Any) -> list[Any]:
    """The linearisation points ``y[0..l-1]``, checked against the input's batch shape."""
    xp = net.backend.xp
    batch = x.shape[1:]
    if around is None:
        return [xp.zeros((n,) + tuple(batch), dtype=net.dtype, device=backend.device(x))
                for n in net.sizes[1:]]
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
    _require_memory(net, x)
    scales, rhs = [], [x]
    for act, bk, y in zip(net.activations, net.b, _points(net, x, around)):
        a, beta = act.linearize(y, linearization)
        scales.append(a)
        rhs.append(a * column(bk, x) + beta)
    hint = (", where f'(y) = 0" if linearization == "newton" else
            ", where f(y)/y = 0 (f(y) = 0 at y != 0, or y = 0 with f(0) != 0)")
    coupling, row_scale, stacks = _coefficients(net, net.W, scales, "W")
    return TriangularSystem(
        coupling, row_scale, xp.concat(rhs), lower=True, sizes=net.sizes, form=form,
        names=functools.partial(_name, "z"), paper_hint=hint + " so that D does not exist",
        **stacks,
    )
