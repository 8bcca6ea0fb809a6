"""A graph on PyTorch copies nothing to its device after its first call, one number back.

On a GPU each copy is a transfer and a synchronisation; on the CPU they are free,
so they are counted: every host array or SciPy matrix sent to PyTorch
(``backend.like``, ``backend.convert``) and every tensor brought back
(``backend.to_host``: one a solve, its true residual's norm) during a second
backprop of each imported module, and during a parallelized transformer layer's
training step. The results are compared with NumPy's graph and with autograd, so
a kept array that went stale would show.
"""

import collections
import copy

import numpy as np
import pytest

import propop as pp
from propop import backend

torch = pytest.importorskip("torch")

from cases import gpu_backends  # noqa: E402
from test_graph_backends import MODULES, imported  # noqa: E402


@pytest.fixture
def copies(monkeypatch):
    """``Counter`` of the copies made while it is active, by direction."""
    seen = collections.Counter()
    like, convert, to_host = backend.like, backend.convert, backend.to_host

    def on_host(a):
        return isinstance(a, np.ndarray) or (backend.is_sparse(a) and
                                             backend.of(a).name == "numpy")

    def counted_like(values, array):
        seen["to the device"] += on_host(values)
        return like(values, array)

    def counted_convert(array, kind, device=None):
        seen["to the device"] += on_host(array)
        return convert(array, kind, device)

    def counted_to_host(array):
        seen["to the host"] += not on_host(array) and array is not None
        return to_host(array)

    monkeypatch.setattr(backend, "like", counted_like)
    monkeypatch.setattr(backend, "convert", counted_convert)
    monkeypatch.setattr(backend, "to_host", counted_to_host)
    return seen


@pytest.mark.parametrize(("kind", "device"), [("torch", None), *gpu_backends()])
@pytest.mark.parametrize("name", list(MODULES))
def test_a_graphs_second_backprop_on_pytorch_copies_nothing_but_its_check(name, kind, device,
                                                                          request):
    """One number comes back: the solve's true residual, which judges CONVERGED."""
    _, graph, x, target = imported(name)
    moved = graph.to(kind, device)
    X, T = (backend.convert(a, kind, device) for a in (x, target))
    pp.backprop(moved, X, T)  # the structure and the index arrays go there once
    seen = request.getfixturevalue("copies")
    grads = pp.backprop(moved, X, T, check=True)
    assert seen == collections.Counter({"to the host": 1}), dict(seen)
    expected = pp.backprop(graph, x, target)
    for (a, ga), (b, gb) in zip(grads.named_parameters(), expected.named_parameters()):
        assert a == b
        np.testing.assert_allclose(backend.to_host(ga), gb, rtol=1e-12, atol=1e-14)


def test_a_parallelized_transformer_step_brings_back_only_its_residual_check(request):
    """``backend="torch"``: one number to the host a step (the solve's true residual)."""
    import propop.torch as ptorch

    torch.manual_seed(0)
    plain = torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True).double()
    x = torch.randn(3, 4, 8, dtype=torch.float64)
    module = ptorch.parallelize(copy.deepcopy(plain), method="substitution",
                                example_input=x, backend="torch")

    def gradients(model):
        model.zero_grad()
        (model(x) ** 2).mean().backward()
        return [p.grad.clone() for p in model.parameters()]

    gradients(module)
    seen = request.getfixturevalue("copies")
    mine = gradients(module)
    assert seen == collections.Counter({"to the host": 1}), dict(seen)
    for a, b in zip(mine, gradients(plain)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("method", ["jacobi", "batched-gmres"])
def test_an_iterative_solve_sends_nothing_to_the_device_per_iteration(method, request):
    """The copies to the device do not grow with the iterations.

    Blocks of unequal sizes (padded once a layout for their norms), each iteration judged.
    """
    net = pp.FNN.random([8] + [16] * 9 + [4], activation="tanh", seed=0)  # 11 blocks
    rng = np.random.default_rng(1)
    x, target = rng.standard_normal((8, 5)), rng.standard_normal((4, 5))
    trace = net.forward(x)
    host = pp.backward_system(net, trace, net.loss_gradient(trace, target))
    moved = net.to("torch")
    trace = moved.forward(torch.from_numpy(x))
    system = pp.backward_system(moved, trace, moved.loss_gradient(trace, torch.from_numpy(
        target)))
    pp.solve(system, method, maxiter=1)  # the system's structure goes there once
    seen = request.getfixturevalue("copies")
    counts = []
    for maxiter in (2, 6):  # GMRES: one cycle (its default restart) of that many steps
        seen.clear()
        assert pp.solve(system, method, maxiter=maxiter).iterations == maxiter
        counts.append(seen["to the device"])
    assert counts[0] == counts[1], counts
    exact = pp.solve(system, method)
    assert exact.converged
    np.testing.assert_allclose(exact.x.numpy(), pp.solve(host, "substitution").x,
                               rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("method", ["substitution", "cyclic-reduction", "jacobi",
                                    "batched-gmres"])
@pytest.mark.parametrize("network", ["fnn", "rnn"])
def test_a_networks_second_backprop_on_pytorch_sends_nothing_to_the_device(network, method,
                                                                            request):
    """Unequal widths (padded block norms) and edge groups: their indices made once.

    GMRES sends 3 small arrays a cycle: the columns that go on, their norms and floors,
    decided on the host from the true residual (one cycle here: restart > nblocks).
    """
    rng = np.random.default_rng(2)
    if network == "fnn":
        net = pp.FNN.random([8, 16, 5, 4], activation="tanh", seed=0)
        x, target = rng.standard_normal((8, 5)), rng.standard_normal((4, 5))
    else:
        net = pp.RNN.random([4, 6, 6], activation="tanh", seed=0)
        x, target = rng.standard_normal((20, 4, 3)), rng.standard_normal((20, 6, 3))
    moved = net.to("torch")
    X, T = torch.from_numpy(x), torch.from_numpy(target)
    pp.backprop(moved, X, T, method=method)
    seen = request.getfixturevalue("copies")
    mine = pp.backprop(moved, X, T, method=method)
    assert seen["to the device"] == (3 if method == "batched-gmres" else 0), dict(seen)
    expected = pp.backprop(net, x, target)
    np.testing.assert_allclose(mine.W[0].numpy(), expected.W[0], rtol=1e-9, atol=1e-12)
