"""Activations: f and f' against PyTorch and finite differences; exact linearisations."""

import numpy as np
import pytest

import propop as pp
from cases import ACTIVATIONS as HIDDEN
from reference import TORCH_ACTIVATIONS, torch

ACTIVATIONS = HIDDEN + ("exp",)
Y = np.concatenate([np.linspace(-6, 6, 241), [-1e-300, 1e-300, 1e-310, -3e2, 3e2]])


@pytest.mark.parametrize("name", ACTIVATIONS)
def test_f_and_derivative_match_torch(name):
    act = pp.get_activation(name)
    y = torch.tensor(Y, requires_grad=True)
    fy = TORCH_ACTIVATIONS[name](y)
    fy.sum().backward()
    # PyTorch loses relative accuracy in some tails (1 + tanh): compare absolutely there
    np.testing.assert_allclose(act.f(Y), fy.detach().numpy(), rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(act.df(Y), y.grad.numpy(), rtol=1e-12, atol=1e-14)


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


def test_registry_lists_extends_and_rejects():
    assert set(ACTIVATIONS) <= set(pp.available_activations())
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
