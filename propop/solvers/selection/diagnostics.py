"""Ahead-of-time facts about a system that predict how iterative methods behave.

- :func:`diagonal_dominance`: the paper's sufficient condition for Jacobi.
- :func:`nilpotency_index`: the index of the off-diagonal part, the number of
  iterations after which Jacobi and every Krylov method are exact.
- :func:`jacobian_decay`: how fast products of Jacobians shrink or grow, which
  decides whether a truncated iteration gives a useful approximate gradient.
- :func:`explain`: all three in plain words.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sys
from typing import TextIO

import numpy as np

from ... import backend
from .auto import choose

__all__ = ["Dominance", "diagonal_dominance", "nilpotency_index", "Decay", "jacobian_decay",
           "explain"]


@dataclass(frozen=True)
class Dominance:
    """Block-row diagonal dominance of a system (paper section 3.2).

    Attributes
    ----------
    ratios : tuple of float
        Per block row, ``max_i sum_j |A_ij| / |A_ii|`` over the off-diagonal
        entries (worst sample of a batch); 0 for rows without a coupling.
    dominant : bool
        Whether every ratio is below 1: then each Jacobi sweep contracts the
        error in the max-norm by at least ``max(ratios)``.
    """

    ratios: tuple
    dominant: bool

    def __str__(self) -> str:
        worst = int(np.argmax(self.ratios))
        verdict = "diagonally dominant" if self.dominant else "not diagonally dominant"
        return (f"{verdict}: worst block row {worst} with ratio {self.ratios[worst]:.3g}; "
                "Jacobi is exact after nblocks sweeps either way (nilpotent coupling)")


def _row_abs_sums(M: Any) -> Any:
    be = backend.of(M)
    sums = abs(M).sum(axis=1)
    return be.xp.asarray(sums.todense() if hasattr(sums, "todense") else sums).reshape(-1)


def diagonal_dominance(system: Any) -> Dominance:
    """Check the paper's sufficient condition for Jacobi, before solving.

    The ratio is the same in the scaled and the paper's form, ``|s_i| sum_j |M_ij|``.

    Examples
    --------
    >>> import numpy as np, propop as pp
    >>> net = pp.FNN([0.5 * np.eye(3)], activation="identity")
    >>> B = pp.backward_system(net, net.forward(np.ones(3)), np.ones(3))
    >>> pp.solvers.diagonal_dominance(B).dominant
    True
    """
    B = system.blocks
    totals: dict[int, Any] = {}
    for e in B.edges:
        sums = _row_abs_sums(e.matrix)
        sums = sums if e.scale is None else abs(e.scale) * (sums if e.scale.ndim == 1
                                                            else sums[:, None])
        totals[e.row] = totals.get(e.row, 0) + sums
    ratios = [0.0] * system.nblocks
    for row, sums in totals.items():
        d = B.diagonal[row]
        sums = sums if d is None else sums / abs(d)
        ratios[row] = float(backend.to_host(sums.max())) if sums.size else 0.0
    return Dominance(tuple(ratios), max(ratios) < 1)


def nilpotency_index(system: Any) -> int:
    """The smallest ``k`` with ``B^k = 0`` for the off-diagonal part ``B``.

    The number of blocks on the longest path of couplings: ``l + 1`` for an
    ``l``-layer FNN, ``tau + l`` for an RNN. Jacobi reaches the exact solution in
    this many sweeps and every Krylov method in at most this many iterations.

    Examples
    --------
    >>> import numpy as np, propop as pp
    >>> net = pp.FNN.random([4, 4, 4, 4], seed=0)
    >>> pp.solvers.nilpotency_index(pp.backward_system(net, net.forward(np.ones(4)), np.ones(4)))
    4
    """
    return len(system.blocks.levels)


@dataclass(frozen=True)
class Decay:
    """How products of Jacobians act: ``||B^k x|| / ||B^(k-1) x||`` for a random ``x``.

    Attributes
    ----------
    factors : tuple of float
        The growth of each application of ``B`` (worst sample).
    rate : float
        Their geometric mean: below 1 the products decay (vanishing gradients)
        and ``k`` Jacobi sweeps leave an error of about ``rate**k``; above 1 they
        grow and only the full ``nilpotency_index`` sweeps give a good answer.
    """

    factors: tuple
    rate: float

    def sweeps_for(self, error: float) -> int | None:
        """Jacobi sweeps for a relative error of about ``error``; ``None`` if not contractive."""
        if not self.rate < 1:
            return None
        return max(1, int(np.ceil(np.log(error) / np.log(max(self.rate, 1e-300)))))


def jacobian_decay(system: Any, steps: int = 20, seed: int = 0) -> Decay:
    """Estimate the decay of Jacobian products from ``steps`` applications of ``B``.

    ``B = I - A`` on the scaled form, applied to a random ``x`` on the blocks
    solved first (no incoming coupling: the output layer of a backward
    system): ``B^k x`` is then the product of ``k`` Jacobians along the
    chain. Stops early where ``B^k x`` vanishes.
    """
    system = system.scaled()
    xp = system.backend.xp
    rng = np.random.default_rng(seed)
    sources = {k for k in range(system.nblocks)} - {e.row for e in system.blocks.edges}
    x = xp.zeros_like(system.rhs)
    for k, part in enumerate(system.split(x)):
        if k in sources:
            part[...] = xp.asarray(rng.standard_normal(part.shape), dtype=system.dtype)
    norms = [_worst(x)]
    for _ in range(min(int(steps), nilpotency_index(system) - 1)):
        x = x - system.apply(x)
        norms.append(_worst(x))
        if norms[-1] == 0 or not np.isfinite(norms[-1]):
            break
    factors = tuple(b / a for a, b in zip(norms, norms[1:]) if a > 0)
    positive = [f for f in factors if f > 0 and np.isfinite(f)]
    rate = float(np.exp(np.mean(np.log(positive)))) if positive else 0.0
    return Decay(factors, rate)


def _worst(x: Any) -> float:
    """The largest column norm."""
    xp = backend.namespace(x)
    return float(backend.to_host(xp.max(xp.linalg.vector_norm(x, axis=0))))


def explain(system: Any, file: TextIO | None = None) -> str:
    """Print, in plain words, what to expect from iterative methods on ``system``.

    Returns the text as well.
    """
    index = nilpotency_index(system)
    dominance = diagonal_dominance(system)
    decay = jacobian_decay(system)
    sweeps = decay.sweeps_for(1e-3)
    shrink = f"products of Jacobians shrink by about {decay.rate:.3g} per block " \
        "(vanishing gradients): "
    if sweeps is None:
        regime = (f"products of Jacobians grow by about {decay.rate:.3g} per block "
                  "(exploding gradients): truncated iterations give poor approximations; "
                  "solve exactly")
    elif sweeps >= index:  # the estimate is no gain over the exact count
        regime = shrink + (f"a 1e-3 approximation would take about {sweeps} Jacobi sweeps, "
                           f"no fewer than the {index} that are exact: truncating saves "
                           "nothing here")
    else:
        regime = shrink + (f"about {sweeps} Jacobi sweeps give a 1e-3 approximate solution "
                           f"({index} are exact)")
    shared = ("one matrix for all samples: the block methods ('block-gmres', "
              "'block-bicgstab') apply" if system.shares_matrix else
              "one matrix per sample: use the batched methods ('batched-gmres', "
              "'batched-bicgstab') or a direct one")
    text = "\n".join([
        repr(system),
        f"- nilpotency index {index}: Jacobi and every Krylov method are exact after "
        f"{index} iterations (of {system.nblocks} blocks)",
        f"- {dominance}",
        f"- {regime}",
        f"- {shared}",
        f"- method='auto' takes {choose(system).reason}",
    ])
    print(text, file=file or sys.stdout)
    return text
