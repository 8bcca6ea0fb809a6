"""Measuring the constants of ``method="auto"``'s cost model on this machine.

:func:`calibrate` (``propop calibrate``) times the exact methods on a grid of
FNN and RNN backward systems and RNN forward systems (a Newton step's; warm-up,
then the median of 5), counts what each did
(:func:`propop.solvers.selection.auto.work`), fits per method and family

    seconds = c_0 + c_step steps + c_flop flops + c_entry flops / n

by non-negative least squares on relative errors (:func:`scipy.optimize.nnls`)
and stores the constants (:mod:`propop.solvers.selection.calibration`, which
``method="auto"`` reads).
"""

from __future__ import annotations

import os
import pathlib
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from .networks import FNN, RNN
from .progress import bar
from .solvers.plan import solve
from .solvers.selection.auto import CANDIDATES, work
from .solvers.selection.calibration import Calibration, machine, path
from .systems import backward_system, forward_system

__all__ = ["calibrate", "CHAIN_GRID", "TIME_GRID"]

# (layers, width, samples) of the FNN systems and (hidden, samples, steps) of the RNN ones
CHAIN_GRID = ((16, 8, 1), (256, 8, 1), (2048, 8, 1), (64, 32, 1), (512, 32, 1), (32, 128, 1),
              (128, 128, 1), (16, 64, 32), (64, 32, 32), (256, 8, 32), (32, 128, 8),
              (256, 4, 1), (1024, 4, 1))
TIME_GRID = ((8, 1, 512), (8, 1, 8192), (32, 1, 1024), (8, 8, 2048), (32, 8, 512),
             (20, 16, 1000))
QUICK = 3  # grid points per family of a quick calibration (tests)


def _median_seconds(function: Callable[[], Any], repeats: int = 5) -> float:
    function()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _systems(quick: bool) -> list[tuple[str, str, Any]]:
    """``(family, label, system)`` of the grid: backward systems of tanh networks."""
    rng = np.random.default_rng(0)
    out = []
    for layers, width, r in CHAIN_GRID[:QUICK] if quick else CHAIN_GRID:
        net = FNN.random([width] * (layers + 1), activation="tanh", seed=0)
        x = rng.standard_normal((width, r))
        out.append(("chain", f"FNN l={layers} n={width} r={r}",
                    backward_system(net, net.forward(x), rng.standard_normal((width, r)))))
    for hidden, r, tau in TIME_GRID[:QUICK] if quick else TIME_GRID:
        rnn = RNN.random([hidden, hidden], activation="tanh", seed=0)
        xs = rng.standard_normal((tau, hidden, r))
        trace = rnn.forward(xs)
        out.append(("time", f"RNN H={hidden} r={r} tau={tau}",
                    backward_system(rnn, trace, rng.standard_normal(trace.output.shape))))
        out.append(("time", f"RNN forward H={hidden} r={r} tau={tau}",  # a Newton step's
                    forward_system(rnn, xs, trace, linearization="newton")))
    return out


def _fit(rows: list[dict]) -> list[float]:
    """Non-negative constants minimising the relative errors of ``rows``' predictions."""
    from scipy.optimize import nnls

    A = np.array([row["features"] for row in rows], dtype=float)
    seconds = np.array([row["seconds"] for row in rows])
    scale = A.max(axis=0)
    scale[scale == 0] = 1.0
    constants, _ = nnls(A / scale / seconds[:, None], np.ones(len(rows)))
    return [float(c) for c in constants / scale]


def calibrate(output: str | os.PathLike | None = None, *, quick: bool = False,
              progress: bool | str = "auto") -> Calibration:
    """Time the exact methods on this machine, fit the cost model and store the constants.

    Parameters
    ----------
    output : path, optional
        Where to store them (default :func:`path`); ``load`` reads :func:`path`.
    quick : bool
        A few small systems only (seconds, for tests); the full grid takes about
        ten seconds on 2 cores.
    progress : {"auto", True, False}
        A bar over the systems (:mod:`propop.progress`).

    Returns
    -------
    Calibration
        With ``measurements``: every timing and its fitted prediction.
    """
    systems = _systems(quick)
    rows: list[dict] = []
    with bar(progress, len(systems), "calibrate") as shown:
        for family, label, system in systems:
            for method in CANDIDATES:
                counted = work(system, method)
                if counted is None:
                    continue
                seconds = _median_seconds(lambda m=method, s=system: solve(s, m, check=True))
                rows.append({"family": family, "system": label, "method": method,
                             "seconds": seconds, "features": list(counted.features())})
            shown.update()
    coefficients: dict[str, dict[str, list[float]]] = {}
    for family in ("chain", "time"):
        for method in CANDIDATES:
            mine = [row for row in rows if (row["family"], row["method"]) == (family, method)]
            if mine:
                coefficients.setdefault(family, {})[method] = _fit(mine)
    for row in rows:
        row["predicted"] = float(np.dot(coefficients[row["family"]][row["method"]],
                                        row["features"]))
    where = pathlib.Path(output).expanduser() if output is not None else path()
    calibration = Calibration(coefficients, f"calibrated now ({where})", machine(), rows)
    where.parent.mkdir(parents=True, exist_ok=True)
    where.write_text(calibration.to_json())
    return calibration
