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


def test_unchecked_direct_solves_say_so_and_change_nothing_else():
    """Inside ``unchecked()`` a direct method's finite result is UNCHECKED, never CONVERGED."""
    from propop.solvers.convergence import unchecked

    case = Case((5, 6, 6, 4), activation="tanh", r=3)
    net, (x, t) = case.net(), case.data()
    trace = net.forward(x)
    B = pp.backward_system(net, trace, trace.output - t)
    checked = pp.solve(B, "cyclic-reduction")
    with unchecked():
        sol = pp.solve(B, "cyclic-reduction")
        kept = {m: pp.solve(B, m).status for m in ("substitution", "jacobi")}
        nan = pp.solve(B, lambda s, **o: pp.Solution(x=s.rhs * np.nan, status=pp.Status.CONVERGED))
        with pytest.raises(pp.ConvergenceError, match="true residual not computed"):
            pp.solve(B, "cyclic-reduction", check=True)  # check=True asks for CONVERGED
    assert sol.status is pp.Status.UNCHECKED and not sol.converged and sol.exit_code == 0
    assert sol.residuals == () and sol.info["verified"] is False and "not computed" in repr(sol)
    np.testing.assert_array_equal(sol.x, checked.x)
    assert kept == {"substitution": pp.Status.CONVERGED, "jacobi": pp.Status.CONVERGED}
    assert nan.status is pp.Status.NONFINITE and not nan.usable and sol.usable
    assert checked.converged and pp.solve(B, "cyclic-reduction").converged  # undone on leaving


def test_newton_judges_its_iterates_and_names_a_bad_last_solve():
    """Newton's direct solves run unchecked; the nonlinear residual judges each iterate.

    A linear solver that is off by 1e-3 (claiming CONVERGED) no longer stops the
    first iteration: the forward pass fails by its own residual, and the message
    names the last solve's miss, judged by its true residual.
    """
    case = Case((4,) * 4, activation="tanh", r=2)
    net, (x, _) = case.net(), case.data()
    reference = net.forward(x)
    tr = pp.forward(net, x, method="cyclic-reduction")
    assert tr.info["converged"] and {s.status for s in tr.info["solutions"]} == {
        pp.Status.UNCHECKED}
    for z, expected in zip(tr.z, reference.z):
        assert relative_error(z, expected) < 1e-12
    evaluated = pp.forward(net, x, method="substitution").info["solutions"]
    assert {s.status for s in evaluated} == {pp.Status.CONVERGED}  # rows evaluated: checked

    def off(system, **options):
        return pp.Solution(x=pp.solve(system, "substitution").x * (1 + 1e-3),
                           status=pp.Status.CONVERGED)

    with pytest.raises(pp.ConvergenceError, match=r"nonlinear residual .*; the last linear "
                                                  r"solve: the result misses the tolerance"):
        pp.forward(net, x, method=off)
    failed = pp.forward(net, x, method=off, check=False)
    assert not failed.info["converged"] and "the last linear solve" in failed.info["message"]
