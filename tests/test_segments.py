"""The outer stages of the two-level reductions, against the sequential recursion."""

import numpy as np

from propop.solvers.reduction.chain import Counter
from propop.solvers.reduction.odd_even import depth, factor, substitute
from propop.solvers.reduction.segments import Across, expand


def test_segments_follow_the_sequential_recursion():
    rng = np.random.default_rng(0)
    m, r, rows, w = 9, 3, 5, 2
    DG = rng.standard_normal((m, r, rows, w)) * 0.5  # D_s^{-1} G_s
    Dc = rng.standard_normal((m, r, rows))  # D_s^{-1} c_s
    carried = np.array([4, 1])
    across = Across(DG[:, :, carried, :], lambda c, k: factor(c, k, np), Counter(),
                    [f"segment {s}" for s in range(m)])
    for _ in range(2):  # the blocks reduced once, any number of right-hand sides
        previous = across.previous(Dc[:, :, carried],
                                   lambda levels, G, k: substitute(levels, G, k, np), Counter())
        x = expand(DG, Dc, previous, Counter())
        y = np.zeros((r, w))  # the first segment reads nothing
        for s in range(m):
            expected = Dc[s] + np.einsum("rij,rj->ri", DG[s], y)
            np.testing.assert_allclose(x[s], expected, rtol=1e-13, atol=1e-14)
            y = expected[:, carried]
        Dc = rng.standard_normal((m, r, rows))
    assert depth(across.levels) == int(np.ceil(np.log2(m)))


def test_an_unscaled_chain_is_the_chain_scaled_by_ones():
    """``L = None`` (no pass multiplies by one) reduces as ``L`` of ones does, exactly.

    Shared and per-sample cores, one and several samples, vector and matrix
    right-hand sides: every path of the dense kernels' product and apply.
    """
    from propop.solvers.reduction.chain import Chain

    rng = np.random.default_rng(1)
    m, n = 11, 3
    for b, r, columns in ((1, 1, ()), (1, 4, ()), (4, 4, ()), (4, 4, (2,))):
        C = rng.standard_normal((m - 1, b, n, n)) * 0.6
        G = rng.standard_normal((m, r, n) + columns)
        ones = np.ones((m, 1, n))
        solved = [substitute(factor(Chain(L, C, None, range(m), ()), Counter(), np), G,
                             Counter()) for L in (None, ones)]
        np.testing.assert_array_equal(solved[0], solved[1])
        x = np.zeros((r, n) + columns)
        for k in range(m):  # the recursion x_k = C_k x_{k-1} + G_k
            x = G[k] + (np.einsum("bij,rj...->ri...", C[k - 1], x) if b == 1 else
                        np.einsum("rij,rj...->ri...", C[k - 1], x)) * (k > 0)
            np.testing.assert_allclose(solved[0][k], x, rtol=1e-12, atol=1e-13)
