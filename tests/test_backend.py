"""Backend dispatch: arrays decide; only propop/backend.py imports CuPy."""

import math
import pathlib
import re

import numpy as np
import pytest
import scipy.sparse as sp

import propop as pp
from propop import backend

PACKAGE = pathlib.Path(pp.__file__).parent


def test_numpy_and_scipy_arrays_select_the_cpu_backend():
    be = backend.of(np.zeros(2), sp.eye_array(2), None)
    assert be.name == "numpy" and be.xp is np and be.sparse is sp
    assert backend.namespace(np.ones(1)) is np
    assert backend.is_sparse(sp.eye_array(2)) and not backend.is_sparse(np.eye(2))
    assert backend.to_host(np.arange(3)) is not None


def test_only_backend_module_imports_cupy():
    offenders = [str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
                 if p.name != "backend.py"
                 and re.search(r"^\s*(import|from)\s+cupy", p.read_text(), re.M)]
    assert offenders == []


def test_declared_backends_of_array_generic_methods():
    generic = {s.name for s in pp.solvers.available() if "cupy" in s.backends}
    assert {"substitution", "jacobi", "richardson", "bicgstab"} <= generic
    # the SciPy names that cupyx.scipy.sparse.linalg also has (CuPy's reference page), only
    assert {n for n in generic if n.startswith(("scipy.", "pyamg."))} == {
        "scipy.gmres", "scipy.cgs", "scipy.lsmr"}


@pytest.mark.parametrize("kind", ["numpy", "torch", "array_api_strict"])
def test_all_finite_sees_nan_and_inf_and_survives_an_overflowing_sum(kind):
    big = np.full((4, 3), 1e308)  # finite entries whose sum overflows
    cases = {"finite": (np.arange(12.0).reshape(4, 3), True), "overflowing sum": (big, True),
             "nan": (np.where(np.eye(4, 3) > 0, np.nan, 1.0), False),
             "inf": (np.where(np.eye(4, 3) > 0, -np.inf, 1.0), False)}
    large = backend.SMALL_FINITE + 1  # the sum's path where a small array's flags are read
    cases.update({"large overflowing sum": (np.full(large, 1e308), True),
                  "large nan": (np.append(np.ones(large), np.nan), False),
                  "large inf, overflowing": (np.append(np.full(large, 1e308), np.inf), False)})
    for name, (a, expected) in cases.items():
        moved = backend.convert(a, kind)
        assert backend.all_finite(moved) is expected, name


@pytest.mark.parametrize("kind", ["numpy", "torch", "array_api_strict"])
def test_require_finite_names_the_first_bad_entry_and_passes_an_overflowing_sum(kind):
    from propop._checks import require_finite

    require_finite(backend.convert(np.full((4, 3), 1e308), kind), "big")  # finite: passes
    require_finite(np.arange(6).reshape(2, 3), "integers")  # no float dtype: passes
    bad = np.ones((4, 3))
    bad[2, 1], bad[3, 0] = np.inf, np.nan
    with pytest.raises(ValueError, match=r"bad contains NaN or Inf \(first at index \(2, 1\)\)"):
        require_finite(backend.convert(bad, kind), "bad")
    with pytest.raises(ValueError, match=r"sparse contains NaN or Inf \(first at index \(1, 2\)"):
        require_finite(sp.csr_array(([1.0, np.nan], ([0, 1], [0, 2])), shape=(2, 3)), "sparse")


@pytest.mark.parametrize("kind", ["numpy", "torch", "array_api_strict"])
def test_norms_over_the_last_axis_on_every_backend(kind):
    a = np.random.default_rng(0).standard_normal((5, 3, 2))
    ours = backend.norms(backend.convert(a, kind))
    assert backend.of(ours).name == kind
    np.testing.assert_allclose(backend.to_host(ours), np.sqrt((a**2).sum(axis=-1)),
                               rtol=1e-15)


@pytest.mark.parametrize("kind", ["numpy", "torch", "array_api_strict"])
def test_the_whole_norm_is_the_square_root_of_the_sum_of_squares_on_every_backend(kind):
    """Contiguous, strided, transposed, 0-d, empty, float32; no over- or underflow; NaN."""
    rng = np.random.default_rng(1)
    stack = rng.standard_normal((7, 6, 4))
    cases = [stack, stack[:, 2:5, ::2], stack.T, np.float64(3.0) * np.ones(()), np.ones((0, 3)),
             stack.astype(np.float32)]
    for a in cases:
        ours = backend.norm(backend.convert(np.asarray(a), kind))
        assert isinstance(ours, float)
        want = math.sqrt(float((np.asarray(a, dtype=np.float64) ** 2).sum()))
        assert ours == pytest.approx(want, rel=1e-6 if a.dtype == np.float32 else 1e-14)
    with np.errstate(over="ignore", under="ignore"):  # the squares would: scaled then
        assert backend.norm(backend.convert(np.array([1e200, 1.0]), kind)) == 1e200
        assert backend.norm(backend.convert(np.array([1e-200, 0.0]), kind)) == 1e-200
        assert backend.norm(backend.convert(np.array([np.inf, 1.0]), kind)) == math.inf
    assert math.isnan(backend.norm(backend.convert(np.array([1.0, np.nan]), kind)))


@pytest.mark.parametrize("kind", ["numpy", "torch", "array_api_strict"])
def test_unstack_gives_views_of_the_first_axis_on_every_backend(kind):
    a = backend.convert(np.arange(24.0).reshape(4, 3, 2), kind)
    views = backend.unstack(a)
    assert isinstance(views, tuple) and len(views) == 4
    for i, view in enumerate(views):
        np.testing.assert_array_equal(backend.to_host(view), np.arange(24.0).reshape(4, 3, 2)[i])
    views[2][...] = -1.0  # views: writing one writes the stack
    assert float(backend.to_host(a)[2].sum()) == -6.0


@pytest.mark.parametrize("kind", ["numpy", "torch", "array_api_strict"])
@pytest.mark.parametrize("shape", [(7, 3), (7, 3, 1), (7, 3, 4)])  # vectors, a column, a batch
def test_a_product_over_time_is_each_steps_product(kind, shape):
    """``over_time(M, Z)[s] = M @ Z[s]``, one sample kept as a column included (one GEMM)."""
    pytest.importorskip(kind)
    rng = np.random.default_rng(3)
    M, Z = rng.standard_normal((5, 3)), rng.standard_normal(shape)
    ours = backend.over_time(backend.convert(M, kind), backend.convert(Z, kind))
    assert tuple(ours.shape) == (7, 5) + shape[2:]
    np.testing.assert_allclose(backend.to_host(ours), np.stack([M @ z for z in Z]),
                               rtol=1e-14, atol=1e-15)
    sparse = backend.over_time(sp.csr_array(M), Z)  # a sparse one: the steps side by side
    np.testing.assert_allclose(sparse, np.stack([M @ z for z in Z]), rtol=1e-14, atol=1e-15)


def test_a_methods_parameters_are_read_once_and_stay_its_own():
    from propop.solvers.method import FunctionMethod

    def mine(system, *, rtol=None, x0=None, own=3):
        return None

    def other(system, *, tol=1.0):
        return None

    first, second = FunctionMethod(mine), FunctionMethod(other)
    assert [p.name for p in first.parameters] == ["rtol", "x0", "own"]
    assert [p.name for p in second.parameters] == ["tol"]
    assert first.names("x0") and not second.names("x0")
    assert first.parameters is not first.parameters  # a fresh list each time: callers may edit


@pytest.mark.parametrize(("M", "x", "out"), [
    ((8, 8), (8, 1), lambda s: np.empty(s)),  # dot's case
    ((8, 8), (8,), lambda s: np.empty(s)),
    ((8, 8), (8, 3), lambda s: np.empty((s[1], s[0])).T),  # a strided out: matmul's
    ((8, 8), (8, 3), lambda s: np.empty(s, dtype=np.float32)),  # another dtype: matmul's
    ((4, 8, 8), (4, 8, 2), lambda s: np.empty(s)),  # a stack: matmul's
    ((8, 8), (5, 8, 1), lambda s: np.empty(s)),  # steps of one column: one GEMM
    ((8, 8), (5, 8, 1), lambda s: np.empty((5, 12, 1))[:, 2:10, :])])  # of a layer's rows
def test_numpys_product_into_out_is_matmuls_in_every_case(M, x, out):
    """``matmul_out(numpy)`` takes ``dot`` where it may and ``matmul`` elsewhere: same result."""
    rng = np.random.default_rng(0)
    M, x = rng.standard_normal(M), rng.standard_normal(x)
    expected = np.matmul(M, x)
    target = out(expected.shape)
    result = backend.matmul_out(np)(M, x, out=target)
    assert result is target or np.shares_memory(result, target)
    np.testing.assert_allclose(target, expected, rtol=1e-6 if target.dtype == np.float32
                               else 1e-15, atol=1e-12)


@pytest.mark.parametrize("accumulate", [False, True])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize(("M", "x", "out"), [
    (lambda M: M, lambda n: (n, 3), lambda s, d: np.empty(s, d)),  # BLAS in place: gemm
    (lambda M: M, lambda n: (n,), lambda s, d: np.empty(s, d)),  # a vector: gemv
    (lambda M: M.T, lambda n: (n, 3), lambda s, d: np.empty(s, d)),  # a Fortran-ordered M
    (lambda M: M[:, ::2], lambda n: (n, 3), lambda s, d: np.empty(s, d)),  # strided: copied
    (lambda M: M, lambda n: (n, 3), lambda s, d: np.empty((s[1], s[0]), d).T),  # BLAS can't
    (lambda M: M, lambda n: (n, 3), lambda s, d: np.empty(s, "float64" if d == "float32"
                                                          else "float32")),
    (lambda M: M, lambda n: (n, 1), lambda s, d: np.empty(s, d)[::-1, :]),  # a reversed out
    (lambda M: M, lambda n: (2, n, 3), lambda s, d: np.empty(s, d))])  # a stack: no one call
def test_a_matrix_writer_is_the_product_in_every_layout(M, x, out, dtype, accumulate):
    """``matmul_writer(M)`` calls BLAS on NumPy floats: never a missed write, any layout."""
    rng = np.random.default_rng(0)
    M = M(rng.standard_normal((8, 8)).astype(dtype))
    x = rng.standard_normal(x(M.shape[1])).astype(dtype)
    target = out((M @ x).shape, dtype)
    target[...] = rng.standard_normal(target.shape) if accumulate else np.nan  # beta 0: unread
    before = target.astype(np.float64) if accumulate else 0.0
    write = backend.matmul_writer(M, accumulate=accumulate)
    assert write(x, out=target) is target
    single = np.float32 in (M.dtype, target.dtype)
    np.testing.assert_allclose(target, M.astype(np.float64) @ x + before,
                               rtol=1e-5 if single else 1e-14, atol=1e-5 if single else 1e-14)


@pytest.mark.parametrize("accumulate", [False, True])
@pytest.mark.parametrize("out", [
    lambda s, d: np.empty(s, d),  # gemv writes the column in place
    lambda s, d: np.empty(s, d)[::-1, :],  # a reversed column: the result copied in
    lambda s, d: np.empty((s[0], 3), d)[:, 1:2],  # a strided column
    lambda s, d: np.empty(s, "float32" if d == "float64" else "float64")])  # another dtype
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_one_column_of_a_larger_matrix_is_a_vector_to_blas(out, dtype, accumulate):
    """From 32 columns up one sample's column goes to ``gemv``: the product, in any ``out``."""
    rng = np.random.default_rng(2)
    M = rng.standard_normal((40, 48)).astype(dtype)
    x = rng.standard_normal((48, 1)).astype(dtype)
    target = out((40, 1), dtype)
    target[...] = rng.standard_normal(target.shape) if accumulate else np.nan
    before = target.astype(np.float64) if accumulate else 0.0
    assert backend.matmul_writer(M, accumulate=accumulate)(x, out=target) is target
    single = np.float32 in (M.dtype, target.dtype)
    np.testing.assert_allclose(target, M.astype(np.float64) @ x + before,
                               rtol=1e-5 if single else 1e-13, atol=1e-5 if single else 1e-13)
    strided = np.repeat(x, 3, axis=1)[:, 1:2]  # x as a strided column: read, not misread
    np.testing.assert_allclose(backend.matmul_writer(M)(strided, out=np.empty((40, 1), dtype)),
                               M.astype(np.float64) @ x, rtol=1e-5 if single else 1e-13,
                               atol=1e-5 if single else 1e-13)
    for rows in (47, 49):  # gemv alone would read a longer x's head
        with pytest.raises(ValueError, match=rf"matmul of a \(40, 48\) matrix and x of shape "
                                             rf"\({rows}, 1\) into out of shape \(40, 1\)"):
            backend.matmul_writer(M)(rng.standard_normal((rows, 1)).astype(dtype),
                                     out=np.zeros((40, 1), dtype))


@pytest.mark.parametrize(("shape", "density", "columns"), [
    ((300, 300), 0.05, 64),  # a dense enough pattern, many products: v z^T read there
    ((40, 30), 0.3, 5),  # dense enough, but few products: each entry's rows gathered
    ((200, 300), 0.005, 900),  # a sparse pattern: gathered
    ((2049, 2048), 0.02, 4),  # dense enough, but v z^T too large to form: gathered
    ((40, 30), 0.3, None),  # one sample: its products gathered
])
def test_weight_gradients_on_a_pattern_are_the_dense_ones_there(shape, density, columns):
    """``outer_on_pattern``: ``v z^T`` at the stored entries, in the weight's own pattern."""
    rng = np.random.default_rng(4)
    W = sp.random_array(shape, density=density, format="csr", rng=rng)
    W.sort_indices()
    v = rng.standard_normal(shape[0] if columns is None else (shape[0], columns))
    z = rng.standard_normal(shape[1] if columns is None else (shape[1], columns))
    got = backend.outer_on_pattern(W, v, z)
    np.testing.assert_array_equal(got.indptr, W.indptr)
    np.testing.assert_array_equal(got.indices, W.indices)
    full = np.outer(v, z) if columns is None else v @ z.T
    rows = np.repeat(np.arange(shape[0]), np.diff(W.indptr))
    np.testing.assert_allclose(got.data, full[rows, W.indices], rtol=1e-13, atol=1e-14)


def test_a_matrix_writer_adds_on_every_backend():
    torch = pytest.importorskip("torch")
    M, x, y = (torch.arange(k, dtype=torch.float64) for k in (12, 4, 3))
    M = M.reshape(3, 4)
    target = y.clone()
    backend.matmul_writer(M, plain=True, accumulate=True)(x, out=target)
    torch.testing.assert_close(target, M @ x + y, rtol=1e-15, atol=0)


@pytest.mark.parametrize("accumulate", [False, True])
def test_a_sparse_matrix_writer_writes_or_adds_its_product(accumulate):
    """A sparse ``M`` (no BLAS call): the product written into ``out``, or added to it."""
    M = sp.random_array((6, 5), density=0.4, format="csr", rng=np.random.default_rng(0))
    x, y = np.random.default_rng(1).standard_normal((2, 5, 2))[0], np.ones((6, 2))
    target = y.copy()
    backend.matmul_writer(M, accumulate=accumulate)(x, out=target)
    np.testing.assert_allclose(target, M.toarray() @ x + (y if accumulate else 0), rtol=1e-14)


def test_a_stack_is_found_only_where_the_arrays_are_its_entries_in_order():
    torch = pytest.importorskip("torch")
    S = np.random.default_rng(0).standard_normal((4, 3, 3))
    assert backend.stack_of(list(S)) is S
    assert backend.stack_of(list(S)[::-1]) is None  # another order
    assert backend.stack_of([S[0].copy(), *S[1:]]) is None  # one copied
    assert backend.stack_of(list(S[:3])) is None  # part of a stack
    assert backend.stack_of(list(S.transpose(0, 2, 1))) is None  # the stack not C-ordered
    assert backend.stack_of(list(np.stack([S, S])[0])) is None  # entries of a deeper stack
    T = torch.tensor(S)
    assert backend.stack_of(list(T)) is T and backend.stack_of(list(T)[1:]) is None
    assert backend.stack_of([T[0].clone(), *T[1:]]) is None


class _DevicelessMatrix(np.ndarray):
    """An array whose ``device`` raises, as a ``cupyx.scipy.sparse`` matrix's does."""

    @property
    def device(self):
        raise NotImplementedError


def test_like_and_device_do_not_ask_a_sparse_gpu_matrix_for_its_device():
    """A ``cupyx.scipy.sparse`` matrix raises NotImplementedError for ``.device`` (H200)."""
    M = np.eye(2).view(_DevicelessMatrix)
    assert backend.device(M) is None
    np.testing.assert_array_equal(backend.like([1, 2], M), [1, 2])


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("form", ["stack", "list", "fortran", "torch"])
def test_a_matrix_adder_adds_each_product_in_its_turn(form, dtype):
    """``matmul_adder``: ``y_k += M_k x_k`` for a stack, a list of any layout, or tensors."""
    rng = np.random.default_rng(1)
    stack = rng.standard_normal((5, 4, 4)).astype(dtype)
    x, y = rng.standard_normal((5, 4, 3)).astype(dtype), rng.standard_normal((5, 4, 3))
    y = y.astype(dtype)
    matrices = {"stack": stack, "list": list(stack),
                "fortran": [np.asfortranarray(M) for M in stack], "torch": None}[form]
    xs, ys = x, y.copy()
    if form == "torch":
        torch = pytest.importorskip("torch")
        matrices, xs, ys = list(torch.from_numpy(stack)), torch.from_numpy(x), \
            torch.from_numpy(y.copy())
    add, operands = backend.matmul_adder(matrices)
    for A, x_k, y_k in zip(operands, xs, ys):
        assert add(A, x_k, out=y_k) is y_k
    single = dtype == "float32"
    np.testing.assert_allclose(np.asarray(ys), stack @ x + y, rtol=1e-5 if single else 1e-14,
                               atol=1e-5 if single else 1e-14)


@pytest.mark.parametrize(("x", "out"), [
    ((5,), (4,)),  # a longer x: gemv alone would read its head
    ((3,), (5,)),  # a longer out: gemv alone would leave its tail
    ((3, 2), (4,)),  # a matrix into a vector
    ((5, 2), (4, 2)), ((3, 2), (5, 2)), ((3,), (4, 2))])
@pytest.mark.parametrize("adder", [False, True])
def test_a_matrix_writer_refuses_shapes_that_do_not_match_by_name(x, out, adder):
    """Shapes that do not match are a ``ValueError`` naming them, never a partial product."""
    M = np.ones((4, 3))
    if adder:
        add, operands = backend.matmul_adder([M])
        write = lambda x, out: add(next(operands), x, out=out)  # noqa: E731
    else:
        write = backend.matmul_writer(M)
    with pytest.raises(ValueError, match=r"matmul of a \(4, 3\) matrix and x of shape "
                                         rf"\({x[0]}, ?{x[1] if len(x) > 1 else ''}\)"):
        write(np.ones(x), out=np.zeros(out))


@pytest.mark.parametrize(("left", "right"), [
    ((50, 16, 2, 2), (50, 16, 2, 2)),  # the reduction's products of cores
    ((50, 1, 2, 2), (50, 16, 2, 1)),  # a shared core times every sample's column
    ((50, 16, 2, 2), (2, 2)),  # a stack times one matrix
    ((7, 1, 1), (7, 1, 1)),  # scalar blocks
    ((7, 2, 1), (7, 1, 2)),  # an outer product per block
    ((7, 1, 2), (7, 2, 2)),
])
@pytest.mark.parametrize("dtypes", [("float64", "float64"), ("float32", "float32"),
                                    ("float32", "float64")])
@pytest.mark.parametrize("chunk", [None, 40])  # 40 blocks: many chunks, the last one short
def test_block_matmul_agrees_with_matmul_on_small_blocks(left, right, dtypes, chunk,
                                                         monkeypatch):
    """Entry by entry on NumPy's blocks of at most 2 x 2: matmul's values, shape and dtype."""
    if chunk is not None:
        monkeypatch.setattr(backend, "BLOCK_CHUNK", chunk)
    rng = np.random.default_rng(0)
    A, B = (rng.standard_normal(s).astype(d) for s, d in zip((left, right), dtypes))
    got, want = backend.block_matmul(A, B), A @ B
    assert got.shape == want.shape and got.dtype == want.dtype
    bound = 4 * np.finfo(got.dtype).eps * (np.abs(A) @ np.abs(B))  # a sum's rounding
    assert (np.abs(got - want) <= bound).all()


@pytest.mark.parametrize(("left", "right", "view"), [
    ((6, 5, 3, 4), (6, 1, 4, 2), None),  # per-sample blocks times a shared core
    ((5, 3, 4), (1, 4, 3), None),
    ((2, 6, 5, 3, 4), (2, 6, 1, 4, 2), None),
    ((12, 5, 3, 4), (6, 1, 4, 2), "every other block"),  # rows of a level: still one stack
    ((6, 3, 5, 4), (6, 1, 4, 2), "transposed"),  # blocks not one under another: matmul
    ((6, 5, 3, 4), (6, 5, 4, 2), None),  # nothing shared
])
def test_block_matmul_with_a_shared_right_block_agrees_with_matmul(left, right, view):
    """Larger blocks times a block shared over the samples: matmul's values and shape."""
    rng = np.random.default_rng(0)
    A, B = rng.standard_normal(left), rng.standard_normal(right)
    if view == "every other block":
        A = A[::2]
    elif view == "transposed":
        A = A.transpose(0, 2, 1, 3)
    got, want = backend.block_matmul(A, B), A @ B
    assert got.shape == want.shape and got.dtype == want.dtype
    bound = 8 * np.finfo(got.dtype).eps * (np.abs(A) @ np.abs(B))  # a sum's rounding
    assert (np.abs(got - want) <= bound).all()


@pytest.mark.parametrize("group", [1, 2, 3, 7, 100])  # blocks a product: 7 = 3 x 2 + 1
@pytest.mark.parametrize("view", [None, "every other block"])
def test_a_shared_right_block_multiplies_groups_of_blocks(group, view, monkeypatch):
    """Groups of ``g`` blocks a product and a last shorter one: matmul's values everywhere."""
    monkeypatch.setattr(backend, "SHARED_ROWS_MNK", group * 3 * 4 * 2)  # n k m = 3 * 4 * 2
    rng = np.random.default_rng(0)
    A, B = rng.standard_normal((4, 7, 3, 4)), rng.standard_normal((4, 1, 4, 2))
    if view:
        A, B = rng.standard_normal((8, 7, 3, 4))[::2], B
    got, want = backend.block_matmul(A, B), A @ B
    assert got.shape == want.shape
    bound = 8 * np.finfo(got.dtype).eps * (np.abs(A) @ np.abs(B))
    assert (np.abs(got - want) <= bound).all()


@pytest.mark.parametrize(("left", "right"), [
    ((3, 4, 0, 5), (3, 1, 5, 3)), ((3, 4, 3, 0), (3, 1, 0, 3)), ((3, 4, 3, 5), (3, 1, 5, 0))])
def test_a_shared_right_block_of_empty_blocks_gives_matmul_s_empty_product(left, right):
    """Blocks with no rows, inner or outer size: matmul's shape and zeros, no division."""
    A, B = np.ones(left), np.ones(right)
    got, want = backend.block_matmul(A, B), A @ B
    assert got.shape == want.shape and (got == want).all()


@pytest.mark.parametrize(("left", "scale", "right"), [
    ((6, 1, 4, 4), (6, 5, 4), (6, 1, 4, 4)),  # a level's pairs: shared cores, per-sample slopes
    ((6, 5, 4, 4), (6, 5, 4), (6, 1, 4, 4)),  # per-sample cores times a shared one
    ((6, 5, 4, 4), (6, 5, 4), (6, 5, 4, 4)),  # nothing shared
    ((6, 1, 3, 4), (6, 1, 4), (6, 1, 4, 2)),  # rectangular blocks
    ((6, 3, 2, 2), (6, 3, 2), (6, 3, 2, 2)),  # small blocks: entry by entry
    ((0, 3, 4, 4), (0, 3, 4), (0, 1, 4, 4)),  # no pairs
])
@pytest.mark.parametrize("chunk", [None, 200, 1300])  # bytes: a pair a chunk, or two and one
@pytest.mark.parametrize("dtypes", [("float64",) * 3, ("float32",) * 3,
                                    ("float32", "float64", "float32")])
def test_scaled_block_matmul_agrees_with_the_expression(left, scale, right, chunk, dtypes,
                                                        monkeypatch):
    """``(A diag(s)) B`` by chunks: the expression's values, shape and dtype, also on views."""
    if chunk is not None:
        monkeypatch.setattr(backend, "SCALED_CHUNK", chunk)
    rng = np.random.default_rng(0)
    A, s, B = (rng.standard_normal((2 * k[0],) + k[1:]).astype(d)[::2]  # every other block
               for k, d in zip((left, scale, right), dtypes))
    got, want = backend.scaled_block_matmul(A, s, B), (A * s[..., None, :]) @ B
    assert got.shape == want.shape and got.dtype == want.dtype
    bound = 8 * np.finfo(got.dtype).eps * (np.abs(A * s[..., None, :]) @ np.abs(B))
    assert (np.abs(got - want) <= bound).all()


def test_a_product_into_an_out_it_cannot_view_as_rows_raises():
    """A shared right block writes ``out`` as rows: an ``out`` that is no such view is refused."""
    rng = np.random.default_rng(0)
    A, B = rng.standard_normal((3, 4, 2, 3)), rng.standard_normal((3, 1, 3, 3))
    out = np.empty((3, 4, 3, 2)).transpose(0, 1, 3, 2)  # the product's shape, not C-ordered
    with pytest.raises(ValueError, match="avoid creating a copy"):
        backend._block_matmul_into(A, B, out)
    out = np.empty((3, 4, 2, 3))
    np.testing.assert_allclose(backend._block_matmul_into(A, B, out), A @ B, rtol=1e-13)


def test_scaled_block_matmul_leaves_other_arrays_and_shapes_to_the_expression():
    """PyTorch tensors and stacks whose first axes differ: the expression itself, exactly."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    A, s, B = rng.standard_normal((4, 2, 3, 3)), rng.standard_normal((4, 2, 3)), \
        rng.standard_normal((1, 1, 3, 3))  # B broadcast over the pairs
    np.testing.assert_array_equal(backend.scaled_block_matmul(A, s, B),
                                  (A * s[..., None, :]) @ B)
    T, t = (torch.as_tensor(a) for a in (A, s))
    assert torch.equal(backend.scaled_block_matmul(T, t, T), (T * t[..., None, :]) @ T)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("view", [False, True])
def test_outer_products_are_each_blocks_vector_times_vector(dtype, view):
    """``V[k] Z[k]^T`` by einsum on NumPy: broadcasting's values, shape and dtype; on views too."""
    rng = np.random.default_rng(0)
    V, Z = rng.standard_normal((14, 5)).astype(dtype), rng.standard_normal((14, 3)).astype(dtype)
    if view:  # every other vector, as a stack's layers are read
        V, Z = V[::2], Z[::2]
    got = backend.outer_products(V, Z)
    assert got.shape == (len(V), 5, 3) and got.dtype == np.dtype(dtype)
    for k in range(len(V)):  # each block one product of two numbers per entry: exact
        np.testing.assert_array_equal(got[k], np.outer(V[k], Z[k]))


def test_outer_products_of_other_arrays_broadcast():
    torch = pytest.importorskip("torch")
    V, Z = torch.randn(4, 3, dtype=torch.float64), torch.randn(4, 2, dtype=torch.float64)
    assert torch.equal(backend.outer_products(V, Z), V[:, :, None] * Z[:, None, :])


def test_block_matmul_leaves_larger_blocks_other_arrays_and_bad_shapes_to_matmul():
    """Larger blocks, one matrix alone and PyTorch tensors are ``@``'s; so are its errors."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    A, B = rng.standard_normal((5, 3, 3)), rng.standard_normal((5, 3, 3))
    np.testing.assert_array_equal(backend.block_matmul(A, B), A @ B)
    M, x = rng.standard_normal((2, 2)), rng.standard_normal((2, 1))
    np.testing.assert_array_equal(backend.block_matmul(M, x), M @ x)
    S, v = rng.standard_normal((5, 2, 2)), rng.standard_normal(2)  # a vector: @'s meaning
    np.testing.assert_array_equal(backend.block_matmul(S, v), S @ v)
    np.testing.assert_array_equal(backend.block_matmul(v, S), v @ S)
    T = torch.as_tensor(rng.standard_normal((5, 2, 2)))
    assert torch.equal(backend.block_matmul(T, T), T @ T)
    with pytest.raises(ValueError, match="mismatch"):
        backend.block_matmul(rng.standard_normal((5, 2, 2)), rng.standard_normal((5, 1, 2)))


@pytest.mark.parametrize("kind", ["numpy", "torch", "array_api_strict"])
def test_eps_is_each_dtypes_own_machine_epsilon_in_every_library(kind):
    """Remembered per dtype object: float32 and float64 of any library, never mixed up."""
    import warnings

    for name, expected in (("float64", np.finfo(np.float64).eps),
                           ("float32", np.finfo(np.float32).eps)):
        a = backend.convert(np.zeros(2, dtype=name), kind)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the strict namespace warns at a mixed compare
            assert backend.eps(a.dtype) == expected, (kind, name)
            assert backend.eps(a.dtype) == expected, (kind, name)  # and when remembered
