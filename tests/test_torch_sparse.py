"""PyTorch's CSR tensors behind SciPy's interface (:mod:`propop.torch_sparse`), against SciPy."""

import warnings

import numpy as np
import pytest
import scipy.sparse as sp

import propop as pp
from propop import backend
from propop._checks import require_finite

torch = pytest.importorskip("torch")
from propop.torch_sparse import CSRTensor  # noqa: E402


def unsorted_with_duplicates():
    """A COO matrix with an entry given twice and its entries out of order."""
    rows, cols = np.array([2, 0, 2, 1, 0, 2]), np.array([3, 1, 0, 2, 1, 1])
    return sp.coo_array((np.arange(1.0, 7.0), (rows, cols)), shape=(3, 4))


def test_a_matrix_is_made_canonical_as_scipy_makes_it():
    M = unsorted_with_duplicates()
    canonical = sp.csr_array(M)
    canonical.sum_duplicates()
    canonical.sort_indices()
    T = CSRTensor(M)
    assert T.shape == (3, 4) and T.nnz == canonical.nnz == 5 and T.dtype == torch.float64
    np.testing.assert_array_equal(T.indptr.numpy(), canonical.indptr)
    np.testing.assert_array_equal(T.indices.numpy(), canonical.indices)
    np.testing.assert_array_equal(T.data.numpy(), canonical.data)
    np.testing.assert_array_equal(T.toarray().numpy(), M.toarray())
    assert (T.to_host() != canonical).nnz == 0


def test_triplets_of_tensors_are_summed_and_sorted_as_scipy_does():
    """SciPy's ``(data, (row, col))`` form with tensors, on their device."""
    M = unsorted_with_duplicates()
    canonical = sp.csr_array(M)
    canonical.sum_duplicates()
    canonical.sort_indices()
    T = CSRTensor((torch.from_numpy(M.data), (torch.from_numpy(M.row), torch.from_numpy(M.col))),
                  shape=M.shape)
    np.testing.assert_array_equal(T.indptr.numpy(), canonical.indptr)
    np.testing.assert_array_equal(T.indices.numpy(), canonical.indices)
    np.testing.assert_array_equal(T.data.numpy(), canonical.data)
    rows = torch.tensor([0, 1])
    with pytest.raises(ValueError, match="needs shape"):
        CSRTensor((torch.ones(2), (rows, rows)))
    with pytest.raises(ValueError, match=r"1-D tensors of one length.*\(3,\), \(2,\)"):
        CSRTensor((torch.ones(3), (rows, rows)), shape=(2, 2))


@pytest.mark.parametrize("columns", [None, 1, 3])
def test_products_and_the_transpose_are_scipys(columns):
    rng = np.random.default_rng(0)
    M = sp.random_array((7, 5), density=0.4, format="csr", rng=rng)
    T = CSRTensor(M)
    x = rng.standard_normal(5 if columns is None else (5, columns))
    y = rng.standard_normal(7 if columns is None else (7, columns))
    np.testing.assert_allclose((T @ torch.from_numpy(x)).numpy(), M @ x, rtol=1e-14)
    np.testing.assert_allclose((T.T @ torch.from_numpy(y)).numpy(), M.T @ y, rtol=1e-14)
    if columns is not None:  # x @ M, as SciPy's
        np.testing.assert_allclose((torch.from_numpy(y.T) @ T).numpy(), y.T @ M, rtol=1e-14)
    assert T.T.shape == (5, 7)
    np.testing.assert_array_equal(T.T.T.toarray().numpy(), M.toarray())
    own = CSRTensor(M.copy())  # (one made from M on the CPU shares M's entries)
    before = own.T  # a transpose made before the entries are written
    own.data.mul_(2.0)  # entries written in place: the next transpose reads them
    np.testing.assert_array_equal(own.T.toarray().numpy(), 2 * before.toarray().numpy())
    np.testing.assert_array_equal(T.T.toarray().numpy(), M.T.toarray())
    assert T.T.format == "csr" and T.T.tensor.layout == torch.sparse_csr


def test_the_transposes_pattern_is_scipys_with_empty_rows_and_columns():
    """Made once from the pointers on the device; the entries gathered from the current ones."""
    M = sp.random_array((9, 6), density=0.3, format="csr", rng=np.random.default_rng(3))
    M = sp.csr_array(M.multiply(np.array([1, 1, 0, 1, 1, 1.0])[None, :]))  # column 2 empty
    M = sp.csr_array(sp.vstack([M[:4], sp.csr_array((2, 6)), M[4:]]))  # two empty rows
    M.eliminate_zeros()
    T = CSRTensor(M.copy())
    expected = sp.csr_array(M.T)
    expected.sort_indices()
    for _ in range(2):  # the second from the kept pattern
        flipped = T.T
        np.testing.assert_array_equal(flipped.indptr.numpy(), expected.indptr)
        np.testing.assert_array_equal(flipped.indices.numpy(), expected.indices)
        np.testing.assert_array_equal(flipped.data.numpy(), expected.data)
    assert T._transposed is T._transposed
    np.testing.assert_array_equal(T.T.T.toarray().numpy(), M.toarray())
    stepped = T.with_data(T.data * 3)  # an optimiser's step: the same pattern
    assert stepped._transposed is T._transposed
    np.testing.assert_array_equal(stepped.T.toarray().numpy(), 3 * M.T.toarray())


def test_a_product_of_the_wrong_shape_names_both_and_dtypes_meet():
    T = CSRTensor(sp.eye_array(3, format="csr"))
    with pytest.raises(ValueError, match=r"sparse \(3, 3\) matrix and x of shape \(4,\)"):
        T @ torch.ones(4, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"x must be \(3,\) or \(3, k\)"):
        T @ torch.ones((3, 2, 2), dtype=torch.float64)
    single = T.astype(torch.float32)
    assert single.dtype == torch.float32 and T.dtype == torch.float64
    out = single @ torch.ones(3, dtype=torch.float64)  # cast to the matrix's dtype
    assert out.dtype == torch.float32
    np.testing.assert_array_equal(out.numpy(), np.ones(3))
    with pytest.raises(ValueError, match="needs shape"):
        CSRTensor((T.data, T.indices, T.indptr))
    with pytest.raises(ValueError, match=r"m \+ 1 = 3 pointers; got shapes \(3,\), \(3,\), "
                                         r"\(4,\)"):
        CSRTensor((T.data, T.indices, T.indptr), shape=(2, 3))
    with pytest.raises(ValueError, match="as many entries as indices"):
        CSRTensor((T.data[:2], T.indices, T.indptr), shape=(3, 3))
    with pytest.raises(TypeError, match="got ndarray"):
        CSRTensor(np.eye(3))
    moved = T.to("cpu")  # Tensor.to's device form
    assert moved.device.type == "cpu" and moved is not T
    np.testing.assert_array_equal(moved.toarray().numpy(), np.eye(3))


def test_the_backend_knows_them_and_moves_them_both_ways():
    M = sp.random_array((6, 4), density=0.5, format="csr", rng=np.random.default_rng(1))
    moved = backend.convert(M, "torch")
    assert isinstance(moved, CSRTensor)
    assert backend.of(moved).name == "torch" and backend.is_sparse(moved)
    assert backend.of(moved).sparse.issparse(moved) and not backend.is_sparse(moved.data)
    back = backend.to_host(moved)
    assert sp.issparse(back) and (back != M).nnz == 0
    assert backend.convert(moved, "numpy") is not None
    np.testing.assert_array_equal(backend.dense(moved).numpy(), M.toarray())
    like = torch.zeros(2, dtype=torch.float32)
    placed = backend.matrix_on(M, like)  # a layer's structure, in the values' dtype
    assert isinstance(placed, CSRTensor) and placed.dtype == torch.float32


def test_a_nan_in_a_csr_tensor_is_named_at_its_index():
    M = sp.csr_array(np.array([[1.0, 0, 2], [0, 3, np.nan]]))
    with pytest.raises(ValueError, match=r"W contains NaN or Inf \(first at index \(1, 2\)\)"):
        require_finite(CSRTensor(M), "W")
    require_finite(CSRTensor(sp.csr_array(np.eye(3))), "W")  # finite: nothing raised


def test_making_and_transposing_them_warns_nothing():
    M = sp.random_array((5, 5), density=0.5, format="csr", rng=np.random.default_rng(2))
    shared = M.copy()
    shared.data.setflags(write=False)  # a read-only structure (a shared scaled identity)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        T = CSRTensor(M)
        T.T @ torch.ones(5, dtype=torch.float64)
        read_only = CSRTensor(shared)
    assert not caught, [str(w.message) for w in caught]
    np.testing.assert_array_equal(read_only.toarray().numpy(), M.toarray())


def test_a_sparse_rnn_moves_to_pytorch_and_backpropagates_as_on_numpy():
    dense = pp.RNN.random([3, 6, 6], seed=0)
    U = [sp.csr_array(u * (np.abs(u) > 0.3)) for u in dense.U]
    rnn = pp.RNN(dense.W, U, dense.b, activation="tanh")
    xs = np.random.default_rng(1).standard_normal((7, 3, 2))
    moved = rnn.to("torch")
    assert all(isinstance(u, CSRTensor) for u in moved.U)
    reference = pp.backprop(rnn, xs, np.zeros((7, 6, 2)))
    for method in ("substitution", "cyclic-reduction", "jacobi"):
        g = pp.backprop(moved, torch.from_numpy(xs), torch.zeros((7, 6, 2), dtype=torch.float64),
                        method=method)
        for mine, theirs in zip(g.U, reference.U):
            np.testing.assert_allclose(backend.to_host(mine).toarray(), theirs.toarray(),
                                       rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(g.x.numpy(), reference.x, rtol=1e-12, atol=1e-15)
