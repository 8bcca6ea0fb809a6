"""Computation graphs, layers with Jacobians and PyTorch import, against autograd (issue 6)."""

import numpy as np
import pytest

import propop as pp
from propop import layers as L
from cases import relative_error
from reference import torch
from propop.interop.torch_import import Residual

nn = torch.nn
SOLVERS = ["substitution", "level-scheduled", "batched-gmres", "scipy.gmres"]
TORCH_NAMES = {"W": "weight", "b": "bias"}


def torch_gradients(module, x):
    """Output, dx and parameter gradients of 1/2 ||module(x)||^2 (float64, samples first)."""
    module = module.double()
    module.zero_grad()
    X = torch.tensor(x, requires_grad=True)
    out = module(X)
    (0.5 * (out**2).sum()).backward()
    return out.detach().numpy(), X.grad.numpy(), {
        name: p.grad.numpy() for name, p in module.named_parameters()}


def check_against_torch(module, x, methods=SOLVERS, input_shape=None):
    """The gradients of ``from_torch(module)`` equal autograd's for every method."""
    r = x.shape[0]
    out, dx, params = torch_gradients(module, x)
    graph = pp.from_torch(module, input_shape)
    flat = x.reshape(r, -1).T
    trace = graph.forward(flat)
    assert relative_error(graph.output_values(trace)[0], out.reshape(r, -1).T) < 1e-13
    target = np.zeros((graph.sizes[-1], r))
    for method in methods:
        g = pp.backprop(graph, flat, target, method=method)
        assert relative_error(g.x, dx.reshape(r, -1).T) < 1e-10, method
        ours = {f"{node}.{TORCH_NAMES[k]}": v for node, grads in g.parameters.items()
                for k, v in grads.items()}
        assert set(ours) == set(params)
        for name, value in params.items():
            assert relative_error(ours[name], value) < 1e-10, (method, name)
    return graph


def test_resnet_style_blocks_match_autograd():
    torch.manual_seed(0)
    def block():
        return Residual(nn.Sequential(nn.Linear(6, 6), nn.Tanh(), nn.Linear(6, 6)))

    module = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), block(), nn.Sigmoid(), block(),
                           nn.Linear(6, 3))
    x = np.random.default_rng(0).standard_normal((5, 4))
    graph = check_against_torch(module, x)
    system = pp.backward_system(graph, graph.forward(x.T), [np.ones((3, 5))])
    assert not system.blocks.is_chain  # the residual sums read two blocks
    with pytest.raises(ValueError, match="not block bi-diagonal.*groups=True"):
        pp.solve(system, "cyclic-reduction")
    # each residual block one node: block bi-diagonal over groups, and CR applies
    sizes = [len(group) for group in system.blocks.groups]
    assert max(sizes) == 4 and sum(sizes) == system.nblocks
    sol = pp.solve(system, "cyclic-reduction", groups=True, check=True)
    assert relative_error(sol.x, pp.solve(system, "substitution").x) < 1e-13
    assert sol.info["levels"] == {"within": 4, "groups": int(np.ceil(np.log2(len(sizes))))}
    grads = pp.backprop(graph, x.T, np.zeros((3, 5)), method="cyclic-reduction", groups=True)
    _, dx, params = torch_gradients(module, x)
    assert relative_error(grads.x, dx.T) < 1e-10
    assert relative_error(grads.parameters["2.body.0"]["W"], params["2.body.0.weight"]) < 1e-10


def test_conv_net_matches_autograd():
    torch.manual_seed(1)
    module = nn.Sequential(nn.Conv2d(2, 3, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                           nn.Conv2d(3, 4, 3, stride=2, padding=1), nn.Tanh(),
                           nn.AvgPool2d(2, stride=1), nn.Flatten(), nn.Linear(4, 3))
    x = np.random.default_rng(1).standard_normal((3, 2, 8, 8))
    graph = check_against_torch(module, x, SOLVERS + ["cyclic-reduction"], (2, 8, 8))
    trace = graph.forward(x.reshape(3, -1).T)
    system = pp.backward_system(graph, trace, graph.loss_gradient(trace, np.zeros((3, 3))))
    assert system.blocks.is_chain  # a plain sequence: block bi-diagonal, so CR applies
    assert pp.solve(system, "cyclic-reduction").levels == int(np.ceil(np.log2(len(graph.order))))


def test_conv1d_net_matches_autograd():
    torch.manual_seed(2)
    module = nn.Sequential(nn.Conv1d(2, 4, 3, stride=2, padding=1), nn.ELU(),
                           nn.Conv1d(4, 2, 2), nn.Flatten(), nn.Linear(8, 2))
    x = np.random.default_rng(2).standard_normal((4, 2, 10))
    check_against_torch(module, x, input_shape=(2, 10))


def test_densenet_style_concatenation_matches_autograd():
    rng = np.random.default_rng(3)
    W1, W2, W3 = rng.standard_normal((5, 4)), rng.standard_normal((5, 9)), \
        rng.standard_normal((2, 14))
    g = pp.Graph(4).add("fc1", L.Dense(W1)).add("a1", L.Activation("gelu")) \
        .add("cat1", L.Concat(), ["input", "a1"]).add("fc2", L.Dense(W2)) \
        .add("a2", L.Activation("softplus")).add("cat2", L.Concat(), ["cat1", "a2"]) \
        .add("out", L.Dense(W3, rng.standard_normal(2)))
    x, t = rng.standard_normal((4, 3)), rng.standard_normal((2, 3))
    X = torch.tensor(x.T, requires_grad=True)
    tW = [torch.tensor(W, requires_grad=True) for W in (W1, W2, W3)]
    a1 = nn.functional.gelu(X @ tW[0].T, approximate="tanh")
    cat1 = torch.cat([X, a1], dim=1)
    cat2 = torch.cat([cat1, nn.functional.softplus(cat1 @ tW[1].T)], dim=1)
    out = cat2 @ tW[2].T + torch.tensor(g.layers["out"].bias)
    (0.5 * ((out - torch.tensor(t.T)) ** 2).sum()).backward()
    for method in SOLVERS:
        grads = pp.backprop(g, x, t, method=method)
        assert relative_error(grads.x, X.grad.numpy().T) < 1e-10
        for node, W in zip(("fc1", "fc2", "out"), tW):
            assert relative_error(grads.parameters[node]["W"], W.grad.numpy()) < 1e-10


def test_an_fnn_is_a_chain_of_dense_and_activations():
    net = pp.FNN.random([5, 7, 6, 3], activation="tanh", seed=0, bias=0.1)
    graph = net.to_graph()
    x, t = np.random.default_rng(0).standard_normal((5, 4)), np.zeros((3, 4))
    want = pp.backprop(net, x, t)
    for method in ("substitution", "cyclic-reduction", "level-scheduled"):
        got = pp.backprop(graph, x, t, method=method)
        for k in range(3):
            assert relative_error(got.parameters[f"fc{k}"]["W"], want.W[k]) < 1e-12
            assert relative_error(got.parameters[f"fc{k}"]["b"], want.b[k]) < 1e-12
        assert relative_error(got.x, want.x) < 1e-12


def test_layer_jacobians_match_finite_differences():
    rng = np.random.default_rng(4)
    cases = [(L.Conv2d(rng.standard_normal((2, 2, 3, 3)), input_shape=(2, 5, 5), stride=2,
                       padding=1), [rng.standard_normal(50)]),
             (L.AvgPool2d(3, 2, 1, input_shape=(2, 5, 5)), [rng.standard_normal(50)]),
             (L.MaxPool2d(2, input_shape=(1, 4, 4)), [rng.standard_normal(16)]),
             (L.Activation("sigmoid"), [rng.standard_normal(6)]),
             (L.Concat(), [rng.standard_normal(3), rng.standard_normal(2)])]
    h = 1e-6
    for layer, inputs in cases:
        J = layer.jacobian(inputs)
        for i, x in enumerate(inputs):
            for j in range(len(x)):
                up = [v.copy() for v in inputs]
                down = [v.copy() for v in inputs]
                up[i][j] += h
                down[i][j] -= h
                column = (layer.forward(up) - layer.forward(down)) / (2 * h)
                np.testing.assert_allclose(J[i].toarray()[:, j], column, atol=1e-6)


def test_rnn_import_matches_torch():
    torch.manual_seed(5)
    module = nn.RNN(3, 4, num_layers=2, nonlinearity="relu").double()
    rnn = pp.from_torch(module)
    xs = np.random.default_rng(5).standard_normal((6, 3, 2))
    out, _ = module(torch.tensor(xs.transpose(0, 2, 1)))
    assert relative_error(rnn.forward(xs).output, out.detach().numpy().transpose(0, 2, 1)) \
        < 1e-13


@pytest.mark.parametrize("model", ["fnn", "rnn", "graph"])
def test_newton_forward_matches_the_sequential_pass(model):
    rng = np.random.default_rng(6)
    if model == "fnn":
        net, x = pp.FNN.random([4, 6, 6, 6, 3], activation="tanh", seed=0), \
            rng.standard_normal((4, 2))
    elif model == "rnn":
        net, x = pp.RNN.random([3, 4, 4], activation="tanh", seed=0), \
            rng.standard_normal((5, 3, 2))
    else:
        net = pp.FNN.random([4, 6, 6], activation="elu", seed=0).to_graph()
        net.add("res", L.Add(), ["act0", "act1"]).add("out", L.Dense(rng.standard_normal(
            (2, 6))))
        x = rng.standard_normal((4, 2))
    trace = pp.forward(net, x, method="level-scheduled", linearization="newton")
    exact = net.forward(x)
    assert trace.info["converged"]
    assert max(relative_error(a, b) for a, b in zip(trace.z, exact.z)) < 1e-10
    system = pp.forward_system(net, x, linearization="newton")
    assert trace.info["iterations"] <= system.nblocks - 1


def test_graphs_with_two_outputs():
    rng = np.random.default_rng(9)
    g = pp.Graph(4, outputs=["head1", "head2"])
    g.add("trunk", L.Dense(rng.standard_normal((5, 4)))).add("act", L.Activation("tanh"))
    g.add("head1", L.Dense(rng.standard_normal((2, 5))), "act")
    g.add("head2", L.Activation("sigmoid"), "act")
    x, t1, t2 = rng.standard_normal((4, 3)), rng.standard_normal((2, 3)), \
        rng.standard_normal((5, 3))
    X = torch.tensor(x.T, requires_grad=True)
    W = [torch.tensor(g.layers[n].W, requires_grad=True) for n in ("trunk", "head1")]
    a = torch.tanh(X @ W[0].T)
    loss = 0.5 * ((a @ W[1].T - torch.tensor(t1.T)) ** 2).sum() + \
        0.5 * ((torch.sigmoid(a) - torch.tensor(t2.T)) ** 2).sum()
    loss.backward()
    for method in ("substitution", "level-scheduled", "batched-gmres"):
        grads = pp.backprop(g, x, [t1, t2], method=method)
        assert relative_error(grads.x, X.grad.numpy().T) < 1e-10
        assert relative_error(grads.parameters["trunk"]["W"], W[0].grad.numpy()) < 1e-10
    with pytest.raises(ValueError, match="2 outputs need 2 targets"):
        pp.backprop(g, x, [t1])


def test_newton_forward_stops_on_the_relative_change():
    net = pp.FNN.random([4, 6, 6, 3], activation="tanh", seed=0).to_graph()
    x = np.random.default_rng(10).standard_normal((4, 2))
    trace = pp.forward(net, x, stop="change", rtol=1e-12)
    assert trace.info["changes"][-1] <= 1e-12 and trace.info["converged"]
    assert len(trace.info["changes"]) == trace.info["iterations"]
    with pytest.raises(ValueError, match="stop must be one of"):
        pp.forward(net, x, stop="never")


def test_newton_forward_on_contractive_and_expanding_nets():
    """Contractive layers converge in few Newton steps (DEER/DeepPCR); expanding may not."""
    rng = np.random.default_rng(7)
    W = [np.linalg.qr(rng.standard_normal((8, 8)))[0] for _ in range(24)]
    x = rng.standard_normal((8, 2))
    calm = pp.FNN([0.3 * w for w in W], activation="tanh")
    trace = pp.forward(calm, x, rtol=1e-12)
    assert trace.info["converged"] and trace.info["iterations"] <= 6 < len(W)
    wild = pp.FNN([4.0 * w for w in W], activation="tanh")
    few = pp.forward(wild, x, rtol=1e-12, maxiter=6, check=False)
    assert not few.info["converged"]
    with pytest.raises(pp.ConvergenceError, match="forward iteration stopped after 6"):
        pp.forward(wild, x, rtol=1e-12, maxiter=6)


def test_bad_graphs_are_named():
    rng = np.random.default_rng(8)
    with pytest.raises(ValueError, match="cycle through nodes \\['a', 'b'\\]"):
        pp.Graph(3, nodes=[("a", L.Add(), ["input", "b"]), ("b", L.Add(), ["a"])])
    with pytest.raises(KeyError, match="reads unknown node\\(s\\) \\['nope'\\]"):
        pp.Graph(3).add("a", L.Activation("tanh"), "nope")
    with pytest.raises(ValueError, match="node 'fc' \\(Dense\\(4 -> 2\\)\\): .*size 4, got 3"):
        pp.Graph(3).add("fc", L.Dense(rng.standard_normal((2, 4))))
    with pytest.raises(ValueError, match="node 'sum'.*one size"):
        pp.Graph(3).add("fc", L.Dense(rng.standard_normal((2, 3)))).add(
            "sum", L.Add(), ["input", "fc"])
    with pytest.raises(ValueError, match="already exists"):
        pp.Graph(3).add("a", L.Activation("tanh")).add("a", L.Activation("tanh"))
    with pytest.raises(ValueError, match="non-overlapping"):
        L.MaxPool2d(3, stride=2, input_shape=(1, 5, 5))
    with pytest.raises(ValueError, match="unsupported module LSTM"):
        pp.from_torch(nn.Sequential(nn.Linear(2, 2), nn.LSTM(2, 2)))
    with pytest.raises(ValueError, match="input_shape is needed"):
        pp.from_torch(nn.Sequential(nn.Conv2d(1, 1, 2)))
    with pytest.raises(ValueError, match="x has shape"):
        pp.Graph(3).add("a", L.Activation("tanh")).forward(np.ones(4))


def test_the_shared_identities_are_made_once_read_only_and_their_own_transpose():
    """A graph's structural couplings (activations' inputs, residual sums) are shared."""
    from propop.layers.base import scaled_identity, transposed

    eye, minus = scaled_identity(5), scaled_identity(5, -1.0)
    assert scaled_identity(5) is eye and scaled_identity(6) is not eye
    assert eye.format == "csr" and eye.has_canonical_format
    np.testing.assert_array_equal(eye.toarray(), np.eye(5))
    np.testing.assert_array_equal(minus.toarray(), -np.eye(5))
    with pytest.raises(ValueError, match="read-only"):
        eye.data[0] = 2.0  # a caller cannot change what every graph shares
    assert transposed(eye) is eye and transposed(minus) is minus
    M = pp.layers.Dense(np.arange(6.0).reshape(2, 3)).W
    np.testing.assert_array_equal(transposed(M), M.T)
    import scipy.sparse as sp

    other = sp.eye_array(5, format="csr")  # an identity not made here: transposed as any
    assert transposed(other) is not other


@pytest.mark.parametrize("weights", [None, (1.0, -1.0), (0.5, 2.0, -3.0)])
def test_add_sums_its_inputs_as_its_jacobians_say(weights):
    """``Add.forward`` (no product) against ``sum_i J_i x_i`` of its own Jacobians, exactly."""
    rng = np.random.default_rng(0)
    count = 2 if weights is None else len(weights)
    xs = [rng.standard_normal((4, 3)) for _ in range(count)]
    add = L.Add(weights)
    products = sum(J @ x for J, x in zip(add.jacobians([4] * count), xs))
    np.testing.assert_array_equal(add.forward(xs), products)


def test_a_node_that_feeds_nothing_and_is_no_output_is_warned_about_once():
    """A second head left out of ``outputs``: computed, zero gradients, said so."""
    rng = np.random.default_rng(0)
    g = pp.Graph(4).add("a", L.Dense(rng.standard_normal((5, 4)))).add("t", L.Activation("tanh"))
    g.add("head1", L.Dense(rng.standard_normal((2, 5))), ["t"])
    g.add("head2", L.Dense(rng.standard_normal((3, 5))), ["t"])
    x = np.ones((4, 2))
    with pytest.warns(UserWarning, match=r"node\(s\) \['head1'\] feed no node and are not "
                                         r"outputs .*'head2'.*zero gradients"):
        g.forward(x)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once for this set of nodes
        grads = pp.backprop(g, x, np.zeros((3, 2)))
        assert not np.any(grads.parameters["head1"]["W"])
        both = pp.Graph(4, [(n, g.layers[n], g.inputs[n]) for n in g.order[1:]],
                        outputs=["head1", "head2"])
        assert len(both.forward(x).z) == 5 and both.outputs == ("head1", "head2")
        assert "outputs ['head2']" in repr(g)
