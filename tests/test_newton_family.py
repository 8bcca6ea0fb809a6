"""The Newton family of parallel forward passes of a recurrence: DEER, quasi-DEER, ELK."""

import warnings

import numpy as np
import pytest

import propop as pp
from cases import relative_error
from propop.solvers.reduction.tridiagonal import block_tridiagonal
from reference import torch

TAU, R = 12, 3


@pytest.mark.parametrize("m", [1, 2, 3, 7, 8, 13])
def test_block_tridiagonal_reduction_against_a_dense_solve(m):
    rng = np.random.default_rng(m)
    r, n = 2, 3
    B, C = rng.standard_normal((m, r, n, n)), rng.standard_normal((m, r, n, n))
    D = rng.standard_normal((m, r, n, n)) + 6 * np.eye(n)
    f = rng.standard_normal((m, r, n))
    x, levels = block_tridiagonal(B, D, C, f)
    assert levels == int(np.ceil(np.log2(m)))
    for i in range(r):
        A = np.zeros((m * n, m * n))
        for k in range(m):
            A[k * n:(k + 1) * n, k * n:(k + 1) * n] = D[k, i]
            if k:
                A[k * n:(k + 1) * n, (k - 1) * n:k * n] = B[k, i]
            if k < m - 1:
                A[k * n:(k + 1) * n, (k + 1) * n:(k + 2) * n] = C[k, i]
        expected = np.linalg.solve(A, f[:, i].reshape(-1)).reshape(m, n)
        for k in range(m):
            assert relative_error(x[k, i], expected[k]) < 1e-12, (i, k)


@pytest.mark.parametrize("linearization", ["newton", "quasi", "block-diagonal", "damped",
                                           "quasi-damped"])
def test_every_linearization_reaches_the_sequential_states(linearization):
    torch.manual_seed(0)
    net = pp.from_torch(torch.nn.GRU(2, 3, num_layers=2).double())
    xs = np.random.default_rng(1).standard_normal((TAU, 2, R))
    exact = net.forward(xs).z[1]
    f = pp.forward(net, xs, method="cyclic-reduction", linearization=linearization)
    assert f.info["converged"]
    assert f.info["residuals"][-1] <= 1e-10 and len(f.info["residuals"]) == \
        f.info["iterations"] + 1
    for s in range(TAU):
        assert relative_error(f.z[1][s], exact[s]) < 1e-9, (linearization, s)
    assert f.info["lyapunov"] < 0  # a contractive GRU
    if linearization.endswith("damped"):
        lam = np.array(f.info["damping"])
        assert lam.shape == (f.info["iterations"], R)
        assert f.info["accepted"][0].all() and (lam[-1] < lam[0]).all()  # Marquardt's schedule


def linear_cell(a):
    """``h_s = a * h_{s-1} + x_s``: its largest Lyapunov exponent is ``log max |a|``."""
    return pp.Recurrence(lambda p, h, x: p["a"] * h + x, {"a": np.asarray(a)}, state_size=2,
                         input_size=2)


def test_the_lyapunov_exponent_and_its_warning():
    xs = np.random.default_rng(2).standard_normal((400, 2, 2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a contractive cell warns of nothing
        calm = pp.forward(linear_cell([0.9, 0.5]), xs, method="cyclic-reduction")
    assert abs(calm.info["lyapunov"] - np.log(0.9)) < 0.01
    with pytest.warns(RuntimeWarning, match=r"Lyapunov exponent .* \+0\.\d+ > 0"):
        wild = pp.forward(linear_cell([1.5, 0.5]), xs[:40], method="cyclic-reduction",
                          rtol=1e-6)
    assert abs(wild.info["lyapunov"] - np.log(1.5)) < 0.02


def test_a_run_that_does_not_converge_returns_its_best_iterate():
    torch.manual_seed(3)
    net = pp.from_torch(torch.nn.LSTM(2, 3).double())
    xs = np.random.default_rng(4).standard_normal((TAU, 2))
    f = pp.forward(net, xs, method="substitution", linearization="quasi", maxiter=2,
                   check=False)
    info = f.info
    assert not info["converged"] and info["iterations"] == 2
    best = int(np.argmin(info["residuals"]))
    assert info["best_iteration"] == best
    assert net.nonlinear_residual(f) == pytest.approx(info["residuals"][best], rel=1e-12)
    assert "returned the best iterate (iteration" in info["message"]
    with pytest.raises(pp.ConvergenceError, match="returned the best iterate"):
        pp.forward(net, xs, linearization="quasi", maxiter=2)



def test_an_iterative_linear_solver_that_stalls_newton_is_asked_for_more():
    """Inexact Newton's forcing term: Jacobi stops each solve at ``linear_rtol``.

    That error was this float32 network's nonlinear residual floor, 1.6x ``rtol``,
    however many iterations were allowed; a tenth of it takes the next iterate to the
    sequential pass. A direct method's solves are exact and keep their tolerance.
    """
    net = pp.FNN.random([4, 5, 1, 1, 5, 3, 3], activation="leaky_relu", seed=29, bias=0.1,
                        dtype="float32", density=0.5)
    x = np.array([2.1363726, -0.90047508, -0.39054534, 1.6273003], dtype=np.float32)
    exact = net.forward(x)
    trace = pp.forward(net, x, method="jacobi")
    rtol = trace.info["linear_rtol"] * 10
    assert trace.info["converged"] and trace.info["residuals"][2] > rtol
    for ours, theirs in zip(trace.z, exact.z):
        assert relative_error(ours, theirs) < 1e-5
    direct = pp.forward(net, x, method="substitution")
    assert direct.info["converged"] and direct.info["linear_rtol"] == rtol


def test_an_iterative_linear_solver_gets_steps_past_the_chain_of_dependencies():
    """The default ``maxiter`` counts the layers; BiCGStab's solves need a step more.

    After as many secant steps as layers the iterate is exact up to the linear solves'
    error: 1.04e-8 here (``linear_rtol=1e-8``), above ``rtol``, so the default call
    raised. With :data:`INEXACT_STEPS` more it reaches the sequential pass; a direct
    method still stops at the layers' count.
    """
    net = pp.FNN.random([4, 6, 3, 5], activation="sigmoid", seed=0, bias=0.1)
    x = np.random.default_rng(3).standard_normal((4, 3))
    exact = net.forward(x)
    trace = pp.forward(net, x, method="bicgstab", linearization="secant", linear_rtol=1e-8)
    assert trace.info["converged"] and trace.info["iterations"] > net.depth
    assert trace.info["residuals"][net.depth] > 1e-10 >= trace.info["residuals"][-1]
    assert relative_error(trace.output, exact.output) < 1e-9
    with pytest.raises(pp.ConvergenceError, match=f"after {net.depth} iterations"):
        pp.forward(net, x, method="bicgstab", linearization="secant", linear_rtol=1e-8,
                   maxiter=net.depth)
    direct = pp.forward(net, x, method="cyclic-reduction", linearization="secant")
    assert direct.info["iterations"] == net.depth

def test_tolerances_follow_the_dtype_and_options_are_checked():
    net = pp.GRU(2, 3)
    xs = np.random.default_rng(5).standard_normal((6, 2))
    f = pp.forward(net, xs, method="cyclic-reduction", linearization="damped", damping=100.0)
    assert f.info["converged"] and f.info["residuals"][-1] <= 1e-10
    assert f.info["damping"][0][0] == pytest.approx(10.0)  # 100 / 10 after an accepted step
    with pytest.raises(ValueError, match="damping is an option of linearization='damped'"):
        pp.forward(net, xs, damping=1.0)
    with pytest.raises(ValueError, match="damping must be >= 0"):
        pp.forward(net, xs, linearization="damped", damping=-1.0)
    fnn = pp.FNN.random([2, 2], seed=0)
    with pytest.raises(ValueError, match="takes a recurrence"):
        pp.forward(fnn, np.ones(2), linearization="damped")


def test_float32_cells_stay_float32_with_tolerances_to_match():
    """DEER's setting in miniature: a float32 GRU, tolerances by dtype."""
    torch.manual_seed(6)
    module = torch.nn.GRU(2, 2)  # float32, as PyTorch makes it
    net = pp.GRU.from_torch(module, dtype="float32")
    xs = np.random.default_rng(7).standard_normal((200, 2, 16)).astype(np.float32)
    with torch.no_grad():
        expected = module(torch.tensor(xs.transpose(0, 2, 1).copy()))[0].numpy()
    for linearization in ("newton", "damped"):
        f = pp.forward(net, xs, method="cyclic-reduction", linearization=linearization)
        assert f.z[1].dtype == np.float32 and f.info["converged"]
        assert f.info["residuals"][-1] <= pp.solvers.convergence.default_rtol(np.float32)
        assert np.abs(f.z[1].transpose(0, 2, 1) - expected).max() < 1e-5, linearization
    g = pp.backprop(net, xs, np.zeros((200, 2, 16), np.float32), method="cyclic-reduction")
    assert g.parameters["weight_hh_l0"].dtype == np.float32
    exact = pp.backprop(pp.GRU.from_torch(module), xs.astype(np.float64),
                        np.zeros((200, 2, 16)), method="substitution")
    for name, value in exact.parameters.items():
        assert relative_error(g.parameters[name], value) < 1e-4, name


def test_the_lyapunov_estimate_reuses_the_last_newton_jacobians_faithfully():
    torch.manual_seed(8)
    net = pp.from_torch(torch.nn.GRU(2, 3, num_layers=2).double())
    xs = np.random.default_rng(9).standard_normal((30, 2, 2))
    f = pp.forward(net, xs, method="cyclic-reduction")
    recomputed = net.lyapunov(f)  # at the final trajectory itself
    # the last step linearised at the iterate before: an estimate's worth apart, no more
    assert f.info["lyapunov"] == pytest.approx(recomputed, abs=1e-6)


def test_the_newton_benchmark_runs_end_to_end_and_says_what_it_lacks(tmp_path, monkeypatch):
    """``python -m benchmarks.newton --quick``: DEER's code not given, named in the table."""
    import json
    import sys

    pytest.importorskip("torch")
    from benchmarks import newton

    monkeypatch.setenv("PROPOP_RESULTS", str(tmp_path))
    monkeypatch.delenv("PROPOP_DEER", raising=False)
    monkeypatch.setattr(sys, "argv", ["newton", "--quick"])
    newton.main()
    rows = json.loads((tmp_path / "newton_quick.json").read_text())["rows"]
    assert {row["kind"] for row in rows} == {"elman", "gru"}
    assert {row["case"].split()[-1] for row in rows if row["kind"] == "gru"} == {"float64",
                                                                                "float32"}
    for row in rows:
        assert "propop newton + CR" in row["seconds"]
        single = row["case"].endswith("float32")  # against the float64 pass: its rounding
        assert max(row["deviation"].values()) < (1e-5 if single else 1e-8)
        if single:  # the sequential pass's own rounding, and propop's Newton at rounding
            # level (10 eps: where its loop stops; 2x the pass's own is judged at DEER's size)
            assert 0 < row["deviation"]["torch.nn.GRU"] < 1e-6
            assert row["deviation"]["propop newton + CR"] <= 10 * np.finfo(np.float32).eps
    text = (tmp_path / "newton_quick.md").read_text()
    assert "DEER's code not given (--deer PATH or $PROPOP_DEER)" in text


def test_the_rows_of_one_trajectory_are_made_once_within_the_loop():
    """Inside ``reusing_steps`` the inputs' rows are made once, each trajectory's once."""
    net = pp.GRU(3, 2, seed=0)
    rng = np.random.default_rng(8)
    xs, h, other = (rng.standard_normal(shape) for shape in ((6, 3, 4), (6, 2, 4), (6, 2, 4)))
    expected_previous = np.concatenate([np.zeros((1, 4, 2)), h[:-1].transpose(0, 2, 1)])
    with net.reusing_steps():
        previous, X, r = net._rows(xs, h)
        again, X_again, _ = net._rows(xs, h)
        moved, X_moved, _ = net._rows(xs, other)
    assert r == 4 and again is previous and X_again is X and X_moved is X
    assert moved is not previous
    np.testing.assert_array_equal(previous, expected_previous.reshape(24, 2))
    np.testing.assert_array_equal(X, xs.transpose(0, 2, 1).reshape(24, 3))
    assert net._rows(xs, h)[0] is not previous and getattr(net, "_kept", None) is None


def test_the_step_is_evaluated_once_per_iterate_and_nothing_is_kept():
    """The residual's F serves the next linearisation; after the call no value is held."""
    calls = []

    def step(p, h, x):
        calls.append(1)
        return torch.tanh(p["w"] * h + x)

    def slope(p, h, x):
        return p["w"] * (1 - torch.tanh(p["w"] * h + x) ** 2)

    net = pp.Recurrence(step, {"w": np.array([0.5, -0.3])}, state_size=2, input_size=2,
                        batched=True, jacobian_diagonal=slope,  # the step is called for F only
                        jacobian=lambda p, h, x: torch.diag(slope(p, h, x)))
    xs = np.random.default_rng(7).standard_normal((30, 2, 3))
    f = pp.forward(net, xs, method="cyclic-reduction", linearization="quasi")
    assert f.info["converged"]
    iterations = f.info["iterations"]
    # one F per iterate (the start and each solve's), none again to linearise
    assert len(calls) == iterations + 1
    assert getattr(net, "_kept", None) is None
    np.testing.assert_allclose(f.z[1], net.forward(xs).z[1], rtol=1e-9, atol=1e-10)
    calls.clear()
    damped = pp.forward(net, xs, method="cyclic-reduction", linearization="quasi-damped")
    steps = damped.info["iterations"]
    # a damped step: its candidate's F and the new iterate's, the iterate's own kept
    assert damped.info["converged"] and len(calls) == 2 * steps + 1


@pytest.mark.parametrize("kind", ["GRU", "LSTM", "ElmanRNN"])
def test_a_built_in_cells_jacobians_from_its_steps_memo_are_bit_for_bit_its_own(kind):
    """The gate values the step kept give the Jacobians and diagonals it would compute."""
    from propop.networks.gated import ElmanRNN

    cls = ElmanRNN if kind == "ElmanRNN" else getattr(pp, kind)
    net = cls(3, 4, num_layers=2, seed=0)
    rng = np.random.default_rng(9)
    H, X = rng.standard_normal((7, net.state_size)), rng.standard_normal((7, 3))
    memo = []
    F = net.cell(H, X, memo)
    assert len(memo) == 2  # one entry a layer
    np.testing.assert_array_equal(F, net.cell(H, X))
    J = net.cell.jacobians(H, X)
    np.testing.assert_array_equal(net.cell.jacobians(H, X, memo), J)
    np.testing.assert_array_equal(net.cell.jacobian_diagonals(H, X, memo),
                                  net.cell.jacobian_diagonals(H, X))
    np.testing.assert_allclose(net.cell.jacobian_diagonals(H, X),  # another sum's order
                               np.diagonal(J, axis1=1, axis2=2), rtol=1e-12, atol=1e-15)
    # against PyTorch's own differentiation of the step, row by row
    step = net.cell.step
    for i in (0, 6):
        def row(h, i=i):
            return step(net.cell.parameters, h[None], torch.tensor(X[i:i + 1]))[0]

        auto = torch.autograd.functional.jacobian(row, torch.tensor(H[i]))
        np.testing.assert_allclose(J[i], auto.numpy(), rtol=1e-12, atol=1e-14)


def test_the_newton_loop_computes_each_iterates_gates_once(monkeypatch):
    """The residual's step keeps its gates' values; the next linearisation reads them.

    The first layer's input gates depend on the inputs alone: made once for the loop.
    """
    from propop.networks import gated

    calls = []
    products = gated.gates
    monkeypatch.setattr(gated, "gates", lambda *a: calls.append(1) or products(*a))
    net = pp.GRU(3, 4, num_layers=2, seed=0)
    xs = np.random.default_rng(10).standard_normal((40, 3, 5))
    f = pp.forward(net, xs, method="cyclic-reduction", linearization="newton")
    iterates = len(f.info["residuals"])  # the start and each solve's
    # the first layer's hidden gates and both of the second's each iterate, its input
    # gates once
    assert f.info["converged"] and len(calls) == 1 + 3 * iterates
    np.testing.assert_allclose(f.z[1], net.forward(xs).z[1], rtol=1e-12, atol=1e-14)
    assert getattr(net, "_kept", None) is None


@pytest.mark.parametrize("cell", [pp.GRU, pp.LSTM])
def test_the_input_gates_kept_for_a_loop_do_not_outlive_it(cell):
    """Another input, or weights changed in place between calls, give that call's pass."""
    import torch

    net = cell(3, 4, num_layers=2, seed=0)
    rng = np.random.default_rng(12)
    first, second = (rng.standard_normal((30, 3, 4)) for _ in range(2))
    for xs in (first, second, second):
        f = pp.forward(net, xs, method="cyclic-reduction", linearization="newton")
        np.testing.assert_allclose(f.z[1], net.forward(xs).z[1], rtol=1e-12, atol=1e-14)
        with torch.no_grad():  # the input weights changed where the cell keeps them
            net.cell.parameters["weight_ih_l0"].mul_(1.5)
    assert getattr(net, "_kept", None) is None


def test_the_lyapunov_product_tree_is_the_product_and_does_not_overflow():
    from propop.networks.recurrence import _normalised_product

    rng = np.random.default_rng(8)
    J = rng.standard_normal((7, 3, 4, 4))  # an odd number of steps: one goes up unpaired
    P, logs = _normalised_product(np, J)
    direct = J[0]
    for step in J[1:]:
        direct = step @ direct  # J_7 ... J_1, applied first to last
    scale = np.linalg.norm(direct, axis=(1, 2))
    np.testing.assert_allclose(P, direct / scale[:, None, None], rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(logs, np.log(scale), rtol=1e-12)
    big = np.broadcast_to(10.0 * np.eye(2), (2000, 1, 2, 2))  # 10^2000: no float holds it
    P, logs = _normalised_product(np, big)
    np.testing.assert_allclose(P[0], np.eye(2) / np.sqrt(2), rtol=1e-12)
    np.testing.assert_allclose(logs, 2000 * np.log(10.0) + 0.5 * np.log(2.0), rtol=1e-12)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("method", ["cyclic-reduction", "substitution"])
def test_newton_polishes_to_the_sequential_passs_own_error(dtype, method):
    """Newton's states are within 2x the sequential pass's own error from float64's.

    One step past the residual test takes the states' error to rounding (it was 800x
    the sequential pass's in float32, an Elman RNN of 10000 steps).
    """
    exact = pp.RNN.random([8, 8], activation="tanh", seed=0)
    xs = np.random.default_rng(1).standard_normal((2000, 8, 4))
    states = exact.forward(xs).output  # float64, the reference
    rnn = pp.RNN(*([a.astype(dtype) for a in arrays] for arrays in (exact.W, exact.U,
                                                                   exact.b)))
    x = xs.astype(dtype)
    own = relative_error(rnn.forward(x).output, states)  # the sequential pass's rounding
    floor = 4 * np.finfo(dtype).eps
    f = pp.forward(rnn, x, method=method)
    assert f.info["converged"] and f.info["polished"]
    assert relative_error(f.output, states) <= 2 * own + floor
    loose = pp.forward(rnn, x, method=method, polish=False)
    assert "polished" not in loose.info
    assert loose.info["iterations"] == f.info["iterations"] - 1
    assert relative_error(loose.output, states) > relative_error(f.output, states)
    capped = pp.forward(rnn, x, method=method, maxiter=loose.info["iterations"])
    assert capped.info["converged"] and capped.info["polished"] is False  # no step left
    np.testing.assert_array_equal(capped.output, loose.output)


def test_a_first_passing_residual_above_rounding_is_polished():
    """A float32 Elman RNN whose first passing residual is 2-10 eps: polished, to 2x own.

    Left there (the polish rule stopped at 10 eps), its states were 38x the sequential
    pass's own error from float64's; one more step takes them to about 1x.
    """
    exact = pp.RNN.random([8, 8], activation="tanh", seed=1)
    xs = np.random.default_rng(1).standard_normal((2000, 8, 4))
    states = exact.forward(xs).output
    rnn = pp.RNN(*([a.astype("float32") for a in arrays] for arrays in (exact.W, exact.U,
                                                                        exact.b)))
    x = xs.astype("float32")
    own = np.abs(rnn.forward(x).output - states).max()
    loose = pp.forward(rnn, x, method="cyclic-reduction", polish=False)
    eps = np.finfo(np.float32).eps
    assert 2 * eps < loose.info["residuals"][-1] <= 10 * eps  # the case the rule is about
    f = pp.forward(rnn, x, method="cyclic-reduction")
    assert f.info["converged"] and f.info["polished"]
    assert f.info["iterations"] == loose.info["iterations"] + 1
    assert np.abs(f.output - states).max() <= 2 * own
    assert np.abs(loose.output - states).max() > 10 * own


def test_the_jacobians_memory_guard_counts_the_steps_memos():
    """A budget over the Jacobians alone but under them and the memos kept raises first."""
    net = pp.GRU(3, 4, seed=0)
    tau, r = 2000, 4
    xs = np.random.default_rng(11).standard_normal((tau, 3, r))
    # entries a row: two trajectories' gate products, and the input gates kept once
    jacobians, memos = 2 * net.state_size ** 2, 2 * 2 * 3 * 4 + 3 * 4
    assert net.memo_entries == memos and pp.Recurrence.memo_entries == 0
    with pp.memory.limit((jacobians + memos // 2) * tau * r * 8):
        with pytest.raises(pp.memory.MemoryBudgetError, match="the Jacobians of 2000 steps"):
            pp.forward(net, xs, method="cyclic-reduction", linearization="newton")
    with pp.memory.limit((jacobians + memos + 1) * tau * r * 8):
        assert pp.forward(net, xs, method="cyclic-reduction").info["converged"]


def test_secant_steps_of_a_sigmoid_in_float32_by_pcr_are_refused_not_returned():
    """The paper's secant through the origin, ``a = f(y) / y``, is 267 at ``y = 0.0019``.

    A sigmoid's ``f(0) = 1/2``: PCR's products of such rows leave the exact-by-depth
    iterate at 3.1e-5 against float32's ``rtol`` 1.2e-5 (substitution 4e-8), however
    many steps. That is a ConvergenceError naming the last solve's amplified rounding
    and the alternatives, never a converged trace; Newton's tangents converge.
    """
    net = pp.FNN.random([4, 6, 3, 5], activation="sigmoid", seed=0, dtype="float32")
    x = np.array([-0.70373523, -1.2654215, -0.62327445, 0.04132598], dtype=np.float32)
    exact = net.forward(x)
    assert np.abs(np.asarray(exact.y[1])).min() < 2e-3
    with pytest.raises(pp.ConvergenceError, match=r"(?s)rounding was amplified beyond rtol "
                       r"\(float32\).*linearization='newton'|linearization='newton'.*"
                       r"rounding was amplified"):
        pp.forward(net, x, method="parallel-cyclic-reduction", linearization="secant")
    tangent = pp.forward(net, x, method="parallel-cyclic-reduction")
    assert tangent.info["converged"]
    assert relative_error(tangent.output, exact.output) < 1e-5
