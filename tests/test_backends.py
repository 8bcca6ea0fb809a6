"""Every propop-native method on every backend, through the same code.

Systems of every layout (:mod:`benchmarks.systems`: a chain of unequal widths, a
stacked chain, a chain with per-sample couplings, an RNN's time layout, a residual
graph, a linear network's batch), built in NumPy and
moved to PyTorch tensors and to ``array_api_strict`` arrays (the array API
standard's strict namespace: what runs there uses nothing beyond the standard),
are solved by every registered native method that applies and compared, block by
block and sample by sample, with NumPy's substitution.
"""

import numpy as np
import pytest
import scipy.sparse as sp

import propop as pp
from benchmarks.systems import SYSTEMS
from cases import gpu_backends
from propop import backend

strict = pytest.importorskip("array_api_strict")
torch = pytest.importorskip("torch")

BACKENDS = [pytest.param("torch", None, id="torch"),
            pytest.param("array_api_strict", None, id="array_api_strict"), *gpu_backends()]
NATIVE = [s.name for s in pp.solvers.available() if s.native and s.available]
EXACT = {s.name for s in pp.solvers.available() if s.exact}


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


@pytest.mark.parametrize(("kind", "device"), BACKENDS)
@pytest.mark.parametrize(("name", "build", "method"), list(cases()))
def test_every_native_method_gives_numpys_answer_on_every_backend(kind, device, name, build,
                                                                  method):
    system = build(3)
    if not pp.solvers.info(method).applies_to(system):
        pytest.skip(f"{method} does not apply to a {name} system")
    reference = pp.solve(system, "substitution").x
    moved = system.to(kind, device)
    assert moved.backend.name == kind
    solution = pp.solve(moved, method, check=True)
    assert str(backend.device(solution.x)) == str(backend.device(moved.rhs))
    assert backend.of(solution.x).name == kind
    x = backend.to_host(solution.x)
    bound = 1e-12 if method in EXACT else 1e-9
    for k, (mine, theirs) in enumerate(zip(system.split(x), system.split(reference))):
        scale = np.maximum(np.abs(theirs).max(axis=0), 1e-300)
        assert (np.abs(mine - theirs).max(axis=0) <= bound * np.maximum(scale, 1)).all(), \
            (method, kind, k)


@pytest.mark.parametrize(("kind", "device"), BACKENDS)
@pytest.mark.parametrize(("name", "options"), [("graph", {"groups": True}),
                                               ("rnn", {"within": "substitution"})])
def test_the_variants_of_cyclic_reduction_on_every_backend(kind, device, name, options):
    """The reduction over groups (dense group solves on the namespace) and over time."""
    system = SYSTEMS[name](3)
    reference = pp.solve(system, "substitution").x
    solution = pp.solve(system.to(kind, device), "cyclic-reduction", check=True, **options)
    assert backend.of(solution.x).name == kind and solution.converged
    np.testing.assert_allclose(backend.to_host(solution.x), reference, rtol=1e-12,
                               atol=1e-12 * np.abs(reference).max())


@pytest.mark.parametrize(("kind", "device"), BACKENDS)
@pytest.mark.parametrize("name", ["fnn-stacked", "fnn-unequal", "linear"])
def test_the_batch_mean_reduction_reports_numpys_error_on_every_backend(kind, device, name):
    """``shared_diagonal="mean"``: its status, its message and its error, as on NumPy."""
    system = SYSTEMS[name](3)
    ours = pp.solve(system.to(kind, device), "cyclic-reduction", shared_diagonal="mean")
    numpys = pp.solve(system, "cyclic-reduction", shared_diagonal="mean")
    assert ours.status == numpys.status  # the messages quote residuals at rounding level
    np.testing.assert_allclose(ours.info["approximation_error"],
                               numpys.info["approximation_error"], rtol=1e-9, atol=1e-15)
    np.testing.assert_allclose(backend.to_host(ours.x), numpys.x, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(("kind", "device"), BACKENDS)
@pytest.mark.parametrize("name", list(SYSTEMS))
def test_products_and_views_on_every_backend(kind, device, name):
    system = SYSTEMS[name](2)
    moved = system.to(kind, device)
    x = np.random.default_rng(6).standard_normal(system.rhs.shape)
    for transpose in (False, True):
        ours = backend.to_host(moved.apply(backend.convert(x, kind, device),
                                           transpose=transpose))
        np.testing.assert_allclose(ours, system.apply(x, transpose=transpose), rtol=1e-13,
                                   atol=1e-13)
    np.testing.assert_allclose(backend.to_host(moved.rhs), system.rhs, rtol=0, atol=0)
    for i in range(2):
        np.testing.assert_allclose(backend.to_host(pp.solve(moved.sample(i), "substitution").x),
                                   pp.solve(system.sample(i), "substitution").x, rtol=1e-12)


@pytest.mark.parametrize("name", list(SYSTEMS))
def test_the_explicit_matrix_on_pytorch_is_a_csr_tensor_equal_to_the_products(name):
    """``system.matrix`` and ``system.csr``: canonical CSR tensors whose products are apply's."""
    from propop.torch_sparse import CSRTensor

    system = SYSTEMS[name](2)
    moved = system.to("torch")
    M = moved.matrix
    assert isinstance(M, CSRTensor) and moved.csr is M and M.device == moved.rhs.device
    host = sp.csr_array(backend.to_host(M))
    assert host.has_canonical_format
    np.testing.assert_allclose(host.toarray(), system.csr.toarray(), rtol=1e-15, atol=0)
    x = np.random.default_rng(7).standard_normal(system.rhs.shape)
    stacked = (M @ torch.from_numpy(x.T.reshape(-1).copy())).numpy()
    expected = system.apply(x)
    np.testing.assert_allclose(stacked, expected.T.reshape(-1), rtol=1e-13, atol=1e-13)


def test_sparse_couplings_move_dense_to_the_strict_namespace_and_networks_refuse():
    net = pp.FNN.random([30, 30, 30], activation="tanh", seed=0, density=0.1)
    system = pp.backward_system(net, net.forward(np.ones((30, 2))), np.ones((30, 2)))
    assert "sparse" in system.tags
    moved = system.to("array_api_strict")
    assert "sparse" not in moved.tags
    np.testing.assert_allclose(backend.to_host(pp.solve(moved, "substitution").x),
                               pp.solve(system, "substitution").x, rtol=1e-12)
    with pytest.raises(TypeError, match="dense here.*'numpy', 'cupy' or 'torch'"):
        net.to("array_api_strict")


def test_sparse_couplings_and_networks_stay_sparse_on_pytorch():
    """PyTorch's CSR tensors: a sparse network moves as it is, its gradients on its pattern."""
    from propop.torch_sparse import CSRTensor

    net = pp.FNN.random([30, 30, 30], activation="tanh", seed=0, density=0.1)
    x, t = np.random.default_rng(0).standard_normal((30, 2)), np.zeros((30, 2))
    system = pp.backward_system(net, net.forward(x), np.ones((30, 2)))
    moved = system.to("torch")
    assert "sparse" in moved.tags
    assert all(isinstance(M, CSRTensor) for M in moved.blocks.coupling)
    np.testing.assert_allclose(backend.to_host(pp.solve(moved, "substitution").x),
                               pp.solve(system, "substitution").x, rtol=1e-12)
    on_torch = net.to("torch")
    assert on_torch.sparse and all(isinstance(W, CSRTensor) for W in on_torch.W)
    g = pp.backprop(on_torch, torch.from_numpy(x), torch.from_numpy(t))
    for mine, theirs in zip(g.W, pp.backprop(net, x, t).W):  # the same pattern and values
        host = backend.to_host(mine)
        np.testing.assert_array_equal(host.indptr, theirs.indptr)
        np.testing.assert_array_equal(host.indices, theirs.indices)
        np.testing.assert_allclose(host.data, theirs.data, rtol=1e-12, atol=1e-15)
    assert all(sp.issparse(W) for W in on_torch.to("numpy").W)
    assert pp.sparsity.density_of(on_torch) == pp.sparsity.density_of(net)


def test_the_gpu_benchmark_runs_end_to_end_on_the_cpu(tmp_path, monkeypatch, capsys):
    """``python -m benchmarks.gpu --device cpu --quick``: what a GPU run only has to start."""
    import json
    import sys

    from benchmarks import gpu

    monkeypatch.setenv("PROPOP_RESULTS", str(tmp_path))
    monkeypatch.setattr(sys, "argv", ["gpu", "--device", "cpu", "--quick"])
    gpu.main()
    rows = json.loads((tmp_path / "gpu_quick.json").read_text())["rows"]
    assert {(row["kind"], row["dtype"]) for row in rows} == {
        (kind, dtype) for kind in ("gru", "mlp", "rnn", "newton")
        for dtype in ("float32", "float64")}
    for row in rows:
        assert not row["errors"], row
        expected = ({"torch.nn.GRU", "propop newton + CR"} if row["kind"] == "gru" else
                    {"torch", "substitution", "cyclic-reduction"})
        assert expected <= set(row["seconds"]), row
        bound = 1e-9 if row["dtype"] == "float64" else 1e-3
        assert max(row["deviation"].values()) <= bound, row
    assert "MLP backprop** on cpu, float32" in capsys.readouterr().out
    monkeypatch.setattr(sys, "argv", ["gpu", "--device", "cpu", "--quick", "--dtype",
                                      "float64", "--record"])
    with pytest.raises(SystemExit, match="--record needs --device cuda"):
        gpu.main()


def test_the_gpu_benchmark_measures_chosen_cases_and_merges_them(tmp_path, monkeypatch):
    """``--case KIND:A,B,C[:DTYPE]`` measures those rows only, in order.

    ``--merge`` keeps the saved rows, a row measured again replacing its old self.
    """
    import json
    import sys

    from benchmarks import gpu

    monkeypatch.setenv("PROPOP_RESULTS", str(tmp_path))
    measured = []  # each row a run measures is tagged with its place in this list

    def tagged(row):
        return lambda *args: dict(row(*args), tag=measured.append(1) or len(measured))

    monkeypatch.setattr(gpu, "mlp_row", tagged(gpu.mlp_row))
    monkeypatch.setattr(gpu, "rnn_row", tagged(gpu.rnn_row))

    def run(*options):
        monkeypatch.setattr(sys, "argv", ["gpu", "--device", "cpu", "--quick", *options])
        gpu.main()
        rows = json.loads((tmp_path / "gpu_quick.json").read_text())["rows"]
        return [(row["kind"], row["case"], row["dtype"], row["tag"]) for row in rows]

    first = run("--case", "mlp:8,4,2:float64", "--case", "rnn:4,2,16:float32")
    assert first == [("mlp", "l=8 n=4 r=2", "float64", 1), ("rnn", "H=4 r=2 tau=16", "float32", 2)]
    merged = run("--case", "mlp:8,4,2:float64", "--merge")
    assert merged == [first[0][:3] + (3,), first[1]]  # measured again in place; kept
    assert [row[:3] for row in run("--case", "mlp:8,4,2:float64")] == [first[0][:3]]
    for bad in ("foo:1", "mlp:8,4", "mlp:8,x,2", "mlp:8,4,2:float16"):
        monkeypatch.setattr(sys, "argv", ["gpu", "--device", "cpu", "--case", bad])
        with pytest.raises(SystemExit):
            gpu.main()


def test_a_compiled_contender_slow_once_is_timed_warm_and_a_slow_one_left_out(monkeypatch):
    """Past ``CAP`` a contender is timed by its first run and left out of larger cases.

    A compiled one (JAX, DEER), whose first run is its compilation, runs once more.
    """
    from benchmarks import gpu

    calls = {"jax.grad": 0, "substitution": 0}

    def counted(name):
        return lambda: calls.__setitem__(name, calls[name] + 1)

    monkeypatch.setattr(gpu, "CAP", -1.0)  # every run counts as over the cap
    monkeypatch.setattr(gpu, "SLOW", -1.0)
    monkeypatch.setattr(gpu, "SKIPPED", {})
    times, _, _, errors = gpu._measure(gpu.Device("cpu", "float64"),
                                       {name: counted(name) for name in calls}, {}, None)
    assert calls == {"jax.grad": 2, "substitution": 1} and not errors, (calls, errors)
    assert times["jax.grad"]["runs"] == times["substitution"]["runs"] == 1
    assert gpu.SKIPPED == {"float64": {"jax.grad", "substitution"}}


def test_the_gpu_record_keeps_each_backend_that_agreed(tmp_path, monkeypatch, capsys):
    """``benchmarks.gpu.record`` with the device and the comparisons stubbed: what it writes.

    A method that failed on one backend is recorded for the other, with the failure; one
    that failed on both is not recorded; the file stays importable Python.
    """
    import importlib.util
    import sys
    import types

    torch = pytest.importorskip("torch")
    from benchmarks import gpu
    from benchmarks.systems import SYSTEMS

    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(__version__="9.9"))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: "Stub GPU")
    failing = {"jacobi": [("cupy", "NotImplementedError: ")],
               "richardson": [("cupy", "x"), ("torch (CUDA)", "y")]}
    asked = {}
    monkeypatch.setattr(gpu, "_disagreements", lambda spec, system, device, kinds: (
        asked.__setitem__(spec.name, kinds), failing.get(spec.name, []))[1:] + (
        "BREAKDOWN" * (spec.name == "scipy.cgs"),))
    path = tmp_path / "gpu_runs.py"
    path.write_text('"""Recorded runs."""\n\nRUNS: dict[str, str] = {}\n')
    passed = gpu.record("cuda", path)
    assert "richardson" not in passed and "substitution" in passed
    assert passed["jacobi"].startswith("Stub GPU, every layout, float64: PyTorch ")
    assert "CuPy" not in passed["jacobi"] and "; cupy failed (" in passed["jacobi"]
    assert passed["jacobi"].endswith(": NotImplementedError: )")
    assert "CuPy 9.9" in passed["substitution"]
    assert asked["scipy.gmres"] == ["cupy"] and "pyamg.gmres" not in asked  # no GPU path
    assert passed["scipy.gmres"] == "Stub GPU, every layout, float64: CuPy 9.9"
    assert passed["scipy.cgs"] == ("Stub GPU, every layout, float64: CuPy 9.9; BREAKDOWN on "
                                   + ", ".join(SYSTEMS) + ", as on NumPy")
    assert "pyamg.gmres" not in passed
    spec = importlib.util.spec_from_file_location("runs", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.RUNS == passed
    assert max(len(line) for line in path.read_text().splitlines()) <= 100  # ruff's limit
    assert "richardson failed: cupy" in capsys.readouterr().out


def test_the_gpu_record_compares_each_backend_with_the_method_on_numpy():
    """``benchmarks.gpu._disagreements`` on the CPU (PyTorch's CPU device for CUDA's).

    A method that converges must agree with substitution; one that fails on NumPy
    (SciPy's CGS breaks down on the linear layout) must fail there with the same status,
    and that status is returned; a backend the method does not run on is a disagreement.
    """
    pytest.importorskip("torch")
    from benchmarks import gpu
    from benchmarks.systems import SYSTEMS

    jacobi, cgs = pp.solvers.info("jacobi"), pp.solvers.info("scipy.cgs")
    assert gpu._disagreements(jacobi, SYSTEMS["rnn"](3), "cpu", ["torch (CUDA)"]) == ([], "")
    assert pp.solve(SYSTEMS["linear"](3), "scipy.cgs").status is pp.Status.BREAKDOWN
    assert gpu._disagreements(cgs, SYSTEMS["linear"](3), "cpu", ["numpy"]) == ([], "BREAKDOWN")
    wrong, home = gpu._disagreements(cgs, SYSTEMS["rnn"](3), "cpu", ["torch (CUDA)"])
    assert home == "" and wrong[0][0] == "torch (CUDA)" and "runs on numpy" in wrong[0][1]
