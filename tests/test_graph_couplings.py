"""A graph's couplings: the structural ones kept, the weights' made from their current values.

Every system is judged against the graph's sequential reference
(:meth:`propop.Graph.backward`, which reads each layer's Jacobians itself) or
against SciPy's own construction, never against a system of the same cache.
"""

import numpy as np
import pytest
import scipy.sparse as sp

import propop as pp
from propop import layers as L
from propop.systems import graph as graph_systems
from cases import relative_error

TOKENS, WIDTH = 3, 4


def token_graph(seed=0):
    """Tokens through a TokenDense, a permutation, a tanh, a concatenation and a sum."""
    rng = np.random.default_rng(seed)
    n = TOKENS * WIDTH
    swap = np.arange(n).reshape(TOKENS, WIDTH)[::-1].reshape(-1)
    graph = pp.Graph(n)
    graph.add("dense", L.TokenDense(rng.standard_normal((WIDTH, WIDTH)), rng.standard_normal(
        WIDTH), tokens=TOKENS), "input")
    graph.add("swap", L.Windows(swap, n), "dense")
    graph.add("act", L.Activation("tanh"), "swap")
    graph.add("pair", L.Concat(), ["act", "input"])
    graph.add("mix", L.Dense(rng.standard_normal((n, 2 * n))), "pair")
    graph.add("out", L.Add(), ["mix", "dense"])
    return graph


def backward_blocks(graph, x, eps):
    """The substitution's blocks of the graph's backward system, and the reference's."""
    trace = graph.forward(x)
    system = pp.backward_system(graph, trace, eps)
    solution = pp.solve(system, "substitution")
    assert solution.converged
    return graph.unstack(system, solution.x), graph.backward(trace, [eps])


def assert_blocks_agree(graph, x, eps):
    ours, reference = backward_blocks(graph, x, eps)
    for name, a, b in zip(graph.order, ours, reference):
        assert relative_error(a, b) < 1e-13, name


def test_weights_written_in_place_are_read_by_the_next_system():
    graph, rng = token_graph(), np.random.default_rng(1)
    x, eps = rng.standard_normal((graph.input_size, 5)), rng.standard_normal((graph.sizes[-1], 5))
    assert_blocks_agree(graph, x, eps)
    first = graph_systems._couplings(graph, x, transpose=True)
    for node in ("dense", "mix"):  # an optimiser's step: the same arrays, new values
        W = graph.layers[node].W
        np.copyto(W, rng.standard_normal(W.shape))
    assert_blocks_agree(graph, x, eps)
    second = graph_systems._couplings(graph, x, transpose=True)
    index = {n: i for i, n in enumerate(graph.order)}
    kept = {(index["swap"], index["dense"]), (index["pair"], index["act"]),
            (index["pair"], index["input"]), (index["out"], index["mix"]),
            (index["out"], index["dense"]), (index["act"], index["swap"])}
    made = {(index["dense"], index["input"]), (index["mix"], index["pair"])}
    assert set(first) == set(second) == kept | made
    for key in kept:  # structure: the same matrix, made once
        assert second[key] is first[key], key
    for key in made:  # from the weights: made again, the new transpose
        assert second[key] is not first[key]
    W = graph.layers["dense"].W
    new = second[(index["dense"], index["input"])]
    assert abs(new - sp.kron(sp.eye_array(TOKENS), W).T).max() == 0


def test_a_layer_replaced_in_the_graph_is_not_read_from_the_kept_couplings():
    graph, rng = token_graph(), np.random.default_rng(2)
    x, eps = rng.standard_normal((graph.input_size, 3)), rng.standard_normal((graph.sizes[-1], 3))
    assert_blocks_agree(graph, x, eps)
    n = graph.input_size
    graph.layers["swap"] = L.Windows(rng.permutation(n), n)  # the same sizes, other entries
    assert_blocks_agree(graph, x, eps)


def test_the_kept_couplings_go_with_their_graph():
    import gc
    import weakref

    graph = token_graph()
    graph_systems._couplings(graph, np.ones((graph.input_size, 2)))
    assert graph in graph_systems._KEPT
    gone = weakref.ref(graph)
    del graph
    gc.collect()
    assert gone() is None  # what the cache keeps does not keep the graph alive


def test_the_kept_couplings_are_kept_per_backend():
    torch = pytest.importorskip("torch")
    graph = token_graph()
    host = np.ones((graph.input_size, 2))
    for like in (host, torch.ones((graph.input_size, 2), dtype=torch.float64), host):
        on_torch = isinstance(like, torch.Tensor)
        for M in graph_systems._couplings(graph, like, transpose=True).values():
            assert pp.backend.of(M).name == ("torch" if on_torch else "numpy")
            assert not on_torch or M.dtype == torch.float64


@pytest.mark.parametrize("dim", [None, 0, 1, -1])
def test_concat_forward_places_the_inputs_as_its_jacobians_say(dim):
    rng = np.random.default_rng(3)
    shapes = [(2, 3), (2, 5)] if dim in (1, -1) else [(2, 3), (4, 3)]
    layer = L.Concat() if dim is None else L.Concat(dim=dim, shapes=shapes)
    inputs = [rng.standard_normal((int(np.prod(s)), 4)) for s in shapes]
    J = layer.jacobians([x.shape[0] for x in inputs])
    expected = sum(Ji @ x for Ji, x in zip(J, inputs))
    np.testing.assert_array_equal(layer.forward(inputs), expected)
    one = layer.forward([x[:, 0] for x in inputs])
    np.testing.assert_array_equal(one, expected[:, 0])


def test_token_dense_jacobian_is_the_kronecker_product():
    rng = np.random.default_rng(4)
    W = rng.standard_normal((5, 3))
    (J,) = L.TokenDense(W, tokens=4).jacobians([12])
    assert J.format == "csr" and J.has_canonical_format
    np.testing.assert_array_equal(J.toarray(), np.kron(np.eye(4), W))


def count_edge_groups(monkeypatch):
    from propop.systems import edge_groups

    counts = []
    original = edge_groups.EdgeGroups.__init__

    def counted(self, *args, **kwargs):
        counts.append(1)
        original(self, *args, **kwargs)

    monkeypatch.setattr(edge_groups.EdgeGroups, "__init__", counted)
    return counts


@pytest.mark.parametrize(("method", "options", "groups"), [
    ("substitution", {}, 0), ("level-scheduled", {}, 0), ("auto", {}, 0),
    ("substitution", {"recheck": True}, 1), ("batched-gmres", {}, 1)])
def test_a_plan_builds_the_operators_products_only_for_a_method_that_applies_it(
        monkeypatch, method, options, groups):
    graph = pp.Graph.residual_mlp(4, 2)
    trace = graph.forward(np.ones((4, 3)))
    system = pp.backward_system(graph, trace, np.ones((4, 3)))
    counts = count_edge_groups(monkeypatch)
    plan = pp.prepare(system, method, **options)
    assert len(counts) == groups
    solution = plan.solve(system.rhs)
    assert solution.converged
    reference = graph.backward(trace, [np.ones((4, 3))])
    for a, b in zip(graph.unstack(system, solution.x), reference):
        assert relative_error(a, b) < 1e-9
    assert len(counts) == groups  # and none in the solve


def test_row_scalings_checked_in_one_sum_still_name_the_bad_block():
    M = [np.eye(2), np.eye(2)]
    rhs = np.ones((6, 2))
    big = np.full((2, 2), 1e308)  # finite, but their sum overflows
    system = pp.TriangularSystem(M, [None, big, big], rhs, lower=True, sizes=[2, 2, 2])
    assert system.nblocks == 3
    bad = big.copy()
    bad[1, 0] = np.nan
    with pytest.raises(ValueError, match=r"block 2: row scaling contains NaN"):
        pp.TriangularSystem(M, [None, big, bad], rhs, lower=True, sizes=[2, 2, 2])


@pytest.mark.parametrize("bad", [1, 2])
def test_a_nan_in_a_large_or_a_small_row_scaling_is_named(bad):
    """Small scalings are concatenated for the check and large ones summed alone."""
    sizes = [2, 3, 1 << 16]  # block 2's scaling is large, block 1's small
    M = [np.ones((3, 2)), np.ones((1 << 16, 3))]
    scales = [None, np.ones(3), np.ones(1 << 16)]
    rhs = np.ones(sum(sizes))
    assert pp.TriangularSystem(M, scales, rhs, lower=True, sizes=sizes).nblocks == 3
    scales[bad] = scales[bad].copy()
    scales[bad][-1] = np.inf
    with pytest.raises(ValueError, match=rf"block {bad}: row scaling contains NaN or Inf"):
        pp.TriangularSystem(M, scales, rhs, lower=True, sizes=sizes)


def test_a_weight_on_the_graphs_device_is_not_sent_through_the_host(monkeypatch):
    """A dense layer's coupling on PyTorch is its weight's transposed view, made there.

    On a GPU a trip through the host is two copies and a synchronisation per weight per
    call; on the CPU it is free, so the host conversions are counted instead.
    """
    torch = pytest.importorskip("torch")
    graph = pp.Graph.residual_mlp(5, 2).to("torch")
    like = torch.ones((graph.input_size, 3), dtype=torch.float64)
    graph_systems._couplings(graph, like, transpose=True)  # the structural ones, kept
    sent = []
    real = pp.backend.to_host
    monkeypatch.setattr(pp.backend, "to_host", lambda a: sent.append(a) or real(a))
    couplings = graph_systems._couplings(graph, like, transpose=True)
    assert not [a for a in sent if isinstance(a, torch.Tensor)]
    index = {n: i for i, n in enumerate(graph.order)}
    dense = [n for n, layer in graph.layers.items() if isinstance(layer, L.Dense)]
    for name in dense:
        (p,) = graph.inputs[name]
        M, W = couplings[(index[name], index[p])], graph.layers[name].W
        assert M.data_ptr() == W.data_ptr() and M.shape == W.T.shape  # W^T, a view
    monkeypatch.setattr(pp.backend, "to_host", real)
    host = pp.Graph.residual_mlp(5, 2)  # the same values on NumPy: the same couplings
    for key, M in graph_systems._couplings(host, np.ones((5, 3)), transpose=True).items():
        mine = pp.backend.to_host(couplings[key])
        np.testing.assert_array_equal(pp.backend.dense(mine), pp.backend.dense(M))
