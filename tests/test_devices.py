"""Networks and systems moved between backends with ``.to()``; GPU runs where a GPU is.

The CPU half runs everywhere (NumPy and PyTorch CPU tensors). The ``gpu``-marked half
runs the same checks on CuPy and on PyTorch CUDA tensors and skips, saying why, on a
machine without them: ``python -m pytest -m gpu``.
"""

import numpy as np
import pytest

import propop as pp
from cases import gpu_backends, relative_error

torch = pytest.importorskip("torch", reason="PyTorch tensors are the second backend here")

ITERATIVE = ("jacobi", "batched-gmres", "batched-bicgstab")


def problem(seed=0, width=6, depth=8, r=3):
    net = pp.FNN.random([width] * (depth + 1), seed=seed, bias=0.1)
    rng = np.random.default_rng(seed)
    return net, rng.standard_normal((width, r)), rng.standard_normal((width, r))


def host(a):
    return pp.backend.to_host(a)


DEVICES = [pytest.param("torch", None, id="torch-cpu"), *gpu_backends()]


@pytest.mark.parametrize(("kind", "device"), DEVICES)
def test_a_network_moved_backpropagates_as_on_numpy_every_layer(kind, device):
    net, x, t = problem()
    moved = net.to(kind, device)
    assert pp.backend.of(moved.W[0]).name == kind
    xd, td = (pp.backend.convert(a, kind, device) for a in (x, t))
    for method in ("substitution", "cyclic-reduction", *ITERATIVE):
        g = pp.backprop(moved, xd, td, method=method)
        reference = pp.backprop(net, x, t, method="substitution")
        for k, (mine, theirs) in enumerate(zip(g.W, reference.W)):
            assert relative_error(host(mine), theirs) < 1e-10, (method, k)
    back = moved.to("numpy")
    assert all(np.array_equal(a, b) for a, b in zip(back.W, net.W))


@pytest.mark.parametrize(("kind", "device"), DEVICES)
def test_no_host_round_trip_inside_an_iteration(kind, device):
    """Every iterate a method hands its callback lives on the system's backend and device."""
    net, x, t = problem(seed=1)
    trace = net.forward(x)
    system = pp.backward_system(net, trace, t).to(kind, device)
    kinds = []
    for method in ITERATIVE:
        sol = pp.solve(system, method, callback=lambda v: kinds.append(
            (pp.backend.of(v).name, str(getattr(v, "device", "cpu")))))
        assert sol.converged and pp.backend.of(sol.x).name == kind
    assert kinds and set(kinds) == {(kind, str(system.rhs.device))}, set(kinds)


def test_systems_move_with_their_storage():
    net, x, t = problem(seed=2)
    B = pp.backward_system(net, net.forward(x), t)
    T = B.to("torch")
    assert T.coupling_stack is not None and pp.backend.of(T.rhs).name == "torch"
    np.testing.assert_allclose(pp.solve(T, "cyclic-reduction").x.numpy(), pp.solve(B).x,
                               rtol=1e-12, atol=1e-14)
    assert np.array_equal(T.to("numpy").rhs, B.rhs)
    graph = pp.Graph.residual_mlp(4, 2)
    trace = graph.forward(np.ones((4, 2)))
    G = pp.backward_system(graph, trace, graph.loss_gradient(trace, np.zeros((4, 2))))
    np.testing.assert_array_equal(pp.solve(G.to("numpy")).x, pp.solve(G).x)
    np.testing.assert_allclose(pp.solve(G.to("torch")).x.numpy(), pp.solve(G).x, rtol=1e-12)
    with pytest.raises(ValueError, match="kind must be one of"):
        B.to("jax")
    sparse = pp.FNN.random([6, 6, 6], density=0.5, seed=0)
    with pytest.raises(TypeError, match="sparse weights moves to 'numpy', 'cupy' or 'torch'"):
        sparse.to("array_api_strict")
