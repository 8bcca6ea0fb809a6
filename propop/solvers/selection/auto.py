"""``method="auto"``: the exact method a calibrated cost model predicts to be fastest.

Written for propop (no library chooses among these methods). For each exact
method that applies to the system, :func:`work` counts from the shapes alone
what the method will do: its sequential steps (blocks for substitution, levels
for a reduction) and its floating-point operations (:mod:`propop.solvers.selection.cost`). The
predicted time is linear in those counts,

    seconds = c_0 + c_step steps + c_flop flops + c_entry flops / n,

with constants per method and per family of system ("chain": FNN-like
block bi-diagonal systems; "time": RNN systems), measured on the machine by
``propop calibrate`` (:mod:`propop.calibration`). ``flops / n`` counts the
entries a product of ``n x n`` blocks moves, which is what small blocks cost.
Methods the memory budget excludes (:mod:`propop.memory`), and reductions of
sparse couplings (fill-in decides their cost, which the shapes do not tell)
are left out, with the reason in ``Solution.info["auto"]``.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ... import memory

from . import cost
from .calibration import Calibration, load
from ..reduction import footprint
from ..method import Method
from ..registry import info, register
from ..solution import Solution
from ..reduction.over_time import Layout

__all__ = ["Work", "Choice", "work", "choose", "CANDIDATES"]

CANDIDATES = ("substitution", "cyclic-reduction", "parallel-cyclic-reduction")


@dataclass(frozen=True)
class Work:
    """What a method does on a system, counted from its shapes: the model's features."""

    family: str  # "chain" or "time"
    steps: int  # sequential steps: blocks (substitution) or levels (reductions)
    flops: float
    width: int  # the widest block, n

    def features(self) -> tuple[float, float, float, float]:
        """``(1, steps, flops, flops / n)``, in the order of the model's constants."""
        return 1.0, float(self.steps), float(self.flops), self.flops / max(self.width, 1)


@dataclass
class Choice:
    """The method ``auto`` picked, the predictions it compared and why others were left out."""

    method: str
    predicted: dict[str, float]
    excluded: dict[str, str] = field(default_factory=dict)
    calibration: str = ""

    @property
    def reason(self) -> str:
        """One sentence: the choice, the predicted times, what was excluded and why."""
        times = ", ".join(f"{m} {_ms(t)}" for m, t in sorted(self.predicted.items(),
                                                             key=lambda kv: kv[1]))
        text = f"{self.method}: predicted fastest ({times})"
        if self.excluded:
            text += "; left out: " + "; ".join(f"{m} ({why})" for m, why in
                                               self.excluded.items())
        return f"{text}; constants: {self.calibration}"

    def as_info(self) -> dict:
        """The choice as ``Solution.info["auto"]``."""
        return {"method": self.method, "predicted_seconds": dict(self.predicted),
                "excluded": dict(self.excluded), "calibration": self.calibration,
                "reason": self.reason}


def _ms(seconds: float) -> str:
    return "not modelled" if math.isnan(seconds) else f"{1e3 * seconds:.3g} ms"


def _levels(blocks: int) -> int:
    return math.ceil(math.log2(blocks)) if blocks > 1 else 0


def _chain_work(system: Any, method: str) -> Work:
    """Substitution, cyclic reduction and PCR of a dense chain (FNN systems)."""
    r = system.nrhs or 1
    return _chain_counts(method, tuple(system.sizes), r, r == 1 or system.shares_matrix)


@functools.lru_cache(maxsize=64)
def _chain_counts(method: str, sizes: tuple[int, ...], r: int, shared: bool) -> Work:
    """:func:`_chain_work` from the shapes alone, counted once for each.

    A training loop's every call asks for the same counts, whose loops were half of
    ``auto``'s choice.
    """
    width, nblocks = max(sizes), len(sizes)
    if method == "substitution":  # sum of n_k n_(k+1): n^2 (nb - 1) for equal widths
        products = float(np.dot(np.asarray(sizes[:-1], dtype=float), sizes[1:]))
        return Work("chain", nblocks, 2.0 * r * products, width)
    count = (cost.cyclic_reduction_flops if method == "cyclic-reduction"
             else cost.parallel_cyclic_reduction_flops)
    return Work("chain", _levels(nblocks), count(sizes, r, shared, width), width)


def _time_work(system: Any, method: str) -> Work:
    """Substitution over time and the two-level reduction of an RNN system.

    Substitution's steps are its per-step products (:func:`.substitution._time_rows`:
    the recurrent layers' terms, ``tau`` each; a forward system's hidden layer reads
    its input and the step before, two); the reduction's inner chain is the layers it
    reduces (a forward system's input layer leads, solved for all steps at once).
    """
    layout = Layout(system)
    tau, r, n, w = layout.tau, layout.r, max(layout.sizes), layout.width
    if method == "substitution":
        entries = sum(t.M.shape[0] * t.M.shape[1] for t in system.structure.templates)
        return Work("time", tau * _per_step_terms(system.layout), 2.0 * tau * r * entries, n)
    m, b = layout.kept - layout.first, tau * r
    inner = (m - 1) * (2 * b * n**3 + 4 * b * n * n * (w + 1))
    over_time = cost.cyclic_reduction_flops([w] * tau, r, shared=False)
    solution = 2 * b * sum(layout.sizes) * w
    return Work("time", _levels(m) + _levels(tau), inner + over_time + solution, n)


def _per_step_terms(layout: Any) -> int:
    """Products substitution makes at every step: the recurrent layers' terms (one at least)."""
    first, last = layout.recurrent
    recurrent = set(layout.step_order()[first:last])
    return max(1, sum(t.row in recurrent for t in layout.templates))


def work(system: Any, method: str) -> Work | None:
    """The model's counts for ``method`` on ``system``; ``None`` where it has none.

    Examples
    --------
    >>> import numpy as np, propop as pp
    >>> net = pp.FNN.random([8] * 9, activation="tanh", seed=0)
    >>> B = pp.backward_system(net, net.forward(np.ones(8)), np.ones(8))
    >>> work(B, "cyclic-reduction").steps, work(B, "substitution").steps
    (4, 9)
    """
    if system.structure is not None and not system.is_chain:
        return _time_work(system, method) if method in CANDIDATES[:2] else None
    if system.is_chain and method in CANDIDATES:
        return _chain_work(system, method)
    return Work("graph", system.nblocks, 0.0, system.width) if method == CANDIDATES[0] \
        else None


def _excluded(system: Any, method: str) -> str | None:
    """Why the model cannot rank ``method`` on ``system``, or ``None``."""
    if not info(method).applies_to(system):
        return "does not apply to this system"
    if method != "substitution" and system.structure is None and system.sparse_couplings:
        return ("sparse couplings: fill-in decides a reduction's cost; substitution keeps "
                "them sparse")
    return None


def _over_budget(system: Any, method: str) -> str | None:
    """Why ``method`` would exceed the memory budget (:mod:`propop.memory`), or ``None``."""
    if method == "substitution":
        return None
    peak = (footprint.time_cyclic_reduction(system, "cyclic-reduction")
            if system.structure is not None else
            footprint.dense_cyclic_reduction(system, False, method != "cyclic-reduction"))
    if memory.fits(peak):
        return None
    return f"needs about {peak / 2**20:.0f} MiB, over the memory budget"


def choose(system: Any, candidates: tuple[str, ...] = CANDIDATES,
           calibration: Calibration | None = None) -> Choice:
    """The candidate with the smallest predicted time on ``system``.

    Parameters
    ----------
    system : TriangularSystem
    candidates : tuple of str
        Exact methods to choose from (default: substitution, cyclic reduction, PCR).
    calibration : Calibration, optional
        The model's constants (default: :func:`propop.solvers.selection.calibration.load`).

    Returns
    -------
    Choice
        ``method``, the ``predicted`` seconds of every candidate, the ``excluded``
        ones with their reasons, and the ``reason`` in words.
    """
    unknown = [m for m in candidates if m not in CANDIDATES]
    if unknown or not candidates:
        raise ValueError(f"auto: candidates must be drawn from {CANDIDATES}, got "
                         f"{tuple(candidates)}")
    calibration = calibration or load()
    predicted, excluded = {}, {}
    for method in candidates:
        why = _excluded(system, method)
        if why is not None:
            excluded[method] = why
            continue
        counted = work(system, method)
        predicted[method] = calibration.predict(counted.family, method, counted.features())
    for method in sorted(predicted, key=predicted.__getitem__):  # memory: the fastest first
        why = _over_budget(system, method)
        if why is None:
            return Choice(method, predicted, excluded, calibration.source)
        excluded[method] = why
    # substitution fits any budget: only a caller's own candidates end here
    raise ValueError("auto: no candidate applies to this system: "
                     + "; ".join(f"{m}: {why}" for m, why in excluded.items()))


@register("auto", kind="direct", exact=True, native=True)
class Auto(Method):
    """The exact method predicted fastest for this system by the calibrated cost model.

    Parameters
    ----------
    rtol, atol
        Passed to the chosen method.
    candidates : tuple of str
        The methods to choose from; default substitution, cyclic reduction and
        parallel cyclic reduction, those that apply to the system.

    Notes
    -----
    ``info["auto"]`` holds the chosen ``method``, the ``predicted_seconds`` of
    every candidate, the ``excluded`` ones with their reasons, the source of the
    constants (``propop calibrate`` stores this machine's) and the ``reason`` in
    words; :func:`propop.solvers.explain` prints the same. The model and its
    constants: :mod:`propop.solvers.selection.auto`, :mod:`propop.calibration`.
    """

    def init(self, operator: Any, *, rtol: float | None = None, atol: float = 0.0,
             candidates: tuple[str, ...] = CANDIDATES) -> tuple:
        """Choose, then run the chosen method's ``init``."""
        choice = choose(operator, (candidates,) if isinstance(candidates, str)
                        else tuple(candidates))
        chosen = info(choice.method).method
        return choice, chosen, chosen.init(operator, rtol=rtol, atol=atol)

    def applies(self, state: tuple) -> bool:
        """Whether the chosen method applies the operator."""
        return state[1].applies(state[2])

    def compute(self, state: tuple, system: Any) -> Solution:
        """The chosen method's ``compute``; ``info["auto"]`` says what was chosen and why."""
        choice, chosen, inner = state
        solution = chosen.compute(inner, system)
        solution.info["auto"] = choice.as_info()
        return solution
