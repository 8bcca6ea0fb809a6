"""Every registered method, on every case (scikit-learn's ``check_estimator`` habit).

A method newly registered is tested here without anyone writing a test for it.
"""

import numpy as np
import pytest

import propop as pp
from cases import (BREAK_DOWN, CASES, SLOW, Case, excused, gpu_backends, relative_error,
                   tolerance)

METHODS = [s.name for s in pp.solvers.available()]
# Shadow residual r0: breakdown on systems whose rhs lives in one block (docs/index.md, "Solving").
# They may fail there, but must then say so.
MAY_BREAK_DOWN = BREAK_DOWN


def rtol_for(dtype):
    return 1e-10 if dtype == "float64" else 1e-5


def check_solution(method, system, reference, dtype):
    if not pp.solvers.info(method).applies_to(system):  # then it must say so
        with pytest.raises(ValueError, match="needs|not block bi-diagonal"):
            pp.solve(system, method)
        return None
    exact = pp.solvers.info(method).exact
    sol = pp.solve(system, method, rtol=rtol_for(dtype))
    assert isinstance(sol, pp.Solution) and sol.method == method
    assert sol.x.shape == system.rhs.shape and sol.x.dtype == system.dtype
    assert sol.residuals and all(isinstance(r, float) for r in sol.residuals)
    assert sol.time > 0 and sol.levels >= 1
    if not sol.converged:
        assert excused(method, sol), sol.message
        return sol
    limit = tolerance(dtype) if exact else 1e3 * rtol_for(dtype)
    assert relative_error(sol.x, np.concatenate(reference)) < limit
    threshold = rtol_for(dtype) * np.linalg.norm(system.rhs, axis=0).max()
    assert sol.residuals[-1] <= threshold * (1 + 1e-6)
    return sol


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
@pytest.mark.parametrize("method", METHODS)
def test_backward_system(method, case):
    net, trace, eps, v = case.problem()
    check_solution(method, pp.backward_system(net, trace, eps), v, case.dtype)


@pytest.mark.parametrize("case", CASES[:4], ids=lambda c: c.id)
@pytest.mark.parametrize("method", METHODS)
def test_forward_system_around_the_true_trace(method, case):
    net, trace, _, _ = case.problem()
    x, _ = case.data()
    system = pp.forward_system(net, x, around=trace, linearization="newton")
    check_solution(method, system, trace.z, case.dtype)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("r", [None, 2])
def test_rnn_backward_system(method, r):
    rnn = pp.RNN.random([3, 4, 4], activation="tanh", seed=0)
    xs = np.random.default_rng(1).standard_normal((5, 3) + (() if r is None else (r,)))
    trace = rnn.forward(xs)
    eps = rnn.loss_gradient(trace, np.zeros_like(trace.output))
    v = rnn.backward(trace, eps)
    reference = [v[k][s] for s in range(5) for k in range(3)]  # time-major blocks
    check_solution(method, pp.backward_system(rnn, trace, eps), reference, "float64")


@pytest.mark.parametrize("method", METHODS)
def test_shadow_r0_methods_do_break_down_on_backward_systems(method):
    """The breakdown list above is a fact, not an excuse: check it is still needed."""
    net, trace, eps, _ = Case((6, 6, 6, 6, 6), r=None).problem()
    if not pp.solvers.info(method).applies_to(pp.backward_system(net, trace, eps)) or \
            method in SLOW:
        return
    sol = pp.solve(pp.backward_system(net, trace, eps), method)
    assert sol.converged == (method not in MAY_BREAK_DOWN), sol.message


def rnn_system(tau=9):
    rnn = pp.RNN.random([3, 4, 4], activation="tanh", seed=0)
    trace = rnn.forward(np.random.default_rng(1).standard_normal((tau, 3, 2)))
    return pp.backward_system(rnn, trace, np.ones_like(trace.output))


def shared_system(widths=(6,) * 9, r=2):
    """A batch with one matrix exactly: one input repeated, a right-hand side per column."""
    net = Case(widths).net()
    x = np.repeat(np.random.default_rng(0).standard_normal((widths[0], 1)), r, axis=1)
    eps = np.random.default_rng(1).standard_normal((widths[-1], r))
    return pp.backward_system(net, net.forward(x), eps).shared()


def some_system(method, fnn):
    """``fnn``, or a system with the structure ``method`` requires (an RNN's, one matrix)."""
    for system in (fnn, rnn_system(), shared_system(fnn.sizes)):
        if pp.solvers.info(method).applies_to(system):
            return system
    raise AssertionError(f"no test system suits {method}")


@pytest.mark.parametrize("method", [m for m in METHODS if not pp.solvers.info(m).exact])
def test_nonconvergence_is_reported_and_check_raises(method):
    net, trace, eps, _ = Case((6,) * 9, r=2).problem()
    system = some_system(method, pp.backward_system(net, trace, eps))
    sol = pp.solve(system, method, maxiter=1)
    assert not sol.converged and sol.status is not pp.Status.CONVERGED
    assert sol.message
    if sol.status is pp.Status.MAX_ITER:
        assert "maxiter=1" in sol.message and "substitution" in sol.message
    with pytest.raises(pp.ConvergenceError, match=method.replace(".", r"\.")) as info:
        pp.solve(system, method, maxiter=1, check=True)
    assert info.value.solution.status is sol.status


@pytest.mark.parametrize("method", [m for m in METHODS if not pp.solvers.info(m).exact])
def test_starting_at_the_solution_takes_no_iteration(method):
    net, trace, eps, v = Case((4, 5, 3), r=2).problem()
    system = some_system(method, pp.backward_system(net, trace, eps))
    exact = pp.solve(system, "substitution").x
    sol = pp.solve(system, method, x0=exact)
    assert sol.converged and sol.iterations == 0


@pytest.mark.parametrize("method", ["jacobi", "richardson", "bicgstab", "scipy.gmres",
                                    "scipy.bicgstab", "pyamg.gmres"])
def test_callback_sees_iterates(method):
    net, trace, eps, _ = Case((4, 5, 5, 3), r=2).problem()
    seen = []
    pp.solve(pp.backward_system(net, trace, eps), method, callback=lambda x: seen.append(1))
    assert seen


def test_jacobi_is_exact_after_nblocks_sweeps_and_not_before():
    """Nilpotency: the residual vanishes at sweep nblocks, exactly."""
    net, trace, eps, v = Case((5,) * 7, r=3).problem()
    system = pp.backward_system(net, trace, eps)
    sol = pp.solve(system, "jacobi", rtol=0.0)
    assert sol.iterations == system.nblocks == 7
    assert sol.residuals[-2] > 1e-6 * sol.residuals[0]
    assert sol.residuals[-1] == 0.0
    np.testing.assert_array_equal(sol.x, pp.solve(system, "substitution").x)


def test_richardson_damping_trades_exactness_for_damping():
    net, trace, eps, _ = Case((5,) * 5, r=None).problem()
    system = pp.backward_system(net, trace, eps)
    assert not pp.solve(system, "richardson", omega=0.5).converged
    assert pp.solve(system, "richardson", omega=0.5, maxiter=200).converged


@pytest.mark.parametrize("method", [m for m in METHODS if pp.solvers.info(m).exact])
def test_direct_methods_always_check_their_result(method):
    net, trace, eps, v = Case((4, 5, 3), r=2).problem()
    system = pp.backward_system(net, trace, eps)
    sol = pp.solve(system, method)
    assert sol.converged and sol.info["verified"] and len(sol.residuals) == 2
    residual = np.linalg.norm(system.rhs - system.apply(sol.x), axis=0).max()
    assert sol.residuals[-1] == pytest.approx(residual, rel=1e-12, abs=1e-300)
    assert sol.residuals[-1] < 1e-13 * sol.residuals[0]
    with pytest.raises(TypeError, match="no option 'verify'"):
        pp.solve(system, method, verify=True)


@pytest.mark.parametrize(("kind", "device"), [("numpy", None), ("torch", None),
                                               ("array_api_strict", None), *gpu_backends()])
def test_block_norms_keep_a_small_block_after_large_ones_on_every_backend(kind, device):
    """Each block's sum of squares to rounding, however small beside the blocks before it.

    (CuPy's ``add.reduceat`` differences a running sum, which would give the 1e-12 block
    as rounding noise of the sum before it: the norms of unequal blocks do not use it.)
    """
    pytest.importorskip(kind)
    from propop import backend
    from propop.solvers.convergence import block_squares

    sizes = [3, 5, 2, 4, 1]
    A = np.random.default_rng(0).standard_normal((15, 3)) * np.repeat(
        [1e0, 1e-12, 1e3, 1e-9, 1.0], sizes)[:, None]
    starts = np.cumsum([0] + sizes[:-1])
    expected = np.array([(A[o:o + n] ** 2).sum(axis=0) for o, n in zip(starts, sizes)])
    couplings = [np.ones((b, a)) for a, b in zip(sizes[:-1], sizes[1:])]
    system = pp.TriangularSystem(couplings, None, np.ones((15, 3)), lower=True,
                                 sizes=sizes).to(kind, device)
    np.testing.assert_allclose(block_squares(system, backend.convert(A, kind, device)),
                               expected, rtol=1e-14)
