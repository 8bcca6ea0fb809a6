"""FNNs and RNNs moved to every backend, backpropagated by every native method there.

``net.to(kind)`` for PyTorch tensors and ``array_api_strict`` arrays (the
standard's strict namespace: the networks' own code, their forward passes, system
builders and gradients, uses nothing beyond it), compared with NumPy's
sequential reference (itself checked against autograd in ``test_reference``).
"""

import numpy as np
import pytest

import propop as pp
from cases import gpu_backends
from propop import backend

pytest.importorskip("array_api_strict")
pytest.importorskip("torch")

BACKENDS = [pytest.param("torch", None, id="torch"),
            pytest.param("array_api_strict", None, id="array_api_strict"), *gpu_backends()]
NATIVE = [s.name for s in pp.solvers.available() if s.native and s.available]
EXACT = {s.name for s in pp.solvers.available() if s.exact}
NETWORKS = {"fnn-unequal": lambda: pp.FNN.random([4, 6, 3, 5], activation="tanh", seed=0),
            "fnn-stacked": lambda: pp.FNN.random([5, 5, 5, 5], activation="sigmoid", seed=1),
            "rnn": lambda: pp.RNN.random([3, 4, 4], activation="tanh", seed=2),
            # one layer: its chain over time keeps U and the slopes (SharedCoreKernels)
            "rnn-one-layer": lambda: pp.RNN.random([3, 5], activation="tanh", seed=4)}


def data(net, name, r):
    rng = np.random.default_rng(3)
    batch = () if r is None else (r,)
    x = rng.standard_normal(((12, 3) if name.startswith("rnn") else (net.sizes[0],)) + batch)
    return x, rng.standard_normal(net.forward(x).output.shape)


@pytest.mark.parametrize(("kind", "device"), BACKENDS)
@pytest.mark.parametrize("r", [None, 3])
@pytest.mark.parametrize("name", list(NETWORKS))
def test_a_moved_network_backpropagates_as_on_numpy_with_every_method(kind, device, name, r):
    net = NETWORKS[name]()
    x, target = data(net, name, r)
    moved = net.to(kind, device)
    assert moved.backend.name == kind
    X, T = backend.convert(x, kind, device), backend.convert(target, kind, device)
    np.testing.assert_allclose(backend.to_host(moved.forward(X).output), net.forward(x).output,
                               rtol=1e-13, atol=1e-14)
    reference = pp.backprop(net, x, target, method="substitution")
    system = pp.backward_system(net, net.forward(x), target)
    methods = [m for m in NATIVE if pp.solvers.info(m).applies_to(system)]
    assert len(methods) >= 9
    for method in methods:
        g = pp.backprop(moved, X, T, method=method)
        bound = 1e-12 if method in EXACT else 1e-8
        for k, (ours, theirs) in enumerate(zip(g.W, reference.W)):
            assert backend.of(ours).name == kind, (method, k)
            assert np.abs(backend.to_host(ours) - theirs).max() <= \
                bound * np.abs(theirs).max(), (method, k)
        assert np.abs(backend.to_host(g.x) - reference.x).max() <= \
            bound * np.abs(reference.x).max(), method


FLOAT32 = {"fnn-unequal": lambda: pp.FNN.random([2, 1, 2], activation="tanh", seed=1, bias=0.1,
                                               dtype="float32"),
           "rnn-one-unit": lambda: pp.RNN.random([3, 1], activation="tanh", seed=2,
                                                 dtype="float32")}


@pytest.mark.parametrize(("kind", "device"), BACKENDS)
@pytest.mark.parametrize("name", list(FLOAT32))
def test_a_float32_network_backpropagates_in_float32_with_every_method(kind, device, name):
    """Every solve in the network's float32 (a host number the solver adds is cast).

    Blocks of width one: the chain's rows whose scaling and diagonal are both one,
    the strict namespace's mismatched dtypes before; against float64's gradients.
    """
    net = FLOAT32[name]()
    x, target = (a.astype("float32") for a in data(net, "rnn" if name.startswith("rnn")
                                                   else name, 3))
    exact = type(net)(*([a.astype("float64") for a in arrays] for arrays in _arrays(net)),
                      net.activations)  # the same weights, in float64
    reference = pp.backprop(exact, x.astype("float64"), target.astype("float64"))
    moved = net.to(kind, device)
    X, T = backend.convert(x, kind, device), backend.convert(target, kind, device)
    system = pp.backward_system(net, net.forward(x), target)
    for method in [m for m in NATIVE if pp.solvers.info(m).applies_to(system)]:
        g = pp.backprop(moved, X, T, method=method)
        for k, (ours, theirs) in enumerate(zip(g.W, reference.W)):
            assert backend.to_host(ours).dtype == np.float32, (method, k)
            assert np.abs(backend.to_host(ours) - theirs).max() <= \
                1e-4 * np.abs(theirs).max(), (method, k)


def _arrays(net):
    """A network's weight lists, in its constructor's order."""
    return (net.W, net.U, net.b) if isinstance(net, pp.RNN) else (net.W, net.b)

@pytest.mark.parametrize(("kind", "device"), BACKENDS)
@pytest.mark.parametrize("name", list(NETWORKS))
def test_a_moved_network_runs_newton_forward_as_on_numpy(kind, device, name):
    net = NETWORKS[name]()
    x, _ = data(net, name, 2)
    trace = pp.forward(net.to(kind, device), backend.convert(x, kind, device),
                       method="cyclic-reduction", linearization="newton")
    assert trace.info["converged"] and backend.of(trace.output).name == kind
    np.testing.assert_allclose(backend.to_host(trace.output), net.forward(x).output,
                               rtol=1e-9, atol=1e-12)


def recurrence(cell):
    rng = np.random.default_rng(0)
    if cell != "recurrence":
        return (pp.GRU if cell == "gru" else pp.LSTM)(2, 3, num_layers=2, seed=0)
    import torch

    def step(p, h, x):
        return torch.tanh(p["W"] @ h + p["U"] @ x)

    return pp.Recurrence(step, {"W": rng.standard_normal((3, 3)) * 0.5,
                                "U": rng.standard_normal((3, 2))}, state_size=3, input_size=2)


@pytest.mark.parametrize(("kind", "device"), [
    pytest.param("array_api_strict", None, id="array_api_strict"), *gpu_backends()])
@pytest.mark.parametrize("cell", ["gru", "lstm", "recurrence"])
def test_a_recurrence_moved_anywhere_runs_every_pass_there(kind, device, cell):
    """PyTorch differentiates the step where the arrays are; the solves run on their backend."""
    net = recurrence(cell)
    xs = np.random.default_rng(1).standard_normal((12, 2, 3))
    moved, X = net.to(kind, device), backend.convert(xs, kind, device)
    assert moved.backend.name == kind and net.backend.name == "numpy"
    exact = net.forward(xs)
    ours = moved.forward(X)
    assert backend.of(ours.z[1]).name == kind
    np.testing.assert_allclose(backend.to_host(ours.z[1]), exact.z[1], rtol=1e-13, atol=1e-14)
    for linearization in ("newton", "quasi", "damped"):
        trace = pp.forward(moved, X, method="cyclic-reduction", linearization=linearization)
        assert backend.of(trace.z[1]).name == kind, linearization
        np.testing.assert_allclose(backend.to_host(trace.z[1]), exact.z[1], rtol=0, atol=1e-9)
    target = np.random.default_rng(2).standard_normal(net.outputs(exact).shape)
    reference = pp.backprop(net, xs, target, method="substitution")
    for method in ("substitution", "cyclic-reduction", "batched-gmres"):
        g = pp.backprop(moved, X, backend.convert(target, kind, device), method=method)
        for name, value in reference.parameters.items():
            assert backend.of(g.parameters[name]).name == kind, (method, name)
            np.testing.assert_allclose(backend.to_host(g.parameters[name]), value, rtol=1e-9,
                                       atol=1e-11, err_msg=f"{method} {name}")
        np.testing.assert_allclose(backend.to_host(g.x), reference.x, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("net_kind", ["numpy", "torch", "array_api_strict"])
@pytest.mark.parametrize("x_kind", ["numpy", "torch", "array_api_strict"])
@pytest.mark.parametrize("name", ["fnn-stacked", "rnn"])
def test_an_input_of_another_backend_is_named_with_the_call_that_moves_it(net_kind, x_kind,
                                                                          name):
    """Named, with the call that moves it; never an internal error.

    A NumPy input to a strict-namespace network raised a TypeError from ``astype``
    (and a tensor there was said to meet NumPy arrays).
    """
    net = NETWORKS[name]().to(net_kind)
    x, target = data(NETWORKS[name](), name, 3)
    X = backend.convert(x, x_kind)
    if net_kind == x_kind:
        assert backend.of(net.forward(X).output).name == net_kind
        return
    what = "xs" if name == "rnn" else "x"
    message = rf"{what} is a .*, but the arrays it meets are .*: pass it as one " \
              rf"\(propop\.backend\.convert\({what}, '{net_kind}'\)\)"
    with pytest.raises(ValueError, match=message):
        net.forward(X)
    with pytest.raises(ValueError, match=message):
        pp.backprop(net, X, backend.convert(target, net_kind))
    with pytest.raises(ValueError, match=r"target is a .*convert\(target, "):
        pp.backprop(net, backend.convert(x, net_kind), backend.convert(target, x_kind))


@pytest.mark.parametrize("kind", ["torch", "array_api_strict"])
@pytest.mark.parametrize("name", ["fnn-unequal", "rnn"])
def test_a_given_trace_and_a_plans_rhs_work_off_numpy_and_other_backends_are_named(kind,
                                                                                  name):
    """Off NumPy, and named when they come from another backend.

    ``trace=`` raised an AttributeError off NumPy (``array_equal`` is not the
    standard's), ``around=`` from NumPy a TypeError, and a plan took a right-hand
    side of another backend silently.
    """
    net = NETWORKS[name]()
    x, target = data(net, name, 2)
    moved, X, T = net.to(kind), backend.convert(x, kind), backend.convert(target, kind)
    want = pp.backprop(moved, X, T)
    given = pp.backprop(moved, X, T, trace=moved.forward(X))
    for ours, theirs in zip(given.W, want.W):
        np.testing.assert_array_equal(backend.to_host(ours), backend.to_host(theirs))
    with pytest.raises(ValueError, match="trace was computed from another input"):
        pp.backprop(moved, X, T, trace=moved.forward(X * 2))
    with pytest.raises(ValueError, match=rf"trace holds numpy arrays, but x is on {kind}"):
        pp.backprop(moved, X, T, trace=net.forward(x))
    with pytest.raises(ValueError, match=rf"around holds numpy arrays, but x is on {kind}"):
        pp.forward(moved, X, method="cyclic-reduction", around=net.forward(x))
    warm = pp.forward(moved, X, method="cyclic-reduction", around=moved.forward(X))
    assert warm.info["converged"] and warm.info["iterations"] == 0
    trace = moved.forward(X)
    plan = pp.prepare(pp.backward_system(moved, trace, moved.loss_gradient(trace, T)),
                      "cyclic-reduction")
    host = net.forward(x)
    reference = pp.prepare(pp.backward_system(net, host, net.loss_gradient(host, target)),
                           "cyclic-reduction")
    rhs = np.ones(tuple(reference.system.rhs.shape))
    np.testing.assert_allclose(backend.to_host(plan.solve(backend.convert(rhs, kind)).x),
                               reference.solve(rhs).x, rtol=1e-12, atol=1e-14)
    with pytest.raises(ValueError, match=rf"rhs is a numpy.ndarray, but the arrays it meets "
                                         rf"are .*convert\(rhs, '{kind}'\)"):
        plan.solve(rhs)
