"""Training with pluggable backward solvers, against PyTorch's optimisers (issue 10)."""

import numpy as np
import pytest

import propop as pp
from cases import relative_error
from propop.data import digits, parity
from propop.training import train
from propop.torch_interop import Residual
from reference import torch

nn = torch.nn


@pytest.fixture(scope="module")
def data():
    xtr, ytr, xte, yte = digits()
    return xtr[:, :600], ytr[:600], xte, yte


def mlp(seed=0):
    base = pp.FNN.random([64, 24, 10], activation="tanh", seed=seed)
    return pp.FNN(base.W, base.b, activation=["tanh", "identity"])


def test_the_data_sets():
    xtr, ytr, xte, yte = digits(test_fraction=0.25)
    assert xtr.shape[0] == 64 and xtr.shape[1] + xte.shape[1] == 1797
    assert set(np.unique(ytr)) == set(range(10)) and 0 <= xtr.min() and xtr.max() <= 1
    bits, targets = parity(5, tau=7, seed=1)
    assert bits.shape == targets.shape == (7, 1, 5)
    np.testing.assert_array_equal(targets[-1, 0], bits[:, 0].sum(axis=0) % 2)


@pytest.mark.parametrize("method", ["substitution", "level-scheduled", "cyclic-reduction",
                                    "scipy.spsolve_triangular"])
def test_loss_decreases_on_digits_with_every_exact_method(data, method):
    xtr, ytr, xte, yte = data
    model, history = train(mlp(), xtr, ytr, epochs=3, batch_size=50, lr=0.5, method=method,
                           x_test=xte, y_test=yte)
    losses = [e["loss"] for e in history.epochs]
    assert losses[-1] < 0.6 * losses[0] or losses[-1] < 0.35
    assert history.epochs[-1]["test_accuracy"] > 0.8
    assert all(s["status"] == "CONVERGED" for s in history.steps)


@pytest.mark.parametrize(("optimizer", "make"), [
    ("sgd", lambda p: torch.optim.SGD(p, lr=0.3)),
    ("momentum", lambda p: torch.optim.SGD(p, lr=0.3, momentum=0.9)),
    ("adam", lambda p: torch.optim.Adam(p, lr=0.01)),
])
def test_one_epoch_equals_pytorch_training(data, optimizer, make):
    xtr, ytr, _, _ = data
    net = mlp(seed=1)
    module = nn.Sequential(nn.Linear(64, 24), nn.Tanh(), nn.Linear(24, 10)).double()
    with torch.no_grad():
        for layer, W, b in zip((module[0], module[2]), net.W, net.b):
            layer.weight.copy_(torch.tensor(W))
            layer.bias.copy_(torch.tensor(b))
    opt = make(module.parameters())
    for first in range(0, 600, 40):
        opt.zero_grad()
        out = module(torch.tensor(xtr[:, first:first + 40].T))
        nn.functional.cross_entropy(out, torch.tensor(ytr[first:first + 40])).backward()
        opt.step()
    lr = 0.01 if optimizer == "adam" else 0.3
    trained, _ = train(net, xtr, ytr, epochs=1, batch_size=40, lr=lr, optimizer=optimizer,
                       shuffle=False)
    for layer, W, b in zip((module[0], module[2]), trained.W, trained.b):
        assert relative_error(W, layer.weight.detach().numpy()) < 1e-10
        assert relative_error(b, layer.bias.detach().numpy()) < 1e-10


def test_a_conv_graph_trains_like_pytorch():
    torch.manual_seed(0)
    module = nn.Sequential(nn.Conv2d(1, 3, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                           nn.Flatten(), nn.Linear(48, 16), nn.Tanh(),
                           Residual(nn.Sequential(nn.Linear(16, 16), nn.Tanh())),
                           nn.Linear(16, 10)).double()
    graph = pp.from_torch(module, input_shape=(1, 8, 8))
    x, y = digits()[0][:, :60], digits()[1][:60]
    opt = torch.optim.SGD(module.parameters(), lr=0.2)
    for first in range(0, 60, 20):
        opt.zero_grad()
        X = torch.tensor(x[:, first:first + 20].T.reshape(-1, 1, 8, 8))
        nn.functional.cross_entropy(module(X), torch.tensor(y[first:first + 20])).backward()
        opt.step()
    trained, _ = train(graph, x, y, epochs=1, batch_size=20, lr=0.2, shuffle=False,
                       method="level-scheduled")
    assert relative_error(trained.layers["0"].W, module[0].weight.detach().numpy()) < 1e-10
    assert relative_error(trained.layers["7"].W, module[7].weight.detach().numpy()) < 1e-10


def test_truncated_gradients_train_and_report_their_error(data):
    xtr, ytr, _, _ = data
    _, exact = train(mlp(), xtr, ytr, epochs=1, batch_size=100, lr=0.5)
    _, rough = train(mlp(), xtr, ytr, epochs=1, batch_size=100, lr=0.5, method="jacobi",
                     solver_options={"maxiter": 1}, gradient_error=True)
    errors = [s["gradient_error"] for s in rough.steps]
    assert all(s["status"] == "MAX_ITER" for s in rough.steps) and min(errors) > 0.1
    assert rough.epochs[-1]["loss"] > exact.epochs[-1]["loss"]
    _, full = train(mlp(), xtr, ytr, epochs=1, batch_size=100, lr=0.5, method="jacobi",
                    solver_options={"maxiter": 3}, gradient_error=True)
    assert max(s["gradient_error"] for s in full.steps) < 1e-12  # l + 1 = 3 sweeps: exact


def test_an_rnn_learns_running_parity_a_little():
    bits, targets = parity(64, tau=6, seed=0)
    rnn = pp.RNN.random([1, 12, 1], activation="tanh", seed=0)
    _, history = train(rnn, bits, targets, epochs=15, batch_size=16, lr=0.05, loss="mse",
                       optimizer="adam", method="cyclic-reduction")
    assert history.epochs[-1]["loss"] < 0.8 * history.epochs[0]["loss"]


def test_bad_training_input_is_named(data):
    xtr, ytr, _, _ = data
    with pytest.raises(ValueError, match="labels must be integers in \\[0, 10\\)"):
        train(mlp(), xtr, ytr + 5, epochs=1)
    with pytest.raises(ValueError, match="batch_size must be an integer >= 1, got 0"):
        train(mlp(), xtr, ytr, batch_size=0)
    with pytest.raises(ValueError, match="unknown optimizer 'rmsprop'"):
        train(mlp(), xtr, ytr, optimizer="rmsprop")


def test_propop_train_prints_epochs_and_a_summary(capsys):
    from propop import cli

    assert cli.main(["train", "--layers", "16", "--epochs", "2", "--method", "jacobi",
                     "--maxiter", "1", "--density", "0.5"]) == 0
    out = capsys.readouterr().out
    assert "| 2 |" in out and "final test accuracy" in out and "mean gradient error" in out


def test_pruned_training_keeps_the_sparsity_pattern(data):
    from propop import sparsity

    xtr, ytr, _, _ = data
    pruned = sparsity.prune(mlp(), 0.3)
    assert abs(sparsity.density_of(pruned) - 0.3) < 0.01
    dense = mlp().W[0]
    kept = pruned.W[0].toarray() != 0
    assert np.abs(dense[kept]).min() >= np.abs(dense[~kept]).max()  # the largest survive
    trained, history = train(pruned, xtr, ytr, epochs=2, batch_size=50, lr=0.5)
    for before, after in zip(pruned.W, trained.W):
        assert after.nnz <= before.nnz
        assert set(zip(*after.nonzero())) <= set(zip(*before.nonzero()))
    assert history.epochs[-1]["accuracy"] > 0.5


def test_gradual_pruning_structured_patterns_and_the_report(data):
    from propop import sparsity

    xtr, ytr, xte, yte = data
    net, stages = sparsity.prune_gradually(mlp(), xtr, ytr, 0.2, stages=3, batch_size=50,
                                           lr=0.5)
    assert abs(sparsity.density_of(net) - 0.2) < 0.01 and len(stages) == 3
    B = sparsity.banded((6, 6), 1)
    assert B.nnz == 6 + 2 * 5 and np.all(np.abs(np.subtract.outer(*np.nonzero(B.toarray())
                                                                   [::-1]).diagonal()) <= 1)
    S = sparsity.block_sparse((8, 8), 4, 0.5, seed=3)
    tiles = S.toarray().reshape(2, 4, 2, 4).transpose(0, 2, 1, 3).reshape(4, 16)
    assert all(np.count_nonzero(t) in (0, 16) for t in tiles)
    rows = sparsity.report(mlp(), xtr, ytr, [1.0, 0.1], xte, yte, batch_size=50, lr=0.5)
    assert [r["density"] for r in rows] == [1.0, 0.1]
    assert all(0 <= r["test_accuracy"] <= 1 and r["cr_seconds"] > 0 for r in rows)
    with pytest.raises(ValueError, match="density must lie in \\(0, 1\\], got 0"):
        sparsity.prune(mlp(), 0)
