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
            "rnn": lambda: pp.RNN.random([3, 4, 4], activation="tanh", seed=2)}


def data(net, name, r):
    rng = np.random.default_rng(3)
    batch = () if r is None else (r,)
    x = rng.standard_normal(((12, 3) if name == "rnn" else (net.sizes[0],)) + batch)
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
