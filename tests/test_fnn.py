"""The sequential reference FNN against PyTorch autograd and finite differences."""

import numpy as np
import pytest
import scipy.sparse as sp

import propop as pp
from cases import ACTIVATIONS, CASES, Case, relative_error, tolerance
from reference import dense, torch_gradients


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_forward_backward_gradients_match_autograd(case):
    net = case.net()
    x, t = case.data()
    trace = net.forward(x)
    g = net.gradients(trace, net.backward(trace, pp.loss_gradient(trace.output, t)))
    out, dW, db, dx = torch_gradients(net, x, t)
    tol = tolerance(case.dtype)
    assert trace.output.dtype == np.dtype(case.dtype)
    assert relative_error(trace.output, out) < tol
    for k in range(net.depth):
        want = dW[k] * (dense(net.W[k]) != 0) if sp.issparse(net.W[k]) else dW[k]
        assert relative_error(dense(g.W[k]), want) < tol, k
        assert relative_error(g.b[k], db[k]) < tol, k
    assert relative_error(g.x, dx) < tol


@pytest.mark.parametrize(("widths", "density", "r"), [
    ([40, 40, 40, 40], 1.0, 1),  # one sample as a column, 32 or more wide: gemv's path
    ([300, 300, 300], 0.05, 64),  # a sparse pattern's gradient read off the dense v z^T
    ([300, 300, 300], 0.05, 2),  # the same pattern, few samples: gathered
])
def test_backprop_on_the_wide_paths_matches_autograd_per_layer(widths, density, r):
    """``pp.backprop`` on the wide paths: autograd's values in every layer.

    The forward pass calls ``gemv`` on a column; sparse gradients come from one
    dense product (or, with few samples, from gathered rows).
    """
    net = pp.FNN.random(widths, activation="tanh", density=density, seed=5, bias=0.1)
    rng = np.random.default_rng(6)
    x, t = rng.standard_normal((widths[0], r)), rng.standard_normal((widths[-1], r))
    g = pp.backprop(net, x, t, method="substitution")
    out, dW, db, dx = torch_gradients(net, x, t)
    for k in range(net.depth):
        want = dW[k] * (dense(net.W[k]) != 0) if sp.issparse(net.W[k]) else dW[k]
        assert sp.issparse(g.W[k]) == sp.issparse(net.W[k])
        assert relative_error(dense(g.W[k]), want) < 1e-12, k
        assert relative_error(g.b[k], db[k]) < 1e-12, k
    assert relative_error(g.x, dx) < 1e-12


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_gradients_match_finite_differences(activation):
    case = Case((4, 5, 3), activation=activation, r=2)
    net, (x, t) = case.net(), case.data()
    trace = net.forward(x)
    g = net.gradients(trace, net.backward(trace, pp.loss_gradient(trace.output, t)))
    h = 1e-6

    def loss_with(W0=None, xx=x):
        W = [net.W[0] if W0 is None else W0, net.W[1]]
        other = pp.FNN(W, net.b, net.activations)
        return pp.loss_value(other.forward(xx).output, t)

    for i, j in [(0, 0), (2, 3), (4, 1)]:
        E = np.zeros_like(net.W[0])
        E[i, j] = h
        fd = (loss_with(net.W[0] + E) - loss_with(net.W[0] - E)) / (2 * h)
        assert abs(fd - g.W[0][i, j]) < 1e-6 * max(1, abs(fd)), (i, j)
    e = np.zeros_like(x)
    e[1, 1] = h
    fd = (loss_with(xx=x + e) - loss_with(xx=x - e)) / (2 * h)
    assert abs(fd - g.x[1, 1]) < 1e-6 * max(1, abs(fd))


def test_sparse_gradient_lives_on_the_weight_pattern():
    net = pp.FNN.random([12, 10, 6], density=0.3, seed=3)
    x = np.random.default_rng(0).standard_normal((12, 5))
    trace = net.forward(x)
    g = net.gradients(trace, net.backward(trace, np.ones((6, 5))))
    for Wk, gk in zip(net.W, g.W):
        assert sp.issparse(gk)
        np.testing.assert_array_equal(gk.indptr, Wk.indptr)
        np.testing.assert_array_equal(gk.indices, Wk.indices)
    full = pp.FNN([Wk.toarray() for Wk in net.W], net.b, net.activations)
    tr = full.forward(x)
    g_full = full.gradients(tr, full.backward(tr, np.ones((6, 5))))
    for Wk, gk, gf in zip(net.W, g.W, g_full.W):
        np.testing.assert_allclose(gk.toarray(), gf * (Wk.toarray() != 0), rtol=1e-13)


@pytest.mark.parametrize("fmt", ["coo", "csc", "lil", "dia"])
def test_any_sparse_format_is_accepted(fmt):
    W = sp.random_array((4, 3), density=0.6, rng=1, format=fmt)
    net = pp.FNN([W], activation="identity")
    np.testing.assert_allclose(net.forward(np.ones(3)).output, W.toarray() @ np.ones(3))


@pytest.mark.parametrize("activation", ["relu", "tanh", "identity"])
def test_deep_random_net_neither_explodes_nor_vanishes(activation):
    width, depth = 64, 256
    net = pp.FNN.random([width] * (depth + 1), activation=activation, seed=0)
    x = np.random.default_rng(1).standard_normal((width, 8))
    trace = net.forward(x)
    v = net.backward(trace, np.random.default_rng(2).standard_normal((width, 8)))
    for name, ratio in [("forward", np.linalg.norm(trace.output) / np.linalg.norm(x)),
                        ("backward", np.linalg.norm(v[0]) / np.linalg.norm(v[-1]))]:
        assert 1e-3 < ratio < 1e3, (name, ratio)


def test_random_respects_dtype_density_and_seed():
    a = pp.FNN.random([6, 5, 4], density=0.5, seed=7, dtype="float32")
    b = pp.FNN.random([6, 5, 4], density=0.5, seed=7, dtype="float32")
    assert a.dtype == np.float32 and a.sparse and a.sizes == (6, 5, 4)
    np.testing.assert_array_equal(a.W[0].toarray(), b.W[0].toarray())
    assert abs(a.W[0].nnz / 30 - 0.5) < 0.1


@pytest.mark.parametrize("shape", [(6,), (6, 3), (6, 1)], ids=["vector", "batch", "column"])
@pytest.mark.parametrize("activations", [["tanh"] * 4, ["relu", "tanh", "sigmoid", "identity"]],
                         ids=["one-kind", "mixed"])
def test_equal_widths_run_stacked_and_agree_with_autograd_in_every_layer(shape, activations):
    """Equal widths: states in two stacked arrays, f' and dW of all layers in one call each."""
    from reference import torch_gradients

    base = pp.FNN.random([6] * 5, activation="tanh", seed=3, bias=0.2)
    net = pp.FNN(base.W, base.b, activation=activations)
    rng = np.random.default_rng(4)
    x, t = rng.standard_normal(shape), rng.standard_normal(shape)
    trace = net.forward(x)
    assert trace.stacked["y"].shape == (4,) + shape and trace.z[0] is trace.x
    assert all(np.shares_memory(a, trace.stacked["y"]) for a in trace.y)
    assert all(np.shares_memory(a, trace.stacked["z"]) for a in trace.z[1:])
    out, dW, db, dx = torch_gradients(net, x, t)
    unstacked = pp.Trace(x=trace.x, y=trace.y, z=trace.z)  # a trace made by hand: no stacks
    for used in (trace, unstacked):
        g = pp.backprop(net, x, t, trace=used)
        for k in range(4):
            assert np.linalg.norm(g.W[k] - dW[k]) <= 1e-12 * np.linalg.norm(dW[k]), k
            assert np.linalg.norm(g.b[k] - db[k]) <= 1e-12 * np.linalg.norm(db[k]), k
        assert np.linalg.norm(g.x - dx) <= 1e-12 * np.linalg.norm(dx)
    assert np.abs(trace.output - out).max() <= 1e-14


def test_states_give_every_pre_activation_at_once():
    net = pp.FNN.random([5] * 4, activation="tanh", seed=1, bias=0.3)
    x = np.random.default_rng(2).standard_normal((5, 2))
    exact = net.forward(x)
    for states in (list(exact.z), exact.stacked["z"]):
        again = net.trace_from_states(x, states)
        for k in range(3):  # y_k = W_k z_k + b_k, written out
            assert np.allclose(again.y[k], net.W[k] @ exact.z[k] + net.b[k][:, None],
                               rtol=1e-15, atol=1e-15)


def test_the_sequential_backward_transposes_each_weight_once(monkeypatch):
    """``net.WT`` is made at every access: the reference loop takes it once (was O(l^2))."""
    import propop.networks.fnn as fnn

    calls = []
    original = fnn.transposed
    monkeypatch.setattr(fnn, "transposed", lambda W: calls.append(1) or original(W))
    net = pp.FNN.random([3] * 65, activation="tanh", seed=0)
    trace = net.forward(np.ones(3))
    v = net.backward(trace, np.ones(3))
    assert len(v) == 65 and len(calls) == 64
