"""propop.torch.parallelize against plain autograd: outputs, gradients, five Adam steps.

The reference is a deep copy of the same module trained by ``loss.backward()``;
the parallelized module shares the original's parameters and is trained the same
way, with gradient clipping and a hook on a parameter.
"""

import copy

import pytest

torch = pytest.importorskip("torch")

import propop as pp  # noqa: E402
import propop.torch as ptorch  # noqa: E402
from propop.interop.torch_import import Residual  # noqa: E402


def mlp(dtype=torch.float64):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(),
                               Residual(torch.nn.Sequential(torch.nn.Linear(8, 8),
                                                            torch.nn.SiLU())),
                               torch.nn.Linear(8, 3)).to(dtype)


class SmallCNN(torch.nn.Module):
    """Bias-free convolutions, a residual block, BatchNorm (evaluation mode), a head."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        self.conv1 = torch.nn.Conv2d(2, 3, 3, padding=1, bias=False)
        self.bn = torch.nn.BatchNorm2d(3)
        self.conv2 = torch.nn.Conv2d(3, 3, 3, padding=1, bias=False)
        self.pool = torch.nn.AvgPool2d(2)
        self.head = torch.nn.Linear(3 * 3 * 3, 4)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-0.2, 0.2)
            self.bn.running_var.uniform_(0.5, 1.5)

    def forward(self, x):
        h = torch.tanh(self.bn(self.conv1(x)))
        h = h + torch.tanh(self.conv2(h))
        return self.head(self.pool(h).flatten(1))


def cnn():
    return SmallCNN().double().eval()


def gradients(module, x):
    x = x.detach().clone().requires_grad_(True)
    out = module(x)
    (out.sin() ** 2).sum().backward()
    return out, x.grad, {n: p.grad.clone() for n, p in module.named_parameters()}


@pytest.mark.parametrize("backend", ["numpy", "torch"])
@pytest.mark.parametrize("build", [mlp, cnn], ids=["mlp", "cnn"])
@pytest.mark.parametrize(("method", "forward", "options"), [
    ("substitution", "sequential", {}), ("cyclic-reduction", "sequential", {"groups": True}),
    ("jacobi", "newton", {})])
def test_outputs_and_gradients_are_autograds(build, method, forward, options, backend):
    """On the host, and (``backend="torch"``) with the graph on the inputs' device."""
    module = build()
    reference = copy.deepcopy(module)
    shape = (6,) if build is mlp else (2, 6, 6)
    x = torch.randn((5,) + shape, dtype=torch.float64)
    ours = ptorch.parallelize(module, method=method, forward=forward, example_input=x,
                              backend=backend, **options)
    assert ours.propop.graph_on(x.device).backend.name == backend
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in module.named_parameters()]
    assert all(p is q for p, q in zip(ours.parameters(), module.parameters()))  # shared
    out, dx, grads = gradients(ours, x)
    out_ref, dx_ref, grads_ref = gradients(reference, x)
    torch.testing.assert_close(out, out_ref, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(dx, dx_ref, rtol=1e-9, atol=1e-12)
    for name, g in grads_ref.items():
        torch.testing.assert_close(grads[name], g, rtol=1e-9, atol=1e-12, msg=name)
    assert ours.propop.last["backward"].converged
    assert isinstance(ours.propop.last["backward"].x, torch.Tensor) == (backend == "torch")
    assert ours.state_dict().keys() == module.state_dict().keys()


def train(module, x, target, steps=5):
    optimiser = torch.optim.Adam(module.parameters(), lr=0.02)
    seen = []
    first = next(module.parameters())
    first.register_hook(lambda g: seen.append(g.norm()))
    for _ in range(steps):
        optimiser.zero_grad()
        loss = torch.nn.functional.cross_entropy(module(x), target)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(module.parameters(), 0.5)
        optimiser.step()
    return seen


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_five_adam_steps_of_a_cnn_equal_plain_autograds(backend):
    module = cnn()
    plain = copy.deepcopy(module)
    x = torch.randn(6, 2, 6, 6, dtype=torch.float64)
    target = torch.randint(0, 4, (6,), generator=torch.Generator().manual_seed(3))
    ours = ptorch.parallelize(module, method="cyclic-reduction", example_input=x, groups=True,
                              backend=backend)
    seen_ours, seen_plain = train(ours, x, target), train(plain, x, target)
    assert len(seen_ours) == 5
    torch.testing.assert_close(torch.stack(seen_ours), torch.stack(seen_plain), rtol=1e-9,
                               atol=1e-12)
    for (name, p), (_, q) in zip(module.named_parameters(), plain.named_parameters()):
        torch.testing.assert_close(p, q, rtol=1e-10, atol=1e-12, msg=name)


def test_five_adam_steps_of_a_pre_norm_swiglu_block_equal_plain_autograds():
    """A transformer's MLP half (LayerNorm, SwiGLU, residual) trained through propop."""
    from test_torch_trace import PreNormSwiGLU

    torch.manual_seed(5)
    module = torch.nn.Sequential(PreNormSwiGLU(6, 8), torch.nn.Linear(6, 4)).double()
    plain = copy.deepcopy(module)
    x = torch.randn(5, 6, dtype=torch.float64)
    target = torch.randint(0, 4, (5,), generator=torch.Generator().manual_seed(5))
    ours = ptorch.parallelize(module, method="level-scheduled")
    seen_ours, seen_plain = train(ours, x, target), train(plain, x, target)
    torch.testing.assert_close(torch.stack(seen_ours), torch.stack(seen_plain), rtol=1e-10,
                               atol=1e-12)
    for (name, p), (_, q) in zip(module.named_parameters(), plain.named_parameters()):
        torch.testing.assert_close(p, q, rtol=1e-10, atol=1e-12, msg=name)


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_a_transformer_block_trains_as_autograd_with_its_output_shape(backend):
    """Attention (a pre-norm block with F.scaled_dot_product_attention) through propop.

    The output keeps the module's shape, (N, T, d) here: it came back flat, (N, T d).
    """
    from test_torch_trace import PreNormBlock

    torch.manual_seed(9)
    module = PreNormBlock().double()
    plain = copy.deepcopy(module)
    x = torch.randn(3, 5, 8, dtype=torch.float64)
    ours = ptorch.parallelize(module, method="substitution", example_input=x, backend=backend)
    for m in (ours, plain):
        optimiser = torch.optim.Adam(m.parameters(), lr=0.01)
        for _ in range(3):
            optimiser.zero_grad()
            out = m(x)
            (out.sin() * torch.arange(8.0, dtype=torch.float64)).sum().backward()
            optimiser.step()
    for (name, p), (_, q) in zip(module.named_parameters(), plain.named_parameters()):
        torch.testing.assert_close(p, q, rtol=1e-10, atol=1e-12, msg=name)
    other = torch.randn(2, 5, 8, dtype=torch.float64)  # another batch size
    assert ours(other).shape == plain(other).shape == (2, 5, 8)
    torch.testing.assert_close(ours(other), plain(other), rtol=1e-12, atol=1e-12)
    conv = torch.nn.Sequential(torch.nn.Conv1d(2, 3, 2)).double()  # (C, L) per sample
    assert ptorch.parallelize(conv, input_shape=(2, 6))(torch.randn(
        4, 2, 6, dtype=torch.float64)).shape == (4, 3, 5)


@pytest.mark.parametrize("backend", ["numpy", "torch"])
@pytest.mark.parametrize("make", ["multihead", "masked", "learned", "encoder"])
def test_attention_modules_train_as_autograd(make, backend):
    """Attention modules and parameters used as tensors train as autograd.

    ``nn.MultiheadAttention`` (its weights read); attention as nanoGPT writes it (a
    causal mask made in forward, ``masked_fill(-inf)``, a softmax, qkv chunked apart,
    position and scale buffers: constants, moved with the graph); a learned position
    embedding and a layer scale; ``nn.TransformerEncoder`` with a causal mask (in
    evaluation mode: no dropout). SGD, not Adam: the key's part of ``in_proj_bias`` has
    an exactly zero gradient (a softmax is blind to a shift shared by a query's scores),
    which Adam would divide by its own rounding noise.
    """
    from test_torch_trace import Holds, Learned, MaskedScores, TorchAttention, encoder

    torch.manual_seed(4)
    module = {"multihead": lambda: TorchAttention(8, need_weights=True),
              "masked": lambda: MaskedScores("made"), "learned": Learned,
              "encoder": lambda: Holds(encoder(2), torch.nn.Transformer
                                       .generate_square_subsequent_mask(5))
              }[make]().double()
    plain = copy.deepcopy(module)
    x = torch.randn(3, *((4, 6) if make == "learned" else (5, 8)), dtype=torch.float64)
    ours = ptorch.parallelize(module, method="substitution", example_input=x, backend=backend)
    for m in (ours, plain):
        optimiser = torch.optim.SGD(m.parameters(), lr=1e-3, momentum=0.9)
        for _ in range(3):
            optimiser.zero_grad()
            out = m(x)
            (out.sin() * torch.arange(float(out.shape[-1]), dtype=torch.float64)).sum().backward()
            optimiser.step()
    for (name, p), (_, q) in zip(module.named_parameters(), plain.named_parameters()):
        torch.testing.assert_close(p, q, rtol=1e-10, atol=1e-12, msg=name)


def test_float32_modules_stay_float32():
    module = mlp(torch.float32)
    reference = copy.deepcopy(module)
    x = torch.randn(4, 6)
    ours = ptorch.parallelize(module, method="substitution")
    out, _, grads = gradients(ours, x)
    out_ref, _, grads_ref = gradients(reference, x)
    assert out.dtype == torch.float32 and grads["0.weight"].dtype == torch.float32
    torch.testing.assert_close(out, out_ref, rtol=1e-5, atol=1e-6)
    for name, g in grads_ref.items():
        torch.testing.assert_close(grads[name], g, rtol=1e-4, atol=1e-5, msg=name)
    with torch.no_grad():
        assert not ours(x).requires_grad


def test_what_cannot_run_is_refused_by_name():
    with pytest.raises(ValueError, match="forward must be one of"):
        ptorch.parallelize(mlp(), forward="fast")
    with pytest.raises(KeyError, match="no-such-method"):
        ptorch.parallelize(mlp(), method="no-such-method")
    with pytest.raises(ValueError, match="not block bi-diagonal.*groups=True"):
        ptorch.parallelize(mlp(), method="cyclic-reduction", example_input=torch.ones(2, 6))
    module = cnn()
    ours = ptorch.parallelize(module, input_shape=(2, 6, 6))
    ours.train()
    with pytest.raises(ValueError, match="BatchNorm2d at bn is in training mode"):
        ours(torch.randn(2, 2, 6, 6, dtype=torch.float64))
    ours.eval()
    with pytest.raises(ValueError, match=r"expected \(N, 2, 6, 6\)"):
        ours(torch.randn(2, 2, 5, 5, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"shape \(0, 2, 6, 6\).*N >= 1"):
        ours(torch.randn(0, 2, 6, 6, dtype=torch.float64))  # was a reshape's RuntimeError
    with pytest.raises(TypeError, match="dtype torch.int64; pass floating-point inputs"):
        ours(torch.ones(2, 2, 6, 6, dtype=torch.int64))  # was an output rounded to integers

    class Branchy(torch.nn.Module):
        def forward(self, x):
            return x.abs().sqrt() if x.sum() > 0 else x  # data-dependent: fx cannot trace

    with pytest.raises(Exception, match="Branchy|control flow|symbolically traced"):
        ptorch.parallelize(Branchy(), input_shape=(3,))
    assert isinstance(pp.torch.parallelize, type(ptorch.parallelize))


def test_the_training_step_benchmark_runs_end_to_end(tmp_path, monkeypatch):
    """``python -m benchmarks.training_step --quick``: every contender takes a step."""
    import json
    import sys

    from benchmarks import training_step

    monkeypatch.setenv("PROPOP_RESULTS", str(tmp_path))
    monkeypatch.setattr(sys, "argv", ["training_step", "--quick"])
    training_step.main()
    rows = json.loads((tmp_path / "training_step_quick.json").read_text())["rows"]
    assert {row["kind"] for row in rows} == {"gru", "mlp", "attention"}
    for row in rows:  # every contender took its steps (times not judged)
        assert len(row["seconds"]) >= 3
        assert not row["errors"], row["errors"]
        assert all(set(t) == {"median", "min", "max"} for t in row["seconds"].values())


def test_a_backend_the_method_cannot_use_is_refused_by_name():
    with pytest.raises(ValueError, match=r"'scipy.gmres' does not run on torch.*substitution"):
        ptorch.parallelize(mlp(), method="scipy.gmres", backend="torch")
    with pytest.raises(ValueError, match="backend must be one of"):
        ptorch.parallelize(mlp(), backend="jax")


def test_the_training_step_benchmark_reports_a_contender_that_fails(monkeypatch):
    """A contender whose step raises is left out of the timing and named in the table."""
    from benchmarks import training_step

    def broken():
        raise TypeError("kernel supports float16/float32/bfloat16, got torch.float64")

    times, errors = training_step._timed({"plain": lambda: None, "pararnn": broken})
    assert set(times) == {"plain"} and errors == {
        "pararnn": "TypeError: kernel supports float16/float32/bfloat16, got torch.float64"}
    row = training_step._row("gru", "case A", times, errors, "plain")
    text = training_step.table([row])
    assert "| case | plain | pararnn |" in text and "| failed |" in text
    assert "- case A, pararnn: TypeError: kernel supports" in text
    assert "not installed" not in text  # it is installed: it failed


class NoDropout(torch.nn.Module):
    """Dropout with p=0, a module's and F.dropout's, in training mode: the identity."""

    def __init__(self, p=0.0):
        super().__init__()
        torch.manual_seed(3)
        self.a, self.drop, self.b = torch.nn.Linear(4, 6), torch.nn.Dropout(p), \
            torch.nn.Linear(6, 2)
        self.p = p

    def forward(self, x):
        h = torch.nn.functional.dropout(torch.tanh(self.a(x)), self.p, self.training)
        return self.b(self.drop(h))


@pytest.mark.parametrize("build", [NoDropout, lambda: torch.nn.TransformerEncoderLayer(
    4, 2, 8, dropout=0.0, batch_first=True)], ids=["dropout", "encoder"])
def test_dropout_with_p_zero_trains_as_autograd_and_p_above_zero_is_refused(build):
    module = build().double().train()
    x = torch.randn(3, 5, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    out_ref, dx_ref, grads_ref = gradients(copy.deepcopy(module), x)
    ours = ptorch.parallelize(module, example_input=x)
    out, dx, grads = gradients(ours, x)
    torch.testing.assert_close(out, out_ref, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(dx, dx_ref, rtol=1e-10, atol=1e-14)
    for name, g in grads_ref.items():
        torch.testing.assert_close(grads[name], g, rtol=1e-10, atol=1e-14, msg=name)
    dropout = next(m for m in ours.modules() if isinstance(m, torch.nn.Dropout))
    dropout.p = 0.1
    with pytest.raises(ValueError, match=r"Dropout at \w+ is in training mode"):
        ours(x)
    dropped, words = (NoDropout(0.1), r"F.dropout\(p=0.1\) with training=True") \
        if build is NoDropout else (torch.nn.TransformerEncoderLayer(
            4, 2, 8, dropout=0.1, batch_first=True), "TransformerEncoderLayer in training mode")
    with pytest.raises(ValueError, match=words):
        ptorch.parallelize(dropped.double(), example_input=x)


def adam_steps(net, loss, x, lr, steps=5):
    """``steps`` plain Adam steps on ``loss(net(x))``."""
    optimiser = torch.optim.Adam(net.parameters(), lr=lr)
    for _ in range(steps):
        optimiser.zero_grad()
        loss(net(x)).backward()
        optimiser.step()


class PositionEmbedded(torch.nn.Module):
    """A token MLP after a learned position embedding as nanoGPT writes it (``wpe(pos)``)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(5)
        self.wpe = torch.nn.Embedding(8, 4)
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        pos = torch.arange(0, x.size(1), dtype=torch.long, device=x.device)
        return torch.tanh(self.fc(x + self.wpe(pos)))


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_five_adam_steps_with_an_embedding_of_positions_equal_autograds(backend):
    module = PositionEmbedded().double()
    reference = copy.deepcopy(module)
    x = torch.randn(6, 5, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    ours = ptorch.parallelize(module, example_input=x, backend=backend)
    for net in (ours, reference):
        adam_steps(net, lambda out: (out.sin() ** 2).sum(), x, lr=0.05)
    assert module.wpe.weight.grad[5:].abs().max() == 0  # the rows no position reads
    for (name, p), q in zip(module.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-12, atol=1e-13, msg=name)


class Tempered(torch.nn.Module):
    """Logits over a learned temperature (a scalar parameter dividing): x / p."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(7)
        self.fc, self.temperature = torch.nn.Linear(4, 3), torch.nn.Parameter(
            torch.tensor(1.5))

    def forward(self, x):
        return self.fc(x) / self.temperature


def test_five_adam_steps_with_a_learned_temperature_equal_autograds():
    module = Tempered().double()
    reference = copy.deepcopy(module)
    x = torch.randn(8, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(8))
    labels = torch.arange(8) % 3
    ours = ptorch.parallelize(module, example_input=x)
    for net in (ours, reference):
        adam_steps(net, lambda out: torch.nn.functional.cross_entropy(out, labels), x, lr=0.1)
    assert abs(module.temperature.item() - 1.5) > 0.1  # it trained
    for (name, p), q in zip(module.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-12, atol=1e-13, msg=name)


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_a_second_derivative_through_propops_solve_is_refused_by_pytorch(backend):
    """``once_differentiable``: the gradient's graph ends in PyTorch's error node.

    Before, the gradient of ``create_graph=True`` had no graph at all, and its
    backward said only that it does not require grad.
    """
    nn = torch.nn
    plain = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3)).double()
    module = ptorch.parallelize(copy.deepcopy(plain), backend=backend)
    x = torch.randn(5, 4, dtype=torch.float64, requires_grad=True)
    (g,) = torch.autograd.grad(module(x).pow(2).sum(), [x], create_graph=True)
    (want,) = torch.autograd.grad(plain(x).pow(2).sum(), [x])
    torch.testing.assert_close(g.detach(), want, rtol=1e-12, atol=1e-14)
    assert g.requires_grad
    with pytest.raises(RuntimeError, match="differentiate twice a function that was marked "
                                           "with @once_differentiable"):
        g.sum().backward()
