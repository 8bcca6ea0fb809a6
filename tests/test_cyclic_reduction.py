"""Cyclic reduction and PCR: exact against substitution, levels, batches, overflow, cost."""

import math

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

import propop as pp
from propop.solvers.selection import cost
from cases import ACTIVATIONS, Case, gpu_backends, relative_error

METHODS = ["cyclic-reduction", "parallel-cyclic-reduction"]
FLOPS = {"cyclic-reduction": cost.cyclic_reduction_flops,
         "parallel-cyclic-reduction": cost.parallel_cyclic_reduction_flops}

# The benchmark grid, shrunk in depth to test speed; plus odd/even/powers of two.
SHAPES = [((8,) * 33, 1), ((32,) * 17, 1), ((16,) * 9, 3), ((12,) * 5, 4), ((6,) * 2, 2),
          ((6,) * 3, None), ((5, 9, 3, 7, 4, 8), 2), ((4,) * 65, 1), ((4,) * 64, None)]


def system_pair(sizes, r, activation="tanh", density=1.0, seed=0, linearization="secant"):
    case = Case(sizes, activation=activation, r=r, density=density, seed=seed)
    net, trace, eps, _ = case.problem()
    x, _ = case.data()
    return (pp.backward_system(net, trace, eps),
            pp.forward_system(net, x, around=trace, linearization=linearization))


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize(("sizes", "r"), SHAPES, ids=lambda v: str(v if v is None or
                                                                   isinstance(v, int)
                                                                   else len(v)))
def test_agrees_with_substitution_and_counts_levels_and_work(method, sizes, r):
    for system in system_pair(sizes, r):
        sol = pp.solve(system, method)
        exact = pp.solve(system, "substitution").x
        assert sol.converged
        assert relative_error(sol.x, exact) < 1e-12
        assert sol.levels == math.ceil(math.log2(system.nblocks))
        assert sol.info["flops"] == FLOPS[method](sizes, r or 1, shared=(r or 1) == 1)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("density", [1.0, 0.3])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_dense_sparse_and_dtypes(method, density, dtype):
    case = Case((7, 9, 9, 9, 9, 5), activation="elu", density=density, r=3, dtype=dtype)
    net, trace, eps, v = case.problem()
    sol = pp.solve(pp.backward_system(net, trace, eps), method)
    assert sol.x.dtype == np.dtype(dtype)
    assert relative_error(sol.x, np.concatenate(v)) < (1e-12 if dtype == "float64" else 1e-5)


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.integers(1, 6), min_size=2, max_size=12).map(tuple),
       r=st.sampled_from([None, 1, 3]), activation=st.sampled_from(ACTIVATIONS),
       seed=st.integers(0, 99))
def test_random_shapes(sizes, r, activation, seed):
    """Agreement to 1e-11 on random shapes, where width-1 chains are ill-conditioned.

    The forward system uses Newton's slopes here: the secant ``f(y)/y`` of an
    activation with ``f(0) != 0`` is unbounded near ``y = 0``, which makes the
    system arbitrarily ill-conditioned for any exact method.
    """
    for system in system_pair(sizes, r, activation, seed=seed, linearization="newton"):
        exact = pp.solve(system, "substitution").x
        for method in METHODS:
            assert relative_error(pp.solve(system, method).x, exact) < 1e-11, method


@pytest.mark.parametrize("method", METHODS)
def test_paper_form_gives_the_same_answer(method):
    B, F = system_pair((5, 6, 6, 6, 3), 2, activation="softplus")
    for system in (B.paper(), F.paper()):
        assert relative_error(pp.solve(system, method).x,
                              pp.solve(system, "substitution").x) < 1e-12


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("method", METHODS)
def test_overflow_of_jacobian_products_is_reported(method, dtype):
    """Vectors stay finite (substitution succeeds) while the products of weights overflow.

    The advice names float64 only where the blocks are narrower.
    """
    big, tiny = (1e200, 1e-300) if dtype == "float64" else (1e20, 1e-30)
    net = pp.FNN([big * np.eye(3, dtype=dtype)] * 3, activation="identity")
    x = np.full(3, tiny, dtype=dtype)
    target = net.forward(x).output
    B = pp.backward_system(net, net.forward(x), np.full(3, tiny, dtype=dtype))
    assert B.dtype == dtype and pp.solve(B, "substitution").converged
    sol = pp.solve(B, method)
    assert sol.status is pp.Status.NONFINITE and not sol.converged
    assert "level 1: the reduced block coupling blocks" in sol.message
    assert "product of Jacobians overflowed" in sol.message
    assert ("or float64" in sol.message) == (dtype == "float32")
    with pytest.raises(pp.ConvergenceError, match="overflowed"):
        pp.backprop(net, x, target, method=method)


@pytest.mark.parametrize("method", METHODS)
def test_shared_diagonal_mean_is_approximate_and_says_how_much(method):
    B, _ = system_pair((6,) * 7, 5, activation="tanh")
    sol = pp.solve(B, method, shared_diagonal="mean")
    exact = pp.solve(B, "substitution").x
    assert sol.status is pp.Status.APPROXIMATE and not sol.converged
    error = relative_error(sol.x, exact)
    assert sol.info["approximation_error"] == pytest.approx(error, rel=1e-6)
    assert error > 1e-6 and "approximate" in sol.message
    assert sol.info["flops"] == FLOPS[method]((6,) * 7, 5, shared=True)
    single, _ = system_pair((6,) * 7, 1)  # one sample: the mean is exact
    assert pp.solve(single, method, shared_diagonal="mean").converged
    with pytest.raises(ValueError, match="shared_diagonal='median' must be one of 'mean', None"):
        pp.solve(B, method, shared_diagonal="median")


@pytest.mark.parametrize("method", METHODS)
def test_per_sample_blocks_cost_r_times_the_shared_ones(method):
    sizes = (16,) * 17
    per_sample = FLOPS[method](sizes, 8)
    shared = FLOPS[method](sizes, 8, shared=True)
    assert per_sample > 4 * shared  # r = 8 block products per pair instead of one
    assert cost.batched_direct_work(16, 16, 8) == 8 * 16 * 16**3 + 16 * 16**2 * 8


def test_cost_model_formulas():
    sizes = (4, 4, 4, 4)
    assert cost.sequential_work(sizes, r=2, gamma=1) == 3 * (16 + 4) * 2
    assert cost.iterative_work(sizes, r=2, eta=5) == 5 * cost.sequential_work(sizes, r=2)
    assert cost.iterative_time(sizes, r=2, eta=5) == 5 * (16 + 4) * 2
    assert cost.direct_work(sizes, r=1, gamma=0) == 2 * (64 + 16) + 2 * 16
    assert cost.direct_memory(sizes, 3) == 2 * cost.sequential_memory(sizes, 3) == 2 * 16 * 3
    assert cost.recursive_direct_time(8, 64, 1) == 8**3 * 6 + 64


def test_peak_memory_of_reduced_blocks_is_reported():
    B, _ = system_pair((16,) * 33, 1)
    sol = pp.solve(B, "cyclic-reduction")
    weights = 32 * 16 * 16 * 8
    assert weights <= sol.info["peak_bytes"] <= 3 * weights


def diagonal_net(depth, width, r, seed=0):
    """Diagonal weights: every product of Jacobians stays diagonal."""
    rng = np.random.default_rng(seed)
    W = [sp.diags_array(rng.uniform(0.5, 1.5, width)).tocsr() for _ in range(depth)]
    net = pp.FNN(W, [0.1 * rng.standard_normal(width) for _ in range(depth)], "tanh")
    x = rng.standard_normal((width, r))
    return net, x


@pytest.mark.parametrize("r", [1, 3])
def test_sparse_reduction_of_diagonal_weights_keeps_them_diagonal(r):
    net, x = diagonal_net(100, 8, r)
    trace = net.forward(x)
    B = pp.backward_system(net, trace, np.ones_like(trace.output))
    sol = pp.solve(B, "cyclic-reduction", sparse=True, dense_threshold=1.0)
    assert relative_error(sol.x, pp.solve(B, "substitution").x) < 1e-12
    assert sol.info["sparse_levels"] == sol.levels == 7
    assert sol.info["fill_in"] == pytest.approx([1.0] * 6)  # the last level has no product
    dense = pp.solve(B, "cyclic-reduction", sparse=False)
    assert sol.info["flops"] < dense.info["flops"] / 10


@pytest.mark.parametrize(("density", "threshold", "r"), [(0.2, 1.0, 1), (0.2, 1.0, 4),
                                                          (0.2, 0.3, 2), (0.6, 0.25, 1),
                                                          (0.1, 0.0, 3)])
def test_sparse_reduction_agrees_and_switches_to_dense_at_the_threshold(density, threshold,
                                                                         r):
    for system in system_pair((10,) * 20, r, density=density):
        sol = pp.solve(system, "cyclic-reduction", sparse=True, dense_threshold=threshold)
        assert relative_error(sol.x, pp.solve(system, "substitution").x) < 1e-12
        assert sol.levels == 5 and len(sol.info["fill_in"]) <= sol.info["sparse_levels"]
        if threshold == 0.0:
            assert sol.info["sparse_levels"] == 0
        if threshold == 1.0:
            assert sol.info["sparse_levels"] == 5


def test_sparse_overflow_and_bad_options():
    W = [sp.csr_array(1e200 * np.eye(3))] * 3
    net = pp.FNN(W, activation="identity")
    B = pp.backward_system(net, net.forward(np.full(3, 1e-300)), np.full(3, 1e-300))
    sol = pp.solve(B, "cyclic-reduction", sparse=True, dense_threshold=1.0)
    assert sol.status is pp.Status.NONFINITE and "level 1" in sol.message
    with pytest.raises(ValueError, match=r"dense_threshold must lie in \[0, 1\]"):
        pp.solve(B, "cyclic-reduction", sparse=True, dense_threshold=2)
    with pytest.raises(ValueError, match=r"dense_threshold applies to sparse reductions"):
        pp.solve(B, "cyclic-reduction", dense_threshold=0.5)  # narrow: the dense path


def test_sparse_path_is_the_default_only_for_wide_sparse_layers():
    narrow, _ = system_pair((10,) * 5, 1, density=0.2)
    said = pp.solve(narrow, "cyclic-reduction").info["fill_in"]  # dense: says so, and the fix
    assert isinstance(said, str) and "not followed" in said and "sparse=True" in said
    wide = Case((256, 256, 256), r=None, density=0.01).problem()
    sol = pp.solve(pp.backward_system(*wide[:3]), "cyclic-reduction")
    assert all(f > 0 for f in sol.info["fill_in"])
    assert relative_error(sol.x, np.concatenate(wide[3])) < 1e-12


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize(("depth", "width", "r"), [
    (4096, 8, 1), (1024, 32, 1), (256, 128, 1),
    pytest.param(64, 256, 32, marks=pytest.mark.slow)], ids=str)
def test_the_benchmark_grid_at_full_size(method, depth, width, r):
    """The issue's benchmark shapes themselves (the largest takes seconds: marked slow)."""
    case = Case((width,) * (depth + 1), activation="tanh", r=r)
    net, trace, eps, v = case.problem()
    sol = pp.solve(pp.backward_system(net, trace, eps), method)
    assert sol.levels == math.ceil(math.log2(depth + 1))
    assert relative_error(sol.x, np.concatenate(v)) < 1e-12


def test_a_namespace_with_a_product_function_is_not_taken_for_kernels(monkeypatch):
    """A namespace with a ``product`` function is reduced with the dense kernels.

    CuPy's namespace has one (NumPy 2's has none): the reduction took it for its
    kernels object and failed on an H200. A NumPy given one solves as before.
    """
    net, trace, eps, _ = Case((4, 6, 6, 6, 6, 6, 3), r=3, seed=2).problem()
    system = pp.backward_system(net, trace, eps)
    expected = pp.solve(system, "substitution").x
    monkeypatch.setattr(np, "product", np.prod, raising=False)
    assert relative_error(pp.solve(system, "cyclic-reduction").x, expected) < 1e-13


def test_chunks_of_samples_give_the_same_answer_in_a_chunks_memory():
    """``chunk_size``: the samples' systems are independent; the same answer to rounding."""
    import tracemalloc

    B, F = system_pair((16,) * 65, 7)
    for system in (B, F):
        whole = pp.solve(system, "cyclic-reduction")
        chunked = pp.solve(system, "cyclic-reduction", chunk_size=3)  # 3, 3 and 1 samples
        assert chunked.converged and chunked.info["chunk_size"] == 3
        assert relative_error(chunked.x, whole.x) < 1e-14
        assert chunked.levels == whole.levels and chunked.info["flops"] == whole.info["flops"]
        assert chunked.info["peak_bytes"] < 0.6 * whole.info["peak_bytes"]
    peaks = {}
    for chunk_size in (None, 1):
        tracemalloc.start()
        pp.solve(B, "cyclic-reduction", chunk_size=chunk_size)
        peaks[chunk_size] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert peaks[1] < 0.4 * peaks[None]
    one = pp.solve(B, "cyclic-reduction", chunk_size=7)  # one chunk: the plain reduction
    assert "chunk_size" not in one.info
    np.testing.assert_array_equal(one.x, pp.solve(B, "cyclic-reduction").x)


@pytest.mark.parametrize(("kind", "device"), [("torch", None), ("array_api_strict", None),
                                               *gpu_backends()])
def test_chunks_on_other_backends(kind, device):
    pytest.importorskip(kind)
    from propop import backend

    net = pp.FNN.random([8] * 17, activation="tanh", seed=0)
    rng = np.random.default_rng(0)
    x, t = rng.standard_normal((8, 5)), rng.standard_normal((8, 5))
    reference = pp.backprop(net, x, t, method="substitution")
    g = pp.backprop(net.to(kind, device), backend.convert(x, kind, device),
                    backend.convert(t, kind, device), method="cyclic-reduction", chunk_size=2)
    assert g.solution.info["chunk_size"] == 2 and backend.of(g.W[0]).name == kind
    for ours, theirs in zip(g.W, reference.W):
        np.testing.assert_allclose(backend.to_host(ours), theirs, rtol=1e-12, atol=1e-14)


def test_an_rnn_batch_reduces_in_chunks_too():
    rnn = pp.RNN.random([3, 4, 4], activation="tanh", seed=2)
    rng = np.random.default_rng(3)
    trace = rnn.forward(rng.standard_normal((12, 3, 5)))
    system = pp.backward_system(rnn, trace, rng.standard_normal(trace.output.shape))
    chunked = pp.solve(system, "cyclic-reduction", chunk_size=2)
    assert chunked.converged and chunked.info["levels"] == \
        pp.solve(system, "cyclic-reduction").info["levels"]
    assert relative_error(chunked.x, pp.solve(system, "substitution").x) < 1e-13


def test_a_chunk_that_overflows_names_its_samples():
    """Samples 0-2 scale their couplings down; sample 3's products overflow at level 2."""
    scales = np.array([1e-160, 1e-160, 1e-160, 1.0]) * np.ones((3, 1))
    system = pp.TriangularSystem([1e150 * np.eye(3)] * 4, [None] + [scales] * 4,
                                 np.ones((15, 4)), lower=True, sizes=[3] * 5)
    sol = pp.solve(system, "cyclic-reduction", chunk_size=2)
    assert sol.status is pp.Status.NONFINITE and not sol.converged
    assert sol.message.startswith("samples 2..3: ") and "overflowed" in sol.message
    assert sol.x.shape == (15, 4)
    first = pp.solve(system.columns(0, 2), "cyclic-reduction")
    np.testing.assert_array_equal(sol.x[:, :2], first.x)  # the chunk before it, solved


def test_chunk_size_is_checked_and_the_budget_error_proposes_one():
    B, _ = system_pair((16,) * 65, 7)
    for bad in (0, -2):
        with pytest.raises(ValueError, match="chunk_size must be a positive integer"):
            pp.solve(B, "cyclic-reduction", chunk_size=bad)
    for bad in (2.5, "3", True):
        with pytest.raises(TypeError, match="chunk_size=.* must be an integer or None"):
            pp.solve(B, "cyclic-reduction", chunk_size=bad)
    with pytest.raises(ValueError, match="exclude each other"):
        pp.solve(B, "cyclic-reduction", chunk_size=2, shared_diagonal="mean")
    single, _ = system_pair((16,) * 9, None)  # one sample: one chunk, the plain reduction
    assert "chunk_size" not in pp.solve(single, "cyclic-reduction", chunk_size=2).info
    peak = pp.solve(B, "cyclic-reduction").info["peak_bytes"]
    with pp.memory.limit(peak // 2):
        with pytest.raises(pp.memory.MemoryBudgetError, match=r"chunk_size=(\d+)") as error:
            pp.solve(B, "cyclic-reduction")
        fits = error.value.advice["chunk_size"]
        assert 1 <= fits < 7 and f"chunk_size={fits}" in str(error.value)
        assert pp.solve(B, "cyclic-reduction", chunk_size=fits).converged


def test_no_chunk_size_is_proposed_where_one_sample_does_not_fit():
    B, _ = system_pair((16,) * 65, 7)
    with pp.memory.limit(10_000):
        with pytest.raises(pp.memory.MemoryBudgetError) as error:
            pp.solve(B, "cyclic-reduction")
    assert error.value.advice == {} and "chunk_size" not in str(error.value)


def test_columns_are_the_batchs_samples():
    B, _ = system_pair((5, 6, 6, 4), 6)
    exact = pp.solve(B, "substitution").x
    part = B.columns(2, 5)
    assert part.nrhs == 3
    np.testing.assert_allclose(pp.solve(part, "substitution").x, exact[:, 2:5], rtol=1e-14)
    for bad in ((3, 3), (-1, 2), (4, 7)):
        with pytest.raises(IndexError, match="out of range for a batch of 6"):
            B.columns(*bad)
    single, _ = system_pair((5, 6, 4), None)
    with pytest.raises(ValueError, match="needs a batch system"):
        single.columns(0, 1)
    for bad in ((0.5, 2), (0, "3"), (True, 2)):
        with pytest.raises(TypeError, match=r"columns\(start, stop\) takes an integer index"):
            B.columns(*bad)


@pytest.mark.parametrize("within", ["cyclic-reduction", "substitution"])
@pytest.mark.parametrize("lower", [True, False])
def test_a_step_whose_inner_layers_the_next_step_does_not_read(lower, within):
    """Reduction over time where the chain carries layer 1 alone: layers 2 and 3 follow.

    Layer 3 of each step reads layer 1 of the step before (after, if upper), so the
    reduced positions are layers 1 to 3 and only layer 1 is carried: its values are
    the chain's own unknowns, the others ``D^{-1} c + D^{-1} G y_prev``. Against a
    dense solve of the explicit matrix.
    """
    from propop.systems.time_structure import Template, TimeStructure

    rng = np.random.default_rng(3)
    sizes, tau, r = (2, 3, 2, 3), 6, 2
    M = {(1, 0): (3, 2), (2, 1): (2, 3), (3, 2): (3, 2), (3, 1): (3, 3)}
    templates = []
    for (row, col), shape in M.items():
        matrix = 0.5 * rng.standard_normal(shape)
        offset = -1 if (row, col) == (3, 1) else 0
        if not lower:  # the transposed structure: row and column swap, time runs back
            row, col, offset, matrix = col, row, -offset, matrix.T
        templates.append(Template(row, col, offset, matrix))
    scales = [None] + [rng.uniform(0.5, 1.5, (tau, n, r)) for n in sizes[1:]]
    rhs = rng.standard_normal((tau * sum(sizes), r))
    system = pp.TriangularSystem(None, None, rhs, lower=lower, sizes=list(sizes) * tau,
                                 structure=TimeStructure(tau, sizes, tuple(templates)),
                                 layer_scales=scales)
    stacked = np.linalg.solve(system.matrix.toarray(), rhs.T.reshape(-1))  # samples in turn
    want = stacked.reshape(r, -1).T
    solution = pp.solve(system, "cyclic-reduction", within=within)
    assert solution.converged
    assert relative_error(solution.x, want) < 1e-13


@pytest.mark.parametrize("scaled", [True, False])
@pytest.mark.parametrize(("n", "tau", "r"), [(3, 7, 1), (8, 16, 1), (5, 9, 3), (40, 6, 1)])
@pytest.mark.parametrize("lower", [True, False])
def test_a_step_of_one_layer_reduces_its_one_matrix_over_time(lower, n, tau, r, scaled,
                                                              monkeypatch):
    """An RNN of one layer: every step's block is ``diag(s_t) U``, reduced as such.

    Its chain over time runs on :class:`~propop.solvers.reduction.odd_even.SharedCoreKernels`
    (one product with ``U`` for the first level's vectors, the pairs' cores from the
    outer products of ``U`` up to width 32, the dense kernels' beyond), with or
    without slopes, one sample or several, forward and backward. Against a dense
    solve of the explicit matrix; the levels counted without the kernels' switch.
    """
    from propop.solvers.reduction import odd_even
    from propop.systems.time_structure import Template, TimeStructure

    used = []
    original = odd_even.SharedCoreKernels.densify
    monkeypatch.setattr(odd_even.SharedCoreKernels, "densify",
                        lambda self, L, C, c: used.append(C.shape[0]) or original(self, L, C, c))
    rng = np.random.default_rng(n + tau)
    sizes = (2, n)
    W, U = rng.standard_normal((n, 2)), rng.standard_normal((n, n)) / np.sqrt(n)
    templates = [Template(1, 0, 0, W), Template(1, 1, -1, U)] if lower else \
        [Template(0, 1, 0, W.T), Template(1, 1, 1, U.T)]
    scales = [None, rng.uniform(0.2, 1.0, (tau, n, r)) if scaled else None]
    rhs = rng.standard_normal((tau * sum(sizes), r))
    system = pp.TriangularSystem(None, None, rhs, lower=lower, sizes=list(sizes) * tau,
                                 structure=TimeStructure(tau, sizes, tuple(templates)),
                                 layer_scales=scales)
    want = np.linalg.solve(system.matrix.toarray(), rhs.T.reshape(-1)).reshape(r, -1).T
    solution = pp.solve(system, "cyclic-reduction")
    assert solution.converged
    assert relative_error(solution.x, want) < 1e-13
    assert used and used[0] == tau - 1  # the shared kernels' first level
    assert solution.info["levels"]["time"] == math.ceil(math.log2(tau))
    used.clear()
    paper = pp.solve(system.paper(), "cyclic-reduction")  # the rows divided by 1 / s
    assert paper.converged and used and relative_error(paper.x, want) < 1e-13


@pytest.mark.parametrize("layers", [1, 2])
def test_an_overflow_over_time_names_its_level_and_steps_with_one_layer_or_two(layers):
    """``U = 1e25 I`` over 32 steps: ``U^16`` overflows at level 4 (steps 16 and 0).

    One layer runs the shared-core kernels, two the dense chain of each step's
    carried block; both name the same level and steps, and substitution, which
    multiplies vectors only, solves the same system.
    """
    from propop.systems.time_structure import Template, TimeStructure

    tau, n = 32, 3
    W, U = np.ones((n, 2)), 1e25 * np.eye(n)
    sizes = (2,) + (n,) * layers
    templates = [Template(1, 0, 0, W), Template(1, 1, -1, U)] + \
        [Template(2, 1, 0, np.eye(n))] * (layers - 1)
    rhs = np.zeros((tau * sum(sizes), 1))
    rhs[-n:, 0] = 1.0  # the last step's only: the solution stays finite
    system = pp.TriangularSystem(None, None, rhs, lower=True, sizes=list(sizes) * tau,
                                 structure=TimeStructure(tau, sizes, tuple(templates)),
                                 layer_scales=[None] * len(sizes))
    assert pp.solve(system, "substitution").converged
    sol = pp.solve(system, "cyclic-reduction")
    assert sol.status is pp.Status.NONFINITE
    assert sol.message.startswith("level 4: the reduced block coupling blocks step 16 and "
                                  "step 0 is not finite")


def test_the_shared_cores_first_products_are_the_pairs_products():
    """``SharedCoreKernels.product``: ``M diag(l) M`` per pair and sample, from outer products."""
    from propop.solvers.reduction import odd_even
    from propop.solvers.reduction.chain import Counter

    rng = np.random.default_rng(0)
    for n in (1, 4, 32, 33):
        M, L = rng.standard_normal((n, n)), rng.standard_normal((5, 3, n))
        kernels = odd_even.SharedCoreKernels(np, M, 5)
        cores = np.broadcast_to(M, (5, 1, n, n))
        got = kernels.product(None, cores, L, cores, Counter())
        want = np.einsum("ij,pbj,jk->pbik", M, L, M)
        assert got.shape == (5, 3, n, n)
        assert relative_error(got, want) < 1e-14


def test_unchecked_chunks_and_approximations_stand_for_their_caller():
    """Inside ``unchecked()`` a chunked or batch-mean reduction is not taken for a failure.

    Each chunk's solve comes back UNCHECKED: the next chunks are still solved (no
    NaN columns), and ``shared_diagonal="mean"`` keeps its error in ``info`` for
    the caller to judge rather than being called APPROXIMATE unjudged.
    """
    from propop.solvers.convergence import unchecked

    B, _ = system_pair((6,) * 9, 7, activation="tanh")
    whole = pp.solve(B, "cyclic-reduction", chunk_size=3)
    mean = pp.solve(B, "cyclic-reduction", shared_diagonal="mean")
    with unchecked():
        chunked = pp.solve(B, "cyclic-reduction", chunk_size=3)
        approximate = pp.solve(B, "cyclic-reduction", shared_diagonal="mean")
    assert chunked.status is pp.Status.UNCHECKED and chunked.usable
    np.testing.assert_array_equal(chunked.x, whole.x)
    assert approximate.status is pp.Status.UNCHECKED and mean.status is pp.Status.APPROXIMATE
    assert approximate.info["approximation_error"] == mean.info["approximation_error"] > 1e-6
