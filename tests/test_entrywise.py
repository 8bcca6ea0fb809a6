"""Cyclic reduction of chains of tiny blocks laid out entries first, against the recursion."""

import math

import numpy as np
import pytest

import propop as pp
from propop.solvers.reduction import odd_even
from propop.solvers.reduction.chain import Chain, Counter
from propop.solvers.reduction.entrywise import EntrywiseKernels


def recursion(L, C, G):
    """``x_0 = G_0``, ``x_k = diag(L_k) C_k x_{k-1} + G_k``: the chain's definition, stepped."""
    x = [G[0]]
    for k in range(1, G.shape[0]):
        core = C[k - 1]  # (b, n, n), b is 1 or r
        if G.ndim == 3:
            step = np.einsum("bij,bj->bi", core, x[-1]) if core.shape[0] > 1 else x[-1] @ core[0].T
        else:  # columns: (r, n, c)
            step = np.einsum("bij,bjc->bic", np.broadcast_to(core, (G.shape[1],) + core.shape[1:]),
                             x[-1])
        if L is not None:
            step = step * (L[k] if G.ndim == 3 else L[k][..., None])
        x.append(step + G[k])
    return np.stack(x)


@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("m", [2, 3, 17, 64])
@pytest.mark.parametrize("per_sample", [False, True])
@pytest.mark.parametrize("scalings", [None, 1, 4])  # none, shared, one per sample
@pytest.mark.parametrize("columns", [None, 3])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_the_reduction_of_tiny_blocks_follows_the_recursion(n, m, per_sample, scalings, columns,
                                                            dtype):
    rng = np.random.default_rng(m + 10 * n)
    r = 4
    C = rng.uniform(-1, 1, (m - 1, r if per_sample else 1, n, n)).astype(dtype)
    L = None if scalings is None else rng.uniform(0.5, 1.5, (m, scalings, n)).astype(dtype)
    G = rng.standard_normal((m, r, n) if columns is None else (m, r, n, columns)).astype(dtype)
    tol = 1e-13 if dtype == "float64" else 1e-5
    levels = odd_even.factor(Chain(L, C, None, range(m), ()), Counter(), np)
    assert isinstance(levels[0], odd_even.Switch)  # entries first from the first level
    assert isinstance(levels[0].kernels, EntrywiseKernels)
    assert odd_even.depth(levels) == math.ceil(math.log2(m))
    for _ in range(2):  # the levels serve any number of right-hand sides
        X = odd_even.substitute(levels, G, Counter(), np)
        assert X.shape == G.shape and X.dtype == dtype
        np.testing.assert_allclose(X, recursion(L, C, G), rtol=tol, atol=tol)
        G = rng.standard_normal(G.shape).astype(dtype)


def test_wider_blocks_stay_positions_first():
    C = np.ones((7, 1, 4, 4)) / 4
    levels = odd_even.factor(Chain(None, C, None, range(8), ()), Counter(), np)
    assert not any(isinstance(level, odd_even.Switch) for level in levels)


@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("bad", [np.inf, np.nan])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_a_reduced_tiny_block_that_is_not_finite_names_its_blocks(n, bad, dtype):
    """Cores 5 and 6 too large (their product, coupling 6 and 4, overflows), or a NaN in core 5.

    The same message for blocks reduced entries first (n = 2, 3) as positions first (n = 4);
    float64 advised for float32 blocks only.
    """
    C = np.broadcast_to(np.eye(n, dtype=dtype) / 2, (15, 1, n, n)).copy()
    if bad == np.inf:
        C[4:6] *= 2e200 if dtype == "float64" else 2e20  # the cores of positions 5 and 6
    else:
        C[4, 0, 0, 1] = np.nan
    named = "level 1: the reduced block coupling blocks 6 and 4 is not finite"
    with pytest.raises(odd_even.ReductionOverflow, match=named) as raised, \
            np.errstate(all="ignore"):
        odd_even.factor(Chain(None, C, None, range(16), ()), Counter(), np)
    assert ("or float64" in raised.value.message) == (dtype == "float32")


@pytest.mark.parametrize("sizes", [[2] * 33, [1] * 17, [2] * 9, [3] * 17])
@pytest.mark.parametrize("r", [None, 1, 5])
def test_backpropagation_through_tiny_layers_by_cyclic_reduction_is_exact_per_layer(sizes, r):
    """Against the sequential reference (substitution), each layer to 1e-12 of its own size.

    The gradients of these deep narrow nets are small (1e-10 at 32 layers of 2): each
    layer is judged by its own largest entry, not by an absolute tolerance.
    """
    net = pp.FNN.random(sizes, activation="tanh", seed=0)
    x = np.random.default_rng(1).standard_normal((sizes[0], r) if r else sizes[0])
    target = np.zeros(net.forward(x).output.shape)
    exact = pp.backprop(net, x, target, method="substitution")
    g = pp.backprop(net, x, target, method="cyclic-reduction")
    assert g.solution.converged
    for a, b in zip(g.W + g.b + (g.x,), exact.W + exact.b + (exact.x,)):
        assert np.abs(b).max() > 0
        assert np.abs(a - b).max() <= 1e-12 * np.abs(b).max()


@pytest.mark.parametrize("hidden", [2, 3])
def test_the_newton_forward_of_a_narrow_gru_matches_the_sequential_one(hidden):
    """DEER's setting (hidden 2, a batch): its chain's 2 x 2 cores are reduced entries first."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    module = torch.nn.GRU(2, hidden).double()
    gru = pp.from_torch(module)
    xs = np.random.default_rng(1).standard_normal((300, 2, 16))
    with torch.no_grad():
        expected = module(torch.tensor(xs.transpose(0, 2, 1).copy()))[0].numpy()
    trace = pp.forward(gru, xs, method="cyclic-reduction", linearization="newton")
    assert trace.info["converged"]
    states = np.asarray(trace.output).transpose(0, 2, 1)
    np.testing.assert_allclose(states, expected, rtol=1e-12, atol=1e-13)
