"""A system's products with its couplings grouped by shape, against a dense matrix built here."""

import numpy as np
import pytest
import scipy.sparse as sp

import propop as pp
from propop.networks.graph import Graph


def dense_matrix(sizes, edges, scales, sample=0):
    """The scaled form's ``A`` of one sample, assembled entry block by entry block."""
    o = np.concatenate([[0], np.cumsum(sizes)])
    A = np.eye(o[-1])
    for row, col, M in edges:
        M = M.toarray() if sp.issparse(M) else M
        s = 1.0 if scales[row] is None else scales[row][:, sample]
        A[o[row]: o[row + 1], o[col]: o[col + 1]] -= s[:, None] * M
    return A


def crowded_system(lower, r=3, seed=0):
    """Blocks written by up to three couplings of the same shape, dense and sparse mixed."""
    rng = np.random.default_rng(seed)
    sizes = (4, 4, 4, 4, 3, 4)
    pairs = [(1, 0), (2, 0), (2, 1), (3, 0), (3, 1), (3, 2), (4, 3), (5, 4), (5, 3), (5, 0)]
    edges = []
    for i, (row, col) in enumerate(pairs):
        row, col = (row, col) if lower else (col, row)
        M = rng.standard_normal((sizes[row], sizes[col]))
        edges.append((row, col, sp.csr_array(M * (rng.random(M.shape) < 0.5)) if i % 3 == 0
                      else M))
    scales = [None if k == (0 if lower else 5) else rng.uniform(0.2, 1.0, (n, r))
              for k, n in enumerate(sizes)]
    rhs = rng.standard_normal((sum(sizes), r))
    return pp.TriangularSystem(None, scales, rhs, lower=lower, sizes=sizes, edges=edges), \
        sizes, edges, scales


@pytest.mark.parametrize("lower", [True, False])
@pytest.mark.parametrize("transpose", [False, True])
def test_grouped_products_equal_the_dense_matrix_for_every_sample(lower, transpose):
    system, sizes, edges, scales = crowded_system(lower)
    x = np.random.default_rng(1).standard_normal(system.rhs.shape)
    y = system.apply(x, transpose=transpose)
    for i in range(system.nrhs):
        A = dense_matrix(sizes, edges, scales, i)
        expected = (A.T if transpose else A) @ x[:, i]
        np.testing.assert_allclose(y[:, i], expected, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("transpose", [False, True])
def test_grouped_products_of_one_sample_and_the_paper_form(transpose):
    system, sizes, edges, scales = crowded_system(True)
    single = system.sample(1)
    x = np.random.default_rng(2).standard_normal(single.size)
    A = dense_matrix(sizes, edges, scales, 1)
    np.testing.assert_allclose(single.apply(x, transpose), (A.T if transpose else A) @ x,
                               rtol=1e-13, atol=1e-13)
    # paper form: every block row divided by its scaling (the unit rows' D^{-1} undone)
    d = np.concatenate([np.ones(n) if s is None else 1 / s[:, 1] for n, s in
                        zip(sizes, scales)])
    P = d[:, None] * A
    np.testing.assert_allclose(single.paper().apply(x, transpose), (P.T if transpose else P) @ x,
                               rtol=1e-12, atol=1e-12)


def test_a_deep_residual_graph_has_as_many_groups_as_a_shallow_one():
    """The Python work of a product is per group of equal shapes, not per edge."""
    counts = []
    for blocks in (2, 64):
        graph = Graph.residual_mlp(8, blocks)
        x = np.random.default_rng(0).standard_normal((8, 2))
        trace = graph.forward(x)
        system = pp.backward_system(graph, trace, graph.loss_gradient(trace, np.zeros((8, 2))))
        system.apply(system.rhs)
        system.apply(system.rhs, transpose=True)
        counts.append((len(system._forward_groups.groups),
                       len(system._transposed_groups.groups)))
        assert len(system.blocks.edges) >= 6 * blocks
    assert counts[1] == counts[0]
