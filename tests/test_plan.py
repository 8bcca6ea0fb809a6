"""Plan once, solve many: prepare(system, method).solve(rhs) for every method."""

import gc
import tracemalloc

import numpy as np
import pytest

import propop as pp
from cases import Case, excused

METHODS = [s.name for s in pp.solvers.available() if s.available]


def systems():
    net, trace, eps, _ = Case((5, 6, 6, 4), r=3, activation="tanh").problem()
    fnn = pp.backward_system(net, trace, eps)
    rnn = pp.RNN.random([3, 4, 4], activation="tanh", seed=0)
    rtrace = rnn.forward(np.random.default_rng(1).standard_normal((6, 3, 2)))
    x = np.repeat(np.random.default_rng(5).standard_normal((5, 1)), 3, axis=1)
    one = net.forward(x)  # one input repeated: one matrix for the batch, exactly
    return [fnn, pp.backward_system(rnn, rtrace, np.ones_like(rtrace.output)),
            pp.backward_system(net, one, np.ones((4, 3))).shared()]


@pytest.mark.parametrize("method", METHODS)
def test_a_plan_solves_many_right_hand_sides_like_solve_does(method):
    system = next(s for s in systems() if pp.solvers.info(method).applies_to(s))
    plan = pp.prepare(system, method)
    assert isinstance(plan, pp.Plan) and plan.method == method and plan.prepare_time >= 0
    rng = np.random.default_rng(2)
    for _ in range(3):
        rhs = rng.standard_normal(system.rhs.shape)
        ours = plan.solve(rhs)
        reference = pp.solve(system.with_rhs(rhs), method)
        assert ours.status is reference.status and ours.method == method
        if reference.converged:
            exact = pp.solve(system.with_rhs(rhs), "substitution").x
            limit = 1e-12 if pp.solvers.info(method).exact else 1e-8
            assert np.linalg.norm(ours.x - exact) <= limit * np.linalg.norm(exact)
        else:
            assert excused(method, reference) or "block" in method
    assert plan.solve().status is pp.solve(system, method).status  # its own rhs by default


def test_a_plan_checks_its_options_once_and_its_right_hand_sides_each_time():
    system = systems()[0]
    with pytest.raises(ValueError, match="jacobi: rtol must be"):
        pp.prepare(system, "jacobi", rtol=-1)
    plan = pp.prepare(system, "substitution")
    with pytest.raises(ValueError, match="rhs has shape"):
        plan.solve(np.ones(3))
    with pytest.raises(ValueError, match="rhs contains NaN"):
        plan.solve(np.full(system.rhs.shape, np.nan))
    with pytest.raises(pp.ConvergenceError, match="jacobi"):
        pp.prepare(system, "jacobi", maxiter=1).solve(check=True)


def test_a_shared_matrix_takes_any_number_of_columns():
    system = systems()[2]
    plan = pp.prepare(system, "block-gmres")
    rhs = np.random.default_rng(3).standard_normal((system.size, 7))
    solution = plan.solve(rhs)
    exact = pp.solve(system.with_rhs(rhs), "substitution").x
    assert solution.x.shape == (system.size, 7)
    np.testing.assert_allclose(solution.x, exact, rtol=1e-8, atol=1e-12)


def test_a_cyclic_reduction_plan_reduces_the_blocks_once(monkeypatch):
    from propop.solvers.reduction import odd_even

    net, trace, eps, _ = Case((16,) * 9, r=4, activation="tanh").problem()
    system = pp.backward_system(net, trace, eps)
    calls = []
    product = odd_even.product

    def counted(*args):  # products of arrays (the memory guard runs the loop on shapes)
        if isinstance(args[1], np.ndarray):
            calls.append(1)
        return product(*args)

    monkeypatch.setattr(odd_even, "product", counted)
    plan = pp.prepare(system, "cyclic-reduction")
    made = len(calls)
    assert made == 4  # ceil(log2 9) levels of block products
    rng = np.random.default_rng(4)
    for _ in range(4):
        rhs = rng.standard_normal(system.rhs.shape)
        solution = plan.solve(rhs)
        exact = pp.solve(system.with_rhs(rhs), "substitution").x
        np.testing.assert_allclose(solution.x, exact, rtol=1e-12, atol=1e-14)
    assert len(calls) == made  # no block product per right-hand side


def _bytes_beyond_output(method, depth):
    """Peak traced bytes of a prepared solve (warm) beyond its output, width 1."""
    net = pp.FNN.random([1] * (depth + 1), activation="tanh", seed=0)
    trace = net.forward(np.full(1, 0.5))
    plan = pp.prepare(pp.backward_system(net, trace, trace.output), method)
    rhs = np.random.default_rng(1).standard_normal(plan.system.rhs.shape)
    plan.solve(rhs)  # the first solve may do matrix work that the plan keeps
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        solution = plan.solve(rhs)
        return tracemalloc.get_traced_memory()[1] - base - solution.x.nbytes
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize(("method", "vectors"), [("substitution", 6), ("cyclic-reduction", 6)])
def test_a_prepared_solve_holds_no_python_object_per_block(method, vectors):
    """Beyond its output, a solve grows by a few float vectors per block, no more.

    At width 1 a block's float is 8 bytes, and any Python object made per block
    (a view, a tuple, a step) is at least 56: ``vectors`` floats per block
    allow the method's work vectors and no such object. The peak is the true
    residual's check at the end (the product that makes it, the residual, its
    block norms and bounds: about 5 floats a block at width 1), which every
    solve does; substitution's own work is 2, cyclic reduction's 6.
    """
    small, large = (_bytes_beyond_output(method, depth) for depth in (256, 2048))
    assert (large - small) / (2048 - 256) <= 8 * vectors, (small, large)


def test_a_plan_keeps_the_matrix_work_of_its_first_solve():
    """A method without a prepare step builds its blocks once per plan, not per solve."""
    net, trace, eps, _ = Case((5, 6, 4, 3), r=2, activation="tanh").problem()
    system = pp.backward_system(net, trace, eps)  # unequal widths: the per-block view
    plan = pp.prepare(system, "jacobi")
    rng = np.random.default_rng(4)
    first = rng.standard_normal(system.rhs.shape)
    plan.solve(first)
    blocks = plan.system.operator_of.__dict__.get("blocks")  # cached on the operator
    assert blocks is not None
    second = rng.standard_normal(system.rhs.shape)
    ours = plan.solve(second)
    assert plan.system.operator_of.__dict__["blocks"] is blocks
    reference = pp.solve(system.with_rhs(second), "substitution").x
    assert np.abs(ours.x - reference).max() <= 1e-9 * np.abs(reference).max()
