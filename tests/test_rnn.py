"""RNNs against torch.nn.RNN: the reference, the two-level systems and every solver."""

import math

import numpy as np
import pytest

import propop as pp
from cases import relative_error
from reference import torch

METHODS = ["substitution", "scipy.spsolve_triangular", "jacobi", "bicgstab", "scipy.gmres",
           "pyamg.gmres", "hybrid", "cyclic-reduction"]
EXACT = [("substitution", {}), ("level-scheduled", {}), ("scipy.spsolve_triangular", {}),
         ("cyclic-reduction", {}),
         ("cyclic-reduction", {"within": "substitution"})]


def problem(layers=2, r=4, nonlinearity="tanh", tau=7, seed=0):
    rnn = pp.RNN.random([3] + [5] * layers, activation=nonlinearity, seed=seed)
    rng = np.random.default_rng(seed + 1)
    batch = () if r is None else (r,)
    xs = rng.standard_normal((tau, 3) + batch)
    targets = rng.standard_normal((tau, 5) + batch)
    return rnn, xs, targets


def torch_reference(rnn, xs, targets, nonlinearity):
    """Output and gradients of torch.nn.RNN (b_ih carries b, b_hh = 0) in float64."""
    layers = rnn.depth
    module = torch.nn.RNN(3, 5, num_layers=layers, nonlinearity=nonlinearity,
                          dtype=torch.float64)
    with torch.no_grad():
        for k in range(layers):
            getattr(module, f"weight_ih_l{k}").copy_(torch.tensor(rnn.W[k]))
            getattr(module, f"weight_hh_l{k}").copy_(torch.tensor(rnn.U[k]))
            getattr(module, f"bias_ih_l{k}").copy_(torch.tensor(rnn.b[k]))
            getattr(module, f"bias_hh_l{k}").zero_()
    as_batch = (lambda a: a) if xs.ndim == 3 else (lambda a: a[:, :, None])
    X = torch.tensor(as_batch(xs)).permute(0, 2, 1).clone().requires_grad_(True)
    out, _ = module(X)
    T = torch.tensor(as_batch(targets)).permute(0, 2, 1)
    (0.5 * ((out - T) ** 2).sum()).backward()
    grads = {name: [getattr(module, f"{name}_l{k}").grad.numpy() for k in range(layers)]
             for name in ("weight_ih", "weight_hh", "bias_ih")}
    dx = X.grad.permute(0, 2, 1).numpy()
    return out.detach().permute(0, 2, 1).numpy(), grads, dx if xs.ndim == 3 else dx[:, :, 0]


@pytest.mark.parametrize("nonlinearity", ["tanh", "relu"])
@pytest.mark.parametrize("layers", [1, 2, 3])
@pytest.mark.parametrize("r", [None, 1, 4])
def test_reference_matches_torch(nonlinearity, layers, r):
    rnn, xs, targets = problem(layers, r, nonlinearity)
    out, grads, dx = torch_reference(rnn, xs, targets, nonlinearity)
    trace = rnn.forward(xs)
    g = rnn.gradients(trace, rnn.backward(trace, rnn.loss_gradient(trace, targets)))
    assert relative_error(trace.output if r else trace.output[:, :, None],
                          out if r else out) < 1e-13
    for k in range(layers):
        assert relative_error(g.W[k], grads["weight_ih"][k]) < 1e-12
        assert relative_error(g.U[k], grads["weight_hh"][k]) < 1e-12
        assert relative_error(g.b[k], grads["bias_ih"][k]) < 1e-12
    assert relative_error(g.x, dx) < 1e-12


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize(("layers", "r", "nonlinearity"), [(1, 4, "tanh"), (3, 1, "relu"),
                                                          (2, None, "tanh")])
def test_backprop_through_every_method_matches_torch(method, layers, r, nonlinearity):
    rnn, xs, targets = problem(layers, r, nonlinearity)
    _, grads, dx = torch_reference(rnn, xs, targets, nonlinearity)
    g = pp.backprop(rnn, xs, targets, method=method)
    assert isinstance(g, pp.RNNGradients) and g.solution.converged
    for k in range(layers):
        assert relative_error(g.W[k], grads["weight_ih"][k]) < 1e-9
        assert relative_error(g.U[k], grads["weight_hh"][k]) < 1e-9
    assert relative_error(g.x, dx) < 1e-9


def test_two_level_structure_operator_and_iterations():
    rnn, xs, targets = problem(layers=2, r=3, tau=6)
    trace = rnn.forward(xs)
    B = pp.backward_system(rnn, trace, rnn.loss_gradient(trace, targets))
    assert B.nblocks == 6 * 3 and B.sizes == (3, 5, 5) * 6 and not B.blocks.is_chain
    assert len(B.blocks.edges) == 6 * 2 + 5 * 2  # W within steps, U across steps
    u = np.random.default_rng(2).standard_normal(B.shape[0])
    np.testing.assert_allclose(B.operator @ u, B.matrix @ u, rtol=1e-13, atol=1e-14)
    sol = pp.solve(B, "jacobi", rtol=1e-14)
    assert sol.iterations == (6 - 1) + 2 + 1  # the longest chain: tau - 1 + l + 1 blocks
    assert sol.residuals[-2] > 1e-6 * sol.residuals[0]  # and not one sweep earlier
    for name, system in [("parallel-cyclic-reduction", B), ("cyclic-reduction", B.unstructured())]:
        with pytest.raises(ValueError, match="not block bi-diagonal"):
            pp.solve(system, name)


@pytest.mark.parametrize(("method", "options"), EXACT)
@pytest.mark.parametrize("nonlinearity", ["tanh", "relu"])
@pytest.mark.parametrize("layers", [1, 2, 3])
@pytest.mark.parametrize("r", [1, 4])
def test_exact_methods_match_torch_to_rounding(method, options, nonlinearity, layers, r):
    rnn, xs, targets = problem(layers, r, nonlinearity, tau=9)
    _, grads, dx = torch_reference(rnn, xs, targets, nonlinearity)
    g = pp.backprop(rnn, xs, targets, method=method, **options)
    assert g.solution.converged
    for k in range(layers):
        assert relative_error(g.W[k], grads["weight_ih"][k]) < 1e-12
        assert relative_error(g.U[k], grads["weight_hh"][k]) < 1e-12
        assert relative_error(g.b[k], grads["bias_ih"][k]) < 1e-12
    assert relative_error(g.x, dx) < 1e-12


@pytest.mark.parametrize("layers", [1, 2, 3, 4, 7])
@pytest.mark.parametrize("tau", [1, 2, 5, 16, 17])
@pytest.mark.parametrize("lower", [True, False])
def test_two_level_cyclic_reduction_levels_follow_the_formula(layers, tau, lower):
    rnn, xs, targets = problem(layers, 2, tau=tau)
    trace = rnn.forward(xs)
    system = (pp.forward_system(rnn, xs, around=trace) if lower else
              pp.backward_system(rnn, trace, rnn.loss_gradient(trace, targets)))
    reference = pp.solve(system, "substitution").x
    # the input layer is not reduced: a forward system's is solved first for all steps at
    # once and folded into the first hidden layer (one product), a backward system's after
    first = 1 if lower else 0
    for within, inner in [("cyclic-reduction", math.ceil(math.log2(layers)) + first),
                          ("substitution", layers - 1 + first)]:
        sol = pp.solve(system, "cyclic-reduction", within=within)
        outer = math.ceil(math.log2(tau)) if tau > 1 else 0
        assert sol.info["levels"] == {"layers": inner, "time": outer}
        assert sol.levels == inner + outer
        assert relative_error(sol.x, reference) < 1e-13


def test_two_level_cyclic_reduction_reports_overflow_and_bad_options():
    rnn, xs, targets = problem(layers=2, r=2, tau=64)
    rnn = pp.RNN([w * 1e3 for w in rnn.W], [u * 1e3 for u in rnn.U], rnn.b,
                 activation="identity")
    trace = rnn.forward(xs)
    system = pp.backward_system(rnn, trace, rnn.loss_gradient(trace, targets))
    sol = pp.solve(system, "cyclic-reduction")
    assert sol.status is pp.Status.NONFINITE and "step" in sol.message
    with pytest.raises(ValueError, match="option within='jacobi' must be one of"):
        pp.solve(system, "cyclic-reduction", within="jacobi")
    with pytest.raises(ValueError, match="shared_diagonal is not supported on RNN"):
        pp.solve(system, "cyclic-reduction", shared_diagonal="mean")


@pytest.mark.parametrize("linearization", ["newton", "secant"])
def test_forward_system_and_newton_forward(linearization):
    rnn, xs, _ = problem(layers=2, r=2, tau=5)
    trace = rnn.forward(xs)
    F = pp.forward_system(rnn, xs, around=trace, linearization=linearization)
    z = rnn.unstack(F, pp.solve(F).x)
    for a, b in zip(z, trace.z):
        assert relative_error(a, b) < 1e-13
    tr = pp.forward(rnn, xs, method="jacobi", linearization=linearization)
    assert tr.info["converged"] and tr.info["iterations"] <= 5 + 2 - 1
    assert relative_error(tr.output, trace.output) < 1e-10


def test_bad_rnn_input_is_named():
    rnn, xs, _ = problem()
    with pytest.raises(ValueError, match=r"xs has shape \(7, 4, 4\), expected \(tau, 3\)"):
        rnn.forward(np.ones((7, 4, 4)))
    with pytest.raises(ValueError, match=r"layer 0: U\[0\] has shape \(4, 4\), expected "
                                         r"\(5, 5\)"):
        pp.RNN([np.ones((5, 3))], [np.ones((4, 4))])
    with pytest.raises(ValueError, match=r"layer 1: W\[1\] has shape \(5, 4\), expected "
                                         r"\(5, 5\)"):
        pp.RNN([np.ones((5, 3)), np.ones((5, 4))], [np.eye(5), np.eye(5)])
    with pytest.raises(ValueError, match="got 1 input weights W but 2 recurrent"):
        pp.RNN([np.ones((5, 3))], [np.eye(5), np.eye(5)])
    with pytest.raises(ValueError, match="xs contains NaN"):
        rnn.forward(np.full((2, 3), np.nan))
    trace = rnn.forward(xs)
    with pytest.raises(ValueError, match=r"eps has shape \(7, 5\), expected \(7, 5, 4\)"):
        pp.backward_system(rnn, trace, np.ones((7, 5)))


class CountingMatrix(np.ndarray):
    """A dense matrix that counts its products (``M @ x``), transposes included."""

    products = [0]

    def __matmul__(self, other):
        CountingMatrix.products[0] += 1
        return np.asarray(self) @ other

    @property
    def T(self):
        return np.asarray(self).T.view(CountingMatrix)


@pytest.mark.parametrize("tau", [3, 50])
@pytest.mark.parametrize("transpose", [False, True])
def test_structured_operator_takes_one_product_per_template_whatever_tau(tau, transpose):
    rnn, xs, targets = problem(layers=2, r=3, tau=tau)
    trace = rnn.forward(xs)
    B = pp.backward_system(rnn, trace, rnn.loss_gradient(trace, targets))
    counted = type(B.structure)(B.structure.tau, B.structure.sizes, tuple(
        type(t)(t.row, t.col, t.offset, np.asarray(t.M).view(CountingMatrix))
        for t in B.structure.templates))
    v = np.random.default_rng(3).standard_normal(B.rhs.shape)
    CountingMatrix.products[0] = 0
    fast = counted.apply(B, v, transpose)
    assert CountingMatrix.products[0] == len(B.structure.templates) == 4
    flat = v.T.reshape(-1)
    M = B.matrix.T if transpose else B.matrix
    np.testing.assert_allclose(fast.T.reshape(-1), M @ flat, rtol=1e-12, atol=1e-13)


def test_structured_operator_in_every_view():
    rnn, xs, targets = problem(layers=2, r=3, tau=5)
    trace = rnn.forward(xs)
    B = pp.backward_system(rnn, trace, rnn.loss_gradient(trace, targets))
    F = pp.forward_system(rnn, xs, around=trace)
    rng = np.random.default_rng(4)
    for S in (B, F, B.paper(), F.sample(1), B.sample(2).paper()):
        assert S.structure is not None and S.unstructured().structure is None
        np.testing.assert_allclose(S.unstructured().apply(S.rhs), S.apply(S.rhs), rtol=1e-12,
                                   atol=1e-13)
        u = rng.standard_normal(S.shape[0])
        np.testing.assert_allclose(S.operator @ u, S.matrix @ u, rtol=1e-12, atol=1e-13)
        np.testing.assert_allclose(S.operator.rmatvec(u), S.matrix.T @ u, rtol=1e-12,
                                   atol=1e-13)


@pytest.mark.parametrize("outer", ["jacobi", "gmres", "bicgstab"])
@pytest.mark.parametrize("form", ["scaled", "paper"])
def test_hybrid_is_exact_after_tau_outer_iterations(outer, form):
    rnn, xs, targets = problem(layers=3, r=2, tau=8)
    trace = rnn.forward(xs)
    B = pp.backward_system(rnn, trace, rnn.loss_gradient(trace, targets), form=form)
    sol = pp.solve(B, "hybrid", outer=outer, rtol=1e-13)
    # the preconditioned coupling over time is nilpotent of index tau = 8
    assert sol.converged and sol.iterations <= (8 if outer != "bicgstab" else 8 + 2)
    assert sol.info["inner_steps"] == 4 and sol.info["outer_iterations"] == sol.iterations
    assert relative_error(sol.x, pp.solve(B, "substitution").x) < 1e-12
    few = pp.solve(B, "hybrid", outer=outer, maxiter=2)
    assert not few.converged and few.status is pp.Status.MAX_ITER
    with pytest.raises(ValueError, match="hybrid: option outer='richardson' must be one of"):
        pp.solve(B, "hybrid", outer="richardson")


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("r", [None, 3])
def test_tensor_rnns_run_pytorchs_recurrent_kernel_with_numpys_results(r, dtype, monkeypatch):
    """A tensor RNN's tanh and ReLU layers run PyTorch's recurrent kernels, as NumPy's loop.

    ``torch.rnn_tanh``/``rnn_relu`` (cuDNN on a GPU); other activations run the loop.
    The trace (states and pre-activations) and the gradients agree with NumPy's.
    """
    calls = []
    for name in ("rnn_tanh", "rnn_relu"):
        kernel = getattr(torch, name)
        monkeypatch.setattr(torch, name, lambda *a, kernel=kernel, name=name: (
            calls.append(name), kernel(*a))[1])
    net = pp.RNN.random([3, 5, 4, 4], activation=["tanh", "relu", "sigmoid"], seed=5,
                        dtype=dtype)
    rng = np.random.default_rng(6)
    xs = rng.standard_normal((40, 3) + (() if r is None else (r,))).astype(dtype)
    target = rng.standard_normal((40, 4) + (() if r is None else (r,))).astype(dtype)
    moved = net.to("torch")
    ours, exact = moved.forward(torch.tensor(xs)), net.forward(xs)
    assert calls == ["rnn_tanh", "rnn_relu"]  # the sigmoid layer took the loop
    bound = 1e-13 if dtype == "float64" else 1e-5
    for k in range(3):
        assert relative_error(ours.z[k + 1].numpy(), exact.z[k + 1]) < bound, k
        assert relative_error(ours.y[k].numpy(), exact.y[k]) < bound, k
    g = pp.backprop(moved, torch.tensor(xs), torch.tensor(target), method="cyclic-reduction")
    reference = pp.backprop(net, xs, target, method="substitution")
    for ours_k, exact_k in zip(g.W + g.U, reference.W + reference.U):
        assert relative_error(ours_k.numpy(), exact_k) < 100 * bound


@pytest.mark.parametrize("kind", ["numpy", "torch", "array_api_strict"])
def test_weight_gradients_summed_a_chunk_of_steps_at_a_time_as_one_sum(kind):
    """``sum_s V[s] Z[s]^T``: wide enough that the steps go in several chunks (here 11)."""
    from propop import backend
    from propop.networks.rnn import _outer_over_steps, _summed_over_steps

    pytest.importorskip(kind)
    rng = np.random.default_rng(5)
    V, Z = rng.standard_normal((30, 300, 20)), rng.standard_normal((30, 310, 20))
    M = backend.convert(np.ones((300, 310)), kind)
    for r in (20, 2):  # per-step products in chunks; columns side by side
        ours = _outer_over_steps(M, backend.convert(V[..., :r], kind),
                                 backend.convert(Z[..., :r], kind))
        np.testing.assert_allclose(backend.to_host(ours),
                                   np.einsum("sir,sjr->ij", V[..., :r], Z[..., :r]),
                                   rtol=1e-13, atol=1e-12)
    np.testing.assert_allclose(backend.to_host(_summed_over_steps(backend.convert(V, kind))),
                               V.sum(axis=(0, 2)), rtol=1e-13, atol=1e-12)
    one = _outer_over_steps(M, backend.convert(V[:, :, 0], kind), backend.convert(Z[:, :, 0],
                                                                                  kind))
    np.testing.assert_allclose(backend.to_host(one), V[:, :, 0].T @ Z[:, :, 0], rtol=1e-13,
                               atol=1e-12)


def test_slopes_come_from_the_states_of_the_sequential_pass_only():
    """``1 - z^2`` where the trace's ``z = tanh(y)`` (its own pass), ``1 - tanh(y)^2`` else."""
    rnn, xs, _ = problem(layers=2, r=3)
    trace = rnn.forward(xs)
    for slope, y, z in zip(rnn.slopes(trace), trace.y, trace.z[1:]):
        np.testing.assert_array_equal(slope, 1 - z * z)
        np.testing.assert_allclose(slope, 1 - np.tanh(y) ** 2, rtol=1e-14, atol=1e-15)
    states = [2 * z for z in trace.z]  # not tanh of their own pre-activations
    other = rnn.trace_from_states(xs, states)
    for slope, y in zip(rnn.slopes(other), other.y):
        np.testing.assert_array_equal(slope, 1 - np.tanh(y) * np.tanh(y))


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("r", [None, 1, 3])
@pytest.mark.parametrize("direction", ["forward", "backward"])
def test_substitution_steps_through_blas_as_the_explicit_matrix_solves(direction, r, dtype):
    """A time layout's per-step products go through BLAS writers: each dtype and batch shape."""
    import scipy.sparse.linalg as sla

    rnn, xs, targets = problem(layers=2, r=r, tau=9)
    rnn = pp.RNN([W.astype(dtype) for W in rnn.W], [U.astype(dtype) for U in rnn.U],
                 [b.astype(dtype) for b in rnn.b], activation="tanh")
    if direction == "forward":
        system = pp.forward_system(rnn, xs.astype(dtype), around=rnn.forward(xs.astype(dtype)))
    else:
        trace = rnn.forward(xs.astype(dtype))
        system = pp.backward_system(rnn, trace, rnn.loss_gradient(trace, targets.astype(dtype)))
    x = pp.solve(system, "substitution").x
    assert x.dtype == np.dtype(dtype)
    rhs = np.asarray(system.rhs, dtype=np.float64)
    expected = sla.spsolve_triangular(system.matrix.astype(np.float64).tocsr(),
                                      rhs.T.reshape(-1), lower=direction == "forward")
    np.testing.assert_allclose(np.asarray(x, dtype=np.float64).T.reshape(-1), expected,
                               rtol=1e-5 if dtype == "float32" else 1e-12,
                               atol=1e-5 if dtype == "float32" else 1e-13)


@pytest.mark.parametrize("zero_input_layer", [True, False])
def test_substitution_on_a_time_layout_adds_whole_layers_rhs_only_where_nonzero(
        zero_input_layer):
    """The input layer's rows cover every step at once; a zero rhs there is skipped."""
    import scipy.sparse.linalg as sla

    rnn, xs, targets = problem(layers=2, r=3, tau=6)
    trace = rnn.forward(xs)
    B = pp.backward_system(rnn, trace, rnn.loss_gradient(trace, targets))
    rhs = np.random.default_rng(5).standard_normal(B.rhs.shape)
    steps = rhs.reshape(6, sum(rnn.sizes), 3)
    if zero_input_layer:
        steps[:, : rnn.sizes[0], :] = 0.0
    system = pp.TriangularSystem.of(B.operator_of, rhs)
    x = pp.solve(system, "substitution").x
    expected = sla.spsolve_triangular(B.matrix.tocsr(), rhs.T.reshape(-1), lower=False)
    np.testing.assert_allclose(x.T.reshape(-1), expected, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("r", [None, 1, 3])
@pytest.mark.parametrize("tau", [1, 6])
@pytest.mark.parametrize("sparse", [False, True])
def test_trace_from_states_is_each_steps_pre_activation(r, tau, sparse):
    """``y[k][s] = W z[k][s] + U z[k+1][s-1] + b`` (zero before step 0), step by step."""
    import scipy.sparse as sp

    rnn, xs, _ = problem(layers=2, r=r, tau=tau)
    if sparse:  # the same weights as CSR: over_time's sparse product
        rnn = pp.RNN([sp.csr_array(W) for W in rnn.W], [sp.csr_array(U) for U in rnn.U],
                     rnn.b, rnn.activations)
    rng = np.random.default_rng(3)
    states = [xs] + [rng.standard_normal((tau, 5) + xs.shape[2:]) for _ in range(2)]
    trace = rnn.trace_from_states(xs, states)
    for k in range(2):
        W, U = (M.toarray() if sparse else M for M in (rnn.W[k], rnn.U[k]))
        b = rnn.b[k] if r is None else rnn.b[k][:, None]
        for s in range(tau):
            before = states[k + 1][s - 1] if s else np.zeros_like(states[k + 1][0])
            np.testing.assert_allclose(trace.y[k][s], W @ states[k][s] + U @ before + b,
                                       rtol=1e-14, atol=1e-14)
    np.testing.assert_array_equal(trace.z[1], states[1])
