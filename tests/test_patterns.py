"""Jacobians of a fixed pattern with a layer's current values (``propop.layers.patterns``).

The convolution's Jacobian and its transpose against PyTorch autograd's dense
Jacobian of ``F.conv2d``; ``kron(I_T, W)`` against NumPy's ``kron``; each on NumPy
and on PyTorch, where the entries are gathered on the kernel's device: no trip
through the host, the index arrays copied once, a kernel written in place read.
"""

import numpy as np
import pytest
import scipy.sparse as sp

import propop as pp
from propop import backend
from propop import layers as L
from propop.layers.patterns import Pattern, diagonal, kron_identity
from propop.systems import graph as graph_systems
from cases import gpu_backends

torch = pytest.importorskip("torch")
F = torch.nn.functional

CONVS = {  # (input_shape, W shape, options)
    "plain": ((2, 5, 6), (3, 2, 3, 3), {}),
    "strided-padded": ((2, 7, 7), (4, 2, 3, 2), {"stride": 2, "padding": 1}),
    "dilated-grouped": ((4, 8, 8), (6, 2, 3, 3), {"padding": 2, "dilation": 2,
                                                  "groups": 2}),
}


def conv_case(name):
    """``(layer, dense Jacobian)``: the latter by autograd through ``F.conv2d``."""
    shape, wshape, options = CONVS[name]
    W = np.random.default_rng(0).standard_normal(wshape)
    layer = L.Conv2d(W, input_shape=shape, **options)
    weight = torch.tensor(W)
    jacobian = torch.autograd.functional.jacobian(
        lambda x: F.conv2d(x.reshape((1,) + shape), weight, **options).reshape(-1),
        torch.zeros(int(np.prod(shape)), dtype=torch.float64))
    return layer, jacobian.numpy()


def transposed(layer, sizes):
    """The ``J_i^T`` as a graph's backward couplings form them: the transposed patterns."""
    return [pattern.T.matrix(values) for pattern, values in layer.patterns(sizes)]


def canonical(M):
    host = backend.to_host(M)
    return sp.issparse(host) and host.format == "csr" and host.has_canonical_format


@pytest.mark.parametrize(("kind", "device"), [("numpy", None), ("torch", None),
                                              *gpu_backends()])
@pytest.mark.parametrize("name", list(CONVS))
def test_a_convolutions_jacobian_and_its_transpose_are_autograds(name, kind, device):
    layer, reference = conv_case(name)
    layer = layer.to(kind, device)
    sizes = [reference.shape[1]]
    (J,), (back,) = layer.jacobians(sizes), transposed(layer, sizes)
    assert backend.of(J).name == backend.of(back).name == kind
    assert canonical(J) and canonical(back)
    np.testing.assert_array_equal(backend.to_host(J).toarray(), reference)
    np.testing.assert_array_equal(backend.to_host(back).toarray(), reference.T)


def test_on_pytorch_the_kernel_is_gathered_where_it_is_and_read_at_each_call(monkeypatch):
    """No host copy of the kernel; the pattern's indices copied there once; in place seen."""
    layer, reference = conv_case("dilated-grouped")
    layer = layer.to("torch")
    sizes = [reference.shape[1]]
    layer.jacobians(sizes), transposed(layer, sizes)  # the indices copied here
    sent, copied = [], []
    to_host, like = backend.to_host, backend.like
    monkeypatch.setattr(backend, "to_host", lambda a: sent.append(a) or to_host(a))
    monkeypatch.setattr(backend, "like", lambda v, a: copied.append(v) or like(v, a))
    layer.W.mul_(2.0)  # written in place: the next Jacobians read it
    (J,), (back,) = layer.jacobians(sizes), transposed(layer, sizes)
    assert not sent and not copied
    assert J.data.device == layer.W.device
    monkeypatch.undo()
    np.testing.assert_array_equal(J.toarray().numpy(), 2 * reference)
    np.testing.assert_array_equal(back.toarray().numpy(), 2 * reference.T)


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_token_dense_jacobians_are_kron_of_the_identity_and_w(kind):
    rng = np.random.default_rng(1)
    W = rng.standard_normal((5, 3))
    layer = L.TokenDense(W, tokens=4).to(kind)
    (J,), (back,) = layer.jacobians([12]), transposed(layer, [12])
    assert canonical(J) and canonical(back)
    np.testing.assert_array_equal(backend.to_host(J).toarray(), np.kron(np.eye(4), W))
    np.testing.assert_array_equal(backend.to_host(back).toarray(), np.kron(np.eye(4), W.T))


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_a_scalings_jacobian_is_its_diagonal_and_its_own_transpose(kind):
    rng = np.random.default_rng(2)
    layer = L.ElementwiseAffine(rng.standard_normal((2, 3)), repeats=2).to(kind)
    expected = np.diag(np.tile(backend.to_host(layer.w).reshape(-1), 2))
    (J,), (back,) = layer.jacobians([12]), transposed(layer, [12])
    for M in (J, back):
        assert canonical(M) and backend.of(M).name == kind
        np.testing.assert_array_equal(backend.to_host(M).toarray(), expected)


def test_a_gather_reads_each_position_once_and_a_transpose_twice_is_the_pattern():
    with pytest.raises(ValueError, match="distinct positions"):
        Pattern.of_entries(np.array([0, 0]), np.array([1, 1]), np.array([0, 1]), (2, 2), 2)
    pattern = kron_identity(3, 2, 4)
    twice = pattern.T.T
    for a, b in ((pattern.source, twice.source), (pattern.indices, twice.indices),
                 (pattern.indptr, twice.indptr)):
        np.testing.assert_array_equal(a, b)
    assert diagonal(5).T is diagonal(5)


@pytest.mark.parametrize(("kind", "device"), [("numpy", None), ("torch", None),
                                              *gpu_backends()])
def test_a_pattern_times_a_selection_is_the_product_its_transpose_too(kind, device):
    """``J A`` for a convolution and a fixed sparse ``A``: entries that are sums of weights."""
    layer, reference = conv_case("strided-padded")
    A = sp.random_array((reference.shape[1], 11), density=0.3, format="csr",
                        rng=np.random.default_rng(4))
    assert (np.diff(A.tocsc().indptr) > 1).all()  # every column sums several of J's
    pattern = layer._pattern.times(A)
    assert sp.issparse(pattern.source)
    W = backend.convert(layer.W, kind, device)
    for M, expected in ((pattern.matrix(W), reference @ A), (pattern.T.matrix(W),
                                                              (reference @ A).T)):
        assert canonical(M) and backend.of(M).name == kind
        np.testing.assert_allclose(backend.to_host(M).toarray(), expected, rtol=1e-14,
                                   atol=1e-14)
    with pytest.raises(ValueError, match="pattern"):
        layer._pattern.matrix(np.ones(3))
    with pytest.raises(ValueError, match=r"pattern times a \(3, 11\) matrix"):
        layer._pattern.times(sp.random_array((3, 11), density=0.5, format="csr"))


def test_a_cnns_backward_couplings_on_pytorch_make_no_trip_through_the_host(monkeypatch):
    """Convolutions and batch norms gathered on the device; equal to NumPy's couplings."""
    from test_graph_backends import imported

    _, graph, _, _ = imported("conv2d")
    moved = graph.to("torch")
    like = torch.ones((graph.input_size, 3), dtype=torch.float64)
    graph_systems._couplings(moved, like, transpose=True)  # the structural ones, kept
    sent = []
    to_host = backend.to_host
    monkeypatch.setattr(backend, "to_host", lambda a: sent.append(a) or to_host(a))
    couplings = graph_systems._couplings(moved, like, transpose=True)
    assert not [a for a in sent if isinstance(a, torch.Tensor) or hasattr(a, "tensor")]
    monkeypatch.undo()
    assert any(isinstance(layer, L.Conv2d) for layer in graph.layers.values())
    host = graph_systems._couplings(graph, np.ones((graph.input_size, 3)), transpose=True)
    assert host.keys() == couplings.keys()
    for key, M in host.items():
        np.testing.assert_array_equal(backend.dense(backend.to_host(couplings[key])),
                                      backend.dense(M))
    trace = moved.forward(torch.from_numpy(np.ones((graph.input_size, 3))))
    np.testing.assert_allclose(trace.output.numpy(), graph.forward(
        np.ones((graph.input_size, 3))).output, rtol=1e-13, atol=1e-14)
    assert pp.backend.of(trace.output).name == "torch"
