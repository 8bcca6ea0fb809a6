"""The constants of ``method="auto"``'s cost model: stored per machine, loaded once.

:func:`propop.calibration.calibrate` (``propop calibrate``) measures them and stores
them as JSON: at ``$PROPOP_CALIBRATION`` if set, else
``$XDG_CONFIG_HOME/propop/calibration.json`` (``~/.config/propop/...``).
:func:`load` reads them; without a stored file it returns :data:`DEFAULT`,
constants measured on the development machine, and says so in ``source``.
"""

from __future__ import annotations

import datetime
import functools
import json
import math
import os
import pathlib
import platform
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

__all__ = ["Calibration", "load", "load_default", "path", "machine", "DEFAULT", "FEATURES"]

FEATURES = ("1", "steps", "flops", "flops / n")


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
        return float(sum(c * f for c, f in zip(constants, features, strict=True)))

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
    return _path(os.environ.get("PROPOP_CALIBRATION"), os.environ.get("XDG_CONFIG_HOME"),
                 os.environ.get("HOME"))


@functools.lru_cache(maxsize=8)
def _path(given: str | None, config: str | None, home: str | None) -> pathlib.Path:
    """:func:`path` for these environment variables, built once for each.

    ``method="auto"`` asks for the path at every solve; building it was most of the
    choice's overhead.
    """
    if given:
        return pathlib.Path(given).expanduser()
    base = config or pathlib.Path.home() / ".config"
    return pathlib.Path(base) / "propop" / "calibration.json"


# Measured by ``propop calibrate`` on the development machine (2-core x86_64 VM,
# NumPy 2 with OpenBLAS, one thread; last on 2026-11-26, with RNN forward systems and
# width-4 chains in the grid, after the chain over time stopped multiplying by ones and
# the time layout's rows were zipped); used until this machine is calibrated.
DEFAULT: dict[str, dict[str, list[float]]] = {
    "chain": {
        "substitution": [0.000117, 1.45e-06, 2.36e-11, 2.08e-10],
        "cyclic-reduction": [0.000168, 5.63e-05, 2.77e-11, 1.81e-09],
        "parallel-cyclic-reduction": [0.000144, 3.36e-05, 3.21e-11, 1.53e-09],
    },
    "time": {
        "substitution": [9.23e-05, 1.71e-06, 0.0, 2.24e-09],
        "cyclic-reduction": [0.000567, 0.0, 0.0, 4.21e-09],
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
