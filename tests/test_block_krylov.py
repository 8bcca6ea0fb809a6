"""Block and batched Krylov methods, preconditioners, diagnostics and truncated solves (issue 5)."""

import math

import numpy as np
import pytest
import scipy.sparse.linalg as spla

import propop as pp
from cases import Case, relative_error

BATCHED = ["batched-gmres", "batched-bicgstab"]
BLOCK = ["block-gmres", "block-bicgstab"]


def system_of(r, density=1.0, dtype="float64", activation="tanh", sizes=(12,) * 7, seed=0):
    net, trace, eps, _ = Case(sizes, activation=activation, density=density, r=r, dtype=dtype,
                              seed=seed).problem()
    return pp.backward_system(net, trace, eps)


def one_matrix(r, density=1.0, dtype="float64", sizes=(12,) * 7):
    """A batch of one matrix exactly: one sample's pass repeated, a different error per column.

    The pass of one sample is repeated, not the input: BLAS need not give equal columns
    of a product whose input columns are equal (OpenBLAS's float32 kernels do not).
    """
    case = Case(sizes, density=density, r=r, dtype=dtype)
    net, (x, t) = case.net(), case.data()
    one = net.forward(x[:, :1])

    def repeated(a):
        return np.repeat(a, r, axis=1)

    trace = pp.Trace(repeated(one.x), tuple(map(repeated, one.y)), tuple(map(repeated, one.z)))
    return pp.backward_system(net, trace, pp.loss_gradient(trace.output, t)).shared()


def rtol_for(dtype):
    return 1e-10 if dtype == "float64" else 1e-5


@pytest.mark.parametrize("method", BATCHED + BLOCK)
@pytest.mark.parametrize("r", [1, 4, 33])
@pytest.mark.parametrize("density", [1.0, 0.3])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_converges_to_the_substitution_answer(method, r, density, dtype):
    system = (one_matrix if method in BLOCK else system_of)(r, density, dtype)
    if method in BLOCK:  # several right-hand sides of one matrix
        assert system.shares_matrix and system.approximates is None
    rtol = rtol_for(dtype)
    exact = pp.solve(system, "substitution").x
    if method == "block-bicgstab" and r > system.sizes[-1]:  # rank(rhs) <= width < r
        sol = pp.solve(system, method, rtol=rtol)
        assert sol.status is pp.Status.BREAKDOWN and "linearly dependent" in sol.message
        return
    sol = pp.solve(system, method, rtol=rtol, check=True)
    assert sol.x.shape == system.rhs.shape and sol.x.dtype == system.dtype
    assert relative_error(sol.x, exact) < 1e3 * rtol
    assert sol.residuals[-1] <= rtol * np.linalg.norm(system.rhs, axis=0).max() * (1 + 1e-6)
    if method.endswith("gmres") and dtype == "float64":
        assert sol.iterations <= pp.solvers.nilpotency_index(system)


def test_block_methods_refuse_per_sample_matrices_and_approximate_on_request():
    system = system_of(4)
    assert not system.shares_matrix
    with pytest.raises(ValueError, match="own matrix.*batched-gmres"):
        pp.solve(system, "block-gmres")
    sol = pp.solve(system, "block-gmres", shared_diagonal="mean")
    exact = pp.solve(system, "substitution").x
    assert sol.status is pp.Status.APPROXIMATE
    assert sol.info["approximation_error"] == pytest.approx(relative_error(sol.x, exact))
    linear = system_of(4, activation="identity")  # f' = 1: one matrix, stored per sample
    assert linear.shares_matrix and pp.solve(linear, "block-gmres").converged


class Counting(spla.LinearOperator):
    """A sample's operator that counts its products."""

    def __init__(self, system):
        super().__init__(system.dtype, system.shape)
        self.system, self.count = system, 0

    def _matvec(self, v):
        self.count += 1
        return self.system.apply(v.reshape(-1))


def test_block_methods_use_fewer_operator_applications_than_independent_solves():
    shared = system_of(16, activation="identity", sizes=(10,) * 9).shared()
    system = shared.with_rhs(np.random.default_rng(3).standard_normal(shared.rhs.shape))
    independent = 0
    for sample in system.samples():
        A = Counting(sample)
        x, info = spla.gmres(A, sample.rhs, rtol=1e-10, restart=50)
        assert info == 0
        independent += A.count
    for method in BLOCK:
        sol = pp.solve(system, method, rtol=1e-10, check=True)
        assert sol.info["operator_applications"] < independent / 4, (method, independent)
    batched = pp.solve(system, "batched-gmres", rtol=1e-10, check=True)
    assert batched.info["operator_applications"] < independent / 4


def test_deflation_drops_dependent_columns_and_block_bicgstab_breakdown_is_reported():
    system = system_of(3, activation="identity")
    rhs = system.rhs.copy()
    rhs[:, 2] = rhs[:, 0] + rhs[:, 1]  # a dependent right-hand side
    dependent = system.shared().with_rhs(rhs)
    sol = pp.solve(dependent, "block-gmres", check=True)
    assert max(sol.info["block_widths"]) == 2  # the third direction was deflated
    exact = pp.solve(dependent, "substitution").x
    assert relative_error(sol.x, exact) < 1e-10
    broken = pp.solve(dependent, "block-bicgstab")
    assert broken.status is pp.Status.BREAKDOWN and "linearly dependent (rank 2" in broken.message


def test_gmres_stagnation_is_reported():
    """GMRES(1) on x1 - 2 x0 = 1, x0 = 1: r0 is orthogonal to A r0, no progress ever."""
    system = pp.TriangularSystem([np.array([[2.0]])], [None, None], np.ones(2),
                                 lower=True, sizes=(1, 1))
    for method in ("batched-gmres", "block-gmres"):
        sol = pp.solve(system, method, restart=1)
        assert sol.status is pp.Status.BREAKDOWN and "stagnated" in sol.message
        assert "restart" in sol.message
    assert pp.solve(system, "batched-gmres", restart=2).converged


@pytest.mark.parametrize("method", ["batched-gmres", "batched-bicgstab"])
def test_the_paper_form_is_solved_as_the_scaled_one(method):
    """The paper's D^-1 / E^-1 scaling (section 3.2) is applied once, at the door.

    Every method sees the unit-diagonal form (make_system), so the paper's form
    takes the scaled one's iterations, and M="diagonal" has nothing left to do.
    """
    scaled = system_of(4, activation="sigmoid", sizes=(10,) * 9)  # f' in (0, 1/4]: uneven
    paper = scaled.paper()
    exact = pp.solve(scaled, "substitution").x
    reference = pp.solve(scaled, method, rtol=1e-10, check=True)
    for options in ({}, {"M": "diagonal"}):
        sol = pp.solve(paper, method, rtol=1e-10, check=True, **options)
        assert relative_error(sol.x, exact) < 1e-8
        assert sol.iterations == reference.iterations
    from propop.solvers.iterative.preconditioners import preconditioner

    assert preconditioner(scaled, "diagonal") is None  # a no-op


@pytest.mark.parametrize("group", [1, 2, 3, 8])
def test_block_jacobi_preconditioner_is_exact_within_groups(group):
    system = system_of(3)
    sol = pp.solve(system, "batched-gmres", M=("block-jacobi", {"group": group}), check=True)
    assert sol.iterations <= math.ceil(system.nblocks / group)
    assert relative_error(sol.x, pp.solve(system, "substitution").x) < 1e-10


def test_air_preconditioner_warns_about_its_set_up_and_works():
    system = system_of(2, sizes=(8,) * 5)
    with pytest.warns(UserWarning, match="AIR preconditioner took"):
        sol = pp.solve(system, "batched-gmres", M="air", check=True)
    assert relative_error(sol.x, pp.solve(system, "substitution").x) < 1e-8


def test_preconditioner_specs_are_checked():
    system = system_of(2)
    with pytest.raises(ValueError, match="unknown preconditioner 'ilu'"):
        pp.solve(system, "batched-gmres", M="ilu")
    with pytest.raises(ValueError, match="group must be an integer >= 1"):
        pp.solve(system, "bicgstab", M=("block-jacobi", {"group": 0}))
    calls = []
    pp.solve(system, "batched-gmres", M=lambda R: calls.append(1) or R)
    assert calls


def test_nilpotency_index_is_the_longest_chain_and_jacobi_is_exact_there():
    system = system_of(2, sizes=(5,) * 8)
    assert pp.solvers.nilpotency_index(system) == system.nblocks == 8
    sol = pp.solve(system, "jacobi", rtol=1e-14)
    assert sol.iterations == 8
    rnn = pp.RNN.random([3, 4, 4], seed=0)
    trace = rnn.forward(np.ones((6, 3)))
    B = pp.backward_system(rnn, trace, np.ones_like(trace.output))
    assert pp.solvers.nilpotency_index(B) == 6 + 2
    levels = pp.solve(B, "level-scheduled", check=True)
    assert levels.levels == 6 + 2 and sum(levels.info["level_sizes"]) == B.nblocks
    assert max(levels.info["level_sizes"]) == 3  # the blocks of a level run at once
    assert relative_error(levels.x, pp.solve(B, "substitution").x) < 1e-15


def scaled_net(gain, r=3, layers=10, width=10):
    """A linear network whose Jacobian products shrink (gain < 1) or grow (gain > 1)."""
    rng = np.random.default_rng(0)
    W = [gain * np.linalg.qr(rng.standard_normal((width, width)))[0] for _ in range(layers)]
    net = pp.FNN(W, activation="identity")
    x, t = rng.standard_normal((width, r)), rng.standard_normal((width, r))
    trace = net.forward(x)
    return net, trace, pp.loss_gradient(trace.output, t)


@pytest.mark.parametrize(("gain", "contractive"), [(0.5, True), (1.5, False)])
def test_jacobian_decay_and_explain(gain, contractive, capsys):
    net, trace, eps = scaled_net(gain)
    system = pp.backward_system(net, trace, eps)
    decay = pp.solvers.jacobian_decay(system)
    assert decay.rate == pytest.approx(gain, rel=1e-9)  # orthogonal W: exactly the gain
    assert (decay.sweeps_for(1e-3) is not None) == contractive
    text = pp.solvers.explain(system)
    assert text in capsys.readouterr().out
    assert "nilpotency index 11" in text
    assert ("vanishing" if contractive else "exploding") in text


@pytest.mark.parametrize("gain", [0.5, 1.5])
def test_truncated_gmres_is_never_worse_than_jacobi(gain):
    """The k-th Jacobi iterate lies in the k-th Krylov space, where GMRES minimises."""
    net, trace, eps = scaled_net(gain)
    system = pp.backward_system(net, trace, eps)
    exact = pp.solve(system, "substitution").x
    errors = {}
    for k in range(1, system.nblocks + 1):
        jacobi = pp.solve(system, "jacobi", maxiter=k)
        gmres = pp.solve(system, "batched-gmres", maxiter=k, restart=k)
        rounding = 1e-10 * np.linalg.norm(system.rhs, axis=0)
        assert (gmres.info["sample_residuals"]
                <= jacobi.info["sample_residuals"] * (1 + 1e-8) + rounding).all()
        errors[k] = relative_error(jacobi.x, exact)
    assert errors[system.nblocks] < 1e-12  # exact at the nilpotency index
    if gain < 1:
        assert errors[4] < 0.1  # contractive: a few sweeps already approximate well
    else:
        assert errors[4] > 0.5  # expanding: the truncated answer is poor
