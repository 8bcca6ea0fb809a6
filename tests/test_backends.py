"""Every propop-native method on every backend, through the same code.

Systems of every layout (a chain of unequal widths, a stacked chain, a chain with
per-sample couplings, an RNN's time layout, a residual graph), built in NumPy and
moved to PyTorch tensors and to ``array_api_strict`` arrays (the array API
standard's strict namespace: what runs there uses nothing beyond the standard),
are solved by every registered native method that applies and compared, block by
block and sample by sample, with NumPy's substitution.
"""

import numpy as np
import pytest

import propop as pp
from propop import backend

strict = pytest.importorskip("array_api_strict")
torch = pytest.importorskip("torch")

BACKENDS = ["torch", "array_api_strict"]
NATIVE = [s.name for s in pp.solvers.available() if s.native and s.available]
EXACT = {s.name for s in pp.solvers.available() if s.exact}


def fnn_unequal(r):
    net = pp.FNN.random([5, 7, 4, 6, 3], activation="tanh", seed=0, bias=0.1)
    trace = net.forward(np.random.default_rng(1).standard_normal((5, r)))
    return pp.backward_system(net, trace, np.ones((3, r)))


def fnn_stacked(r):
    net = pp.FNN.random([5] * 9, activation="tanh", seed=0, bias=0.1)
    x = np.random.default_rng(2).standard_normal((5, r))
    return pp.forward_system(net, x, around=net.forward(x))


def per_sample(r):
    rng = np.random.default_rng(3)
    stack = rng.standard_normal((6, r, 4, 4)) * 0.4
    return pp.TriangularSystem(None, None, rng.standard_normal((28, r)), lower=True,
                               sizes=[4] * 7, coupling_stack=stack)


def rnn(r):
    net = pp.RNN.random([3, 4, 5], activation="tanh", seed=0)
    trace = net.forward(np.random.default_rng(4).standard_normal((6, 3, r)))
    return pp.backward_system(net, trace, np.ones_like(trace.output))


def graph(r):
    net = pp.Graph.residual_mlp(4, 3, seed=0)
    trace = net.forward(np.random.default_rng(5).standard_normal((4, r)))
    return pp.backward_system(net, trace, net.loss_gradient(trace, np.zeros((4, r))))


def linear(r):
    """A linear network's batch: every sample has the same matrix (the block methods' case)."""
    net = pp.FNN.random([4, 5, 5, 3], activation="identity", seed=0, bias=0.1)
    trace = net.forward(np.random.default_rng(6).standard_normal((4, r)))
    return pp.backward_system(net, trace, np.random.default_rng(7).standard_normal((3, r)))


SYSTEMS = {"fnn-unequal": fnn_unequal, "fnn-stacked": fnn_stacked, "per-sample": per_sample,
           "rnn": rnn, "graph": graph, "linear": linear}


def test_the_native_methods_are_the_registry_less_its_adapters():
    names = {s.name for s in pp.solvers.available()}
    adapters = {n for n in names if n.startswith(("scipy.", "pyamg.", "mpi."))}
    assert set(NATIVE) == names - adapters
    for s in pp.solvers.available():
        assert set(s.backends) == ({"numpy", "cupy", "torch", "array_api_strict"} if s.native
                                   else set(s.backends) - {"torch", "array_api_strict"})


def cases():
    for name, build in SYSTEMS.items():
        for method in NATIVE:
            yield pytest.param(name, build, method, id=f"{name}-{method}")


@pytest.mark.parametrize("kind", BACKENDS)
@pytest.mark.parametrize(("name", "build", "method"), list(cases()))
def test_every_native_method_gives_numpys_answer_on_every_backend(kind, name, build, method):
    system = build(3)
    if not pp.solvers.info(method).applies_to(system):
        pytest.skip(f"{method} does not apply to a {name} system")
    reference = pp.solve(system, "substitution").x
    moved = system.to(kind)
    assert moved.backend.name == kind
    solution = pp.solve(moved, method, check=True)
    assert backend.of(solution.x).name == kind
    x = backend.to_host(solution.x)
    bound = 1e-12 if method in EXACT else 1e-9
    for k, (mine, theirs) in enumerate(zip(system.split(x), system.split(reference))):
        scale = np.maximum(np.abs(theirs).max(axis=0), 1e-300)
        assert (np.abs(mine - theirs).max(axis=0) <= bound * np.maximum(scale, 1)).all(), \
            (method, kind, k)


@pytest.mark.parametrize("kind", BACKENDS)
@pytest.mark.parametrize("name", list(SYSTEMS))
def test_products_and_views_on_every_backend(kind, name):
    system = SYSTEMS[name](2)
    moved = system.to(kind)
    x = np.random.default_rng(6).standard_normal(system.rhs.shape)
    for transpose in (False, True):
        ours = backend.to_host(moved.apply(backend.convert(x, kind), transpose=transpose))
        np.testing.assert_allclose(ours, system.apply(x, transpose=transpose), rtol=1e-13,
                                   atol=1e-13)
    np.testing.assert_allclose(backend.to_host(moved.rhs), system.rhs, rtol=0, atol=0)
    for i in range(2):
        np.testing.assert_allclose(backend.to_host(pp.solve(moved.sample(i), "substitution").x),
                                   pp.solve(system.sample(i), "substitution").x, rtol=1e-12)


@pytest.mark.parametrize("kind", BACKENDS)
def test_sparse_couplings_move_dense_to_a_dense_backend_and_networks_refuse(kind):
    net = pp.FNN.random([30, 30, 30], activation="tanh", seed=0, density=0.1)
    system = pp.backward_system(net, net.forward(np.ones((30, 2))), np.ones((30, 2)))
    assert "sparse" in system.tags
    moved = system.to(kind)
    assert "sparse" not in moved.tags
    np.testing.assert_allclose(backend.to_host(pp.solve(moved, "substitution").x),
                               pp.solve(system, "substitution").x, rtol=1e-12)
    with pytest.raises(TypeError, match="dense here.*'numpy' or 'cupy'"):
        net.to(kind)
