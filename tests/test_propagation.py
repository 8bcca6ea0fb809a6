"""The one-liners: backprop against PyTorch, Newton forward against the reference."""

import numpy as np
import pytest
import scipy.sparse as sp

import propop as pp
from cases import Case, relative_error
from reference import dense, torch_gradients

METHODS = ["substitution", "scipy.spsolve_triangular", "jacobi", "bicgstab", "scipy.gmres",
           "cyclic-reduction", "parallel-cyclic-reduction",
           "pyamg.fgmres"]


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("case", [Case((6, 8, 8, 3), activation="tanh", r=4),
                                  Case((5, 9, 4), activation="relu", density=0.5, r=None)],
                         ids=lambda c: c.id)
def test_backprop_matches_autograd(method, case):
    net, (x, t) = case.net(), case.data()
    g = pp.backprop(net, x, t, loss="mse", method=method)
    _, dW, db, dx = torch_gradients(net, x, t)
    assert g.solution.converged and g.solution.method == method
    for k in range(net.depth):
        mask = dense(net.W[k]) != 0 if sp.issparse(net.W[k]) else 1
        assert relative_error(dense(g.W[k]), dW[k] * mask) < 1e-9
        assert relative_error(g.b[k], db[k]) < 1e-9
    assert relative_error(g.x, dx) < 1e-9


def test_backprop_cross_entropy_with_labels_matches_autograd():
    case = Case((6, 7, 5), activation="gelu", r=8)
    net, (x, _) = case.net(), case.data()
    labels = np.arange(8) % 5
    g = pp.backprop(net, x, labels, loss="cross_entropy", method="jacobi")
    _, dW, db, dx = torch_gradients(net, x, labels, loss="cross_entropy")
    assert relative_error(g.W[0], dW[0]) < 1e-9 and relative_error(g.x, dx) < 1e-9


@pytest.mark.parametrize("linearization", ["newton", "secant"])
@pytest.mark.parametrize("method", ["substitution", "jacobi", "scipy.gmres", "cyclic-reduction"])
def test_forward_iteration_reproduces_the_sequential_pass(linearization, method):
    case = Case((5, 8, 8, 8, 8, 3), activation="tanh", r=3)
    net, (x, _) = case.net(), case.data()
    tr = pp.forward(net, x, method=method, linearization=linearization)
    reference = net.forward(x)
    assert tr.info["converged"] and 1 <= tr.info["iterations"] <= net.depth
    for a, b in zip(tr.z, reference.z):
        assert relative_error(a, b) < 1e-10
    assert tr.info["residuals"][-1] <= 1e-10


def test_newton_is_exact_after_depth_iterations_even_for_relu():
    """Layer k is exact after k iterations: the bound holds for piecewise-linear f too."""
    case = Case((4,) * 9, activation="relu", r=2)
    net, (x, _) = case.net(), case.data()
    tr = pp.forward(net, x, rtol=0.0, maxiter=net.depth, check=False)
    np.testing.assert_allclose(tr.output, net.forward(x).output, rtol=1e-13, atol=1e-14)


def test_newton_takes_fewer_iterations_than_secant_on_a_smooth_net():
    case = Case((6,) * 9, activation="tanh", r=2)
    net, (x, _) = case.net(), case.data()
    newton = pp.forward(net, x, linearization="newton").info["iterations"]
    secant = pp.forward(net, x, linearization="secant").info["iterations"]
    assert newton <= secant <= net.depth


def test_forward_that_does_not_converge_says_so():
    case = Case((5,) * 7, activation="tanh", r=2)
    net, (x, _) = case.net(), case.data()
    with pytest.raises(pp.ConvergenceError, match=r"after 1 iterations.*raise maxiter"):
        pp.forward(net, x, maxiter=1)
    tr = pp.forward(net, x, maxiter=1, check=False)
    assert not tr.info["converged"] and tr.info["iterations"] == 1
