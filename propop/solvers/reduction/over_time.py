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

import math
import dataclasses
import itertools
from collections.abc import Callable, Sequence
from typing import Any

from ... import backend
from ...systems.coefficients import DENSE
from ..direct.substitution import sweep
from . import odd_even
from .chain import Chain, Counter
from .segments import Across, expand, shifted

__all__ = ["OverTime", "WITHIN", "Layout"]

WITHIN = ("cyclic-reduction", "substitution")


class OverTime:
    """The two-level reduction of an RNN system split as a plan: the matrix once, then rhs.

    ``factor(chain, counter[, kernels])`` and ``substitute(levels, G, counter)`` are
    the two halves of odd-even cyclic reduction. Built on the system's canonical
    operator (any right-hand side), it reduces the layers' chain of every step
    for ``G_s`` (the stage 1 solve of ``D_s^{-1} G_s``), takes the carried rows
    as ``A_s`` and reduces the chain over time (stage 2's blocks);
    :meth:`solve` does the same for a right-hand side's ``c_s``, then stage 3.
    """

    def __init__(self, system: Any, factor: Callable, substitute: Callable,
                 counter: Counter, within: str) -> None:
        if within not in WITHIN:
            raise ValueError(f"within must be one of {WITHIN}, got {within!r}")
        self.layers, self.within, self.substitute = _LayerChain(system), within, substitute
        self.flip = not system.lower  # chain order over time: backward, last step first
        steps = range(self.layers.tau)
        names = _Steps(steps[::-1] if self.flip else steps)
        shared = self.layers.shared_core()
        if shared is not None:  # one layer, D_s = I: A_s = diag(L_s) M, one matrix M
            self.levels, self.inner, self.DG, self.depth = [], None, None, 0
            scales, M = shared
            xp = system.backend.xp
            kernels = odd_even.SharedCoreKernels(xp, M, self.layers.tau - 1)
            self.across = Across(xp.broadcast_to(M, (self.layers.tau, 1) + tuple(M.shape)),
                                 lambda chain, c: factor(chain, c, kernels), counter, names,
                                 None if scales is None else self._time_order(scales))
            return
        self.inner = self.layers.chain(counter)  # G: the across-step couplings, (m, b, n, w)
        if within == "cyclic-reduction":
            self.levels = factor(self.inner, counter)
        self.depth = (odd_even.depth(self.levels) if within == "cyclic-reduction"
                      else self.inner.C.shape[0])
        DG = self._inner_solve(self.inner.G, counter)
        self.inner = dataclasses.replace(self.inner, G=None)  # its blocks only are kept
        A = self.layers.carried(DG)
        # stage 3 reads D^{-1} G of the positions the next step does not read only
        self.DG = DG if self.layers.uncarried else None
        self.across = Across(self._time_order(A), factor, counter, names)

    def _inner_solve(self, G: Any, counter: Counter) -> Any:
        """``D^{-1} G`` for every step's layers: through the levels, or substitution.

        A step of one layer (:meth:`_LayerChain.shared_core`) has ``D_s = I``.
        """
        if self.inner is None:
            return G
        if self.within == "cyclic-reduction":
            return self.substitute(self.levels, G, counter)
        return _substitute(self.inner, G, counter)

    def _time_order(self, A: Any) -> Any:
        """``A`` (steps first) in the chain's order over time, or back: flipped if backward."""
        return backend.namespace(A).flip(A, axis=0) if self.flip else A

    def solve(self, system: Any, counter: Counter) -> tuple[Any, int, dict]:
        """``(x, levels, info)`` for ``system``'s right-hand side (canonical, ``(N, r)``)."""
        layers = self.layers
        rhs = layers.rhs_of(system)
        leading = layers.leading(rhs, counter)
        Dc = self._inner_solve(layers.rhs_column(rhs, leading, counter), counter)
        g = layers.carried(Dc)[..., 0]
        y = self.across.solve(self._time_order(g), self.substitute, counter)
        x = layers.solution(self.DG, Dc[..., 0], self._time_order(y), None if self.DG is None
                            else self._time_order(shifted(y)), leading, rhs, counter)
        inner = self.depth + layers.first  # the leading positions too
        time = odd_even.depth(self.across.levels)
        return x, inner + time, {"levels": {"layers": inner, "time": time},
                                 "within": self.within, "carried": layers.width}


def _substitute(chain: Chain, G: Any, counter: Counter) -> Any:
    """``x_k = diag(L_k) C_k x_{k-1} + G_k`` in chain order: block substitution's :func:`sweep`.

    ``G`` ``(m, b, n, w)`` holds ``w`` columns per batch entry; the cores
    ``(b | 1, n, n)`` broadcast over the batch.
    """
    xp = backend.namespace(G)
    X = xp.empty_like(G)
    m, b, n, w = G.shape
    counter.flops += max(m - 1, 0) * (2 * n * n + n) * b * w
    walk = backend.walk
    L = (chain.L[k, ...][..., None] for k in range(1, m))
    rows = itertools.chain([(X[0, ...], None, None, None, (), None, G[0, ...])],
                           zip(walk(X[1:, ...]), walk(chain.C), walk(X[:-1, ...]),
                               itertools.repeat(DENSE), itertools.repeat(()), L,
                               walk(G[1:, ...])))
    sweep(xp, rows)
    return X


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
        self.system = system
        self.scale = [self._columns(a) for a in system.periodic_scales(len(self.sizes))]

    def rhs_of(self, system: Any) -> list:
        """The right-hand side per layer, ``(tau r, h)`` each."""
        xp, per = system.backend.xp, len(self.sizes)
        R = xp.moveaxis(xp.reshape(system.rhs, (self.tau, sum(self.sizes), -1)), 2, 1)
        offsets = [sum(self.sizes[:k]) for k in range(per)]  # R: (tau, r, H)
        return [xp.reshape(R[:, :, o: o + h], (-1, h)) for o, h in zip(offsets, self.sizes)]

    def _follow(self, k: int, before: Any, rhs: list, counter: Counter) -> Any:
        """Layer ``k`` of every step from the layer it reads within the step, ``before``."""
        M = backend.dense(self.within[k].M)
        product = before @ M.T
        counter.flops += 2 * math.prod(product.shape) * M.shape[1]
        return (product if self.scale[k] is None else self.scale[k] * product) + rhs[k]

    def leading(self, rhs: list, counter: Counter) -> list:
        """The positions before ``first``, every step at once (they read no other step)."""
        values: list = []
        for k in self.order[: self.first]:
            values.append(rhs[k] if k not in self.within else
                          self._follow(k, values[-1], rhs, counter))
        return values

    @property
    def positions(self) -> list:
        """The layers of the reduced chain, ``first..kept-1``, in chain order."""
        return self.order[self.first: self.kept]

    def chain(self, counter: Counter) -> Chain:
        """The padded chain of positions ``first..kept-1`` with ``G`` the couplings across steps.

        ``G`` ``(m, tau r, n, width)``: column block ``o`` of position ``i`` holds
        ``s U`` for the carried layer at offset ``o`` that its layer reads.
        """
        system, xp = self.system, self.system.backend.xp
        n, b = max(self.sizes), self.tau * self.r
        m, device = len(self.positions), backend.device(system._scaled_rhs)
        L = xp.ones((m, b, n), dtype=system.dtype, device=device)
        C = xp.zeros((m, 1, n, n), dtype=system.dtype, device=device)
        G = xp.zeros((m, b, n, self.width), dtype=system.dtype, device=device)
        for i, k in enumerate(self.positions):
            h, s = self.sizes[k], self.scale[k]
            if s is not None:
                L[i, :, :h] = s
            if k in self.within:
                M = backend.dense(self.within[k].M)
                C[i, 0, : M.shape[0], : M.shape[1]] = M
            for t in (t for t in self.across if t.row == k):
                M, o = backend.dense(t.M), self.carried_offset[t.col]
                G[i, :, :h, o: o + M.shape[1]] = M[None, ...]
                if s is not None:  # scaled in place: no temporary as large as G
                    G[i, :, :h, o: o + M.shape[1]] *= s[:, :, None]
        return Chain(L, C[1:, ...], G, [f"block {k} of every step" for k in self.positions], ())

    def shared_core(self) -> tuple | None:
        """``(L, M)`` where every step's block over time is ``diag(L_s) M``, else ``None``.

        A step of one reduced layer (an RNN of one layer), carried, that the next step
        reads through one matrix ``M`` (``U``; backward its transpose) scaled by the
        layer's ``f'``: ``A_s = diag(f'_s) U`` needs no solve within the step and no
        dense block a step. ``L`` ``(tau, r, h)`` (``None`` for a linear layer), ``M``
        dense ``(h, h)``.
        """
        if len(self.positions) != 1:
            return None
        k = self.positions[0]
        reading = [t for t in self.across if t.row == k]
        if len(reading) != 1 or reading[0].col != k:
            return None
        s = self.scale[k]
        L = None if s is None else self.system.backend.xp.reshape(
            s, (self.tau, self.r, self.sizes[k]))
        return L, backend.astype(backend.dense(reading[0].M), self.system.dtype)

    def rhs_column(self, rhs: list, leading: list, counter: Counter) -> Any:
        """The chain's right-hand side ``(m, tau r, n, 1)``: each position's ``c``.

        The first position's takes the leading positions' values (a forward
        system's input layer) through its within-step coupling.
        """
        xp = self.system.backend.xp
        G = xp.zeros((len(self.positions), self.tau * self.r, max(self.sizes), 1),
                     dtype=self.system.dtype, device=backend.device(rhs[0]))
        for i, k in enumerate(self.positions):
            G[i, :, : self.sizes[k], 0] = rhs[k] if i or not self.first else self._follow(
                k, leading[-1], rhs, counter)
        return G

    def carried(self, Y: Any) -> Any:
        """The carried rows of ``Y`` ``(m, tau r, n, c)``, as ``(tau, r, width, c)``."""
        xp = self.system.backend.xp
        rows = [Y[self.order.index(k) - self.first, :, : self.sizes[k], ...]
                for k in self.carried_layers]
        Z = rows[0] if len(rows) == 1 else xp.concat(rows, axis=1)
        return xp.reshape(Z, (self.tau, self.r, self.width, Y.shape[-1]))

    @property
    def uncarried(self) -> list:
        """The reduced layers that the next step does not read (a step's inner layers)."""
        return [k for k in self.positions if k not in self.carried_offset]

    def solution(self, DG: Any, Dc: Any, y: Any, previous: Any, leading: list, rhs: list,
                 counter: Counter) -> Any:
        """``x = D^{-1} c + D^{-1} G y_prev`` in the system's layout ``(tau H, r)``.

        The carried layers are the chain's own unknowns ``y`` (``(tau, r, width)``, as
        ``previous``, which only the other layers read: ``None`` where there are none):
        their rows of that sum are the chain's equation, solved already.
        """
        xp = self.system.backend.xp
        own = xp.reshape(y, (-1, self.width))  # (b, width)
        prev = None if previous is None else xp.reshape(previous, (-1, self.width))
        x: list[Any] = [None] * len(self.sizes)
        for i, k in enumerate(self.order):
            h = self.sizes[k]
            if i < self.first:
                x[k] = leading[i]
            elif k in self.carried_offset:
                x[k] = own[:, self.carried_offset[k]: self.carried_offset[k] + h]
            elif i < self.kept:
                x[k] = expand(DG[i - self.first, :, :h, ...], Dc[i - self.first, :, :h], prev,
                              counter)
            else:
                x[k] = self._follow(k, x[self.order[i - 1]], rhs, counter)
        out = xp.reshape(xp.concat(x, axis=1), (self.tau, self.r, -1))
        return xp.reshape(xp.permute_dims(out, (0, 2, 1)), (-1, self.r))

    def _columns(self, scale: Any) -> Any:
        """A ``(tau, h[, r])`` scaling as ``(tau r, h)``; ``None`` stays ``None``."""
        if scale is None:
            return None
        xp = self.system.backend.xp
        if scale.ndim == 2:
            scale = scale[:, :, None]
        full = xp.broadcast_to(scale, tuple(scale.shape[:2]) + (self.r,))
        return xp.reshape(xp.permute_dims(full, (0, 2, 1)), (self.tau * self.r, scale.shape[1]))
