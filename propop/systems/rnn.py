"""Systems of RNNs: the two-level eqs. forw_prop_sys_rnn and back_prop_sys_rnn, row-scaled.

Blocks are time-major, as in the paper: block ``s (l + 1) + k`` holds layer ``k``'s
vector at step ``s`` (``k = 0`` the input). Within a step the layers couple through
``W`` (the diagonal blocks ``L^(s)``, ``R^(s)``, themselves block bi-diagonal); across
steps each layer couples to itself through ``U`` (the blocks ``U-bar``).
"""

from __future__ import annotations

from typing import Any

from .. import backend
from ..networks.rnn import RNN
from ..networks.trace import Trace
from .builders import backward_system, forward_system
from .time_structure import Template, TimeStructure
from .triangular import TriangularSystem

__all__: list[str] = []


def _names(letter: str, depth: int) -> Any:
    """Block ``i``'s name, made only when a message needs it (there are tau (l + 1))."""
    def name(i: int) -> str:
        s, k = divmod(i, depth + 1)
        return f"{letter}[{k}] at step {s}" + (" (input)" if k == 0 else f" (layer {k - 1})")

    return name


def _stack(xp: Any, rnn: RNN, tau: int, batch: tuple, blocks: dict) -> Any:
    """The time-major right-hand side with ``blocks[k]`` ``(tau, h, [r])`` at layer ``k``."""
    per_step = sum(rnn.sizes)
    rhs = xp.zeros((tau, per_step) + tuple(batch), dtype=rnn.dtype,
                   device=backend.device(rnn.W[0]))
    offsets = [sum(rnn.sizes[:k]) for k in range(rnn.depth + 1)]
    for k, values in blocks.items():
        rhs[:, offsets[k]: offsets[k] + rnn.sizes[k], ...] = values
    return xp.reshape(rhs, (tau * per_step,) + tuple(batch))


def _structure(rnn: RNN, tau: int, lower: bool) -> TimeStructure:
    """``W`` within each step and ``U`` across steps, as repeated templates."""
    templates, WT, UT = [], rnn.WT if not lower else (), rnn.UT if not lower else ()
    for k in range(1, rnn.depth + 1):
        if lower:
            templates += [Template(k, k - 1, 0, rnn.W[k - 1]), Template(k, k, -1, rnn.U[k - 1])]
        else:
            templates += [Template(k - 1, k, 0, WT[k - 1]), Template(k, k, 1, UT[k - 1])]
    return TimeStructure(tau, rnn.sizes, tuple(templates))


@backward_system.register
def _rnn_backward(rnn: RNN, trace: Trace, eps: Any, *, form: str = "scaled"
                  ) -> TriangularSystem:
    """Rows ``v[k,s] - f'[k,s] * (W^T v[k+1,s] + U^T v[k,s+1]) = 0``, top rows ``f' * eps``."""
    xp = rnn.backend.xp
    eps = rnn.check_eps(trace, eps)
    tau, batch = trace.output.shape[0], trace.output.shape[2:]
    slopes = rnn.slopes(trace)
    rhs = _stack(xp, rnn, tau, batch, {rnn.depth: slopes[-1] * eps})
    return TriangularSystem(
        None, None, rhs, lower=False, sizes=rnn.sizes * tau, form=form,
        names=_names("v", rnn.depth), structure=_structure(rnn, tau, lower=False),
        layer_scales=[None] + slopes,
        paper_hint=", where f'(y) = 0 so that E = 1/f'(y) does not exist")


@forward_system.register
def _rnn_forward(rnn: RNN, xs: Any, around: Any = None, *, linearization: str = "secant",
                 form: str = "scaled") -> TriangularSystem:
    """Rows ``z[k,s] - a * (W z[k-1,s] + U z[k,s-1]) = a * b + beta``, inputs ``z[0,s] = x_s``."""
    xp = rnn.backend.xp
    xs = rnn.check_input(xs)
    tau, batch = xs.shape[0], xs.shape[2:]
    points = ([xp.zeros((tau, h) + tuple(batch), dtype=rnn.dtype, device=backend.device(xs))
               for h in rnn.sizes[1:]]
              if around is None else list(around.y if isinstance(around, Trace) else around))
    blocks, scales_by_layer = {0: xs}, []
    for k, (act, bk, y) in enumerate(zip(rnn.activations, rnn.b, points)):
        if tuple(y.shape) != (tau, rnn.sizes[k + 1]) + tuple(batch):
            raise ValueError(f"layer {k}: around.y[{k}] has shape {tuple(y.shape)}, expected "
                             f"{(tau, rnn.sizes[k + 1]) + tuple(batch)}")
        a, beta = act.linearize(y, linearization)
        scales_by_layer.append(a)
        blocks[k + 1] = a * (bk[:, None] if batch else bk) + beta
    return TriangularSystem(
        None, None, _stack(xp, rnn, tau, batch, blocks), lower=True,
        sizes=rnn.sizes * tau, form=form, names=_names("z", rnn.depth),
        structure=_structure(rnn, tau, lower=True), layer_scales=[None] + scales_by_layer)
