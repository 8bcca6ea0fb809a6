"""A graph that is a chain of dense layers, computed as the FNN it is (propop.networks.graph_fnn).

The FNN found must be the graph's network on the graph's own arrays, and every
graph that is not such a chain must be left alone. References: the graph's own
sequential pass and backprop (independent systems: one block per node), and
PyTorch autograd through the parallelized module.
"""

import copy

import numpy as np
import pytest

import propop as pp
from propop.layers import Activation, Add, Dense
from propop.networks.graph_fnn import as_fnn

torch = pytest.importorskip("torch")

import propop.torch as ptorch  # noqa: E402
from test_parallelize import gradients  # noqa: E402


def sequential(*parts):
    torch.manual_seed(0)
    return torch.nn.Sequential(*parts).double()


def linear(m, n, bias=True):
    return torch.nn.Linear(m, n, bias=bias)


def test_a_sequential_mlp_is_the_fnn_of_its_layers_on_the_graphs_arrays():
    module = sequential(linear(5, 6), torch.nn.Tanh(), linear(6, 6, bias=False), torch.nn.ReLU(),
                        linear(6, 3))
    graph = pp.from_torch(module)
    found = as_fnn(graph)
    assert found is not None and found.dense == ("0", "2", "4")
    net = found.net
    assert [a.name for a in net.activations] == ["tanh", "relu", "identity"]
    assert all(net.W[k] is graph.layers[node].W for k, node in enumerate(found.dense))
    assert net.b[0] is graph.layers["0"].bias and net.b[2] is graph.layers["4"].bias
    assert not np.any(net.b[1])  # the bias-free layer: zeros of its own
    x = np.random.default_rng(0).standard_normal((5, 4))
    np.testing.assert_allclose(net.forward(x).output, graph.output_values(graph.forward(x))[0],
                               rtol=1e-13, atol=1e-14)
    np.testing.assert_allclose(net.forward(x).output,
                               module(torch.as_tensor(x.T)).detach().numpy().T, rtol=1e-13)


def test_the_fnns_gradients_are_the_graphs_under_its_names():
    module = sequential(linear(4, 6), torch.nn.Sigmoid(), linear(6, 6, bias=False),
                        linear(6, 2), torch.nn.Tanh())
    graph = pp.from_torch(module)
    found = as_fnn(graph)
    assert found.dense == ("0", "2", "3")
    rng = np.random.default_rng(1)
    x, t = rng.standard_normal((4, 3)), rng.standard_normal((2, 3))
    ours = found.named(pp.backprop(found.net, x, t))
    theirs = pp.backprop(graph, x, t)
    assert dict(ours.named_parameters()).keys() == dict(theirs.named_parameters()).keys()
    assert "2.bias" not in dict(ours.named_parameters())
    for (name, a), (_, b) in zip(ours.named_parameters(), theirs.named_parameters()):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14, err_msg=name)
    np.testing.assert_allclose(ours.x, theirs.x, rtol=1e-12, atol=1e-14)


def test_a_weight_changed_in_place_in_the_graph_is_the_fnns():
    graph = pp.from_torch(sequential(linear(3, 3), torch.nn.Tanh(), linear(3, 2)))
    net = as_fnn(graph).net
    x = np.ones((3, 2))
    before = net.forward(x).output.copy()
    graph.layers["2"].W[...] *= 2.0  # as parallelize's load writes an optimiser's step
    after = net.forward(x).output
    np.testing.assert_allclose(after, graph.output_values(graph.forward(x))[0], rtol=1e-14)
    assert not np.allclose(after, before)


@pytest.mark.parametrize(("why", "build"), [
    ("a residual connection", lambda: pp.from_torch(sequential(
        linear(4, 4), ptorch_residual(), linear(4, 2)))),
    ("two activations in a row", lambda: pp.from_torch(sequential(
        linear(4, 4), torch.nn.Tanh(), torch.nn.ReLU(), linear(4, 2)))),
    ("a layer that is neither", lambda: pp.from_torch(sequential(
        linear(4, 4), torch.nn.LayerNorm(4), linear(4, 2)))),
    ("an activation first", lambda: pp.from_torch(sequential(torch.nn.Tanh(), linear(4, 2)),
                                                  input_shape=(4,))),
])
def test_a_graph_that_is_no_chain_of_dense_layers_is_no_fnn(why, build):
    assert as_fnn(build()) is None, why


def ptorch_residual():
    from propop.interop.torch_import import Residual

    return Residual(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh()))


def test_a_node_read_twice_or_two_outputs_is_no_fnn():
    rng = np.random.default_rng(2)
    W = [rng.standard_normal((3, 3)) for _ in range(2)]
    branch = pp.Graph(3)
    branch.add("a", Dense(W[0]), "input")
    branch.add("f", Activation("tanh"), "a")
    branch.add("b", Dense(W[1]), "f")
    branch.add("sum", Add(), ["b", "f"])  # f read twice
    assert as_fnn(branch) is None
    two = pp.Graph(3, outputs=["f", "b"])
    two.add("a", Dense(W[0]), "input")
    two.add("f", Activation("tanh"), "a")
    two.add("b", Dense(W[1]), "f")
    assert as_fnn(two) is None


@pytest.mark.parametrize("backend", ["numpy", "torch"])
@pytest.mark.parametrize(("method", "forward"), [
    ("substitution", "sequential"), ("cyclic-reduction", "sequential"),
    ("jacobi", "newton")])
def test_parallelize_computes_a_sequential_mlp_as_its_fnn(method, forward, backend):
    """Autograd's outputs and gradients, from the FNN's systems (``l + 1`` blocks)."""
    shared = linear(6, 6)  # tied: used twice, its gradient the sum of both uses
    module = sequential(linear(5, 6), torch.nn.Tanh(), shared, torch.nn.SiLU(), shared,
                        linear(6, 3, bias=False), torch.nn.Sigmoid())
    reference = copy.deepcopy(module)
    x = torch.randn(4, 5, dtype=torch.float64)
    ours = ptorch.parallelize(module, method=method, forward=forward, example_input=x,
                              backend=backend)
    out, dx, grads = gradients(ours, x)
    out_ref, dx_ref, grads_ref = gradients(reference, x)
    torch.testing.assert_close(out, out_ref, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(dx, dx_ref, rtol=1e-9, atol=1e-12)
    assert grads.keys() == grads_ref.keys()
    for name, g in grads_ref.items():
        torch.testing.assert_close(grads[name], g, rtol=1e-9, atol=1e-12, msg=name)
    solution = ours.propop.last["backward"]
    assert solution.converged and solution.x.shape == (5 + 3 * 6 + 3, 4)  # the graph: 43 rows


def test_adam_steps_through_the_fnn_equal_plain_autograds():
    """Parameters the optimiser changes in place reach the FNN at every step."""
    module = sequential(linear(5, 8), torch.nn.Tanh(), linear(8, 8), torch.nn.Tanh(),
                        linear(8, 4))
    plain, start = copy.deepcopy(module), copy.deepcopy(module)
    ours = ptorch.parallelize(module, method="cyclic-reduction")
    x = torch.randn(6, 5, dtype=torch.float64)
    target = torch.randint(0, 4, (6,), generator=torch.Generator().manual_seed(3))
    for model in (ours, plain):
        optimiser = torch.optim.Adam(model.parameters(), lr=0.05)
        for _ in range(5):
            optimiser.zero_grad()
            torch.nn.functional.cross_entropy(model(x), target).backward()
            optimiser.step()
    for (name, p), (_, q) in zip(module.named_parameters(), plain.named_parameters()):
        torch.testing.assert_close(p, q, rtol=1e-10, atol=1e-12, msg=name)
    assert all(not torch.allclose(p, q) for p, q in zip(module.parameters(), start.parameters()))


def test_a_parameter_the_graph_rebinds_is_seen_not_the_old_one():
    """``current()`` finds the FNN anew when a weight or bias is rebound (set_parameter)."""
    graph = pp.from_torch(sequential(linear(3, 3, bias=False), torch.nn.Tanh(), linear(3, 2)))
    found = as_fnn(graph)
    assert found.current() is found  # nothing rebound: itself, no work
    x = np.ones((3, 2))
    graph.layers["2"].set_parameter("b", np.full(2, 0.5))  # a bias rebound alone
    again = found.current()
    assert again is not found and again.net.b[1] is graph.layers["2"].bias
    graph.layers["2"].set_parameter("W", 2 * graph.layers["2"].W)
    latest = again.current()
    assert latest is not again and latest.net.W[1] is graph.layers["2"].W
    np.testing.assert_allclose(latest.net.forward(x).output,
                               graph.output_values(graph.forward(x))[0], rtol=1e-14)
    assert not np.allclose(found.net.forward(x).output, latest.net.forward(x).output)


def test_parallelize_sees_a_weight_rebound_in_its_graph():
    module = sequential(linear(4, 5), torch.nn.Tanh(), linear(5, 2))
    ours = ptorch.parallelize(module, method="substitution")
    x = torch.randn(3, 4, dtype=torch.float64)
    first = ours.propop.net_on(x.device)
    ours(x)
    graph = ours.propop.graph
    graph.layers["2"].set_parameter("W", np.array(graph.layers["2"].W))  # a new array
    assert ours.propop.net_on(x.device) is not first
    torch.testing.assert_close(ours(x), module(x), rtol=1e-12, atol=1e-14)
