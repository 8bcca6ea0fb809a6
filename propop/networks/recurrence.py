"""Any recurrent cell by its Jacobians: ``h_s = F(h_{s-1}, x_s; theta)`` (optional: torch).

Written for propop; the Jacobians come from ``torch.func`` (``jacrev`` under
``vmap``), the parameter gradients from ``torch.func.vjp``. The paper's Elman RNN
(section 2.2) is one such cell; GRUs and LSTMs (:mod:`propop.networks.gated`)
are others. With ``J_s = dF/dh`` at ``(h_{s-1}, x_s)``, one per step and sample:

- the **backward system** (BPTT, eq. back_prop_sys over time) is the upper
  block bi-diagonal chain ``v_s - J_{s+1}^T v_{s+1} = eps_s``, ``v_s = dE/dh_s``;
- the **forward system** linearised around an iterate ``h^(i)`` (Newton's method
  on the whole sequence, DEER) is the lower chain
  ``h_s - A_s h_{s-1} = F(h^(i)_{s-1}, x_s) - A_s h^(i)_{s-1}`` with ``A_s = J_s``
  (``linearization="newton"``), its diagonal (``"quasi"``, quasi-DEER) or its
  diagonal blocks of ``block_size`` (``"block-diagonal"``, as ParaRNN's cells);

both with per-step, per-sample couplings (a ``(tau - 1, r, n, n)`` stack), so
every method for stacked chains solves them, cyclic reduction included. A cell
of several layers is one cell whose state is all layers' states: its Jacobian
is block lower triangular over the layers, and the system stays one chain.

Sequences are propop's: ``xs`` is ``(tau, m)`` or ``(tau, m, r)`` (time first,
samples last); the states ``(tau, n[, r])``; the output is the state's rows
``output`` (an LSTM's ``h``, not its ``c``). A recurrence's arrays are NumPy
arrays, or PyTorch tensors on any device after :meth:`Recurrence.to` (a step
written in PyTorch then never leaves its device): the same code for both.
"""

from __future__ import annotations

import contextlib
import copy
import math
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import backend, memory
from .._checks import (float_dtype, positive_int, real_array, require_finite,
                       require_samples)
from ..losses import loss_gradient, require_steps_target
from .trace import Trace

__all__ = ["Recurrence", "RecurrenceGradients", "LINEARIZATIONS"]

LINEARIZATIONS = ("newton", "quasi", "block-diagonal")
# Up to this many samples a step written for one sample runs on each in turn, not under
# vmap: one vmap call cost 66-71 us for 1-64 samples of an 8-state tanh cell, the cell
# itself 8 us a sample (one thread); at 4 samples 34 against 67 us a step.
SAMPLE_BY_SAMPLE = 4
# From this many steps a vmapped step runs as one traced graph of its batched operations
# (_TorchCell._traced): 22 against 67 us a step for an 8-state tanh cell at batch 16 with
# torch's public functions called (_by_public_functions; 33 with the ATen overloads), the
# trace 9 ms (after its first, about a second, in a process): it pays from about 200 steps.
TRACED_STEPS = 256
# More samples than this take the recorded graph on a long sequence, not each its own
# loop: 17.8-19.4 us a step for the graph at 1-5 samples against 6.7, 14.5, 22.3 and 28.7
# us for 1 to 4 samples' own loops (8-state tanh cell, one thread)
TRACED_SAMPLES = 2
# A step's gap at most this many eps of its sample's largest state is a parallel solve's
# rounding (:meth:`Recurrence.nonlinear_residual`)
ROUNDING = 4


@dataclass(frozen=True)
class RecurrenceGradients:
    """Gradients of a recurrence, summed over time steps and samples.

    Attributes
    ----------
    parameters : dict
        ``dE/dtheta`` by parameter name (PyTorch's names for a GRU or LSTM).
    x : array
        ``dE/dx``, shaped like the input sequence.
    solution : Solution or None
    initial : array or None
        ``dE/dh_{-1}`` of a recurrence started from a given state
        (:meth:`Recurrence.starting_from`), shaped like it; ``None`` otherwise.
    """

    parameters: dict
    x: Any
    solution: Any = field(default=None, compare=False)
    initial: Any = field(default=None, compare=False)

    def named_parameters(self) -> Any:
        """``(name, gradient)`` per parameter (PyTorch's names for a GRU or LSTM)."""
        yield from self.parameters.items()


class Recurrence:
    """``h_s = step(theta, h_{s-1}, x_s)`` for ``s = 0..tau-1`` from ``h_{-1} = 0``.

    :meth:`starting_from` gives the same recurrence from another ``h_{-1}``.

    Parameters
    ----------
    step : callable
        ``step(parameters, h, x) -> h_new``. With ``backend="torch"`` (default) on
        PyTorch tensors of one sample (``h`` ``(n,)``, ``x`` ``(m,)``), written with
        ``torch`` operations so that ``torch.func`` batches and differentiates it;
        with ``backend="numpy"`` on NumPy arrays of a batch (``h`` ``(b, n)``,
        ``x`` ``(b, m)``).
    parameters : mapping of str to array
        ``theta``, copied as arrays of ``dtype`` (tensors for ``"torch"``).
    state_size, input_size : int
    output : sequence of int, optional
        The rows of the state that are the output (default: all).
    jacobian : callable, optional
        ``jacobian(parameters, h, x) -> dF/dh``: of one sample, ``(n, n)``, instead
        of ``torch.func.jacrev`` (``"torch"``); of a batch, ``(b, n, n)``, needed
        (``"numpy"``).
    jacobian_diagonal : callable, optional
        ``jacobian_diagonal(parameters, h, x) -> diag(dF/dh)`` of a batch's rows,
        ``(b, n)`` (tensors for ``"torch"``, arrays for ``"numpy"``): what
        quasi-Newton needs, without the full Jacobians (by default their
        diagonals, the Jacobians formed a few rows at a time).
    vjp : callable, optional
        ``"numpy"`` only: ``vjp(parameters, h, x, v) -> (dtheta, dx)``, the
        products ``v^T dF/dtheta`` (summed over the batch, by parameter name) and
        ``v^T dF/dx`` (``(b, m)``); needed for gradients (:func:`propop.backprop`).
    block_size : int, optional
        The diagonal blocks ``linearization="block-diagonal"`` keeps (default 1).
    backend : {"torch", "numpy"}
        Where ``step`` runs.
    dtype : {"float64", "float32"}
        Of the parameters, states and systems; tolerances follow it.
    batched : bool
        ``backend="torch"``: ``step`` takes a batch of states and inputs as rows
        (``(r, n)``, ``(r, m)``) as it is, so no ``vmap`` wraps it (the built-in
        cells are written so); ``False`` (default): ``step`` is written for one
        sample and ``torch.func.vmap`` batches it. A NumPy step always takes batches.
    jacobian_batched : bool
        ``backend="torch"``: the given ``jacobian`` takes a batch's rows too,
        ``(r, n, n)``, and no ``vmap`` wraps it (the built-in cells': their Jacobians
        written into one stack, no per-sample temporaries); ``False`` (default): of
        one sample. A NumPy ``jacobian`` always takes batches.
    """

    def __init__(self, step: Callable, parameters: Mapping[str, Any], *, state_size: int,
                 input_size: int, output: Sequence[int] | None = None,
                 jacobian: Callable | None = None, vjp: Callable | None = None,
                 block_size: int = 1, backend: str = "torch", dtype: Any = "float64",
                 batched: bool = False, jacobian_diagonal: Callable | None = None,
                 jacobian_batched: bool = False) -> None:
        if backend not in CELLS:
            raise ValueError(f"backend must be one of {tuple(CELLS)}, got {backend!r}")
        self._dtype = float_dtype(dtype)
        self.step = step
        self.cell = CELLS[backend](step, parameters, jacobian, vjp, self._dtype, batched,
                                   jacobian_diagonal, jacobian_batched)
        self.state_size = positive_int(state_size, "state_size")
        self.input_size = positive_int(input_size, "input_size")
        self.output = np.arange(self.state_size) if output is None else _rows(output,
                                                                               self.state_size)
        self.block_size = positive_int(block_size, "block_size")
        if self.state_size % self.block_size:
            raise ValueError(f"block_size {block_size} must divide the state size "
                             f"{self.state_size}")

    # The input is no block of a recurrence's systems: Newton makes one more state exact
    # per iteration from h_{-1} = 0, tau iterations in all (an FNN's x is block 0: l).
    input_blocks = 0
    initial: Any = None  # h_{-1}: None is zero (see starting_from)

    def starting_from(self, h: Any) -> Recurrence:
        """The same recurrence started from ``h_{-1} = h`` instead of zero.

        ``h`` is ``(state_size,)`` for sequences of one sample or ``(state_size, r)``
        for ``r`` samples, on the recurrence's backend. The sequential pass, the
        Newton family and the systems all start there, and :meth:`gradients` adds
        ``dE/dh_{-1}`` (``.initial``). ``None`` starts from zero again.
        """
        started = copy.copy(self)
        if h is None:
            started.initial = None
            return started
        h = real_array(h, "the initial state", self.dtype)
        if h.ndim not in (1, 2) or h.shape[0] != self.state_size:
            raise ValueError(f"the initial state has shape {tuple(h.shape)}, expected "
                             f"({self.state_size},) or ({self.state_size}, r)")
        require_finite(h, "the initial state")
        started.initial = h
        return started

    def _first(self, like: Any) -> Any:
        """``h_{-1}`` as ``(1, r, n)`` like the samples-first states ``like`` (zeros by default)."""
        xp = self._xp()
        if self.initial is None:
            return xp.zeros_like(like[:1, ...])
        first = _samples_first(self.initial[None, ...], self.dtype)
        if tuple(first.shape[1:]) != tuple(like.shape[1:]):
            raise ValueError(f"the initial state holds {first.shape[1]} samples, the sequence "
                             f"{like.shape[1]}: give one state per sample")
        return first

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(input {self.input_size}, state {self.state_size}, "
                f"output {self.output.size})")

    @property
    def parameters(self) -> dict:
        """``theta`` by name: arrays of the recurrence's backend (the cell's own)."""
        return self.cell.parameters

    @property
    def dtype(self) -> Any:
        """The parameters' and states' dtype (the backend's: a ``torch.dtype`` on PyTorch)."""
        return self.cell.array_dtype

    @property
    def backend(self) -> backend.Backend:
        """Where its sequences and systems live: NumPy, or PyTorch after :meth:`to`."""
        return backend.of(self.cell.like)

    def to(self, kind: str, device: Any = None) -> Recurrence:
        """The same recurrence with its arrays on backend ``kind``.

        ``kind`` is ``"numpy"``, ``"torch"``, ``"cupy"`` or ``"array_api_strict"``;
        ``device`` a PyTorch device (``"cuda"``, say). A step written in PyTorch
        (``backend="torch"``, GRU and LSTM) runs and is differentiated by PyTorch
        where the arrays are (CuPy's CUDA device, exchanged by DLPack; the CPU for
        the strict namespace) and solved on the arrays' backend; a NumPy step
        (``backend="numpy"``) stays on NumPy.
        """
        if kind not in backend.KINDS:
            raise ValueError(f"kind must be one of {backend.KINDS} (a PyTorch device with "
                             f"device=), got {kind!r}")
        moved = copy.copy(self)
        moved.cell = self.cell.to(kind, device)
        return moved

    def _xp(self) -> Any:
        return self.backend.xp

    def _rows(self, xs: Any, states: Any) -> tuple[Any, Any, int]:
        """``(h_{s-1}, x_s)`` of every step and sample as ``(tau r, n)`` and ``(tau r, m)``."""
        xp = self._xp()
        tau, r = xs.shape[0], xs.shape[2] if xs.ndim == 3 else 1

        def previous() -> Any:
            H = _samples_first(states, self.dtype)
            return xp.reshape(xp.concat([self._first(H), H[:-1, ...]]), (tau * r, -1))

        return (self._reused("previous", states, previous), self._reused(
            "inputs", xs, lambda: xp.reshape(_samples_first(xs, self.dtype), (tau * r, -1))), r)

    # -- the sequential reference -----------------------------------------------------------
    def check_input(self, xs: Any) -> Any:
        """``xs`` as an array of :attr:`dtype`, ``(tau, m)`` or ``(tau, m, r)``."""
        xs = real_array(xs, "xs", self.dtype)
        if xs.ndim not in (2, 3) or xs.shape[1] != self.input_size or xs.shape[0] < 1:
            raise ValueError(f"xs has shape {xs.shape}, expected (tau, {self.input_size}) or "
                             f"(tau, {self.input_size}, r)")
        require_samples(xs, "xs")
        require_finite(xs, "xs")
        return xs

    def forward(self, xs: Any) -> Trace:
        """The states step by step, all samples at once: ``z = (xs, h)``."""
        xp = self._xp()
        xs = self.check_input(xs)
        X = _samples_first(xs, self.dtype)
        states = self._states(X)
        if not backend.all_finite(states, xp):  # the inputs are finite: the parameters?
            for name, value in self.cell.parameters.items():  # changed in place since made
                require_finite(value, f"parameter {name!r}")
            bad = ~np.isfinite(backend.to_host(states))
            s, i = (int(k) for k in np.argwhere(bad)[0][:2])
            raise ValueError(f"the step returned NaN or Inf at time step {s} (sample {i}) from "
                             "finite states, inputs and parameters: it overflows or leaves "
                             "its domain there")
        return self.trace_from_states(xs, [None, _samples_last(states, xs)])

    def _states(self, X: Any) -> Any:
        """Every step's state ``(tau, r, n)`` from inputs ``X`` ``(tau, r, m)``, step by step."""
        shape = (1, X.shape[1], self.state_size)
        first = self._first(self._xp().empty(shape, dtype=self.dtype, device=backend.device(X)))
        return self.cell.sequence(first[0, ...], X)

    def outputs(self, trace: Trace) -> Any:
        """The output rows of the states, ``(tau, len(output)[, r])``."""
        h = trace.z[1]
        return backend.namespace(h).take(h, backend.like(self.output, h), axis=1)

    def loss_gradient(self, trace: Trace, target: Any, loss: str = "mse",
                      reduction: str = "sum") -> Any:
        """``eps = dE/dh`` at every step: the loss's gradient in the output rows, zero elsewhere."""
        xp = self._xp()
        require_steps_target(self.outputs(trace), target, loss)
        out = xp.moveaxis(self.outputs(trace), 1, 0)
        if tuple(np.shape(target)) == tuple(self.outputs(trace).shape):  # steps first: moved
            target = xp.moveaxis(real_array(target, "target", out.dtype), 1, 0)
        grad = xp.moveaxis(loss_gradient(out, target, loss, reduction), 0, 1)  # (tau, k[, r])
        spread = np.zeros((self.state_size, self.output.size))  # a row listed twice counts twice
        spread[self.output, np.arange(self.output.size)] = 1
        return xp.astype(backend.like(spread, grad), grad.dtype) @ grad if grad.ndim == 3 \
            else grad @ xp.astype(backend.like(spread.T, grad), grad.dtype)

    def gradients(self, trace: Trace, v: Sequence[Any]) -> RecurrenceGradients:
        """``dE/dtheta`` and ``dE/dx`` from ``v = dE/dh`` (one vector-Jacobian product)."""
        (V,) = v
        xp = self._xp()
        previous, X, r = self._rows(trace.x, trace.z[1])
        V = xp.reshape(_samples_first(V, self.dtype), tuple(previous.shape))
        d_parameters, d_input = self.cell.pullback(previous, X, V)
        dx = _samples_last(xp.reshape(d_input, (trace.x.shape[0], r, -1)), trace.x)
        if self.initial is None:
            return RecurrenceGradients(d_parameters, dx)
        first = self.cell.jacobians(previous[:r, ...], X[:r, ...])  # dh_0/dh_{-1}, (r, n, n)
        d_initial = (xp.matrix_transpose(first) @ V[:r, :, None])[..., 0]  # (r, n)
        d_initial = _samples_last(d_initial[None, ...], self.initial[None, ...])[0, ...]
        return RecurrenceGradients(d_parameters, dx, initial=d_initial)

    # -- systems and Newton -----------------------------------------------------------------
    def state_shapes(self, xs: Any) -> tuple[list, list]:
        """Shapes of ``z = (xs, h)`` and of ``y`` (none)."""
        return [xs.shape, (xs.shape[0], self.state_size) + xs.shape[2:]], []

    def trace_from_states(self, xs: Any, states: Sequence[Any] | None) -> Trace:
        """The trace of states ``[_, h]`` (``None``: zeros)."""
        xp = self._xp()
        xs = self.check_input(xs)
        h = xp.zeros((xs.shape[0], self.state_size) + tuple(xs.shape[2:]), dtype=self.dtype,
                     device=backend.device(xs)) \
            if states is None else backend.astype(states[-1], self.dtype)
        return Trace(x=xs, y=(), z=(xs, h))

    def unstack(self, system: Any, x: Any) -> list:
        """A solution ``(tau n[, r])`` as ``[h]`` with ``h`` ``(tau, n[, r])``."""
        return [self._xp().reshape(x, (-1, self.state_size) + tuple(x.shape[1:]))]

    def input_deviation(self, states: Sequence[Any], xs: Any) -> float:
        """The input is no block of a recurrence's systems: nothing to deviate."""
        return 0.0

    # entries a row of the memos a step keeps for its Jacobians, two trajectories' (a
    # built-in cell's gate values, _Gated.memo_entries; a user's step keeps none)
    memo_entries = 0

    @contextlib.contextmanager
    def reusing_steps(self) -> Iterator[None]:
        """Within the block, the step at one trajectory is evaluated once.

        The Newton loop's: its nonlinear residual and its next linearisation read
        the same trace, so the residual's ``F(h_{s-1}, x_s)`` serves both (and a
        damped step's merits, of the iterate and of its candidate), and so do the
        rows both read (:meth:`_rows`: the inputs' once for the whole loop). The
        values of the last two trajectories are kept, for the array objects they
        were made from, and dropped when the block ends: nothing outlives the call
        that made them.
        """
        self._kept = {}
        try:
            yield
        finally:
            self._kept = None

    def _reused(self, kind: str, key: Any, make: Callable[[], Any]) -> Any:
        """``make()``, once per ``key`` object and ``kind`` within :meth:`reusing_steps`."""
        kept = getattr(self, "_kept", None)
        if kept is None:
            return make()
        values = kept.setdefault(kind, [])
        for made_from, value in values:
            if made_from is key:
                return value
        value = make()
        values[:] = [*values[-1:], (key, value)]
        return value

    def _step_at(self, trace: Trace, previous: Any, X: Any) -> tuple[Any, list]:
        """``(F, memo)`` of every row at the trace's states (kept within :meth:`reusing_steps`).

        ``memo``: what a built-in cell's step keeps for its Jacobians at the same rows
        ``previous``, ``X`` (its gate values; empty for a user's cell). What depends
        on the inputs alone is kept for ``X`` (one array for the whole Newton loop,
        :meth:`_rows`): a built-in cell's first layer's input gates, made once a loop.
        """
        def step() -> tuple[Any, list]:
            memo: list = []
            return self.cell(previous, X, memo, self._reused("inputs' values", X, dict)), memo

        return self._reused("step", trace.z[1], step)

    def _defects(self, trace: Trace) -> tuple[Any, Any]:
        """``(h_s - F(h_{s-1}, x_s), F(h_{s-1}, x_s))``, each ``(tau, r, n)``."""
        xp = self._xp()
        previous, X, r = self._rows(trace.x, trace.z[1])
        F = xp.reshape(self._step_at(trace, previous, X)[0], (trace.x.shape[0], r, -1))
        return _samples_first(trace.z[1], self.dtype) - F, F  # the states read transposed

    def nonlinear_residual(self, trace: Trace, rtol: float | None = None) -> float:
        """``max_s ||h_s - F_s|| / max(||F_s||, floor)``, ``F_s = F(h_{s-1}, x_s)``, all samples.

        Given ``rtol`` (the Newton loop's), a step is measured no finer than the
        rounding a parallel solve leaves in every step of its sample's trajectory:
        ``floor = (ROUNDING eps / rtol) S``, ``S`` the sample's largest ``||F_s||``, so
        that the residual is at most ``rtol`` where each gap is at most ``rtol ||F_s||``
        or ``ROUNDING eps S``. (A ReLU step whose units are all zero, ``F_s = 0``, or
        one a thousand times smaller than the largest, read a solve's last bits of
        ``h_s`` as a relative residual of ``1e290`` or ``2e-12``, and the loop never
        stopped.) Without ``rtol`` the floor is the dtype's tiny.
        """
        xp = self._xp()
        gap, F = self._defects(trace)
        size = backend.norms(F)  # (tau, r)
        if rtol is not None and rtol > 0:
            scale = xp.max(size, axis=0) * (ROUNDING * backend.eps(F.dtype) / rtol)
            size = xp.maximum(size, scale[None, :])
        size = xp.clip(size, min=backend.tiny(F.dtype))  # 0 / 0 is no gap
        return float(xp.max(backend.norms(gap) / size))

    def first_overflow(self, trace: Trace) -> str | None:
        """The first step and sample whose ``F(h_{s-1}, x_s)`` is NaN or Inf, named."""
        xp = self._xp()
        with backend.quiet(xp):
            F = self._defects(trace)[1]  # (tau, r, n)
        bad = backend.to_host(~xp.all(xp.isfinite(F), axis=2))
        if not bad.any():
            return None
        s, j = (int(i) for i in np.argwhere(bad)[0])
        return f"F(h_(s-1), x_s) at step {s}, sample {j} (the step overflows at the iterate)"

    def merit(self, trace: Trace) -> Any:
        """``sum_s ||h_s - F(h_{s-1}, x_s)||^2`` per sample, ``(r,)``: what damping reduces."""
        return self._xp().sum(self._defects(trace)[0] ** 2, axis=(0, 2))

    def lyapunov(self, trace: Trace, jacobians: Any = None) -> float:
        """The largest Lyapunov exponent along the trajectory, estimated, worst sample.

        ``(1 / (tau - 1)) log ||J_{tau-1} ... J_1 q||`` with ``q`` the normalised
        ones (power iteration along the trajectory). Positive: nearby trajectories
        separate, and Newton-type parallel evaluation converges slowly
        (Gonzalez et al., NeurIPS 2025); negative: contractive, fast. The product
        is formed as a tree, each level's pairs multiplied in one batched product
        and normalised, their logarithms summed (:func:`_normalised_product`), so
        no loop runs over the steps. ``jacobians`` are ``J_1..J_{tau-1}``
        (``(tau - 1[, r], n, n)``) where the caller has them, else they are
        computed at the trace a chunk of steps at a time (:meth:`_jacobian_chunks`:
        the memory quasi-Newton saved is not spent here).
        """
        xp, last = self._xp(), trace.x.shape[0] - 1
        if last <= 0:
            return float("-inf")
        if jacobians is not None:
            chunks = [jacobians if jacobians.ndim == 4 else jacobians[:, None, ...]]
        else:
            chunks = self._jacobian_chunks(trace)
        r = trace.x.shape[2] if trace.x.ndim == 3 else 1
        device, n = backend.device(trace.z[1]), self.state_size
        q = xp.ones((r, n), dtype=self.dtype, device=device) / math.sqrt(n)
        total = xp.zeros(r, dtype=self.dtype, device=device)
        for J in chunks:  # q <- P q for each chunk's normalised product P, scales summed
            P, logs = _normalised_product(xp, J)
            q = (P @ q[..., None])[..., 0]
            norm = xp.clip(backend.norms(q), min=backend.tiny(q.dtype))
            total += logs + xp.log(norm)
            q /= norm[:, None]
        return float(xp.max(total / last))

    def _jacobian_chunks(self, trace: Trace) -> Any:
        """``J_1, ..., J_{tau-1}`` at the trace in chunks ``(steps, r, n, n)``, made as reached.

        Whole steps a chunk (:func:`_jacobian_rows`), so :meth:`lyapunov` holds one
        chunk at a time however long the sequence.
        """
        xp, n = self._xp(), self.state_size
        previous, X, r = self._rows(trace.x, trace.z[1])
        for J in _jacobian_rows(self.cell.jacobians, previous[r:, ...], X[r:, ...], unit=r):
            yield xp.reshape(J, (-1, r, n, n))

    def forward_diagnostics(self, trace: Trace, jacobians: Any = None) -> dict:
        """What :func:`propop.forward` adds to ``info``: the Lyapunov exponent's estimate.

        ``jacobians``: those of the last Newton step, at the converged trajectory to
        within the tolerance, so that they are not computed again.
        """
        return {"lyapunov": self.lyapunov(trace, jacobians)}

    def linearized(self, xs: Any, trace: Trace | None, linearization: str,
                   diagonal: bool = False) -> tuple[Any, Any]:
        """``(A, c)`` of the forward system around ``trace``: ``A`` ``(tau, r, n, n)``.

        ``diagonal=True`` with ``linearization="quasi"``: ``A`` holds the
        Jacobians' diagonals alone, ``(tau, r, n)`` (the chain of identity
        couplings scaled by them, ``O(tau r n)``).
        """
        if linearization not in LINEARIZATIONS:
            raise ValueError(f"unknown linearization {linearization!r} for a recurrence; "
                             f"choose one of {LINEARIZATIONS}")
        xp = self._xp()
        trace = trace if trace is not None else self.trace_from_states(xs, None)
        previous, X, r = self._rows(trace.x, trace.z[1])
        (F, memo), tau = self._step_at(trace, previous, X), trace.x.shape[0]
        if diagonal and linearization == "quasi":
            d = self.cell.jacobian_diagonals(previous, X, memo)
            c = xp.concat([F[:r, ...], F[r:, ...] - d[r:, ...] * previous[r:, ...]])
            return xp.reshape(d, (tau, r, -1)), xp.reshape(c, (tau, r, -1))
        self._require_jacobians(trace.x)
        J = self.cell.jacobians(previous, X, memo)
        if linearization != "newton":  # the diagonal blocks only (quasi: of size one)
            size = 1 if linearization == "quasi" else self.block_size
            block = np.arange(self.state_size) // size
            J = J * xp.astype(backend.like(block[:, None] == block[None, :], J), J.dtype)
        c = F - backend.block_matmul(J, previous[..., None])[..., 0]
        c[:r, ...] = F[:r, ...]  # step 0: h_{-1} is given, no unknown
        return (xp.reshape(J, (tau, r, self.state_size, -1)), xp.reshape(c, (tau, r, -1)))

    def _require_jacobians(self, xs: Any) -> None:
        """The Jacobian stack ``(tau, r, n, n)`` checked against the memory budget first.

        With the step's memos the Newton loop keeps (:attr:`memo_entries` a row).
        """
        r = xs.shape[2] if xs.ndim == 3 else 1
        memory.require_arrays(xs.shape[0] * r * (2 * self.state_size ** 2 + self.memo_entries),
                              backend.itemsize(self.dtype),
                              f"the Jacobians of {xs.shape[0]} steps and {r} samples "
                              f"(state size {self.state_size})",
                              "use shorter sequences or fewer samples per call")

    def jacobians_along(self, trace: Trace) -> Any:
        """``J_s = dF/dh`` at the trace's states, ``(tau, r, n, n)``."""
        self._require_jacobians(trace.x)
        previous, X, r = self._rows(trace.x, trace.z[1])
        J = self.cell.jacobians(previous, X)
        return self._xp().reshape(J, (trace.x.shape[0], r, self.state_size, -1))


class _TorchCell:
    """A step on one sample's tensors, batched and differentiated by ``torch.func``.

    ``vmap``, ``jacrev`` and ``vjp``, on the cell's device; its arrays in and out
    are of its home backend: NumPy (``home = "numpy"``), tensors of that device
    (``"torch"``), CuPy arrays (``"cupy"``: the work on their CUDA device, by
    DLPack) or the strict namespace's (``"array_api_strict"``, through the host).
    """

    def __init__(self, step: Callable, parameters: Mapping[str, Any], jacobian: Any,
                 vjp: Any, dtype: Any, batched: bool = False, diagonal: Any = None,
                 jacobian_batched: bool = False) -> None:
        import torch
        from torch.func import jacrev, vmap

        if vjp is not None:
            raise ValueError("vjp is for backend='numpy'; torch.func differentiates a "
                             "PyTorch step")
        self.home, self.device = "numpy", torch.device("cpu")
        self.dtype = getattr(torch, dtype.name)
        self.parameters = {k: _tensor_parameter(k, v, self.dtype) if isinstance(v, torch.Tensor)
                           else backend.to_torch(_parameter(k, v, dtype), self.dtype,
                                                 "cpu").clone()
                           for k, v in parameters.items()}
        devices = {t.device for t in self.parameters.values()}
        if len(devices) > 1:
            raise ValueError(f"the parameters live on several devices {sorted(map(str, devices))}"
                             ": move them to one")
        self.device = devices.pop() if devices else self.device
        self.like = np.zeros(0, dtype=dtype)  # an empty array of the home backend and dtype
        self.step = step
        self.remembers = False  # a built-in cell's: its step fills a memo (_Gated._step)
        self._batched = step if batched else vmap(step, in_dims=(None, 0, 0))
        self._jacobian = jacobian if jacobian is not None and jacobian_batched else \
            vmap(jacobian or jacrev(step, argnums=1), in_dims=(None, 0, 0))
        self._diagonal = diagonal

    @property
    def array_dtype(self) -> Any:
        """The dtype of the cell's home arrays."""
        return self.like.dtype

    def to(self, kind: str, device: Any) -> _TorchCell:
        """The cell with ``kind`` arrays, its parameters and its work where they are."""
        moved = copy.copy(self)
        moved.home, moved.device = kind, backend.torch_device(kind, device)
        moved.parameters = {k: v.to(moved.device) for k, v in self.parameters.items()}
        moved.like = moved.home_array(moved.tensor(np.zeros(0)))
        return moved

    def __call__(self, H: Any, X: Any, memo: list | None = None, inputs: dict | None = None
                 ) -> Any:
        """The step of every row; a built-in cell's appends its gate values to ``memo``.

        ``inputs``: a dict kept for these rows' ``X`` (:meth:`Recurrence._step_at`), in
        which a built-in cell keeps what depends on ``X`` alone (its first layer's
        input gates) for the next step at the same inputs.
        """
        import torch

        to_fill = {"memo": memo, "inputs": inputs} if memo is not None and self.remembers \
            else {}
        with torch.no_grad():
            out = self._batched(self.parameters, self.tensor(H), self.tensor(X), **to_fill)
        return self.home_array(_checked(out, H.shape, self.dtype, "the step"))

    def _memo_keyword(self, memo: list | None) -> dict:
        """The keyword that hands a filled ``memo`` to a built-in cell's Jacobians."""
        return {"memo": memo} if memo and self.remembers else {}

    def sequence(self, first: Any, X: Any) -> Any:
        """The states ``(tau, r, n)`` from ``h_{-1} = first`` and inputs ``X``, step by step.

        One loop on the cell's device: the arrays cross from and to the home backend
        once, and the step's output is checked at the first step (its shape and
        dtype cannot change from one step to the next). A step written for one
        sample runs under ``vmap`` for a batch (as one traced graph from
        :data:`TRACED_STEPS` steps and more than :data:`TRACED_SAMPLES` samples,
        :meth:`_traced`), but on each sample in turn for up to
        :data:`SAMPLE_BY_SAMPLE` of them otherwise, where ``vmap``'s own cost per
        call is more.
        """
        import torch

        inputs, h = self.tensor(X), self.tensor(first)
        r, step = h.shape[0], self._batched
        with torch.no_grad():
            if step is not self.step and r > TRACED_SAMPLES and \
                    inputs.shape[0] >= TRACED_STEPS:
                step = self._traced(h, inputs[0])  # vmap's batched step if not recorded
            if step is self.step or step is not self._batched or r > SAMPLE_BY_SAMPLE:
                return self.home_array(self._steps(step, h, inputs, tuple(first.shape)))
            one = (1,) + tuple(first.shape[1:])
            return self.home_array(torch.stack(
                [self._steps(self.step, h_i, x_i, one, single=True) for h_i, x_i in
                 zip(h.unbind(0), inputs.unbind(1))], dim=1))

    def _traced(self, h: Any, x: Any) -> Callable:
        """The vmapped step as one graph of its batched operations (``make_fx``), or ``vmap``.

        ``vmap`` costs about 60 us a call whatever the step; the graph it records
        once, for these shapes, calls the same operations without it. The
        parameters are the graph's inputs, so nothing of their values is kept. The
        graph is used only if its first step equals ``vmap``'s exactly: a step that
        cannot be recorded, or whose recording would differ (random numbers, a
        Python side effect), runs under ``vmap`` as before.
        """
        import torch
        from torch.fx.experimental.proxy_tensor import make_fx

        names, batched = list(self.parameters), self._batched

        def flat(h: Any, x: Any, *values: Any) -> Any:
            return batched(dict(zip(names, values)), h, x)

        values = [self.parameters[k] for k in names]
        try:
            graph = make_fx(flat)(h, x, *values)
        except Exception:  # noqa: BLE001 (anything the recording cannot take: vmap runs it)
            return batched
        reference = batched(self.parameters, h, x)
        public = _by_public_functions(graph)
        for candidate in (public, graph) if public is not graph else (graph,):  # faster first
            recorded = candidate(h, x, *values)
            if isinstance(recorded, torch.Tensor) and torch.equal(recorded, reference):
                forward = candidate.forward  # not the module call: its hooks cost more
                return lambda p, h, x: forward(h, x, *values)  # p is these values
        return batched

    def _steps(self, step: Callable, h: Any, inputs: Any, shape: tuple,
               single: bool = False) -> Any:
        """``step`` from ``h`` over ``inputs`` (time first): the states, time first.

        ``shape`` is a batch's state shape; ``single``: ``step`` takes one sample
        (``shape`` is ``(1, n)``).
        """
        import torch

        states = []
        for s, x_s in enumerate(inputs.unbind(0)):
            h = step(self.parameters, h, x_s)
            if s == 0:
                _checked(h[None] if single else h, shape, self.dtype, "the step")
            states.append(h)
        return torch.stack(states)

    def jacobians(self, H: Any, X: Any, memo: list | None = None) -> Any:
        """``dF/dh`` of every row ``(rows, n, n)``; ``memo``: the step's at these rows."""
        import torch

        with torch.no_grad():
            out = self._jacobian(self.parameters, self.tensor(H), self.tensor(X),
                                 **self._memo_keyword(memo))
        return self.home_array(_checked(out, tuple(H.shape) + tuple(H.shape[-1:]), self.dtype,
                                  "the Jacobian"))

    def jacobian_diagonals(self, H: Any, X: Any, memo: list | None = None) -> Any:
        """The Jacobians' diagonals ``(rows, n)``: the cell's own, or :func:`_diagonals`."""
        import torch

        if self._diagonal is None:
            return _diagonals(self.jacobians, H, X)
        with torch.no_grad():
            out = self._diagonal(self.parameters, self.tensor(H), self.tensor(X),
                                 **self._memo_keyword(memo))
        return self.home_array(_checked(out, tuple(H.shape), self.dtype, "jacobian_diagonal()"))

    def pullback(self, H: Any, X: Any, V: Any) -> tuple[dict, Any]:
        from torch.func import vjp

        H = self.tensor(H)
        _, pull = vjp(lambda p, x: self._batched(p, H, x), self.parameters, self.tensor(X))
        d_parameters, d_input = pull(self.tensor(V))
        return ({k: self.home_array(t.detach()) for k, t in d_parameters.items()},
                self.home_array(d_input.detach()))

    def tensor(self, a: Any) -> Any:
        """``a`` as a tensor of the cell's dtype on its device."""
        return backend.to_torch(a, self.dtype, self.device)

    def home_array(self, t: Any) -> Any:
        """A result tensor as a home array."""
        return backend.from_torch(t, self.home)


class _NumpyCell:
    """A step on NumPy batches with the user's Jacobian (and vector-Jacobian product)."""

    def __init__(self, step: Callable, parameters: Mapping[str, Any], jacobian: Any,
                 vjp: Any, dtype: Any, batched: bool = True, diagonal: Any = None,
                 jacobian_batched: bool = True) -> None:
        if jacobian is None:
            raise ValueError("backend='numpy' needs jacobian(parameters, h, x) -> (b, n, n): "
                             "nothing differentiates a NumPy step (or write the step in "
                             "PyTorch, backend='torch')")
        self.dtype = self.array_dtype = dtype
        self.like = np.zeros(0, dtype=dtype)
        self.parameters = {k: np.array(_parameter(k, v, dtype), dtype=dtype)
                           for k, v in parameters.items()}
        self.step, self._jacobian, self._vjp, self._diagonal = step, jacobian, vjp, diagonal

    def to(self, kind: str, device: Any) -> _NumpyCell:
        """Itself on NumPy; a NumPy step runs nowhere else."""
        if kind != "numpy":
            raise ValueError("this recurrence's step is NumPy code (backend='numpy'): it runs "
                             "on NumPy arrays only; write the step in PyTorch "
                             "(backend='torch') to run it on PyTorch tensors or a GPU")
        return self

    def __call__(self, H: Any, X: Any, memo: list | None = None, inputs: dict | None = None
                 ) -> Any:
        """The step of every row (a user's step keeps no ``memo`` and no ``inputs``)."""
        return _checked(np.asarray(self.step(self.parameters, H, X)), H.shape, self.dtype,
                        "the step")

    def sequence(self, first: Any, X: Any) -> Any:
        """The states ``(tau, r, n)`` from ``h_{-1} = first`` and inputs ``X``, step by step."""
        states = np.empty(tuple(X.shape[:2]) + tuple(first.shape[1:]), dtype=self.dtype)
        h = first
        for s in range(X.shape[0]):
            h = states[s, ...] = self(h, X[s, ...])
        return states

    def jacobians(self, H: Any, X: Any, memo: list | None = None) -> Any:
        """The user's ``jacobian`` of every row (``memo`` unread: no built-in cell's)."""
        return _checked(np.asarray(self._jacobian(self.parameters, H, X)),
                        H.shape + H.shape[-1:], self.dtype, "jacobian()")

    def jacobian_diagonals(self, H: Any, X: Any, memo: list | None = None) -> Any:
        """The Jacobians' diagonals ``(rows, n)``: the user's, or :func:`_diagonals`."""
        if self._diagonal is None:
            return _diagonals(self.jacobians, H, X)
        return _checked(np.asarray(self._diagonal(self.parameters, H, X)), H.shape, self.dtype,
                        "jacobian_diagonal()")

    def pullback(self, H: Any, X: Any, V: Any) -> tuple[dict, Any]:
        if self._vjp is None:
            raise ValueError("gradients of a backend='numpy' recurrence need vjp(parameters, "
                             "h, x, v) -> (dtheta, dx)")
        d_parameters, d_input = self._vjp(self.parameters, H, X, V)
        return {k: np.asarray(a) for k, a in d_parameters.items()}, np.asarray(d_input)


CELLS = {"torch": _TorchCell, "numpy": _NumpyCell}


# Rows of Jacobians formed at a time for their diagonals: 2^20 entries (8 MB in float64).
DIAGONAL_CHUNK = 1 << 20


def _normalised_product(xp: Any, J: Any) -> tuple[Any, Any]:
    """``(P, log s)`` with ``J_m ... J_1 = s P`` per sample and ``||P||_F = 1``, by a tree.

    ``J`` is ``(m, r, n, n)``, ``J[0]`` applied first. Each level multiplies every
    pair, later by earlier, in one batched product and divides each by its norm,
    adding the logarithm to the pair's: ``log2 m`` levels, no overflow however
    long the product. A zero product keeps the floor ``log(tiny)`` of its dtype.
    """
    logs = xp.zeros(tuple(J.shape[:2]), dtype=J.dtype, device=backend.device(J))
    while J.shape[0] > 1:
        pairs = J.shape[0] // 2
        P = backend.block_matmul(J[1: 2 * pairs: 2, ...], J[0: 2 * pairs: 2, ...])
        norm = xp.clip(backend.norms(xp.reshape(P, tuple(P.shape[:-2]) + (-1,))),
                       min=backend.tiny(P.dtype))
        P /= norm[..., None, None]
        level = logs[1: 2 * pairs: 2, ...] + logs[0: 2 * pairs: 2, ...] + xp.log(norm)
        if J.shape[0] == 2 * pairs:
            J, logs = P, level
        else:  # an odd one out goes up as it is
            J, logs = xp.concat([P, J[2 * pairs:, ...]]), xp.concat([level, logs[2 * pairs:, ...]])
    return J[0, ...], logs[0, ...]


def _jacobian_rows(jacobians: Callable, H: Any, X: Any, unit: int = 1) -> Any:
    """The Jacobians ``(rows, n, n)`` of the rows of ``H`` and ``X``, a chunk at a time.

    Each chunk is whole groups of ``unit`` rows (a step's samples) and about
    :data:`DIAGONAL_CHUNK` entries, so a caller that keeps less than the chunk
    holds ``O(r n^2)`` of them however many rows there are.
    """
    rows, n = H.shape
    step = unit * max(1, DIAGONAL_CHUNK // (unit * n * n))
    for i in range(0, rows, step):
        j = min(i + step, rows)
        yield jacobians(H[i:j, ...], X[i:j, ...])


def _diagonals(jacobians: Callable, H: Any, X: Any) -> Any:
    """``diag(dF/dh)`` of every row ``(rows, n)``, from the full Jacobians a chunk at a time.

    A general step's diagonal needs its Jacobian; formed in chunks
    (:func:`_jacobian_rows`), the memory held stays ``O(rows n)`` (quasi-Newton's).
    """
    xp = backend.namespace(H)
    return xp.concat([xp.linalg.diagonal(J) for J in _jacobian_rows(jacobians, H, X)])


def _parameter(name: str, value: Any, dtype: Any) -> Any:
    """A parameter as a finite real array of ``dtype``, or ``ValueError`` naming it."""
    if hasattr(value, "detach"):  # a tensor, a Parameter
        value = value.detach().cpu().numpy()
    value = real_array(value, f"parameter {name!r}", dtype)
    require_finite(value, f"parameter {name!r}")
    return value


def _tensor_parameter(name: str, value: Any, dtype: Any) -> Any:
    """A tensor parameter of ``dtype`` on its own device (no copy to the host), checked."""
    import torch

    if value.is_complex() or not (value.is_floating_point() or not value.dtype.is_signed
                                  or value.dtype in (torch.int32, torch.int64)):
        raise ValueError(f"parameter {name!r} has dtype {value.dtype}, expected real numbers")
    tensor = value.detach().to(dtype)
    if not bool(torch.isfinite(tensor).all()):
        raise ValueError(f"parameter {name!r} contains NaN or Inf")
    return tensor


def _checked(out: Any, shape: tuple, dtype: Any, what: str) -> Any:
    """What the step (or its Jacobian) returned for a batch, checked: shape and dtype.

    ``shape`` is the batch's expected shape; messages give one sample's.
    """
    got = tuple(getattr(out, "shape", ()))
    if got != tuple(shape):
        raise ValueError(f"{what} returned shape {got[1:] if got[:1] == shape[:1] else got} for "
                         f"one sample, expected {tuple(shape[1:])} (a state of size "
                         f"{shape[1]})")
    if out.dtype != dtype and (backend.kind(out.dtype) != "f"
                               or backend.eps(out.dtype) != backend.eps(dtype)):
        raise TypeError(f"{what} returned {out.dtype} values in a {dtype} recurrence: compute "
                        "in the parameters' floating type")
    return out


def _rows(output: Any, size: int) -> Any:
    """``output`` as integer rows of a state of ``size``, or ``ValueError`` naming the bad one."""
    rows = np.asarray(output)
    if rows.ndim != 1 or rows.size == 0 or rows.dtype.kind not in "iu":
        raise ValueError(f"output must be a non-empty list of state rows (integers), got "
                         f"{output!r}")
    bad = rows[(rows < 0) | (rows >= size)]
    if bad.size:
        raise ValueError(f"output row {int(bad[0])} is not a row of the state (0..{size - 1})")
    return rows


def _samples_first(a: Any, dtype: Any) -> Any:
    """A propop sequence ``(tau, k[, r])`` as a ``(tau, r, k)`` array of ``dtype``."""
    a = backend.astype(a, dtype)
    return a[:, None, :] if a.ndim == 2 else backend.namespace(a).permute_dims(a, (0, 2, 1))


def _samples_last(a: Any, like: Any) -> Any:
    """A ``(tau, r, k)`` array as a propop sequence shaped like ``like`` (vector or batch)."""
    if like.ndim == 2:
        return a[:, 0, :]
    return backend.contiguous(backend.namespace(a).permute_dims(a, (0, 2, 1)))


def _by_public_functions(graph: Any) -> Any:
    """A copy of a recorded graph calling ``torch.mm``, ``torch.add``, ... for its ATen ops.

    ``make_fx`` records each operation as its ATen overload (``aten.mm.default``),
    whose call parses the operator's schema: 1.5-2.0 us against 0.8-1.1 for the
    public function of the same name and arguments (one thread, 16 x 8 blocks), at
    every node of every step. An operation that ``torch`` has as a built-in function
    is called as that function (its Python binding takes the schema's arguments in
    their order and picks the overload by their types: ``aten.rsub.Scalar`` is
    ``torch.rsub``); the others (``aten.expand``, ``aten.split``, a Python function in
    ``torch``) stay. The caller compares the copy's result with ``vmap``'s; ``graph``
    itself is returned where no operation has a function.
    """
    import torch

    public = {}
    for node in graph.graph.nodes:
        namespace, _, rest = str(node.target).partition(".")
        function = getattr(torch, rest.partition(".")[0], None) if \
            node.op == "call_function" and namespace == "aten" else None
        if isinstance(function, types.BuiltinFunctionType):
            public[node.name] = function
    if not public:
        return graph
    copied = copy.deepcopy(graph)
    for node in copied.graph.nodes:
        node.target = public.get(node.name, node.target)
    copied.recompile()
    return copied
