"""The memory guard: estimated peaks against tracemalloc's, the budget, the errors."""

import gc
import tracemalloc

import numpy as np
import pytest

import propop as pp
from propop import cli


def fnn_system(sizes, r, dtype="float64", lower=False):
    net = pp.FNN.random(sizes, activation="tanh", seed=0, dtype=dtype)
    x = np.random.default_rng(1).standard_normal((sizes[0], r) if r else sizes[0])
    trace = net.forward(x)
    if lower:
        return pp.forward_system(net, x, around=trace)
    return pp.backward_system(net, trace, np.ones_like(trace.output))


def rnn_system(sizes, tau, r, lower=False):
    rnn = pp.RNN.random(sizes, seed=0)
    xs = np.random.default_rng(1).standard_normal((tau, sizes[0], r) if r else (tau, sizes[0]))
    trace = rnn.forward(xs)
    if lower:
        return pp.forward_system(rnn, xs, around=trace)
    return pp.backward_system(rnn, trace, np.ones_like(trace.output))


def traced_peak(system, method, **options):
    """The solve's peak of traced memory (NumPy reports its arrays to tracemalloc).

    A tiny solve by the same method first: the first solve of a process also
    allocates once-only things (modules imported on first use, caches), which are
    no part of a method's peak.
    """
    assert system.blocks.sizes  # built once, as by any earlier solve
    tiny = (rnn_system([2, 2], 3, 1) if system.structure is not None else
            graph_system(2, 2, 1) if options.get("groups") else fnn_system([2, 2, 2], 1))
    pp.solve(tiny, method, **options)
    if options.get("groups"):  # the memory guard's shape-only run of this system too
        pp.solve(system, method, **options)  # (its objects, once per system, are no array)
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        solution = pp.solve(system, method, **options)
        return tracemalloc.get_traced_memory()[1] - base, solution
    finally:
        tracemalloc.stop()


CASES = [
    ("cyclic-reduction", lambda: fnn_system([64] * 17, 1)),
    ("cyclic-reduction", lambda: fnn_system([64] * 17, 16)),
    ("cyclic-reduction", lambda: fnn_system([64, 32, 48, 64, 16, 64], 4)),
    ("cyclic-reduction", lambda: fnn_system([16] * 257, None)),
    ("cyclic-reduction", lambda: fnn_system([8] * 129, 64)),
    ("cyclic-reduction", lambda: fnn_system([64] * 33, 4, dtype="float32")),
    ("cyclic-reduction", lambda: fnn_system([32] * 17, 8, lower=True)),
    ("parallel-cyclic-reduction", lambda: fnn_system([64] * 17, 16)),
    ("parallel-cyclic-reduction", lambda: fnn_system([64, 32, 48, 64, 16, 64], 4)),
    ("parallel-cyclic-reduction", lambda: fnn_system([128] * 9, 8)),
    ("cyclic-reduction", lambda: rnn_system([4, 8], 200, 4)),
    ("cyclic-reduction", lambda: rnn_system([8, 16, 16], 100, 8)),
    ("cyclic-reduction", lambda: rnn_system([8, 8], 1000, None)),
    ("cyclic-reduction", lambda: rnn_system([2, 2], 2000, 16)),  # entrywise (2 x 2 cores)
    ("cyclic-reduction", lambda: rnn_system([2, 2, 2], 500, 8)),
    ("cyclic-reduction", lambda: fnn_system([2] * 257, 64)),
    ("cyclic-reduction", lambda: rnn_system([3, 3], 1000, 16)),
    ("cyclic-reduction", lambda: rnn_system([8, 16, 16], 100, 8, lower=True)),
    ("scipy.spsolve_triangular", lambda: fnn_system([128] * 9, 16)),
    ("scipy.spsolve_triangular", lambda: fnn_system([64, 32, 64, 16], 4)),
    ("scipy.spsolve_triangular", lambda: rnn_system([6, 12], 50, 3)),
]


@pytest.mark.parametrize(("method", "build"), CASES)
def test_peak_bytes_are_within_20_percent_of_the_measured_peak(method, build):
    system = build()
    measured, solution = traced_peak(system, method)
    assert solution.converged
    assert 0.8 <= solution.info["peak_bytes"] / measured <= 1.2, (solution.info["peak_bytes"],
                                                                  measured)


def test_a_second_triangular_solve_reuses_the_matrix_and_says_so():
    system = fnn_system([128] * 9, 16)
    first, _ = traced_peak(system, "scipy.spsolve_triangular")
    again, solution = traced_peak(system, "scipy.spsolve_triangular")
    assert again < 0.6 * first
    assert 0.8 <= solution.info["peak_bytes"] / again <= 1.2


def test_the_within_substitution_variant_is_estimated_too():
    system = rnn_system([8, 16, 16], 100, 8)
    measured, solution = traced_peak(system, "cyclic-reduction", within="substitution")
    assert 0.8 <= solution.info["peak_bytes"] / measured <= 1.2


def sparse_system(n, density, r, layers):
    net = pp.FNN.random([n] * (layers + 1), activation="tanh", density=density, seed=0)
    trace = net.forward(np.random.default_rng(1).standard_normal((n, r)))
    return pp.backward_system(net, trace, np.ones_like(trace.output))


def graph_system(width, blocks, r):
    graph = pp.Graph.residual_mlp(width, blocks, seed=0)
    trace = graph.forward(np.random.default_rng(1).standard_normal((width, r)))
    return pp.backward_system(graph, trace, graph.loss_gradient(trace, np.zeros((width, r))))


@pytest.mark.parametrize("build", [lambda: sparse_system(300, 0.05, 8, 8),
                                   lambda: sparse_system(256, 0.2, 4, 8),
                                   lambda: sparse_system(400, 0.02, 16, 6)])
def test_the_sparse_reduction_counts_its_peak_as_the_fill_in_happens(build):
    system = build()
    measured, solution = traced_peak(system, "cyclic-reduction")
    assert "fill_in" in solution.info
    assert 0.8 <= solution.info["peak_bytes"] / measured <= 1.2
    from propop.solvers.reduction import footprint

    assert 3 * footprint.dense_cyclic_reduction(system, False, False) >= measured  # the guard


@pytest.mark.parametrize("build", [lambda: graph_system(16, 6, 4),
                                   lambda: graph_system(64, 4, 16),
                                   lambda: graph_system(8, 20, 8)])
def test_the_reduction_over_groups_is_estimated_too(build):
    measured, solution = traced_peak(build(), "cyclic-reduction", groups=True)
    assert 0.8 <= solution.info["peak_bytes"] / measured <= 1.2


@pytest.mark.parametrize("method", ["cyclic-reduction", "parallel-cyclic-reduction",
                                    "scipy.spsolve_triangular", "batched-gmres"])
def test_over_the_budget_is_a_clear_error_before_allocating(method):
    system = fnn_system([64] * 17, 16)
    pp.solvers.info(method)  # the method's module imported before measuring
    with pp.memory.limit(10_000):
        gc.collect()
        tracemalloc.start()
        try:
            with pytest.raises(pp.MemoryBudgetError) as raised:
                pp.solve(system, method)
            allocated = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    error = raised.value
    assert error.budget == 10_000 and error.estimate > 10_000
    assert "over the memory budget of 9.8 KiB" in str(error) and "'substitution'" in str(error)
    assert allocated < 200_000  # nothing like the estimate was allocated
    assert pp.solve(system, "substitution").converged  # the cheaper method runs


def test_the_budget_comes_from_set_budget_the_environment_or_the_available_memory(
        monkeypatch):
    monkeypatch.delenv("PROPOP_MEMORY_BUDGET", raising=False)
    default = pp.memory.budget()
    assert 0 < default <= pp.memory.available()
    monkeypatch.setenv("PROPOP_MEMORY_BUDGET", "123456")
    assert pp.memory.budget() == 123456
    monkeypatch.setenv("PROPOP_MEMORY_BUDGET", "0.25")
    assert pp.memory.budget() <= 0.26 * pp.memory.available()
    monkeypatch.setenv("PROPOP_MEMORY_BUDGET", "lots")
    with pytest.raises(ValueError, match="PROPOP_MEMORY_BUDGET='lots' is not a number"):
        pp.memory.budget()
    with pp.memory.limit(5000):
        assert pp.memory.budget() == 5000
    pp.memory.set_budget(7777)
    try:
        assert pp.memory.budget() == 7777
    finally:
        pp.memory.set_budget(None)
    for bad in (0, -1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="a memory budget is a number of bytes"):
            pp.memory.set_budget(bad)


def test_small_estimates_fit_without_reading_the_available_memory(monkeypatch):
    monkeypatch.delenv("PROPOP_MEMORY_BUDGET", raising=False)

    def unread():
        raise AssertionError("the available memory was read")

    monkeypatch.setattr(pp.memory, "available", unread)
    assert pp.memory.fits(pp.memory.SMALL)
    with pytest.raises(AssertionError, match="was read"):
        pp.memory.fits(pp.memory.SMALL + 1)
    with pp.memory.limit(1000):  # a budget set is always read, however small the estimate
        assert pp.memory.fits(1000) and not pp.memory.fits(1001)
    monkeypatch.setenv("PROPOP_MEMORY_BUDGET", "500")
    assert not pp.memory.fits(501)


def test_the_cli_marks_a_run_over_the_budget_not_applicable(capsys):
    with pp.memory.limit(60_000):  # the system fits (52 KiB), cyclic reduction does not
        rows = cli.experiments.experiment(layers=4, width=32, batch=8, repeats=1,
                              methods=["substitution", "cyclic-reduction"])
    assert rows[0].status == "CONVERGED"
    assert rows[1].status.startswith("N/A (memory: needs") and "budget" in rows[1].status


@pytest.mark.parametrize("index", [(slice(2, None, 2),), (slice(1, 5, 2), 0), (Ellipsis, None),
                                   (slice(None), None, slice(None), 0), 1, (Ellipsis, 0),
                                   (slice(None, None, -1),), (np.array([0, 2]),)])
def test_shape_arrays_index_as_numpy_does(index):
    from propop.solvers.reduction import shapes
    from propop.solvers.reduction.chain import Counter

    counter = Counter()
    a = shapes.ShapeArray((5, 4, 3, 3), np.float64, counter)
    assert a[index].shape == np.zeros((5, 4, 3, 3))[index].shape
    assert (a @ shapes.ShapeArray((3, 2), np.float64, counter)).shape == (5, 4, 3, 2)


@pytest.mark.parametrize(("m", "r", "n"), [(17, 16, 32), (129, 1, 8), (33, 4, 16), (257, 16, 2),
                                              (129, 4, 1), (65, 8, 3)])
def test_the_loops_on_shapes_count_the_peak_of_the_loops_on_arrays(m, r, n):
    """The odd-even loops on shape arrays against tracemalloc on NumPy arrays."""
    from propop.solvers.reduction import footprint, odd_even
    from propop.solvers.reduction.chain import Chain, Counter

    rng = np.random.default_rng(0)
    L, C = rng.standard_normal((m, r, n)), rng.standard_normal((m - 1, 1, n, n)) / n
    G = rng.standard_normal((m, r, n))
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        levels = odd_even.factor(Chain(L, C, G, list(range(m)), ()), Counter(), np)
        X = odd_even.substitute(levels, G, Counter(), np)
        measured = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    counter = Counter()
    footprint.odd_even(counter, m, n, r, 1, r, 1, 8)
    assert X.shape == G.shape
    assert 0.8 <= counter.peak_bytes / measured <= 1.2, (counter.peak_bytes, measured)


@pytest.mark.parametrize("make", [
    lambda a: a.reshape(-1), lambda a: a.T.reshape(-1), lambda a: a[:, 1:].reshape(-1),
    lambda a: a[::2].reshape(3, -1), lambda a: a.reshape(2, 3, 10)[:, :, 3:].reshape(-1, 7),
    lambda a: a.reshape(6, 2, 5).T.reshape(10, -1), lambda a: a[1:4].reshape(3, 2, 5)])
def test_shape_arrays_copy_where_numpy_copies(make):
    """A reshape of a shape array is a view exactly where NumPy's is, else a counted copy."""
    from propop.solvers.reduction import shapes
    from propop.solvers.reduction.chain import Counter

    real, counter = np.zeros((6, 10)), Counter()
    made, out = make(shapes.ShapeArray((6, 10), np.float64, counter, owned=False)), make(real)
    view = np.shares_memory(out, real)
    assert made.shape == out.shape and (made.base is not None) == view
    assert made._owned == shapes.HEADER + (0 if view else out.nbytes)


def test_the_guard_remembers_a_peak_per_shape_and_never_across_shapes():
    """Equal signatures (any values) give the remembered peak; another shape its own."""
    from propop.solvers.reduction import footprint, shapes

    a, b = fnn_system([16] * 9, 4), fnn_system([16] * 9, 4)
    b = b.with_rhs(b.rhs * 3.0)
    c, d = fnn_system([16] * 9, 5), fnn_system([16] * 9, 4, dtype="float32")
    assert shapes.signature(a) == shapes.signature(b)
    assert len({shapes.signature(s) for s in (a, c, d)}) == 3
    footprint._PEAKS.clear()
    fresh = [footprint.dense_cyclic_reduction(s, False, False) for s in (a, c, d)]
    assert fresh[1] > fresh[0] > fresh[2]  # one more sample; half the bytes an entry
    assert footprint.dense_cyclic_reduction(b, False, False) == fresh[0]
    footprint._PEAKS.clear()
    assert footprint.dense_cyclic_reduction(b, False, False) == fresh[0]
    # peaks are kept by the signature's hash: another signature with that hash is no hit
    key = (("chain", False), None, hash(shapes.signature(b)))
    footprint._PEAKS[key] = (shapes.signature(c), 1)
    assert footprint.dense_cyclic_reduction(b, False, False) == fresh[0]


def test_an_operators_signature_is_read_once_and_dies_with_it():
    """Kept per operator (its arrays' shapes and strides do not change), never across."""
    from propop.solvers.reduction import shapes

    a = fnn_system([16] * 9, 4)
    first = shapes.signature(a)
    again = shapes.signature(a.with_rhs(a.rhs * 2.0))  # one operator, another rhs
    assert again == first and all(x is y for x, y in zip(again[:-1], first[:-1]))
    other = fnn_system([16] * 9, 4)
    assert shapes.signature(other) == first and shapes.signature(other)[3] is not first[3]
    kept = len(shapes._OPERATORS)
    del a, other
    gc.collect()
    assert len(shapes._OPERATORS) <= kept - 2


@pytest.mark.parametrize("kind", ["torch", "array_api_strict"])
def test_the_guard_runs_the_reduction_on_the_twin_of_any_backend(kind):
    """A system on PyTorch or the strict namespace has the same twin as on NumPy."""
    pytest.importorskip(kind)
    from propop.solvers.reduction import footprint

    for system in (fnn_system([8, 12, 8, 8], 3), rnn_system([4, 8], 20, 2)):
        moved = system.to(kind)
        if system.structure is None:
            assert footprint.dense_cyclic_reduction(moved, False, False) == \
                footprint.dense_cyclic_reduction(system, False, False)
        else:
            assert footprint.time_cyclic_reduction(moved, "cyclic-reduction") == \
                footprint.time_cyclic_reduction(system, "cyclic-reduction")


def _propop_objects_in_cycles(call):
    """The propop objects that ``call``'s result and temporaries leave in reference cycles."""
    call()  # once-only caches first
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        call()
        gc.collect()
        return sorted({type(o).__name__ for o in gc.garbage
                       if type(o).__module__.startswith("propop")})
    finally:
        gc.set_debug(0)
        gc.garbage.clear()


def _calls():
    rng = np.random.default_rng(0)
    net = pp.FNN.random([6] * 4, activation="tanh", seed=0)
    rnn = pp.RNN.random([3, 4, 2], activation="tanh", seed=0)
    gru = pp.GRU(2, 3, seed=0)
    x, t = rng.standard_normal((6, 3)), rng.standard_normal((6, 3))
    xs, ts = rng.standard_normal((20, 3, 2)), rng.standard_normal((20, 2, 2))
    calls = {f"fnn {m}": (lambda m=m: pp.backprop(net, x, t, method=m))
             for m in ("substitution", "cyclic-reduction", "parallel-cyclic-reduction",
                       "jacobi", "auto")}
    calls.update({f"fnn vector {m}": (lambda m=m: pp.backprop(net, x[:, 0], t[:, 0], method=m))
                  for m in ("substitution", "cyclic-reduction")})
    calls.update({f"rnn {m}": (lambda m=m: pp.backprop(rnn, xs, ts, method=m))
                  for m in ("substitution", "cyclic-reduction", "jacobi", "auto")})
    calls.update({f"newton {m}": (lambda m=m: pp.forward(rnn, xs[:, :, 0], method=m))
                  for m in ("substitution", "cyclic-reduction")})
    calls["fnn newton"] = lambda: pp.forward(net, x, method="cyclic-reduction")
    calls["gru newton"] = lambda: pp.forward(gru, rng.standard_normal((20, 2, 3)),
                                             method="cyclic-reduction")
    calls.update({f"propop.torch {kind}": _module_step(kind) for kind in ("GRU", "LSTM")})
    return calls


def _module_step(kind):
    """A forward and backward of ``propop.torch``'s module, which makes its cell per call."""
    def step():
        import torch

        import propop.torch as ptorch

        module = getattr(ptorch, kind)(2, 3, mode="newton", method="cyclic-reduction").double()
        x = torch.randn(12, 2, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
        module(x)[0].sum().backward()

    return step


@pytest.mark.parametrize("name", list(_calls()))
def test_no_call_leaves_its_systems_in_reference_cycles(name):
    """No system is left in a reference cycle when a call returns.

    A system in a cycle (an operator caching itself did) keeps its arrays until the
    cyclic collector runs: the memory of several calls at once, fresh pages at each.
    """
    assert _propop_objects_in_cycles(_calls()[name]) == []


def test_the_cycle_check_sees_a_cycle():
    class Cyclic:
        pass

    Cyclic.__module__ = "propop.fake"

    def call():
        obj = Cyclic()
        obj.me = obj

    assert _propop_objects_in_cycles(call) == ["Cyclic"]
