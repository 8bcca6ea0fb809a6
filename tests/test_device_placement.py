"""Every array propop makes lands on its operands' device: checked on the CPU.

A GPU run fails where an array is made on the default device (``xp.zeros(...)``
without ``device=``) and then meets the operands on the GPU. Here PyTorch's
default device is set to ``"meta"`` (arrays without data) while the operands are
CPU tensors: an allocation that forgets its device becomes a meta tensor, which
a :class:`~torch.overrides.TorchFunctionMode` records with the line of propop
that made it (and which fails any computation it meets). Every native method on
every system layout and every network kind's passes run so, and none may make one.
"""

import contextlib
import os
import traceback

import numpy as np
import pytest

import propop as pp
from benchmarks.systems import SYSTEMS

torch = pytest.importorskip("torch")

NATIVE = [s.name for s in pp.solvers.available() if s.native and s.available]
PACKAGE = os.path.dirname(pp.__file__) + os.sep


class _Strays(torch.overrides.TorchFunctionMode):
    """Records the propop line of every tensor made on the ``meta`` device."""

    def __init__(self):
        super().__init__()
        self.lines = set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor) and out.device.type == "meta":
            ours = [f"{f.filename[len(PACKAGE):]}:{f.lineno}"
                    for f in traceback.extract_stack() if f.filename.startswith(PACKAGE)]
            self.lines.add(ours[-1] if ours else "outside propop")
        return out


@contextlib.contextmanager
def default_device_elsewhere():
    """Yield the set of propop lines that made a tensor on the default device."""
    spy = _Strays()
    torch.set_default_device("meta")
    try:
        with spy:
            yield spy.lines
    finally:
        torch.set_default_device(None)


@pytest.mark.parametrize("name", list(SYSTEMS))
def test_every_native_method_makes_its_arrays_beside_its_operands(name):
    system = SYSTEMS[name](3)
    moved = system.to("torch")
    reference = pp.solve(system, "substitution").x
    for method in NATIVE:
        if not pp.solvers.info(method).applies_to(system):
            continue
        with default_device_elsewhere() as strays:
            solution = pp.solve(moved, method, check=True)
        assert not strays, (method, strays)
        assert solution.x.device.type == "cpu"
        np.testing.assert_allclose(solution.x.numpy(), reference, rtol=1e-7, atol=1e-9)


def sparse_rnn():
    """An RNN whose recurrent weights are SciPy CSR arrays (its small entries dropped)."""
    import scipy.sparse as sp

    dense = pp.RNN.random([3, 4, 4], seed=0)
    return pp.RNN(dense.W, [sp.csr_array(U * (np.abs(U) > 0.3)) for U in dense.U], dense.b)


def networks():
    from test_torch_trace import ConvNet, randomised

    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    conv = pp.from_torch(randomised(ConvNet()).double(), (2, 9, 9))
    return {"fnn-unequal": (pp.FNN.random([4, 6, 3, 5], seed=0), rng.standard_normal((4, 2))),
            "fnn-stacked": (pp.FNN.random([5] * 4, seed=0), rng.standard_normal((5, 2))),
            "fnn-sparse": (pp.FNN.random([6, 8, 8, 5], seed=0, density=0.4),
                           rng.standard_normal((6, 2))),
            "rnn": (pp.RNN.random([3, 4, 4], seed=0), rng.standard_normal((10, 3, 2))),
            "rnn-sparse": (sparse_rnn(), rng.standard_normal((10, 3, 2))),
            "graph": (pp.Graph.residual_mlp(5, 2), rng.standard_normal((5, 2))),
            "conv-graph": (conv, rng.standard_normal((162, 2)))}


@pytest.mark.parametrize("name", ["fnn-unequal", "fnn-stacked", "fnn-sparse", "rnn",
                                  "rnn-sparse", "graph", "conv-graph"])
def test_a_network_of_tensors_makes_its_arrays_beside_its_weights(name):
    net, x = networks()[name]
    moved, X = net.to("torch"), torch.from_numpy(x)
    target = torch.from_numpy(np.zeros(net.forward(x).z[-1].shape))
    with default_device_elsewhere() as strays:
        moved.forward(X)
        pp.forward(moved, X, method="substitution", linearization="newton")
        for method in ("substitution", "batched-gmres", "jacobi"):
            pp.backprop(moved, X, target, method=method)
    assert not strays, strays


@pytest.mark.parametrize("cell", ["gru", "lstm", "recurrence"])
def test_a_recurrence_of_tensors_makes_its_arrays_beside_its_weights(cell):
    rng = np.random.default_rng(0)
    if cell == "recurrence":
        def step(p, h, x):
            return torch.tanh(p["W"] @ h + p["U"] @ x)

        net = pp.Recurrence(step, {"W": rng.standard_normal((3, 3)) * 0.5,
                                   "U": rng.standard_normal((3, 2))}, state_size=3,
                            input_size=2)
    else:
        net = (pp.GRU if cell == "gru" else pp.LSTM)(2, 3, num_layers=2, seed=0)
    moved, xs = net.to("torch"), rng.standard_normal((12, 2, 3))
    X = torch.from_numpy(xs)
    target = torch.from_numpy(np.zeros(net.outputs(net.forward(xs)).shape))
    with default_device_elsewhere() as strays:
        moved.forward(X)
        for linearization in ("newton", "quasi", "damped"):
            pp.forward(moved, X, method="cyclic-reduction", linearization=linearization)
        pp.backprop(moved, X, target, method="cyclic-reduction")
    assert not strays, strays


def test_a_stray_allocation_is_caught():
    """The check itself: an array made without ``device=`` is named by its line."""
    from propop import backend

    x = torch.ones(3, dtype=torch.float64)
    with default_device_elsewhere() as strays:
        backend.namespace(x).zeros(3, dtype=x.dtype)  # no device: the default one
    assert strays == {"outside propop"}


def test_a_parallelized_module_on_its_tensors_makes_its_arrays_beside_them():
    """``propop.torch.parallelize(..., backend="torch")``: a training step, no stray arrays."""
    import propop.torch as ptorch

    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Tanh(),
                                 torch.nn.Linear(6, 3)).double()
    x = torch.randn(5, 4, dtype=torch.float64)
    ours = ptorch.parallelize(module, method="cyclic-reduction", example_input=x,
                              backend="torch")
    with default_device_elsewhere() as strays:
        ours(x).sum().backward()
    assert not strays, strays
    assert module[0].weight.grad.device.type == "cpu"
