"""Training with pluggable backward solvers, against PyTorch's optimisers (issue 10)."""

import numpy as np
import pytest

import propop as pp
from cases import relative_error
from propop.data import digits, parity
from propop.training import train
from propop.interop.torch_import import Residual
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


EXACT = [s.name for s in pp.solvers.available() if s.exact
         and s.applies_to(pp.backward_system(mlp(), mlp().forward(np.ones((64, 2))),
                                             np.ones((10, 2))))]


def test_every_exact_method_is_listed():
    assert {"substitution", "level-scheduled", "cyclic-reduction", "parallel-cyclic-reduction",
            "scipy.spsolve_triangular"} <= set(EXACT)


@pytest.mark.parametrize("method", EXACT)
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
@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_one_epoch_equals_pytorch_training(data, optimizer, make, kind):
    """On NumPy, and with the model and the data on PyTorch (labels as tensors)."""
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
    on = lambda a: pp.backend.convert(a, kind)  # noqa: E731
    trained, history = train(net.to(kind), on(xtr), on(ytr), epochs=1, batch_size=40, lr=lr,
                             optimizer=optimizer, shuffle=False)
    assert trained.backend.name == kind and 0 <= history.epochs[0]["accuracy"] <= 1
    for layer, W, b in zip((module[0], module[2]), trained.W, trained.b):
        assert relative_error(pp.backend.to_host(W), layer.weight.detach().numpy()) < 1e-10
        assert relative_error(pp.backend.to_host(b), layer.bias.detach().numpy()) < 1e-10


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
                    maxiter=3, gradient_error=True)  # solver options as keywords too
    assert max(s["gradient_error"] for s in full.steps) < 1e-12  # l + 1 = 3 sweeps: exact


def test_an_rnn_learns_running_parity_a_little():
    bits, targets = parity(64, tau=6, seed=0)
    rnn = pp.RNN.random([1, 12, 1], activation="tanh", seed=0)
    _, history = train(rnn, bits, targets, epochs=15, batch_size=16, lr=0.05, loss="mse",
                       optimizer="adam", method="cyclic-reduction")
    assert history.epochs[-1]["loss"] < 0.8 * history.epochs[0]["loss"]


@pytest.mark.parametrize("method", ["substitution", "cyclic-reduction", "batched-gmres"])
def test_newton_forward_trains_like_the_sequential_forward(data, method):
    xtr, ytr, _, _ = data
    reference, _ = train(mlp(), xtr, ytr, epochs=1, batch_size=100, lr=0.5)
    newton, history = train(mlp(), xtr, ytr, epochs=1, batch_size=100, lr=0.5,
                            forward=method, forward_options={"rtol": 1e-13})
    for a, b in zip(newton.W + newton.b, reference.W + reference.b):
        assert relative_error(a, b) < 1e-10
    # Newton on 2 layers: exact after 2 iterations, the second confirms the residual
    assert all(1 <= s["forward_iterations"] <= 2 for s in history.steps)


def test_a_truncated_newton_forward_is_reported_or_raises(data):
    xtr, ytr, _, _ = data
    base = pp.FNN.random([64, 24, 24, 10], seed=0)
    deep = pp.FNN(base.W, base.b, activation=["tanh", "tanh", "identity"])  # 2 iterations
    with pytest.raises(pp.ConvergenceError, match="forward iteration stopped after 1"):
        train(deep, xtr, ytr, forward="substitution", forward_options={"maxiter": 1})
    _, history = train(deep, xtr, ytr, batch_size=100, forward="substitution",
                       forward_options={"maxiter": 1, "check": False}, gradient_error=True)
    assert all(s["forward_iterations"] == 1 and s["gradient_error"] > 1e-3
               for s in history.steps)


def test_training_is_deterministic_with_a_seed(data):
    xtr, ytr, _, _ = data
    runs = [train(mlp(), xtr, ytr, epochs=2, batch_size=64, lr=0.5, seed=seed)[0]
            for seed in (3, 3, 4)]
    for a, b in zip(runs[0].W, runs[1].W):
        np.testing.assert_array_equal(a, b)
    assert relative_error(runs[2].W[0], runs[0].W[0]) > 1e-3  # other batches


def test_bad_training_input_is_named(data):
    xtr, ytr, _, _ = data
    with pytest.raises(ValueError, match="labels must be integers in \\[0, 10\\)"):
        train(mlp(), xtr, ytr + 5, epochs=1)
    with pytest.raises(ValueError, match="batch_size must be an integer >= 1, got 0"):
        train(mlp(), xtr, ytr, batch_size=0)
    with pytest.raises(ValueError, match="unknown optimizer 'rmsprop'"):
        train(mlp(), xtr, ytr, optimizer="rmsprop")
    with pytest.raises(ValueError, match="solver options \\['maxiter'\\] given both"):
        train(mlp(), xtr, ytr, method="jacobi", maxiter=2, solver_options={"maxiter": 3})
    with pytest.raises(TypeError, match="has no option 'restrat' .did you mean 'restart'"):
        train(mlp(), xtr, ytr, method="batched-gmres", restrat=5)
    with pytest.raises(ValueError, match="epochs must be an integer >= 1, got 0"):
        train(mlp(), xtr, ytr, epochs=0)
    with pytest.raises(ValueError, match="lr must be a finite number > 0, got -1"):
        train(mlp(), xtr, ytr, lr=-1)
    with pytest.raises(KeyError, match="unknown solver 'gauss'"):
        train(mlp(), xtr, ytr, method="gauss")
    with pytest.raises(KeyError, match="unknown solver 'newton'"):
        train(mlp(), xtr, ytr, forward="newton")
    with pytest.raises(ValueError, match="x has shape \\(63, 5\\)"):
        train(mlp(), xtr[:63, :5], ytr[:5])
    bad = xtr[:, :6].copy()
    bad[2, 3] = np.nan
    with pytest.raises(ValueError, match="x contains NaN or Inf \\(first at index \\(2, 3\\)"):
        train(mlp(), bad, ytr[:6])
    with pytest.raises(ValueError, match="y has 5 samples \\(last axis\\) but x has 6"):
        train(mlp(), xtr[:, :6], ytr[:5])
    with pytest.raises(ValueError, match="y_test has 4 samples \\(last axis\\) but x_test"):
        train(mlp(), xtr[:, :6], ytr[:6], x_test=xtr[:, :6], y_test=ytr[:4])


def test_propop_train_prints_epochs_and_a_summary(capsys):
    from propop import cli

    assert cli.main(["train", "--layers", "16", "--epochs", "2", "--method", "jacobi",
                     "--maxiter", "1", "--density", "0.5"]) == 0
    out = capsys.readouterr().out
    assert "| 2 |" in out and "final test accuracy" in out and "mean gradient error" in out
    assert cli.main(["train", "--layers", "16,16", "--epochs", "1", "--prune", "block",
                     "--density", "0.25", "--stages", "2", "--forward", "cyclic-reduction"]) == 0
    out = capsys.readouterr().out
    assert "| 2 |" in out and "weight density 0.25" in out and "Newton with cyclic" in out


def test_propop_train_names_bad_options(capsys):
    from propop import cli

    for argv, message in ((["--density", "0"], "must lie in (0, 1], got 0.0"),
                          (["--method", "gauss"], "unknown solver 'gauss'"),
                          (["--prune", "diagonal"], "invalid choice: 'diagonal'")):
        with pytest.raises(SystemExit) as exit_:
            cli.main(["train", *argv])
        assert exit_.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["rnn", "graph"])
def test_newton_forward_trains_rnns_and_graphs_like_the_sequential_forward(kind):
    if kind == "rnn":
        x, y = parity(24, tau=5, seed=0)
        make = lambda: pp.RNN.random([1, 6, 1], activation="tanh", seed=0)  # noqa: E731
    else:  # a graph's layers are trained in place: one fresh graph per run
        x, y = np.random.default_rng(0).standard_normal((2, 6, 24))
        make = lambda: pp.Graph.residual_mlp(6, 2, "tanh", 0)  # noqa: E731
    models = [train(make(), x, y, batch_size=8, lr=0.05, loss="mse", forward=forward,
                    forward_options={"rtol": 1e-13})[0] for forward in (None, "substitution")]
    before, reference, newton = (pp.training.parameters(m) for m in (make(), *models))
    for name, value in reference.items():
        assert relative_error(newton[name], value) < 1e-10
        assert relative_error(before[name], value) > 1e-4  # training moved it


@pytest.mark.parametrize("kind", ["torch", "array_api_strict"])
@pytest.mark.parametrize("model", ["rnn", "graph", "sparse"])
def test_a_model_on_another_backend_trains_as_on_numpy(kind, model):
    """Every step's solve, update and the epochs' scores there; the NumPy run as reference."""
    pytest.importorskip(kind)
    rng = np.random.default_rng(0)
    if model == "rnn":
        x, y = parity(24, tau=5, seed=0)
        make = lambda: pp.RNN.random([1, 6, 1], activation="tanh", seed=0)  # noqa: E731
        options = dict(loss="mse", optimizer="momentum")
    elif model == "graph":  # trained in place: one fresh graph per run
        x, y = rng.standard_normal((6, 24)), rng.integers(0, 6, 24)
        make = lambda: pp.Graph.residual_mlp(6, 2, "tanh", 0)  # noqa: E731
        options = dict(method="cyclic-reduction", groups=True, gradient_error=True)
    else:
        if kind == "array_api_strict":
            pytest.skip("the strict namespace has no sparse arrays")
        x, y = rng.standard_normal((6, 24)), rng.integers(0, 3, 24)
        make = lambda: pp.FNN.random([6, 8, 3], activation="tanh", seed=0,  # noqa: E731
                                     density=0.5)
        options = dict(optimizer="adam", lr=0.01)
    on = lambda a: pp.backend.convert(a, kind)  # noqa: E731
    reference, expected = train(make(), x, y, batch_size=8, x_test=x, y_test=y, **options)
    trained, history = train(make().to(kind), on(x), on(y), batch_size=8, x_test=on(x),
                             y_test=on(y), **options)
    assert trained.backend.name == kind
    for name, value in pp.training.parameters(reference).items():
        mine = pp.training.parameters(trained)[name]
        assert pp.backend.is_sparse(mine) == pp.backend.is_sparse(value)
        assert relative_error(pp.backend.dense(pp.backend.to_host(mine)),
                              pp.backend.dense(value)) < 1e-12
    for ours, theirs in zip(history.epochs, expected.epochs):
        assert ours.keys() == theirs.keys()
        for key in ours.keys() - {"seconds"}:
            assert ours[key] == pytest.approx(theirs[key], rel=1e-12)


def test_data_on_another_backend_than_the_model_is_named():
    torch = pytest.importorskip("torch")
    net = pp.FNN.random([4, 6, 3], seed=0).to("torch")
    x, y = np.ones((4, 8)), np.ones((3, 8))
    with pytest.raises(ValueError, match=r"x is a numpy array but the model's arrays are torch"):
        pp.train(net, x, y, loss="mse")
    X = torch.ones((4, 8), dtype=torch.float64)
    with pytest.raises(ValueError, match=r"x_test is a numpy array"):
        pp.train(net, X, torch.ones((3, 8), dtype=torch.float64), loss="mse", x_test=x,
                 y_test=y)
    with pytest.raises(ValueError, match=r"y is a numpy array but the model's arrays are torch"):
        pp.train(net, X, y, loss="mse")  # before any step, not at the first
    labels = np.arange(8) % 3  # host labels go with a model anywhere
    trained, history = pp.train(net, X, labels, loss="cross_entropy", progress=False)
    assert trained.backend.name == "torch" and len(history.epochs) == 1


def test_a_step_that_overflows_names_its_epoch_step_and_learning_rate():
    """lr=1e8 on an MSE: the weights overflow within the first epoch.

    The error said only that substitution's blocks were not finite, with the advice
    to use a direct method such as substitution.
    """
    xtr, ytr, _, _ = digits(seed=0)
    net = pp.FNN.random([64, 16, 10], activation="relu", output_activation="identity", seed=0)
    targets = np.eye(10)[ytr].T
    with pytest.raises(pp.ConvergenceError) as failed:
        train(net, xtr, targets, lr=1e8, epochs=2, loss="mse", progress=False)
    message = str(failed.value)
    steps = int(message.split("step ")[1].split()[0])
    assert message.startswith("substitution: pp.train, epoch 1, step ") and steps > 1
    assert f"(after {steps - 1} updates, lr=1e+08): non-finite values" in message
    assert "the learning rate" in message and "such as 'substitution'" not in message
