"""Feedforward networks (paper section 2.1) and their sequential reference propagation."""

from __future__ import annotations

import collections
import functools
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np
import scipy.sparse as sp

from .. import backend, memory
from .._checks import (canonical_matrix, float_dtype, positive_sizes, real_array,
                       require_density, require_finite, require_samples, require_shape)
from ..activations import Activation, get_activation
from ..losses import loss_gradient
from .trace import Gradients, Trace

__all__ = ["FNN", "column"]


def column(b: Any, like: Any) -> Any:
    """``b`` broadcastable against ``like``: a column ``(n, 1)`` when ``like`` is a batch."""
    return b if like.ndim == 1 else b[:, None]


def transposed(W: Any) -> Any:
    """``W^T``: a view of a dense matrix, a canonical CSR array of a sparse one."""
    if not backend.is_sparse(W):
        return W.T
    if isinstance(W, sp.csr_array) and W.has_canonical_format:
        return _csr_transposed(W)
    return canonical_matrix(W.T, "W^T")


# The transposed patterns of SciPy CSR weights, by their index arrays: the last used, at
# most this many bytes in all (about 20 a stored entry), each dropped with its arrays
_PATTERNS: collections.OrderedDict = collections.OrderedDict()
_KEPT_BYTES = 1 << 28
_GONE: list = []  # keys whose index arrays died: dropped at the next call, not in a callback


def _csr_transposed(W: sp.csr_array) -> sp.csr_array:
    """``W^T`` of a canonical CSR array: its pattern made once, its entries gathered now.

    The pattern (the entries' order, the transpose's indices) is found by ``W``'s
    index arrays and checked against their contents at every call, so indices written
    in place make it again; the entries are read at every call. SciPy's ``W.T.tocsr()``
    sorts the entries anew (109 against 36 us, 512 x 512 at density 0.1), at every
    call of a network whose weights a training step rebuilds on the same index arrays.
    """
    while _GONE:  # a finalizer only appends: it may run while the dict is iterated
        _PATTERNS.pop(_GONE.pop(), None)
    key = (id(W.indices), id(W.indptr), W.shape)
    kept = _PATTERNS.get(key)
    if kept is None or not (np.array_equal(kept[0], W.indices) and
                            np.array_equal(kept[1], W.indptr)):
        rows = np.repeat(np.arange(W.shape[0]), np.diff(W.indptr))
        order = np.argsort(W.indices, kind="stable")  # by column, then row: canonical
        counts = np.bincount(W.indices, minlength=W.shape[1])
        kept = _PATTERNS[key] = (W.indices.copy(), W.indptr.copy(), order, rows[order],
                                 np.concatenate([[0], np.cumsum(counts)]))
        weakref.finalize(W.indices, _GONE.append, key)  # gone with the weight's arrays
        while sum(a.nbytes for k in _PATTERNS for a in _PATTERNS[k]) > _KEPT_BYTES and \
                len(_PATTERNS) > 1:
            _PATTERNS.popitem(last=False)
    _PATTERNS.move_to_end(key)
    order, indices, indptr = kept[2:]
    T = sp.csr_array((W.data[order], indices.copy(), indptr.copy()),
                     shape=(W.shape[1], W.shape[0]))
    T.has_canonical_format = True
    return T


def _as_weight(W: Any, what: str) -> Any:
    """``W`` as a 2-D real matrix, sparse ones of any format as canonical CSR arrays."""
    return canonical_matrix(W, what)


def _as_biases(b: Sequence[Any] | None, weights: Sequence[Any], xp: Any) -> list:
    """The biases as real arrays (zeros if ``b`` is ``None``), as many as ``weights``."""
    if b is None:
        return [xp.zeros(Wk.shape[0], dtype=Wk.dtype, device=backend.device(Wk))
                for Wk in weights]
    if isinstance(b, (str, bytes)) or not isinstance(b, Sequence):
        raise ValueError("b must be a sequence of bias vectors, one per layer")
    if len(b) != len(weights):
        raise ValueError(f"got {len(weights)} weight matrices but {len(b)} biases")
    return [real_array(bk, f"layer {k}: b[{k}]") for k, bk in enumerate(b)]


def _float_dtype(arrays: Sequence[Any]) -> Any:
    """The common floating type of ``arrays``: float32 if all are, else float64."""
    be = backend.of(*arrays)
    if all(a.dtype == be.xp.float32 for a in arrays):
        return arrays[0].dtype
    return be.xp.float64 if be.name in ("torch", "array_api_strict") else np.dtype(np.float64)


class FNN:
    """A feedforward network ``y_k = W_k z_k + b_k``, ``z_{k+1} = f_k(y_k)`` (eq. def_forw_prop2).

    Parameters
    ----------
    W : sequence of arrays
        ``W[k]`` has shape ``(n_{k+1}, n_k)``; dense (NumPy/CuPy) or sparse
        (``scipy.sparse``, any format; stored as CSR). ``W[0]`` is the paper's ``W^(1)``.
    b : sequence of arrays, optional
        ``b[k]`` has shape ``(n_{k+1},)``; zeros if omitted.
    activation : str, Activation or sequence of them
        One for all layers, or one per layer.

    Examples
    --------
    >>> import numpy as np
    >>> net = FNN.random([3, 4, 2], activation="tanh", seed=1)
    >>> net.sizes, net.depth
    ((3, 4, 2), 2)
    >>> net.forward(np.ones(3)).output.shape
    (2,)
    """

    def __init__(self, W: Sequence[Any], b: Sequence[Any] | None = None,
                 activation: str | Activation | Sequence[str | Activation] = "tanh") -> None:
        if isinstance(W, (str, bytes)) or not isinstance(W, Sequence) or len(W) == 0:
            raise ValueError("W must be a non-empty sequence of weight matrices")
        weights = [_as_weight(Wk, f"layer {k}: W[{k}]") for k, Wk in enumerate(W)]
        be = backend.of(*weights)
        biases = _as_biases(b, weights, be.xp)
        self.dtype = _float_dtype(weights + biases)
        self.W = tuple(backend.astype(Wk, self.dtype) for Wk in weights)
        self.b = tuple(backend.astype(bk, self.dtype) for bk in biases)
        self.activations = self._activations(activation)
        self.backend = be
        self._validate()

    def _activations(self, spec: Any) -> tuple[Activation, ...]:
        if isinstance(spec, (str, Activation)):
            return (get_activation(spec),) * len(self.W)
        spec = list(spec)
        if len(spec) != len(self.W):
            raise ValueError(f"got {len(spec)} activations for {len(self.W)} layers")
        return tuple(get_activation(a) for a in spec)

    def _validate(self) -> None:
        for k, (Wk, bk) in enumerate(zip(self.W, self.b)):
            if k > 0 and Wk.shape[1] != self.W[k - 1].shape[0]:
                n = self.W[k - 1].shape[0]
                raise ValueError(f"layer {k}: W[{k}] has shape {Wk.shape}, expected "
                                 f"({Wk.shape[0]}, {n}) to follow layer {k - 1}'s width {n}")
            require_shape(bk, (Wk.shape[0],), f"layer {k}: b[{k}]", f" to match W[{k}]")
            require_finite(Wk, f"layer {k}: W[{k}]")
            require_finite(bk, f"layer {k}: b[{k}]")

    @property
    def sizes(self) -> tuple[int, ...]:
        """Widths ``(n_0, n_1, ..., n_l)``."""
        return self._shape()[0]

    def _shape(self) -> tuple:
        """``(sizes, sparse, equal widths)``: what the weights' shapes and kinds decide.

        Kept for the tuple :attr:`W` it was read from, and read again when ``W`` is
        rebound: values change in place (they are never kept), shapes and sparsity
        cannot.
        """
        kept = self.__dict__.get("_shape_of")
        if kept is None or kept[0] is not self.W:
            sizes = (self.W[0].shape[1],) + tuple(Wk.shape[0] for Wk in self.W)
            sparse = any(backend.is_sparse(Wk) for Wk in self.W)
            equal = not sparse and all(Wk.shape == (sizes[0],) * 2 for Wk in self.W)
            stack = backend.stack_of(self.W) if equal else None  # the weights' own memory
            kept = self.__dict__["_shape_of"] = (self.W, (sizes, sparse, equal, stack))
        return kept[1]

    @property
    def WT(self) -> tuple:
        """The transposed weights ``W[k]^T``: views of dense ones, CSR copies of sparse ones.

        Made at every call from the current entries: weights changed in place are
        always seen. Only a SciPy CSR weight's transposed pattern is kept, checked
        against its index arrays' contents at every call (:func:`transposed`).
        """
        return tuple(transposed(Wk) for Wk in self.W)

    @property
    def equal_widths(self) -> bool:
        """Whether all weights are dense and square of one width (layers then stack)."""
        return self._shape()[2]

    def stacks(self, transposed: bool = False) -> dict:
        """``{"W": (l, n, n), "b": (l, n)}`` stacked now, or empty; ``W^T`` if ``transposed``.

        Where :attr:`equal_widths`: chains then reduce without gathering their
        couplings block by block. Weights that are the entries of one stack (as
        :meth:`random` makes them) are read in place, ``W^T`` as a view of it;
        others are copied per call, ``W^T`` contiguous. Either way nothing derived
        from the weights is kept.
        """
        if not self.equal_widths:
            return {}
        return {"W": self.weight_stack(transposed), "b": self.backend.xp.stack(self.b)}

    def weight_stack(self, transposed: bool = False) -> Any:
        """The ``"W"`` of :meth:`stacks` alone (equal widths only): no stack of the biases."""
        xp, stack = self.backend.xp, self._shape()[3]
        if stack is not None:
            return xp.permute_dims(stack, (0, 2, 1)) if transposed else stack
        W = xp.stack(self.W)
        return backend.contiguous(xp.permute_dims(W, (0, 2, 1))) if transposed else W

    @property
    def depth(self) -> int:
        """Number of layers ``l``."""
        return len(self.W)

    @property
    def sparse(self) -> bool:
        """Whether any weight matrix is sparse."""
        return self._shape()[1]

    def __repr__(self) -> str:
        runs: list[list] = []  # the activations in layer order, repeats counted
        for a in self.activations:
            if runs and runs[-1][0] == a.name:
                runs[-1][1] += 1
            else:
                runs.append([a.name, 1])
        names = ", ".join(name if count == 1 else f"{name} x{count}" for name, count in runs)
        shown = names if len(runs) == 1 else f"[{names}]"
        return (f"FNN(sizes={self.sizes}, activation={shown}, dtype={self.dtype}, "
                f"sparse={self.sparse})")

    @classmethod
    def random(cls, sizes: Sequence[int],
               activation: str | Activation | Sequence[str | Activation] = "tanh",
               density: float = 1.0, seed: int | None = 0, dtype: Any = "float64",
               bias: float = 0.0, output_activation: str | Activation | None = None) -> FNN:
        """A random network whose signal neither explodes nor vanishes with depth.

        Entries of ``W[k]`` are normal with standard deviation
        ``gain / sqrt(n_k * density)`` (He/Xavier scaling with layer ``k``'s
        activation's gain, corrected for the expected number of non-zeros per row).

        Parameters
        ----------
        sizes : sequence of int
            Widths ``[n_0, ..., n_l]``, at least two.
        activation : str, Activation or sequence of them
            One activation for all layers (``"tanh"``, as :class:`FNN`), or one per layer.
        density : float in (0, 1]
            Fraction of non-zeros; below 1 the weights are ``scipy.sparse`` CSR arrays.
        seed : int or None
            Seed of ``numpy.random.default_rng``.
        dtype : {"float64", "float32"}
        bias : float
            Standard deviation of the biases (zero biases by default).
        output_activation : str or Activation, optional
            The last layer's, replacing ``activation``'s there (``"identity"``
            for logits, say).
        """
        sizes, dtype = positive_sizes(sizes), float_dtype(dtype)
        require_density(density)
        layers = len(sizes) - 1
        names = list(activation) if isinstance(activation, Sequence) and not isinstance(
            activation, str) else [activation] * layers
        if len(names) != layers:
            raise ValueError(f"{layers} layers need {layers} activations, got {len(names)}")
        if output_activation is not None:
            names[-1] = output_activation
        acts = [get_activation(a) for a in names]
        entries = sum(m * n for m, n in zip(sizes, sizes[1:])) * (1 if density == 1 else
                                                                  3 * density)
        memory.require_arrays(entries, dtype.itemsize, f"FNN.random of "
                              f"{layers} layers of widths up to {max(sizes)}",
                              "use fewer or narrower layers, or a lower density")
        rng = np.random.default_rng(seed)
        W, b = [], []
        for n_in, n_out, act in zip(sizes[:-1], sizes[1:], acts):
            std = act.gain / np.sqrt(n_in * density)
            W.append(_random_matrix(rng, (n_out, n_in), density, std, dtype))
            b.append((bias * rng.standard_normal(n_out)).astype(dtype))
        if density == 1 and len(set(sizes)) == 1:  # the entries of one stack (stacks())
            W, b = list(np.stack(W)), list(np.stack(b))
        return cls(W, b, acts)

    def to(self, kind: str, device: Any = None) -> FNN:
        """The same network with its arrays on backend ``kind``.

        ``kind`` is ``"numpy"``, ``"torch"`` or ``"cupy"``; ``device`` a PyTorch
        device such as ``"cuda"``.
        """
        return FNN([backend.convert(Wk, kind, device) for Wk in self.W],
                   [backend.convert(bk, kind, device) for bk in self.b], self.activations)

    def check_input(self, x: Any) -> Any:
        """Return ``x`` as an array of the network's dtype, or raise naming the problem."""
        x = real_array(x, "x", self.dtype)
        if x.ndim not in (1, 2) or x.shape[0] != self.sizes[0]:
            raise ValueError(f"x has shape {x.shape}, expected ({self.sizes[0]},) or "
                             f"({self.sizes[0]}, r): samples are columns")
        require_samples(x, "x")
        require_finite(x, "x")
        return x

    def to_graph(self) -> Any:
        """The same network as a :class:`~propop.Graph`: a chain of ``Dense`` and activations.

        Node names are ``fc0, act0, fc1, act1, ...``.
        """
        from .. import layers
        from .graph import Graph

        graph = Graph(self.sizes[0])
        for k, (Wk, bk, act) in enumerate(zip(self.W, self.b, self.activations)):
            graph.add(f"fc{k}", layers.Dense(Wk, bk)).add(f"act{k}", layers.Activation(act))
        return graph

    def forward(self, x: Any) -> Trace:
        """Sequential reference forward propagation (eq. def_forw_prop2).

        Parameters
        ----------
        x : array, shape (n0,) or (n0, r)
            Input; samples are columns.
        """
        x = self.check_input(x)
        states = 2 * sum(self.sizes) * (x.shape[1] if x.ndim == 2 else 1)
        memory.require_arrays(states, backend.itemsize(self.dtype),
                              f"the forward pass of {self.depth} layers",
                              "use a smaller batch, fewer layers or float32")
        if self.equal_widths:  # the states written into two stacked arrays
            return self._stacked_forward(x)
        z, y = [x], []
        for Wk, bk, f in zip(self.W, self.b, self.activations):
            y.append(Wk @ z[-1] + column(bk, z[-1]))
            z.append(f(y[-1]))
        return Trace(x=z[0], y=tuple(y), z=tuple(z))

    def _stacked_forward(self, x: Any) -> Trace:
        xp = self.backend.xp
        Y = xp.empty((self.depth,) + tuple(x.shape), dtype=self.dtype, device=backend.device(x))
        Z = xp.empty((self.depth + 1,) + tuple(x.shape), dtype=self.dtype,
                     device=backend.device(x))
        Z[0, ...] = x
        B = self._bias_stack()  # y_k = b_k first, every layer in one call, then W_k z_k added
        Y[...] = B if x.ndim == 1 else B[:, :, None]
        ys, zs = backend.unstack(Y), backend.unstack(Z)  # views, made once: the trace keeps them
        stack = self._shape()[3]
        add, weights = backend.matmul_adder(self.W if stack is None else stack)
        for Wk, write, y, z, z_next in zip(weights, self._writers, ys, zs, zs[1:]):
            add(Wk, z, out=y)
            write(y, out=z_next)
        return _stacked_trace(x, Y, Z, (ys, zs[1:]))

    def _bias_stack(self) -> Any:
        """The biases as one ``(l, n)`` array: their own memory where they are one stack's rows.

        Kept (the stack, not a copy) for the tuple :attr:`b` it was found for, as
        :meth:`_shape` keeps the weights'; other biases are stacked at every call.
        """
        kept = self.__dict__.get("_bias_stack_of")
        if kept is None or kept[0] is not self.b:
            kept = self.__dict__["_bias_stack_of"] = (self.b, backend.stack_of(self.b))
        return kept[1] if kept[1] is not None else self.backend.xp.stack(self.b)

    @functools.cached_property
    def _writers(self) -> tuple:
        """Each layer's in-place activation (:meth:`Activation.writer`), made once."""
        writers = {f: f.writer(self.backend.xp) for f in set(self.activations)}
        return tuple(writers[f] for f in self.activations)

    def backward(self, trace: Trace, eps: Any) -> list[Any]:
        """Sequential reference backward propagation (eq. def_back_prop2).

        Returns ``v[0..l]`` with ``v[l] = f'_l(y) * eps``,
        ``v[k] = f'_k(y) * (W[k]^T v[k+1])`` for ``k = 1..l-1``, ``v[0] = W[0]^T v[1]``.
        """
        eps = self.check_eps(trace, eps)
        depth, WT = self.depth, self.WT  # made once per call: WT is made at every access
        v = [None] * (depth + 1)
        v[depth] = self.activations[-1].df(trace.y[-1]) * eps
        for k in range(depth - 1, -1, -1):
            v[k] = WT[k] @ v[k + 1]
            if k > 0:
                v[k] *= self.activations[k - 1].df(trace.y[k - 1])
        return v

    def check_eps(self, trace: Trace, eps: Any) -> Any:
        """Return ``eps`` as an array of the output's shape and dtype, or raise."""
        eps = real_array(eps, "eps", self.dtype)
        require_shape(eps, trace.output.shape, "eps", " (the output's shape)")
        require_finite(eps, "eps")
        return eps

    def loss_gradient(self, trace: Trace, target: Any, loss: str = "mse",
                      reduction: str = "sum") -> Any:
        """``eps = dE/dz^(l)`` of this network's output (see :func:`propop.loss_gradient`)."""
        return loss_gradient(trace.output, target, loss, reduction)

    def unstack(self, system: Any, x: Any) -> Any:
        """Per-layer blocks (``v[0..l]`` or ``z[0..l]``) of a solution of its system.

        For equal widths one ``(l + 1, n[, r])`` array (a view), else a list.
        """
        if self.equal_widths:
            shape = (self.depth + 1, self.sizes[0]) + tuple(x.shape[1:])
            return self.backend.xp.reshape(x, shape)
        return system.split(x)

    def state_shapes(self, x: Any) -> tuple[list, list]:
        """Shapes of ``z[0..l]`` and ``y[0..l-1]`` of a forward pass of ``x``."""
        z = [(n,) + x.shape[1:] for n in self.sizes]
        return z, z[1:]

    def trace_from_states(self, x: Any, z: Sequence[Any] | None) -> Trace:
        """The trace whose ``y[k] = W[k] z[k] + b[k]`` comes from states ``z``.

        All layers at once (no sequential dependency); ``z = None`` means zeros.
        """
        xp = self.backend.xp
        x = self.check_input(x)
        if z is None:
            z = [x] + [xp.zeros((n,) + tuple(x.shape[1:]), dtype=self.dtype,
                                device=backend.device(x)) for n in self.sizes[1:]]
        if self.equal_widths:  # all layers in one batched product
            later = xp.stack(z[1:]) if isinstance(z, (list, tuple)) else z[1:, ...]
            Z = xp.concat([x[None, ...], later])
            stacks = self.stacks()
            if x.ndim == 1:  # one vector per layer: (l, n, n) @ (l, n, 1)
                return _stacked_trace(x, (stacks["W"] @ Z[:-1, :, None])[..., 0]
                                      + stacks["b"], Z)
            return _stacked_trace(x, stacks["W"] @ Z[:-1, ...] + stacks["b"][:, :, None], Z)
        y = [Wk @ zk + column(bk, x) for Wk, bk, zk in zip(self.W, self.b, [x] + list(z[1:-1]))]
        return Trace(x=x, y=tuple(y), z=tuple([x] + list(z[1:])))

    def restarted(self, trace: Trace) -> Trace | None:
        """``trace`` with the states whose next layer overflows, or that are not finite, zeroed.

        As :meth:`Graph.restarted <propop.Graph.restarted>`: a Newton iterate past the
        exact front can overshoot (an ``exp`` layer linearised at an unsettled input);
        those layers' inputs start again from zeros, and so do states so far from their
        layer's value that the gap overflows; the exact layers (gap zero) stay. ``None``
        where zeros do not mend it (the first layer overflows at the input itself).
        """
        xp = self.backend.xp
        z = [trace.x] + [a if backend.all_finite(a) else xp.zeros_like(a) for a in trace.z[1:]]
        while True:  # each pass zeros a non-zero state more: at most one a layer
            restarted = self.trace_from_states(trace.x, z)
            with backend.quiet(xp):
                values = [act(y) for act, y in zip(self.activations, restarted.y)]
                bad = next((k for k, f in enumerate(values) if not backend.all_finite(f)), None)
                far = [k + 1 for k, f in enumerate(values) if bad is None
                       and not backend.all_finite(z[k + 1] - f)]
            if bad is None and not far:
                return restarted
            if bad is not None and (bad == 0 or not bool(xp.any(z[bad]))):
                return None
            for k in far or [bad]:
                z[k] = xp.zeros_like(z[k])

    def gradients(self, trace: Trace, v: Sequence[Any]) -> Gradients:
        """Weight, bias and input gradients from the errors ``v``, summed over samples.

        Eqs. gradient_w_hidden_layer and gradient_b_hidden_layer.

        A sparse ``W[k]`` gets a sparse gradient on its own pattern.
        """
        blocks = len(v) if isinstance(v, (list, tuple)) else v.shape[0]  # a list or a stack
        if blocks != self.depth + 1:
            raise ValueError(f"v has {blocks} blocks, expected {self.depth + 1} (v[0..l])")
        if self.equal_widths:  # one batched product for all layers
            xp = self.backend.xp
            stacked = not isinstance(v, (list, tuple))
            V = v[1:, ...] if stacked else xp.stack(v[1:])
            x = v[0, ...] if stacked else v[0]
            Z = trace.stacked["z"][:-1, ...] if trace.stacked else xp.stack(trace.z[:-1])
            if V.ndim == 3 and V.shape[2] == 1:  # one sample as a column: as a vector
                V, Z = V[..., 0], Z[..., 0]
            if V.ndim == 2:  # outer products, no sum: half matmul's time (inner size 1)
                return Gradients(W=backend.unstack(backend.outer_products(V, Z)),
                                 b=backend.unstack(V), x=x)
            return Gradients(W=backend.unstack(V @ xp.permute_dims(Z, (0, 2, 1))),
                             b=backend.unstack(xp.sum(V, axis=2)), x=x)
        dW = tuple(backend.outer_on_pattern(Wk, vk, zk)
                   for Wk, vk, zk in zip(self.W, v[1:], trace.z[:-1]))
        db = tuple(vk if vk.ndim == 1 else self.backend.xp.sum(vk, axis=1) for vk in v[1:])
        return Gradients(W=dW, b=db, x=v[0])

    def slopes(self, trace: Trace) -> Any:
        """``f'_k(y_k)`` of every layer, indexed by ``k``.

        Where all layers share width and kind: one call, returned as the stacked
        ``(l, n[, r])`` array; otherwise a list of arrays.
        """
        first = self.activations[0]
        if self.equal_widths and self.activations.count(first) == self.depth:  # counted in C
            if trace.stacked and first.df_of_output is not None:  # z = f(y) is at hand
                return first.df_of_output(trace.stacked["z"][1:, ...])
            Y = trace.stacked["y"] if trace.stacked else self.backend.xp.stack(trace.y)
            return first.df(Y)
        return [act.df(y) for act, y in zip(self.activations, trace.y)]


def _stacked_trace(x: Any, Y: Any, Z: Any, views: tuple | None = None) -> Trace:
    """The trace whose layers are the slices of ``Y`` and ``Z`` (``z[0]`` is ``x`` itself).

    ``views``: the slices ``(Y[k]..., Z[1:][k]...)`` where the caller made them already.
    """
    ys, zs = views if views is not None else (backend.unstack(Y), backend.unstack(Z[1:, ...]))
    return Trace(x=x, y=tuple(ys), z=(x, *zs), stacked={"y": Y, "z": Z})


def _random_matrix(rng: np.random.Generator, shape: tuple[int, int], density: float,
                   std: float, dtype: Any) -> Any:
    if density == 1:
        return (std * rng.standard_normal(shape)).astype(dtype)
    M = sp.random_array(shape, density=density, format="csr", dtype=dtype, rng=rng,
                        data_sampler=lambda size: std * rng.standard_normal(size))
    M.sort_indices()
    return M
