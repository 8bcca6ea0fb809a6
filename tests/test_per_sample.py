"""Chains whose samples each have their own couplings (a recurrence's Jacobians)."""

import numpy as np
import pytest

import propop as pp
from cases import relative_error

METHODS = ["substitution", "level-scheduled", "cyclic-reduction", "parallel-cyclic-reduction",
           "jacobi", "richardson", "auto", "batched-gmres", "batched-bicgstab", "bicgstab",
           "scipy.gmres", "scipy.spsolve_triangular", "pyamg.gmres"]
NB, N, R = 11, 3, 4


def per_sample_system(lower, seed=0, xp=np):
    rng = np.random.default_rng(seed)
    C = 0.5 * rng.standard_normal((NB - 1, R, N, N))
    rhs = rng.standard_normal((NB * N, R))
    system = pp.TriangularSystem(None, None, xp.asarray(rhs), lower=lower, sizes=[N] * NB,
                                 coupling_stack=xp.asarray(C))
    return system, C, rhs


def dense(C, lower, i):
    """Sample ``i``'s matrix, written out: unit diagonal, ``-C[j, i]`` in block (j+1, j)."""
    A = np.eye(NB * N)
    for j in range(NB - 1):
        row, col = (j + 1, j) if lower else (j, j + 1)
        A[row * N:(row + 1) * N, col * N:(col + 1) * N] = -C[j, i]
    return A


@pytest.mark.parametrize("lower", [True, False])
@pytest.mark.parametrize("method", METHODS)
def test_every_method_solves_every_block_of_every_sample(lower, method):
    system, C, rhs = per_sample_system(lower)
    assert system.per_sample_couplings and not system.shares_matrix
    sol = pp.solve(system, method)
    assert sol.converged
    for i in range(R):
        expected = np.linalg.solve(dense(C, lower, i), rhs[:, i]).reshape(NB, N)
        got = np.asarray(sol.x)[:, i].reshape(NB, N)
        for k in range(NB):
            assert relative_error(got[k], expected[k]) < 1e-9, (method, i, k)


@pytest.mark.parametrize("lower", [True, False])
@pytest.mark.parametrize("transpose", [False, True])
def test_products_and_one_sample_equal_the_dense_matrix(lower, transpose):
    system, C, _ = per_sample_system(lower, seed=1)
    x = np.random.default_rng(2).standard_normal((NB * N, R))
    y = system.apply(x, transpose)
    for i in range(R):
        A = dense(C, lower, i)
        np.testing.assert_allclose(y[:, i], (A.T if transpose else A) @ x[:, i], rtol=1e-13,
                                   atol=1e-13)
        single = system.sample(i)
        assert not single.per_sample_couplings
        np.testing.assert_allclose(single.matrix.toarray(), A, rtol=0, atol=0)


def test_torch_tensors_run_through_the_same_code():
    torch = pytest.importorskip("torch")
    system, C, rhs = per_sample_system(True, seed=3, xp=torch)
    reference = pp.solve(per_sample_system(True, seed=3)[0], "substitution").x
    for method in ["substitution", "cyclic-reduction", "parallel-cyclic-reduction", "jacobi",
                   "batched-gmres", "auto"]:
        x = pp.solve(system, method).x
        assert isinstance(x, torch.Tensor)
        assert relative_error(x.numpy(), reference) < 1e-10, method


def test_what_needs_a_shared_matrix_or_edges_says_so():
    system, C, rhs = per_sample_system(True)
    with pytest.raises(ValueError, match="a coupling differs between samples"):
        pp.solve(system, "block-gmres")
    with pytest.raises(ValueError, match="its own couplings .*sample\\(i\\)"):
        _ = system.blocks
    with pytest.raises(ValueError, match=r"\(10, 3, 3\) or, per sample, \(10, r, 3, 3\)"):
        pp.TriangularSystem(None, None, rhs, lower=True, sizes=[N] * NB,
                            coupling_stack=C[:, :2])
    same = np.repeat(C[:, :1], R, axis=1)
    shared = pp.TriangularSystem(None, None, rhs, lower=True, sizes=[N] * NB,
                                 coupling_stack=same).shared()
    assert not shared.per_sample_couplings
    np.testing.assert_array_equal(shared.coupling_stack, C[:, 0])


@pytest.mark.parametrize("method", ["mpi.substitution", "mpi.cyclic-reduction", "mpi.jacobi",
                                    "mpi.gmres", "mpi.bicgstab"])
def test_the_mpi_methods_say_they_need_shared_couplings(method):
    system, _, _ = per_sample_system(True)
    shared, _, _ = per_sample_system(True)
    shared = pp.TriangularSystem(None, None, shared.rhs, lower=True, sizes=[N] * NB,
                                 coupling_stack=np.repeat(shared.coupling_stack[:, :1], R,
                                                          axis=1)).shared()
    info = pp.solvers.info(method)
    assert info.requires == ("shared_couplings",)
    assert "per-sample" in system.tags and "per-sample" not in shared.tags
    assert not info.applies_to(system) and info.applies_to(shared)
    if info.available:
        with pytest.raises(ValueError, match="its own couplings"):
            pp.solve(system, method)


def test_a_truncated_solve_names_the_block_once():
    system, _, _ = per_sample_system(True)
    message = pp.solve(system, "jacobi", maxiter=3).message
    assert message.startswith("reached maxiter=3: block ") and "block block" not in message
    named = pp.TriangularSystem(None, None, system.rhs, lower=True, sizes=[N] * NB,
                                coupling_stack=system.coupling_stack,
                                names=[f"h{k}" for k in range(NB)])
    assert ": block h" in pp.solve(named, "jacobi", maxiter=3).message
