"""No derived state outlives its source (trust round 2, cause 1).

A hand-written training loop updates the weights in place between calls. Every
network kind, on every backend, must then give what a network freshly built from
the updated weights gives: every method's gradients and the Newton forward pass.
Each case mutates weights after a first solve has had every chance to cache
something derived from them (stacks, transposes, CSR copies, Jacobians).
"""

import numpy as np
import pytest
import scipy.sparse as sp

import propop as pp
from propop import layers as L

METHODS = ["substitution", "level-scheduled", "cyclic-reduction", "parallel-cyclic-reduction",
           "jacobi", "bicgstab", "batched-gmres", "scipy.gmres", "scipy.spsolve_triangular",
           "auto"]


def fnn_weights(widths, sparse=False, seed=0):
    rng = np.random.default_rng(seed)
    W = [rng.standard_normal((m, n)) / np.sqrt(n) for n, m in zip(widths, widths[1:])]
    if sparse:
        W = [sp.csr_array(Wk * (rng.random(Wk.shape) < 0.6)) for Wk in W]
    b = [0.1 * rng.standard_normal(m) for m in widths[1:]]
    return W, b


def gradients(net, x, t, method):
    g = pp.backprop(net, x, t, method=method)
    return [np.asarray(a.toarray() if hasattr(a, "toarray") else a) for a in g.W + g.b] + [g.x]


def assert_same(ours, fresh, method):
    for k, (a, b) in enumerate(zip(ours, fresh)):
        assert np.linalg.norm(a - b) <= 1e-10 * max(np.linalg.norm(b), 1e-300), (method, k)


def in_place_updates(W):
    """Every way a user changes weights without rebinding them."""
    def numpy_step(W):
        for Wk in W:
            Wk -= 0.3 * np.sign(Wk)

    def sparse_data(W):
        for Wk in W:
            Wk.data *= 3

    return sparse_data if sp.issparse(W[0]) else numpy_step


@pytest.mark.parametrize("widths", [(4, 4, 4, 4), (4, 6, 3, 5)], ids=["equal", "unequal"])
@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
@pytest.mark.parametrize("through", ["network", "user"])
def test_fnn_gradients_follow_weights_changed_in_place(widths, sparse, through):
    W, b = fnn_weights(widths, sparse)
    net = pp.FNN(W, b)
    rng = np.random.default_rng(3)
    x, t = rng.standard_normal((widths[0], 3)), rng.standard_normal((widths[-1], 3))
    for method in METHODS:
        gradients(net, x, t, method)  # everything a first solve may cache
    target = net.W if through == "network" else W  # the network aliases the user's arrays
    in_place_updates(target)(target)
    for Wk in net.b:
        Wk += 0.5
    fresh = pp.FNN([Wk.copy() for Wk in net.W], [bk.copy() for bk in net.b])
    for method in METHODS:
        assert_same(gradients(net, x, t, method), gradients(fresh, x, t, "substitution"),
                    method)
    for method in ("substitution", "cyclic-reduction"):
        ours = pp.forward(net, x, method=method).output
        np.testing.assert_allclose(ours, fresh.forward(x).output, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_weights_that_are_one_stack_are_read_in_place_and_followed(kind):
    """``FNN.random``'s weights are the entries of one stack: read there, never copied.

    Changed in place, the stack changes with them; rebound to other arrays, the
    network copies them per call again.
    """
    torch = pytest.importorskip("torch") if kind == "torch" else None
    shares = (lambda a, b: a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()) \
        if torch else np.shares_memory
    net = pp.FNN.random([4] * 5, seed=0, bias=0.1)
    if torch:
        net = pp.FNN(list(torch.tensor(np.stack(net.W))), [torch.tensor(bk) for bk in net.b])
    assert all(shares(net.stacks()["W"], Wk) for Wk in net.W)
    assert shares(net.stacks(transposed=True)["W"], net.W[2])
    host = np.random.default_rng(3)
    x, t = host.standard_normal((4, 3)), host.standard_normal((4, 3))
    if torch:
        x, t = torch.tensor(x), torch.tensor(t)
    methods = METHODS if torch is None else ["substitution", "cyclic-reduction", "jacobi"]
    for method in methods:
        gradients(net, x, t, method)

    def fresh_gradients():
        copy = pp.FNN([Wk.clone() if torch else Wk.copy() for Wk in net.W], list(net.b))
        return gradients(copy, x, t, "substitution")

    for Wk in net.W:  # in place: the stack changes with them
        Wk -= 0.3 * (torch.sign(Wk) if torch else np.sign(Wk))
    for method in methods:
        assert_same(gradients(net, x, t, method), fresh_gradients(), method)
    net.W = tuple(Wk.clone() if torch else Wk.copy() for Wk in net.W)  # rebound: copies
    assert not shares(net.stacks()["W"], net.W[0])
    for method in methods:
        assert_same(gradients(net, x, t, method), fresh_gradients(), method)


def test_fnn_of_torch_parameters_follows_sub_():
    torch = pytest.importorskip("torch")
    W, b = fnn_weights((3, 3, 3))
    Wt = [torch.nn.Parameter(torch.tensor(Wk)) for Wk in W]  # requires_grad, as a module's
    bt = [torch.nn.Parameter(torch.tensor(bk)) for bk in b]
    net = pp.FNN(Wt, bt)
    x, t = torch.ones((3, 2), dtype=torch.float64), torch.zeros((3, 2), dtype=torch.float64)
    for method in ("substitution", "cyclic-reduction", "jacobi"):
        pp.backprop(net, x, t, method=method)
    with torch.no_grad():
        for Wk in Wt:
            Wk.sub_(0.2)
    fresh = pp.FNN([Wk.detach().clone() for Wk in Wt], [bk.detach().clone() for bk in bt])
    want = pp.backprop(fresh, x, t)
    for method in ("substitution", "cyclic-reduction", "jacobi"):
        g = pp.backprop(net, x, t, method=method)
        for a, c in zip(g.W, want.W):
            assert torch.allclose(a, c, rtol=1e-10, atol=1e-13), method
    assert torch.allclose(pp.forward(net, x, method="cyclic-reduction").output,
                          fresh.forward(x).output, rtol=1e-10, atol=1e-13)


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
def test_rnn_gradients_follow_weights_changed_in_place(sparse):
    rng = np.random.default_rng(0)
    W = [rng.standard_normal((4, 3)) / 2, rng.standard_normal((5, 4)) / 2]
    U = [rng.standard_normal((4, 4)) / 3, rng.standard_normal((5, 5)) / 3]
    if sparse:
        W, U = [sp.csr_array(a) for a in W], [sp.csr_array(a) for a in U]
    rnn = pp.RNN(W, U)
    xs, ts = rng.standard_normal((6, 3, 2)), rng.standard_normal((6, 5, 2))
    methods = ["substitution", "cyclic-reduction", "jacobi", "bicgstab", "scipy.gmres"]
    for method in methods:
        pp.backprop(rnn, xs, ts, method=method)
    for A in rnn.W + rnn.U:
        if sparse:
            A.data *= -2
        else:
            A *= -2
    fresh = pp.RNN([A.copy() for A in rnn.W], [A.copy() for A in rnn.U], list(rnn.b))
    want = pp.backprop(fresh, xs, ts)
    for method in methods:
        g = pp.backprop(rnn, xs, ts, method=method)
        for a, c in zip(g.U + g.W, want.U + want.W):
            a, c = (np.asarray(m.toarray() if hasattr(m, "toarray") else m) for m in (a, c))
            np.testing.assert_allclose(a, c, rtol=1e-9, atol=1e-12, err_msg=method)


def test_graph_of_convolutions_follows_kernels_changed_in_place():
    rng = np.random.default_rng(0)
    conv = L.Conv2d(rng.standard_normal((2, 1, 2, 2)), rng.standard_normal(2),
                    input_shape=(1, 4, 4))
    graph = pp.Graph(16).add("conv", conv).add("act", L.Activation("tanh"))
    graph.add("fc", L.Dense(rng.standard_normal((3, 18)) / 4))
    x, t = rng.standard_normal((16, 2)), rng.standard_normal((3, 2))
    for method in ("substitution", "jacobi", "cyclic-reduction"):
        pp.backprop(graph, x, t, method=method)
    conv.W *= -1.5
    graph.layers["fc"].W += 1
    fresh = pp.Graph(16).add("conv", L.Conv2d(conv.W.copy(), conv.b, input_shape=(1, 4, 4)))
    fresh.add("act", L.Activation("tanh")).add("fc", L.Dense(graph.layers["fc"].W.copy()))
    want = pp.backprop(fresh, x, t)
    assert np.allclose(graph.forward(x).output, fresh.forward(x).output, rtol=1e-12)
    for method in ("substitution", "jacobi", "cyclic-reduction"):
        g = pp.backprop(graph, x, t, method=method)
        for node in ("conv", "fc"):
            np.testing.assert_allclose(g.parameters[node]["W"], want.parameters[node]["W"],
                                       rtol=1e-9, atol=1e-12, err_msg=method)


def test_gru_gradients_and_newton_follow_parameters_changed_in_place():
    torch = pytest.importorskip("torch")
    gru = pp.GRU(2, 3, seed=0)
    rng = np.random.default_rng(0)
    xs, ts = rng.standard_normal((5, 2, 2)), rng.standard_normal((5, 3, 2))
    for method in ("substitution", "cyclic-reduction"):
        pp.backprop(gru, xs, ts, method=method)
        pp.forward(gru, xs, method=method)
    with torch.no_grad():
        gru.parameters["weight_hh_l0"].mul_(-1.5)
    fresh = pp.GRU(2, 3, parameters={k: v.clone().numpy() for k, v in gru.parameters.items()})
    want = pp.backprop(fresh, xs, ts)
    for method in ("substitution", "cyclic-reduction"):
        g = pp.backprop(gru, xs, ts, method=method)
        for name, value in want.parameters.items():
            np.testing.assert_allclose(g.parameters[name], value, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(pp.forward(gru, xs, method=method).z[1],
                                   fresh.forward(xs).z[1], rtol=1e-9, atol=1e-12)


def test_weights_rebound_to_other_shapes_are_seen():
    net = pp.FNN.random([3, 3, 3], seed=0)
    assert net.equal_widths and net.sizes == (3, 3, 3)
    rng = np.random.default_rng(0)
    net.W = (rng.standard_normal((5, 3)), rng.standard_normal((3, 5)))
    net.b = (np.zeros(5), np.zeros(3))
    assert not net.equal_widths and net.sizes == (3, 5, 3)
    fresh = pp.FNN(list(net.W), list(net.b))
    x, t = np.ones((3, 2)), np.zeros((3, 2))
    for ours, want in zip(pp.backprop(net, x, t).W, pp.backprop(fresh, x, t).W):
        np.testing.assert_allclose(ours, want, rtol=1e-14)


def test_biases_changed_in_place_or_rebound_are_seen_by_the_stacked_forward():
    """The forward pass keeps the biases as columns for their tuple: never stale."""
    net = pp.FNN.random([4, 4, 4, 4], seed=0, bias=0.1)
    x = np.random.default_rng(1).standard_normal((4, 3))
    net.forward(x)
    net.b[1][...] = 2.0  # in place: the kept columns are views of it
    fresh = pp.FNN(list(net.W), [b.copy() for b in net.b])
    np.testing.assert_array_equal(net.forward(x).output, fresh.forward(x).output)
    net.b = tuple(b - 1.0 for b in net.b)  # rebound: the columns are made again
    fresh = pp.FNN(list(net.W), [b.copy() for b in net.b])
    np.testing.assert_array_equal(net.forward(x).output, fresh.forward(x).output)


def test_a_sparse_weights_indices_written_in_place_are_seen_by_its_transpose():
    """The transposed pattern is kept by the index arrays and checked against them.

    Two layers' weights moved to other columns in place (the same arrays): every
    method's gradients are a fresh network's; the entries scaled in place as well.
    """
    W, b = fnn_weights((6, 6, 6, 6), sparse=True, seed=4)
    net = pp.FNN(W, b)
    rng = np.random.default_rng(5)
    x, t = rng.standard_normal((6, 3)), rng.standard_normal((6, 3))
    for method in ("substitution", "cyclic-reduction", "jacobi"):
        gradients(net, x, t, method)
    for Wk in net.W[:2]:
        for i in range(Wk.shape[0]):  # each row's columns shifted: still sorted, new places
            row = slice(Wk.indptr[i], Wk.indptr[i + 1])
            Wk.indices[row] = np.arange(6)[-(row.stop - row.start):] if row.stop > row.start \
                else Wk.indices[row]
        Wk.data *= -2
    fresh = pp.FNN([sp.csr_array((Wk.data.copy(), Wk.indices.copy(), Wk.indptr.copy()),
                                 shape=Wk.shape) for Wk in net.W], [bk.copy() for bk in b])
    for method in ("substitution", "cyclic-reduction", "jacobi"):
        assert_same(gradients(net, x, t, method), gradients(fresh, x, t, method), method)
        for ours, theirs in zip(net.WT, fresh.WT):
            np.testing.assert_array_equal(ours.toarray(), np.asarray(theirs.toarray()))


def test_a_recurrence_parameter_made_infinite_in_place_is_named():
    """The sequential pass blamed the step "from finite ... parameters" (checked when made)."""
    torch = pytest.importorskip("torch")
    gru = pp.GRU(2, 3, seed=0)
    xs = np.ones((5, 2, 2))
    gru.forward(xs)
    with torch.no_grad():
        gru.parameters["weight_hh_l0"][0, 1] = float("inf")
    with pytest.raises(ValueError, match=r"parameter 'weight_hh_l0' contains NaN or Inf "
                                         r"\(first at index \(0, 1\)\)"):
        pp.backprop(gru, xs, np.zeros((5, 3, 2)))
