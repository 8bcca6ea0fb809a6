"""Identity couplings: a diagonal linear recurrence stored as its scalings (quasi-Newton's).

``TriangularSystem(..., coupling_stack="identity", scale_stack=D)`` is the chain
``x_k = c_k + d_k * x_{k-1}``. Every method is held to a plain Python loop over the
recurrence, the operator to the explicit matrix of the same system with its identities
stored densely, and the storage to its promise: no ``(nb, n, n)`` array anywhere.
"""

import tracemalloc

import numpy as np
import pytest
import torch

import propop as pp
from propop import backend

NATIVE = [s.name for s in pp.solvers.available() if s.native and s.available]
EXACT = {s.name for s in pp.solvers.available() if s.exact}


def recurrence(c, d, lower):
    """``x_k = c_k + s_k * x_{k-1}`` (lower) or ``x_k = c_k + s_k * x_{k+1}`` (upper), looped.

    Row ``k``'s scaling ``s_k`` is ``d[k - 1]``; row 0 is unscaled (a stacked chain's
    convention: the input block), so an upper chain's row 0 reads ``x_1`` as it is.
    """
    x = np.empty_like(c)
    steps = range(len(c)) if lower else range(len(c) - 1, -1, -1)
    previous = None
    for k in steps:
        s = 1.0 if k == 0 else d[k - 1]
        x[k] = c[k] if previous is None else c[k] + s * previous
        previous = x[k]
    return x


def chain(tau, n, columns, lower, seed=0):
    """A diagonal chain of ``tau`` blocks: ``columns`` None (a vector), or per-sample scalings."""
    rng = np.random.default_rng(seed)
    batch = () if columns is None else (columns,)
    d = rng.uniform(-1.2, 1.2, (tau - 1, n) + batch)
    c = rng.standard_normal((tau, n) + batch)
    system = pp.TriangularSystem(None, None, c.reshape((tau * n,) + batch), lower=lower,
                                 sizes=[n] * tau, coupling_stack="identity", scale_stack=d)
    return system, d, recurrence(c, d, lower)


CASES = [(40, 3, 4, True), (40, 3, 4, False), (17, 2, None, True), (17, 2, None, False),
         (2, 3, 2, True), (1, 3, 2, False)]


@pytest.mark.parametrize(("tau", "n", "columns", "lower"), CASES)
@pytest.mark.parametrize("method", NATIVE)
def test_every_native_method_solves_the_recurrence_as_a_loop_does(tau, n, columns, lower,
                                                                   method):
    system, _, expected = chain(tau, n, columns, lower)
    if not pp.solvers.info(method).applies_to(system):
        pytest.skip(f"{method} does not apply")
    solution = pp.solve(system, method, check=True)
    x = solution.x.reshape(expected.shape)
    bound = 1e-12 if method in EXACT else 1e-8
    for k in range(tau):
        scale = max(np.abs(expected[k]).max(), 1.0)
        assert np.abs(x[k] - expected[k]).max() <= bound * scale, (method, k)


@pytest.mark.parametrize(("tau", "n", "columns", "lower"), CASES[:2])
def test_the_operator_is_the_matrix_with_its_identities_stored(tau, n, columns, lower):
    system, d, _ = chain(tau, n, columns, lower)
    dense = pp.TriangularSystem(None, None, system.rhs, lower=lower, sizes=[n] * tau,
                                coupling_stack=np.broadcast_to(np.eye(n), (tau - 1, n, n)).copy(),
                                scale_stack=d)
    assert system.couplings.identity and not dense.couplings.identity
    for i in range(columns):
        np.testing.assert_array_equal(system.sample(i).matrix.toarray(),
                                      dense.sample(i).matrix.toarray())
    x = np.random.default_rng(1).standard_normal(system.rhs.shape)
    for transpose in (False, True):
        np.testing.assert_allclose(system.apply(x, transpose=transpose),
                                   dense.apply(x, transpose=transpose), rtol=1e-15, atol=1e-15)
        ours = system.apply(x, transpose=transpose)
        for i in range(columns):  # the explicit matrix is a sample's
            A = system.sample(i).matrix
            np.testing.assert_allclose(ours[:, i], (A.T if transpose else A) @ x[:, i],
                                       rtol=1e-14, atol=1e-14)


def test_no_square_block_is_stored_or_allocated():
    tau, n, r = 4000, 64, 4
    system, _, expected = chain(tau, n, r, True)
    assert system.coupling_stack.strides[0] == 0  # the identity broadcast: a view
    data = tau * n * r * 8  # one array of the chain's size: 8 MB
    square = (tau - 1) * n * n * 8  # what dense couplings would hold: 16 times that
    for method in ("substitution", "cyclic-reduction", "jacobi"):  # per-sample reduced ones
        tracemalloc.start()
        solution = pp.solve(system, method, **({"maxiter": 3} if method == "jacobi" else {}))
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert peak < 8 * data < square, (method, peak)
        if method != "jacobi":
            np.testing.assert_allclose(solution.x.reshape(expected.shape), expected,
                                       rtol=1e-11, atol=1e-11)
    reduced = pp.solve(system, "cyclic-reduction")
    assert reduced.info["peak_bytes"] < 8 * data and reduced.levels == int(np.ceil(np.log2(tau)))


@pytest.mark.parametrize("kind", ["torch", "array_api_strict"])
def test_identity_couplings_move_as_one_identity(kind):
    system, _, expected = chain(30, 3, 2, True)
    moved = system.to(kind)
    assert moved.couplings.identity and backend.of(moved.rhs).name == kind
    assert tuple(moved.couplings.eye.shape) == (3, 3)
    for method in ("substitution", "cyclic-reduction", "batched-gmres"):
        x = backend.to_host(pp.solve(moved, method, check=True).x)
        np.testing.assert_allclose(x.reshape(expected.shape), expected, rtol=1e-9, atol=1e-10)


def test_identity_couplings_are_named_and_need_their_diagonals():
    c = np.zeros(6)
    with pytest.raises(ValueError, match="the one name it takes is 'identity'"):
        pp.TriangularSystem(None, None, c, lower=True, sizes=[2] * 3, coupling_stack="eye",
                            scale_stack=np.ones((2, 2)))
    with pytest.raises(ValueError, match="with the diagonals as scale_stack"):
        pp.TriangularSystem(None, None, c, lower=True, sizes=[2] * 3, coupling_stack="identity")
    with pytest.raises(ValueError, match="scale_stack must be"):
        pp.TriangularSystem(None, None, c, lower=True, sizes=[2] * 3, coupling_stack="identity",
                            scale_stack=np.ones((3, 2)))
    with pytest.raises(ValueError, match="row scaling contains NaN"):
        pp.TriangularSystem(None, None, c, lower=True, sizes=[2] * 3, coupling_stack="identity",
                            scale_stack=np.array([[1.0, np.nan], [1.0, 1.0]]))


def test_an_overflowing_recurrence_is_named_by_every_exact_method():
    system, _, _ = chain(600, 2, 2, True)
    big = pp.TriangularSystem(None, None, system.rhs, lower=True, sizes=[2] * 600,
                              coupling_stack="identity",
                              scale_stack=np.full((599, 2, 2), 10.0))
    for method in ("substitution", "cyclic-reduction"):
        solution = pp.solve(big, method)
        assert solution.status is pp.Status.NONFINITE, method


def test_quasi_newton_system_holds_the_jacobians_diagonals():
    torch.manual_seed(0)
    net = pp.from_torch(torch.nn.GRU(2, 3, num_layers=2).double())
    xs = np.random.default_rng(2).standard_normal((12, 2, 3))
    around = net.forward(xs * 0.5)
    quasi = pp.forward_system(net, xs, around=around, linearization="quasi")
    newton = pp.forward_system(net, xs, around=around, linearization="newton")
    assert quasi.couplings.identity and not newton.couplings.identity
    J = newton.coupling_stack  # (tau - 1, r, n, n): the full Jacobians, by the cell
    d = np.diagonal(J, axis1=2, axis2=3)  # (tau - 1, r, n)
    np.testing.assert_allclose(quasi.scale_stack, np.moveaxis(d, 1, 2), rtol=1e-13, atol=1e-15)
    exact = net.forward(xs).z[1]
    f = pp.forward(net, xs, method="cyclic-reduction", linearization="quasi")
    assert f.info["converged"]
    np.testing.assert_allclose(f.z[1], exact, rtol=1e-9, atol=1e-10)


def _built_in(kind):
    from propop.networks.gated import ElmanRNN

    torch.manual_seed(1)
    if kind == "gru":
        return pp.from_torch(torch.nn.GRU(3, 4, num_layers=2).double())
    if kind == "lstm":
        return pp.from_torch(torch.nn.LSTM(3, 4, num_layers=2).double())
    return ElmanRNN(3, 4, num_layers=2, nonlinearity=kind.split("-")[1])


@pytest.mark.parametrize("kind", ["gru", "lstm", "rnn-tanh", "rnn-relu"])
def test_the_built_in_cells_diagonals_are_their_steps_jacobians(kind):
    """The closed-form diagonals against ``torch.func.jacrev`` of the step, sample by sample."""
    net = _built_in(kind)
    rng = np.random.default_rng(3)
    H, X = rng.standard_normal((9, net.state_size)), rng.standard_normal((9, 3))
    d = net.cell.jacobian_diagonals(H, X)
    step = torch.func.jacrev(lambda h, x: net.step(net.cell.parameters, h, x))
    J = torch.func.vmap(step)(torch.tensor(H), torch.tensor(X)).numpy()
    np.testing.assert_allclose(d, np.diagonal(J, axis1=1, axis2=2), rtol=1e-13, atol=1e-15)


def test_a_users_diagonal_is_used_and_checked():
    """``jacobian_diagonal=`` replaces the full Jacobians; a wrong shape is named."""
    calls = []

    def diagonal(p, h, x):
        calls.append(h.shape)
        return p["a"] * (1 - torch.tanh(p["a"] * h) ** 2)

    def step(p, h, x):
        return torch.tanh(p["a"] * h) + x

    a = np.array([0.5, -0.8])
    net = pp.Recurrence(step, {"a": a}, state_size=2, input_size=2, jacobian_diagonal=diagonal)
    xs = np.random.default_rng(4).standard_normal((50, 2, 3))
    f = pp.forward(net, xs, method="cyclic-reduction", linearization="quasi")
    assert f.info["converged"] and calls and calls[0] == (150, 2)
    np.testing.assert_allclose(f.z[1], net.forward(xs).z[1], rtol=1e-9, atol=1e-10)
    wrong = pp.Recurrence(step, {"a": a}, state_size=2, input_size=2,
                          jacobian_diagonal=lambda p, h, x: h[..., :1])
    with pytest.raises(ValueError, match="jacobian_diagonal"):
        pp.forward(wrong, xs, linearization="quasi")


def test_quasi_newton_runs_where_the_full_jacobians_would_not_fit():
    """Under a budget below the ``(tau, r, n, n)`` Jacobians, Newton is refused, quasi runs.

    The Jacobians' diagonals and the Lyapunov walk form a chunk of steps at a time.
    """
    net = pp.GRU(2, 24, seed=0)
    xs = np.random.default_rng(5).standard_normal((600, 2, 3))
    full = 600 * 3 * 24 * 24 * 8  # 8.3 MB of Jacobians
    with pp.memory.limit(full // 2):
        with pytest.raises(pp.memory.MemoryBudgetError, match="Jacobians"):
            pp.forward(net, xs, method="cyclic-reduction")
        runs = [pp.forward(net, xs, method="cyclic-reduction", linearization=name)
                for name in ("quasi", "quasi-damped")]  # quasi-ELK: r n scalar systems
    for f in runs:
        assert f.info["converged"] and f.info["lyapunov"] < 0
        np.testing.assert_allclose(f.z[1], net.forward(xs).z[1], rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("columns", [1, 4])  # one scaling column for every sample, or each its own
def test_shared_columns_and_float32_follow_the_dtype(dtype, columns):
    """``(nb - 1, n, 1)`` diagonals serve every sample; float32 meets float32's tolerance."""
    rng = np.random.default_rng(6)
    tau, n, r = 300, 3, 4
    d = rng.uniform(-0.95, 0.95, (tau - 1, n, columns))
    c = rng.standard_normal((tau, n, r))
    expected = recurrence(c, np.broadcast_to(d, (tau - 1, n, r)), True)
    system = pp.TriangularSystem(None, None, c.reshape(tau * n, r).astype(dtype), lower=True,
                                 sizes=[n] * tau, coupling_stack="identity",
                                 scale_stack=d.astype(dtype))
    assert system.dtype == np.dtype(dtype) and system.couplings.eye.dtype == np.dtype(dtype)
    for method in ("substitution", "cyclic-reduction", "parallel-cyclic-reduction", "jacobi"):
        exact = method in EXACT  # an iterative method is held to its rtol (by dtype)
        bound = (1e-12 if exact else 1e-8) if dtype == "float64" else (2e-5 if exact else 1e-4)
        solution = pp.solve(system, method, check=True)
        assert solution.x.dtype == np.dtype(dtype)
        error = np.abs(solution.x.reshape(tau, n, r) - expected).max()
        assert error <= bound * max(np.abs(expected).max(), 1.0), (method, error)
