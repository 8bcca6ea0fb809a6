"""Hostile inputs, as a table, over every registered method.

Each case either has a right answer, checked layer by layer against PyTorch
autograd (exact methods to 1e-12, iterative ones to the accuracy contract when
they say CONVERGED), or a documented exception whose message names the culprit.
Never an internal error (IndexError, AttributeError, a NumPy reshape message),
never a wrong CONVERGED.
"""

from dataclasses import dataclass, replace
from typing import Any
from collections.abc import Callable

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

import propop as pp
from propop import layers as L
from cases import excused
from reference import dense, torch, torch_gradients

METHODS = [s.name for s in pp.solvers.available() if s.available]
# Block BiCGStab cannot deflate: dependent right-hand sides, or a block Krylov space that
# loses rank (a layer of width 1, say), are a breakdown it reports.
NO_DEFLATION = "block BiCGStab breakdown"
NAMED = (ValueError, TypeError, KeyError)


def named(error: BaseException, *words: str) -> None:
    """``error`` is a documented kind and its message names every one of ``words``."""
    assert isinstance(error, NAMED), f"{type(error).__name__}: {error}"
    for word in words:
        assert word in str(error), f"{word!r} not in {error}"


def check_every_method(system, reference_blocks, names=None):
    """Every method that applies: exact to 1e-12 per block, iterative CONVERGED to 1e-8."""
    for method in names or METHODS:
        info = pp.solvers.info(method)
        if not info.applies_to(system):
            continue
        solution = pp.solve(system, method)
        if excused(method, solution):
            continue
        if not solution.converged and method == "block-bicgstab" and \
                NO_DEFLATION in solution.message:
            assert solution.status is pp.Status.BREAKDOWN
            continue
        assert solution.converged, (method, solution.message)
        limit = 1e-12 if info.exact else 1e-8
        whole = np.linalg.norm(np.concatenate(reference_blocks))  # zero blocks: eps^2 of it
        for k, (ours, want) in enumerate(zip(system.split(solution.x), reference_blocks)):
            error = np.linalg.norm(ours - want)
            assert error <= limit * np.linalg.norm(want) + 1e-31 * whole, (method,
                                                                           system.names[k])


# -- options: every method, every bad value ----------------------------------------------

def small_system():
    net = pp.FNN.random([4, 5, 3], activation="tanh", seed=0)
    x = np.random.default_rng(1).standard_normal((4, 2))
    trace = net.forward(x)
    return pp.backward_system(net, trace, np.ones((3, 2)))


def shared_system():
    """One matrix for a batch of two, exactly: one input repeated."""
    net = pp.FNN.random([4, 5, 3], activation="tanh", seed=0)
    trace = net.forward(np.ones((4, 2)))
    return pp.backward_system(net, trace, np.array([[1.0, -1], [2, 0], [0, 1]])).shared()


def rnn_system():
    rnn = pp.RNN.random([3, 4], activation="tanh", seed=0)
    trace = rnn.forward(np.ones((4, 3, 2)))
    return pp.backward_system(rnn, trace, np.ones_like(trace.output))


def system_for(method):
    for system in (small_system(), rnn_system(), shared_system()):
        if pp.solvers.info(method).applies_to(system):
            return system
    raise AssertionError(method)


BAD_OPTIONS = [
    ("restrat", 3, "has no option 'restrat'"),
    ("rtol", -1.0, "rtol must be a number in [0, 1)"),
    ("rtol", float("inf"), "rtol must be a number in [0, 1)"),
    ("rtol", float("nan"), "rtol"),
    ("rtol", "1e-3", "rtol"),
    ("rtol", 1.5, "rtol must be a number in [0, 1)"),
    ("atol", -1.0, "atol must be a finite number >= 0"),
    ("atol", float("inf"), "atol must be a finite number >= 0"),
    ("maxiter", 0, "maxiter"),
    ("maxiter", -3, "maxiter"),
    ("maxiter", 2.5, "maxiter"),
    ("maxiter", True, "maxiter"),
    ("x0", "zeros", "x0"),
    ("M", "bogus", "M"),
    ("callback", 3, "callback"),
    ("verify", "yes", "verify"),
]


@pytest.mark.parametrize(("option", "value", "words"), BAD_OPTIONS,
                         ids=[f"{o}={v!r}" for o, v, _ in BAD_OPTIONS])
@pytest.mark.parametrize("method", METHODS)
def test_a_bad_option_is_named_with_the_method(method, option, value, words):
    system = system_for(method)
    with pytest.raises(NAMED) as raised:
        pp.solve(system, method, **{option: value})
    named(raised.value, method, option)
    takes = option in _signature(method)
    if takes:
        assert words in str(raised.value) or option in str(raised.value)
    else:
        assert f"has no option {option!r}" in str(raised.value)


def _signature(method):
    """The names of the options the method takes."""
    return {p.name for p in pp.solvers.info(method).method.parameters}


@pytest.mark.parametrize("method", [m for m in METHODS if "x0" in _signature(m)])
def test_x0_of_the_wrong_shape_or_with_nan_is_named(method):
    system = system_for(method)
    for x0, words in ((np.zeros(3), "x0 has shape"),
                      (np.full(system.rhs.shape, np.nan), "x0 contains NaN"),
                      (np.zeros(system.rhs.shape, dtype=complex), "x0 must be a real array")):
        with pytest.raises(NAMED) as raised:
            pp.solve(system, method, x0=x0)
        named(raised.value, method, words)


LITERALS = [("bicgstab", "shadow", "zero"), ("hybrid", "outer", "richardson"),
            ("cyclic-reduction", "within", "jacobi"), ("cyclic-reduction", "shared_diagonal",
                                                       "median"),
            ("block-gmres", "shared_diagonal", 1), ("batched-gmres", "restart", 0),
            ("block-gmres", "restart", -2), ("richardson", "omega", 3.0),
            ("block-gmres", "deflation_tol", 2.0), ("batched-gmres", "M", ("air", 3)),
            ("bicgstab", "M", ("block-jacobi", {"groop": 2})),
            ("bicgstab", "M", ("block-jacobi", {"group": 0}))]


@pytest.mark.parametrize(("method", "option", "value"), LITERALS)
def test_method_specific_options_are_checked_and_named(method, option, value):
    system = system_for(method)
    with pytest.raises(NAMED) as raised:
        pp.solve(system, method, **{option: value})
    named(raised.value, method)
    assert option in str(raised.value) or "group" in str(raised.value)


def test_an_option_for_another_kind_of_system_is_refused_not_ignored():
    with pytest.raises(ValueError, match="within applies to RNN systems only"):
        pp.solve(small_system(), "cyclic-reduction", within="substitution")
    with pytest.raises(ValueError, match="sparse applies to chains only"):
        pp.solve(rnn_system(), "cyclic-reduction", sparse=True)


# -- inputs: every network kind, every format ----------------------------------------------

@dataclass(frozen=True)
class Bad:
    """A call that must raise a documented error naming ``words``."""

    name: str
    call: Callable[[], Any]
    words: tuple


def fnn():
    return pp.FNN.random([4, 5, 3], activation="tanh", seed=0)


X, T = np.ones((4, 2)), np.zeros((3, 2))
BAD_INPUTS = [
    Bad("x-rows", lambda: pp.backprop(fnn(), np.ones((5, 2)), T), ("x has shape (5, 2)",)),
    Bad("x-3d", lambda: pp.backprop(fnn(), np.ones((4, 2, 1)), T), ("x has shape",)),
    Bad("x-complex", lambda: pp.backprop(fnn(), X * 1j, T), ("x has complex dtype",)),
    Bad("x-object", lambda: pp.backprop(fnn(), np.array([object()] * 4), T[:, 0]),
        ("x has dtype object",)),
    Bad("x-strings", lambda: pp.backprop(fnn(), ["a", "b", "c", "d"], T[:, 0]),
        ("x has dtype <U1",)),
    Bad("x-ragged", lambda: pp.backprop(fnn(), [[1, 2], [3], [4], [5]], T),
        ("x is not a rectangular array",)),
    Bad("x-empty-batch", lambda: pp.backprop(fnn(), np.ones((4, 0)), np.ones((3, 0))),
        ("no samples",)),
    Bad("x-nan", lambda: pp.backprop(fnn(), np.full((4, 2), np.nan), T), ("x contains NaN",)),
    Bad("target-shape", lambda: pp.backprop(fnn(), X, np.zeros((3, 3))), ("target has shape",)),
    Bad("target-complex", lambda: pp.backprop(fnn(), X, T * 1j), ("target has complex",)),
    Bad("target-inf", lambda: pp.backprop(fnn(), X, np.full((3, 2), np.inf)),
        ("target contains NaN or Inf",)),
    Bad("W-complex", lambda: pp.FNN([np.ones((3, 4)) * 1j]), ("layer 0: W[0] has complex",)),
    Bad("W-3d", lambda: pp.FNN([np.ones((3, 4, 1))]), ("layer 0: W[0] has 3 dimensions",)),
    Bad("W-sparse-complex", lambda: pp.FNN([sp.csr_array(np.ones((3, 4)) * 1j)]),
        ("layer 0: W[0] has dtype complex128",)),
    Bad("b-complex", lambda: pp.FNN([np.ones((3, 4))], [np.ones(3) * 1j]),
        ("layer 0: b[0] has complex",)),
    Bad("b-shape", lambda: pp.FNN([np.ones((3, 4))], [np.ones(4)]), ("layer 0: b[0]",)),
    Bad("b-not-a-list", lambda: pp.FNN([np.ones((3, 4))], np.ones(3)), ("b must be",)),
    Bad("trace-other-x", lambda: pp.backprop(fnn(), X, T, trace=fnn().forward(2 * X)),
        ("trace was computed from another input",)),
    Bad("trace-other-net", lambda: pp.backprop(fnn(), X, T, trace=pp.FNN.random(
        [4, 6, 3], seed=0).forward(X)), ("trace does not belong to this network",)),
    Bad("trace-not-a-trace", lambda: pp.backprop(fnn(), X, T, trace="forward"),
        ("trace must be a propop Trace",)),
    Bad("rnn-tau-0", lambda: pp.RNN.random([3, 4]).forward(np.ones((0, 3, 2))),
        ("xs has shape (0, 3, 2)",)),
    Bad("rnn-features", lambda: pp.RNN.random([3, 4]).forward(np.ones((5, 4))),
        ("xs has shape (5, 4)",)),
    Bad("rnn-empty-batch", lambda: pp.RNN.random([3, 4]).forward(np.ones((5, 3, 0))),
        ("no samples",)),
    Bad("rnn-complex", lambda: pp.RNN([np.ones((4, 3))], [np.eye(4) * 1j]),
        ("layer 0: U[0] has complex",)),
    Bad("rnn-eps-shape", lambda: pp.backward_system(
        pp.RNN.random([3, 4]), pp.RNN.random([3, 4]).forward(np.ones((5, 3))), np.ones(4)),
        ("eps has shape (4,)",)),
    Bad("graph-x-complex", lambda: pp.Graph.residual_mlp(4, 1).forward(np.ones(4) * 1j),
        ("x has complex",)),
    Bad("graph-dense-complex", lambda: L.Dense(np.ones((2, 2)) * 1j),
        ("Dense: W has complex",)),
    Bad("graph-dense-nan", lambda: L.Dense(np.full((2, 2), np.nan)),
        ("Dense: W contains NaN",)),
    Bad("graph-eps-count", lambda: pp.backward_system(
        pp.Graph.residual_mlp(4, 1), pp.Graph.residual_mlp(4, 1).forward(np.ones(4)),
        [np.ones(4), np.ones(4)]), ("1 outputs need 1 eps arrays",)),
    Bad("system-complex-rhs", lambda: pp.TriangularSystem(
        [np.ones((2, 2))], [None, None], np.ones(4) * 1j, lower=True, sizes=[2, 2]),
        ("rhs has dtype complex128",)),
    Bad("system-complex-coupling", lambda: pp.TriangularSystem(
        [np.ones((2, 2)) * 1j], [None, None], np.ones(4), lower=True, sizes=[2, 2]),
        ("coupling (1, 0), by which block 1 reads block 0, has complex",)),
    Bad("system-empty-block", lambda: pp.TriangularSystem(
        [np.ones((0, 2))], [None, None], np.ones(2), lower=True, sizes=[2, 0]),
        ("block sizes must be >= 1",)),
    Bad("structured-sizes-differ", lambda: structured(lambda s, sizes: (
        s, sizes[:5] + [4] + sizes[6:])), ("not the structure's (2, 3) repeated over 4",)),
    Bad("structured-empty-layer", lambda: structured(lambda s, sizes: (
        replace(s, sizes=(0, 3)), [0, 3] * 4)), ("block sizes must be >= 1",)),
]


def structured(change):
    """An RNN system rebuilt from its structure, with ``change(structure, sizes)`` made."""
    rnn = pp.RNN.random([2, 3], activation="tanh", seed=0)
    system = pp.backward_system(rnn, rnn.forward(np.ones((4, 2))), np.ones((4, 3)))
    structure, sizes = change(system.structure, list(system.sizes))
    return pp.TriangularSystem(None, None, np.ones(20), lower=False, sizes=sizes,
                               structure=structure, layer_scales=[None, None])


@pytest.mark.parametrize("case", BAD_INPUTS, ids=[c.name for c in BAD_INPUTS])
def test_bad_input_is_named(case):
    with pytest.raises(NAMED) as raised:
        case.call()
    named(raised.value, *case.words)


def fnn_with(weights, activation="tanh"):
    return pp.FNN(weights, [np.linspace(-0.1, 0.1, W.shape[0]) for W in weights], activation)


def with_duplicates(shape, seed):
    """A COO matrix with three entries stored twice: their values must add up."""
    A = sp.random_array(shape, density=0.6, rng=seed, format="coo")
    row, col = np.concatenate([A.row, A.row[:3]]), np.concatenate([A.col, A.col[:3]])
    return sp.coo_array((np.concatenate([A.data, A.data[:3]]), (row, col)), shape=shape)


FORMATS = ["coo", "csc", "dia", "lil", "bsr", "dok", "csr"]


@pytest.mark.parametrize("kind", ["array", "matrix"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_every_sparse_format_and_class_gives_the_right_gradients(fmt, kind):
    weights = [with_duplicates((6, 5), 1), with_duplicates((7, 6), 2),
               with_duplicates((4, 7), 3)]
    as_format = (lambda A: A.asformat(fmt)) if kind == "array" else (
        lambda A: getattr(sp, f"{fmt}_matrix")(A))
    net = fnn_with([as_format(W) for W in weights])
    reference = fnn_with([W.toarray() for W in weights])
    rng = np.random.default_rng(0)
    x, t = rng.standard_normal((5, 3)), rng.standard_normal((4, 3))
    _, dW, db, dx = torch_gradients(reference, x, t)
    masks = [W.toarray() != 0 for W in weights]
    for method in ("substitution", "cyclic-reduction", "batched-gmres", "jacobi"):
        g = pp.backprop(net, x, t, method=method)
        for k, (ours, want, mask) in enumerate(zip(g.W, dW, masks)):
            assert sp.issparse(ours) and ours.has_canonical_format
            np.testing.assert_allclose(dense(ours), want * mask, rtol=1e-9, atol=1e-12,
                                       err_msg=f"{method} W[{k}]")
        np.testing.assert_allclose(g.x, dx, rtol=1e-9, atol=1e-12)
    graph = pp.Graph(5)
    for k, W in enumerate(weights):
        graph.add(f"fc{k}", L.Dense(as_format(W), reference.b[k])).add(
            f"act{k}", L.Activation("tanh"))
    g = pp.backprop(graph, x, t, method="substitution")
    for k, (want, mask) in enumerate(zip(dW, masks)):
        np.testing.assert_allclose(dense(g.parameters[f"fc{k}"]["W"]), want * mask,
                                   rtol=1e-9, atol=1e-12)


def test_rnn_sparse_weights_give_sparse_gradients_on_their_pattern_and_train():
    W, U = with_duplicates((4, 3), 1).asformat("csc"), with_duplicates((4, 4), 2)
    sparse = pp.RNN([W], [U], [np.zeros(4)])
    dense_rnn = pp.RNN([W.toarray()], [U.toarray()], [np.zeros(4)])
    xs, t = np.random.default_rng(0).standard_normal((6, 3, 2)), np.zeros((6, 4, 2))
    g, ref = pp.backprop(sparse, xs, t), pp.backprop(dense_rnn, xs, t)
    np.testing.assert_allclose(g.W[0].toarray(), ref.W[0] * (W.toarray() != 0), atol=1e-14)
    np.testing.assert_allclose(g.U[0].toarray(), ref.U[0] * (U.toarray() != 0), atol=1e-14)
    model, history = pp.train(sparse, xs, t, loss="mse", batch_size=1, lr=0.01,
                              progress=False)
    assert sp.issparse(model.W[0]) and np.isfinite(history.epochs[-1]["loss"])


def test_rnn_with_one_time_step_and_a_batch_matches_the_reference_with_every_method():
    rnn = pp.RNN.random([3, 4, 4], activation="tanh", seed=0)
    xs = np.random.default_rng(0).standard_normal((1, 3, 2))
    trace = rnn.forward(xs)
    eps = np.ones_like(trace.output)
    v = rnn.backward(trace, eps)
    g = pp.backprop(rnn, xs, trace.output - eps, method="substitution")
    np.testing.assert_allclose(g.x, v[0], atol=1e-14)
    assert g.U[0].shape == (4, 4) and not g.U[0].any()  # no step to carry to
    check_every_method(pp.backward_system(rnn, trace, eps), [v[k][0] for k in range(3)])


def test_lists_integers_and_booleans_are_inputs_like_floats():
    net = fnn()
    reference = pp.backprop(net, X, T)
    for x in (X.tolist(), X.astype(int), X.astype(bool)):
        g = pp.backprop(net, x, T.tolist())
        np.testing.assert_array_equal(g.x, reference.x)
        assert all(np.array_equal(a, b) for a, b in zip(g.W, reference.W))


def test_a_chain_of_dense_and_sparse_couplings_reduces():
    graph = pp.FNN.random([6] * 4, seed=0).to_graph()  # dense W, sparse identities
    x, t = np.ones((6, 2)), np.zeros((6, 2))
    trace = graph.forward(x)
    system = pp.backward_system(graph, trace, graph.loss_gradient(trace, t))
    check_every_method(system, graph.backward(trace, graph.loss_gradient(trace, t)))


def test_overflow_is_nonfinite_never_converged_for_every_method():
    net = pp.FNN([1e30 * np.eye(3)] * 12, activation="identity")
    trace = net.forward(np.full(3, 1e-300))
    system = pp.backward_system(net, trace, np.ones(3))
    for method in METHODS:
        if pp.solvers.info(method).applies_to(system):
            assert not pp.solve(system, method).converged, method


# -- from_torch, training, forward ----------------------------------------------------------

class OddSequential(torch.nn.Sequential):
    def forward(self, x):
        return 2 * super().forward(x)


class OddLinear(torch.nn.Linear):
    def forward(self, x):
        return super().forward(x).clamp(max=0.1)


class OddLinearTan(torch.nn.Linear):
    def forward(self, x):
        return super().forward(x).tan()


class PlainSequential(torch.nn.Sequential):
    """A subclass that keeps Sequential's forward: imported as one."""


def test_from_torch_traces_what_subclasses_compute_and_names_what_it_cannot():
    """A subclass's own forward() is traced, not assumed to be its base class's."""
    from propop.interop.torch_import import Residual

    class OddResidual(Residual):
        def forward(self, x):
            return x - self.body(x)

    x = np.random.default_rng(0).standard_normal((3, 2))
    for module in (OddSequential(torch.nn.Linear(3, 2)),
                   torch.nn.Sequential(OddResidual(torch.nn.Linear(3, 3))),
                   PlainSequential(torch.nn.Linear(3, 2), torch.nn.Tanh()),
                   torch.nn.Sequential(OddLinear(3, 2))):  # its clamp, not Linear's output
        module = module.double()
        graph = pp.from_torch(module)
        expected = module(torch.tensor(x.T)).detach().numpy().T
        np.testing.assert_allclose(graph.output_values(graph.forward(x))[0], expected,
                                   rtol=1e-14, atol=1e-14)
    with pytest.raises(ValueError, match=r"node 'tan' .*test_hostile.py:\d+: return super"
                                         r"\(\).forward\(x\).tan\(\): unsupported method"):
        pp.from_torch(torch.nn.Sequential(OddLinearTan(3, 2)).double())
    hooked = torch.nn.Sequential(torch.nn.Linear(3, 2))
    hooked[0].register_forward_hook(lambda module, inputs, output: output * 2)
    with pytest.raises(ValueError, match="Linear at 0 has forward hooks") as raised:
        pp.from_torch(hooked.double())
    named(raised.value, "Linear at 0 has forward hooks")


TRAINING = [
    ("object x", dict(x=np.array([[object()] * 10] * 4)), "x has dtype object"),
    ("x_test alone", dict(x_test=np.ones((4, 3))), "x_test and y_test go together"),
    ("y_test alone", dict(y_test=np.zeros(3, dtype=int)), "x_test and y_test go together"),
    ("nan momentum", dict(optimizer="momentum", momentum=float("nan")), "momentum must be"),
    ("inf lr", dict(lr=float("inf")), "lr must be a finite number"),
    ("bad betas", dict(optimizer="adam", betas=(0.9, 1.0)), "betas must be"),
    ("zero eps", dict(optimizer="adam", eps=0.0), "eps must be"),
    ("complex y", dict(loss="mse", y=np.ones((3, 10)) * 1j), "y has complex"),
]


@pytest.mark.parametrize(("name", "change", "words"), TRAINING, ids=[c[0] for c in TRAINING])
def test_bad_training_settings_are_named(name, change, words):
    arguments = dict(x=np.ones((4, 10)), y=np.arange(10) % 3, progress=False)
    arguments.update(change)
    with pytest.raises(NAMED) as raised:
        pp.train(fnn(), arguments.pop("x"), arguments.pop("y"), **arguments)
    named(raised.value, words)


def test_training_takes_lists():
    x = np.random.default_rng(0).standard_normal((4, 10))
    y = list(np.arange(10) % 3)
    model, history = pp.train(fnn(), x.tolist(), y, epochs=1, batch_size=5, progress=False)
    _, reference = pp.train(fnn(), x, np.asarray(y), epochs=1, batch_size=5, progress=False)
    assert history.epochs[-1]["loss"] == reference.epochs[-1]["loss"]


def test_forward_stop_change_gets_its_extra_iterate_and_says_what_it_measured():
    net = fnn()
    trace = pp.forward(net, X, stop="change")
    np.testing.assert_allclose(trace.output, net.forward(X).output, atol=1e-14)
    assert trace.info["iterations"] == 3
    with pytest.raises(pp.ConvergenceError, match="relative change of the states"):
        pp.forward(net, X, stop="change", maxiter=1)


def test_the_forward_residual_checks_the_input_block():
    def wrong_input(system, **options):
        """Substitution, but block 0 (the input) is off."""
        solution = pp.solvers.get("substitution")(system, **options)
        solution.x[: system.sizes[0]] += 1.0
        return solution

    with pytest.raises(pp.ConvergenceError, match="nonlinear residual"):
        pp.forward(fnn(), X, method=wrong_input, maxiter=4)


# -- shapes that vary: hypothesis ------------------------------------------------------------

@settings(max_examples=30, deadline=None, derandomize=True)  # the same cases in every run
@given(sizes=st.lists(st.integers(1, 6), min_size=2, max_size=5),
       r=st.one_of(st.none(), st.integers(1, 3)),
       activation=st.sampled_from(["tanh", "relu", "sigmoid", "identity"]),
       density=st.sampled_from([1.0, 0.5]), seed=st.integers(0, 10**6))
def test_any_shape_every_method_is_right_per_block_or_says_why(sizes, r, activation, density,
                                                               seed):
    net = pp.FNN.random(sizes, activation=activation, density=density, seed=seed, bias=0.1)
    rng = np.random.default_rng(seed)
    shape = (sizes[0],) if r is None else (sizes[0], r)
    x = rng.standard_normal(shape)
    trace = net.forward(x)
    eps = rng.standard_normal(trace.output.shape)
    system = pp.backward_system(net, trace, eps)
    check_every_method(system, net.backward(trace, eps))
    with pytest.raises(ValueError, match="x has shape"):
        net.forward(rng.standard_normal((sizes[0] + 1,) + shape[1:]))


@pytest.mark.parametrize("sizes", [(4, 5, 3), (4, 4, 4)], ids=["unequal", "stacked"])
@pytest.mark.parametrize("density", [1.0, 0.6], ids=["dense", "sparse"])
def test_a_weight_with_inf_is_named_by_the_blocks_it_joins(sizes, density):
    """An Inf in ``W[1]``, whose tanh layer still gives a finite output.

    It was named as ``coupling_stack (index (j, i, k): coupling j)`` (one width), or
    not at all: unequal widths and sparse weights reached the solve, which said that
    a long product of Jacobians had overflowed.
    """
    net = pp.FNN.random(list(sizes), activation="tanh", seed=0, density=density)
    if density < 1:
        net.W[1].data[0] = np.inf
    else:
        net.W[1][0, 0] = np.inf
    x, t = np.ones((4, 2)), np.zeros((sizes[-1], 2))
    with np.errstate(invalid="ignore"):
        assert np.isfinite(net.forward(x).output).all()
        for run, block in ((lambda: pp.backprop(net, x, t), r"v\[1\] \(layer 0, W\[0\]\) "
                            r"reads v\[2\] \(layer 1, W\[1\]\)"),
                           (lambda: pp.forward(net, x, method="cyclic-reduction"),
                            r"z\[2\] \(layer 1, W\[1\]\) reads z\[1\] \(layer 0, W\[0\]\)")):
            with pytest.raises(ValueError, match=block + r", contains NaN or Inf"):
                run()


@pytest.mark.parametrize(("weights", "words"), [
    ("U", r"template \(layer 2 reads layer 2 one step later\)"),
    ("W", r"template \(layer 1 reads layer 2 at the same step\)")])
def test_an_rnn_weight_with_inf_is_named_by_its_template_and_step(weights, words):
    """``U[1]`` couples layer 2 across steps, ``W[1]`` layers 1 and 2 within one.

    Both were "template (layer 2 reads layer 2)" and "(layer 1 reads layer 2)" alone.
    """
    rnn = pp.RNN.random([3, 4, 4], seed=0)
    getattr(rnn, weights)[1][0, 0] = np.inf
    with np.errstate(invalid="ignore"), pytest.raises(ValueError,
                                                      match=words + r" contains NaN or Inf"):
        pp.backprop(rnn, np.ones((5, 3, 2)), np.zeros((5, 4, 2)))  # Inf * 0 in the pass
