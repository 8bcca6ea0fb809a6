"""Freed memory kept in the process: glibc's two thresholds, set while Python runs.

Every propop call returns new arrays and frees its temporaries, where a hand-written
loop writes into arrays it made once. On Linux, glibc gives freed heap memory back to
the system once more of it is free at the top of the heap than its *trim threshold*,
and maps arrays above its *mmap threshold* fresh (both adjusted as arrays are freed);
the next call faults that memory in again, a page at a time. In a loop of
``pp.backprop`` or ``pp.forward`` calls that is up to a quarter of a call's time
(``python -m benchmarks.fresh_memory``; the guide's "Calling propop in a loop").

The environment variables ``MALLOC_TRIM_THRESHOLD_`` and ``MALLOC_MMAP_THRESHOLD_``
change both, but only if set before Python starts; :func:`keep_freed` sets the same
through glibc's ``mallopt`` in a running process (a Jupyter kernel, a training script
that cannot restart itself). The setting is the whole process's, as the variables'
are: propop never makes it by itself, and memory that is kept is not given back to
the system until the process ends (what ``ps`` shows as its resident size stays at
its peak).

Examples
--------
>>> import propop as pp
>>> pp.allocator.keep_freed()  # doctest: +SKIP
True
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any

__all__ = ["keep_freed", "KEPT_TRIM_THRESHOLD", "KEPT_MMAP_THRESHOLD"]

# glibc's <malloc.h>: mallopt's parameters, and its defaults for both (128 KiB)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
DEFAULT_THRESHOLD = 128 * 1024
# kept: nothing given back below 2 GiB free (mallopt takes an int), and arrays up to
# 32 MiB from the heap (glibc's largest mmap threshold on 64-bit systems)
KEPT_TRIM_THRESHOLD = 2**31 - 1
KEPT_MMAP_THRESHOLD = 32 * 2**20


@functools.cache
def _glibc() -> Any:
    """The process's C library if it is glibc (it has ``gnu_get_libc_version``), else ``None``."""
    try:
        libc = ctypes.CDLL(None)
    except OSError:  # Windows: no process-wide namespace to open
        return None
    if not hasattr(libc, "gnu_get_libc_version") or not hasattr(libc, "mallopt"):
        return None  # macOS, musl, Windows: another allocator, other settings
    libc.mallopt.argtypes, libc.mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return libc


def keep_freed(keep: bool = True) -> bool:
    """Keep freed memory in the process (``keep``), or give it back at glibc's default.

    ``keep=True`` sets glibc's trim threshold to 2 GiB (``mallopt`` takes an ``int``;
    ``MALLOC_TRIM_THRESHOLD_=4000000000`` gives 4 GB, and either keeps all that a loop's
    calls free) and its mmap threshold to 32 MiB, as ``MALLOC_MMAP_THRESHOLD_=33554432``
    does at start: the heap keeps what a call frees for the next, and arrays up to
    32 MiB come from it (larger ones are mapped fresh whatever the setting).
    ``keep=False`` sets both to glibc's default, 128 KiB; glibc then no longer adjusts
    them as arrays are freed (any ``mallopt`` call ends that), so it gives memory back
    sooner than a process that never called this.

    Returns
    -------
    bool
        ``True`` once set; ``False`` where the C library is not glibc (macOS, Windows,
        musl), whose allocators have other settings: nothing was changed.

    Raises
    ------
    RuntimeError
        If glibc refuses a setting (``mallopt`` returned 0).
    """
    libc = _glibc()
    if libc is None:
        return False
    trim, mmap = ((KEPT_TRIM_THRESHOLD, KEPT_MMAP_THRESHOLD) if keep
                  else (DEFAULT_THRESHOLD, DEFAULT_THRESHOLD))
    for parameter, value, name in ((M_MMAP_THRESHOLD, mmap, "M_MMAP_THRESHOLD"),
                                   (M_TRIM_THRESHOLD, trim, "M_TRIM_THRESHOLD")):
        if libc.mallopt(parameter, value) != 1:
            raise RuntimeError(f"glibc's mallopt refused {name} = {value}")
    return True
