"""Data sets for training: scikit-learn's digits (shipped, no download), a sequence task.

Samples are columns, as everywhere in propop: ``x`` is ``(features, n)`` (or
``(tau, features, n)`` for sequences) and labels are ``(n,)`` integers.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["digits", "parity"]


def digits(test_fraction: float = 0.2, seed: int = 0) -> tuple:
    """The 8x8 digits (1797 images, 10 classes) scaled to ``[0, 1]``, shuffled and split.

    Returns ``(x_train, y_train, x_test, y_test)``: ``x`` of shape ``(64, n)``,
    labels of shape ``(n,)``. Needs scikit-learn (``pip install "propop[data]"``).
    """
    if not 0 <= test_fraction < 1:
        raise ValueError(f"test_fraction must lie in [0, 1), got {test_fraction}")
    try:
        from sklearn.datasets import load_digits
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise ImportError('digits() needs scikit-learn: pip install "propop[data]"') from error
    data = load_digits()
    order = np.random.default_rng(seed).permutation(len(data.target))
    x, y = data.data[order].T / 16.0, data.target[order].astype(int)
    cut = len(y) - int(round(test_fraction * len(y)))
    return x[:, :cut], y[:cut], x[:, cut:], y[cut:]


def parity(n: int, tau: int = 20, seed: int = 0) -> tuple[Any, Any]:
    """Bit streams and their running parity: ``x`` ``(tau, 1, n)``, targets ``(tau, 1, n)``.

    The target at step ``s`` is the parity of bits ``0..s`` (as 0 or 1), a task
    that needs memory over the whole sequence.
    """
    if n < 1 or tau < 1:
        raise ValueError(f"n and tau must be >= 1, got n={n}, tau={tau}")
    bits = np.random.default_rng(seed).integers(0, 2, size=(tau, 1, n)).astype(float)
    return bits, np.cumsum(bits, axis=0) % 2
