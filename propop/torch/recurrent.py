"""Drop-in ``torch.nn.GRU``, ``LSTM`` and ``RNN`` whose passes are propop's solves.

Each module *is* its ``torch.nn`` class (a subclass): the same constructor
arguments, parameter names, ``state_dict``, initialisation and call signature
``output, h_n = module(x, h0)`` (``(h_n, c_n)`` for an LSTM; ``h0`` any state, its
gradient returned when it requires one), ``batch_first`` included. What changes is
how the passes run:

- the **forward** is ``mode``: ``"sequential"`` (step by step), or a member of
  the Newton family of parallel forward passes (``"newton"``, DEER;
  ``"quasi"``, ``"block-diagonal"``, ``"damped"``, ``"quasi-damped"``), each
  linear step solved by ``method`` (:func:`propop.forward`);
- the **backward** is propop's solve of the backward system (backpropagation
  through time as a block bi-diagonal chain) by ``method``, inside a
  ``torch.autograd.Function``: ``loss.backward()`` fills the module's
  parameters' ``.grad`` (and the input's), so ``torch.optim``, gradient
  clipping and hooks work as with the ``torch.nn`` module.

The cell is propop's (:class:`propop.GRU`, :class:`propop.LSTM`,
:class:`~propop.networks.gated.ElmanRNN`) on the module's own tensors and
device. A forward that does not converge raises :class:`propop.ConvergenceError`
(``on_failure="raise"``, the default), or warns and runs the sequential pass
(``on_failure="sequential"``): never a silently wrong state. The last call's
facts are in :attr:`last`.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch.autograd.function import once_differentiable

from ..networks import gated
from ..newton.loop import forward as newton_forward
from ..solvers.plan import solve
from ..solvers.registry import info
from ..solvers.solution import ConvergenceError
from ..systems.builders import backward_system

__all__ = ["GRU", "LSTM", "RNN", "MODES", "from_module"]

MODES = ("sequential", "newton", "quasi", "block-diagonal", "damped", "quasi-damped")
FAILURES = ("raise", "sequential")


class _Parallel:
    """What the three modules add to their ``torch.nn`` class: modes, method, the passes."""

    cell: type

    def __init__(self, *args: Any, mode: str = "newton", method: str = "auto",
                 on_failure: str = "raise", rtol: float | None = None,
                 maxiter: int | None = None, options: dict | None = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # the torch.nn module's own constructor
        self._configure(mode, method, on_failure, rtol, maxiter, options)

    def _configure(self, mode: str, method: str, on_failure: str, rtol: float | None,
                   maxiter: int | None, options: dict | None) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if on_failure not in FAILURES:
            raise ValueError(f"on_failure must be one of {FAILURES}, got {on_failure!r}")
        info(method)  # an unknown method is named now, not at the first call
        if self.bidirectional or getattr(self, "proj_size", 0):
            raise ValueError(f"propop.torch.{type(self).__name__}: bidirectional=True and "
                             "proj_size > 0 are not supported; use torch.nn's module")
        # forward_mode, not mode: torch.nn.RNNBase's own mode ("GRU", "RNN_TANH") drives its
        # kernels and cuDNN's weight layout (flatten_parameters, on .to("cuda"))
        self.forward_mode, self.method, self.on_failure = mode, method, on_failure
        self._rtol, self.maxiter, self.options = rtol, maxiter, dict(options or {})
        self.last: dict = {}

    @property
    def rtol(self) -> float:
        """The tolerance of the forward iteration and of the solves (``1e3 eps`` by default)."""
        if self._rtol is not None:
            return self._rtol
        return 1e3 * float(torch.finfo(next(self.parameters()).dtype).eps)

    def extra_repr(self) -> str:
        """``torch.nn``'s description and propop's choices."""
        return (super().extra_repr() + f", mode={self.forward_mode!r}, method={self.method!r}")

    def recurrence(self, parameters: dict) -> Any:
        """The propop cell of this module with ``parameters`` (tensors, on their device)."""
        dtype = "float64" if next(iter(parameters.values())).dtype == torch.float64 \
            else "float32"
        full = dict(parameters)
        for k in range(self.num_layers):  # bias=False: zero biases, as the module computes
            for side in ("ih", "hh"):
                like = parameters[f"weight_{side}_l{k}"]
                full.setdefault(f"bias_{side}_l{k}", torch.zeros(
                    like.shape[0], dtype=like.dtype, device=like.device))
        net = self.cell(self.input_size, self.hidden_size, self.num_layers, full, dtype=dtype,
                        **self.cell._options_of(self))
        return net.to("torch", like.device)

    def forward(self, input: Any, hx: Any = None) -> Any:  # noqa: A002 (torch.nn's name)
        """``output, h_n`` (``output, (h_n, c_n)``) as the ``torch.nn`` module returns them."""
        if self.dropout and self.training:
            raise ValueError(f"propop.torch.{type(self).__name__}: dropout between layers in "
                             "training mode is not supported (the cell is deterministic); set "
                             "dropout=0 or call .eval()")
        if isinstance(input, torch.nn.utils.rnn.PackedSequence):
            raise ValueError(f"propop.torch.{type(self).__name__}: a PackedSequence is not "
                             "supported (the passes run on sequences of one length); pass the "
                             "padded tensor, and read each sequence's outputs up to its length")
        if input.dim() not in (2, 3):
            raise ValueError(f"propop.torch.{type(self).__name__}: expected the input to be 2-D "
                             f"or 3-D, got {input.dim()}-D ({tuple(input.shape)})")
        batched = input.dim() == 3
        x = input if batched else input.unsqueeze(1 if not self.batch_first else 0)
        self.check_input(x, None)  # torch.nn's own checks: the dtype, the input size
        x = x.transpose(0, 1) if self.batch_first else x  # (tau, batch, features)
        if 0 in x.shape[:2]:  # no steps or no samples: torch.nn's own answer (nothing to solve)
            return super().forward(input, hx)
        initial = self._initial(hx, x)
        names = [name for name, _ in self.named_parameters()]
        states = _Passes.apply(self, names, x, initial,
                               *[p for _, p in self.named_parameters()])
        output, final = self._split(states)  # (tau, batch, H), per layer (batch, width)
        if self.batch_first:
            output = output.transpose(0, 1)
        if not batched:
            output = output.squeeze(1 if not self.batch_first else 0)
            final = [f.squeeze(0) for f in final]
        return output, self._final(final, batched)

    def _initial(self, hx: Any, x: Any) -> Any:
        """``h_{-1}`` as ``(batch, state)`` (every layer's ``[h; c]`` stacked), or ``None``.

        ``hx`` is ``torch.nn``'s ``h0`` (``(h0, c0)`` for an LSTM), ``(layers,
        batch, hidden)`` or unbatched ``(layers, hidden)``; ``None`` is zero.
        """
        if hx is None:
            return None
        parts = hx if isinstance(hx, (tuple, list)) else (hx,)
        if len(parts) != self.cell.carries:
            raise ValueError(f"propop.torch.{type(self).__name__} takes "
                             f"{'(h0, c0)' if self.cell.carries == 2 else 'h0'} as its "
                             f"initial state, got {len(parts)} tensor(s)")
        wanted = (self.num_layers, x.shape[1], self.hidden_size)
        parts = [h if h.dim() == 3 else h.unsqueeze(1) for h in parts]
        for h in parts:
            if tuple(h.shape) != wanted:
                raise ValueError(f"propop.torch.{type(self).__name__}: an initial state of "
                                 f"shape {tuple(h.shape)}, expected {wanted} (layers, batch, "
                                 "hidden)")
        layers = [torch.cat([h[k] for h in parts], dim=-1) for k in range(self.num_layers)]
        return torch.cat(layers, dim=-1)

    def _split(self, states: Any) -> tuple[Any, list]:
        """The top layer's ``h`` over time and every layer's last state, from all states."""
        width = self.cell.carries * self.hidden_size
        top = (self.num_layers - 1) * width
        output = states[:, :, top: top + self.hidden_size]
        return output, [states[-1, :, k * width: (k + 1) * width]
                        for k in range(self.num_layers)]

    def _final(self, final: list, batched: bool) -> Any:
        """``h_n`` stacked over layers (GRU, RNN)."""
        return torch.stack([f[..., : self.hidden_size] for f in final])


class _Passes(torch.autograd.Function):
    """All states of the recurrence by the module's forward mode; the backward by propop."""

    @staticmethod
    def forward(ctx: Any, module: Any, names: list, x: Any, initial: Any, *parameters: Any
                ) -> Any:
        net = module.recurrence({n: p.detach() for n, p in zip(names, parameters)})
        if initial is not None:  # (batch, state) -> propop's (state, batch)
            net = net.starting_from(initial.detach().T.contiguous())
        xs = x.detach().permute(0, 2, 1)  # (tau, features, batch): propop's sequences
        trace = _forward(module, net, xs)
        ctx.module, ctx.names, ctx.net, ctx.trace = module, names, net, trace
        return trace.z[1].permute(0, 2, 1)  # (tau, batch, state)

    @staticmethod
    @once_differentiable  # propop's solve is not differentiated again: said so, by PyTorch
    def backward(ctx: Any, grad_states: Any) -> tuple:
        module, net, trace = ctx.module, ctx.net, ctx.trace
        eps = grad_states.permute(0, 2, 1).contiguous()  # dE/dh_s, (tau, state, batch)
        system = backward_system(net, trace, eps)
        solution = solve(system, module.method, rtol=module.rtol, **module.options)
        gradients = net.gradients(trace, net.unstack(system, solution.x))
        module.last["backward"] = solution
        dx = gradients.x.permute(0, 2, 1)  # (tau, batch, features)
        initial = None if gradients.initial is None else gradients.initial.T
        return (None, None, dx, initial, *[gradients.parameters[n] for n in ctx.names])


def _forward(module: Any, net: Any, xs: Any) -> Any:
    """The trace of ``xs`` by the module's mode, recorded in ``module.last``."""
    if module.forward_mode == "sequential":
        trace = net.forward(xs)
        module.last = {"mode": "sequential", "method": module.method}
        return trace
    try:
        trace = newton_forward(net, xs, method=module.method, linearization=module.forward_mode,
                               rtol=module.rtol, maxiter=module.maxiter, **module.options)
    except ConvergenceError as error:
        if module.on_failure == "raise":
            raise
        warnings.warn(f"{type(module).__name__}: the {module.forward_mode} forward did not "
                      f"converge ({error}); ran the sequential pass instead", RuntimeWarning,
                      stacklevel=4)
        module.last = {"mode": "sequential", "method": module.method, "fallback": str(error)}
        return net.forward(xs)
    module.last = {"mode": module.forward_mode, "method": module.method,
                   "iterations": trace.info["iterations"],
                   "residuals": trace.info["residuals"],
                   "converged": trace.info["converged"],
                   "lyapunov": trace.info.get("lyapunov")}
    return trace


class GRU(_Parallel, torch.nn.GRU):
    """``torch.nn.GRU`` whose forward is ``mode`` and whose backward is propop's ``method``.

    Parameters
    ----------
    *args, **kwargs
        ``torch.nn.GRU``'s (``input_size``, ``hidden_size``, ``num_layers``,
        ``bias``, ``batch_first``, ``dtype``, ``device``, ...).
    mode : {"sequential", "newton", "quasi", "block-diagonal", "damped", "quasi-damped"}
        The forward pass (default ``"newton"``: DEER).
    method : str
        The registered method of the linear solves, forward and backward.
    on_failure : {"raise", "sequential"}
        What a forward that does not converge does.
    rtol : float, optional
        Tolerance of the forward iteration and of the solves; default ``1e3 eps`` of
        the dtype (``2.2e-13`` in float64): Newton's quadratic convergence reaches
        it in about one iteration more than ``1e-10`` would take, and then outputs
        and gradients are ``torch.nn``'s to rounding, as a drop-in's must be.
    maxiter : int, optional
        Newton iterations at most (default: enough for an exact answer).
    options : dict, optional
        The method's own options (forward and backward solves).
    """

    cell = gated.GRU



class RNN(_Parallel, torch.nn.RNN):
    """``torch.nn.RNN`` (tanh or ReLU) with propop's passes; parameters as :class:`GRU`'s."""

    cell = gated.ElmanRNN



class LSTM(_Parallel, torch.nn.LSTM):
    """``torch.nn.LSTM`` with propop's passes; ``output, (h_n, c_n) = lstm(x)``."""

    cell = gated.LSTM


    def _final(self, final: list, batched: bool) -> Any:
        """``(h_n, c_n)`` stacked over layers."""
        H = self.hidden_size
        return (torch.stack([f[..., :H] for f in final]),
                torch.stack([f[..., H:] for f in final]))


def from_module(module: Any, **choices: Any) -> Any:
    """The propop module of a ``torch.nn.GRU``, ``LSTM`` or ``RNN``, with its parameters.

    ``choices`` are the propop module's (``mode``, ``method``, ...). The result
    holds copies of the parameters on the same device and dtype.
    """
    kinds = {torch.nn.GRU: GRU, torch.nn.LSTM: LSTM, torch.nn.RNN: RNN}
    target = kinds.get(type(module))
    if target is None:
        raise TypeError(f"from_module takes a torch.nn.GRU, LSTM or RNN, got "
                        f"{type(module).__name__}")
    options = dict(input_size=module.input_size, hidden_size=module.hidden_size,
                   num_layers=module.num_layers, bias=module.bias,
                   batch_first=module.batch_first, dropout=module.dropout,
                   bidirectional=module.bidirectional)
    if isinstance(module, torch.nn.RNN):
        options["nonlinearity"] = module.nonlinearity
    if getattr(module, "proj_size", 0):
        options["proj_size"] = module.proj_size
    parameter = next(module.parameters())
    made = target(**options, device=parameter.device, dtype=parameter.dtype, **choices)
    made.load_state_dict(module.state_dict())
    return made
