"""Imports faithful or refused (trust round 2, causes 4-6 and the import's internal errors).

Every accepted module is checked against PyTorch itself: forward values and
autograd gradients (under the module's own parameter names) and training steps.
"""

import numpy as np
import pytest

import propop as pp

torch = pytest.importorskip("torch")
nn = torch.nn


def autograd(module, x, target):
    """``{name: grad}`` of the summed squared error, samples as rows for PyTorch."""
    module.zero_grad()
    out = module(torch.tensor(x.T))
    (0.5 * ((out - torch.tensor(target.T)) ** 2).sum()).backward()
    return out.detach().numpy().T, {n: p.grad.numpy().copy() for n, p in module.named_parameters()}


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 4, bias=False), nn.Linear(4, 4)
        self.b.weight = self.a.weight  # tied: one parameter used twice

    def forward(self, x):
        return self.b(torch.tanh(self.a(x)))


def test_tied_weights_stay_one_parameter():
    torch.manual_seed(0)
    module = Tied().double()
    graph = pp.from_torch(module)
    assert graph.layers["a"].W is graph.layers["b"].W
    rng = np.random.default_rng(0)
    x, t = rng.standard_normal((4, 3)), rng.standard_normal((4, 3))
    out, want = autograd(module, x, t)
    for method in ("substitution", "cyclic-reduction", "jacobi"):
        g = pp.backprop(graph, x, t, method=method, groups=True) if method == \
            "cyclic-reduction" else pp.backprop(graph, x, t, method=method)
        named = dict(g.named_parameters())
        assert list(named) == [n for n, _ in module.named_parameters()] == ["a.weight", "b.bias"]
        for name, value in want.items():
            np.testing.assert_allclose(named[name], value, rtol=1e-10, atol=1e-14)
    state = pp.state_dict(graph)
    assert list(state) == ["a.weight", "b.bias"]  # one entry for the tied weight


def test_training_keeps_tied_weights_tied_as_torch_does():
    torch.manual_seed(1)
    module = Tied().double()
    graph = pp.from_torch(module)
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((4, 8)), rng.standard_normal((4, 8))
    graph, _ = pp.train(graph, x, y, loss="mse", lr=0.05, batch_size=8, epochs=3,
                        shuffle=False, progress=False, reduction="sum")
    assert graph.layers["a"].W is graph.layers["b"].W
    opt = torch.optim.SGD(module.parameters(), lr=0.05)
    for _ in range(3):
        opt.zero_grad()
        out = module(torch.tensor(x.T))
        (0.5 * ((out - torch.tensor(y.T)) ** 2).sum()).backward()
        opt.step()
    np.testing.assert_allclose(graph.layers["a"].W, module.a.weight.detach().numpy(),
                               rtol=1e-10, atol=1e-12)


def test_bias_free_layers_write_their_state_dict():
    torch.manual_seed(2)
    module = nn.Sequential(nn.Conv2d(1, 2, 3, bias=False), nn.ReLU(), nn.Flatten(),
                           nn.Linear(8, 3, bias=False)).double()
    graph = pp.from_torch(module, (1, 4, 4))
    state = pp.state_dict(graph)
    assert set(state) == {"0.weight", "3.weight"}
    missing = module.load_state_dict(state, strict=True)
    assert not missing.missing_keys and not missing.unexpected_keys


class ReusedAfterInPlace(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)
        self.act = nn.ReLU(inplace=True)

    def forward(self, x):
        h = self.fc(x)
        return self.act(h) + h  # PyTorch: both terms are relu(h), h was overwritten


class InPlaceAlone(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc, self.act, self.out = nn.Linear(3, 4), nn.ReLU(inplace=True), nn.Linear(4, 2)

    def forward(self, x):
        return self.out(self.act(self.fc(x)))


class InPlaceThroughAView(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        h = self.fc(x)
        v = h.view(-1, 2, 2)
        v.relu_()  # overwrites h as well
        return h.flatten(1) + x


@pytest.mark.parametrize("module", [ReusedAfterInPlace(), InPlaceThroughAView()],
                         ids=["reused", "view"])
def test_in_place_operations_read_again_are_refused_by_name(module):
    with pytest.raises(ValueError, match=r"overwrites .* also read.*out-of-place"):
        pp.from_torch(module.double())


def test_in_place_operations_nothing_else_reads_are_imported_exactly():
    torch.manual_seed(3)
    module = InPlaceAlone().double()
    graph = pp.from_torch(module)
    rng = np.random.default_rng(3)
    x, t = rng.standard_normal((3, 5)), rng.standard_normal((2, 5))
    out, want = autograd(module, x, t)
    np.testing.assert_allclose(graph.forward(x).output, out, rtol=1e-12)
    named = dict(pp.backprop(graph, x, t).named_parameters())
    for name, value in want.items():
        np.testing.assert_allclose(named[name], value, rtol=1e-10, atol=1e-14)


class Branches(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x):
        if x.sum() > 0:  # data-dependent: torch.fx cannot trace it
            return self.fc(x)
        return x


def test_data_dependent_control_flow_is_refused_naming_module_and_line():
    with pytest.raises(ValueError, match=r"from_torch: Branches.forward .* at .*"
                                         r"test_import_fidelity.py:\d+: if x.sum\(\) > 0:"
                                         r".*data-dependent control flow"):
        pp.from_torch(Branches().double())


@pytest.mark.parametrize("kind", [nn.GRU, nn.LSTM, nn.RNN])
def test_recurrent_dropout_in_training_mode_is_refused(kind):
    module = kind(3, 4, num_layers=2, dropout=0.5)
    with pytest.raises(ValueError, match=r"dropout=0.5\) in training mode.*module.eval\(\)"):
        pp.from_torch(module)
    imported = pp.from_torch(module.eval())  # no dropout in evaluation mode
    assert imported is not None


def test_parameters_with_requires_grad_build_a_network():
    torch.manual_seed(4)
    lin = [nn.Linear(3, 3), nn.Linear(3, 3)]
    net = pp.FNN([m.weight.double() for m in lin], [m.bias.double() for m in lin])
    x = torch.ones((3, 2), dtype=torch.float64)
    g = pp.backprop(net, x, torch.zeros((3, 2), dtype=torch.float64), method="substitution")
    assert g.solution.converged and not g.W[0].requires_grad
