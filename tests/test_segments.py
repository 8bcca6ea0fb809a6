"""The outer stages of the two-level reductions, against the sequential recursion."""

import numpy as np

from propop.solvers.reduction.chain import Counter
from propop.solvers.reduction.odd_even import factor, substitute
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
    assert len(across.levels) == int(np.ceil(np.log2(m)))
