"""Computation graphs on every backend: ``Graph.to``, then every native method there.

Imported PyTorch modules (residual blocks, convolutions with batch norm and
pooling, a softmax, LayerNorm and products) are moved to PyTorch tensors and to
``array_api_strict`` arrays (the standard's strict namespace: the graph's code
uses nothing beyond it) and backpropagated by every registered native method
that applies; the gradients are compared with PyTorch autograd on the module
itself, the forward values node by node with NumPy's graph.
"""

import numpy as np
import pytest

import propop as pp
from cases import gpu_backends
from propop import backend
from propop import layers as L

torch = pytest.importorskip("torch")
strict = pytest.importorskip("array_api_strict")
nn = torch.nn

from test_torch_trace import (  # noqa: E402
    ConvNet,
    Conv1dNet,
    Einsums,
    Extremes,
    HandWritten,
    Positions,
    PreNormSwiGLU,
    ResidualMLP,
    TokenNorm,
    randomised,
)

BACKENDS = [pytest.param("torch", None, id="torch"),
            pytest.param("array_api_strict", None, id="array_api_strict"), *gpu_backends()]
MODULES = {"residual-mlp": (ResidualMLP, (5,)), "conv2d": (ConvNet, (2, 9, 9)),
           "conv1d": (Conv1dNet, (2, 9)), "swiglu": (PreNormSwiGLU, (6,)),
           "handwritten": (HandWritten, (5,)), "token-norm": (TokenNorm, (4, 6)),
           "positions": (Positions, (4, 6)), "extremes": (Extremes, (4, 6)),
           "einsums": (Einsums, (4, 6))}
NATIVE = [s.name for s in pp.solvers.available() if s.native and s.available]
EXACT = {s.name for s in pp.solvers.available() if s.exact}


def imported(name):
    """``(module, graph, x, target)``: the module in float64, samples as columns."""
    make, shape = MODULES[name]
    torch.manual_seed(0)
    module = randomised(make()).double()
    graph = pp.from_torch(module, shape if len(shape) > 1 else None)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((int(np.prod(shape)), 3))
    return module, graph, x, rng.standard_normal((graph.sizes[-1], 3))


def autograd(name, module, x, target):
    """``{name: grad}`` of ``1/2 ||module(x) - target||^2`` and ``dE/dx``, by PyTorch."""
    module.zero_grad()
    X = torch.tensor(x.T.reshape((x.shape[1],) + MODULES[name][1]), requires_grad=True)
    out = module(X).reshape(x.shape[1], -1)
    (0.5 * ((out - torch.tensor(target.T)) ** 2).sum()).backward()
    return ({n: p.grad.numpy().copy() for n, p in module.named_parameters()
             if p.requires_grad},
            X.grad.numpy().reshape(x.shape[1], -1).T)


def on(kind, device, array):
    return backend.convert(array, kind, device)


@pytest.mark.parametrize(("kind", "device"), BACKENDS)
@pytest.mark.parametrize("name", list(MODULES))
def test_an_imported_graph_backpropagates_like_autograd_on_every_backend(kind, device, name):
    module, graph, x, target = imported(name)
    dparams, dx = autograd(name, module, x, target)
    moved = graph.to(kind, device)
    assert moved.backend.name == kind and graph.backend.name == "numpy"
    X, T = on(kind, device, x), on(kind, device, target)
    trace, reference = moved.forward(X), graph.forward(x)
    for k, node in enumerate(graph.order):
        assert backend.of(trace.z[k]).name == kind
        np.testing.assert_allclose(backend.to_host(trace.z[k]), reference.z[k], rtol=1e-13,
                                   atol=1e-14, err_msg=node)
    system = pp.backward_system(graph, reference, graph.loss_gradient(reference, target))
    methods = [(m, {}) for m in NATIVE if pp.solvers.info(m).applies_to(system)]
    methods.append(("cyclic-reduction", {"groups": True}))
    assert len(methods) >= 8
    for method, options in methods:
        g = pp.backprop(moved, X, T, method=method, **options)
        bound = 1e-10 if method in EXACT else 1e-7
        ours = dict(g.named_parameters())
        assert set(ours) == set(dparams), method
        for pname, value in dparams.items():
            assert backend.of(ours[pname]).name == kind, (method, pname)
            mine = backend.to_host(ours[pname])
            assert np.abs(mine - value).max() <= bound * max(np.abs(value).max(), 1), \
                (method, pname)
        assert np.abs(backend.to_host(g.x) - dx).max() <= bound * max(np.abs(dx).max(), 1)


@pytest.mark.parametrize(("kind", "device"), BACKENDS)
def test_newton_forward_of_a_moved_graph_is_the_sequential_pass(kind, device):
    _, graph, x, _ = imported("swiglu")
    moved, X = graph.to(kind, device), on(kind, device, x)
    near = moved.forward(X + 0.05)
    exact = graph.forward(x)
    newton = pp.forward(moved, X, method="substitution", linearization="newton", around=near)
    assert newton.info["converged"]
    for k, node in enumerate(graph.order):
        assert backend.of(newton.z[k]).name == kind
        np.testing.assert_allclose(backend.to_host(newton.z[k]), exact.z[k], rtol=1e-9,
                                   atol=1e-12, err_msg=node)


def test_tied_weights_stay_one_array_when_moved():
    from test_import_fidelity import Tied

    torch.manual_seed(0)
    module = Tied().double()
    moved = pp.from_torch(module).to("torch")
    assert moved.layers["a"].W is moved.layers["b"].W
    assert isinstance(moved.layers["a"].W, torch.Tensor)
    rng = np.random.default_rng(0)
    x, t = rng.standard_normal((4, 3)), rng.standard_normal((4, 3))
    g = dict(pp.backprop(moved, torch.from_numpy(x), torch.from_numpy(t)).named_parameters())
    module.zero_grad()
    out = module(torch.tensor(x.T))
    (0.5 * ((out - torch.tensor(t.T)) ** 2).sum()).backward()
    assert set(g) == {"a.weight", "b.bias"}
    np.testing.assert_allclose(g["a.weight"].numpy(), module.a.weight.grad.numpy(), rtol=1e-12)


def test_values_changed_in_place_are_read_again():
    """The couplings are made from the layers' current values on every call."""
    _, graph, x, target = imported("residual-mlp")
    moved = graph.to("torch")
    X, T = torch.from_numpy(x), torch.from_numpy(target)
    before = pp.backprop(moved, X, T, method="level-scheduled").x.numpy()
    with torch.no_grad():
        moved.layers["fc1"].W.mul_(-2.0)
    graph.layers["fc1"].W *= -2.0
    after = pp.backprop(moved, X, T, method="level-scheduled").x.numpy()
    np.testing.assert_allclose(after, pp.backprop(graph, x, target).x, rtol=1e-12)
    assert np.abs(after - before).max() > 1e-3


def test_a_moved_graph_says_what_it_takes():
    rng = np.random.default_rng(0)
    import scipy.sparse as sp

    sparse = pp.Graph(4).add("fc", L.Dense(sp.random(4, 4, density=0.5, random_state=0)))
    with pytest.raises(TypeError, match=r"node 'fc': .*dense here.*'numpy', 'cupy' or 'torch'"):
        sparse.to("array_api_strict")
    moved = pp.Graph.residual_mlp(4, 1).to("torch")
    with pytest.raises(ValueError,
                       match=r"x is a numpy.ndarray.*PyTorch tensors.*convert\(x, 'torch'\)"):
        moved.forward(rng.standard_normal((4, 2)))
    with pytest.raises(ValueError, match="x has shape"):
        moved.forward(torch.ones((5, 2), dtype=torch.float64))
    layer = moved.layers["fc0a"]
    layer.set_parameter("W", torch.ones((4, 4)))  # a float32 tensor: float64, still a tensor
    assert isinstance(layer.W, torch.Tensor) and layer.W.dtype == torch.float64
    assert moved.to("numpy").backend.name == "numpy"


def test_a_network_of_tensors_becomes_a_graph_of_tensors():
    net = pp.FNN.random([4, 6, 3], activation="tanh", seed=0)
    x, t = np.ones((4, 2)), np.zeros((3, 2))
    graph = net.to("torch").to_graph()
    assert graph.backend.name == "torch"
    g = pp.backprop(graph, torch.from_numpy(x), torch.from_numpy(t), method="substitution")
    reference = pp.backprop(net, x, t, method="substitution")
    for k in range(2):
        np.testing.assert_allclose(g.parameters[f"fc{k}"]["W"].numpy(), reference.W[k],
                                   rtol=1e-12)


def test_a_moved_conv1d_keeps_its_kernel_one_array():
    """``parameters()["W"]`` is the moved kernel, and the 2-D one a view of it (in place)."""
    layer = L.Conv1d(np.random.default_rng(0).standard_normal((3, 2, 2)), input_shape=(2, 5))
    moved = layer.to("torch")
    kernel = moved.parameters()["W"]
    assert isinstance(kernel, torch.Tensor) and kernel.shape == (3, 2, 2)
    x = np.random.default_rng(1).standard_normal((10, 2))
    with torch.no_grad():
        kernel.mul_(3.0)
    layer.kernel_1d *= 3.0  # NumPy's 2-D kernel is a view too
    np.testing.assert_allclose(moved.forward([torch.from_numpy(x)]).numpy(),
                               layer.forward([x]), rtol=1e-13)


def test_a_moved_graph_writes_its_state_dict_back():
    module, graph, _, _ = imported("swiglu")
    moved = graph.to("torch")
    for name, value in pp.state_dict(moved).items():
        assert value.device.type == "cpu" and value.dtype == torch.float64
        torch.testing.assert_close(value, pp.state_dict(graph)[name], rtol=0, atol=0)
    loaded = module.load_state_dict(pp.state_dict(moved), strict=False)
    assert not loaded.unexpected_keys


def test_a_graph_of_no_parameters_moves_too():
    """Sums and activations only: the graph remembers where it was moved."""
    graph = pp.Graph(3).add("act", L.Activation("tanh")).add("sum", L.Add(), ["input", "act"])
    moved = graph.to("torch")
    assert moved.backend.name == "torch" and moved.dtype == torch.float64
    x, t = np.random.default_rng(0).standard_normal((3, 2)), np.zeros((3, 2))
    g = pp.backprop(moved, torch.from_numpy(x), torch.from_numpy(t), method="substitution")
    np.testing.assert_allclose(g.x.numpy(), pp.backprop(graph, x, t).x, rtol=1e-14)


def test_a_structure_too_large_to_expand_is_refused_by_the_memory_budget():
    """A convolution's sparse Jacobian is dense on the strict namespace: within the budget."""
    _, graph, x, _ = imported("conv2d")
    moved = graph.to("array_api_strict")
    with pp.memory.limit(100_000), pytest.raises(pp.MemoryBudgetError,
                                                 match=r"sparse \d+ x \d+ matrix.*'torch'"):
        moved.forward(strict.asarray(x))
    assert graph.forward(x).z[-1].shape[0] == graph.sizes[-1]  # NumPy keeps it sparse


def test_a_convolution_stays_sparse_on_pytorch_within_a_budget_its_dense_form_is_not():
    """PyTorch's CSR tensors: the Jacobian's dense form would be refused, its CSR one fits."""
    from propop.torch_sparse import CSRTensor

    _, graph, x, _ = imported("conv2d")
    conv = next(layer for layer in graph.layers.values() if isinstance(layer, L.Conv2d))
    rows, cols = conv._pattern.shape
    moved, budget = graph.to("torch"), 100_000
    assert rows * cols * 8 > budget  # the dense Jacobian would not fit
    with pp.memory.limit(budget):
        trace = moved.forward(torch.from_numpy(x))
        G = pp.backward_system(moved, trace, moved.loss_gradient(trace, torch.zeros_like(
            trace.output)))
    assert any(isinstance(M, CSRTensor) for M in G.operator_of.couplings.arrays())
    reference = graph.forward(x)
    np.testing.assert_allclose(trace.output.numpy(), reference.output, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(pp.solve(G, "substitution").x.numpy(), pp.solve(
        pp.backward_system(graph, reference, graph.loss_gradient(
            reference, np.zeros(reference.output.shape))), "substitution").x,
        rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize(("kind", "device"), [pytest.param("numpy", None, id="numpy"),
                                              *BACKENDS])
def test_token_dense_forward_is_its_kronecker_matrix_on_every_backend(kind, device):
    """The batched product of every token equals ``kron(I_T, W) x + b`` (its Jacobian)."""
    rng = np.random.default_rng(3)
    W, b = rng.standard_normal((5, 3)), rng.standard_normal(5)
    layer = pp.layers.TokenDense(W, b, tokens=4).to(kind, device)
    kron = np.kron(np.eye(4), W)
    for x in (rng.standard_normal(12), rng.standard_normal((12, 2))):
        z = layer.forward([on(kind, device, x)])
        assert backend.of(z).name == kind and tuple(z.shape) == (20,) + x.shape[1:]
        expected = kron @ x + (np.tile(b, 4) if x.ndim == 1 else np.tile(b, 4)[:, None])
        np.testing.assert_allclose(backend.to_host(z), expected, rtol=1e-14, atol=1e-14)
