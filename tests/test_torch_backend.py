"""PyTorch CPU tensors through the same solver code as NumPy (array API, array-api-compat).

Chains built from tensors (stacked, or one coupling per block) are solved by every
method that runs on PyTorch and compared with the same system in NumPy, solved by
substitution (the sequential reference); networks of tensors (equal and unequal
widths, RNNs) backpropagate as PyTorch autograd does. ``tests/test_backends.py``
holds every layout against every native method.
"""

import numpy as np
import pytest

import propop as pp

torch = pytest.importorskip("torch")

METHODS = [s.name for s in pp.solvers.available() if "torch" in s.backends]


def require_applies(method, system):
    """Skip, saying why, a method whose structure requirement ``system`` lacks."""
    if not pp.solvers.info(method).applies_to(system):
        pytest.skip(f"{method} needs {pp.solvers.info(method).requires}")
EXACT = {s.name for s in pp.solvers.available() if s.exact}


def chains(lower, r, dtype, depth=12, n=5, seed=0):
    """The same chain as NumPy arrays and as PyTorch tensors."""
    rng = np.random.default_rng(seed)
    C = (rng.standard_normal((depth, n, n)) / np.sqrt(n)).astype(dtype)
    S = rng.uniform(0.2, 1.0, (depth, n) + (() if r is None else (r,))).astype(dtype)
    rhs = rng.standard_normal(((depth + 1) * n,) + (() if r is None else (r,))).astype(dtype)
    kwargs = dict(lower=lower, sizes=(n,) * (depth + 1))
    return (pp.TriangularSystem(None, None, rhs, coupling_stack=C, scale_stack=S, **kwargs),
            pp.TriangularSystem(None, None, torch.from_numpy(rhs),
                                coupling_stack=torch.from_numpy(C),
                                scale_stack=torch.from_numpy(S), **kwargs))


def test_the_dense_paths_run_on_torch():
    assert {"substitution", "cyclic-reduction", "jacobi", "batched-gmres",
            "batched-bicgstab"} <= set(METHODS)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("lower", [True, False])
@pytest.mark.parametrize("r", [None, 3])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_torch_tensors_give_numpys_answer(method, lower, r, dtype):
    numpy_system, torch_system = chains(lower, r, dtype)
    require_applies(method, numpy_system)
    assert torch_system.backend.name == "torch"
    reference = pp.solve(numpy_system, "substitution").x
    solution = pp.solve(torch_system, method, check=True)
    x = solution.x
    assert isinstance(x, torch.Tensor) and x.dtype == getattr(torch, dtype)
    assert tuple(x.shape) == reference.shape
    eps = np.finfo(dtype).eps
    bound = 100 * eps if method in EXACT else 1e3 * max(1e-10, 100 * eps)
    blocks = x.numpy().reshape(13, 5, -1) - reference.reshape(13, 5, -1)
    scale = np.abs(reference.reshape(13, 5, -1)).max(axis=1)  # every block, every sample
    assert (np.abs(blocks).max(axis=1) <= bound * np.maximum(scale, 1)).all()


@pytest.mark.parametrize("lower", [True, False])
@pytest.mark.parametrize("form", ["scaled", "paper"])
def test_the_stacked_product_is_the_blockwise_one(lower, form):
    """A x and A^T x of a stacked chain against the same chain given block by block."""
    numpy_system, torch_system = chains(lower, 3, "float64")
    listed = pp.TriangularSystem(list(numpy_system.coupling_stack),
                                 [None] + list(numpy_system.scale_stack), numpy_system.rhs,
                                 lower=lower, sizes=numpy_system.sizes)
    if form == "paper":
        listed, torch_system = listed.paper(), torch_system.paper()
    x = np.random.default_rng(1).standard_normal(listed.rhs.shape)
    for transpose in (False, True):
        ours = torch_system.apply(torch.from_numpy(x), transpose=transpose).numpy()
        np.testing.assert_allclose(ours, listed.apply(x, transpose=transpose), rtol=1e-13,
                                   atol=1e-13)


def test_torch_systems_say_what_they_take():
    C = torch.ones((4, 3, 3), dtype=torch.float64) * 0.5
    rhs = torch.ones(15, dtype=torch.float64)
    listed = pp.TriangularSystem(list(C), None, rhs, lower=True, sizes=(3,) * 5)
    system = pp.TriangularSystem(None, None, rhs, lower=True, sizes=(3,) * 5, coupling_stack=C,
                                 scale_stack=torch.ones((4, 3), dtype=torch.float64))
    assert "stacked" in system.tags and listed.backend.name == "torch"
    np.testing.assert_allclose(pp.solve(listed).x.numpy(), pp.solve(system).x.numpy(),
                               rtol=1e-14)
    with pytest.raises(TypeError, match="PyTorch tensors do not have"):
        _ = system.operator  # SciPy's LinearOperator; the explicit matrix is a CSR tensor
    other = next(s.name for s in pp.solvers.available() if "torch" not in s.backends)
    with pytest.raises(ValueError, match="torch arrays"):
        pp.solve(system, other)
    bad = C.clone()
    bad[2, 1, 0] = float("nan")
    with pytest.raises(ValueError,
                       match=r"coupling \(3, 2\) \(coupling_stack\[2\]\).*NaN or Inf.*\(1, 0\)"):
        pp.TriangularSystem(None, None, rhs, lower=True, sizes=(3,) * 5, coupling_stack=bad,
                            scale_stack=torch.ones((4, 3), dtype=torch.float64))


def torch_net(net):
    """The same network with its weights and biases as PyTorch tensors."""
    return pp.FNN([torch.from_numpy(np.asarray(Wk)) for Wk in net.W],
                  [torch.from_numpy(np.asarray(bk)) for bk in net.b],
                  activation=[act.name for act in net.activations])


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("activation", [a for a in pp.available_activations() if a != "exp"])
@pytest.mark.parametrize("r", [None, 3])
def test_a_network_of_tensors_backpropagates_like_autograd(method, activation, r):
    """Every layer's dW and db, and dx, against PyTorch autograd (float64)."""
    from reference import torch_gradients

    net = pp.FNN.random([6] * 9, activation=activation, seed=2)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((6,) if r is None else (6, r))
    t = rng.standard_normal(x.shape)
    require_applies(method, pp.backward_system(net, net.forward(x), t))
    _, dW, db, dx = torch_gradients(net, x, t)
    grads = pp.backprop(torch_net(net), torch.from_numpy(x), torch.from_numpy(t), method=method,
                        check=True)
    assert all(isinstance(g, torch.Tensor) for g in (*grads.W, *grads.b, grads.x))
    bound = 1e-12 if method in EXACT else 1e-8
    for k, (ours, theirs) in enumerate(zip(grads.W, dW)):
        scale = max(np.abs(theirs).max(), 1e-300)
        assert np.abs(ours.numpy() - theirs).max() <= bound * scale, f"layer {k}"
    for k, (ours, theirs) in enumerate(zip(grads.b, db)):
        scale = max(np.abs(theirs).max(), 1e-300)
        assert np.abs(ours.numpy() - theirs).max() <= bound * scale, f"layer {k}: db"
    assert np.abs(grads.x.numpy() - dx).max() <= bound * max(np.abs(dx).max(), 1e-300)


@pytest.mark.parametrize("method", ["substitution", "cyclic-reduction"])
def test_a_network_of_tensors_runs_forward_in_parallel(method):
    """Newton's forward pass on tensors reaches the sequential forward pass of NumPy."""
    net = pp.FNN.random([6] * 9, activation="tanh", seed=2)
    x = np.random.default_rng(3).standard_normal((6, 2))
    result = pp.forward(torch_net(net), torch.from_numpy(x), method=method)
    assert isinstance(result.output, torch.Tensor)
    np.testing.assert_allclose(result.output.numpy(), net.forward(x).output, rtol=0, atol=1e-9)


@pytest.mark.parametrize("method", METHODS)
def test_a_float32_network_of_tensors_stays_float32(method):
    net = pp.FNN.random([6] * 9, activation="tanh", seed=2, dtype="float32")
    x = np.random.default_rng(3).standard_normal((6, 3)).astype("float32")
    require_applies(method, pp.backward_system(net, net.forward(x), x))
    ours = pp.backprop(torch_net(net), torch.from_numpy(x), torch.from_numpy(x), method=method)
    reference = pp.backprop(net, x, x, method="substitution")
    assert all(g.dtype == torch.float32 for g in ours.W)
    for k, (a, b) in enumerate(zip(ours.W, reference.W)):
        assert np.abs(a.numpy() - b).max() <= 1e-4 * np.abs(b).max(), f"layer {k}"


def test_tensor_inputs_pass_the_same_front_door():
    net = pp.FNN([torch.ones((3, 3), dtype=torch.int64)] * 2)
    assert all(Wk.dtype == torch.float64 for Wk in net.W) and net.backend.name == "torch"
    with pytest.raises(ValueError, match=r"layer 1: W\[1\] has complex dtype"):
        pp.FNN([torch.ones((3, 3)), torch.ones((3, 3), dtype=torch.complex64)])
    bad = torch.ones((3, 3), dtype=torch.float64)
    bad[1, 2] = float("inf")
    with pytest.raises(ValueError, match=r"layer 0: W\[0\] contains NaN or Inf.*\(1, 2\)"):
        pp.FNN([bad])


@pytest.mark.parametrize("method", ["substitution", "cyclic-reduction", "jacobi",
                                    "batched-gmres", "bicgstab"])
def test_a_network_of_tensors_with_unequal_widths_backpropagates_like_autograd(method):
    from reference import torch_gradients

    net = pp.FNN.random([6, 8, 4, 5], activation="tanh", seed=0)
    rng = np.random.default_rng(4)
    x, t = rng.standard_normal((6, 2)), rng.standard_normal((5, 2))
    _, dW, db, dx = torch_gradients(net, x, t)
    grads = pp.backprop(torch_net(net), torch.from_numpy(x), torch.from_numpy(t), method=method)
    bound = 1e-12 if method in EXACT else 1e-8
    for k, (ours, theirs) in enumerate(zip(grads.W, dW)):
        assert isinstance(ours, torch.Tensor)
        assert np.abs(ours.numpy() - theirs).max() <= bound * np.abs(theirs).max(), k
    assert np.abs(grads.x.numpy() - dx).max() <= bound * np.abs(dx).max()


@pytest.mark.parametrize("method", ["substitution", "cyclic-reduction", "hybrid",
                                    "batched-gmres"])
def test_an_rnn_of_tensors_runs_forward_and_backpropagates_as_on_numpy(method):
    rnn = pp.RNN.random([4, 4], activation="tanh", seed=0)
    tensors = pp.RNN([torch.from_numpy(np.asarray(Wk)) for Wk in rnn.W],
                     [torch.from_numpy(np.asarray(Uk)) for Uk in rnn.U],
                     [torch.from_numpy(np.asarray(bk)) for bk in rnn.b])
    xs = np.random.default_rng(0).standard_normal((20, 4, 2))
    out = tensors.forward(torch.from_numpy(xs)).output
    assert isinstance(out, torch.Tensor)
    np.testing.assert_allclose(out.numpy(), rnn.forward(xs).output, rtol=1e-13, atol=1e-15)
    ours = pp.backprop(tensors, torch.from_numpy(xs), torch.from_numpy(xs), method=method)
    reference = pp.backprop(rnn, xs, xs, method="substitution")
    bound = 1e-12 if method in EXACT else 1e-8
    for name in ("W", "U", "b"):
        for k, (a, b) in enumerate(zip(getattr(ours, name), getattr(reference, name))):
            assert isinstance(a, torch.Tensor)
            assert np.abs(a.numpy() - b).max() <= bound * np.abs(b).max(), (name, k)


@pytest.mark.parametrize("cell", ["gru", "lstm", "recurrence"])
def test_a_recurrence_moved_to_torch_runs_every_pass_there(cell):
    """GRU, LSTM and a user's cell on tensors: forward, Newton family and backprop as on NumPy."""
    if cell == "recurrence":
        def step(p, h, x):
            return torch.tanh(p["W"] @ h + p["U"] @ x)

        rng = np.random.default_rng(0)
        net = pp.Recurrence(step, {"W": rng.standard_normal((3, 3)) * 0.5,
                                   "U": rng.standard_normal((3, 2))}, state_size=3,
                            input_size=2)
    else:
        net = (pp.GRU if cell == "gru" else pp.LSTM)(2, 3, num_layers=2, seed=0)
    xs = np.random.default_rng(1).standard_normal((12, 2, 3))
    moved = net.to("torch")
    assert moved.backend.name == "torch" and net.backend.name == "numpy"
    X = torch.from_numpy(xs)
    ours, theirs = moved.forward(X), net.forward(xs)
    assert isinstance(ours.z[1], torch.Tensor)
    np.testing.assert_allclose(ours.z[1].numpy(), theirs.z[1], rtol=1e-13, atol=1e-14)
    for linearization in ("newton", "quasi", "damped"):
        trace = pp.forward(moved, X, method="cyclic-reduction", linearization=linearization)
        assert isinstance(trace.z[1], torch.Tensor), linearization
        np.testing.assert_allclose(trace.z[1].numpy(), theirs.z[1], rtol=0, atol=1e-9)
    target = np.random.default_rng(2).standard_normal(net.outputs(theirs).shape)
    for method in ("substitution", "cyclic-reduction"):
        g = pp.backprop(moved, X, torch.from_numpy(target), method=method)
        reference = pp.backprop(net, xs, target, method="substitution")
        for name, value in reference.parameters.items():
            assert isinstance(g.parameters[name], torch.Tensor)
            np.testing.assert_allclose(g.parameters[name].numpy(), value, rtol=1e-11,
                                       atol=1e-13)
        np.testing.assert_allclose(g.x.numpy(), reference.x, rtol=1e-11, atol=1e-13)
    with pytest.raises(ValueError, match="kind must be one of"):
        net.to("rocm")
