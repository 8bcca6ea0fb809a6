"""The accuracy contract: CONVERGED means every layer and every time step is right.

Every registered method that applies, with its default options, on the networks
where a global residual rule fails: a deep sigmoid MLP whose lowest layers'
gradients are 1e-12 of the top ones (vanishing gradients), and an RNN whose loss
sits on the last step only, so that early steps' dx are tiny. The reference is
PyTorch autograd, layer by layer and step by step. A method either reports
CONVERGED and is right everywhere, or reports that it is not.
"""

import numpy as np
import pytest

import propop as pp
from cases import BREAK_DOWN, excused
from reference import torch, torch_gradients

METHODS = [s.name for s in pp.solvers.available() if s.available]
PER_LAYER = 1e-8  # CONVERGED at rtol=1e-10: each block within the contract (module docstring)


def layer_errors(ours, reference):
    return [float(np.linalg.norm(np.asarray(a) - b) / np.linalg.norm(b))
            for a, b in zip(ours, reference)]


def applies(method, system):
    return pp.solvers.info(method).applies_to(system)


@pytest.fixture(scope="module")
def vanishing():
    """20 sigmoid layers of width 16, batch 4: dW[0] is ~1e-12 of dW[19]."""
    net = pp.FNN.random([16] * 21, activation="sigmoid", seed=0)
    rng = np.random.default_rng(1)
    x, t = rng.standard_normal((16, 4)), rng.standard_normal((16, 4))
    _, dW, db, dx = torch_gradients(net, x, t)
    assert np.linalg.norm(dW[0]) < 1e-10 * np.linalg.norm(dW[-1])  # the case is hostile
    return net, x, t, dW, db, dx


@pytest.mark.parametrize("method", METHODS)
def test_converged_means_every_layer_is_right_with_vanishing_gradients(method, vanishing):
    net, x, t, dW, db, dx = vanishing
    system = pp.backward_system(net, net.forward(x), net.forward(x).output - t)
    if not applies(method, system):
        return
    g = pp.backprop(net, x, t, method=method, check=False)
    if method in BREAK_DOWN:
        assert g.solution.status is pp.Status.BREAKDOWN and g.solution.message
        return
    if excused(method, g.solution):
        return
    assert g.solution.converged, g.solution.message
    limit = 1e-12 if pp.solvers.info(method).exact else PER_LAYER
    assert max(layer_errors(g.W, dW)) < limit, layer_errors(g.W, dW)
    assert max(layer_errors(g.b, db)) < limit
    assert layer_errors([g.x], [dx])[0] < limit


def rnn_case(tau=30, r=3):
    rnn = pp.RNN.random([4, 8, 8], activation="tanh", seed=0)
    rng = np.random.default_rng(1)
    xs = rng.standard_normal((tau, 4, r))
    trace = rnn.forward(xs)
    eps = np.zeros_like(trace.output)
    eps[-1] = rng.standard_normal((8, r))  # the loss at the last step only
    return rnn, xs, trace, eps


def torch_rnn_dx(rnn, xs, eps):
    """Per-step dx of sum(output * eps) through torch.nn.RNN (b_ih = b, b_hh = 0)."""
    module = torch.nn.RNN(4, 8, num_layers=2, dtype=torch.float64)
    with torch.no_grad():
        for k in range(2):
            getattr(module, f"weight_ih_l{k}").copy_(torch.tensor(rnn.W[k]))
            getattr(module, f"weight_hh_l{k}").copy_(torch.tensor(rnn.U[k]))
            getattr(module, f"bias_ih_l{k}").copy_(torch.tensor(rnn.b[k]))
            getattr(module, f"bias_hh_l{k}").zero_()
    X = torch.tensor(xs).permute(0, 2, 1).clone().requires_grad_(True)  # (tau, r, n)
    out, _ = module(X)
    (out * torch.tensor(eps).permute(0, 2, 1)).sum().backward()
    return X.grad.permute(0, 2, 1).numpy()


@pytest.mark.parametrize("method", METHODS)
def test_converged_means_every_time_step_is_right_with_the_loss_at_the_end(method):
    rnn, xs, trace, eps = rnn_case()
    dx = torch_rnn_dx(rnn, xs, eps)
    assert np.linalg.norm(dx[0]) < 1e-6 * np.linalg.norm(dx[-1])  # the case is hostile
    system = pp.backward_system(rnn, trace, eps)
    if not applies(method, system):
        return
    solution = pp.solve(system, method)
    if method in BREAK_DOWN:
        assert solution.status is pp.Status.BREAKDOWN and solution.message
        return
    if excused(method, solution):
        return
    assert solution.converged, solution.message
    g = rnn.gradients(trace, rnn.unstack(system, solution.x))
    limit = 1e-12 if pp.solvers.info(method).exact else PER_LAYER
    assert max(layer_errors(g.x, dx)) < limit, max(layer_errors(g.x, dx))


@pytest.mark.parametrize("method", [m for m in METHODS if not pp.solvers.info(m).exact])
def test_a_truncated_solve_is_never_converged_and_names_the_block(method, vanishing):
    net, x, t, *_ = vanishing
    system = pp.backward_system(net, net.forward(x), net.forward(x).output - t)
    if not applies(method, system) or method in BREAK_DOWN:
        return
    solution = pp.solve(system, method, maxiter=5)
    assert solution.status is pp.Status.MAX_ITER
    assert "block v[" in solution.message and "raise maxiter" in solution.message
    assert solution.info["block_ratios"].max() > 1


@pytest.mark.parametrize("method", METHODS)
def test_float32_works_out_of_the_box_with_every_method_that_works_in_float64(method):
    net64 = pp.FNN.random([16] * 9, activation="tanh", seed=0)
    net32 = pp.FNN([W.astype("float32") for W in net64.W],
                   [b.astype("float32") for b in net64.b], "tanh")
    rng = np.random.default_rng(1)
    x, t = rng.standard_normal((16, 5)), rng.standard_normal((16, 5))
    _, dW, _, _ = torch_gradients(net64, x, t)
    system = pp.backward_system(net32, net32.forward(x), net32.forward(x).output - t)
    if not applies(method, system) or method in BREAK_DOWN:
        return
    g = pp.backprop(net32, x.astype("float32"), t.astype("float32"), method=method,
                    check=False)
    if excused(method, g.solution):
        return
    assert g.solution.converged and g.W[0].dtype == np.float32
    assert g.solution.info.get("rtol", 1.2e-5) == pytest.approx(1.2e-5, rel=0.01)
    assert max(layer_errors(g.W, dW)) < 1e-4


@pytest.mark.parametrize("method", ["bicgstab", "batched-gmres", "scipy.gmres", "jacobi"])
def test_an_rtol_below_the_dtype_says_so(method):
    net = pp.FNN.random([8] * 5, activation="tanh", seed=0, dtype="float32")
    x = np.random.default_rng(1).standard_normal((8, 2)).astype("float32")
    system = pp.backward_system(net, net.forward(x), np.ones((8, 2), dtype="float32"))
    solution = pp.solve(system, method, rtol=1e-12, maxiter=2)
    assert solution.status is pp.Status.MAX_ITER
    assert "rtol is below what float32 can reach (about 1e-06)" in solution.message


def test_the_default_rtol_follows_the_dtype():
    from propop.solvers.convergence import default_rtol

    assert default_rtol(np.float64) == 1e-10
    assert default_rtol(np.float32) == pytest.approx(100 * np.finfo(np.float32).eps)
    assert default_rtol(np.float16) == pytest.approx(100 * np.finfo(np.float16).eps)
