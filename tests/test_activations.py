"""Activations: f and f' against PyTorch and finite differences; exact linearisations."""

import numpy as np
import pytest

import propop as pp
from propop import activations
from cases import ACTIVATIONS as HIDDEN
from reference import TORCH_ACTIVATIONS, torch

F = torch.nn.functional

MORE = ("celu", "selu", "hardtanh", "relu6", "mish", "softsign", "hardsigmoid", "hardswish",
        "tanhshrink", "logsigmoid", "sin", "cos", "abs", "clamp", "erf")
ACTIVATIONS = HIDDEN + ("exp",) + MORE
# the kinks of the piecewise ones (0, +-1, +-3, 6) and both sides of softplus's threshold
Y = np.concatenate([np.linspace(-6, 6, 241), [-1e-300, 1e-300, 1e-310, -3e2, 3e2, 6.0, 19.99,
                                               20.0, 20.01, 2.5, 2.501, 10.0, 10.01]])
# members of the families at settings other than PyTorch's defaults
MEMBERS = [("leaky_relu", {"negative_slope": 0.2}, lambda y: F.leaky_relu(y, 0.2)),
           ("leaky_relu", {"negative_slope": -0.5}, lambda y: F.leaky_relu(y, -0.5)),
           ("elu", {"alpha": 0.5}, lambda y: F.elu(y, 0.5)),
           ("celu", {"alpha": 2.5}, lambda y: F.celu(y, 2.5)),
           ("softplus", {"beta": 2.0}, lambda y: F.softplus(y, 2.0)),
           ("softplus", {"beta": 0.5, "threshold": 5}, lambda y: F.softplus(y, 0.5, 5.0)),
           ("softplus", {"beta": -1.0}, lambda y: F.softplus(y, -1.0)),
           ("hardtanh", {"min_val": 0.0, "max_val": 2.5}, lambda y: F.hardtanh(y, 0.0, 2.5)),
           ("clamp", {"min": -1.0, "max": 3.0}, lambda y: torch.clamp(y, -1.0, 3.0)),
           ("clamp", {"min": 0.0}, lambda y: torch.clamp(y, min=0.0)),  # relu but at 0
           ("clamp", {"max": 2.5}, lambda y: torch.clamp(y, max=2.5))]


def _against_torch(act, reference):
    y = torch.tensor(Y, requires_grad=True)
    fy = reference(y)
    fy.sum().backward()
    slope = y.grad.numpy()
    # PyTorch loses relative accuracy in some tails (1 + tanh): compare absolutely there
    np.testing.assert_allclose(act.f(Y), fy.detach().numpy(), rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(act.df(Y), slope, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("name", ACTIVATIONS)
def test_f_and_derivative_match_torch(name):
    _against_torch(pp.get_activation(name), TORCH_ACTIVATIONS[name])


@pytest.mark.parametrize(("name", "settings", "reference"), MEMBERS)
def test_a_familys_member_matches_torch_at_its_settings(name, settings, reference):
    act = pp.get_activation(name, **settings)
    assert act is pp.get_activation(name, **settings)  # made once
    assert act.name.startswith(f"{name}(") and act.name != name
    _against_torch(act, reference)
    for kind in ("secant", "newton"):  # exact at the point, to the rounding of a y + beta
        a, beta = act.linearize(Y, kind)
        f = act.f(Y)
        assert (np.abs(a * Y + beta - f) <= 1e-14 * np.maximum(abs(f), abs(a * Y))).all()


def test_hardsigmoid_is_pytorchs_but_for_its_float32_slope():
    y = torch.tensor(Y, requires_grad=True)
    F.hardsigmoid(y).sum().backward()
    act = pp.get_activation("hardsigmoid")
    np.testing.assert_allclose(act.f(Y), F.hardsigmoid(y).detach().numpy(), rtol=1e-15,
                               atol=1e-16)
    slope = y.grad.numpy()  # 0 and float32's 1/6: propop's is float64's
    assert set(np.unique(slope)) == {0.0, float(np.float32(1 / 6))}
    np.testing.assert_array_equal(act.df(Y), np.where(slope == 0, 0.0, 1 / 6))


def test_family_settings_are_checked():
    assert pp.get_activation("elu", alpha=1) is pp.get_activation("elu")  # the defaults
    with pytest.raises(TypeError, match=r"'leaky_relu' has no setting 'slope'; its settings "
                                        r"are negative_slope=0.01"):
        pp.get_activation("leaky_relu", slope=0.2)
    with pytest.raises(TypeError, match=r"activation 'tanh' takes no settings; those that do: "
                                        r"leaky_relu \(negative_slope\)"):
        pp.get_activation("tanh", alpha=2)
    with pytest.raises(TypeError, match="alpha must be a number, got '2'"):
        pp.get_activation("elu", alpha="2")
    with pytest.raises(ValueError, match="min_val 2.0 must be below max_val 1.0"):
        pp.get_activation("hardtanh", min_val=2)
    with pytest.raises(ValueError, match="celu: alpha must be non-zero"):
        pp.get_activation("celu", alpha=0)
    with pytest.raises(ValueError, match="threshold must be a number, got NaN"):
        pp.get_activation("softplus", threshold=np.nan)
    with pytest.raises(ValueError, match="clamp: min 2.0 must not exceed max 1.0"):
        pp.get_activation("clamp", min=2, max=1)


@pytest.mark.parametrize("name", ACTIVATIONS)
def test_derivative_matches_finite_differences(name):
    act = pp.get_activation(name)
    y = np.linspace(-3, 3, 60) + 0.013  # away from the kinks at 0
    h = 1e-6
    np.testing.assert_allclose(act.df(y), (act.f(y + h) - act.f(y - h)) / (2 * h),
                               rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("name", ACTIVATIONS)
@pytest.mark.parametrize("kind", ["secant", "newton"])
def test_linearization_is_exact_at_its_point(name, kind):
    act = pp.get_activation(name)
    a, beta = act.linearize(Y, kind)
    assert np.isfinite(a).all() and np.isfinite(beta).all()
    f = act.f(Y)
    # exact up to the rounding of a * y + beta: relative to |a y|, which can exceed |f|
    # (the tangent of exp or silu at |y| = 300 cancels 300 f against 299 f)
    bound = 1e-14 * np.maximum(np.abs(f), np.abs(a * Y)) + 1e-300
    assert (np.abs(a * Y + beta - f) <= bound).all()


@pytest.mark.parametrize("name", ACTIVATIONS)
def test_secant_is_the_ratio_away_from_zero_and_its_limit_at_zero(name):
    act = pp.get_activation(name)
    y = np.array([-2.0, -0.5, 0.25, 3.0, 0.0])
    a, beta = act.secant(y)
    np.testing.assert_allclose(a[:4], act.f(y[:4]) / y[:4], rtol=1e-15)
    np.testing.assert_array_equal(beta[:4], 0)
    f0 = act.f(np.zeros(1))[0]
    if f0 == 0:  # the limit f(y)/y -> f'(0)
        assert a[4] == act.df(np.zeros(1))[0] and beta[4] == 0
    else:  # the paper's breakdown case, removed: a = 0, beta = f(0)
        assert a[4] == 0 and beta[4] == f0


def test_float32_stays_float32():
    y = np.linspace(-2, 2, 9, dtype=np.float32)
    for name in ACTIVATIONS:
        a, beta = pp.get_activation(name).secant(y)
        assert a.dtype == np.float32 and beta.dtype == np.float32, name


def test_registry_lists_extends_and_rejects(monkeypatch):
    assert set(ACTIVATIONS) <= set(pp.available_activations())
    # the registration below is undone after the test, so that the registry
    # other tests see (the README's count of activations) is the package's own
    monkeypatch.setattr(activations, "_REGISTRY", dict(activations._REGISTRY))
    cube = pp.Activation("cube-test", lambda y: y**3, lambda y: 3 * y**2)
    pp.register_activation(cube)
    assert pp.get_activation("cube-test") is cube
    with pytest.raises(ValueError, match="already registered"):
        pp.register_activation(cube)
    with pytest.raises(KeyError, match="unknown activation 'swishy'.*relu"):
        pp.get_activation("swishy")
    net = pp.FNN([np.eye(2)], activation="cube-test")
    np.testing.assert_allclose(net.forward(np.array([2.0, -1.0])).output, [8.0, -1.0])


@pytest.mark.parametrize("name", [n for n in pp.available_activations()
                                  if pp.get_activation(n).df_of_output is not None])
def test_derivative_from_the_output_is_the_derivative_bit_for_bit(name):
    act = pp.get_activation(name)
    y = np.random.default_rng(0).standard_normal((50, 7)) * 8
    assert np.array_equal(act.df_of_output(act.f(y)), act.df(y))


@pytest.mark.parametrize("name", ACTIVATIONS)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_newton_tangent_is_its_definition_bit_for_bit(name, dtype):
    """``a = f'(y)``, ``beta = f(y) - f'(y) y``: f once (slope from the output), no bit changed."""
    act = pp.get_activation(name)
    y = (np.random.default_rng(1).standard_normal((40, 3)) * 4).astype(dtype)
    a, beta = act.newton(y)
    assert a.dtype == dtype and beta.dtype == dtype
    assert np.array_equal(a, act.df(y))
    assert np.array_equal(beta, act.f(y) - act.df(y) * y)


@pytest.mark.parametrize(("name", "reference", "low", "start"), [
    ("log", torch.log, 0.0, 1e-300), ("log1p", torch.log1p, -1.0, 1e-15)])
def test_partial_functions_match_torch_on_their_domain(name, reference, low, start):
    """``log`` and ``log1p``: no network's activations, but what from_torch imports."""
    assert name not in pp.available_activations()
    act = activations.PARTIAL[name]
    y = low + np.concatenate([np.geomspace(start, 1e3, 200), [1.0, 2.0, 0.5]])
    t = torch.tensor(y, requires_grad=True)
    fy = reference(t)
    fy.sum().backward()
    np.testing.assert_allclose(act.f(y), fy.detach().numpy(), rtol=1e-15, atol=0)
    np.testing.assert_allclose(act.df(y), t.grad.numpy(), rtol=1e-15, atol=0)
    inner = y[(y > low + 1e-3) & (y < low + 1e3)]
    h = 1e-6 * (inner - low)
    fd = (act.f(inner + h) - act.f(inner - h)) / (2 * h)
    np.testing.assert_allclose(act.df(inner), fd, rtol=1e-6)
