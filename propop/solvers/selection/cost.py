"""Work, time and memory of propagation (paper section 4), and the mini-batch correction.

``sizes = (n_0, ..., n_l)`` are the widths, ``W[k]`` has shape ``(n_{k+1}, n_k)``
(code indices), ``r`` is the batch size and ``gamma`` the cost of one activation
evaluation. Counts are in multiply-add pairs as the paper writes them (one
``n x n`` matrix-vector product costs ``n^2``); :func:`cyclic_reduction_flops`
and :func:`parallel_cyclic_reduction_flops` count floating-point operations the
way propop's solvers do (``2 n^3`` per block product), for comparison with
``Solution.info["flops"]``.

The correction: the paper's reduced blocks ``B`` and ``C`` are per *sample* in a
mini-batch, because they contain the sample's diagonal ``E^{-1}`` (or ``D^{-1}``)
between two weight matrices (docs/index.md, "The cost model"). The paper's ``O(l n^3 log l +
l n^2 r)`` for the direct method becomes ``O(r l n^3)`` work for a batch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = [
    "sequential_work", "direct_work", "direct_time", "recursive_direct_work",
    "recursive_direct_time", "iterative_work", "iterative_time", "sequential_memory",
    "direct_memory", "iterative_memory", "batched_direct_work",
    "cyclic_reduction_flops", "parallel_cyclic_reduction_flops",
]


def _pairs(sizes: Sequence[int]) -> list[tuple[int, int]]:
    return list(zip(sizes[:-1], sizes[1:]))


def sequential_work(sizes: Sequence[int], r: int = 1, gamma: float = 1.0) -> float:
    """``sum_k (n_{k+1} n_k + gamma n_{k+1}) r`` (eq. seqcomplexity)."""
    return sum((n_out * n_in + gamma * n_out) * r for n_in, n_out in _pairs(sizes))


def direct_work(sizes: Sequence[int], r: int = 1, gamma: float = 1.0) -> float:
    """One level of the paper's direct method (eq. parworkcomplexity).

    Forming every product of consecutive weights and its right-hand side,
    ``sum_k n_{k+1} n_k n_{k-1} + n_{k+1} n_k``, then two independent
    propagations through the modified weights of half the layers each.
    """
    n = list(sizes)
    build = sum(n[k + 1] * n[k] * n[k - 1] + n[k + 1] * n[k] for k in range(1, len(n) - 1))
    propagate = sum((n[k + 1] * n[k - 1] + gamma * n[k + 1]) * r
                    for k in range(1, len(n) - 1))
    return build + propagate


def direct_time(sizes: Sequence[int], r: int = 1, gamma: float = 1.0) -> float:
    """Time of one level on ``p = l`` processors (eq. partimecomplexity)."""
    n = list(sizes)
    build = max((n[k + 1] * n[k] * n[k - 1] + n[k + 1] * n[k] for k in range(1, len(n) - 1)),
                default=0)
    halves = [sum((n[k + 1] * n[k - 1] + gamma * n[k + 1]) * r
                  for k in range(start, len(n) - 1, 2)) for start in (1, 2)]
    return build + max(halves)


def recursive_direct_work(n: int, depth: int, r: int = 1) -> float:
    """``l n^3 log2 l + l n^2 r``: the recursive direct method, equal widths (section 4.1)."""
    return depth * n**3 * math.log2(max(depth, 2)) + depth * n**2 * r


def recursive_direct_time(n: int, depth: int, r: int = 1) -> float:
    """``n^3 log2 l + n^2 r`` on ``p = l`` processors (eq. recursive_complexity)."""
    return n**3 * math.log2(max(depth, 2)) + n**2 * r


def batched_direct_work(n: int, depth: int, r: int) -> float:
    """The corrected direct work for a batch: per-sample reduced blocks, ``r l n^3 + l n^2 r``.

    Work-efficient cyclic reduction forms about ``l`` block products in all
    (``l/2 + l/4 + ...``), each once per sample.
    """
    return r * depth * n**3 + depth * n**2 * r


def iterative_work(sizes: Sequence[int], r: int = 1, eta: int = 1, gamma: float = 1.0
                   ) -> float:
    """``eta`` matrix-vector products of the whole system (eq. parworkcomplexity_it)."""
    return sequential_work(sizes, r, gamma) * eta


def iterative_time(sizes: Sequence[int], r: int = 1, eta: int = 1, gamma: float = 1.0
                   ) -> float:
    """``eta max_k (n_{k+1} n_k + gamma n_{k+1}) r`` on ``p = l`` (eq. partimecomplexity_it)."""
    return eta * max((n_out * n_in + gamma * n_out) * r for n_in, n_out in _pairs(sizes))


def sequential_memory(sizes: Sequence[int], r: int = 1) -> int:
    """Entries of the vectors of a sequential pass, ``sum_k n_k r``."""
    return sum(sizes) * r


def direct_memory(sizes: Sequence[int], r: int = 1) -> int:
    """The paper's bound for the direct method: twice the sequential memory."""
    return 2 * sequential_memory(sizes, r)


def iterative_memory(sizes: Sequence[int], r: int = 1, delta: int = 7) -> int:
    """``delta l n r`` with ``2 <= delta <= 7`` work vectors (section 4.2)."""
    return delta * sequential_memory(sizes, r)


def _level_sizes(nblocks: int) -> list[int]:
    sizes, m = [], nblocks
    while m > 1:
        sizes.append(m)
        m = (m + 1) // 2
    return sizes


def cyclic_reduction_flops(sizes: Sequence[int], r: int = 1, shared: bool = False,
                           width: int | None = None) -> int:
    """Floating-point operations of propop's ``cyclic-reduction``, as it counts them.

    Widths are padded to ``n = max(sizes)`` (``width`` where the caller knows it).
    Per level with ``m`` unknowns: ``(m - 1) // 2`` block products (``b = 1`` core
    each if ``shared`` else ``r``) with their right-hand-side updates, and
    ``m // 2`` back-substitutions.
    """
    n, b = max(sizes) if width is None else width, 1 if shared else r
    total = 0
    for m in _level_sizes(len(sizes)):
        pairs, odd = (m - 1) // 2, m // 2
        total += pairs * (2 * b * n**3 + b * n * n + 2 * r * n * n + r * n)
        total += odd * (2 * r * n * n + r * n)
    return total


def parallel_cyclic_reduction_flops(sizes: Sequence[int], r: int = 1,
                                    shared: bool = False, width: int | None = None) -> int:
    """Floating-point operations of propop's ``parallel-cyclic-reduction`` (``width`` as there)."""
    n, b, m = max(sizes) if width is None else width, 1 if shared else r, len(sizes)
    total, shift = 0, 1
    while shift < m:
        total += (m - shift) * (2 * r * n * n + r * n)
        if 2 * shift < m:
            total += (m - 2 * shift) * (2 * b * n**3 + b * n * n)
        shift *= 2
    return total
