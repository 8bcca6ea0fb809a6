"""Two-level cyclic reduction of RNN systems: over layers inside a step, then over time.

Written for propop (no library reduces these systems). An RNN system (eqs.
forw_prop_sys_rnn, back_prop_sys_rnn) is block bi-diagonal over time steps,
``D_s x_s = c_s + G_s x_{s -+ 1}``, whose diagonal blocks ``D_s`` (eqs.
forw_prop_sub_sys_rnn, back_prop_sub_sys_rnn: the layers of one step) are
themselves block bi-diagonal over layers and ``G_s`` holds the ``U`` couplings.
The paper (end of section 3.1) solves it in ``O(log l log tau)`` steps; here:

1. **Over layers** (``within``): ``Y_s = D_s^{-1} [G_s | c_s]`` for every step
   and sample at once, by cyclic reduction over the ``l`` hidden layers
   (``ceil(log2 l)`` levels, the paper's inner reduction) or by substitution
   (``l - 1`` levels, less work). Time and samples are batch axes. The input
   layer is not reduced: a forward system's is known and enters the first
   hidden layer's right-hand side (one product for all steps, one level more),
   a backward system's follows from the solution.
2. **Over time**: the carried layers (those the next step reads through ``U``)
   stacked into one dense block per step give the chain
   ``y_s = A_s y_{s -+ 1} + g_s``, ``A_s = (D_s^{-1} G_s)`` restricted to them;
   odd-even cyclic reduction solves it in ``ceil(log2 tau)`` levels.
3. ``x_s = D_s^{-1} c_s + D_s^{-1} G_s y_{s -+ 1}``: one batched product.

Stages 2 and 3 are :mod:`.segments`', shared with the groups of a graph and the
ranks of an MPI run.

Because the reduction of a bi-diagonal chain never changes its diagonal blocks,
``D_s^{-1}`` is needed once, not at every time level: the depth is
``ceil(log2 l) + ceil(log2 tau)`` (plus one for a forward system), within the
paper's product bound.
The price is the dense per-step blocks: ``O(tau r H^3)`` work for ``H`` carried
features, against the sequential ``O(tau r H^2)``, so this pays off only for
small widths and with parallel hardware.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ... import backend
from .chain import Chain, Counter, apply
from .segments import across, expand, relation

__all__ = ["reduce_over_time", "WITHIN", "Layout"]

WITHIN = ("cyclic-reduction", "substitution")


def reduce_over_time(system: Any, reduce: Any, counter: Counter, within: str
                     ) -> tuple[Any, int, dict]:
    """Solve an RNN system by the three stages of the module docstring.

    ``reduce(chain, counter)`` is odd-even cyclic reduction returning
    ``(X, levels)``; returns ``(x, levels, info)``.
    """
    if within not in WITHIN:
        raise ValueError(f"within must be one of {WITHIN}, got {within!r}")
    system = system.scaled()
    layers = _LayerChain(system)
    inner = layers.chain(counter)
    if within == "cyclic-reduction":
        Y, inner_levels = reduce(inner, counter)
    else:
        Y, inner_levels = _substitute(inner, counter), inner.G.shape[0] - 1
    inner_levels += layers.first  # the leading positions: one product each, all steps at once
    del inner
    A, g = layers.carried(Y)
    steps = slice(None, None, 1 if system.lower else -1)  # chain order over time
    previous, time_levels = across(A[steps], g[steps], reduce, counter,
                                   _Steps(range(A.shape[0])[steps]))
    del A, g
    x = layers.solution(Y, previous[steps], counter)
    levels = {"layers": inner_levels, "time": time_levels}
    return (x[:, 0] if system.nrhs is None else x), inner_levels + time_levels, {
        "levels": levels, "within": within, "carried": layers.width}


def _substitute(chain: Chain, counter: Counter) -> Any:
    """``x_k = diag(L_k) C_k x_{k-1} + G_k`` in chain order, one position at a time."""
    X = [chain.G[0]]
    for k in range(1, chain.G.shape[0]):
        X.append(apply(chain.L[k: k + 1], chain.C[k - 1: k], X[-1][None], counter)[0]
                 + chain.G[k])
    return backend.namespace(X[0]).stack(X)


class _Steps(Sequence):
    """The name of each chain position over time, made only when a message needs one."""

    def __init__(self, steps: range) -> None:
        self.steps = steps

    def __len__(self) -> int:
        return len(self.steps)

    def __getitem__(self, i: int) -> str:
        return f"step {self.steps[i]}"


class Layout:
    """The shape of the two-level reduction of an RNN system, from its structure alone.

    Position ``i`` of the layer chain is layer ``order[i]``; only the first
    ``kept`` positions, up to the last layer the recurrence involves, are
    reduced with matrix right-hand sides; ``carried_layers`` are the layers the
    next step reads, ``width`` their total size.
    """

    def __init__(self, system: Any) -> None:
        structure = system.structure
        self.sizes, self.tau = structure.sizes, structure.tau
        self.within = {t.row: t for t in structure.templates if t.offset == 0}
        self.across = [t for t in structure.templates if t.offset != 0]
        self.order = self._chain_order(system.lower)
        self.carried_layers = sorted({t.col for t in self.across})
        involved = set(self.carried_layers) | {t.row for t in self.across}
        self.kept = 1 + max((self.order.index(k) for k in involved), default=0)
        # positions before the first the recurrence involves (a forward system's input
        # layer) depend on their own step only: solved for all steps at once, not reduced
        self.first = min((self.order.index(k) for k in involved), default=0)
        self.carried_offset, width = {}, 0
        for k in self.carried_layers:
            self.carried_offset[k], width = width, width + self.sizes[k]
        self.width = width
        self.r = system.nrhs or 1

    def _chain_order(self, lower: bool) -> list:
        """Layer indices in chain order; a clear error if the step is no chain."""
        step = -1 if lower else 1
        if any(t.offset != step for t in self.across):
            raise ValueError("cyclic reduction over time needs every recurrent coupling to "
                             f"read the {'previous' if lower else 'next'} step")
        first = [k for k in range(len(self.sizes)) if k not in self.within]
        order = first[:1]
        while len(first) == 1 and len(order) < len(self.sizes):
            following = [k for k, t in self.within.items() if t.col == order[-1]]
            if len(following) != 1:
                break
            order.append(following[0])
        if len(order) != len(self.sizes):
            raise ValueError("cyclic reduction over time needs the layers of a step to form "
                             "a chain (one within-step coupling per layer but the first)")
        return order


class _LayerChain(Layout):
    """The layers of one step as a chain, batched over steps and samples (``b = tau r``).

    Position ``i`` of the chain is layer ``order[i]``; its core is the ``W``
    template reading the previous position, its scaling the layer's ``f'`` (or
    secant slope) per step and sample, and its right-hand side ``[G_s | c_s]``.
    The positions before ``first`` (the input layer of a forward system) are
    solved first, for all steps at once, and enter the right-hand side of
    position ``first``; the positions after ``kept`` (the input layer of a
    backward system) follow from the solution in one product each.
    """

    def __init__(self, system: Any) -> None:
        super().__init__(system)
        xp, per = system.backend.xp, len(self.sizes)
        self.system = system
        rhs = system.rhs if system.nrhs is not None else system.rhs[:, None]
        R = xp.moveaxis(rhs.reshape(self.tau, sum(self.sizes), self.r), 2, 1)  # (tau, r, H)
        offsets = [sum(self.sizes[:k]) for k in range(per)]
        self.rhs = [R[:, :, o: o + h].reshape(-1, h) for o, h in zip(offsets, self.sizes)]
        self.scale = [self._columns(a) for a in system.periodic_scales(per)]

    def _follow(self, k: int, before: Any, counter: Counter) -> Any:
        """Layer ``k`` of every step from the layer it reads within the step, ``before``."""
        M = backend.dense(self.within[k].M)
        product = before @ M.T
        counter.flops += 2 * product.size * M.shape[1]
        return (product if self.scale[k] is None else self.scale[k] * product) + self.rhs[k]

    def _leading(self, counter: Counter) -> list:
        """The positions before ``first``, every step at once (they read no other step)."""
        values: list = []
        for k in self.order[: self.first]:
            values.append(self.rhs[k] if k not in self.within else
                          self._follow(k, values[-1], counter))
        return values

    def chain(self, counter: Counter) -> Chain:
        """The padded chain of positions ``first..kept-1``, ``c = width + 1`` columns.

        Solves the positions before ``first`` on the way (:attr:`leading`, which
        :meth:`solution` reads).
        """
        system, xp = self.system, self.system.backend.xp
        n, b = max(self.sizes), self.tau * self.r
        positions = self.order[self.first: self.kept]
        m = len(positions)
        self.leading = self._leading(counter)
        L = xp.ones((m, b, n), dtype=system.dtype)
        C = xp.zeros((m, 1, n, n), dtype=system.dtype)
        G = xp.zeros((m, b, n, self.width + 1), dtype=system.dtype)
        for i, k in enumerate(positions):
            h, s = self.sizes[k], self.scale[k]
            G[i, :, :h, -1] = self.rhs[k] if i or not self.first else self._follow(
                k, self.leading[-1], counter)
            if s is not None:
                L[i, :, :h] = s
            if k in self.within:
                M = backend.dense(self.within[k].M)
                C[i, 0, : M.shape[0], : M.shape[1]] = M
            for t in (t for t in self.across if t.row == k):
                M, o = backend.dense(t.M), self.carried_offset[t.col]
                G[i, :, :h, o: o + M.shape[1]] = M[None] if s is None else s[:, :, None] * M
        return Chain(L, C[1:], G, [f"block {k} of every step" for k in positions], ())

    def carried(self, Y: Any) -> tuple[Any, Any]:
        """``A = (D^{-1} G)`` and ``g = (D^{-1} c)`` on the carried rows, ``(tau, r, ...)``."""
        xp = self.system.backend.xp
        rows = [Y[self.order.index(k) - self.first, :, : self.sizes[k]]
                for k in self.carried_layers]
        Z = (rows[0] if len(rows) == 1 else xp.concatenate(rows, axis=1)).reshape(
            (self.tau, self.r, self.width, self.width + 1))
        return relation(Z, slice(None))

    def solution(self, Y: Any, previous: Any, counter: Counter) -> Any:
        """``x = D^{-1} c + D^{-1} G y_prev`` in the system's layout ``(tau H, r)``."""
        xp = self.system.backend.xp
        prev = previous.reshape(-1, self.width)  # (b, width)
        x: list[Any] = [None] * len(self.sizes)
        for i, k in enumerate(self.order):
            h = self.sizes[k]
            if i < self.first:
                x[k] = self.leading[i]
            elif i < self.kept:
                x[k] = expand(Y[i - self.first, :, :h], prev, counter)
            else:
                x[k] = self._follow(k, x[self.order[i - 1]], counter)
        out = xp.concatenate(x, axis=1).reshape(self.tau, self.r, -1)
        return out.transpose(0, 2, 1).reshape(-1, self.r)

    def _columns(self, scale: Any) -> Any:
        """A ``(tau, h[, r])`` scaling as ``(tau r, h)``; ``None`` stays ``None``."""
        if scale is None:
            return None
        if scale.ndim == 2:
            scale = scale[:, :, None]
        full = scale if scale.shape[2] == self.r else scale.repeat(self.r, axis=2)
        return full.transpose(0, 2, 1).reshape(self.tau * self.r, scale.shape[1])
