"""from_torch by tracing: every node's value and gradient against PyTorch's, node by node."""

import math
import warnings

import numpy as np
import pytest

import propop as pp
from cases import relative_error
from reference import torch

nn = torch.nn
F = torch.nn.functional
fx = torch.fx

METHODS = ["substitution", "level-scheduled", "batched-gmres"]


def recorded(module, x):
    """Every traced tensor of ``module(x)`` by fx node (retaining its gradient), and autograd's.

    The loss is ``1/2 ||output||^2``; returns ``(values, dx, parameter gradients)``.
    """
    module.zero_grad()
    values = {}

    class Recorder(fx.Interpreter):
        def run_node(self, node):
            out = super().run_node(node)
            if isinstance(out, torch.Tensor) and out.requires_grad:
                out.retain_grad()
                values[node] = out
            return out

    X = torch.tensor(x, requires_grad=True)
    out = Recorder(fx.symbolic_trace(module)).run(X)
    (0.5 * (out**2).sum()).backward()
    grads = {name: p.grad.numpy() for name, p in module.named_parameters()
             if p.requires_grad}  # a frozen one is a constant
    return values, X.grad.numpy(), grads


def node_name(node, seen):
    """The propop node an fx node becomes (a module's path the first time)."""
    name = node.target if node.op == "call_module" and node.target not in seen else node.name
    seen.add(name)
    return name


def check_node_by_node(module, x, input_shape=None, methods=METHODS, tol=1e-12):
    """Forward values of every node, backward blocks of every linear node, and gradients."""
    module = module.double()
    graph = pp.from_torch(module, input_shape)
    values, dx, params = recorded(module, x)
    r = x.shape[0]
    flat = x.reshape(r, -1).T
    trace = graph.forward(flat)
    seen, compared = set(), []
    for node, tensor in values.items():
        name = node_name(node, seen)
        if name in graph.order and node.op != "placeholder":
            k = graph.order.index(name)
            expected = tensor.detach().numpy().reshape(r, -1).T
            assert relative_error(trace.z[k], expected) < tol, name
            compared.append((name, tensor))
    target = np.zeros((graph.sizes[graph.order.index(graph.outputs[0])], r))
    eps = graph.loss_gradient(trace, target)
    system = pp.backward_system(graph, trace, eps)
    for method in methods:
        sol = pp.solve(system, method, rtol=1e-13 if method != "substitution" else None)
        blocks = graph.unstack(system, sol.x)
        for name, tensor in compared:
            if graph.is_linear(name) and tensor.grad is not None:
                expected = tensor.grad.numpy().reshape(r, -1).T
                assert relative_error(blocks[graph.order.index(name)], expected) < 1e-10, \
                    (method, name)
        g = pp.backprop(graph, flat, target, method=method)
        assert relative_error(g.x, dx.reshape(r, -1).T) < 1e-10, method
        ours = dict(g.named_parameters())  # PyTorch's names (pp.state_dict's)
        assert set(ours) == set(params), method
        for name, value in params.items():
            assert relative_error(ours[name], value) < 1e-10, (method, name)
    return graph, len(compared)


class ResidualMLP(nn.Module):
    """Residual blocks written in forward() as PyTorch users write them."""

    def __init__(self):
        super().__init__()
        self.fc0 = nn.Linear(5, 6)
        self.fc1, self.fc2 = nn.Linear(6, 6), nn.Linear(6, 6)
        self.fc3, self.fc4 = nn.Linear(6, 6), nn.Linear(6, 6)
        self.drop = nn.Dropout(0.3)
        self.act = nn.GELU()
        self.head = nn.Linear(12, 4)

    def forward(self, x):
        h = F.silu(self.fc0(x))
        h = h + self.fc2(F.relu(self.fc1(h)))
        h = h - 0.5 * self.drop(self.fc4(self.act(self.fc3(h))))
        h = torch.cat([F.gelu(h, approximate="tanh"), torch.tanh(h) / 3], dim=1)
        return torch.softmax(self.head(h), dim=-1) * 2.0 + 1.0


class ConvNet(nn.Module):
    """Dilated grouped convolutions, batch norm, overlapping pooling and a view."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(2, 4, 3, padding=2, dilation=2, groups=2)
        self.bn1 = nn.BatchNorm2d(4)
        self.pool = nn.MaxPool2d(3, stride=2, padding=1)
        self.conv2 = nn.Conv2d(4, 6, 3, stride=1, padding="same", groups=2)
        self.avg = nn.AvgPool2d(3, stride=1, padding=1)
        self.gap = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(6, 3)
        self.out = nn.LogSoftmax(dim=1)

    def forward(self, x):
        h = self.pool(F.relu(self.bn1(self.conv1(x))))
        h = F.max_pool2d(torch.sigmoid(self.avg(self.conv2(h))), 2)
        h = self.gap(h)
        return self.out(self.fc(h.view(h.size(0), -1)))


class Conv1dNet(nn.Module):
    """1-D: groups and dilation, batch norm, overlapping max pooling, cat along the length."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv1d(2, 4, 3, dilation=2, groups=2, padding=1)
        self.b = nn.Conv1d(2, 4, 2, stride=2)
        self.bn = nn.BatchNorm1d(4)
        self.pool = nn.MaxPool1d(3, stride=1, padding=1)
        self.mean = nn.AvgPool1d(2)
        self.fc = nn.Linear(4 * 4, 3)

    def forward(self, x):
        h = torch.cat([self.a(x), self.b(x)], dim=2)  # lengths 7 and 4: interleaved rows
        h = self.pool(F.elu(self.bn(h)))
        h = F.softmax(h, dim=1)  # over channels, at every position
        return self.fc(torch.flatten(self.mean(h[:, :, 1:-1:1]), 1))  # a slice: a selection


def randomised(module):
    """Batch-norm statistics that are not the defaults; evaluation mode."""
    torch.manual_seed(3)
    for m in module.modules():
        if isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d)):
            with torch.no_grad():
                m.running_mean.uniform_(-1, 1)
                m.running_var.uniform_(0.5, 2.0)
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.5, 0.5)
    return module.eval()


def test_residual_blocks_written_in_forward_match_torch_node_by_node():
    torch.manual_seed(0)
    module = randomised(ResidualMLP())
    x = np.random.default_rng(0).standard_normal((4, 5))
    graph, compared = check_node_by_node(module, x)
    assert compared >= 15
    assert any(name.endswith(".lse") for name in graph.order)  # the softmax's normaliser
    assert "drop" not in graph.order  # dropout in evaluation mode is the identity


def test_conv_net_with_dilation_groups_batchnorm_and_overlapping_pools_matches_torch():
    torch.manual_seed(1)
    module = randomised(ConvNet())
    x = np.random.default_rng(1).standard_normal((3, 2, 9, 9))
    graph, compared = check_node_by_node(module, x, (2, 9, 9))
    assert compared >= 10
    assert "pool.windows" in graph.order  # overlapping windows copied apart first


def test_conv1d_net_with_interleaving_cat_and_channel_softmax_matches_torch():
    torch.manual_seed(2)
    module = randomised(Conv1dNet())
    x = np.random.default_rng(2).standard_normal((3, 2, 9))
    check_node_by_node(module, x, (2, 9), methods=["substitution"])


def normed_nets():
    """Group and instance norms, adaptive pools: (module, sample shape); each was refused.

    A norm follows a bias-free convolution: its statistics remove a per-channel offset,
    so the bias's gradient would be zero to rounding (nothing to compare).
    """
    conv1, conv2 = (lambda i, o: nn.Conv1d(i, o, 2, bias=False),
                    lambda i, o: nn.Conv2d(i, o, 2, bias=False))
    return [
        (nn.Sequential(conv1(2, 6), nn.GroupNorm(3, 6), nn.Tanh(), nn.AdaptiveAvgPool1d(5),
                       nn.Flatten(), nn.Linear(30, 3)), (2, 11)),
        (nn.Sequential(conv2(1, 4), nn.GroupNorm(2, 4, affine=False), nn.Tanh(),
                       nn.AdaptiveMaxPool2d((2, 1)), nn.Flatten(), nn.Linear(8, 3)), (1, 5, 4)),
        (nn.Sequential(conv1(2, 3), nn.InstanceNorm1d(3, affine=True), nn.SiLU(),
                       nn.AdaptiveMaxPool1d(2), nn.Flatten(), nn.Linear(6, 3)), (2, 7)),
        (nn.Sequential(conv2(1, 3), nn.InstanceNorm2d(3), nn.Tanh(), nn.AdaptiveAvgPool2d(1),
                       nn.Flatten(), nn.Linear(3, 2)), (1, 5, 4)),
    ]


@pytest.mark.parametrize("case", range(4))
def test_group_and_instance_norms_and_adaptive_pools_match_torch_node_by_node(case):
    torch.manual_seed(4)
    module, shape = normed_nets()[case]
    with torch.no_grad():  # a norm's weight and bias other than ones and zeros
        for name, p in module.named_parameters():
            if name.startswith("1."):
                p.uniform_(0.5, 2.0)
    x = np.random.default_rng(4).standard_normal((3,) + shape)
    check_node_by_node(module, x, shape)


@pytest.mark.parametrize(("make", "shape"), [
    (lambda: nn.Sequential(nn.Linear(4, 5), nn.PReLU(), nn.Linear(5, 3)), (4,)),
    (lambda: nn.Sequential(nn.Linear(4, 5), nn.PReLU(5), nn.Linear(5, 3)), (4,)),
    (lambda: nn.Sequential(nn.Conv1d(2, 3, 2), nn.PReLU(3), nn.Flatten(), nn.Linear(15, 2)),
     (2, 6))], ids=["one slope", "a slope per feature", "a slope per channel"])
def test_prelu_and_its_slopes_gradient_match_torch(make, shape):
    # PReLU was refused: its slopes are a parameter, here a linear node's
    import copy

    import propop.torch as ptorch

    torch.manual_seed(6)
    module = make().double()
    with torch.no_grad():
        module[1].weight.uniform_(-0.5, 0.8)
    x = np.random.default_rng(6).standard_normal((4,) + shape)
    graph, _ = check_node_by_node(module, x, shape if len(shape) > 1 else None)
    assert tuple(pp.state_dict(graph)["1.weight"].shape) == tuple(module[1].weight.shape)
    reference = copy.deepcopy(module)
    parallel = ptorch.parallelize(module, method="substitution", forward="newton",
                                  example_input=torch.tensor(x))
    for m in (parallel, reference):
        optimiser = torch.optim.Adam(m.parameters(), lr=0.01)
        for _ in range(3):
            optimiser.zero_grad()
            (m(torch.tensor(x)) ** 2).sum().backward()
            optimiser.step()
    assert max(float((p - q).detach().abs().max())
               for p, q in zip(parallel.parameters(), reference.parameters())) < 1e-12


def test_instance_norm_with_running_statistics_is_batch_norms_affine_map():
    torch.manual_seed(5)
    module = nn.Sequential(nn.Conv1d(2, 3, 2), nn.InstanceNorm1d(
        3, affine=True, track_running_stats=True), nn.Flatten(), nn.Linear(15, 2)).double()
    module(torch.randn(8, 2, 6, dtype=torch.float64))  # training: running statistics
    check_node_by_node(module.eval(), np.random.default_rng(5).standard_normal((3, 2, 6)),
                       (2, 6))
    with pytest.raises(ValueError, match="AdaptiveMaxPool1d with return_indices=True"):
        pp.from_torch(nn.Sequential(nn.Conv1d(1, 2, 3), nn.AdaptiveMaxPool1d(
            2, return_indices=True)).double(), input_shape=(1, 8))
    with pytest.raises(ValueError, match=r"AdaptiveAvgPool1d from \(6,\) to \(4,\): the "
                                         "output sizes must divide the input's"):
        pp.from_torch(nn.Sequential(nn.Conv1d(1, 2, 3), nn.AdaptiveAvgPool1d(4)).double(),
                      input_shape=(1, 8))


@pytest.mark.parametrize(("make", "shape", "buffers"), [
    (ConvNet, (2, 9, 9), {"bn1.running_mean", "bn1.running_var"}),
    (lambda: PreNormSwiGLU(), (6,), set())], ids=["conv", "swiglu"])
def test_a_torch_module_round_trips_through_state_dict(make, shape, buffers):
    torch.manual_seed(4)
    module = randomised(make()).double()
    graph = pp.from_torch(module, shape if len(shape) > 1 else None)
    before = {k: v.clone() for k, v in module.state_dict().items()}
    loaded = module.load_state_dict(pp.state_dict(graph), strict=False)
    assert set(loaded.missing_keys) == buffers and not loaded.unexpected_keys
    for name, value in module.state_dict().items():
        assert torch.equal(value, before[name]), name  # unchanged weights come back exactly
    rng = np.random.default_rng(5)
    for node, (_, names) in graph.origins.items():
        for ours in names:
            value = graph.layers[node].parameters()[ours]
            graph.layers[node].set_parameter(ours, rng.standard_normal(np.shape(value)))
    module.load_state_dict(pp.state_dict(graph), strict=False)
    x = rng.standard_normal((2,) + shape)
    ours = graph.output_values(graph.forward(x.reshape(2, -1).T))[0]
    with torch.no_grad():
        theirs = module(torch.tensor(x)).numpy().T
    assert relative_error(ours, theirs) < 1e-13


def test_an_rnn_round_trips_through_state_dict():
    torch.manual_seed(6)
    module = nn.RNN(3, 4, num_layers=2).double()
    rnn = pp.from_torch(module)
    other = nn.RNN(3, 4, num_layers=2).double()
    other.load_state_dict(pp.state_dict(rnn))
    xs = torch.randn(5, 2, 3, dtype=torch.float64)
    with torch.no_grad():
        assert torch.allclose(other(xs)[0], module(xs)[0], rtol=1e-14, atol=1e-14)


def test_the_graph_repr_lists_every_node():
    module = randomised(ConvNet())
    text = repr(pp.from_torch(module.double(), (2, 9, 9)))
    assert text.startswith("Graph(input 162, ")
    for piece in ("conv1", "Conv2d((2, 9, 9) -> (4, 9, 9))", "BatchNorm((4, 9, 9))",
                  "pool.windows", "WindowMaximum", "<- conv1", "out.lse", "LogSumExp"):
        assert piece in text, piece
    assert "object at" not in text


class Squares(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)
        self.p = nn.Parameter(torch.ones(3))

    def forward(self, x):
        h = self.fc(x)
        return self.p / h  # a parameter used as a tensor, not through a module


class Tangents(nn.Module):
    def forward(self, x):
        return torch.tan(x)


class BatchMixer(nn.Module):
    def forward(self, x):
        return x.reshape(1, -1)


class Softmax0(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=0)


class Softpluses(nn.Module):
    """``nn.Softplus`` and ``F.softplus`` (its defaults given positionally), both sides of 20."""

    def __init__(self):
        super().__init__()
        self.fc, self.act, self.out = nn.Linear(4, 6), nn.Softplus(), nn.Linear(6, 3)

    def forward(self, x):
        h = self.act(self.fc(x))
        return nn.functional.softplus(self.out(h), 1.0, 20.0)


class Activations(nn.Module):
    """Every activation family at settings other than its defaults, as modules and functions."""

    def __init__(self):
        super().__init__()
        self.fc = nn.ModuleList(nn.Linear(5, 5) for _ in range(19))
        self.acts = nn.ModuleList([
            nn.LeakyReLU(0.2), nn.ELU(alpha=0.5), nn.CELU(alpha=2.5), nn.SELU(),
            nn.Softplus(beta=2, threshold=5), nn.Hardtanh(-0.5, 2.0), nn.ReLU6(), nn.Mish(),
            nn.Softsign(), nn.Hardswish(), nn.Tanhshrink(), nn.LogSigmoid()])

    def forward(self, x):
        for fc, act in zip(self.fc, self.acts):
            x = act(fc(x))
        functions = [lambda h: F.leaky_relu(h, -0.3), lambda h: F.elu(h, 2.0),
                     lambda h: F.celu(h, alpha=0.5), lambda h: F.softplus(h, 0.5, 3.0),
                     lambda h: F.hardtanh(h, min_val=-2.0), F.relu6, F.hardswish]
        for fc, f in zip(self.fc[len(self.acts):], functions):
            x = f(4 * fc(x))  # wide pre-activations: every kink and threshold is crossed
        return x


def test_activations_at_their_settings_match_torch_node_by_node():
    # LeakyReLU(0.2), ELU(alpha), Softplus(beta, threshold) were refused; CELU, SELU,
    # Hardtanh, ReLU6, Mish, Softsign, Hardswish, Tanhshrink, LogSigmoid unsupported
    torch.manual_seed(3)
    x = 3 * np.random.default_rng(3).standard_normal((9, 5))
    check_node_by_node(Activations(), x)


class Elementwise(nn.Module):
    """sin, cos, abs and clamp as functions and methods (clamp's sides open or closed)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.ModuleList(nn.Linear(5, 5) for _ in range(9))

    def forward(self, x):
        f = self.fc
        x = f[1](torch.sin(3 * f[0](x))).cos()
        x = f[3](torch.abs(f[2](x))).abs()
        x = f[5](torch.clamp(f[4](x), -0.5, 0.5)).clamp(min=0)
        x = f[7](torch.clip(f[6](x), max=0.2)).clamp(None, 1.0)
        return f[8](x).sin()


def test_sin_cos_abs_and_clamp_match_torch_node_by_node():
    torch.manual_seed(7)
    check_node_by_node(Elementwise(), 2 * np.random.default_rng(7).standard_normal((6, 5)))


class Linears(nn.Module):
    """``count`` layers ``nn.Linear(5, 5)`` in ``self.fc``, for a ``forward`` to combine."""

    count = 3

    def __init__(self):
        super().__init__()
        self.fc = nn.ModuleList(nn.Linear(5, 5) for _ in range(self.count))


class HandWrittenGelu(Linears):
    """The exact GELU written by hand, as BERT's and older Hugging Face code do, and erf."""

    def forward(self, x):
        x = self.fc[0](x)
        x = x * 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))
        x = torch.special.erf(self.fc[1](x))
        return self.fc[2](x).erf()


def test_erf_and_a_gelu_written_with_it_match_torch_node_by_node():
    torch.manual_seed(8)
    x = 2 * np.random.default_rng(8).standard_normal((6, 5))
    check_node_by_node(HandWrittenGelu(), x)
    graph = pp.from_torch(HandWrittenGelu(), (5,))
    kinds = [repr(graph.layers[n]) for n in graph.order[1:]]
    assert kinds.count("Activation('erf')") == 3


class HandWrittenLogs(Linears):
    """log and log1p as users write them: a log-softmax, a softplus, a log-sigmoid."""

    count = 4

    def forward(self, x):
        h = self.fc[0](x)
        h = h - torch.log(torch.exp(h).sum(-1, keepdim=True))
        h = torch.log1p(torch.exp(self.fc[1](h)))
        h = torch.sigmoid(self.fc[2](h)).log() + torch.special.log1p(h).log1p()
        return self.fc[3](h)


def test_log_and_log1p_match_torch_node_by_node():
    torch.manual_seed(9)
    check_node_by_node(HandWrittenLogs(), 2 * np.random.default_rng(9).standard_normal((6, 5)))


def test_newton_forward_through_logarithms_from_zeros_is_the_pass():
    """A zero start is outside log's domain: the tangent at 1 stands in until it is inside."""
    torch.manual_seed(9)
    graph = pp.from_torch(HandWrittenLogs().double(), (5,))
    x = 2 * np.random.default_rng(9).standard_normal((5, 6))
    reference = graph.forward(x)
    trace = pp.forward(graph, x, method="substitution", linearization="newton")
    assert trace.info["converged"]
    for k, (ours, theirs) in enumerate(zip(trace.z, reference.z)):
        assert relative_error(ours, theirs) < 1e-12, graph.order[k]
    log = pp.activations.PARTIAL["log"]
    a, beta = log.linearize(np.array([-2.0, 0.0, 0.5]), "newton")
    np.testing.assert_array_equal(a, [1.0, 1.0, 2.0])  # 1/y at 1, 1, 0.5
    np.testing.assert_array_equal(beta, [-1.0, -1.0, np.log(0.5) - 1.0])


def test_a_logarithm_out_of_its_domain_names_its_node():
    class Log(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3, 3)

        def forward(self, x):
            return torch.log(self.fc(x))

    graph = pp.from_torch(Log().double(), (3,))
    x = np.random.default_rng(1).standard_normal((3, 8))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # named, not warned about
        with pytest.raises(ValueError, match=r"node 'log' \(Activation\('log'\)\) gives "
                                             r"non-finite.*logarithm of one outside its domain"):
            graph.forward(x)


def test_softplus_is_pytorchs_on_both_sides_of_its_threshold():
    """Above ``threshold=20`` PyTorch's softplus is ``y`` itself, and its slope one."""
    torch.manual_seed(0)
    module = Softpluses().double()
    with torch.no_grad():
        module.fc.bias.fill_(15.0)  # both layers' pre-activations straddle 20
        module.out.bias.fill_(15.0)
    x = 12 * np.random.default_rng(0).standard_normal((4, 7))
    X = torch.tensor(x.T, requires_grad=True)
    out = module(X)
    pre = module.out(module.act(module.fc(X)))
    assert (pre > 20).any() and (pre < 20).any() and (module.fc(X) > 20).any()
    (out.sin().sum()).backward()
    graph = pp.from_torch(module)
    trace = graph.forward(x)
    assert relative_error(trace.output, out.detach().numpy().T) < 1e-14
    g = pp.backprop(graph, x, np.cos(trace.output) + trace.output, loss="mse")
    # the MSE against t = cos(z) + z has dE/dz = -cos(z): sin's derivative, negated
    assert relative_error(-g.x, X.grad.numpy().T) < 1e-12

@pytest.mark.parametrize(("module", "words"), [
    (Squares(), r"node 'truediv' \(call_function _operator.truediv\) at .*test_torch_trace"
                r".py:\d+: return self.p / h.*: div with the trainable parameter 'p': x \+ p, "
                r"x - p, p - x, x \* p and x / p"),
    (Tangents(), r"node 'tan' .*test_torch_trace.py:\d+: return torch.tan\(x\): unsupported "
                 r"function torch.tan"),
    (BatchMixer(), r"node 'reshape' .*reshapes the batch dimension"),
    (Softmax0(), r"dim=0 for a batch of shape"),
    (nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3)),
     r"\(call_module 1\): BatchNorm1d in training mode.*eval\(\)"),
    (nn.Sequential(nn.Linear(3, 3), nn.Dropout()),
     r"Dropout\(p=0.5\) in training mode: call module.eval\(\)"),
    (nn.Sequential(nn.Linear(3, 3), nn.LSTM(3, 3)), r"unsupported module LSTM \(recurrent"),
    (nn.Sequential(nn.Linear(3, 3), nn.GELU(approximate="none"), nn.RReLU()),
     r"unsupported module RReLU; supported: Linear"),
    (nn.Sequential(nn.Linear(3, 3), nn.Softplus(beta=0)), r"softplus: beta must be non-zero"),
])
def test_what_cannot_be_imported_is_named_with_its_node_and_line(module, words):
    with pytest.raises(ValueError, match=words):
        pp.from_torch(module.double(), input_shape=(3,))


def test_importing_leaves_the_modules_buffers_as_they_were():
    """from_torch runs the module once for the shapes, and puts its buffers back.

    A training-mode BatchNorm would update its running statistics (before its
    refusal), as PyTorch's own call does.
    """
    module = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3)).double()
    before = {k: v.clone() for k, v in module.state_dict().items()}
    with pytest.raises(ValueError, match="BatchNorm1d in training mode"):
        pp.from_torch(module, input_shape=(3,))
    for k, v in module.state_dict().items():
        assert torch.equal(v, before[k]), k
    module(torch.randn(4, 3, dtype=torch.float64))  # PyTorch's call changes them
    assert not torch.equal(module[1].running_mean, before["1.running_mean"])


def test_hooks_and_missing_input_shapes_are_named():
    hooked = nn.Sequential(nn.Linear(3, 2), nn.Sequential(nn.Tanh()))
    hooked[1].register_forward_hook(lambda module, inputs, output: output * 2)
    with pytest.raises(ValueError, match="Sequential at 1 has forward hooks"):
        pp.from_torch(hooked)
    with pytest.raises(ValueError, match="input_shape is needed: ConvNet"):
        pp.from_torch(ConvNet())
    # the first nn.Linear is not the first layer: its in_features a wrong guess
    for first in [nn.ConvTranspose2d(2, 3, 3, stride=2), nn.Upsample(scale_factor=2)]:
        with pytest.raises(ValueError, match=r"Sequential fails on a batch of samples of "
                                             r"shape \(243,\).*check input_shape.*is needed"):
            pp.from_torch(nn.Sequential(first, nn.Flatten(), nn.Linear(243, 2)))


def test_a_sample_shape_the_module_fails_on_is_named_and_nothing_printed(capfd):
    with pytest.raises(ValueError, match=r"Sequential fails on a batch of samples of shape "
                                         r"\(5,\) \(RuntimeError: mat1 and mat2"):
        pp.from_torch(nn.Sequential(nn.Linear(4, 2), nn.Tanh()).double(), input_shape=(5,))
    assert capfd.readouterr().err == ""
    with pytest.raises(ValueError, match="bidirectional=True"):
        pp.from_torch(nn.GRU(2, 2, bidirectional=True))


@pytest.mark.parametrize(("make", "shape"), [(ResidualMLP, (5,)), (ConvNet, (2, 9, 9))])
def test_newton_forward_through_traced_softmax_batchnorm_and_overlapping_pools(make, shape):
    """The new nodes' linearisations: Newton reaches the sequential pass node by node."""
    torch.manual_seed(7)
    module = randomised(make()).double()
    graph = pp.from_torch(module, shape if len(shape) > 1 else None)
    x = np.random.default_rng(7).standard_normal((3,) + shape).reshape(3, -1).T
    exact = graph.forward(x)
    newton = pp.forward(graph, x, method="level-scheduled", linearization="newton")
    assert newton.info["converged"]
    for k, name in enumerate(graph.order):
        assert relative_error(newton.z[k], exact.z[k]) < 1e-9, name


def test_the_new_layers_name_bad_inputs():
    from propop import layers as L

    with pytest.raises(ValueError, match="windows that do not overlap"):
        L.WindowMaximum([[0, 1], [1, 2]], 3)
    with pytest.raises(ValueError, match="indices below the input size 3"):
        L.WindowMaximum([[0, 5]], 3)
    with pytest.raises(ValueError, match=r"Windows\(4 -> 2\) takes an input of size 4, got 5"):
        pp.Graph(5).add("w", L.Windows([0, 1], 4))
    with pytest.raises(ValueError, match=r"takes inputs of sizes \[3, 1\], got \[3\]"):
        pp.Graph(3).add("m", L.LinearMap([np.eye(3), np.ones((3, 1))]))
    with pytest.raises(ValueError, match="BatchNorm of 2 channels needs an input shape"):
        L.BatchNorm(np.zeros(2), np.ones(2), eps=1e-5, input_shape=(3, 4))
    with pytest.raises(ValueError, match=r"Concat of shapes \[\(2,\), \(2,\)\] takes inputs"):
        pp.Graph(3).add("a", L.Dense(np.eye(3))).add(
            "c", L.Concat(dim=0, shapes=[(2,), (2,)]), ["input", "a"])
    with pytest.raises(ValueError, match="Add with 2 weights takes 2 inputs, got 3"):
        pp.Graph(3).add("a", L.Add(weights=(1, -1)), ["input", "input", "input"])
    with pytest.raises(ValueError, match="out divisible by groups = 3"):
        L.Conv2d(np.ones((4, 1, 2, 2)), input_shape=(3, 5, 5), groups=3)


class PreNormSwiGLU(nn.Module):
    """A transformer's MLP half: pre-norm LayerNorm, a SwiGLU unit, a residual; a final norm."""

    def __init__(self, d=6, hidden=8):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.gate, self.up = nn.Linear(d, hidden), nn.Linear(d, hidden)
        self.down = nn.Linear(hidden, d, bias=False)
        self.final = nn.LayerNorm(d, bias=False)

    def forward(self, x):
        y = self.norm(x)
        return self.final(x + self.down(F.silu(self.gate(y)) * self.up(y)))


class HandWritten(nn.Module):
    """RMSNorm, a sigmoid GLU, a feature sum and a division, written with tensor operations."""

    def __init__(self, d=5):
        super().__init__()
        self.a, self.b = nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, x):
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        g = self.a(h) * torch.sigmoid(self.b(h))
        s = g.sum(dim=-1, keepdim=True)
        return g / (1 + s**2) + torch.sqrt(h * h + 1.0) - F.layer_norm(g, (5,), eps=1e-3)


class TokenNorm(nn.Module):
    """LayerNorm over the last dimension of a (tokens, features) sample, then over both."""

    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(6)
        self.both = nn.LayerNorm((4, 6), elementwise_affine=False)
        self.head = nn.Linear(24, 3)

    def forward(self, x):
        h = torch.tanh(self.norm(x)) * x.mean(dim=2, keepdim=True)
        return self.head(torch.flatten(self.both(h), 1))


class RMSNormed(nn.Module):
    """Llama's norm: ``nn.RMSNorm`` and ``F.rms_norm``.

    The module with the dtype's eps, over two dimensions without an affine part, and the
    function with a module's weight and an eps of its own.
    """

    def __init__(self):
        super().__init__()
        self.fc, self.norm = nn.Linear(6, 6), nn.RMSNorm(6)
        self.tokens = nn.RMSNorm((2, 3), eps=1e-3, elementwise_affine=False)
        self.final_norm, self.head = nn.RMSNorm(6), nn.Linear(6, 3)

    def forward(self, x):
        h = x + F.silu(self.fc(self.norm(x)))
        h = torch.flatten(self.tokens(h.reshape(-1, 2, 3)), 1) * h
        return self.head(F.rms_norm(h, (6,), self.final_norm.weight, 1e-4))


@pytest.mark.parametrize(("make", "shape"), [(PreNormSwiGLU, (6,)), (HandWritten, (5,)),
                                             (TokenNorm, (4, 6)), (RMSNormed, (6,))],
                         ids=lambda v: str(v))
def test_transformer_pieces_match_torch_node_by_node(make, shape):
    """LayerNorm, products of two tensors, powers, feature means: exact, node by node."""
    torch.manual_seed(1)
    module = make()
    with torch.no_grad():  # weights and biases that are not LayerNorm's defaults
        for name, p in module.named_parameters():
            if "norm" in name or "final" in name:
                p.uniform_(0.5, 1.5)
    x = np.random.default_rng(1).standard_normal((3,) + shape)
    graph, compared = check_node_by_node(module, x, shape if len(shape) > 1 else None)
    assert compared >= 6
    assert any(isinstance(graph.layers[n], pp.layers.Multiply) for n in graph.order[1:])


class SelfAttention(nn.Module):
    """Multi-head self-attention as it is written by hand.

    Per-token Linear layers, heads by view and transpose from ``x.shape``,
    ``q @ k^T / sqrt(d)``, a softmax over the keys.
    """

    def __init__(self, d=6, heads=2):
        super().__init__()
        self.q, self.v, self.o = (nn.Linear(d, d) for _ in range(3))
        self.k = nn.Linear(d, d, bias=False)  # its bias moves a score row by a constant
        self.heads, self.norm, self.ff = heads, nn.LayerNorm(d), nn.Linear(d, d)

    def forward(self, x):
        B, T, d = x.shape
        y = self.norm(x)
        q, k, v = (f(y).view(B, T, self.heads, d // self.heads).transpose(1, 2)
                   for f in (self.q, self.k, self.v))
        weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d // self.heads), dim=-1)
        x = x + self.o((weights @ v).transpose(1, 2).reshape(B, T, d))
        return x + self.ff(F.gelu(x))


class PreNormBlock(nn.Module):
    """A pre-norm transformer block.

    RMSNorm, a fused qkv projection sliced apart, ``F.scaled_dot_product_attention``
    over two heads, a residual, a SwiGLU MLP.
    """

    def __init__(self, d=8, heads=2):
        super().__init__()
        self.qkv, self.o, self.heads = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d), heads
        self.n1, self.n2 = nn.RMSNorm(d), nn.LayerNorm(d)
        self.up, self.gate, self.down = nn.Linear(d, 16), nn.Linear(d, 16), nn.Linear(16, d)

    def forward(self, x):
        B, T, d = x.shape
        h = self.qkv(self.n1(x))
        q, k, v = (t.reshape(B, T, self.heads, d // self.heads).permute(0, 2, 1, 3)
                   for t in (h[:, :, :d], h[:, :, d:2 * d], h[:, :, 2 * d:]))
        a = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, T, d)
        x = x + self.o(a)
        y = self.n2(x)
        return x + self.down(F.silu(self.gate(y)) * self.up(y))


class CausalAttention(nn.Module):
    """``F.scaled_dot_product_attention(..., is_causal=True, scale=0.3)`` over two heads."""

    def __init__(self, d=6):
        super().__init__()
        self.qkv, self.o = nn.Linear(d, 3 * d), nn.Linear(d, d)

    def forward(self, x):
        B, T, d = x.shape
        h = self.qkv(x)
        q, k, v = (t.reshape(B, T, 2, d // 2).transpose(1, 2)
                   for t in (h[:, :, :d], h[:, :, d:2 * d], h[:, :, 2 * d:]))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3)
        return x + self.o(a.transpose(1, 2).reshape(B, T, d))


@pytest.mark.parametrize(("make", "shape"), [(SelfAttention, (4, 6)), (PreNormBlock, (5, 8)),
                                             (CausalAttention, (5, 6))],
                         ids=["attention", "block", "causal"])
def test_attention_matches_torch_node_by_node(make, shape):
    # Linear on tokens, transpose/permute, matrix products of two tensors, shapes read from
    # x.shape and F.scaled_dot_product_attention were each refused
    torch.manual_seed(8)
    x = np.random.default_rng(8).standard_normal((3,) + shape)
    graph, compared = check_node_by_node(make(), x, shape)
    assert compared >= 10
    assert any(isinstance(graph.layers[n], pp.layers.TokenDense) for n in graph.order[1:])
    causal = [n for n in graph.order if n.endswith(".weights")]
    if make is CausalAttention:  # the masked weights are exact zeros, the rows sum to one
        trace = graph.forward(x.reshape(3, -1).T)
        w = trace.z[graph.order.index(causal[0])].T.reshape(3, 2, 5, 5)
        assert (w[..., np.triu_indices(5, 1)[0], np.triu_indices(5, 1)[1]] == 0).all()
        np.testing.assert_allclose(w.sum(axis=-1), 1, rtol=1e-15)


class TorchAttention(nn.Module):
    """A pre-norm block with ``nn.MultiheadAttention`` (its weights read, or not)."""

    def __init__(self, d=8, need_weights=False, average=True, heads=2, bias=True):
        super().__init__()
        self.attn = nn.MultiheadAttention(d, heads, bias=bias, batch_first=True)
        self.norm, self.ff = nn.LayerNorm(d), nn.Linear(d, d)
        self.need_weights, self.average = need_weights, average

    def forward(self, x):
        y = self.norm(x)
        a, w = self.attn(y, y, y, need_weights=self.need_weights,
                         average_attn_weights=self.average)
        x = x + a
        x = x + self.ff(F.gelu(x))
        if not self.need_weights:
            return x
        # (N, T, T) averaged over the heads, or (N, H, T, T): one number per token
        return x + (w.sum(dim=-1, keepdim=True) if self.average else w[:, :, :, :1].sum(dim=1))


@pytest.mark.parametrize(("need_weights", "average", "heads", "bias"),
                         [(False, True, 2, True), (True, True, 2, True),
                          (True, False, 2, True), (False, True, 4, False)],
                         ids=["output", "averaged-weights", "weights-per-head", "no-bias"])
def test_multihead_attention_matches_torch_node_by_node(need_weights, average, heads, bias):
    torch.manual_seed(10)
    x = np.random.default_rng(10).standard_normal((3, 5, 8))
    module = TorchAttention(8, need_weights, average, heads, bias)
    graph, compared = check_node_by_node(module, x, (5, 8))
    assert compared >= 5 + 2 * need_weights
    assert "attn.in_proj_weight" in dict(pp.state_dict(graph))
    # the attention's own output and weights (fx sees one call, PyTorch's tuple)
    seen = []
    module.attn.register_forward_hook(lambda m, args, out: seen.append(out))
    module(torch.from_numpy(x))
    trace = graph.forward(x.reshape(3, -1).T)
    output, weights = seen[0]
    z = dict(zip(graph.order, trace.z))
    assert relative_error(z["attn"], output.detach().numpy().reshape(3, -1).T) < 1e-12
    assert ("attn.weights" in z) == (need_weights and average)  # the average: a node
    if need_weights:
        name = "attn.weights" if average else "attn.attention.weights"
        assert relative_error(z[name], weights.detach().numpy().reshape(3, -1).T) < 1e-12


def test_what_multihead_attention_cannot_import_is_named():
    class Calls(nn.Module):
        def __init__(self, attention, **call):
            super().__init__()
            self.attn, self.call = attention, call

        def forward(self, x):
            call = dict(self.call)
            return self.attn(x, call.pop("key", lambda x: x)(x), x, **call)[0]

    mha = nn.MultiheadAttention
    for module, words in [
            (Calls(mha(8, 2)), r"batch_first=False"),
            (Calls(mha(8, 2, batch_first=True, add_bias_kv=True)), r"add_bias_kv=True"),
            (Calls(mha(8, 2, batch_first=True, add_zero_attn=True)), r"add_zero_attn=True"),
            (Calls(mha(8, 2, batch_first=True, dropout=0.1)).train(), r"dropout in training"),
            (Calls(mha(8, 2, batch_first=True), key=lambda x: 2 * x), r"cross-attention")]:
        with pytest.raises(ValueError, match=words):
            pp.from_torch(module.double(), input_shape=(5, 8))


class MaskedScores(nn.Module):
    """Attention written as users write it (nanoGPT's): scores masked before a softmax.

    ``how``: ``"buffer"`` (a causal buffer, ``masked_fill(mask == 0, -inf)``,
    ``F.softmax``), ``"made"`` (the mask made in ``forward`` from ``x.size(1)``, on
    ``x.device``), ``"finite"`` (``-1e9`` and ``nn.Softmax``); qkv split apart
    (``split``, or ``chunk`` for ``"made"``), a sinusoidal position buffer added and a
    buffer of scales multiplied.
    """

    def __init__(self, how, d=8, heads=2, T=5):
        super().__init__()
        self.qkv, self.o, self.heads, self.how = nn.Linear(d, 3 * d), nn.Linear(d, d), heads, how
        self.register_buffer("mask", torch.tril(torch.ones(T, T)).view(1, 1, T, T))
        position = torch.arange(T)[:, None] / 10 ** (torch.arange(d)[None] / d)
        self.register_buffer("pe", torch.where(torch.arange(d) % 2 == 0, position.sin(),
                                               position.cos()))
        self.register_buffer("scales", torch.linspace(0.5, 1.5, d))
        self.softmax = nn.Softmax(dim=-1)

    def forward(self, x):
        B, T, C = x.size()
        x = x * self.scales + self.pe
        h = self.qkv(x)
        q, k, v = h.chunk(3, dim=-1) if self.how == "made" else h.split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        if self.how == "made":
            mask = torch.tril(torch.ones((T, T), device=x.device, dtype=torch.bool))
            att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        elif self.how == "buffer":
            att = F.softmax(att.masked_fill(self.mask == 0, float("-inf")), dim=-1)
        else:
            att = self.softmax(att.masked_fill(self.mask == 0, -1e9))
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return x + self.o(y)


@pytest.mark.parametrize("how", ["buffer", "made", "finite"])
def test_masked_scores_match_torch_node_by_node(how):
    # buffers, constants made in forward, masked_fill, split and chunk were each refused
    torch.manual_seed(11)
    x = np.random.default_rng(11).standard_normal((3, 5, 8))
    graph, compared = check_node_by_node(MaskedScores(how), x, (5, 8))
    assert compared >= 10
    weights = [n for n in graph.order if n.endswith(".exp")] if how != "finite" else []
    assert len(weights) == (0 if how == "finite" else 1)  # -inf: the kept entries alone


class MaskedSDPA(nn.Module):
    """``F.scaled_dot_product_attention`` with a constant ``attn_mask`` (bool or float)."""

    def __init__(self, mask):
        super().__init__()
        self.qkv = nn.Linear(6, 18)
        self.register_buffer("attn_mask", mask)

    def forward(self, x):
        B, T, d = x.shape
        q, k, v = self.qkv(x).split(d, -1)
        q, k, v = (t.reshape(B, T, 2, 3).transpose(1, 2) for t in (q, k, v))
        return F.scaled_dot_product_attention(q, k, v, attn_mask=self.attn_mask).sum(dim=1)


class MaskedMHA(nn.Module):
    """``nn.MultiheadAttention`` with a constant 2-D ``attn_mask`` (True: blocked)."""

    def __init__(self, mask):
        super().__init__()
        self.attn = nn.MultiheadAttention(6, 2, batch_first=True)
        self.register_buffer("attn_mask", mask)

    def forward(self, x):
        return self.attn(x, x, x, attn_mask=self.attn_mask)[0]


@pytest.mark.parametrize("make", [MaskedSDPA, MaskedMHA], ids=["sdpa", "mha"])
@pytest.mark.parametrize("kind", ["bool", "float"])
def test_attention_masks_match_torch_node_by_node(make, kind):
    torch.manual_seed(12)
    rng = np.random.default_rng(12)
    allowed = torch.from_numpy(rng.random((4, 4)) < 0.6) | torch.eye(4, dtype=torch.bool)
    if make is MaskedMHA:
        mask = ~allowed if kind == "bool" else nn.Transformer.generate_square_subsequent_mask(4)
    else:  # SDPA's boolean mask keeps where true; a float one adds, -inf drops
        mask = allowed if kind == "bool" else torch.where(
            allowed, torch.from_numpy(rng.standard_normal((4, 4))), -math.inf)
    x = rng.standard_normal((3, 4, 6))
    check_node_by_node(make(mask.double() if mask.is_floating_point() else mask), x, (4, 6))


def test_what_constants_and_masks_cannot_import_is_named():
    class Uses(nn.Module):
        def __init__(self, forward, **buffers):
            super().__init__()
            self.f, self.p = forward, nn.Parameter(torch.ones(4))
            for name, value in buffers.items():
                self.register_buffer(name, value)

        def forward(self, x):
            return self.f(self, x)

    tril = torch.tril(torch.ones(4, 4, dtype=torch.bool))
    for f, buffers, words in [
            (lambda m, x: x.masked_fill(~m.tril, -math.inf).exp(), {"tril": tril},
             r"only a softmax may read"),
            (lambda m, x: x.masked_fill(~m.tril, -math.inf).log_softmax(-1), {"tril": tril},
             r"only a softmax may read"),
            (lambda m, x: x.masked_fill(m.none, -math.inf).softmax(-1),
             {"none": torch.ones(4, 4, dtype=torch.bool)}, r"leaves a group no entry"),
            (lambda m, x: x.masked_fill(m.two, 0.0),  # from_torch's example: 2 samples
             {"two": torch.zeros(2, 4, 4, dtype=torch.bool)}, r"differs between the samples"),
            (lambda m, x: x.masked_fill(~m.tril, math.inf), {"tril": tril}, r"the value inf"),
            (lambda m, x: x + torch.randn(x.shape[1:]), {}, r"random numbers"),
            (lambda m, x: x * m.p.exp(), {}, r"parameter 'p' outside"),
            (lambda m, x: x / m.zero, {"zero": torch.zeros(4)}, r"a division by zero"),
            (lambda m, x: x.unbind(0)[0], {}, r"dim=0 for a batch")]:
        with pytest.raises(ValueError, match=words):
            pp.from_torch(Uses(f, **buffers).double(), input_shape=(4, 4))
    mha = nn.MultiheadAttention(4, 2, batch_first=True).double()

    class Padded(nn.Module):
        def __init__(self, **call):
            super().__init__()
            self.attn, self.call = mha, call

        def forward(self, x):
            return self.attn(x, x, x, **self.call)[0]

    for call, words in [({"key_padding_mask": torch.zeros(2, 4, dtype=torch.bool)},
                         r"key_padding_mask \(one per sample\)"),
                        ({"attn_mask": torch.zeros(4, 4, 4, dtype=torch.bool)},
                         r"attn_mask per sample and head")]:
        with pytest.raises(ValueError, match=words):
            pp.from_torch(Padded(**call), input_shape=(4, 4))


def test_constant_arithmetic_matches_torch():
    class Shifted(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)
            self.register_buffer("a", torch.tensor([1.0, -2.0, 0.5, 3.0]))
            self.register_buffer("b", torch.arange(8.0).view(2, 4))

        def forward(self, x):
            h = self.fc(x).unsqueeze(1) * self.a - self.b  # (N, 1, 4) broadcast to (N, 2, 4)
            h = self.b - h / self.a + torch.full((2, 1), 0.25)
            return torch.tanh(h).unbind(dim=1)[1] * torch.tensor(2.0)

    torch.manual_seed(13)
    check_node_by_node(Shifted(), np.random.default_rng(13).standard_normal((3, 4)), (4,))


class Learned(nn.Module):
    """Parameters used as tensors, not through a module.

    A learned position embedding added, a layer scale multiplied, a per-token shift
    added and subtracted, a parameter less a tensor, the same embedding twice, a
    bias-only layer norm.
    """

    def __init__(self, T=4, d=6):
        super().__init__()
        self.fc = nn.Linear(d, d)
        self.pos = nn.Parameter(torch.randn(1, T, d))
        self.gamma = nn.Parameter(torch.randn(d))
        self.shift = nn.Parameter(torch.randn(T, 1))
        self.beta = nn.Parameter(torch.randn(d))
        self.temperature = nn.Parameter(torch.tensor(1.7))

    def forward(self, x):
        h = self.fc(x + self.pos)
        h = torch.tanh(self.gamma * torch.tanh(h) + self.shift)  # (T, 1): over features
        h = torch.tanh(h - self.shift) + (self.gamma - h)  # x - p and p - x
        h = h / self.temperature + torch.tanh(h) / self.gamma  # a learned temperature, x / p
        return F.layer_norm(h + self.pos, (6,), None, self.beta)


def test_parameters_used_as_tensors_match_torch_node_by_node():
    # x + p, x * p were refused, and F.layer_norm with a bias alone lost the bias
    torch.manual_seed(14)
    graph, _ = check_node_by_node(Learned(), np.random.default_rng(14).standard_normal(
        (3, 4, 6)), (4, 6))
    names = dict(pp.state_dict(graph))
    assert {"pos", "gamma", "shift", "beta"} <= set(names)
    assert names["pos"].shape == (1, 4, 6) and names["shift"].shape == (4, 1)


class Positions(nn.Module):
    """``nn.Embedding`` of constant positions as nanoGPT writes it, added and multiplied.

    The tables have more rows than positions (a block size), read forwards (from row
    0 and from row 2), backwards (``flip``) and at a repeated row; a frozen table is a
    constant.
    """

    def __init__(self, T=4, d=6, block=9):
        super().__init__()
        self.wpe, self.scale = nn.Embedding(block, d), nn.Embedding(block, d)
        self.frozen = nn.Embedding(block, d).requires_grad_(False)
        self.fc = nn.Linear(d, d)

    def forward(self, x):
        pos = torch.arange(0, x.size(1), dtype=torch.long, device=x.device)
        h = self.fc(x + self.wpe(pos) + self.frozen(pos))
        h = torch.tanh(h) * self.scale(pos.flip(0)) + self.scale(pos + 2)  # a run from 2
        return h + self.wpe(torch.tensor([1, 1, 5, 0]))


def test_embeddings_of_constant_positions_match_torch_node_by_node():
    torch.manual_seed(15)
    module = Positions()
    graph, _ = check_node_by_node(module, np.random.default_rng(15).standard_normal(
        (3, 4, 6)), (4, 6))
    names = dict(pp.state_dict(graph))
    assert set(names) == {"wpe.weight", "scale.weight", "fc.weight", "fc.bias"}
    assert names["wpe.weight"].shape == (9, 6)  # the table, its unread rows' gradient zero
    x = torch.randn(2, 4, 6, dtype=torch.float64)
    assert relative_error(graph.to("torch").forward(torch.reshape(x, (2, -1)).T).output.T,
                          module(x).detach().reshape(2, -1)) < 1e-12


class AfterLinear(nn.Module):
    """``f`` of a Linear layer's output (a sample ``(4, 6)``): what it is refused for."""

    def __init__(self, f):
        super().__init__()
        self.f, self.fc = f, nn.Linear(6, 6)

    def forward(self, x):
        return self.f(self.fc(x))


class Selections(nn.Module):
    """Operations that move, copy or zero-pad a sample's entries, as users write them."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 6)
        self.register_buffer("order", torch.tensor([5, 0, 3, 3]))
        self.register_buffer("scale", torch.linspace(0.5, 2.0, 6))

    def forward(self, x):
        h = torch.tanh(self.fc(x))  # (T, d) = (4, 6)
        parts = [h.flip(1), torch.roll(h, 1, 1), torch.roll(h, (1, -2), (1, 2)),
                 h[:, :2].repeat(1, 2, 1), h[:, :1].expand(-1, 4, -1),
                 F.pad(h, (1, 1))[..., 1:7], F.pad(h.transpose(1, 2), (1, 1), mode="reflect")
                 [..., 1:5].transpose(1, 2), h[..., ::-1 + 2].tril(), torch.narrow(h, 2, 0, 6),
                 h.index_select(2, self.order).repeat_interleave(2, dim=2)[..., :6],
                 h.movedim(1, 2).transpose(1, 2), h[..., torch.tensor([1, 1, 0, 2, 4, 5])],
                 torch.cumsum(h, 1), h.cumsum(dim=-1)]  # prefix sums: linear maps
        mixed = sum(p * (i + 1) for i, p in enumerate(parts))
        stacked = torch.stack([mixed, torch.square(h)], dim=2).flatten(2)[..., :6]
        return stacked + self.scale / (2.0 + h.exp()) + torch.ones_like(h) * 0.5  # c / x


def test_selections_found_by_probing_match_torch_node_by_node():
    """flip, roll, repeat, expand, pad (zeros, reflect), tril, narrow, index_select, ..."""
    torch.manual_seed(16)
    graph, compared = check_node_by_node(Selections(), np.random.default_rng(16)
                                         .standard_normal((3, 4, 6)), (4, 6))
    assert sum(isinstance(graph.layers[n], pp.layers.Windows) for n in graph.order[1:]) >= 12


@pytest.mark.parametrize(("f", "words"), [
    (lambda h: torch.roll(h, 1, 0), r"torch.roll is not a selection of a sample's own"),
    (lambda h: h.repeat(2, 1, 1), r".repeat\(\) changes the batch dimension"),
    (lambda h: F.pad(h, (1, 1), value=1.0), r"pads with a value other than zero"),
    (lambda h: torch.stack([h, h]), r"torch.stack along the batch dimension"),
    (lambda h: h[..., :h.shape[0]], r"depends on the batch size"),
    (lambda h: torch.where(h > 0, h, 0.1 * h), r"_operator.gt of a traced tensor: a mask that "
                                               r"depends on the input's values"),
    (lambda h: h.index_select(2, h[0, 0].long()), r"is a second traced tensor|batch"),
])
def test_what_probed_selections_cannot_import_is_named(f, words):
    with pytest.raises(ValueError, match=words):
        pp.from_torch(AfterLinear(f).double(), (4, 6))


class Statistics(nn.Module):
    """var, std, 2-norms, F.normalize, logsumexp, GLU; the Annotated Transformer's LayerNorm."""

    def __init__(self, d=6):
        super().__init__()
        self.fc, self.head = nn.Linear(d, d), nn.Linear(d, d)
        self.a_2, self.b_2 = nn.Parameter(torch.randn(d)), nn.Parameter(torch.randn(d))
        self.glu = nn.GLU(dim=1)

    def forward(self, x):
        h = torch.tanh(self.fc(x))  # (T, d) = (4, 6)
        mean, std = h.mean(-1, keepdim=True), h.std(-1, keepdim=True)
        norm = self.a_2 * (h - mean) / (std + 1e-6) + self.b_2
        s = (h.var(1, keepdim=True) + torch.var(h, dim=-1, correction=0, keepdim=True)
             + h.norm(dim=-1, keepdim=True) + torch.linalg.vector_norm(h, dim=(1, 2),
                                                                        keepdim=True)
             + torch.logsumexp(h, -1, keepdim=True) + torch.linalg.norm(h, dim=1)[:, None])
        gated = F.glu(torch.cat([h, h.flip(2)], dim=-1)) + self.glu(torch.cat([h, h], 1))
        return self.head(norm * s + F.normalize(h, dim=-1) + F.normalize(h, dim=1, eps=0.5)
                         + gated)


class Extremes(nn.Module):
    """max(dim) and min(dim) (the first extreme: PyTorch's index), amax and amin (ties split).

    ReLU's zeros tie: whole groups of them, where the two rules differ; elementwise
    maxima and minima of two tensors, or of one and a constant, tie there too.
    """

    def __init__(self, d=6):
        super().__init__()
        self.fc, self.head = nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, x):
        h = self.fc(x)  # (T, d) = (4, 6)
        r = torch.relu(h - 0.8)
        s = (r.max(-1, keepdim=True).values + torch.min(r, dim=2, keepdim=True)[0]
             + r.amax(-1, keepdim=True) + torch.amin(-r, (1, 2), keepdim=True)
             + h.max(1).values[:, None] + h.amin(1)[:, None])
        pairs = (torch.maximum(r, torch.relu(-h - 0.8)) + torch.max(h, r)  # ties at zero
                 + torch.minimum(h, h.new_tensor(0.3)) + h.maximum(h[:, :1])
                 + torch.minimum(r, torch.zeros_like(r)))
        return self.head(torch.tanh(h) * s + pairs)


def test_statistics_match_torch_node_by_node():
    torch.manual_seed(17)
    check_node_by_node(Statistics(), np.random.default_rng(17).standard_normal((3, 4, 6)),
                       (4, 6), methods=["substitution", "jacobi"])
    with pytest.raises(ValueError, match=r"statistic must be one of \('var', 'std', 'norm'\)"):
        pp.layers.moments_over((3,), [0], "mean")


class Einsums(nn.Module):
    """``torch.einsum`` as attention code writes it, and its other uses on one sample."""

    def __init__(self, d=6):
        super().__init__()
        self.fc, self.head = nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, x):
        h = torch.tanh(self.fc(x))  # (T, d) = (4, 6)
        scores = torch.einsum("btd,bsd->bts", h, h.sigmoid()).softmax(-1)
        mixed = torch.einsum("bts,bsd->btd", scores, h)  # attention's weighted values
        outer = torch.einsum("bi,bj->bij", h[:, 0], h[:, 1])[:, :4]  # (4, 6)
        diagonal = torch.einsum("bii->bi", h[:, :, :4])[..., None]  # (4, 1)
        gates = torch.einsum("b t d , b t d -> b t", [h, h.cos()])[..., None]  # a list
        return self.head(mixed + outer * diagonal + gates * torch.einsum("btd->bdt", h)
                         .transpose(1, 2))


def test_einsums_match_torch_node_by_node():
    torch.manual_seed(19)
    check_node_by_node(Einsums(), np.random.default_rng(19).standard_normal((3, 4, 6)),
                       (4, 6), methods=["substitution", "jacobi"])
    with pytest.raises(ValueError, match=r"einsum: 'j' is 3 and 4 long"):
        pp.layers.einsum_of(["ij", "jk"], "ik", [(2, 3), (4, 5)])
    with pytest.raises(ValueError, match=r"einsum: output subscripts 'iq'"):
        pp.layers.einsum_of(["ij"], "iq", [(2, 3)])


def test_maxima_and_minima_with_ties_match_torch_node_by_node():
    torch.manual_seed(18)
    x = np.random.default_rng(18).standard_normal((3, 4, 6))
    module = Extremes()
    check_node_by_node(module, x, (4, 6), methods=["substitution"])
    tied = torch.relu(module.fc(torch.from_numpy(x)) - 0.8) == 0
    assert tied.all(-1).any() and tied.all(1).any()  # whole groups of zeros, both ways
    with pytest.raises(ValueError, match=r"ties must be one of \('first', 'split'\)"):
        pp.layers.WindowMaximum(np.arange(4).reshape(2, 2), 4, ties="last")


@pytest.mark.filterwarnings(r"ignore:var\(\). degrees of freedom")  # PyTorch's own run
@pytest.mark.parametrize(("f", "words"), [
    (lambda h: h.norm(p=1, dim=-1), r"a norm of order 1; the 2-norm of entries"),
    (lambda h: torch.linalg.norm(h, ord=2, dim=(1, 2)), r"over two dimensions \(a matrix"),
    (lambda h: h.var(), r"var over every dimension, the batch's included"),
    (lambda h: h.var(-1, correction=6), r"var of 6 entries with correction=6.0"),
    (lambda h: F.normalize(h, p=1.0), r"F.normalize with p=1.0"),
    (lambda h: h.max(-1).indices * 1.0, r"the indices of a maximum or minimum"),
    (lambda h: h + h.new_zeros(h.shape), r"a constant the size of the batch"),
    (lambda h: h + torch.full_like(h, h.shape[0]), r"a constant the size of the batch"),
    (lambda h: h.cumsum(1, dtype=torch.float32), r"cumsum with a dtype"),
    (lambda h: h.cumsum(0), r"dim=0 for a batch"),
    (lambda h: torch.einsum("btd,bsd", h, h), r"give the output \(->\) and no '...'"),
    (lambda h: torch.einsum("...td->...dt", h), r"give the output \(->\) and no '...'"),
    (lambda h: torch.einsum("btd->td", h), r"must start with the batch's subscript"),
    (lambda h: torch.einsum("btd,btd,btd->bt", h, h, h), r"einsum of one or two traced"),
    (lambda h: h.max(), r"a maximum or minimum over every dimension")])
def test_what_statistics_cannot_import_is_named(f, words):
    with pytest.raises(ValueError, match=words):
        pp.from_torch(AfterLinear(f).double(), (4, 6))


@pytest.mark.parametrize(("change", "words"), [
    ({"padding_idx": 2}, r"Embedding at wpe with padding_idx=2 among the indices"),
    ({"max_norm": 1.0}, r"Embedding at wpe with max_norm"),
    ({"scale_grad_by_freq": True}, r"Embedding at wpe with scale_grad_by_freq"),
    ({"reshaped": True}, r"the rows of 'wpe.weight' at constant indices .* read only as "
                         r"x \+ rows or x \* rows")])
def test_what_embeddings_of_positions_cannot_import_is_named(change, words):
    class Read(nn.Module):
        def __init__(self):
            super().__init__()
            self.wpe = nn.Embedding(4, 3, **{k: v for k, v in change.items()
                                             if k != "reshaped"})

        def forward(self, x):
            rows = self.wpe(torch.arange(4))
            return x + (rows.unsqueeze(0) if change.get("reshaped") else rows)

    with pytest.raises(ValueError, match=words):
        pp.from_torch(Read().double(), (4, 3))


class Holds(nn.Module):
    """A user's model holding a module (an encoder), called with a constant mask or not."""

    def __init__(self, module, mask=None):
        super().__init__()
        self.inner = module
        self.register_buffer("mask", mask)

    def forward(self, x):
        return self.inner(x) if self.mask is None else self.inner(x, self.mask)


def encoder(layers=None, **settings):
    """``nn.TransformerEncoderLayer`` (or an encoder of ``layers`` of them), norms random.

    A LayerNorm of weight one and bias zero makes the test's loss, ``|z|^2 / 2``, nearly
    constant: its gradient rounding noise.
    """
    layer = nn.TransformerEncoderLayer(8, 2, 16, batch_first=True, **settings)
    module = layer if layers is None else nn.TransformerEncoder(
        layer, layers, norm=nn.LayerNorm(8), enable_nested_tensor=False)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if "norm" in name:
                p.copy_(torch.randn_like(p))
    return module.eval()


@pytest.mark.parametrize("settings", [{}, {"norm_first": True}, {"activation": "gelu"},
                                      {"activation": nn.GELU(approximate="tanh"),
                                       "bias": False}, {"layers": 2}, {"layers": 1,
                                                                       "mask": True}],
                         ids=["post-norm", "pre-norm", "gelu", "gelu-module", "encoder",
                              "causal-encoder"])
def test_transformer_encoder_matches_torch_node_by_node(settings):
    # nn.TransformerEncoderLayer and nn.TransformerEncoder were unsupported modules
    torch.manual_seed(15)
    settings = dict(settings)
    mask = nn.Transformer.generate_square_subsequent_mask(5) if settings.pop("mask", False) \
        else None
    x = np.random.default_rng(15).standard_normal((3, 5, 8))
    module = encoder(**settings)
    graph, _ = check_node_by_node(Holds(module, mask), x, (5, 8))
    assert any(n.endswith("self_attn.in_proj") for n in graph.order)
    # the module alone (its own forward() branches on shapes: imported as one call)
    alone = pp.from_torch(module.double(), (5, 8)) if mask is None else None
    if alone is not None:
        expected = module(torch.from_numpy(x)).detach().numpy().reshape(3, -1).T
        assert relative_error(alone.forward(x.reshape(3, -1).T).output, expected) < 1e-12
        assert set(dict(pp.state_dict(alone))) == set(dict(module.named_parameters()))


def test_what_transformer_encoders_cannot_import_is_named():
    layer = encoder()
    with pytest.raises(ValueError, match=r"TransformerEncoderLayer in training mode"):
        pp.from_torch(Holds(layer).train().double(), (5, 8))

    class Padded(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = encoder()
            self.register_buffer("padding", torch.zeros(2, 5, dtype=torch.bool))  # 2 samples

        def forward(self, x):
            return self.inner(x, src_key_padding_mask=self.padding)

    with pytest.raises(ValueError, match=r"key_padding_mask \(one per sample\)"):
        pp.from_torch(Padded().double(), (5, 8))
    odd = nn.TransformerEncoderLayer(8, 2, 16, batch_first=True, activation=torch.square)
    with pytest.raises(ValueError, match=r"TransformerEncoderLayer with the activation"):
        pp.from_torch(Holds(odd.eval()).double(), (5, 8))
    with pytest.raises(ValueError, match=r"batch_first=False"):
        pp.from_torch(Holds(nn.TransformerEncoderLayer(8, 2, 16).eval()).double(), (5, 8))


def test_a_softmax_over_kept_entries_is_torchs_with_minus_infinity():
    L = pp.layers
    keep = np.array([[True, False, True], [False, True, True]])
    graph = pp.Graph(6)
    for suffix, layer, reads in L.softmax_over((2, 3), 1, keep=keep):
        graph.add("s" + suffix, layer, ["input" if r is None else "s" + r for r in reads])
    x = np.random.default_rng(9).standard_normal((6, 4))
    masked = torch.tensor(x.T.reshape(4, 2, 3)).masked_fill(~torch.tensor(keep), -np.inf)
    expected = torch.softmax(masked, dim=-1).reshape(4, 6).numpy().T
    assert np.abs(graph.forward(x).output - expected).max() < 1e-15
    with pytest.raises(ValueError, match="keep must leave every group an entry"):
        L.softmax_over((2, 3), 1, keep=np.array([[True] * 3, [False] * 3]))
    with pytest.raises(ValueError, match="log-softmax none out"):
        L.softmax_over((2, 3), 1, log=True, keep=keep)


def test_what_attention_cannot_import_is_named():
    class Dropped(nn.Module):
        def forward(self, x):
            return F.scaled_dot_product_attention(x, x, x, dropout_p=0.1)

    class ByParameter(nn.Module):
        def __init__(self):
            super().__init__()
            self.W = nn.Parameter(torch.ones(3, 3))

        def forward(self, x):
            return x @ self.W

    class BatchScaled(nn.Module):
        def forward(self, x):
            return x / x.shape[0]

    class Swapped(nn.Module):
        def forward(self, x):
            return x.transpose(0, 1)

    for module, words in [(Dropped(), r"scaled_dot_product_attention with dropout_p=0.1"),
                          (ByParameter(), r"a matrix product with a parameter"),
                          (BatchScaled(), r"div with the batch size"),
                          (Swapped(), r"moves the batch dimension")]:
        with pytest.raises(ValueError, match=words):
            pp.from_torch(module.double(), input_shape=(2, 3))


def test_rms_norm_without_eps_takes_the_modules_dtypes():
    """``nn.RMSNorm(eps=None)`` adds ``finfo(x.dtype).eps``: a float32 module's, imported."""
    norm = nn.RMSNorm(3)  # float32
    x = 1e-4 * np.random.default_rng(0).standard_normal((3, 2))  # mean(x^2) ~ eps
    graph = pp.from_torch(norm, input_shape=(3,))
    expected = F.rms_norm(torch.tensor(x.T), (3,), eps=float(np.finfo(np.float32).eps))
    assert relative_error(graph.forward(x).output, expected.numpy().T) < 1e-13
    assert relative_error(graph.forward(x).output, F.rms_norm(torch.tensor(x.T), (3,)).numpy().T
                          ) > 1e-3  # float64's eps would be another function here


@pytest.mark.parametrize("norm", [nn.LayerNorm((4, 5)), nn.RMSNorm((4, 5))],
                         ids=["LayerNorm", "RMSNorm"])
def test_a_norm_over_two_dimensions_keeps_its_parameters_shapes(norm):
    # the weight of nn.LayerNorm((4, 5)) is (4, 5): its gradient was (20,), so state_dict
    # could not be loaded back and a parallelized module's backward raised PyTorch's error
    import copy

    import propop.torch as ptorch

    torch.manual_seed(2)
    module = nn.Sequential(nn.Conv1d(2, 4, 2), norm, nn.Flatten(), nn.Linear(20, 3)).double()
    with torch.no_grad():
        module[1].weight.uniform_(0.5, 2.0)
    x = torch.randn(3, 2, 6, dtype=torch.float64)
    graph = pp.from_torch(module, input_shape=(2, 6))
    g = pp.backprop(graph, x.numpy().reshape(3, -1).T, np.ones((3, 3)), loss="mse")
    shapes = {name: tuple(p.shape) for name, p in module.named_parameters()}
    assert {name: np.shape(v) for name, v in g.named_parameters()} == shapes
    copy.deepcopy(module).load_state_dict({k: torch.as_tensor(v)
                                           for k, v in pp.state_dict(graph).items()})
    reference = copy.deepcopy(module)
    parallel = ptorch.parallelize(module, method="substitution", example_input=x)
    for m in (parallel, reference):
        optimiser = torch.optim.Adam(m.parameters(), lr=0.01)
        for _ in range(3):
            optimiser.zero_grad()
            (m(x) ** 2).sum().backward()
            optimiser.step()
    assert max(float((p - q).detach().abs().max())
               for p, q in zip(parallel.parameters(), reference.parameters())) < 1e-12


def test_newton_forward_through_layer_norm_and_products():
    torch.manual_seed(2)
    module = PreNormSwiGLU().double()
    graph = pp.from_torch(module)
    x = np.random.default_rng(2).standard_normal((6, 4))
    exact = graph.forward(x)
    near = graph.forward(x + 0.05 * np.random.default_rng(3).standard_normal(x.shape))
    newton = pp.forward(graph, x, method="substitution", linearization="newton", around=near)
    assert newton.info["converged"]
    for k, name in enumerate(graph.order):
        assert relative_error(newton.z[k], exact.z[k]) < 1e-9, name
    # from zeros an iterate's variance goes negative (rsqrt: NaN), and the nodes that
    # overflow start again from zeros: the exact front advances all the same
    cold = pp.forward(graph, x, method="substitution", linearization="newton")
    assert cold.info["converged"] and cold.info["restarts"]
    for k, name in enumerate(graph.order):
        assert relative_error(cold.z[k], exact.z[k]) < 1e-9, name


@pytest.mark.parametrize("layer", ["multiply", "power", "rsqrt", "affine", "shift"])
def test_product_layers_jacobians_against_finite_differences(layer):
    from propop import layers as L

    rng = np.random.default_rng(4)
    x = rng.standard_normal(6) + (3.0 if layer == "rsqrt" else 0.0)
    made = {"multiply": L.Multiply(), "power": L.Power(3.0), "rsqrt": L.Power(-0.5, 1e-3),
            "affine": L.ElementwiseAffine(rng.standard_normal(3), rng.standard_normal(3), 2),
            "shift": L.ElementwiseAffine(None, rng.standard_normal((3, 1)), 2)}
    f = made[layer]
    J = f.jacobian([x])[0].toarray()
    h = 1e-6
    for i in range(x.size):
        step = np.zeros_like(x)
        step[i] = h
        column = (f.forward([x + step]) - f.forward([x - step])) / (2 * h)
        assert np.abs(J[:, i] - column).max() < 1e-7 * max(1.0, np.abs(column).max()), i
    if not f.linear:  # the tangent reproduces the layer at x
        a, beta = f.linearize(x, "newton")
        A = f.selection(x.size)
        t = a * x + beta
        assert np.allclose(t if A is None else A @ t, f.forward([x]), rtol=1e-14, atol=1e-14)


def test_products_and_reductions_name_what_they_cannot_do():
    from propop import layers as L

    with pytest.raises(ValueError, match="takes the concatenation of two factors"):
        pp.Graph(3).add("m", L.Multiply())
    with pytest.raises(ValueError, match="needs a weight, a bias, or both"):
        L.ElementwiseAffine(None)
    with pytest.raises(ValueError, match="divides needs a weight"):
        L.ElementwiseAffine(None, np.ones(3), divides=True)
    with pytest.raises(ValueError, match=r"rows must be indices in \[0, 4\), got \[0 4\]"):
        L.ElementwiseAffine(None, np.ones((4, 2)), rows=[0, 4])
    with pytest.raises(ValueError, match=r"rows must be indices in \[0, 4\)"):
        L.ElementwiseAffine(None, np.ones((4, 2)), rows=[0.5])
    assert np.isnan(L.Power(-0.5).forward([np.array([1.0, -2.0])])[1])  # as torch.rsqrt
    with pytest.raises(ValueError, match=r"node 'root' \(Power\(0.5\)\) gives non-finite "
                                         r"values from finite inputs \(1 of 4 entries, first "
                                         r"at row 1\)"):
        pp.Graph(2).add("root", L.Power(0.5)).forward(np.array([[1.0, 2.0], [-1.0, 3.0]]))

    class Everything(nn.Module):
        def forward(self, x):
            return x * x.sum()

    with pytest.raises(ValueError, match="sum over every dimension, the batch's included"):
        pp.from_torch(Everything(), (3,))

    class Exponent(nn.Module):
        def forward(self, x):
            return x ** x

    with pytest.raises(ValueError, match="exponent is not a number"):
        pp.from_torch(Exponent(), (3,))

    class Made(nn.Module):  # a LayerNorm weight computed in forward(), not a parameter
        def forward(self, x):
            return F.layer_norm(x, (3,), weight=x.sum(dim=0))

    with pytest.raises(ValueError, match=r"node 'sum_1' .*weight=x.sum\(dim=0\)\): dim=0 .* "
                                         "not a feature dimension"):
        pp.from_torch(Made(), (3,))
