"""TriangularSystem: explicit matrix, operator, forms, batches and views."""

import functools

import numpy as np
import pytest
import scipy.sparse.linalg as spla

import propop as pp
from cases import CASES, Case, relative_error, tolerance


def systems(case):
    net, trace, eps, _ = case.problem()
    x, _ = case.data()
    return [pp.backward_system(net, trace, eps),
            pp.forward_system(net, x, around=trace, linearization="secant"),
            pp.forward_system(net, x, around=trace, linearization="newton")]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_operator_equals_matrix(case):
    rng = np.random.default_rng(5)
    for S in systems(case):
        v = rng.standard_normal(S.shape[0]).astype(S.dtype)
        M = S.matrix
        tol = 10 * tolerance(case.dtype)
        assert relative_error(S.operator @ v, M @ v) < tol
        assert relative_error(S.operator.rmatvec(v), M.T @ v) < tol
        V = rng.standard_normal(S.rhs.shape).astype(S.dtype)
        flat = V if S.nrhs is None else V.T.reshape(-1)
        assert relative_error(S.apply(V) if S.nrhs is None else S.apply(V).T.reshape(-1),
                              M @ flat) < tol


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_matrix_solution_is_the_reference_propagation(case):
    """A general sparse LU of the explicit matrix reproduces backward and forward passes."""
    net, trace, eps, v = case.problem()
    B, Fs, Fn = systems(case)
    for S, reference in [(B, v), (Fs, trace.z), (Fn, trace.z)]:
        rhs = S.rhs if S.nrhs is None else S.rhs.T.reshape(-1)
        x = spla.spsolve(S.matrix.astype(np.float64).tocsc(), rhs.astype(np.float64))
        x = x if S.nrhs is None else x.reshape(S.nrhs, S.size).T
        assert relative_error(x, np.concatenate(reference)) < tolerance(case.dtype)


def test_matrix_formats_and_structure():
    dense = Case((4, 6, 8, 2)).problem()
    sparse = Case((4, 6, 8, 2), density=0.5).problem()
    B = pp.backward_system(*dense[:3])
    assert B.matrix.format == "bsr" and B.matrix.blocksize == (2, 2)
    assert pp.backward_system(*sparse[:3]).matrix.format == "csr"
    assert not B.lower and B.nblocks == 4 and B.sizes == (4, 6, 8, 2) and B.nrhs == 3
    assert B.shape == (3 * 20, 3 * 20)
    A = B.sample(1).matrix.toarray()
    assert np.allclose(np.tril(A, -1), 0) and np.allclose(np.diag(A), 1)
    Fm = pp.forward_system(dense[0], Case((4, 6, 8, 2)).data()[0]).sample(0).matrix.toarray()
    assert np.allclose(np.triu(Fm, 1), 0)


def test_sample_is_a_view_and_split_gives_blocks():
    net, trace, eps, _ = Case((5, 4, 3), r=4).problem()
    B = pp.backward_system(net, trace, eps)
    S = B.sample(2)
    assert S.nrhs is None and S.rhs.shape == (12,)
    assert np.shares_memory(S.rhs, B.rhs)
    assert all(np.shares_memory(a, b) for a, b in zip(S.blocks.scale, B.blocks.scale)
               if a is not None)
    np.testing.assert_array_equal(S.rhs, B.rhs[:, 2])
    assert [p.shape for p in B.split(B.rhs)] == [(5, 4), (4, 4), (3, 4)]
    with pytest.raises(IndexError, match="sample 4 out of range for a batch of 4"):
        B.sample(4)


@pytest.mark.parametrize("activation", ["tanh", "softplus", "elu"])
def test_paper_form_has_the_same_solution(activation):
    case = Case((5, 6, 6, 4), activation=activation)
    net, trace, eps, v = case.problem()
    x, _ = case.data()
    for scaled in [pp.backward_system(net, trace, eps),
                   pp.forward_system(net, x, around=trace, linearization="newton")]:
        paper = scaled.paper()
        assert paper.form == "paper" and paper.blocks.scale[0] is None
        assert paper.blocks.diagonal[1] is not None and scaled.blocks.diagonal[1] is None
        x_paper = pp.solve(paper, "substitution").x
        x_scaled = pp.solve(scaled, "substitution").x
        assert relative_error(x_paper, x_scaled) < 1e-13
        assert pp.solve(paper, "jacobi").converged


def test_paper_form_backward_diagonal_is_one_over_derivative():
    net, trace, eps, _ = Case((3, 4, 2), r=None).problem()
    E = pp.backward_system(net, trace, eps, form="paper")
    np.testing.assert_allclose(E.blocks.diagonal[1], 1 / net.activations[0].df(trace.y[0]))
    np.testing.assert_allclose(E.split(E.rhs)[-1], eps)


@pytest.mark.parametrize("method", ["substitution", "cyclic-reduction",
                                    "parallel-cyclic-reduction"])
def test_forward_system_around_a_perturbed_trace_approaches_the_truth(method):
    """The paper's approximate forward: the error shrinks as the trace nears the true one."""
    case = Case((6, 8, 8, 8, 4), activation="tanh")
    net, trace, _, _ = case.problem()
    x, _ = case.data()
    noise = [np.random.default_rng(k).standard_normal(y.shape) for k, y in enumerate(trace.y)]
    errors = []
    for delta in [1e-1, 1e-2, 1e-3, 0.0]:
        around = [y + delta * n for y, n in zip(trace.y, noise)]
        z = pp.solve(pp.forward_system(net, x, around=around), method).x
        errors.append(relative_error(z, np.concatenate(trace.z)))
    assert errors[0] > errors[1] > errors[2] > 0 and errors[3] < 1e-14


def test_batch_shares_one_product_per_layer():
    """apply() never loops over samples: it equals the per-sample products."""
    net, trace, eps, _ = Case((5, 7, 3), r=6).problem()
    B = pp.backward_system(net, trace, eps)
    V = np.random.default_rng(0).standard_normal(B.rhs.shape)
    per_sample = np.stack([B.sample(i).apply(V[:, i]) for i in range(6)], axis=1)
    np.testing.assert_allclose(B.apply(V), per_sample, rtol=1e-14)


def _stacked_chain(lower, r=None, seed=0):
    rng = np.random.default_rng(seed)
    depth, n = 5, 3
    C = rng.standard_normal((depth, n, n))
    S = rng.uniform(0.5, 1.5, (depth, n) + (() if r is None else (r,)))
    rhs = rng.standard_normal(((depth + 1) * n,) + (() if r is None else (r,)))
    return C, S, rhs


@pytest.mark.parametrize("lower", [True, False])
@pytest.mark.parametrize("r", [None, 2])
def test_stacked_coefficients_are_the_listed_ones(lower, r):
    """A chain given as (l, n, n) and (l, n[, r]) stacks is the chain given block by block."""
    C, S, rhs = _stacked_chain(lower, r)
    sizes = (3,) * 6
    listed = pp.TriangularSystem(list(C), [None] + list(S), rhs, lower=lower, sizes=sizes)
    stacked = pp.TriangularSystem(None, None, rhs, lower=lower, sizes=sizes,
                                  coupling_stack=C, scale_stack=S)
    assert abs(stacked.matrix - listed.matrix).max() == 0
    reference = pp.solve(listed, "substitution").x
    for method in ("substitution", "cyclic-reduction", "parallel-cyclic-reduction"):
        for system in (stacked, stacked.paper()):
            x = pp.solve(system, method).x
            assert relative_error(x, reference) < 1e-13, (method, system.form)


def test_stacked_coefficients_are_checked_once_and_named():
    C, S, rhs = _stacked_chain(True)
    sizes = (3,) * 6
    chain = functools.partial(pp.TriangularSystem, None, None, rhs, lower=True)
    with pytest.raises(ValueError, match="instead of coupling"):
        pp.TriangularSystem(list(C), None, rhs, sizes=sizes, lower=True, coupling_stack=C)
    with pytest.raises(ValueError, match="instead of row_scale"):
        pp.TriangularSystem(None, [None] + list(S), rhs, sizes=sizes, lower=True, coupling_stack=C,
                            scale_stack=S)
    with pytest.raises(ValueError, match=r"coupling_stack must be .*\(5, 3, 3\)"):
        chain(sizes=sizes, coupling_stack=C[:4])
    with pytest.raises(ValueError, match=r"scale_stack must be .*\(5, 3\)"):
        chain(sizes=sizes, coupling_stack=C, scale_stack=S[:, :2])
    with pytest.raises(ValueError, match="one width"):
        chain(sizes=(3, 3, 3, 3, 2, 4), coupling_stack=C)
    with pytest.raises(ValueError, match="real floating"):
        chain(sizes=sizes, coupling_stack=C.astype(complex))
    bad = S.copy()
    bad[2, 1] = np.nan
    with pytest.raises(ValueError, match=r"block 3.*row scaling"):
        chain(sizes=sizes, coupling_stack=C, scale_stack=bad)
    C[3, 0, 0] = np.inf
    with pytest.raises(ValueError, match=r"coupling \(4, 3\) \(coupling_stack\[3\]\), by "
                       r"which block 4 reads block 3, contains NaN or Inf \(first at index "
                       r"\(0, 0\)\)"):
        chain(sizes=sizes, coupling_stack=C)


def test_equal_width_fnn_systems_are_stacked():
    net = pp.FNN.random([4] * 7, activation="tanh", seed=3)
    x = np.random.default_rng(0).standard_normal((4, 2))
    trace = net.forward(x)
    B = pp.backward_system(net, trace, trace.output)
    assert B.coupling_stack is not None and B.scale_stack.shape == (6, 4, 2)
    assert B.names[3] == "v[3] (layer 2, W[2])"
    F = pp.forward_system(net, x, trace)
    assert F.coupling_stack is not None and F.scale_stack.shape == (6, 4, 2)


def test_no_row_scale_means_unscaled_rows():
    C, _, rhs = _stacked_chain(True)
    system = pp.TriangularSystem(list(C), None, rhs, lower=True, sizes=(3,) * 6)
    x = pp.solve(system, "substitution").x.reshape(6, 3)
    expected = [rhs[:3]]
    for k in range(5):
        expected.append(rhs[3 * (k + 1):3 * (k + 2)] + C[k] @ expected[-1])
    assert relative_error(x, np.array(expected)) < 1e-14


@pytest.mark.parametrize("how", ["exact", "mean"])
def test_shared_keeps_a_stacked_chain_stacked(how):
    C, S, rhs = _stacked_chain(False, r=3)
    S[:, :, 1:] = S[:, :, :1]  # one matrix for all samples ...
    system = pp.TriangularSystem(None, None, rhs, lower=False, sizes=(3,) * 6,
                                 coupling_stack=C, scale_stack=S)
    shared = system.shared(how)
    assert shared.scale_stack.shape == (5, 3, 1) and shared.shares_matrix
    listed = pp.TriangularSystem(list(C), [None] + [s[:, :1] for s in S], rhs, lower=False,
                                 sizes=(3,) * 6)
    assert relative_error(pp.solve(shared, "substitution").x,
                          pp.solve(listed, "substitution").x) < 1e-14
    S[3, 2, 2] += 1  # ... but for one entry of block 4
    with pytest.raises(ValueError, match="block 4: the row scaling differs between samples"):
        pp.TriangularSystem(None, None, rhs, lower=False, sizes=(3,) * 6, coupling_stack=C,
                            scale_stack=S).shared("exact")


@pytest.mark.parametrize("sizes", [(3, 3, 3, 3), (3, 5, 2, 4), (np.int64(3),) * 4,
                                   [np.int32(3), 5, np.int64(2), 4]])
def test_block_sizes_become_python_ints_and_their_offsets_are_the_running_sums(sizes):
    """Equal sizes are read at once (one int repeated, a range of offsets), others one by one."""
    ints = [int(s) for s in sizes]
    rng = np.random.default_rng(0)
    coupling = [rng.standard_normal((ints[k], ints[k + 1])) for k in range(len(ints) - 1)]
    S = pp.TriangularSystem(coupling, None, rng.standard_normal(sum(ints)), lower=False,
                            sizes=sizes)
    assert S.sizes == tuple(ints) and all(type(s) is int for s in S.sizes)
    assert S.offsets == (0, *np.cumsum(ints).tolist())
    x = pp.solve(S, "substitution").x
    np.testing.assert_allclose(S.matrix @ x, S.rhs, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(("sizes", "named"), [((3, 2.5), "2.5 for block 1"),
                                              ((2.5, 2.5), "2.5 for block 0"),
                                              (("3", 2), "'3' for block 0")])
def test_block_sizes_that_are_not_integers_are_named(sizes, named):
    """A size of 2.5 is not a block of 2: the size and its block are named, equal or not."""
    rng = np.random.default_rng(1)
    with pytest.raises(ValueError, match=f"block sizes must be integers, got {named}"):
        pp.TriangularSystem([rng.standard_normal((3, 2))], None, rng.standard_normal(5),
                            lower=False, sizes=sizes)
