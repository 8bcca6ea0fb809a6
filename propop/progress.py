"""Progress bars for long runs (tqdm, optional): shown when asked or when interactive.

``progress=True`` needs tqdm (``pip install "propop[progress]"``) and says so if it
is missing; ``"auto"`` shows a bar only when tqdm is installed and the session is
interactive (standard error is a terminal, or the code runs in a Jupyter kernel);
``False`` shows nothing. Solvers default to ``False``; long runs (training) to ``"auto"``,
which shows nothing in CI.
"""

from __future__ import annotations

import importlib.util
import sys
from typing import Any

__all__ = ["bar", "interactive", "Silent", "PROGRESS"]

PROGRESS = (True, False, "auto")


class Silent:
    """A bar that shows nothing (tqdm's interface, the parts propop uses)."""

    total: int | None = None

    def update(self, n: int = 1) -> None:
        """Do nothing."""

    def set_postfix_str(self, text: str) -> None:
        """Do nothing."""

    def close(self) -> None:
        """Do nothing."""

    def __enter__(self) -> Silent:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def interactive() -> bool:
    """Whether a person is watching: standard error is a terminal, or a Jupyter kernel runs."""
    return sys.stderr.isatty() or _in_kernel()


def _in_kernel() -> bool:
    """Whether this process is a Jupyter kernel (IPython's shell has a kernel).

    Not merely whether ``ipykernel`` was imported: a test process that imports it
    to run notebooks elsewhere is no kernel.
    """
    ipython = sys.modules.get("IPython")
    shell = getattr(ipython, "get_ipython", lambda: None)()
    return getattr(shell, "kernel", None) is not None


def bar(progress: bool | str, total: int | None, description: str) -> Any:
    """A tqdm bar of ``total`` steps, or a :class:`Silent` one; a context manager."""
    if progress not in PROGRESS:
        raise ValueError(f"progress must be one of {PROGRESS}, got {progress!r}")
    if progress is False:
        return Silent()
    installed = importlib.util.find_spec("tqdm") is not None
    if progress is True and not installed:
        raise ImportError("progress=True needs tqdm: pip install \"propop[progress]\"")
    if progress is False or not installed or (progress == "auto" and not interactive()):
        return Silent()
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=description, leave=False)
