"""Loss gradients against PyTorch, and their checks."""

import numpy as np
import pytest

import propop as pp
from reference import F, torch


def test_mse_value_and_gradient():
    z, t = np.array([[1.0, 2.0], [3.0, -1.0]]), np.array([[0.0, 2.0], [1.0, 1.0]])
    np.testing.assert_array_equal(pp.loss_gradient(z, t), z - t)
    assert pp.loss_value(z, t) == pytest.approx(0.5 * ((z - t) ** 2).sum())


@pytest.mark.parametrize("labels", [True, False])
@pytest.mark.parametrize("batch", [None, 4])
def test_cross_entropy_matches_torch(labels, batch):
    rng = np.random.default_rng(0)
    shape = (5,) if batch is None else (5, batch)
    z = rng.standard_normal(shape) * 3
    if labels:
        t = rng.integers(0, 5, size=shape[1:])
        t_torch = torch.as_tensor(t).reshape(-1)
    else:
        t = rng.dirichlet(np.ones(5), size=shape[1:]).T if batch else rng.dirichlet(np.ones(5))
        t_torch = torch.as_tensor(t.T if batch else t[None, :])
    zt = torch.tensor(z.T if batch else z[None, :], requires_grad=True)
    E = F.cross_entropy(zt, t_torch, reduction="sum")
    E.backward()
    grad = zt.grad.numpy()
    np.testing.assert_allclose(pp.loss_gradient(z, t, "cross_entropy"),
                               grad.T if batch else grad[0], rtol=1e-12, atol=1e-15)
    assert pp.loss_value(z, t, "cross_entropy") == pytest.approx(E.item(), rel=1e-12)


def test_loss_errors_name_the_problem():
    z = np.zeros((3, 2))
    with pytest.raises(ValueError, match=r"target has shape \(2, 3\), expected \(3, 2\)"):
        pp.loss_gradient(z, np.zeros((2, 3)))
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 3\)"):
        pp.loss_gradient(z, np.array([0, 3]), "cross_entropy")
    with pytest.raises(ValueError, match="unknown loss 'hinge'"):
        pp.loss_gradient(z, z, "hinge")
    with pytest.raises(ValueError, match="target contains NaN"):
        pp.loss_gradient(z, np.full((3, 2), np.nan))


@pytest.mark.parametrize("kind", ["torch", "array_api_strict"])
@pytest.mark.parametrize("reduction", ["sum", "mean"])
@pytest.mark.parametrize("labels", [True, False])
def test_cross_entropy_on_other_backends_is_torchs(kind, reduction, labels):
    """On PyTorch tensors and the strict namespace, against autograd's cross-entropy."""
    pytest.importorskip(kind)
    rng = np.random.default_rng(1)
    z = rng.standard_normal((5, 4)) * 3
    t = rng.integers(0, 5, size=4) if labels else rng.dirichlet(np.ones(5), size=4).T
    zt = torch.tensor(z.T, requires_grad=True)
    E = F.cross_entropy(zt, torch.as_tensor(t if labels else t.T), reduction=reduction)
    E.backward()
    on = lambda a: pp.backend.convert(a, kind)  # noqa: E731
    g = pp.loss_gradient(on(z), on(t), "cross_entropy", reduction)
    assert pp.backend.of(g).name == kind
    np.testing.assert_allclose(pp.backend.to_host(g), zt.grad.numpy().T, rtol=1e-12,
                               atol=1e-15)
    assert pp.loss_value(on(z), on(t), "cross_entropy", reduction) == pytest.approx(
        E.item(), rel=1e-12)
    assert pp.loss_value(on(z), on(z * 0), "mse", reduction) == pytest.approx(
        pp.loss_value(z, z * 0, "mse", reduction), rel=1e-14)
    if labels:
        with pytest.raises(ValueError, match=r"labels must lie in \[0, 5\), got range"):
            pp.loss_gradient(on(z), on(t + 5), "cross_entropy")


@pytest.mark.parametrize("kind", ["numpy", "torch"])
@pytest.mark.parametrize("cell", ["rnn", "gru"])
def test_a_recurrent_targets_shape_is_named_as_the_caller_sees_it(kind, cell):
    """Steps first, as the output; the moved features-first shapes were named before.

    A GRU's output of 4 steps, 3 features and 2 samples is ``(4, 3, 2)``; a target
    of 5 steps was said to miss ``(3, 4, 2)``, the loss's internal layout (and on
    PyTorch as ``torch.Size([...])``).
    """
    from propop import backend

    net = pp.RNN.random([2, 3], seed=0) if cell == "rnn" else pp.GRU(2, 3, seed=0)
    net = net.to(kind)
    xs = backend.convert(np.zeros((4, 2, 2)), kind)
    assert tuple(net.outputs(net.forward(xs)).shape if cell == "gru"
                 else net.forward(xs).output.shape) == (4, 3, 2)
    wrong = backend.convert(np.zeros((5, 3, 2)), kind)
    with pytest.raises(ValueError, match=r"target has shape \(5, 3, 2\), expected \(4, 3, 2\) "
                       r"\(the output's: steps, features\[, samples\]\)$"):
        pp.backprop(net, xs, wrong)
    with pytest.raises(ValueError, match=r"or integer labels of shape \(4, 2\)$"):
        pp.backprop(net, xs, np.zeros((5, 2), dtype=int), loss="cross_entropy")
    for good in (np.zeros((4, 3, 2)), np.zeros((3, 4, 2))):  # steps or features first
        g = pp.backprop(net, xs, backend.convert(good, kind))
        assert np.isfinite(backend.to_host(g.x)).all()
    pp.backprop(net, xs, np.zeros((4, 2), dtype=int), loss="cross_entropy")
