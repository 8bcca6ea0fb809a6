"""One storage: a layout plus dense stacks or a sparse list, whatever form the caller gave.

Every way of giving a system (a chain's couplings one per block, edges, a time
structure, stacks) is read into one storage; its views and solves must agree
with a dense matrix the test builds itself from the coefficients, and the
storage must keep the caller's arrays as views, never copies.
"""

import numpy as np
import pytest
import scipy.sparse as sp

import propop as pp
from propop.systems.coefficients import DenseCouplings, Scalings, SparseCouplings
from propop.systems.layout import ChainLayout, GraphLayout


def dense_matrix(sizes, lower, edges, scales):
    """``I - diag(s_row) M`` at every edge ``(row, col, M)``: the scaled form, by hand."""
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    A = np.eye(offsets[-1])
    for row, col, M in edges:
        M = M.toarray() if sp.issparse(M) else M
        s = np.ones(sizes[row]) if scales[row] is None else scales[row]
        A[offsets[row]:offsets[row + 1], offsets[col]:offsets[col + 1]] -= s[:, None] * M
    return A


def chain_parts(rng, n=4, nb=6, lower=True):
    couplings = [rng.standard_normal((n, n)) * 0.5 for _ in range(nb - 1)]
    scales = [None] + [rng.uniform(0.2, 1.0, n) for _ in range(nb - 1)]
    edges = [((j + 1, j) if lower else (j, j + 1)) + (M,) for j, M in enumerate(couplings)]
    return couplings, scales, edges


@pytest.mark.parametrize("lower", [True, False])
def test_every_form_of_a_chain_is_one_operator(lower):
    rng = np.random.default_rng(0)
    couplings, scales, edges = chain_parts(rng, lower=lower)
    sizes, rhs = [4] * 6, rng.standard_normal(24)
    forms = {
        "coupling": pp.TriangularSystem(couplings, scales, rhs, lower=lower, sizes=sizes),
        "edges": pp.TriangularSystem(None, scales, rhs, lower=lower, sizes=sizes, edges=edges),
        "stacks": pp.TriangularSystem(None, None, rhs, lower=lower, sizes=sizes,
                                      coupling_stack=np.stack(couplings),
                                      scale_stack=np.stack(scales[1:])),
    }
    A = dense_matrix(sizes, lower, edges, scales)
    x = rng.standard_normal(24)
    exact = np.linalg.solve(A, rhs)
    for name, system in forms.items():
        np.testing.assert_allclose(system.apply(x), A @ x, rtol=1e-14, atol=1e-14,
                                   err_msg=name)
        np.testing.assert_allclose(system.apply(x, transpose=True), A.T @ x, rtol=1e-14,
                                   atol=1e-14, err_msg=name)
        solution = pp.solve(system, "substitution")
        np.testing.assert_allclose(solution.x, exact, rtol=1e-12, err_msg=name)
        assert system.is_chain and "chain" in system.tags
    assert forms["stacks"].operator_of.layout.kind == "chain"
    assert forms["edges"].operator_of.layout.kind == "graph"  # a graph that is a chain
    assert "stacked" in forms["stacks"].tags and "stacked" not in forms["edges"].tags


def test_the_storage_keeps_the_callers_arrays_as_views():
    rng = np.random.default_rng(1)
    couplings, scales, _ = chain_parts(rng)
    stack, scale_stack = np.stack(couplings), np.stack(scales[1:])
    system = pp.TriangularSystem(None, None, rng.standard_normal(24), lower=True, sizes=[4] * 6,
                                 coupling_stack=stack, scale_stack=scale_stack)
    op = system.operator_of
    assert isinstance(op.couplings, DenseCouplings) and op.couplings.stack is stack
    assert op.scalings.stacks[0] is scale_stack and op.scalings[0] is None
    assert np.shares_memory(op.scalings[3], scale_stack)
    listed = pp.TriangularSystem(couplings, scales, rng.standard_normal(24), lower=True,
                                 sizes=[4] * 6).operator_of
    assert all(np.shares_memory(listed.couplings[j], couplings[j]) for j in range(5))
    assert all(s is None or np.shares_memory(listed.scalings[k], s)
               for k, s in enumerate(scales))


def test_a_sparse_coupling_makes_the_sparse_list_and_mixed_graphs_solve():
    rng = np.random.default_rng(2)
    dense, sparse = rng.standard_normal((3, 4)), sp.random(4, 3, density=0.5, random_state=3,
                                                             format="coo")
    sizes = [3, 4, 3]
    edges = [(1, 0, sparse), (2, 1, dense), (2, 0, np.eye(3) * 0.5)]
    scales = [None, rng.uniform(0.5, 1, 4), None]
    rhs = rng.standard_normal(10)
    system = pp.TriangularSystem(None, scales, rhs, lower=True, sizes=sizes, edges=edges)
    op = system.operator_of
    assert isinstance(op.couplings, SparseCouplings) and "sparse" in op.tags
    assert sp.issparse(op.couplings[0]) and op.couplings[0].format == "csr"
    A = dense_matrix(sizes, True, edges, scales)
    np.testing.assert_allclose(pp.solve(system, "substitution").x, np.linalg.solve(A, rhs),
                               rtol=1e-12)
    assert not system.is_chain and "graph" in op.tags


def rnn_case(r=3, tau=5):
    rnn = pp.RNN.random([3, 4, 5], activation="tanh", seed=0)
    shape = (tau, 3, r) if r else (tau, 3)
    trace = rnn.forward(np.random.default_rng(4).standard_normal(shape))
    return rnn, trace, pp.backward_system(rnn, trace, np.ones_like(trace.output))


def test_a_time_layout_stores_templates_once_and_unrolls_to_the_same_matrix():
    _, _, B = rnn_case()
    op = B.operator_of
    assert op.layout.kind == "time" and "time" in op.tags and not op.is_chain
    assert len(op.couplings) == 4  # W and U of two layers, not one per step
    unrolled = B.unstructured()
    assert op.size == op.layout.size == sum(op.sizes) == unrolled.operator_of.size  # N
    assert unrolled.operator_of.layout.kind == "graph"
    x = np.random.default_rng(5).standard_normal(B.rhs.shape)
    A = B.csr.toarray()  # explicit matrix of the samples stacked, against both products
    stacked = x.T.reshape(-1)
    for system in (B, unrolled):
        np.testing.assert_allclose(system.apply(x).T.reshape(-1), A @ stacked, rtol=1e-13,
                                   atol=1e-13)
    np.testing.assert_allclose(pp.solve(B, "substitution").x,
                               pp.solve(unrolled, "level-scheduled").x, rtol=1e-12)


def test_the_diagonal_blocks_over_time_drop_the_recurrence_only():
    _, _, B = rnn_case(r=2, tau=4)
    op = B.operator_of
    within = op.within_steps()
    assert within.layout.kind == "time" and all(t.offset == 0 for t in within.layout.templates)
    per = op.layout.per
    same_step = B.restricted(lambda row, col: row // per == col // per)
    x = np.random.default_rng(6).standard_normal(B.rhs.shape)
    system = pp.TriangularSystem.of(within, x)
    reference = pp.solve(pp.TriangularSystem.of(same_step.operator_of, x), "level-scheduled")
    np.testing.assert_allclose(pp.solve(system, "substitution").x, reference.x, rtol=1e-12)


def test_tags_say_what_methods_ask():
    rng = np.random.default_rng(7)
    couplings, scales, _ = chain_parts(rng, nb=3)
    one = pp.TriangularSystem(couplings, scales, rng.standard_normal(12), lower=True,
                              sizes=[4] * 3)
    assert {"chain", "equal-widths", "shared-matrix"} <= one.tags
    batch_scales = [None] + [rng.uniform(0.2, 1, (4, 2)) for _ in range(2)]
    batch = pp.TriangularSystem(couplings, batch_scales, rng.standard_normal((12, 2)),
                                lower=True, sizes=[4] * 3)
    assert "shared-matrix" not in batch.tags and "shared-matrix" in batch.shared("mean").tags
    assert not batch.shares_matrix
    diagonal = pp.TriangularSystem(None, None, rng.standard_normal(6), lower=True,
                                   sizes=[3, 3], edges=[])
    assert "diagonal" in diagonal.tags and "diagonal" not in one.tags
    single = pp.TriangularSystem([], [None], rng.standard_normal(4), lower=True, sizes=[4])
    assert single.is_chain and "diagonal" in single.tags  # one block reads none
    per_sample = pp.TriangularSystem(None, None, rng.standard_normal((12, 2)), lower=True,
                                     sizes=[4] * 3,
                                     coupling_stack=rng.standard_normal((2, 2, 4, 4)))
    assert {"per-sample", "stacked"} <= per_sample.tags


def test_per_sample_couplings_sample_and_share_by_the_storage():
    rng = np.random.default_rng(8)
    stack = rng.standard_normal((3, 2, 4, 4)) * 0.3
    rhs = rng.standard_normal((16, 2))
    system = pp.TriangularSystem(None, None, rhs, lower=True, sizes=[4] * 4,
                                 coupling_stack=stack)
    for i in range(2):
        single = system.sample(i)
        assert single.couplings.stack.shape == (3, 4, 4)
        np.testing.assert_array_equal(single.couplings.stack, stack[:, i])
        edges = [(j + 1, j, stack[j, i]) for j in range(3)]
        A = dense_matrix([4] * 4, True, edges, [None] * 4)
        np.testing.assert_allclose(pp.solve(single, "substitution").x,
                                   np.linalg.solve(A, rhs[:, i]), rtol=1e-12)
    mean = system.shared("mean")
    np.testing.assert_allclose(mean.couplings.stack, stack.mean(axis=1), rtol=1e-15)
    with pytest.raises(ValueError, match="a coupling differs between samples"):
        system.shared()


def test_shared_names_the_first_block_whose_scaling_differs_in_any_layout():
    _, _, B = rnn_case(r=2, tau=3)
    with pytest.raises(ValueError, match=r"v\[\d\] at step \d \(layer \d\): the row scaling "
                                         "differs between samples"):
        B.shared()


def test_layouts_find_levels_and_groups_from_their_edges_alone():
    # 0 -> 1 -> 2 -> 3 and a skip 0 -> 2: levels by depth, groups {0}, {1, 2}, {3}
    layout = GraphLayout(True, (1, 1, 1, 1), ((1, 0, 0), (2, 1, 1), (2, 0, 2), (3, 2, 3)))
    assert layout.levels == ((0,), (1,), (2,), (3,))
    assert layout.groups == ((0,), (1, 2), (3,))
    assert not layout.is_chain
    wide = GraphLayout(True, (1, 1, 1), ((1, 0, 0), (2, 0, 1)))
    assert wide.levels == ((0,), (1, 2))
    chain = ChainLayout(False, (2, 2, 2))
    assert chain.edges() == ((0, 1, 0), (1, 2, 1)) and chain.is_chain
    assert chain.unrolled().is_chain and list(chain.order()) == [2, 1, 0]


def test_scalings_walk_in_either_order_as_indexed():
    rng = np.random.default_rng(9)
    stacked = Scalings([rng.standard_normal((4, 3))], 1, 5)
    per_block = Scalings.per_block([None] + [rng.standard_normal(3) for _ in range(4)])
    for scalings in (stacked, per_block):
        forward = list(scalings.in_order())
        backward = list(scalings.in_order(reverse=True))
        assert len(forward) == 5 and forward[0] is None and backward[-1] is None
        for k in range(1, 5):
            np.testing.assert_array_equal(forward[k], scalings[k])
            np.testing.assert_array_equal(backward[4 - k], scalings[k])


@pytest.mark.parametrize("where", ["scalings", "couplings"])
def test_samples_that_differ_only_in_a_later_block_do_not_share_a_matrix(where):
    """``shares_matrix`` reads the first block first: a difference further on still counts."""
    rng = np.random.default_rng(11)
    n, nb, r = 3, 6, 4
    rhs = rng.standard_normal((n * nb, r))
    if where == "scalings":
        stack = rng.standard_normal((nb - 1, n, n))
        scales = np.broadcast_to(rng.standard_normal((nb - 1, n, 1)), (nb - 1, n, r)).copy()
        system = pp.TriangularSystem(None, None, rhs, lower=True, sizes=[n] * nb,
                                     coupling_stack=stack, scale_stack=scales)
        assert system.shares_matrix  # equal columns everywhere: one matrix
        scales[4, 1, 2] += 1.0  # one entry of the last block, one sample
    else:
        stack = np.broadcast_to(rng.standard_normal((nb - 1, 1, n, n)), (nb - 1, r, n, n)).copy()
        system = pp.TriangularSystem(None, None, rhs, lower=True, sizes=[n] * nb,
                                     coupling_stack=stack)
        assert system.shares_matrix
        stack[3, 2, 0, 1] += 1.0
    changed = pp.TriangularSystem(None, None, rhs, lower=True, sizes=[n] * nb,
                                  coupling_stack=stack,
                                  **({"scale_stack": scales} if where == "scalings" else {}))
    assert not changed.shares_matrix
