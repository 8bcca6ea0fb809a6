"""The conventions users bring from PyTorch and SciPy (issue 18, deliverable 4)."""

import numpy as np
import pytest
import scipy.sparse as sp

import propop as pp
from cases import relative_error
from reference import torch

F = torch.nn.functional


def torch_mean_gradients(net, x, target, loss):
    """The weights' gradients of PyTorch's default losses (``reduction="mean"``)."""
    W = [torch.tensor(np.asarray(w), requires_grad=True) for w in net.W]
    b = [torch.tensor(np.asarray(v), requires_grad=True) for v in net.b]
    z = torch.tensor(x.T)
    for k, (Wk, bk) in enumerate(zip(W, b)):
        z = z @ Wk.T + bk
        z = torch.tanh(z) if k < len(W) - 1 else z
    if loss == "mse":
        E = torch.nn.MSELoss()(z, torch.tensor(target.T))
    else:
        E = torch.nn.CrossEntropyLoss()(z, torch.tensor(target))
    E.backward()
    return [w.grad.numpy() for w in W], E.item()


@pytest.mark.parametrize("loss", ["mse", "cross_entropy"])
def test_mean_reduction_matches_pytorchs_default_losses(loss):
    net = pp.FNN.random([5, 6, 4], output_activation="identity", seed=0, bias=0.1)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((5, 7))
    target = rng.standard_normal((4, 7)) if loss == "mse" else rng.integers(0, 4, 7)
    expected, value = torch_mean_gradients(net, x, target, loss)
    for method in ("substitution", "cyclic-reduction"):
        g = pp.backprop(net, x, target, loss=loss, method=method, reduction="mean")
        for k in range(2):
            assert relative_error(g.W[k], expected[k]) < 1e-12, (method, k)
    out = net.forward(x).output
    assert pp.loss_value(out, target, loss, reduction="mean") == pytest.approx(value,
                                                                               rel=1e-12)
    summed = pp.backprop(net, x, target, loss=loss)
    ratio = summed.W[0] / pp.backprop(net, x, target, loss=loss, reduction="mean").W[0]
    np.testing.assert_allclose(ratio, 7 if loss == "cross_entropy" else 4 * 7 / 2)
    with pytest.raises(ValueError, match="unknown reduction 'average'"):
        pp.backprop(net, x, target, loss=loss, reduction="average")


def test_fnn_random_takes_per_layer_activations_and_an_output_one():
    assert [a.name for a in pp.FNN.random([3, 4, 4, 2]).activations] == ["tanh"] * 3
    assert [a.name for a in pp.FNN([np.eye(2)]).activations] == ["tanh"]  # one default
    net = pp.FNN.random([3, 4, 4, 2], activation=["relu", "sigmoid", "tanh"],
                        output_activation="identity", seed=0)
    assert [a.name for a in net.activations] == ["relu", "sigmoid", "identity"]
    assert "activation=[relu, sigmoid, identity]" in repr(net)
    assert "activation=tanh x3" in repr(pp.FNN.random([3, 4, 4, 2]))
    with pytest.raises(ValueError, match="3 layers need 3 activations, got 2"):
        pp.FNN.random([3, 4, 4, 2], activation=["relu", "tanh"])


def test_solution_unpacks_like_scipy():
    net = pp.FNN.random([4, 4, 4, 4], seed=0)
    trace = net.forward(np.ones((4, 2)))
    B = pp.backward_system(net, trace, trace.output)
    x, info = pp.solve(B, "jacobi")
    assert info == 0 and relative_error(x, pp.solve(B).x) < 1e-12
    x, info = pp.solve(B, "jacobi", maxiter=1)
    assert info == 1  # SciPy: > 0, the iterations when maxiter ran out


def test_a_plain_sparse_triangular_matrix_is_wrapped():
    rng = np.random.default_rng(2)
    L = sp.tril(sp.random(30, 30, density=0.2, random_state=3), -1) + \
        sp.diags(rng.uniform(1, 2, 30))
    b = rng.standard_normal((30, 2))
    for A in (L.tocsr(), L.T.tocsc(), L.toarray()):
        for method in ("substitution", "jacobi", "scipy.gmres"):
            x, info = pp.solve(A, method, b=b)
            assert info == 0
            np.testing.assert_allclose(A @ x, b, atol=1e-10)
    with pytest.raises(ValueError, match="needs its right-hand side"):
        pp.solve(L, "substitution")
    with pytest.raises(ValueError, match="neither lower nor upper"):
        pp.solve(L + L.T, "substitution", b=b)
    with pytest.raises(ValueError, match="zero on its diagonal \\(row 0\\)"):
        pp.solve(sp.tril(L, -1), "substitution", b=b)
    with pytest.raises(TypeError, match="pp.solve takes a TriangularSystem"):
        pp.solve([[1.0]], "substitution", b=b)


def test_one_truncation_rule_for_backprop_and_train():
    net = pp.FNN.random([4, 6, 6, 6, 3], seed=0)
    rng = np.random.default_rng(4)
    x, t = rng.standard_normal((4, 5)), rng.standard_normal((3, 5))
    g = pp.backprop(net, x, t, method="jacobi", maxiter=1)  # asked for: no error
    assert g.solution.status is pp.Status.MAX_ITER
    with pytest.raises(pp.ConvergenceError, match="pass check=False"):
        pp.backprop(net, x, t, method="jacobi", maxiter=1, check=True)
    labels = rng.integers(0, 3, 20)
    _, history = pp.train(net, rng.standard_normal((4, 20)), labels, method="jacobi",
                          maxiter=1, batch_size=10, progress=False)
    assert {s["status"] for s in history.steps} == {"MAX_ITER"}
    with pytest.raises(pp.ConvergenceError, match="pass check=False"):
        pp.train(net, rng.standard_normal((4, 20)), labels, method="jacobi", maxiter=1,
                 batch_size=10, progress=False, check=True)


def test_reprs_are_short():
    net = pp.FNN.random([8] * 6, seed=0)
    trace = net.forward(np.ones((8, 3)))
    blocks = pp.backward_system(net, trace, trace.output).blocks
    assert repr(blocks) == "Blocks(upper, 6 blocks of sizes 8, 5 couplings, chain)"
    _, history = pp.train(net, np.ones((8, 40)), np.arange(40) % 8, epochs=5, batch_size=4,
                          progress=False)
    assert len(repr(history)) < 150 and "5 epochs, 50 steps" in repr(history)
    graph = pp.Graph.residual_mlp(4, 20)
    text = repr(graph)
    assert len(text.splitlines()) == 26 and "... 76 more" in text
