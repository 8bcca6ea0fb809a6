"""Bad input fails loudly, with a message that names the culprit."""

import re

import numpy as np
import pytest
import scipy.sparse as sp

import propop as pp
from cases import Case


def test_mismatched_layer_sizes_name_the_layer():
    with pytest.raises(ValueError, match=r"layer 1: W\[1\] has shape \(2, 5\), expected "
                                         r"\(2, 4\) to follow layer 0's width 4"):
        pp.FNN([np.ones((4, 3)), np.ones((2, 5))])


def test_bias_shape_names_the_layer():
    with pytest.raises(ValueError, match=r"layer 0: b\[0\] has shape \(3,\), expected \(4,\)"):
        pp.FNN([np.ones((4, 3))], [np.ones(3)])


@pytest.mark.parametrize("where", ["W", "b", "sparse W"])
def test_nan_and_inf_in_parameters_are_rejected(where):
    W = [np.ones((3, 3)), np.ones((2, 3))]
    b = [np.zeros(3), np.zeros(2)]
    if where == "W":
        W[1][1, 2] = np.nan
        pattern = r"layer 1: W\[1\] contains NaN or Inf \(first at index \(1, 2\)\)"
    elif where == "b":
        b[0][2] = np.inf
        pattern = r"layer 0: b\[0\] contains NaN or Inf \(first at index \(2,\)\)"
    else:
        W[0] = sp.csr_array(np.diag([1.0, np.inf, 1.0]))
        pattern = r"layer 0: W\[0\] contains NaN or Inf \(first at index \(1, 1\)\)"
    with pytest.raises(ValueError, match=pattern):
        pp.FNN(W, b)


def test_bad_input_and_eps():
    net = pp.FNN.random([3, 4, 2])
    with pytest.raises(ValueError, match=r"x has shape \(4, 2\), expected \(3,\) or \(3, r\)"):
        net.forward(np.ones((4, 2)))
    with pytest.raises(ValueError, match=r"x contains NaN or Inf \(first at index \(1, 0\)\)"):
        net.forward(np.array([[0.0], [np.nan], [0.0]]))
    trace = net.forward(np.ones((3, 2)))
    with pytest.raises(ValueError, match=r"eps has shape \(2,\), expected \(2, 2\)"):
        net.backward(trace, np.ones(2))
    with pytest.raises(ValueError, match="eps contains NaN"):
        pp.backward_system(net, trace, np.full((2, 2), np.inf))


def test_unknown_names_list_the_known_ones():
    with pytest.raises(KeyError, match="unknown activation 'rleu'; known: .*relu"):
        pp.FNN([np.ones((2, 2))], activation="rleu")
    net, trace, eps, _ = Case((3, 2)).problem()
    with pytest.raises(KeyError, match="unknown solver 'gmress' .did you mean 'scipy.gmres'"):
        pp.solve(pp.backward_system(net, trace, eps), "gmress")
    with pytest.raises(ValueError, match="unknown linearization 'tangent'"):
        pp.forward_system(net, np.ones((3, 3)), linearization="tangent")
    with pytest.raises(ValueError, match="unknown form 'unscaled'"):
        pp.backward_system(net, trace, eps, form="unscaled")


def test_structure_errors():
    with pytest.raises(ValueError, match="W must be a non-empty sequence"):
        pp.FNN([])
    with pytest.raises(ValueError, match=r"W\[0\] has 1 dimensions, expected a 2-D matrix"):
        pp.FNN([np.ones(3)])
    with pytest.raises(ValueError, match="got 1 activations for 2 layers"):
        pp.FNN([np.ones((2, 2))] * 2, activation=["tanh"])
    with pytest.raises(ValueError, match="density must lie in"):
        pp.FNN.random([3, 3], density=0)


@pytest.mark.parametrize(("make", "error", "message"), [
    (lambda: pp.FNN.random(5), TypeError, r"sizes must be a sequence of widths"),
    (lambda: pp.RNN.random(3, 4), TypeError, r"sizes must be a sequence of widths"),
    (lambda: pp.FNN.random([3]), ValueError, r"at least two widths, got \[3\]"),
    (lambda: pp.FNN.random([3.5, 4]), TypeError, r"sizes\[0\] must be an integer, got 3.5"),
    (lambda: pp.RNN.random([3, True]), TypeError, r"sizes\[1\] must be an integer, got True"),
    (lambda: pp.FNN.random([3, 0]), ValueError, r"sizes\[1\] must be at least 1, got 0"),
    (lambda: pp.FNN.random([3, 4], density="0.5"), TypeError, r"density must be a real number"),
    (lambda: pp.train(pp.FNN.random([2, 2]), np.ones((2, 3)), np.array([0, 1, 0]), lr="0.1"),
     TypeError, r"lr must be a real number, got '0.1'"),
    (lambda: pp.train(pp.FNN.random([2, 2]), np.ones((2, 3)), np.array([0, 1, 0]),
                      optimizer="adam", betas=0.9), ValueError, r"betas must be two numbers"),
    (lambda: pp.FNN.random([3, 4], dtype="int64"), ValueError, r"float32 or float64, got 'int64'"),
    (lambda: pp.RNN.random([3, 4], dtype="float16"), ValueError, r"got 'float16'"),
    (lambda: pp.FNN.random([3, 4], dtype=None), ValueError, r"got None"),
    (lambda: pp.GRU(2.5, 3), TypeError, r"input_size must be an integer, got 2.5"),
    (lambda: pp.GRU("2", 3), TypeError, r"input_size must be an integer, got '2'"),
    (lambda: pp.LSTM(2, True), TypeError, r"hidden_size must be an integer, got True"),
    (lambda: pp.GRU(2, 0), ValueError, r"hidden_size must be at least 1, got 0"),
    (lambda: pp.LSTM(2, 3, num_layers=0), ValueError, r"num_layers must be at least 1"),
])
def test_sizes_and_dtypes_are_checked_not_truncated(make, error, message):
    # int() made 2.5 a width of 2 and True one of 1; dtype="int64" rounded the random
    # weights to integers and "float16" was float64; a width of 0 raised NumPy's errors
    with pytest.raises(error, match=message):
        make()


def test_a_torch_dtype_names_the_float_type():
    torch = pytest.importorskip("torch")
    assert pp.FNN.random([3, 4], dtype=torch.float32).dtype == np.float32
    assert pp.GRU(2, 3, dtype=torch.float32).dtype == np.float32


def test_a_non_square_block_in_the_wrong_place_is_named():
    c = np.zeros(5)
    with pytest.raises(ValueError, match=r"coupling 0 \(block row 1, column 0\) has shape "
                                         r"\(2, 2\), expected \(2, 3\)"):
        pp.TriangularSystem([np.ones((2, 2))], [None, None], c, lower=True, sizes=(3, 2))


def test_paper_form_that_does_not_exist_names_layer_and_entry():
    W = [np.eye(2), np.eye(2)]
    net = pp.FNN(W, activation="relu")
    trace = net.forward(np.array([1.0, -1.0]))  # second unit of layer 0 is off: f'(y) = 0
    with pytest.raises(ValueError, match=r"v\[1\] \(layer 0, W\[0\]\): form='paper' needs "
                                         r"the diagonal 1/s, but s = 0 at entry 1.*f'\(y\) = 0"):
        pp.backward_system(net, trace, np.ones(2), form="paper")
    with pytest.raises(ValueError, match=r"z\[1\] \(layer 0, W\[0\]\).*entry 1 of sample 0"):
        pp.forward_system(net, np.array([[1.0], [-1.0]]),
                          around=net.forward(np.array([[1.0], [-1.0]])), form="paper")
    sig = pp.FNN([np.eye(2)], activation="sigmoid")
    with pytest.raises(ValueError, match=r"y = 0 with f\(0\) != 0"):
        pp.forward_system(sig, np.zeros(2), around=[np.zeros(2)], form="paper")


def test_around_of_the_wrong_shape():
    net = pp.FNN.random([3, 4, 2])
    with pytest.raises(ValueError, match=r"layer 1: around.y\[1\] has shape \(2,\), "
                                         r"expected \(2, 5\)"):
        pp.forward_system(net, np.ones((3, 5)), around=[np.ones((4, 5)), np.ones(2)])


def test_bad_solver_options():
    net, trace, eps, _ = Case((3, 2)).problem()
    B = pp.backward_system(net, trace, eps)
    with pytest.raises(ValueError, match=r"jacobi: rtol must be a number in \[0, 1\), got -1"):
        pp.solve(B, "jacobi", rtol=-1)
    with pytest.raises(ValueError, match="bicgstab: maxiter must be an integer >= 1, got 0"):
        pp.solve(B, "bicgstab", maxiter=0)
    with pytest.raises(ValueError, match=r"scipy.gmres: option x0 has shape \(5,\), expected "
                                         r"\(5, 3\)"):
        pp.solve(B, "scipy.gmres", x0=np.zeros(5))
    with pytest.raises(ValueError, match=r"richardson: omega must lie in \(0, 2\)"):
        pp.solve(B, "richardson", omega=2.5)
    with pytest.raises(ValueError, match="bicgstab: option shadow='zero' must be one of"):
        pp.solve(B, "bicgstab", shadow="zero")


def test_overflow_in_long_jacobian_products_is_reported_not_returned():
    net = pp.FNN([1e30 * np.eye(3)] * 12, activation="identity")
    trace_x = np.ones(3) * 1e-300  # forward stays finite; backward products overflow
    trace = net.forward(trace_x)
    B = pp.backward_system(net, trace, np.ones(3))
    sol = pp.solve(B, "substitution")
    assert sol.status is pp.Status.NONFINITE and not sol.converged
    assert "first in v[1]" in sol.message and "overflowed" in sol.message
    with pytest.raises(pp.ConvergenceError, match="non-finite"):
        pp.backprop(net, trace_x, np.zeros(3))


def test_displays_name_the_fix():
    """A plan given more columns names .shared(); a missing backend its extra; repr's residual."""
    net = pp.FNN.random([4, 8, 3], activation="tanh", seed=0)
    B = pp.backward_system(net, net.forward(np.ones((4, 2))), np.ones((3, 2)))
    with pytest.raises(ValueError, match=r"expected \(15, 2\).*\.shared\(\)"):
        pp.prepare(B, "substitution").solve(np.ones((15, 5)))
    assert pp.prepare(B.shared(), "substitution").solve(np.ones((15, 5))).converged
    solution = pp.solve(B, "substitution")
    stacked = B.matrix @ solution.x.T.reshape(-1) - B.rhs.T.reshape(-1)  # samples stacked
    final = np.linalg.norm(stacked.reshape(2, 15), axis=1).max()
    assert f"residual={solution.residuals[-1]:.2e}" in repr(solution)
    assert solution.residuals[-1] == pytest.approx(final, abs=1e-15)
    empty = pp.Solution(x=solution.x, status=pp.Status.CONVERGED, message="", residuals=())
    assert "residual=not computed" in repr(empty)


def test_a_missing_backend_names_its_extra(monkeypatch):
    import builtins

    from propop import backend

    real = builtins.__import__

    def no_cupy(name, *args, **kwargs):
        if name.split(".")[0] in ("cupy", "cupyx") or name == "array_api_compat.cupy":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name.split(".")[0])
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_cupy)
    monkeypatch.setattr(backend, "_CACHE", {})
    net = pp.FNN.random([4, 3], seed=0)
    with pytest.raises(ModuleNotFoundError, match=r'pip install "propop\[gpu\]"'):
        pp.backward_system(net, net.forward(np.ones(4)), np.ones(3)).to("cupy")


@pytest.mark.parametrize(("call", "words"), [
    (lambda net, x, t: pp.train(net, x, np.array([0, 1]), epoch=2),
     "pp.train has no keyword 'epoch' (did you mean 'epochs'?)"),
    (lambda net, x, t: pp.train(net, x, np.array([0, 1]), batchsize=2),
     "pp.train has no keyword 'batchsize' (did you mean 'batch_size'?)"),
    (lambda net, x, t: pp.forward(net, x, method="jacobi", linearisation="newton"),
     "pp.forward has no keyword 'linearisation' (did you mean 'linearization'?)"),
    (lambda net, x, t: pp.backprop(net, x, t, reducton="mean"),
     "pp.backprop has no keyword 'reducton' (did you mean 'reduction'?)"),
])
def test_a_misspelt_keyword_is_named_as_the_callers_not_the_solvers(call, words):
    """They were said to be options the solver lacks (``substitution has no option 'epoch'``)."""
    net, x, t = pp.FNN.random([4, 4, 4], seed=0), np.ones((4, 2)), np.zeros((4, 2))
    with pytest.raises(TypeError, match=re.escape(words) + "; its other keywords go to the "
                       "solver, whose options are "):
        call(net, x, t)


def test_solver_options_close_to_a_callers_keyword_still_reach_the_solver():
    net, x, t = pp.FNN.random([4, 4, 4], seed=0), np.ones((4, 2)), np.zeros((4, 2))
    g = pp.backprop(net, x, t, method="jacobi", atol=1e-300, maxiter=1, check=False)
    assert g.solution.iterations == 1  # maxiter reached jacobi
    with pytest.raises(TypeError, match="jacobi has no option 'restrat'"):
        pp.backprop(net, x, t, method="jacobi", restrat=3)
