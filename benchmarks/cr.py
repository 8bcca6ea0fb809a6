"""Cyclic reduction against the hand-written NumPy loop on a CPU (issue 3's grid).

For each FNN backward system: the time of ``cyclic-reduction``,
``parallel-cyclic-reduction``, ``substitution`` and ``scipy.spsolve_triangular``
relative to the loop ``v = f'(y) * (W^T v)``, all measured in one run (warm-up,
median of 5 round-robin rounds), the solves on a prebuilt system. The flop ratio
(counted by the solver, against the loop's ``2 nnz(W) r`` per layer) explains
who wins: reduction pays ``n^3`` per block product (``r`` of them per pair for a
batch) where the loop pays ``n^2 r``. The loop is given ``f'(y)`` ready, as the
solvers are. Peak memory is the weights plus the solve's peak allocation
(tracemalloc), relative to the same for ``substitution``: the paper's accounting
for its "at most twice the memory" claim.

Then the block products alone (``chain.product`` on one level's stacked pairs)
against this machine's DGEMM rate, measured in the same run, beside NumPy's own
``matmul`` of the same blocks (scaled already) and propop's ``backend.block_matmul``:
blocks of 8 to 32 are far from DGEMM's rate whoever multiplies them (a BLAS call per
block, or per pair where the right block is shared), and the product adds the
scaling (a chunk of pairs at a time, in a buffer that stays in the cache, where the
scaled blocks exceed ``backend.SCALED_CHUNK``).

Run: ``python -m benchmarks.cr`` (a few minutes on 2 cores).
"""

from __future__ import annotations

import functools
import time
import tracemalloc

import numpy as np
import scipy.sparse as sp

import propop as pp
from propop.solvers.selection import cost

from .common import each, median_times, save
from .baselines import TightBackward
from .substitution import derivatives

GRID = [(4096, 8, 1), (1024, 32, 1), (256, 128, 1), (64, 256, 32)]
METHODS = ["substitution", "cyclic-reduction", "parallel-cyclic-reduction",
           "scipy.spsolve_triangular"]
SKIP_FLOPS = 3e11  # methods predicted above this many flops are not run
SKIP_SECONDS = 30.0  # nor those whose warm-up run took longer


def diagonal_net(depth: int, width: int) -> pp.FNN:
    """Diagonal weights: products of Jacobians stay diagonal."""
    rng = np.random.default_rng(0)
    W = [sp.diags_array(rng.uniform(0.5, 1.5, width)).tocsr() for _ in range(depth)]
    return pp.FNN(W, [0.1 * rng.standard_normal(width) for _ in range(depth)], "tanh")


def predicted_flops(method: str, sizes: tuple, r: int) -> float:
    """Flops a reduction will count, from the cost model (0 for the others)."""
    if method == "cyclic-reduction":
        return cost.cyclic_reduction_flops(sizes, r, shared=r == 1)
    if method == "parallel-cyclic-reduction":
        return cost.parallel_cyclic_reduction_flops(sizes, r, shared=r == 1)
    return 0.0


def _nbytes(W) -> int:
    """Bytes of a dense or sparse weight matrix."""
    return W.data.nbytes + W.indices.nbytes + W.indptr.nbytes if sp.issparse(W) else W.nbytes


def peak_bytes(function) -> int:
    """Peak bytes allocated while ``function`` runs (tracemalloc)."""
    tracemalloc.start()
    function()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak


def measure(label: str, net: pp.FNN, r: int) -> list[dict]:
    """One row per method for the backward system of ``net`` with batch ``r``."""
    rng = np.random.default_rng(1)
    width = net.sizes[0]
    trace = net.forward(rng.standard_normal((width, r)))
    eps = rng.standard_normal((net.sizes[-1], r))
    system = pp.backward_system(net, trace, eps)
    loop_flops = 2 * r * sum(Wk.nnz if sp.issparse(Wk) else Wk.size for Wk in net.W)
    slopes = derivatives(net, trace)  # the loop gets f'(y) ready, as the solvers do
    loop = TightBackward(net.W, r)
    reference = np.concatenate(loop(slopes, eps))
    contenders = {"loop": lambda: loop(slopes, eps)}
    skipped = {}
    for method in METHODS:
        flops = predicted_flops(method, net.sizes, r)
        if flops > SKIP_FLOPS:
            skipped[method] = f"not run: {flops:.1e} flops predicted"
            continue
        start = time.perf_counter()
        pp.solve(system, method)  # warm-up (builds the explicit matrix where needed)
        seconds = time.perf_counter() - start
        if seconds > SKIP_SECONDS:
            skipped[method] = f"not repeated: {seconds:.0f} s for one run"
            continue
        contenders[method] = (lambda m=method: pp.solve(system, m))
    times = median_times(contenders, repeats=5, warmup=0)
    weights = sum(_nbytes(Wk) for Wk in net.W)  # held by every method: the paper counts them
    base_memory = weights + peak_bytes(lambda: pp.solve(system, "substitution"))
    rows = []
    for method in METHODS:
        row = {"case": label, "l": net.depth, "n": width, "r": r, "method": method,
               "loop_ms": 1e3 * times["loop"]}
        if method in skipped:
            rows.append(dict(row, note=skipped[method]))
            continue
        sol = pp.solve(system, method)
        error = np.linalg.norm(sol.x - reference) / np.linalg.norm(reference)
        rows.append(dict(
            row, ms=1e3 * times[method], ratio=times[method] / times["loop"],
            levels=sol.levels, error=float(error),
            flop_ratio=sol.info.get("flops", 0) / loop_flops,
            memory_ratio=(weights + peak_bytes(lambda m=method: pp.solve(system, m)))
            / base_memory))
    return rows


PRODUCTS = [(8, 1, 2048), (32, 1, 512), (128, 1, 128), (32, 32, 128)]  # (n, r, pairs)


def dgemm_rate(n: int = 1024) -> float:
    """The DGEMM rate here, flop/s: the median of 5 products of two ``n x n`` matrices."""
    rng = np.random.default_rng(0)
    A, B = rng.standard_normal((n, n)), rng.standard_normal((n, n))
    times = median_times({"dgemm": lambda: A @ B}, repeats=5)
    return 2 * n**3 / times["dgemm"]


def product_rates() -> list[dict]:
    """Cyclic reduction's block products (``chain.product``, one level's pairs) against DGEMM.

    ``r > 1``: per-sample blocks, as a batch's reduction forms them (a per-sample
    left core scaled by the next position's per-sample slopes, times a shared core).
    Beside each, NumPy's own ``matmul`` of the same blocks, already scaled: the rate
    a batched product of blocks this size reaches here, whoever calls it.
    """
    from propop import backend
    from propop.solvers.reduction.chain import Counter, product

    peak, rng, rows = dgemm_rate(), np.random.default_rng(1), []
    for n, r, pairs in PRODUCTS:
        L1, L2 = (rng.standard_normal((pairs, r, n)) for _ in range(2))
        C1, C2 = rng.standard_normal((pairs, r, n, n)), rng.standard_normal((pairs, 1, n, n))
        left = C1 * L2[:, :, None, :]
        seconds = median_times({"product": functools.partial(product, L1, C1, L2, C2,
                                                             Counter()),
                                "matmul": functools.partial(np.matmul, left, C2),
                                "block_matmul": functools.partial(backend.block_matmul,
                                                                  left, C2)},
                               repeats=5)
        flops = 2 * pairs * r * n**3
        rate = (flops + pairs * r * n * n) / seconds["product"]
        rows.append({"n": n, "r": r, "pairs": pairs, "gflops": rate / 1e9,
                     "dgemm_gflops": peak / 1e9, "of_dgemm": rate / peak,
                     "matmul_gflops": flops / seconds["matmul"] / 1e9,
                     "block_matmul_gflops": flops / seconds["block_matmul"] / 1e9})
    return rows


def product_table(rows: list[dict]) -> str:
    """The block products' rates as a Markdown table, DGEMM's in the heading."""
    lines = [f"**Block products** (`chain.product`, one level's pairs) against this machine's "
             f"DGEMM (1024 x 1024: {rows[0]['dgemm_gflops']:.1f} GFLOP/s), and NumPy's "
             "`matmul` and propop's `block_matmul` of the same blocks, scaled already",
             "", "| n | r | pairs | GFLOP/s | of DGEMM | matmul alone | block_matmul alone |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {row['n']} | {row['r']} | {row['pairs']} | {row['gflops']:.1f} | "
              f"{100 * row['of_dgemm']:.0f}% | {row['matmul_gflops']:.1f} | "
              f"{row['block_matmul_gflops']:.1f} |" for row in rows]
    return "\n".join(lines)


def cases():
    """The grid, dense and at density 0.05, then the diagonal-weight case."""
    for depth, n, r in GRID:
        for density in (1.0, 0.05):
            label = f"{'dense' if density == 1 else 'density 0.05'}"
            yield label, pp.FNN.random([n] * (depth + 1), activation="tanh", density=density,
                                       seed=0), r
    yield "diagonal W", diagonal_net(65536, 8), 1


def table(rows: list[dict]) -> str:
    """The rows as a Markdown table."""
    lines = ["| case | l | n | r | method | time [ms] | vs NumPy loop | levels | flops / loop's "
             "| memory / substitution's | error |",
             "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        head = f"| {row['case']} | {row['l']} | {row['n']} | {row['r']} | {row['method']} |"
        if "note" in row:
            lines.append(f"{head} {row['note']} | | | | | |")
            continue
        flops = f"{row['flop_ratio']:.1f}" if row["flop_ratio"] else "-"
        lines.append(f"{head} {row['ms']:.1f} | {row['ratio']:.2f}x | {row['levels']} | "
                     f"{flops} | {row['memory_ratio']:.1f}x | {row['error']:.0e} |")
    return "\n".join(lines)


def main() -> None:
    """Measure every case, print and save the table."""
    rows = []
    for label, net, r in each(cases(), "cr"):
        rows.extend(measure(label, net, r))
        print(table(rows[-len(METHODS):]).splitlines()[-len(METHODS):], flush=True)
    rates = product_rates()
    text = table(rows) + "\n\n" + product_table(rates)
    print(text)
    print(f"written to {save('cr', rows + [dict(row, case='products') for row in rates], text)}")


if __name__ == "__main__":
    main()
