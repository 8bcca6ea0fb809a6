"""The constants of ``method="auto"``'s cost model, measured once per machine.

:func:`calibrate` (``propop calibrate``) times the exact methods on a grid of
FNN and RNN backward systems (warm-up, then the median of 5), counts what each
did (:func:`propop.solvers.auto.work`), fits per method and family

    seconds = c_0 + c_step steps + c_flop flops + c_entry flops / n

by non-negative least squares on relative errors (:func:`scipy.optimize.nnls`)
and stores the constants as JSON: at ``$PROPOP_CALIBRATION`` if set, else
``$XDG_CONFIG_HOME/propop/calibration.json`` (``~/.config/propop/...``).
:func:`load` reads them; without a stored file it returns :data:`DEFAULT`,
constants measured on the development machine, and says so in ``source``.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import pathlib
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["Calibration", "calibrate", "load", "load_default", "path", "DEFAULT",
           "CHAIN_GRID", "TIME_GRID"]

FEATURES = ("1", "steps", "flops", "flops / n")
# (layers, width, samples) of the FNN systems and (hidden, samples, steps) of the RNN ones
CHAIN_GRID = ((16, 8, 1), (256, 8, 1), (2048, 8, 1), (64, 32, 1), (512, 32, 1), (32, 128, 1),
              (128, 128, 1), (16, 64, 32), (64, 32, 32), (256, 8, 32), (32, 128, 8))
TIME_GRID = ((8, 1, 512), (8, 1, 8192), (32, 1, 1024), (8, 8, 2048), (32, 8, 512),
             (20, 16, 1000))
QUICK = 3  # grid points per family of a quick calibration (tests)


@dataclass
class Calibration:
    """Constants of the cost model, per family (``"chain"``, ``"time"``) and method.

    Attributes
    ----------
    coefficients : dict
        ``{family: {method: [c_0, c_step, c_flop, c_entry]}}`` in seconds per unit.
    source : str
        Where the constants come from, for ``Solution.info["auto"]`` and messages.
    machine : dict
        The machine they were measured on.
    measurements : list of dict
        The timings they were fitted to, with the fitted prediction of each.
    """

    coefficients: dict[str, dict[str, list[float]]]
    source: str
    machine: dict = field(default_factory=dict)
    measurements: list = field(default_factory=list)

    def predict(self, family: str, method: str, features: Sequence[float]) -> float:
        """Predicted seconds of ``method`` on a system of ``family`` with these counts.

        A graph is not modelled (NaN): substitution is its only candidate.
        """
        constants = self.coefficients.get(family, {}).get(method)
        if constants is None:
            if family == "graph":
                return math.nan
            raise KeyError(f"the calibration ({self.source}) has no constants for {method!r} "
                           f"on {family} systems; run propop calibrate")
        return float(np.dot(constants, features))

    def to_json(self) -> str:
        """The calibration as JSON (what :func:`load` reads)."""
        return json.dumps({"features": FEATURES, "coefficients": self.coefficients,
                           "machine": self.machine, "measurements": self.measurements},
                          indent=1) + "\n"


def machine() -> dict:
    """What the constants depend on: the processor, its cores and the array library."""
    return {"machine": platform.machine(), "processor": platform.processor(),
            "cpu_count": os.cpu_count(), "numpy": np.__version__,
            "python": platform.python_version(),
            "measured": datetime.datetime.now(datetime.timezone.utc).isoformat(
                timespec="seconds")}


def path() -> pathlib.Path:
    """Where :func:`calibrate` stores and :func:`load` reads the constants."""
    given = os.environ.get("PROPOP_CALIBRATION")
    if given:
        return pathlib.Path(given).expanduser()
    config = os.environ.get("XDG_CONFIG_HOME") or pathlib.Path.home() / ".config"
    return pathlib.Path(config) / "propop" / "calibration.json"


# Measured by ``propop calibrate`` on the development machine (2-core x86_64 VM,
# NumPy 2 with OpenBLAS); used until this machine is calibrated.
DEFAULT: dict[str, dict[str, list[float]]] = {
    "chain": {
        "substitution": [3.07e-05, 1.77e-06, 4.14e-11, 0.0],
        "cyclic-reduction": [5.48e-05, 3.84e-05, 1.65e-11, 1.37e-09],
        "parallel-cyclic-reduction": [0.000127, 4.22e-06, 1.57e-11, 1.32e-09],
    },
    "time": {
        "substitution": [0.0, 3.1e-06, 3.19e-12, 3.29e-09],
        "cyclic-reduction": [0.0, 2.58e-05, 4.93e-11, 3.98e-09],
    },
}


def load_default() -> Calibration:
    """The development machine's constants (:data:`DEFAULT`).

    Examples
    --------
    >>> c = load_default()
    >>> c.predict("chain", "substitution", (1.0, 100.0, 1e6, 1e5)) > 0
    True
    """
    return Calibration({f: dict(m) for f, m in DEFAULT.items()},
                       "defaults measured on the development machine; run propop "
                       "calibrate for this one's")


_LOADED: dict[pathlib.Path, tuple[float, Calibration]] = {}


def load() -> Calibration:
    """Read this machine's constants from :func:`path` (:func:`load_default` if none are stored).

    Read once per file and modification time.

    Raises
    ------
    ValueError
        If the stored file is not a calibration (it names the file).
    """
    where = path()
    try:
        stamp = where.stat().st_mtime
    except FileNotFoundError:
        return load_default()
    cached = _LOADED.get(where)
    if cached is not None and cached[0] == stamp:
        return cached[1]
    try:
        stored = json.loads(where.read_text())
        coefficients = {family: {method: [float(c) for c in constants]
                                 for method, constants in methods.items()}
                        for family, methods in stored["coefficients"].items()}
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise ValueError(f"{where} is not a propop calibration ({error}); delete it or run "
                         "propop calibrate") from None
    if any(len(c) != len(FEATURES) for methods in coefficients.values()
           for c in methods.values()):
        raise ValueError(f"{where}: every method needs {len(FEATURES)} constants "
                         f"({', '.join(FEATURES)}); run propop calibrate")
    found = stored.get("machine", {})
    source = f"calibrated on {found.get('measured', 'an unknown date')} ({where})"
    if found.get("cpu_count") != os.cpu_count() or found.get("machine") != platform.machine():
        source += ", on another machine"
    calibration = Calibration(coefficients, source, found, stored.get("measurements", []))
    _LOADED[where] = (stamp, calibration)
    return calibration


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
    from .networks import FNN, RNN
    from .systems import backward_system

    rng = np.random.default_rng(0)
    out = []
    for layers, width, r in CHAIN_GRID[:QUICK] if quick else CHAIN_GRID:
        net = FNN.random([width] * (layers + 1), activation="tanh", seed=0)
        x = rng.standard_normal((width, r))
        out.append(("chain", f"FNN l={layers} n={width} r={r}",
                    backward_system(net, net.forward(x), rng.standard_normal((width, r)))))
    for hidden, r, tau in TIME_GRID[:QUICK] if quick else TIME_GRID:
        rnn = RNN.random([hidden, hidden], activation="tanh", seed=0)
        trace = rnn.forward(rng.standard_normal((tau, hidden, r)))
        out.append(("time", f"RNN H={hidden} r={r} tau={tau}",
                    backward_system(rnn, trace, rng.standard_normal(trace.output.shape))))
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
    from .progress import bar
    from .solvers import solve
    from .solvers.auto import CANDIDATES, work

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
