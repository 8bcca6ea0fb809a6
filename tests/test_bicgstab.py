"""SciPy's BiCGStab breaks down on the backward system; propop's converges.

As docs/index.md, "Solving", says.
"""

import numpy as np
import scipy.sparse.linalg as spla

import propop as pp
from cases import Case, relative_error


def backward():
    net, trace, eps, v = Case((8,) * 7, activation="tanh", r=None).problem()
    return pp.backward_system(net, trace, eps), np.concatenate(v)


def test_scipy_bicgstab_breaks_down_because_rho_vanishes():
    B, v = backward()
    x, info = spla.bicgstab(B.matrix, B.rhs, rtol=1e-10)
    assert info < 0  # SciPy's breakdown flag
    assert relative_error(x, v) > 0.1
    # the reason: after one step the residual is orthogonal to rhat = r0
    r0 = B.rhs
    r1_seen = []
    spla.bicgstab(B.matrix, B.rhs, rtol=1e-10, maxiter=1,
                  callback=lambda xk: r1_seen.append(B.rhs - B.matrix @ xk))
    assert abs(r0 @ r1_seen[0]) <= 1e-12 * np.linalg.norm(r0) * np.linalg.norm(r1_seen[0])


def test_propop_bicgstab_converges_where_scipy_breaks_down():
    B, v = backward()
    sol = pp.solve(B, "bicgstab", rtol=1e-12)
    assert sol.converged and relative_error(sol.x, v) < 1e-10
    assert sol.levels == 2 * sol.iterations
    assert pp.solve(B, "scipy.bicgstab").status is pp.Status.BREAKDOWN


def test_shadow_r0_reproduces_the_breakdown_and_reports_it():
    B, _ = backward()
    sol = pp.solve(B, "bicgstab", shadow="residual")
    assert sol.status is pp.Status.BREAKDOWN
    assert "rho" in sol.message and "shadow='random'" in sol.message


def test_batch_runs_in_lock_step_with_per_sample_scalars():
    net, trace, eps, v = Case((6, 7, 7, 7, 4), activation="softplus", r=5).problem()
    B = pp.backward_system(net, trace, eps)
    sol = pp.solve(B, "bicgstab")
    assert sol.converged and relative_error(sol.x, np.concatenate(v)) < 1e-9
    assert len(sol.info["sample_residuals"]) == 5
    single = [pp.solve(B.sample(i), "bicgstab").iterations for i in range(5)]
    assert sol.iterations == max(single)
