"""Block triangular systems beyond chains: several couplings per block row (skip edges)."""

import numpy as np
import pytest
import scipy.sparse as sp

import propop as pp
from cases import relative_error

SIZES = (3, 4, 4, 2, 5)


def skip_system(lower=True, r=3, seed=0):
    """Chain edges plus skip edges 0 -> 2 and 1 -> 4 (transposed for an upper system)."""
    rng = np.random.default_rng(seed)
    pairs = [(1, 0), (2, 1), (3, 2), (4, 3), (2, 0), (4, 1)]
    if not lower:
        pairs = [(col, row) for row, col in pairs]
    edges = [(row, col, 0.5 * rng.standard_normal((SIZES[row], SIZES[col])))
             for row, col in pairs]
    edges[4] = (edges[4][0], edges[4][1], sp.csr_array(edges[4][2]))  # a sparse one
    scales = [None] + [rng.uniform(0.2, 1.0, (n, r)) for n in SIZES[1:]]
    rhs = rng.standard_normal((sum(SIZES), r))
    return pp.TriangularSystem(None, scales, rhs, lower=lower, sizes=SIZES, edges=edges)


def dense_solution(system):
    rhs = system.rhs.T.reshape(-1)
    x = np.linalg.solve(system.matrix.toarray(), rhs)
    return x.reshape(system.nrhs, system.size).T


@pytest.mark.parametrize("lower", [True, False])
@pytest.mark.parametrize("method", ["substitution", "jacobi", "bicgstab", "scipy.gmres",
                                    "scipy.spsolve_triangular"])
def test_methods_solve_systems_with_skip_edges(lower, method):
    system = skip_system(lower)
    assert not system.blocks.is_chain
    sol = pp.solve(system, method)
    assert sol.converged
    assert relative_error(sol.x, dense_solution(system)) < 1e-9


@pytest.mark.parametrize("lower", [True, False])
def test_operator_paper_form_and_pattern(lower):
    system = skip_system(lower)
    v = np.random.default_rng(1).standard_normal(system.shape[0])
    np.testing.assert_allclose(system.operator @ v, system.matrix @ v, rtol=1e-13)
    np.testing.assert_allclose(system.operator.rmatvec(v), system.matrix.T @ v, rtol=1e-13)
    paper = system.paper()
    assert relative_error(pp.solve(paper).x, dense_solution(system)) < 1e-12
    single = system.sample(0)
    A = single.matrix.toarray()
    off = np.abs(A - np.diag(np.diag(A))).sum(axis=1) / np.abs(np.diag(A))
    o = single.offsets
    expected = [off[o[k]: o[k + 1]].max() for k in range(single.nblocks)]
    np.testing.assert_allclose(pp.solvers.diagonal_dominance(single).ratios, expected,
                               rtol=1e-12)


def test_cyclic_reduction_needs_a_chain_and_says_so():
    system = skip_system()
    for method in ("cyclic-reduction", "parallel-cyclic-reduction"):
        with pytest.raises(ValueError, match="not block bi-diagonal .* use 'substitution'"):
            pp.solve(system, method)


def test_edges_in_the_wrong_triangle_or_shape_are_named():
    with pytest.raises(ValueError, match=r"coupling 0 sits in block row 0, column 1: not "
                                         r"strictly lower triangular"):
        pp.TriangularSystem(None, [None, None], np.zeros(5), lower=True, sizes=(3, 2),
                            edges=[(0, 1, np.ones((3, 2)))])
    with pytest.raises(ValueError, match="give either coupling"):
        pp.TriangularSystem([np.ones((2, 3))], [None, None], np.zeros(5), lower=True,
                            sizes=(3, 2), edges=[(1, 0, np.ones((2, 3)))])
