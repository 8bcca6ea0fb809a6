"""Property tests over random shapes (hypothesis): every exact path agrees."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import propop as pp
from cases import ACTIVATIONS, Case, relative_error

cases = st.builds(
    Case,
    sizes=st.lists(st.integers(1, 6), min_size=2, max_size=6).map(tuple),
    activation=st.sampled_from(ACTIVATIONS),
    density=st.sampled_from([1.0, 0.5]),
    r=st.sampled_from([None, 1, 2, 4]),
    seed=st.integers(0, 1000),
)


@settings(max_examples=60, deadline=None, derandomize=True)  # the same cases in every run
@given(cases)
def test_substitution_jacobi_and_matrix_agree_with_the_reference(case):
    net, trace, eps, v = case.problem()
    reference = np.concatenate(v)
    B = pp.backward_system(net, trace, eps)
    assert relative_error(pp.solve(B, "substitution").x, reference) < 1e-12
    jac = pp.solve(B, "jacobi", rtol=1e-14)  # exact after nblocks sweeps, to rounding
    assert jac.converged and jac.iterations <= B.nblocks
    assert relative_error(jac.x, reference) < 1e-12
    u = np.random.default_rng(case.seed).standard_normal(B.shape[0])
    assert relative_error(B.operator @ u, B.matrix @ u) < 1e-13


@settings(max_examples=40, deadline=None, derandomize=True)
@given(cases)
def test_forward_system_around_the_true_trace_is_exact(case):
    net, trace, _, _ = case.problem()
    x, _ = case.data()
    for linearization in ("secant", "newton"):
        F = pp.forward_system(net, x, around=trace, linearization=linearization)
        # the rows z_k = a_k (W z_{k-1}) + (a_k b_k + beta_k) cancel to z_k where
        # |a_k W z_{k-1}| >> |z_k| (secant slopes f(y)/y near y = 0 with f(0) != 0)
        products = [y - (b if y.ndim == 1 else b[:, None]) for y, b in zip(trace.y, net.b)]
        amplification = max([1.0] + [
            float(np.abs(act.linearize(y, linearization)[0] * Wz).max())
            / max(float(np.abs(z).max()), 1e-300)
            for act, y, Wz, z in zip(net.activations, trace.y, products, trace.z[1:])])
        error = relative_error(pp.solve(F).x, np.concatenate(trace.z))
        assert error < 1e-12 * amplification, (error, amplification)
