"""Timing and reporting shared by the benchmarks: warm-up, median of >= 5, machine facts.

A benchmark writes its JSON and Markdown outside the repository (``$PROPOP_RESULTS``,
default ``<tmp>/propop-benchmarks``) unless run with ``--save``, which updates the
committed tables in ``benchmarks/results`` (the README's and the docs' source).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
import pyamg
import scipy

from propop.progress import bar

RESULTS = pathlib.Path(__file__).parent / "results"
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                    "XLA_FLAGS")


def timings(functions: dict[str, Callable[[], Any]], repeats: int = 7, warmup: int = 1,
            settle: bool = True) -> dict[str, dict[str, float]]:
    """``{name: {"median", "min", "max"}}`` wall-clock seconds over ``repeats`` rounds.

    The functions run in interleaved rounds after ``warmup`` calls each, so slow
    phases of a noisy machine hit every contender alike and ratios stay fair; each
    round in its own order (shuffled, seeded), so that no contender always follows
    the same neighbour: the memory a contender frees decides the page faults of the
    next (measured: one solve read 1.66x and 2.15x the same baseline at two places
    of a fixed order). With ``settle`` each timed call follows an untimed call of
    the same function, so that no contender pays for the caches and freed pages the
    one before it left (a 2 ms solve timed right after a 70 ms reduction takes
    twice as long).
    """
    if repeats < 5:
        raise ValueError(f"repeats must be >= 5 for a trustworthy median, got {repeats}")
    for function in functions.values():
        for _ in range(warmup):
            function()
    times: dict[str, list[float]] = {name: [] for name in functions}
    order, shuffle = list(functions.items()), random.Random(0).shuffle
    for _ in range(repeats):
        shuffle(order)
        for name, function in order:
            if settle:
                function()
            start = time.perf_counter()
            function()
            times[name].append(time.perf_counter() - start)
    return {name: {"median": statistics.median(t), "min": min(t), "max": max(t)}
            for name, t in times.items()}


def median_times(functions: dict[str, Callable[[], Any]], repeats: int = 7,
                 warmup: int = 1, settle: bool = True) -> dict[str, float]:
    """The medians of :func:`timings`."""
    return {name: t["median"] for name, t in
            timings(functions, repeats, warmup, settle).items()}


def threads() -> int:
    """The thread count every contender gets (``OMP_NUM_THREADS``, one by default).

    Sets PyTorch's where it is installed; BLAS and XLA read the environment
    (:mod:`benchmarks`).
    """
    count = int(os.environ.get("OMP_NUM_THREADS", "1"))
    try:
        import torch
    except ImportError:
        return count
    torch.set_num_threads(count)
    return count


def _blas() -> str:
    try:
        config = np.show_config(mode="dicts")
        blas = config["Build Dependencies"]["blas"]
        return f"{blas.get('name')} {blas.get('version')}"
    except (TypeError, KeyError):
        return "unknown"


def environment() -> dict[str, Any]:
    """The machine, thread settings and library versions of this run."""
    return {
        "machine": f"{platform.machine()} {platform.processor() or platform.system()}",
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "threads": {name: os.environ.get(name, "unset") for name in THREAD_VARIABLES},
        "python": platform.python_version(),
        "numpy": np.__version__,
        "blas": _blas(),
        "scipy": scipy.__version__,
        "pyamg": pyamg.__version__,
        **{name: _version(name) for name in ("torch", "jax")},
    }


def cpu_model(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The processor's model name and widest vector unit (AVX-512 or AVX2), where Linux says.

    Ratios against compiled code (JAX, DEER's XLA program) move with the processor:
    the same code read DEER at 0.97x and 0.60x the NumPy loop on two such machines.
    """
    try:
        text = pathlib.Path(cpuinfo).read_text()
    except OSError:
        return platform.processor() or "unknown"
    fields = {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in
                                                    text.split("\n\n")[0].splitlines())}
    name, flags = fields.get("model name", "unknown"), set(fields.get("flags", "").split())
    unit = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"
    return f"{name}, {unit}"


def _version(module: str) -> str:
    """A package's version, or "not installed"."""
    try:
        from importlib.metadata import version

        return version(module)
    except Exception:
        return "not installed"


def describe(env: dict[str, Any]) -> str:
    """One line for a table caption."""
    threads = ", ".join(f"{k}={v}" for k, v in env["threads"].items())
    cpu = f" ({env['cpu']})" if env.get("cpu") else ""  # runs saved before it was recorded
    return (f"{env['machine']}{cpu}, {env['cpu_count']} cores ({threads}); "
            f"Python {env['python']}, "
            f"NumPy {env['numpy']} ({env['blas']}), SciPy {env['scipy']}, "
            f"PyAMG {env['pyamg']}, PyTorch {env.get('torch', '?')}, JAX {env.get('jax', '?')}")


def arguments(name: str) -> argparse.ArgumentParser:
    """The command line of ``python -m benchmarks.<name>``, with ``--save``."""
    parser = argparse.ArgumentParser(prog=f"python -m benchmarks.{name}")
    parser.add_argument("--save", action="store_true",
                        help="update the committed tables in benchmarks/results")
    return parser


def destination() -> pathlib.Path:
    """``benchmarks/results`` with ``--save`` on the command line, else outside the tree."""
    if "--save" in sys.argv[1:]:
        return RESULTS
    return pathlib.Path(os.environ.get("PROPOP_RESULTS")
                        or pathlib.Path(tempfile.gettempdir()) / "propop-benchmarks")


def save(name: str, rows: list[dict[str, Any]], table: str) -> pathlib.Path:
    """Write ``<name>.json`` (rows and environment) and ``<name>.md`` to :func:`destination`."""
    folder = destination()
    folder.mkdir(parents=True, exist_ok=True)
    env = environment()
    (folder / f"{name}.json").write_text(json.dumps({"environment": env, "rows": rows},
                                                    indent=2, default=str) + "\n")
    path = folder / f"{name}.md"
    path.write_text(f"{table}\n\nMeasured on {describe(env)}.\n")
    return path


def publish(name: str, rows: list[dict[str, Any]], table: str) -> None:
    """Print ``table`` and save it with ``rows`` (:func:`save`), saying where."""
    print(table)
    print(f"written to {save(name, rows, table)}")


def pyplot() -> Any:
    """``matplotlib.pyplot`` drawing to files (Agg), or ``None`` without matplotlib."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def each(items: Iterable[Any], description: str) -> Iterator[Any]:
    """``items`` one by one, with a progress bar when run in a terminal."""
    items = list(items)
    with bar("auto", len(items), description) as shown:
        for item in items:
            yield item
            shown.update()


def by_kind(rows: list[dict[str, Any]], titles: Iterable[tuple[str, str]]
            ) -> Iterator[tuple[str, list[dict[str, Any]], list[str]]]:
    """``(title, rows, contenders)`` for each ``(kind, title)`` with rows, in that order.

    The rows are those of that ``kind``; the contenders the keys of their ``seconds``.
    """
    for kind, title in titles:
        chosen = [row for row in rows if row["kind"] == kind]
        if chosen:
            yield title, chosen, list(chosen[0]["seconds"])
