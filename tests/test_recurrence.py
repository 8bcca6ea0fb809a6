"""Recurrent cells by their Jacobians (GRU, LSTM, any step) against PyTorch, step by step."""

import numpy as np
import pytest

import propop as pp
from cases import relative_error
from propop.networks import gated
from reference import torch

nn = torch.nn
METHODS = ["substitution", "cyclic-reduction", "parallel-cyclic-reduction", "jacobi",
           "batched-gmres", "scipy.gmres"]
TAU, R = 9, 3


def autograd(module, xs):
    """Output, dx and parameter gradients of ``1/2 ||module(xs)||^2`` (propop layouts)."""
    module.zero_grad()
    X = torch.tensor(np.moveaxis(xs, 2, 1) if xs.ndim == 3 else xs[:, None, :],
                     requires_grad=True)
    out = module(X)[0]
    (0.5 * (out**2).sum()).backward()
    to_ours = (lambda t: np.moveaxis(t, 1, 2)) if xs.ndim == 3 else (lambda t: t[:, 0])
    return (to_ours(out.detach().numpy()), to_ours(X.grad.numpy()),
            {k: p.grad.numpy() for k, p in module.named_parameters()})


@pytest.fixture(params=["GRU", "LSTM"])
def cell(request):
    torch.manual_seed(0)
    module = getattr(nn, request.param)(3, 4, num_layers=2).double()
    return module, pp.from_torch(module)


@pytest.mark.parametrize("batch", [True, False])
@pytest.mark.parametrize("method", METHODS)
def test_gated_cells_backpropagate_like_autograd_at_every_step(cell, method, batch):
    module, net = cell
    assert isinstance(net, getattr(pp, type(module).__name__))
    xs = np.random.default_rng(1).standard_normal((TAU, 3, R) if batch else (TAU, 3))
    out, dx, params = autograd(module, xs)
    trace = net.forward(xs)
    for s in range(TAU):  # the output of every step, every sample
        assert relative_error(net.outputs(trace)[s], out[s]) < 1e-13, s
    g = pp.backprop(net, xs, np.zeros_like(out), method=method)
    assert g.solution.converged
    for s in range(TAU):
        assert relative_error(g.x[s], dx[s]) < 1e-10, (method, s)
    assert set(g.parameters) == set(params)
    for name, value in params.items():
        assert relative_error(g.parameters[name], value) < 1e-10, (method, name)


def test_every_step_of_the_backward_solution_is_the_adjoint(cell):
    """``v_s = dE/dh_s`` per step against autograd's gradients of the states."""
    module, net = cell
    xs = np.random.default_rng(2).standard_normal((TAU, 3, R))
    trace = net.forward(xs)
    eps = net.loss_gradient(trace, np.zeros((TAU, 4, R)))
    system = pp.backward_system(net, trace, eps)
    assert system.per_sample_couplings and system.nblocks == TAU
    v_expected = [None] * TAU
    v = torch.tensor(np.moveaxis(eps, 2, 1))
    X = torch.tensor(np.moveaxis(xs, 2, 1))
    H = torch.tensor(np.moveaxis(trace.z[1], 2, 1))
    previous = torch.cat([torch.zeros_like(H[:1]), H[:-1]])
    J = torch.stack([torch.func.vmap(torch.func.jacfwd(net.step, argnums=1), in_dims=(None, 0, 0))(
        net.parameters, previous[s], X[s]) for s in range(TAU)])  # forward-mode: independent
    for s in range(TAU - 1, -1, -1):  # the sequential adjoint recursion, written out
        total = v[s] if s == TAU - 1 else v[s] + (J[s + 1].transpose(1, 2)
                                                  @ v_expected[s + 1][..., None])[..., 0]
        v_expected[s] = total
    for method in ("substitution", "cyclic-reduction"):
        V = pp.solve(system, method).x.reshape(TAU, net.state_size, R)
        for s in range(TAU):
            assert relative_error(V[s], v_expected[s].numpy().T) < 1e-12, (method, s)


@pytest.mark.parametrize("linearization", ["newton", "quasi"])
def test_newton_forward_reaches_the_sequential_states(cell, linearization):
    module, net = cell
    xs = np.random.default_rng(3).standard_normal((TAU, 3, R))
    exact = net.forward(xs).z[1]
    f = pp.forward(net, xs, method="cyclic-reduction", linearization=linearization,
                   maxiter=40)
    assert f.info["converged"] and f.info["residuals"][-1] <= 1e-10
    for s in range(TAU):
        assert relative_error(f.z[1][s], exact[s]) < 1e-10, s
    if linearization == "newton":  # exact after at most tau iterations, fewer here
        assert f.info["iterations"] <= TAU


def minimal_step(p, h, x):
    """A diagonal recurrence with a tanh: the shape of a quasi-DEER cell."""
    return torch.tanh(p["a"] * h + p["B"] @ x)


def rows_step(p, h, x):
    """:func:`minimal_step` written on the last axis: one sample or a batch's rows."""
    return torch.tanh(p["a"] * h + x @ p["B"].T)


def minimal_jacobian(p, h, x):
    return torch.diag(p["a"] * (1 - torch.tanh(p["a"] * h + p["B"] @ x) ** 2))


def rows_jacobian(p, h, x):
    """:func:`minimal_jacobian` of a batch's rows, ``(r, n, n)``: ``jacobian_batched=True``."""
    assert h.ndim == 2, "called on one sample: vmap wrapped a Jacobian written for rows"
    return torch.diag_embed(p["a"] * (1 - torch.tanh(p["a"] * h + x @ p["B"].T) ** 2))


def test_any_step_function_with_jacrev_or_its_own_jacobian():
    rng = np.random.default_rng(4)
    parameters = {"a": rng.uniform(0.5, 1.0, 5), "B": rng.standard_normal((5, 2))}
    xs = rng.standard_normal((TAU, 2, R))
    t = {k: torch.tensor(v, requires_grad=True) for k, v in parameters.items()}
    X = torch.tensor(np.moveaxis(xs, 2, 1), requires_grad=True)
    h, loss = torch.zeros(R, 5, dtype=torch.float64), 0
    for s in range(TAU):  # the loop a PyTorch user writes
        h = torch.tanh(t["a"] * h + X[s] @ t["B"].T)
        loss = loss + 0.5 * (h**2).sum()
    loss.backward()
    for step, jacobian, batched in ((minimal_step, None, False),
                                    (minimal_step, minimal_jacobian, False),
                                    (rows_step, None, True),  # no vmap: rows as they are
                                    (rows_step, rows_jacobian, True)):  # the Jacobian too
        net = pp.Recurrence(step, parameters, state_size=5, input_size=2,
                            jacobian=jacobian, batched=batched,
                            jacobian_batched=jacobian is rows_jacobian)
        g = pp.backprop(net, xs, np.zeros((TAU, 5, R)), method="cyclic-reduction")
        for name in parameters:
            assert relative_error(g.parameters[name], t[name].grad.numpy()) < 1e-12, name
        assert relative_error(g.x, np.moveaxis(X.grad.numpy(), 2, 1)) < 1e-12
        newton = pp.forward(net, xs, method="cyclic-reduction")  # from h_{-1} = 0 too
        assert relative_error(newton.z[1], net.forward(xs).z[1]) < 1e-10


@pytest.mark.parametrize("kind", ["GRU", "LSTM"])
def test_a_one_unit_cell_of_one_sample_backpropagates_by_cyclic_reduction(kind):
    """Its reduced time chain comes back as a reversed view, which PyTorch takes as a copy.

    (One unit, one sample: the entrywise reduction hands its solution back as a view,
    and the backward pass's time order is the steps reversed.)
    """
    torch.manual_seed(910)
    module = getattr(nn, kind)(3, 1).double()
    xs = np.random.default_rng(2).standard_normal((5, 3))
    out, dx, params = autograd(module, xs)
    g = pp.backprop(pp.from_torch(module), xs, np.zeros_like(out), method="cyclic-reduction")
    for s in range(5):
        assert relative_error(g.x[s], dx[s]) < 1e-12, s
    for name, value in params.items():
        assert relative_error(g.parameters[name], value) < 1e-12, name


def test_parameters_and_inputs_given_as_reversed_views_are_read_as_copies():
    """PyTorch has no negative strides: a NumPy view with one is copied, not refused."""
    rng = np.random.default_rng(5)
    parameters = {"a": rng.uniform(0.5, 1.0, 5), "B": rng.standard_normal((2, 5))}
    xs = rng.standard_normal((TAU, 2, R))
    reversed_views = {"a": parameters["a"][::-1].copy()[::-1], "B": parameters["B"][::-1].T}
    assert all(min(v.strides) < 0 for v in reversed_views.values())
    copies = {k: np.ascontiguousarray(v) for k, v in reversed_views.items()}
    ours, plain = (pp.Recurrence(minimal_step, p, state_size=5, input_size=2)
                   for p in (reversed_views, copies))
    view = xs[..., ::-1]  # the samples reversed: a negative stride
    assert min(view.strides) < 0
    reference = plain.forward(np.ascontiguousarray(view)).z[1]
    assert relative_error(ours.forward(view).z[1], reference) < 1e-15
    g, h = (pp.backprop(net, x, np.zeros((TAU, 5, R)), method="cyclic-reduction")
            for net, x in ((ours, view), (plain, np.ascontiguousarray(view))))
    for name in parameters:
        assert relative_error(g.parameters[name], h.parameters[name]) < 1e-14, name


@pytest.mark.parametrize("r", [1, 4, 5, 9])  # sample by sample up to 4, under vmap above
def test_a_one_sample_step_runs_any_batch_as_the_loop_a_user_writes(r):
    """The sequential pass of a step written for one sample: each sample's own loop."""
    from propop.networks import recurrence

    assert recurrence.SAMPLE_BY_SAMPLE == 4
    rng = np.random.default_rng(r)
    parameters = {"a": rng.uniform(0.5, 1.0, 5), "B": rng.standard_normal((5, 2))}
    xs = rng.standard_normal((TAU, 2, r))
    t = {k: torch.tensor(v) for k, v in parameters.items()}
    expected = np.empty((TAU, 5, r))
    for i in range(r):
        h = torch.zeros(5, dtype=torch.float64)
        for s in range(TAU):
            h = minimal_step(t, h, torch.tensor(xs[s, :, i]))
            expected[s, :, i] = h.numpy()
    net = pp.Recurrence(minimal_step, parameters, state_size=5, input_size=2)
    np.testing.assert_allclose(net.forward(xs).z[1], expected, rtol=1e-14, atol=1e-15)
    broadcast = pp.Recurrence(lambda p, h, x: minimal_step(p, h, x)[None, :], parameters,
                              state_size=5, input_size=2)  # (1, 5) for one sample
    with pytest.raises(ValueError, match=r"the step returned shape \(1, 5\) for one sample"):
        broadcast.forward(xs)


def _user_loop(step, parameters, xs):
    """The loop a user writes: each sample's own ``step(p, h, x, s)``, ``(tau, n, r)``."""
    t = {k: torch.tensor(v) for k, v in parameters.items()}
    out = np.empty((xs.shape[0], 5, xs.shape[2]))
    for i in range(xs.shape[2]):
        h = torch.zeros(5, dtype=torch.float64)
        for s in range(xs.shape[0]):
            h = step(t, h, torch.tensor(xs[s, :, i]), s)
            out[s, :, i] = h.numpy()
    return out


def _counted_long_sequence(seed, r):
    """``(net, parameters, xs, expected, calls)``: a step that counts its calls, TRACED_STEPS long.

    ``expected`` is the user's loop of the same step; ``calls`` grows by one a call.
    """
    from propop.networks import recurrence

    rng = np.random.default_rng(seed)
    parameters = {"a": rng.uniform(0.5, 1.0, 5), "B": rng.standard_normal((5, 2))}
    xs = rng.standard_normal((recurrence.TRACED_STEPS, 2, r))
    calls = []

    def counted(p, h, x):
        calls.append(1)
        return minimal_step(p, h, x)

    expected = _user_loop(lambda p, h, x, s: minimal_step(p, h, x), parameters, xs)
    net = pp.Recurrence(counted, parameters, state_size=5, input_size=2)
    return net, parameters, xs, expected, calls


def test_a_long_sequence_runs_the_vmapped_step_as_one_recorded_graph(monkeypatch):
    """From TRACED_STEPS steps the batched step runs as one recorded graph, not vmap.

    Recorded once (make_fx), the same states as the user's loop; a step whose recording
    would differ (a Python side effect), or that cannot be recorded, runs under vmap.
    """
    from torch.fx.experimental import proxy_tensor

    from propop.networks import recurrence

    tau = recurrence.TRACED_STEPS
    net, parameters, xs, expected, calls = _counted_long_sequence(11, 6)
    np.testing.assert_allclose(net.forward(xs).z[1], expected, rtol=1e-14, atol=1e-15)
    assert len(calls) <= 3  # recorded once, one vmap call to compare: not tau calls
    calls.clear()
    np.testing.assert_allclose(net.forward(xs[:-1]).z[1], expected[:-1], rtol=1e-14,
                               atol=1e-15)
    assert len(calls) == tau - 1  # shorter: vmap at every step

    count = [0]

    def drifting(p, h, x):  # a Python side effect: each call adds one more
        count[0] += 1
        return minimal_step(p, h, x) + count[0]

    drifted = pp.Recurrence(drifting, parameters, state_size=5, input_size=2).forward(xs)
    before = count[0] - tau  # the recording's calls and the comparison's, then the loop's
    assert before >= 2
    np.testing.assert_allclose(drifted.z[1], _user_loop(
        lambda p, h, x, s: minimal_step(p, h, x) + before + 1 + s, parameters, xs),
        rtol=1e-14, atol=1e-13)

    def refused(*args, **kwargs):
        raise RuntimeError("cannot record")

    monkeypatch.setattr(proxy_tensor, "make_fx", refused)
    calls.clear()
    np.testing.assert_allclose(net.forward(xs).z[1], expected, rtol=1e-14, atol=1e-15)
    assert len(calls) == tau


def test_a_long_sequences_bad_step_is_named_as_a_short_ones():
    """Recorded or not, a step of the wrong shape is named, and a step's own error is its."""
    from propop.networks import recurrence

    rng = np.random.default_rng(12)
    parameters = {"a": rng.uniform(0.5, 1.0, 5), "B": rng.standard_normal((5, 2))}
    xs = rng.standard_normal((recurrence.TRACED_STEPS, 2, 6))
    broadcast = pp.Recurrence(lambda p, h, x: minimal_step(p, h, x)[None, :], parameters,
                              state_size=5, input_size=2)
    with pytest.raises(ValueError, match=r"the step returned shape \(1, 5\) for one sample"):
        broadcast.forward(xs)

    def broken(p, h, x):
        raise ArithmeticError("the user's own error")

    with pytest.raises(ArithmeticError, match="the user's own error"):
        pp.Recurrence(broken, parameters, state_size=5, input_size=2).forward(xs)


def test_the_recurrence_benchmark_row_agrees_with_its_loop():
    """benchmarks.gru's pp.Recurrence row: the same states as the cell's rows in a loop."""
    from benchmarks import gru

    row = gru.recurrence_row(batch=6, tau=300, n=4)
    assert row["deviation"] < 1e-12 and set(row["overhead_us"]) == {"one sample", "batched"}
    assert "n=4 batch=6 tau=300" in gru.recurrence_table([row])


def numpy_step(p, h, x):
    return np.tanh(p["a"] * h + x @ p["B"].T)


def numpy_jacobian(p, h, x):
    slope = 1 - numpy_step(p, h, x) ** 2
    return (slope * p["a"])[:, :, None] * np.eye(h.shape[1])


def numpy_vjp(p, h, x, v):
    u = v * (1 - numpy_step(p, h, x) ** 2)  # v^T dF/d(pre-activation)
    return {"a": (u * h).sum(axis=0), "B": u.T @ x}, u @ p["B"]


def test_a_numpy_step_with_its_jacobian_and_vjp_equals_the_torch_one():
    rng = np.random.default_rng(5)
    parameters = {"a": rng.uniform(0.5, 1.0, 5), "B": rng.standard_normal((5, 2))}
    xs = rng.standard_normal((TAU, 2, R))
    mine = pp.Recurrence(numpy_step, parameters, state_size=5, input_size=2,
                         jacobian=numpy_jacobian, vjp=numpy_vjp, backend="numpy")
    theirs = pp.Recurrence(minimal_step, parameters, state_size=5, input_size=2)
    np.testing.assert_allclose(mine.forward(xs).z[1], theirs.forward(xs).z[1], rtol=1e-13,
                               atol=1e-15)
    for method in ("substitution", "cyclic-reduction"):
        a = pp.backprop(mine, xs, np.zeros((TAU, 5, R)), method=method)
        b = pp.backprop(theirs, xs, np.zeros((TAU, 5, R)), method=method)
        for name in parameters:
            assert relative_error(a.parameters[name], b.parameters[name]) < 1e-12, name
        assert relative_error(a.x, b.x) < 1e-12
    f = pp.forward(mine, xs, method="cyclic-reduction", linearization="damped")
    assert relative_error(f.z[1], theirs.forward(xs).z[1]) < 1e-10
    with pytest.raises(ValueError, match="backend='numpy' needs jacobian"):
        pp.Recurrence(numpy_step, parameters, state_size=5, input_size=2, backend="numpy")
    bare = pp.Recurrence(numpy_step, parameters, state_size=5, input_size=2,
                         jacobian=numpy_jacobian, backend="numpy")
    with pytest.raises(ValueError, match="need vjp\\(parameters"):
        pp.backprop(bare, xs, np.zeros((TAU, 5, R)))


def test_state_dict_round_trips_a_gated_cell(cell):
    module, net = cell
    other = type(module)(3, 4, num_layers=2).double()
    other.load_state_dict(pp.state_dict(net))
    xs = torch.randn(5, 2, 3, dtype=torch.float64)
    with torch.no_grad():
        assert torch.equal(other(xs)[0], module(xs)[0])


def test_bad_recurrences_are_named():
    with pytest.raises(ValueError, match="bidirectional=True or proj_size"):
        pp.from_torch(nn.LSTM(2, 3, proj_size=2))
    net = pp.GRU(2, 3)
    with pytest.raises(ValueError, match=r"xs has shape \(4, 3\), expected \(tau, 2\)"):
        net.forward(np.ones((4, 3)))
    with pytest.raises(ValueError, match="unknown linearization 'secant' for a recurrence"):
        pp.forward(net, np.ones((4, 2)), linearization="secant")
    with pytest.raises(ValueError, match="needs parameters \\['weight_ih_l0'"):
        pp.GRU(2, 3, parameters={})
    trace = net.forward(np.ones((4, 2, 2)))
    with pytest.raises(ValueError, match=r"eps has shape \(4, 3\), expected the states'"):
        pp.backward_system(net, trace, np.ones((4, 3)))


def test_gated_cells_without_biases_and_bad_settings():
    torch.manual_seed(9)
    module = nn.LSTM(3, 4, bias=False).double()
    xs = np.random.default_rng(9).standard_normal((TAU, 3, R))
    out, dx, _ = autograd(module, xs)
    net = pp.from_torch(module)
    assert relative_error(net.outputs(net.forward(xs)), out) < 1e-13  # zero biases
    step = lambda p, h, x: torch.tanh(h + x)  # noqa: E731
    with pytest.raises(ValueError, match="block_size 2 must divide the state size 3"):
        pp.Recurrence(step, {}, state_size=3, input_size=3, block_size=2)
    with pytest.raises(ValueError, match="dtype must be float32 or float64"):
        pp.Recurrence(step, {}, state_size=3, input_size=3, dtype="int64")
    with pytest.raises(ValueError, match="backend must be one of"):
        pp.Recurrence(step, {}, state_size=3, input_size=3, backend="jax")
    with pytest.raises(ValueError, match="vjp is for backend='numpy'"):
        pp.Recurrence(step, {}, state_size=3, input_size=3, vjp=lambda *a: None)


@pytest.mark.parametrize(("cell", "options"), [
    ("GRU", {}), ("LSTM", {}), ("ElmanRNN", {}), ("ElmanRNN", {"nonlinearity": "relu"})])
@pytest.mark.parametrize("side", ["tiny", "narrow", "wide"])
def test_the_built_in_cells_jacobians_in_closed_form_are_torch_funcs(cell, options, side):
    """The closed-form Jacobians (no backward pass) against jacrev, every layer coupled.

    Narrow states' stacks are written rows innermost, wider ones C-ordered, and
    blocks of at most 2 x 2 (one layer, ``tiny``) are left rows innermost: all here.
    """
    from torch.func import jacrev, vmap

    kind = getattr(gated, cell)
    hidden = (1 if cell == "LSTM" else 2) if side == "tiny" else \
        2 if side == "narrow" else kind.narrow_below  # the layouts of the stack
    net = kind(3, hidden, num_layers=1 if side == "tiny" else 3, seed=0, **options)
    assert (hidden < net.narrow_below) == (side != "wide")
    generator = torch.Generator().manual_seed(1)
    states = torch.randn(6, net.state_size, dtype=torch.float64, generator=generator)
    inputs = torch.randn(6, 3, dtype=torch.float64, generator=generator)
    reference = vmap(jacrev(net._step, argnums=1), in_dims=(None, 0, 0))(net.parameters,
                                                                         states, inputs)
    rows = net.cell.jacobians(states.numpy(), inputs.numpy())  # a batch's rows, no vmap
    torch.testing.assert_close(torch.from_numpy(rows), reference, rtol=1e-13, atol=1e-14)


@pytest.mark.parametrize(("kind", "options"), [
    ("GRU", {}), ("LSTM", {}), ("RNN", {}), ("RNN", {"nonlinearity": "relu"})])
@pytest.mark.parametrize("hidden", [2, 5])
def test_one_step_on_rows_and_on_a_vector_is_torchs_own_step(kind, options, hidden):
    """``_step`` feature-major on a batch's rows, and on one sample, against torch.nn's step.

    The reference is the module itself run for one step from a given state (its own
    kernel), every layer's new state compared, ``[h; c]`` per layer for an LSTM.
    """
    torch.manual_seed(3)
    module = getattr(nn, kind)(3, hidden, num_layers=3, **options).double()
    net = (gated.ElmanRNN if kind == "RNN" else getattr(gated, kind)).from_torch(module)
    r, g = 7, torch.Generator().manual_seed(4)
    x = torch.randn(r, 3, dtype=torch.float64, generator=g)
    h0 = torch.randn(3, r, hidden, dtype=torch.float64, generator=g)
    with torch.no_grad():
        if kind == "LSTM":
            c0 = torch.randn(3, r, hidden, dtype=torch.float64, generator=g)
            _, (h1, c1) = module(x[None], (h0, c0))
            state = torch.cat([h0, c0], -1).permute(1, 0, 2).reshape(r, -1)
            expected = torch.cat([h1, c1], -1).permute(1, 0, 2).reshape(r, -1)
        else:
            _, h1 = module(x[None], h0)
            state, expected = (a.permute(1, 0, 2).reshape(r, -1) for a in (h0, h1))
        rows = net._step(net.parameters, state, x)
        one = torch.stack([net._step(net.parameters, h, v) for h, v in zip(state, x)])
    for ours in (rows, one):
        torch.testing.assert_close(ours, expected, rtol=1e-13, atol=1e-14)


@pytest.mark.parametrize("tau", [1, 2, 7, 64, 1000])
def test_the_linear_scan_is_the_recurrence_step_by_step(tau):
    """``x_s = a_s x_{s-1} + b_s`` by the parallel prefix, against the loop (zeros included)."""
    from propop.networks.gated import linear_scan

    rng = np.random.default_rng(tau)
    a = torch.from_numpy(rng.uniform(-1.2, 1.2, (tau, 3, 4)))
    a[tau // 2] = 0.0  # a step that forgets everything before it
    b, first = torch.from_numpy(rng.standard_normal((tau, 3, 4))), torch.ones(3, 4).double()
    expected, x = [], first
    for s in range(tau):
        x = a[s] * x + b[s]
        expected.append(x)
    expected = torch.stack(expected)
    torch.testing.assert_close(linear_scan(a, b, first), expected, rtol=1e-12,
                               atol=1e-12 * float(expected.abs().max()))


def test_the_lstm_cell_states_at_every_step_are_the_sequential_ones():
    """``h`` from ``torch.nn.LSTM``'s kernel, ``c`` by the scan: as ``torch.lstm_cell`` steps."""
    torch.manual_seed(3)
    module = nn.LSTM(3, 5, num_layers=2).double()
    net = pp.from_torch(module)
    xs = np.random.default_rng(3).standard_normal((300, 3, 4))
    states = net.forward(xs).z[1]  # (tau, state, r): [h; c] per layer
    inputs = torch.from_numpy(xs.transpose(0, 2, 1).copy())
    for k in range(2):
        weights = [getattr(module, f"{n}_l{k}") for n in ("weight_ih", "weight_hh", "bias_ih",
                                                           "bias_hh")]
        h = c = torch.zeros(4, 5, dtype=torch.float64)
        hs, cs = [], []
        with torch.no_grad():
            for x_s in inputs:
                h, c = torch.lstm_cell(x_s, (h, c), *weights)
                hs.append(h)
                cs.append(c)
        ours = torch.from_numpy(states[:, 10 * k: 10 * (k + 1), :]).permute(0, 2, 1)
        torch.testing.assert_close(ours[..., :5], torch.stack(hs), rtol=1e-13, atol=1e-14)
        torch.testing.assert_close(ours[..., 5:], torch.stack(cs), rtol=1e-13, atol=1e-14)
        inputs = torch.stack(hs)


def wrapped_kernels_against_torch(cell, monkeypatch, check, tau):
    """A 2-layer ``cell``'s outputs over ``tau`` steps against the ``torch.nn`` module.

    PyTorch's recurrent kernel is wrapped by ``check(inputs, hx)``, called before it.
    """
    name = {"GRU": "gru", "RNN": "rnn_tanh", "LSTM": "lstm"}[cell]
    kernel = getattr(torch, name)
    monkeypatch.setattr(torch, name, lambda inputs, hx, *rest: (
        check(inputs, hx), kernel(inputs, hx, *rest))[1])
    torch.manual_seed(4)
    module = getattr(nn, cell)(3, 4, num_layers=2).double()
    net = getattr(gated, "ElmanRNN" if cell == "RNN" else cell).from_torch(module).to("torch")
    xs = np.random.default_rng(4).standard_normal((tau, 3, 5))
    ours = net.outputs(net.forward(torch.tensor(xs)))
    with torch.no_grad():
        theirs = module(torch.tensor(xs.transpose(0, 2, 1).copy()))[0]
    torch.testing.assert_close(ours.permute(0, 2, 1), theirs, rtol=1e-13, atol=1e-14)


@pytest.mark.parametrize("cell", ["GRU", "RNN", "LSTM"])
def test_the_sequence_kernels_get_contiguous_states_as_cudnn_needs(cell, monkeypatch):
    """The recurrent kernels get a contiguous initial state, as cuDNN needs.

    cuDNN refuses a non-contiguous ``hx`` ("rnn: hx is not contiguous", seen on an
    H200); the CPU kernels accept one, so the kernels here are wrapped to check it.
    """
    seen = []
    wrapped_kernels_against_torch(cell, monkeypatch, lambda inputs, hx: seen.append(
        all(h.is_contiguous() for h in (hx if isinstance(hx, tuple) else (hx,)))), 6)
    assert seen and all(seen), seen


@pytest.mark.parametrize("cell", ["GRU", "RNN", "LSTM"])
def test_sequences_longer_than_a_kernel_call_takes_run_in_chained_calls(cell, monkeypatch):
    """Each kernel call gets at most ``KERNEL_STEPS`` steps, from the last one's state.

    cuDNN's RNN kernels refuse more than 65535 (pytorch/pytorch#133751, seen on an H200
    at 65536). Emulated on the CPU with a limit of 4 steps and kernels that refuse
    more; 11 steps (three calls, the last one short) against the whole module.
    """
    lengths = []

    def limited(inputs, hx):
        lengths.append(inputs.shape[0])
        if inputs.shape[0] > 4:
            raise RuntimeError("cuDNN error: CUDNN_STATUS_NOT_SUPPORTED")

    monkeypatch.setattr(gated, "KERNEL_STEPS", 4)
    wrapped_kernels_against_torch(cell, monkeypatch, limited, 11)
    assert lengths == [4, 4, 3] * 2, lengths  # two layers, three calls each


def test_an_elman_network_longer_than_a_kernel_call_takes_runs_in_chained_calls(monkeypatch):
    """``pp.RNN``'s kernel forward on PyTorch arrays, 4 steps a call, against NumPy's loop."""
    kernel, lengths = torch.rnn_tanh, []
    monkeypatch.setattr(torch, "rnn_tanh", lambda inputs, *rest: (
        lengths.append(inputs.shape[0]), kernel(inputs, *rest))[1])
    monkeypatch.setattr(gated, "KERNEL_STEPS", 4)
    net = pp.RNN.random([3, 5], activation="tanh", seed=6)
    xs = np.random.default_rng(6).standard_normal((11, 3, 2))
    expected = net.forward(xs).z[1]
    ours = net.to("torch").forward(torch.tensor(xs)).z[1]
    assert lengths == [4, 4, 3], lengths
    np.testing.assert_allclose(ours.numpy(), expected, rtol=1e-13, atol=1e-14)


def test_cudnns_unflattened_weights_warning_is_not_shown_and_others_are(monkeypatch):
    """The kernels hide cuDNN's warning about unflattened weights, and only that one.

    cuDNN's "weights are not part of single contiguous chunk" (seen on an H200) is
    about propop's own weights, which the user cannot flatten. Emulated on the CPU:
    a kernel that warns as cuDNN does, then another way.
    """
    import warnings

    def warn(inputs, hx):
        warnings.warn(gated.UNFLATTENED + ". This means they need to be compacted at "
                      "every call, possibly greatly increasing memory usage.", UserWarning,
                      stacklevel=2)
        warnings.warn("something else", UserWarning, stacklevel=2)

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        wrapped_kernels_against_torch("GRU", monkeypatch, warn, 3)
    assert [str(w.message) for w in seen] == ["something else"] * 2, seen  # two layers


def rich_step(p, h, x):
    """A cell of many operations: products, gates, a sum over features, where, clamp, cat."""
    gate = torch.sigmoid(p["W"] @ h + p["U"] @ x)
    mixed = torch.cat([h[:2] * gate[:2], torch.tanh(h[2:] - gate[2:])])
    total = mixed.sum(dim=0, keepdim=True)
    return torch.where(mixed > 0, mixed, 0.5 * mixed).clamp(-2.0, 2.0) + 0.1 * total


def test_a_recorded_graph_calls_public_functions_with_the_same_states():
    """The recorded step's ATen overloads become ``torch.mm``, ``torch.add``, ...: same states.

    A cell of many operations over a long sequence (recorded, the public functions
    called) against the loop a user writes, sample by sample; the rewritten graph
    itself calls ``torch.mm`` and keeps the overloads ``torch`` has no function for.
    """
    from torch.fx.experimental.proxy_tensor import make_fx

    from propop.networks import recurrence

    rng = np.random.default_rng(13)
    parameters = {"W": 0.5 * rng.standard_normal((5, 5)), "U": rng.standard_normal((5, 2))}
    xs = rng.standard_normal((recurrence.TRACED_STEPS, 2, 6))
    net = pp.Recurrence(rich_step, parameters, state_size=5, input_size=2)
    expected = _user_loop(lambda p, h, x, s: rich_step(p, h, x), parameters, xs)
    np.testing.assert_allclose(net.forward(xs).z[1], expected, rtol=1e-14, atol=1e-15)

    def rows(h, x, W, U):  # a batch's rows: expand and view have no torch function
        return torch.tanh(1 - h @ W.T + (x @ U.T).expand(3, 5).reshape(3, 5))

    args = [torch.randn(3, 5, dtype=torch.float64), torch.randn(1, 2, dtype=torch.float64),
            torch.randn(5, 5, dtype=torch.float64), torch.randn(5, 2, dtype=torch.float64)]
    graph = make_fx(rows)(*args)
    public = recurrence._by_public_functions(graph)
    assert "torch.ops.aten.mm" in graph.code and "torch.ops.aten.mm" not in public.code
    assert "torch.mm(" in public.code and "torch.ops.aten.expand" in public.code
    assert "torch.ops.aten.rsub.Scalar" in graph.code and "torch.rsub(" in public.code
    assert torch.equal(public(*args), graph(*args)) and torch.equal(public(*args), rows(*args))
    only_views = make_fx(lambda h: h.expand(2, 3, 5))(args[0])  # nothing to call otherwise
    assert recurrence._by_public_functions(only_views) is only_views


@pytest.mark.parametrize(("r", "recorded"), [(2, False), (3, True), (4, True)])
def test_a_long_sequence_of_few_samples_takes_the_recorded_graph_from_three(r, recorded,
                                                                            monkeypatch):
    """Up to TRACED_SAMPLES samples each runs its own loop; more take the recorded graph.

    A step that cannot be recorded runs each sample's own loop again (up to
    SAMPLE_BY_SAMPLE), not ``vmap``; the states are the user's loop's either way.
    """
    from torch.fx.experimental import proxy_tensor

    from propop.networks import recurrence

    assert recurrence.TRACED_SAMPLES == 2
    tau = recurrence.TRACED_STEPS
    net, _, xs, expected, calls = _counted_long_sequence(14, r)
    np.testing.assert_allclose(net.forward(xs).z[1], expected, rtol=1e-14, atol=1e-15)
    assert len(calls) <= 3 if recorded else len(calls) == r * tau

    def refused(*args, **kwargs):
        raise RuntimeError("cannot record")

    monkeypatch.setattr(proxy_tensor, "make_fx", refused)
    calls.clear()
    np.testing.assert_allclose(net.forward(xs).z[1], expected, rtol=1e-14, atol=1e-15)
    assert len(calls) == r * tau  # each sample's own loop, not vmap's one call a step
