"""Any SciPy, CuPy or PyAMG Krylov solver as ``method=``: by name, by function, adapted.

References are propop's substitution (exact) per block and SciPy's own list of its
iterative solvers; every count is checked against ``maxiter``.
"""

import numpy as np
import pyamg.krylov
import pytest
import scipy.sparse.linalg as spla

import propop as pp
from cases import gpu_backends

# SciPy's "Iterative methods for linear equation systems" and "for least-squares
# problems" (the scipy.sparse.linalg reference page), and the ones needing symmetry.
SCIPY_ITERATIVE = ("bicg", "bicgstab", "cg", "cgs", "gmres", "lgmres", "minres", "qmr",
                   "gcrotmk", "tfqmr", "lsqr", "lsmr")
SYMMETRIC = ("cg", "minres")


@pytest.fixture(scope="module")
def deep():
    """41 tanh layers of width 8, three samples: deeper than SciPy's restart of 20."""
    net = pp.FNN.random([8] * 42, activation="tanh", seed=0)
    rng = np.random.default_rng(0)
    x, t = rng.standard_normal((8, 3)), rng.standard_normal((8, 3))
    trace = net.forward(x)
    system = pp.backward_system(net, trace, pp.loss_gradient(trace.output, t))
    return system, net.backward(trace, pp.loss_gradient(trace.output, t))


def assert_blocks_close(system, x, reference, limit=1e-8):
    for k, (ours, want) in enumerate(zip(system.split(x), reference)):
        assert np.linalg.norm(ours - want) <= limit * np.linalg.norm(want), system.names[k]


@pytest.mark.parametrize("name", SCIPY_ITERATIVE)
def test_every_scipy_iterative_solver_is_offered_by_name_or_refused_with_the_reason(name):
    if name in SYMMETRIC:
        with pytest.raises(ValueError, match=f"scipy.{name} needs a symmetric.*not symmetric"):
            pp.solvers.info(f"scipy.{name}")
        with pytest.raises(ValueError, match="not symmetric"):
            pp.solvers.adapt(getattr(spla, name))
        return
    info = pp.solvers.info(f"scipy.{name}")
    assert info.kind == "krylov" and not info.exact and info.method.function is getattr(spla,
                                                                                         name)


@pytest.mark.parametrize("function", [spla.gcrotmk, spla.lgmres, spla.gmres, pyamg.krylov.fgmres],
                         ids=lambda f: f.__name__)
def test_the_function_object_itself_is_a_method(function, deep):
    system, reference = deep
    solution = pp.solve(system, function, rtol=1e-10)
    assert solution.converged, solution.message
    assert solution.method == f"{function.__module__.split('.')[0]}.{function.__name__}"
    assert_blocks_close(system, solution.x, reference)


def test_adapt_is_public_names_and_registers(deep):
    system, reference = deep
    method = pp.solvers.adapt(spla.gcrotmk, name="my-gcrot")
    assert method.name == "my-gcrot" and pp.solvers.adapt(spla.gcrotmk).name == "scipy.gcrotmk"
    pp.solvers.register("my-gcrot", kind="krylov", exact=False, replace=True)(method)
    try:
        solution = pp.solve(system, "my-gcrot", rtol=1e-10, k=3)  # the library's own option
        assert solution.converged and solution.method == "my-gcrot"
        assert_blocks_close(system, solution.x, reference)
        assert "k" in {p.name for p in method.parameters}
        with pytest.raises(TypeError, match="my-gcrot has no option .restrat."):
            pp.solve(system, "my-gcrot", restrat=3)
    finally:
        pp.solvers.unregister("my-gcrot")


def test_what_is_not_an_iterative_solver_is_refused_by_name():
    with pytest.raises(TypeError, match=r"scipy.spsolve\(A, b.*not an iterative solver"):
        pp.solvers.adapt(spla.spsolve)
    with pytest.raises(ValueError, match="pyamg.cr needs a symmetric"):
        pp.solve(pp.backward_system(pp.FNN.random([3, 3], seed=0),
                                    pp.FNN.random([3, 3], seed=0).forward(np.ones((3, 1))),
                                    np.ones((3, 1))), pyamg.krylov.cr)
    with pytest.raises(ValueError, match="pyamg.cgnr transposes A.*'scipy.lsqr'"):
        pp.solvers.adapt(pyamg.krylov.cgnr)
    with pytest.raises(ValueError, match="'pyamg.steepest_descent' is not offered"):
        pp.solvers.info("pyamg.steepest_descent")


def test_gmres_restarts_at_the_number_of_blocks_and_is_exact_in_one_cycle(deep):
    system, reference = deep
    solution = pp.solve(system, "scipy.gmres", rtol=1e-10)
    assert solution.converged, solution.message
    assert solution.iterations <= system.nblocks + 2  # one cycle: nilpotent in nblocks steps
    assert_blocks_close(system, solution.x, reference)
    # SciPy's own default restart (20) on this 41-block system needs cycles; here it says so
    short = pp.solve(system, "scipy.gmres", restart=5, maxiter=23)
    assert short.status is pp.Status.MAX_ITER and short.iterations <= 23
    assert "restart=5" in short.message and f"raise restart to {system.nblocks}" in short.message


def test_the_memory_budget_caps_the_restart_and_the_advice_says_so(deep):
    system, _ = deep
    one = system.operator_of.sample(0).size * 8  # one sample's vector, float64
    with pp.memory.limit(11 * one):
        plan = pp.prepare(system, "scipy.gmres", maxiter=25)
    assert plan.options.get("restart") is None  # the caller's options are untouched
    solution = plan.solve()
    assert solution.info["sample_iterations"][0] <= 25
    assert not solution.converged
    assert "raise restart (the memory budget holds 10)" in solution.message, solution.message


@pytest.mark.parametrize("name", ["scipy.gmres", "scipy.lgmres", "scipy.gcrotmk", "scipy.cgs",
                                  "scipy.tfqmr", "scipy.lsqr", "scipy.lsmr", "pyamg.gmres",
                                  "pyamg.fgmres"])
@pytest.mark.parametrize("maxiter", [3, 11])
def test_iterations_never_pass_maxiter(name, maxiter, deep):
    system, _ = deep
    solution = pp.solve(system, name, maxiter=maxiter, restart=7) if name == "scipy.gmres" \
        else pp.solve(system, name, maxiter=maxiter)
    assert not solution.converged
    assert solution.iterations <= maxiter
    assert all(i <= maxiter for i in solution.info["sample_iterations"])
    assert all(p >= 1 for p in solution.info["products"])


@pytest.mark.parametrize("name", ["scipy.qmr", "scipy.bicg", "scipy.lsqr"])
def test_a_preconditioner_is_refused_where_the_library_cannot_apply_it(name, deep):
    system, _ = deep
    with pytest.raises(ValueError, match=f"{name}: M: .*(transpose|takes no preconditioner)"):
        pp.solve(system, name, M=("block-jacobi", {"group": 2}))


def test_a_preconditioner_is_handed_to_the_library(deep):
    system, reference = deep
    solution = pp.solve(system, "scipy.gcrotmk", M=("block-jacobi", {"group": 8}), rtol=1e-10)
    assert solution.converged and solution.iterations < system.nblocks
    assert_blocks_close(system, solution.x, reference)


def test_a_library_function_on_tensors_names_the_methods_that_run_there(deep):
    torch = pytest.importorskip("torch")
    system, _ = deep
    with pytest.raises(ValueError, match="scipy.gcrotmk' runs on numpy arrays.*'substitution'"):
        pp.solve(system.to("torch"), spla.gcrotmk)
    assert torch.is_tensor(pp.solve(system.to("torch"), "substitution").x)


@pytest.mark.parametrize(("kind", "device"), [p for p in gpu_backends() if p.id == "cupy"])
def test_scipy_names_run_cupyx_on_cupy(kind, device, deep):
    system, reference = deep
    on_gpu = system.to(kind)
    for name in ("scipy.gmres", "scipy.cgs", "scipy.lsmr"):
        assert kind in pp.solvers.info(name).backends
        solution = pp.solve(on_gpu, name, rtol=1e-10)
        assert type(solution.x).__module__.startswith("cupy")
        if name == "scipy.gmres":  # the others may break down or be slow: then they say so
            assert solution.converged, solution.message
            assert solution.iterations <= solution.info["products"][0]
            assert_blocks_close(system, pp.backend.to_host(solution.x), reference)
        else:
            assert solution.converged or solution.message
