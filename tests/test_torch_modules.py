"""propop.torch's GRU, LSTM and RNN against torch.nn's: passes, gradients, training, failures.

Every comparison is with the ``torch.nn`` module itself (cuDNN-free CPU kernels,
autograd): outputs, final states and every parameter's gradient, then five steps
of Adam with gradient clipping and a parameter hook in a small language model.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import propop as pp  # noqa: E402
import propop.torch as ptorch  # noqa: E402

KINDS = {"gru": (torch.nn.GRU, {}), "lstm": (torch.nn.LSTM, {}),
         "rnn": (torch.nn.RNN, {"nonlinearity": "tanh"}),
         "rnn-relu": (torch.nn.RNN, {"nonlinearity": "relu"})}


def pair(kind, mode, method="cyclic-reduction", dtype=torch.float64, **options):
    torch.manual_seed(0)
    cls, own = KINDS[kind]
    reference = cls(3, 4, num_layers=2, dtype=dtype, **own, **options)
    return reference, ptorch.from_module(reference, mode=mode, method=method)


def run(module, x):
    x = x.detach().clone().requires_grad_(True)
    out, final = module(x)
    finals = final if isinstance(final, tuple) else (final,)
    loss = (out.sin() ** 2).sum() + sum((f * f.cos()).sum() for f in finals)
    loss.backward()
    return x, out, finals


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize(("mode", "method"), [("sequential", "substitution"),
                                              ("newton", "cyclic-reduction"),
                                              ("newton", "substitution"),
                                              ("quasi", "cyclic-reduction"),
                                              ("damped", "cyclic-reduction")])
def test_outputs_states_and_every_gradient_are_torch_nns(kind, mode, method):
    reference, ours = pair(kind, mode, method)
    x = torch.randn(15, 2, 3, dtype=torch.float64)
    x_ref, out_ref, finals_ref = run(reference, x)
    x_ours, out, finals = run(ours, x)
    torch.testing.assert_close(out, out_ref, rtol=1e-10, atol=1e-12)
    for a, b in zip(finals, finals_ref):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    for (name, p), (_, q) in zip(ours.named_parameters(), reference.named_parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-10, atol=1e-12, msg=name)
    torch.testing.assert_close(x_ours.grad, x_ref.grad, rtol=1e-10, atol=1e-12)
    assert ours.last["mode"] == mode and ours.last["backward"].converged
    if mode != "sequential":
        assert ours.last["converged"] and ours.last["iterations"] <= 15


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize(("mode", "batched"), [("sequential", True), ("newton", True),
                                               ("damped", True), ("newton", False)])
def test_a_given_initial_state_and_its_gradient_are_torch_nns(kind, mode, batched):
    """``module(x, h0)``: outputs, final states, and dE/dh0 as torch.nn computes them."""
    reference, ours = pair(kind, mode)
    shape = (15, 2, 3) if batched else (15, 3)
    x = torch.randn(*shape, dtype=torch.float64)
    state = (2, 2, 4) if batched else (2, 4)
    h0 = [torch.randn(*state, dtype=torch.float64) for _ in range(2 if kind == "lstm" else 1)]
    results = []
    for module in (reference, ours):
        hx = [h.clone().requires_grad_(True) for h in h0]
        xs = x.clone().requires_grad_(True)
        out, final = module(xs, tuple(hx) if kind == "lstm" else hx[0])
        finals = final if isinstance(final, tuple) else (final,)
        ((out.sin() ** 2).sum() + sum((f * f.cos()).sum() for f in finals)).backward()
        results.append((out, finals, xs.grad, [h.grad for h in hx],
                        [p.grad for p in module.parameters()]))
    (out_ref, finals_ref, dx_ref, dh_ref, dp_ref), (out, finals, dx, dh, dp) = results
    torch.testing.assert_close(out, out_ref, rtol=1e-10, atol=1e-12)
    for a, b in zip(list(finals) + [dx] + dh + dp, list(finals_ref) + [dx_ref] + dh_ref
                    + dp_ref):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    assert all(h.abs().max() > 0 for h in dh)  # h0 matters


def test_a_recurrence_started_from_a_state_backpropagates_to_it():
    """pp.GRU(...).starting_from(h): dE/dh_{-1} against finite differences."""
    gru = pp.GRU(2, 3, num_layers=2, seed=0)
    rng = np.random.default_rng(0)
    xs, h = rng.standard_normal((6, 2, 2)), rng.standard_normal((6, 2))
    target = rng.standard_normal((6, 3, 2))

    def loss(start):
        net = gru.starting_from(start)
        return 0.5 * float(np.sum((net.outputs(net.forward(xs)) - target) ** 2))

    g = pp.backprop(gru.starting_from(h), xs, target, method="cyclic-reduction")
    assert g.initial.shape == h.shape and gru.forward(xs).z[1].shape == (6, 6, 2)
    step = 1e-6
    for i, j in [(0, 0), (4, 1), (5, 0)]:
        e = np.zeros_like(h)
        e[i, j] = step
        fd = (loss(h + e) - loss(h - e)) / (2 * step)
        assert abs(g.initial[i, j] - fd) < 1e-7 * max(1.0, abs(fd)), (i, j)
    with pytest.raises(ValueError, match=r"the initial state has shape \(5,\), expected \(6,\)"):
        gru.starting_from(np.zeros(5))
    with pytest.raises(ValueError, match="the initial state holds 3 samples, the sequence 2"):
        gru.starting_from(np.zeros((6, 3))).forward(xs)


def test_the_modules_keep_torch_nns_conventions():
    reference, ours = pair("gru", "newton", batch_first=True, bias=False)
    assert isinstance(ours, torch.nn.GRU) and ours.batch_first and not ours.bias
    assert list(ours.state_dict()) == list(reference.state_dict())
    x = torch.randn(2, 9, 3, dtype=torch.float64)  # batch first
    torch.testing.assert_close(ours(x)[0], reference(x)[0], rtol=1e-10, atol=1e-12)
    unbatched = torch.randn(9, 3, dtype=torch.float64)
    out, h = ours(unbatched, torch.zeros(2, 4, dtype=torch.float64))
    torch.testing.assert_close(out, reference(unbatched)[0], rtol=1e-10, atol=1e-12)
    assert out.shape == (9, 4) and h.shape == (2, 4)
    with torch.no_grad():  # no graph: the forward alone
        assert not ours(x)[0].requires_grad
    assert "mode='newton'" in repr(ours)


class LanguageModel(torch.nn.Module):
    """Embedding, a 2-layer recurrent module, a linear head: next-token logits."""

    def __init__(self, recurrent):
        super().__init__()
        torch.manual_seed(1)
        self.embed = torch.nn.Embedding(11, 3, dtype=torch.float64)
        self.recurrent = recurrent
        self.head = torch.nn.Linear(4, 11, dtype=torch.float64)

    def forward(self, tokens):
        return self.head(self.recurrent(self.embed(tokens))[0])


def train(model, tokens, steps=5):
    optimiser = torch.optim.Adam(model.parameters(), lr=0.05)
    seen = []
    model.recurrent.weight_hh_l0.register_hook(lambda g: seen.append(g.norm()))
    for _ in range(steps):
        optimiser.zero_grad()
        logits = model(tokens[:-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 11), tokens[1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimiser.step()
    return seen


@pytest.mark.parametrize("kind", ["gru", "lstm"])
def test_five_adam_steps_of_a_language_model_equal_plain_autograds(kind):
    reference, ours = pair(kind, "newton")
    tokens = torch.randint(0, 11, (13, 4), generator=torch.Generator().manual_seed(2))
    plain, parallel = LanguageModel(reference), LanguageModel(ours)
    parallel.load_state_dict(plain.state_dict())
    seen_plain, seen_parallel = train(plain, tokens), train(parallel, tokens)
    assert len(seen_parallel) == 5  # the hook on a parameter saw every backward
    torch.testing.assert_close(torch.stack(seen_parallel), torch.stack(seen_plain),
                               rtol=1e-9, atol=1e-12)
    for (name, p), (_, q) in zip(parallel.named_parameters(), plain.named_parameters()):
        torch.testing.assert_close(p, q, rtol=1e-10, atol=1e-12, msg=name)


def test_float32_trains_to_float32s_tolerance():
    torch.manual_seed(0)
    reference = torch.nn.GRU(3, 4, num_layers=2)
    ours = ptorch.from_module(reference, mode="newton", method="cyclic-reduction")
    x = torch.randn(12, 3, 3)
    x_ref, out_ref, _ = run(reference, x)
    x_ours, out, _ = run(ours, x)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, out_ref, rtol=1e-4, atol=1e-5)
    for (name, p), (_, q) in zip(ours.named_parameters(), reference.named_parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-3, atol=1e-4, msg=name)



@pytest.mark.parametrize("mode", ["newton", "quasi"])
def test_a_float32_relu_layer_whose_steps_are_all_zero_converges(mode):
    """``F = 0`` at a step: its residual ``0 / max(0, tiny)`` is 0, not float32's NaN.

    (The floor was ``1e-300``, zero in float32.) The Lyapunov estimate's products of
    zero Jacobians stay finite too.
    """
    torch.manual_seed(2)
    reference = torch.nn.RNN(1, 1, num_layers=2, nonlinearity="relu")  # float32
    with torch.no_grad():
        reference.bias_ih_l1.fill_(-5.0)  # the second layer's output: zero at every step
    ours = ptorch.from_module(reference, mode=mode, method="cyclic-reduction")
    x = torch.randn(6, 4, 1)
    x_ref, out_ref, _ = run(reference, x)
    x_ours, out, _ = run(ours, x)
    assert not out_ref.any() and out.dtype == torch.float32
    torch.testing.assert_close(out, out_ref)
    assert ours.last["converged"] and np.isfinite(ours.last["lyapunov"])
    torch.testing.assert_close(x_ours.grad, x_ref.grad)


@pytest.mark.parametrize("mode", ["newton", "damped", "quasi-damped"])
def test_relu_steps_far_smaller_than_their_trajectory_converge_to_its_rounding(mode):
    """A step's gap is measured no finer than the rounding of its sample's largest state.

    ReLU steps whose units are all zero (``F_s = 0``: a damped step leaves the last
    bits of the previous iterate there) or a thousand times smaller than the largest
    read as relative residuals of ``1e290`` and ``2e-12`` against the module's
    ``rtol = 1e3 eps``, and the iteration raised at states exact to ``4e-16``.
    """
    for seed in (0, 2, 3, 16):  # failing before: 16 under Newton, 0, 2, 3 damped
        torch.manual_seed(seed)
        ours = ptorch.RNN(2, 3, nonlinearity="relu", bias=False, mode=mode,
                          method="cyclic-reduction").double()
        x = torch.randn(11, 4, 2, dtype=torch.float64)
        reference = torch.nn.RNN(2, 3, nonlinearity="relu", bias=False).double()
        reference.load_state_dict(ours.state_dict())
        x_ref, out_ref, finals_ref = run(reference, x)
        x_ours, out, finals = run(ours, x)
        assert ours.last["converged"], (seed, ours.last["residuals"][-3:])
        torch.testing.assert_close(out, out_ref, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(x_ours.grad, x_ref.grad, rtol=1e-10, atol=1e-12)

def test_a_forward_that_does_not_converge_raises_or_falls_back_saying_so():
    torch.manual_seed(3)
    reference = torch.nn.RNN(3, 8, dtype=torch.float64)
    with torch.no_grad():
        reference.weight_hh_l0.mul_(6.0)  # chaotic: Newton needs many iterations
    x = torch.randn(40, 2, 3, dtype=torch.float64)
    strict = ptorch.from_module(reference, mode="newton", method="substitution", maxiter=2)
    with pytest.raises(pp.ConvergenceError, match="forward iteration stopped after 2"):
        strict(x)
    lenient = ptorch.from_module(reference, mode="newton", method="substitution", maxiter=2,
                                 on_failure="sequential")
    with pytest.warns(RuntimeWarning, match="ran the sequential pass instead"):
        out, _ = lenient(x)
    torch.testing.assert_close(out, reference(x)[0], rtol=1e-10, atol=1e-12)
    assert lenient.last["mode"] == "sequential" and "fallback" in lenient.last


def test_what_is_not_supported_is_refused_by_name():
    with pytest.raises(ValueError, match="mode must be one of"):
        ptorch.GRU(3, 4, mode="fast")
    with pytest.raises(KeyError, match="no-such-method"):
        ptorch.GRU(3, 4, method="no-such-method")
    with pytest.raises(ValueError, match="bidirectional=True"):
        ptorch.LSTM(3, 4, bidirectional=True)
    gru = ptorch.GRU(3, 4, num_layers=2, dropout=0.5, dtype=torch.float64)
    with pytest.raises(ValueError, match="dropout between layers in training mode"):
        gru(torch.randn(5, 1, 3, dtype=torch.float64))
    gru.eval()
    gru(torch.randn(5, 1, 3, dtype=torch.float64))  # eval: dropout off, it runs
    with pytest.raises(ValueError, match=r"an initial state of shape \(2, 3, 4\), expected "
                                         r"\(2, 1, 4\) \(layers, batch, hidden\)"):
        gru(torch.randn(5, 1, 3, dtype=torch.float64), torch.ones(2, 3, 4, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"takes \(h0, c0\) as its initial state, got 1"):
        ptorch.LSTM(3, 4, dtype=torch.float64)(torch.randn(5, 1, 3, dtype=torch.float64),
                                               (torch.zeros(1, 1, 4, dtype=torch.float64),))
    with pytest.raises(TypeError, match="torch.nn.GRU, LSTM or RNN"):
        ptorch.from_module(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match=r"expected the input to be 2-D or 3-D, got 4-D"):
        gru(torch.randn(5, 1, 3, 1, dtype=torch.float64))  # was PyTorch's permute error
    packed = torch.nn.utils.rnn.pack_padded_sequence(torch.randn(5, 2, 3, dtype=torch.float64),
                                                     [5, 3])
    with pytest.raises(ValueError, match="a PackedSequence is not supported"):
        gru(packed)  # was an AttributeError
    assert np.isfinite(float(gru(torch.randn(5, 1, 3, dtype=torch.float64))[0].detach().sum()))


@pytest.mark.parametrize("cls", [torch.nn.RNN, torch.nn.GRU, torch.nn.LSTM])
def test_backprop_of_an_imported_recurrent_module_names_gradients_as_torch_does(cls):
    torch.manual_seed(4)
    module = cls(3, 4, num_layers=2, dtype=torch.float64)
    xs = np.random.default_rng(5).standard_normal((8, 3, 2))
    net = pp.from_torch(module)
    target = np.random.default_rng(6).standard_normal(
        (8, 4, 2) if cls is torch.nn.RNN else net.outputs(net.forward(xs)).shape)
    g = pp.backprop(net, xs, target, method="cyclic-reduction")
    out = module(torch.from_numpy(xs.transpose(0, 2, 1).copy()))[0]
    (0.5 * ((out - torch.from_numpy(target.transpose(0, 2, 1).copy())) ** 2).sum()).backward()
    ours = dict(g.named_parameters())
    assert list(ours) == [name for name, _ in module.named_parameters()]
    for name, p in module.named_parameters():
        np.testing.assert_allclose(np.asarray(ours[name]), p.grad.numpy(), rtol=1e-10,
                                   atol=1e-12, err_msg=name)


@pytest.mark.parametrize("kind", ["gru", "lstm", "rnn"])
@pytest.mark.parametrize("batch_first", [False, True])
def test_edge_inputs_behave_as_the_torch_nn_module(kind, batch_first):
    # a batch of no samples returned torch.nn's empty outputs nowhere (a ValueError), and a
    # float32 input to a float64 module ran where torch.nn raises: now as torch.nn does
    reference, ours = pair(kind, "newton", batch_first=batch_first)
    empty = torch.zeros((0, 5, 3) if batch_first else (5, 0, 3), dtype=torch.float64)
    for module in (reference, ours):
        out, final = module(empty)
        finals = final if isinstance(final, tuple) else (final,)
        assert tuple(out.shape) == tuple(reference(empty)[0].shape)
        assert all(tuple(f.shape) == (2, 0, 4) for f in finals)
        assert out.requires_grad
    for bad, error in [(torch.zeros(5, 1, 3, dtype=torch.float32), ValueError),
                       (torch.zeros(5, 1, 2, dtype=torch.float64), RuntimeError),
                       (torch.zeros((1, 0, 3) if batch_first else (0, 1, 3),
                                    dtype=torch.float64), RuntimeError)]:
        with pytest.raises(error) as expected:
            reference(bad)
        with pytest.raises(error) as got:
            ours(bad)
        assert str(got.value) == str(expected.value)


@pytest.mark.parametrize("kind", ["gru", "lstm", "rnn"])
def test_torch_nn_keeps_its_own_mode(kind):
    # propop's forward mode was stored as .mode, torch.nn.RNNBase's own ("GRU", "RNN_TANH"):
    # torch.nn.RNN's forward then refused it, and cuDNN's flatten_parameters (.to("cuda"))
    # would have read "newton" as a cell kind
    reference, ours = pair(kind, "quasi")
    assert ours.mode == reference.mode and ours.forward_mode == "quasi"
    assert "mode='quasi'" in repr(ours)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs PyTorch with CUDA")
@pytest.mark.parametrize("kind", ["gru", "lstm", "rnn"])
def test_a_module_moved_to_cuda_computes_as_torch_nn_there(kind):
    reference, ours = pair(kind, "newton")
    reference, ours = reference.to("cuda"), ours.to("cuda")  # flatten_parameters runs
    x = torch.randn(6, 2, 3, dtype=torch.float64, device="cuda")
    (_, out, finals), (_, theirs, their_finals) = run(ours, x), run(reference, x)
    assert (out - theirs).abs().max() < 1e-10
    assert all((f - g).abs().max() < 1e-10 for f, g in zip(finals, their_finals))
    for (name, p), q in zip(ours.named_parameters(), reference.parameters()):
        assert p.grad.device.type == "cuda" and (p.grad - q.grad).abs().max() < 1e-9, name


def test_a_second_derivative_through_a_recurrent_modules_solve_is_refused_by_pytorch():
    """``once_differentiable``, as :func:`propop.torch.parallelize`'s backward."""
    gru = ptorch.GRU(2, 3, dtype=torch.float64)
    plain = torch.nn.GRU(2, 3, dtype=torch.float64)
    plain.load_state_dict(gru.state_dict())
    x = torch.randn(6, 2, 2, dtype=torch.float64, requires_grad=True)
    (g,) = torch.autograd.grad(gru(x)[0].pow(2).sum(), [x], create_graph=True)
    (want,) = torch.autograd.grad(plain(x)[0].pow(2).sum(), [x])
    torch.testing.assert_close(g.detach(), want, rtol=1e-10, atol=1e-12)
    with pytest.raises(RuntimeError, match="differentiate twice a function that was marked "
                                           "with @once_differentiable"):
        g.sum().backward()
