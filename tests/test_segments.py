"""The outer stages of the two-level reductions, against the sequential recursion."""

import numpy as np

from propop.solvers.reduction.chain import Counter
from propop.solvers.reduction.cyclic import _reduce
from propop.solvers.reduction.segments import across, expand, relation


def test_segments_follow_the_sequential_recursion():
    rng = np.random.default_rng(0)
    m, r, rows, w = 9, 3, 5, 2
    Y = rng.standard_normal((m, r, rows, w + 1)) * 0.5  # D_s^{-1} [G_s | c_s]
    carried = np.array([4, 1])
    A, g = relation(Y, carried)
    previous, levels = across(A, g, lambda c, k: _reduce(c, k, np), Counter(),
                              [f"segment {s}" for s in range(m)])
    x = expand(Y, previous, Counter())
    y = np.zeros((r, w))  # the first segment reads nothing
    for s in range(m):
        expected = Y[s, :, :, -1] + np.einsum("rij,rj->ri", Y[s, :, :, :-1], y)
        np.testing.assert_allclose(x[s], expected, rtol=1e-13, atol=1e-14)
        y = expected[:, carried]
    assert levels == int(np.ceil(np.log2(m)))
