"""GRU and LSTM cells as ``torch.nn.GRU`` and ``torch.nn.LSTM`` compute them (optional: torch).

Each is a :class:`~propop.networks.recurrence.Recurrence` whose state is every
layer's state stacked (an LSTM's layer holds ``[h; c]``), whose step runs the
layers in order at one time step, and whose output is the top layer's ``h``;
``linearization="block-diagonal"`` keeps each layer's own block of the Jacobian.
Parameters carry PyTorch's names (``weight_ih_l0``, ``bias_hh_l1``, ...), so
``pp.state_dict`` and ``load_state_dict`` move them both ways. Equations
(PyTorch's documentation):

- GRU: ``r = s(W_ir x + b_ir + W_hr h + b_hr)``, ``z = s(W_iz x + b_iz + W_hz h + b_hz)``,
  ``n = tanh(W_in x + b_in + r * (W_hn h + b_hn))``, ``h' = (1 - z) * n + z * h``;
- LSTM: ``i, f, g, o`` from ``W_i x + b_i + W_h h + b_h`` (sigmoid, sigmoid,
  tanh, sigmoid), ``c' = f * c + i * g``, ``h' = o * tanh(c')``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from .. import backend, memory
from .._checks import positive_int
from .recurrence import Recurrence

__all__ = ["GRU", "LSTM", "ElmanRNN"]

# torch.gru / torch.rnn_tanh's options after the weights, as torch.nn.GRU passes them for one
# layer: has_biases, num_layers, dropout, train, bidirectional, batch_first
ONE_LAYER = (True, 1, 0.0, False, False, False)
# the most steps of one kernel call: cuDNN's RNN kernels refuse longer sequences with
# CUDNN_STATUS_NOT_SUPPORTED (pytorch/pytorch#133751; seen on an H200 at 65536 steps)
KERNEL_STEPS = 65535
# cuDNN's warning for weights that are not one buffer (the start of its message)
UNFLATTENED = "RNN module weights are not part of single contiguous chunk of memory"


def kernel(run: Callable, inputs: Any, hidden: Any, weights: list) -> Any:
    """``run``'s (``torch.gru``, ``torch.lstm``, ``torch.rnn_tanh``) outputs at every step.

    One layer over ``inputs`` ``(tau, r, m)`` from ``hidden`` (``(1, r, H)``, a pair for
    an LSTM), at most :data:`KERNEL_STEPS` steps a call, each call starting from the
    last one's final state: the same recurrence, on any sequence length.

    cuDNN copies weights that are not one contiguous buffer into one at every call
    and warns that ``flatten_parameters()`` would avoid it; propop's weights are
    its own tensors, not an ``nn.RNN``'s, so the user could not act on the warning:
    it is not shown (the copy is of one layer's weights, small beside the sequence).
    """
    outputs = []
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=UNFLATTENED, category=UserWarning)
        for start in range(0, max(inputs.shape[0], 1), KERNEL_STEPS):
            out, *last = run(inputs[start: start + KERNEL_STEPS], hidden, weights, *ONE_LAYER)
            outputs.append(out)
            hidden = last[0] if len(last) == 1 else tuple(last)
    return joined(outputs)


def joined(parts: list, dim: int = 0) -> Any:
    """``torch.cat(parts, dim)``, or the one part itself (a copy saved: one layer's case)."""
    import torch

    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=dim)


def elman_kernel(nonlinearity: str, inputs: Any, first: Any, weights: list) -> Any:
    """``h`` ``(tau, r, H)`` of one Elman layer by PyTorch's kernel (cuDNN's on CUDA).

    ``torch.rnn_tanh`` or ``rnn_relu`` from ``h_{-1} = first`` ``(r, H)`` on inputs
    ``(tau, r, m)``, ``weights`` ``[W_ih, W_hh, b_ih, b_hh]``; the initial state made
    contiguous, as cuDNN requires.
    """
    import torch

    run = torch.rnn_tanh if nonlinearity == "tanh" else torch.rnn_relu
    return kernel(run, inputs, first[None, ...].contiguous(), weights)


class _Gated(Recurrence):
    """Layers of one gated cell kind: :class:`GRU` (``gates = 3``) or :class:`LSTM` (``4``)."""

    gates = 0
    carries = 1  # state vectors per layer: h (GRU), h and c (LSTM)
    # the hidden size from which the Jacobians' stack is written C-ordered (_jacobian):
    # the more passes a cell makes over its blocks, the wider the rows-innermost layout
    # pays (measured on a batch's rows, one thread: the cells' own values below)
    narrow_below = 0

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1,
                 parameters: Mapping[str, Any] | None = None, seed: int | None = 0,
                 dtype: Any = "float64") -> None:
        input_size = positive_int(input_size, "input_size")
        self.hidden_size = positive_int(hidden_size, "hidden_size")
        self.num_layers = positive_int(num_layers, "num_layers")
        if parameters is None:
            parameters = self._random(input_size, seed)
        missing = [k for k in self._names() if k not in parameters]
        if missing:
            raise ValueError(f"{type(self).__name__} needs parameters {missing}")
        width = self.carries * self.hidden_size
        top = (self.num_layers - 1) * width
        shape = self._shape_only()
        super().__init__(shape._step, {k: parameters[k] for k in self._names()},
                         state_size=self.num_layers * width, input_size=input_size,
                         output=np.arange(top, top + self.hidden_size), block_size=width,
                         jacobian=shape._jacobian, dtype=dtype, batched=True,
                         jacobian_diagonal=shape._jacobian_diagonal, jacobian_batched=True)
        self.cell.remembers = True  # its step fills a memo its Jacobians read (_step)

    def _shape_only(self) -> _Gated:
        """A twin of this cell's kind holding its sizes and options alone, not its cell.

        Its step and Jacobians are bound to the twin: the cell that keeps them then
        keeps no path back to this network, which would otherwise sit in a reference
        cycle until the cyclic collector ran (one per ``propop.torch.GRU`` call).
        """
        twin = object.__new__(type(self))
        twin.__dict__.update(vars(self))  # the sizes and options set so far: no cell yet
        return twin

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.input_size}, {self.hidden_size}, "
                f"num_layers={self.num_layers})")

    @classmethod
    def from_torch(cls, module: Any, dtype: Any = "float64") -> _Gated:
        """The cell of a ``torch.nn.GRU`` or ``torch.nn.LSTM`` (unidirectional, no projection).

        The weights are copied as ``dtype`` (float64 by default, as :func:`propop.from_torch`).
        """
        if module.bidirectional or getattr(module, "proj_size", 0):
            raise ValueError(f"from_torch: {type(module).__name__} with bidirectional=True or "
                             "proj_size > 0 is not supported")
        parameters = {k: v.detach().double().cpu().numpy() for k, v in module.named_parameters()}
        for k in range(module.num_layers):  # bias=False: zero biases
            for side in ("ih", "hh"):
                parameters.setdefault(f"bias_{side}_l{k}",
                                      np.zeros(cls.gates * module.hidden_size))
        return cls(module.input_size, module.hidden_size, module.num_layers, parameters,
                   dtype=dtype, **cls._options_of(module))

    @classmethod
    def _options_of(cls, module: Any) -> dict:
        """The cell's own constructor options read from a ``torch.nn`` module (none)."""
        return {}

    def _names(self) -> list[str]:
        return [f"{kind}_{side}_l{k}" for k in range(self.num_layers)
                for kind in ("weight", "bias") for side in ("ih", "hh")]

    def _random(self, input_size: int, seed: int | None) -> dict:
        """PyTorch's initialisation: uniform in ``+-1/sqrt(hidden_size)``."""
        rng, bound, H = np.random.default_rng(seed), 1 / np.sqrt(self.hidden_size), \
            self.hidden_size
        memory.require_arrays(self.gates * H * (input_size + H + 2 * (self.num_layers - 1) * H),
                              8, f"{type(self).__name__} of {self.num_layers} layers of "
                              f"hidden size {H}", "use fewer or smaller layers")
        out = {}
        for k in range(self.num_layers):
            m = input_size if k == 0 else H
            for side, cols in (("ih", m), ("hh", H)):
                out[f"weight_{side}_l{k}"] = rng.uniform(-bound, bound, (self.gates * H, cols))
                out[f"bias_{side}_l{k}"] = rng.uniform(-bound, bound, self.gates * H)
        return out

    def _step(self, p: Mapping[str, Any], state: Any, x: Any, memo: list | None = None,
              inputs: dict | None = None) -> Any:
        """All layers at one time step: each reads the output of the one below.

        ``state`` and ``x`` are one sample's vectors or a batch's rows (``(r, n)``):
        a batch needs no ``vmap``, and its layers are computed feature-major
        (:func:`gates`, :meth:`_layer` on features first). ``memo``, a list, receives
        each layer's gate values (:meth:`_values`), which :meth:`_jacobian` and
        :meth:`_jacobian_diagonal` at the same rows then read instead of recomputing
        them: the Newton loop's residual and its next linearisation are at one point.
        ``inputs``, a dict kept for these rows' inputs ``x``, holds the first layer's
        input gates from the first step at them on (the inputs do not change between
        Newton iterates; the layers above read states, which do).
        """
        width, new = self.carries * self.hidden_size, []
        for k in range(self.num_layers):
            own = state[..., k * width: (k + 1) * width]
            values = self._values(p, k, x, own, inputs if k == 0 else None)
            if memo is not None:
                memo.append(values)
            layer = features_first(self._layer(values, features_first(own)))
            new.append(layer)
            x = layer[..., : self.hidden_size]
        return joined(new, -1)

    @property
    def memo_entries(self) -> int:
        """A row's entries of two trajectories' memos: at most both gates' products a layer.

        What :meth:`_activated` returns keeps at most ``gi`` and ``gh`` (``gates H``
        entries each) or arrays of their sizes alive; and the first layer's input
        gates, kept for the inputs (:meth:`_values`), once.
        """
        return (2 * self.num_layers * 2 + 1) * self.gates * self.hidden_size

    def _values(self, p: Mapping[str, Any], k: int, x: Any, own: Any,
                inputs: dict | None = None) -> tuple:
        """Layer ``k``'s gate values at input ``x`` and state ``own`` (rows, or vectors).

        Its gates' products (:func:`gates`) through the cell's activations
        (:meth:`_activated`), features first: all that its new state and its
        derivatives are made of. ``inputs``: where the input gates of ``x`` are kept
        (made there once; :meth:`_activated` reads them and never writes into them).
        """
        if inputs is None:
            gi = gates(p[f"weight_ih_l{k}"], p[f"bias_ih_l{k}"], x)
        else:
            gi = inputs.get("gates")
            if gi is None:
                gi = inputs["gates"] = gates(p[f"weight_ih_l{k}"], p[f"bias_ih_l{k}"], x)
        gh = gates(p[f"weight_hh_l{k}"], p[f"bias_hh_l{k}"], own[..., : self.hidden_size])
        return self._activated(gi, gh, features_first(own))

    def _states(self, X: Any) -> Any:
        """The sequential pass layer by layer, by PyTorch's own loop over the steps.

        Each layer's states at every step come from :meth:`_sequence`: the C++
        kernel ``torch.nn.GRU`` and ``torch.nn.RNN`` run (one layer at a time, so
        that every layer's states are kept), or ``torch.lstm_cell`` step by step
        for an LSTM, whose cell states ``torch.nn.LSTM`` does not return. The same
        function as :meth:`_step`, computed as PyTorch computes it.
        """
        import torch

        cell, r = self.cell, X.shape[1]
        p, width, H = cell.parameters, self.carries * self.hidden_size, self.hidden_size
        inputs = cell.tensor(X)
        shape = (1, r, self.state_size)  # h_{-1}: zeros, or the initial state
        start = cell.tensor(self._first(self._xp().empty(shape, dtype=self.dtype,
                                                          device=backend.device(X))))[0]
        layers = []
        with torch.no_grad():
            for k in range(self.num_layers):
                weights = [p[f"{kind}_{side}_l{k}"] for kind in ("weight", "bias")
                           for side in ("ih", "hh")]  # PyTorch's order: W_ih, W_hh, b_ih, b_hh
                layers.append(self._sequence(inputs, start[:, k * width: (k + 1) * width],
                                             weights))
                inputs = layers[-1][..., :H]
        return cell.home_array(joined(layers, -1))

    def _jacobian_diagonal(self, p: Mapping[str, Any], state: Any, x: Any,
                           memo: list | None = None) -> Any:
        """``diag(dF/dstate)`` of a batch's rows in closed form, ``(r, n)``: quasi-Newton's.

        The Jacobian is block lower triangular over layers, so its diagonal is each
        layer's own block's (:meth:`_layer_diagonal`); every gate's dependence on
        the state is a row scaling of a weight, whose diagonal is the weight's
        diagonal scaled: ``O(r n)`` a step beyond the step itself, no ``n x n``.
        ``memo``: the gate values :meth:`_step` kept at these rows, if any.
        """
        width, out = self.carries * self.hidden_size, []
        for k in range(self.num_layers):
            own = state[..., k * width: (k + 1) * width]
            values = memo[k] if memo else self._values(p, k, x, own)
            out.append(self._layer_diagonal(p, k, values, own))
            if k + 1 < self.num_layers:
                x = self._input_above(values, own)
        return joined(out, -1)

    def _jacobian(self, p: Mapping[str, Any], state: Any, x: Any,
                  memo: list | None = None) -> Any:
        """``dF/dstate`` of a batch's rows in closed form, ``(r, n, n)``: block lower triangular.

        Layer ``k``'s new state depends on its own state (``d_own``) and on its
        input, the new ``h`` of layer ``k - 1`` (``d_x``; the first layer's input is no
        state, so its ``d_x`` is not formed), whose own dependence on the layers
        below is the rows above (the chain rule). Written for a batch's rows
        ``(r, n)`` into one stack, block by block: each ``d_own`` in place, the blocks
        above the diagonal zeroed, nothing padded or concatenated (the stack is
        ``r n^2`` entries, the largest array here). ``memo``: the gate values
        :meth:`_step` kept at these rows, if any.
        """
        width, H = self.carries * self.hidden_size, self.hidden_size
        n, rows = state.shape[-1], state.shape[0]
        # a narrow cell's stack is written rows innermost, then made C-ordered: each
        # elementwise pass over (rows, n, n) with tiny n runs along the rows (H = 2,
        # 160000 rows: 0.3 against 11 ms a pass); from narrow_below on, the blocks are
        # long enough and the copy costs more than it saves (narrow_below's comments).
        # Blocks of at most 2 x 2 stay rows innermost: backend.block_matmul and cyclic
        # reduction's entrywise kernels read each entry as a plane (GRU H = 2, batch 16,
        # 10000 steps: its Newton forward 0.94x, one process, alternating)
        narrow = H < self.narrow_below
        J = (state.new_empty((n, n, rows)).permute(2, 0, 1) if narrow
             else state.new_empty((rows, n, n)))
        for k in range(self.num_layers):
            rows = slice(k * width, (k + 1) * width)
            J[..., rows, (k + 1) * width:] = 0  # no layer reads a later one's state
            own = state[..., rows]
            values = memo[k] if memo else self._values(p, k, x, own)
            d_x = self._layer_jacobian(p, k, values, own, J[..., rows, rows])
            if k:  # through the layer below's new h, whose rows of J are complete
                J[..., rows, : k * width] = d_x @ J[..., k * width - width:
                                                    k * width - width + H, : k * width]
            if k + 1 < self.num_layers:
                x = self._input_above(values, own)
        return J.contiguous() if narrow and n > 2 else J

    def _input_above(self, values: tuple, own: Any) -> Any:
        """The next layer's input, this layer's new ``h`` as rows, from its gate values.

        Formed only where a layer above reads it: the top layer's new state is no
        part of a Jacobian.
        """
        return features_first(self._layer(values, features_first(own)))[..., : self.hidden_size]


def gates(W: Any, b: Any, x: Any) -> Any:
    """``W x_s + b`` of every row ``s`` of ``x`` ``(rows, m)``, feature-major: ``(3H, rows)``.

    Each gate's rows are then one contiguous ``(H, rows)`` block: elementwise work on
    them runs at full speed where the columns of ``x W^T`` (stride ``3 H``) ran 5x
    slower for a narrow state (``H = 2``), and the product is one GEMM of that shape.
    One sample's vector ``x`` ``(m,)`` gives ``W x + b``.
    """
    import torch

    return torch.addmm(b[:, None], W, x.mT) if x.ndim == 2 else torch.addmv(b, W, x)


def features_first(a: Any) -> Any:
    """A batch's rows ``(r, n)`` as a feature-major view ``(n, r)``, and back; a vector stays."""
    return a.mT if a.ndim == 2 else a


def scaled_rows(c: Any, W: Any, out: Any = None) -> Any:
    """``diag(c_s) W`` for every row ``s``: ``c`` feature-major ``(H, rows)``, ``(rows, H, m)``."""
    import torch

    return torch.mul(c.mT[..., None], W, out=out)


def linear_scan(a: Any, b: Any, first: Any) -> Any:
    """``x_s = a_s * x_{s-1} + b_s`` for every step ``s`` (axis 0), ``x_{-1} = first``.

    The chain of diagonal blocks ``diag(a_s)`` reduced by propop's odd-even loop
    (:func:`~propop.solvers.reduction.odd_even.factor` and ``substitute``) on
    :class:`~propop.solvers.reduction.odd_even.DiagonalKernels`: ``log2 tau``
    whole-array levels, ``O(tau n)`` work, an overflowing product named.
    """
    from ..solvers.reduction import odd_even
    from ..solvers.reduction.chain import Chain, Counter

    xp, counter = backend.namespace(b), Counter()
    G = xp.concat([a[:1, ...] * first[None, ...] + b[:1, ...], b[1:, ...]])
    chain = Chain(None, a[1:, ...], None, range(a.shape[0]), ())  # no scalings: L is one
    kernels = odd_even.DiagonalKernels(xp)
    return odd_even.substitute(odd_even.factor(chain, counter, kernels), G, counter)


class GRU(_Gated):
    """A multi-layer GRU as ``torch.nn.GRU`` (time first, unidirectional), by its Jacobians.

    Parameters
    ----------
    input_size, hidden_size : int
    num_layers : int
    parameters : mapping, optional
        PyTorch's names and shapes (``weight_ih_l0`` ``(3 H, m)``, ...); default
        random as PyTorch initialises them.
    seed : int, optional
    dtype : {"float64", "float32"}
    """

    gates = 3
    narrow_below = 8  # H = 2: 21.3 -> 10.6 ms, 6: 5.8 -> 4.6, 8: 3.0 against 3.2, 12: 4.4 vs 5.8

    def _layer(self, values: tuple, own: Any) -> Any:
        """``(1 - z) n + z h``, ``n = tanh(i_n + r h_n)`` (:meth:`_activated`'s values).

        Features first (a vector, or feature-major rows ``(H, r)``, :func:`gates`).
        """
        import torch

        r, z, n, _ = values
        return torch.lerp(n, own, z)

    def _activated(self, gi: Any, gh: Any, own: Any) -> tuple:
        """``(r, z, n, h_n)`` from the gates, features first: ``r, z`` by one sigmoid."""
        import torch

        H = self.hidden_size
        (i_rz, i_n), (h_rz, h_n) = gi.split((2 * H, H)), gh.split((2 * H, H))
        r, z = (i_rz + h_rz).sigmoid_().chunk(2)
        return r, z, torch.addcmul(i_n, r, h_n).tanh_(), h_n

    def _sequence(self, inputs: Any, own: Any, weights: list) -> Any:
        """One layer's ``h`` at every step: ``torch.nn.GRU``'s kernel, ``(tau, r, H)``."""
        import torch

        return kernel(torch.gru, inputs, own[None, ...].contiguous(), weights)

    def _layer_jacobian(self, p: Mapping[str, Any], k: int, values: tuple, h: Any,
                        d_own: Any) -> Any:
        """``dh'/dx`` of layer ``k`` (the first: ``None``), ``dh'/dh`` into ``d_own``: the GRU's.

        Every gate reads its input through a row block of a weight, so each
        derivative is a sum over the gates of row-scaled blocks,
        ``diag(c_r) W_r + diag(c_z) W_z + diag(c_n) W_n``: the coefficients are
        vectors, and each block is read once (three products of the matrix's size,
        not nine), summed in place. ``h``: a batch's rows; the gate values
        (:meth:`_values`) feature-major, ``h'`` returned as rows.
        """
        import torch

        W_x, W_h = p[f"weight_ih_l{k}"], p[f"weight_hh_l{k}"]
        r, z, n, h_n = values
        h = h.mT
        # each a pass or two over (H, rows), in place where the operand is new:
        # dh'/d(i_n + r h_n) = (1 - z)(1 - n^2); s' = s - s^2 for r and z
        keep = 1 - z
        on_n = torch.addcmul(keep, keep * n, n, value=-1)
        via_r = (on_n * h_n).mul_(torch.addcmul(r, r, r, value=-1))
        via_z = (h - n).mul_(torch.addcmul(z, z, z, value=-1))

        def through(W: Any, c_n: Any, out: Any = None) -> Any:  # dh'/d(input of W): h or x
            W_r, W_z, W_n = W.chunk(3)
            d = scaled_rows(c_n, W_n, out)
            d.addcmul_(via_r.mT[..., None], W_r)
            return d.addcmul_(via_z.mT[..., None], W_z)

        through(W_h, on_n * r, d_own)  # h_n = W_hn h + b: r scales it
        torch.diagonal(d_own, dim1=-2, dim2=-1).add_(z.mT)  # h' = ... + z h
        return through(W_x, on_n) if k else None

    def _layer_diagonal(self, p: Mapping[str, Any], k: int, values: tuple, h: Any) -> Any:
        """``diag(dh'/dh)`` of layer ``k`` on rows: :meth:`_layer_jacobian`'s diagonal.

        Feature-major inside (the gate values, :meth:`_values`), returned as rows.
        """
        import torch

        W_h = p[f"weight_hh_l{k}"]
        r, z, n, h_n = values
        h = h.mT
        w_r, w_z, w_n = (torch.diagonal(W)[:, None] for W in W_h.chunk(3))
        d_n = (1 - n * n).mul_(torch.addcmul(r * w_n, h_n * torch.addcmul(r, r, r, value=-1),
                                             w_r))
        d = (1 - z).mul_(d_n).add_(z)  # (1 - z) d_n + z, then the z gate's part
        d.addcmul_((h - n).mul_(torch.addcmul(z, z, z, value=-1)), w_z)
        return d.mT


class LSTM(_Gated):
    """A multi-layer LSTM as ``torch.nn.LSTM`` (time first, unidirectional), by its Jacobians.

    Each layer's state is ``[h; c]``; the output is the top layer's ``h``.
    Parameters as :class:`GRU`'s, with ``4 H`` rows (gates ``i, f, g, o``).
    """

    gates = 4
    carries = 2
    narrow_below = 12  # H = 2: 10.3 -> 4.1 ms, 8: 18.5 -> 13.4, 12: 20.2 against 43.7

    def _layer(self, values: tuple, own: Any) -> Any:
        """``[h'; c']``: ``c' = s(f) c + s(i) tanh(g)``, ``h' = s(o) tanh(c')``.

        Features first (a vector, or feature-major rows ``(2 H, r)``), from
        :meth:`_activated`'s values.
        """
        import torch

        si, sf, tg, so, c, tc = values
        return torch.cat([so * tc, c])

    def _activated(self, gi: Any, gh: Any, own: Any) -> tuple:
        """:meth:`_activations` of the gates' sum and the cell state ``c`` (``own``'s rows H:)."""
        return self._activations(gi + gh, own[self.hidden_size:])

    def _activations(self, a: Any, c: Any) -> tuple:
        """``(s(i), s(f), tanh(g), s(o), c', tanh(c'))`` from the gates' sum ``a``, features first.

        Every gate's sigmoid in one call (``g``'s unused).
        """
        import torch

        H = self.hidden_size
        s = torch.sigmoid(a)
        si, sf, so, tg = s[:H], s[H: 2 * H], s[3 * H:], torch.tanh(a[2 * H: 3 * H])
        c_new = torch.addcmul(sf * c, si, tg)
        return si, sf, tg, so, c_new, torch.tanh(c_new)

    def _sequence(self, inputs: Any, own: Any, weights: list) -> Any:
        """One layer's ``[h; c]`` at every step, ``(tau, r, 2 H)``.

        ``h`` by ``torch.nn.LSTM``'s kernel, which returns no cell states; given
        every ``h``, each step's gates are known at once, and ``c_s = f_s c_{s-1} +
        i_s g_s`` is a linear recurrence with diagonal coefficients: a scan.
        """
        import torch

        H = self.hidden_size
        h0, c0 = own[:, :H].contiguous(), own[:, H:].contiguous()
        h = kernel(torch.lstm, inputs, (h0[None, ...], c0[None, ...]), weights)
        x, before = inputs.reshape(-1, inputs.shape[-1]), torch.cat([h0[None, ...], h[:-1, ...]])
        W_ih, W_hh, b = weights[0], weights[1], weights[2] + weights[3]

        def gate(rows: slice) -> Any:  # the gates of ``rows`` for every step, contiguous
            out = torch.addmm(b[rows], x, W_ih[rows, :].T)
            return out.addmm_(before.reshape(-1, H), W_hh[rows, :].T).reshape(
                h.shape[:2] + (-1,))

        i_f = gate(slice(0, 2 * H)).sigmoid_()  # i and f; o is not needed for c
        u = i_f[..., :H] * gate(slice(2 * H, 3 * H)).tanh_()
        return torch.cat([h, linear_scan(i_f[..., H:], u, c0)], dim=-1)

    def _layer_jacobian(self, p: Mapping[str, Any], k: int, values: tuple, own: Any,
                        d_own: Any) -> Any:
        """``d[h'; c']/dx`` of layer ``k`` (first: ``None``), ``d[h'; c']/d[h; c]`` in ``d_own``.

        ``own``: a batch's rows; the gate values (:meth:`_values`) feature-major.
        """
        import torch

        H = self.hidden_size
        c = own[..., H:].mT
        W_x, W_h = p[f"weight_ih_l{k}"], p[f"weight_hh_l{k}"]
        si, sf, tg, so, _, tc = values
        on_c = (so * (1 - tc * tc)).mT[..., None]  # dh'/dc'
        # each gate's row block of a weight, row-scaled by a vector: sum_g diag(c_g) W_g
        on_i, on_f, on_g = (tg * si * (1 - si)).mT[..., None], \
            (c * sf * (1 - sf)).mT[..., None], (si * (1 - tg * tg)).mT[..., None]
        on_o = (tc * so * (1 - so))

        def through(W: Any, into: Any) -> Any:  # d[h'; c']/d(input of W): h' rows, c' rows
            W_i, W_f, W_g, W_o = W.chunk(4)
            d_c = torch.mul(on_i, W_i, out=into[..., H:, :])
            d_c.addcmul_(on_f, W_f).addcmul_(on_g, W_g)
            scaled_rows(on_o, W_o, into[..., :H, :]).addcmul_(on_c, d_c)
            return into

        through(W_h, d_own[..., :H])
        keep = torch.diag_embed(sf.mT)  # dc'/dc, and dh'/dc = diag(dh'/dc') dc'/dc
        torch.mul(on_c, keep, out=d_own[..., :H, H:])
        d_own[..., H:, H:] = keep
        return through(W_x, own.new_empty(tuple(own.shape[:-1]) + (2 * H, H))) if k \
            else None  # the input of layer k > 0 is the new h below, H wide

    def _layer_diagonal(self, p: Mapping[str, Any], k: int, values: tuple, own: Any) -> Any:
        """``[diag(dh'/dh); diag(dc'/dc)]`` of layer ``k`` on rows."""
        import torch

        H = self.hidden_size
        c = own[..., H:].mT
        W_h = p[f"weight_hh_l{k}"]
        si, sf, tg, so, _, tc = values  # feature-major
        w_i, w_f, w_g, w_o = (torch.diagonal(W)[:, None] for W in W_h.chunk(4))
        d_c = c * (sf * (1 - sf)) * w_f + tg * (si * (1 - si)) * w_i + si * (1 - tg * tg) * w_g
        d_h = tc * (so * (1 - so)) * w_o + so * (1 - tc * tc) * d_c
        return torch.cat([d_h, sf]).mT


class ElmanRNN(_Gated):
    """A multi-layer Elman RNN as ``torch.nn.RNN`` computes it, by its Jacobians.

    ``h' = f(W_ih x + b_ih + W_hh h + b_hh)`` with ``f`` tanh or ReLU
    (``nonlinearity``); parameters as :class:`GRU`'s, with ``H`` rows. The same
    network as :class:`propop.RNN` (whose one bias is ``b_ih + b_hh``), as a
    recurrence: the cell of ``propop.torch.RNN``.
    """

    gates = 1
    narrow_below = 6  # H = 2: 8.3 -> 4.1 ms, 4: 3.1 -> 2.2, 6: equal, 8: 1.1 against 1.8

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1,
                 parameters: Mapping[str, Any] | None = None, seed: int | None = 0,
                 dtype: Any = "float64", nonlinearity: str = "tanh") -> None:
        if nonlinearity not in ("tanh", "relu"):
            raise ValueError(f"nonlinearity must be one of ('tanh', 'relu'), got {nonlinearity!r}")
        self.nonlinearity = nonlinearity
        super().__init__(input_size, hidden_size, num_layers, parameters, seed, dtype)

    def __repr__(self) -> str:
        return (f"ElmanRNN({self.input_size}, {self.hidden_size}, num_layers={self.num_layers}"
                f", nonlinearity={self.nonlinearity!r})")

    @classmethod
    def _options_of(cls, module: Any) -> dict:
        return {"nonlinearity": module.nonlinearity}

    def _activated(self, gi: Any, gh: Any, own: Any) -> tuple:
        """``(f(gi + gh),)``, entry by entry (any layout): the new state itself."""
        import torch

        return (torch.tanh(gi + gh) if self.nonlinearity == "tanh" else torch.relu(gi + gh),)

    def _layer(self, values: tuple, own: Any) -> Any:
        """The new state, :meth:`_activated`'s one value."""
        return values[0]

    def _sequence(self, inputs: Any, own: Any, weights: list) -> Any:
        """One layer's ``h`` at every step: ``torch.nn.RNN``'s kernel, ``(tau, r, H)``."""
        return elman_kernel(self.nonlinearity, inputs, own, weights)

    def _layer_jacobian(self, p: Mapping[str, Any], k: int, values: tuple, h: Any,
                        d_own: Any) -> Any:
        """``dh'/dx`` of layer ``k`` (the first: ``None``), ``dh'/dh`` in ``d_own``: ``f'(a) W``."""
        W_x, W_h = p[f"weight_ih_l{k}"], p[f"weight_hh_l{k}"]
        new = values[0]  # feature-major, (H, rows)
        slope = self._slope(new)
        scaled_rows(slope, W_h, d_own)
        return scaled_rows(slope, W_x) if k else None

    def _layer_diagonal(self, p: Mapping[str, Any], k: int, values: tuple, h: Any) -> Any:
        """``diag(dh'/dh)`` of layer ``k`` on rows: ``f'(a) diag(W_hh)``."""
        import torch

        W_h = p[f"weight_hh_l{k}"]
        new = values[0]  # feature-major
        return (self._slope(new) * torch.diagonal(W_h)[:, None]).mT

    def _slope(self, new: Any) -> Any:
        """``f'(a)`` from ``h' = f(a)``: ``1 - h'^2`` (tanh) or ``h' > 0`` (ReLU)."""
        return 1 - new * new if self.nonlinearity == "tanh" else (new > 0).to(new.dtype)

