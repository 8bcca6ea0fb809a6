"""The benchmarks' baselines compute the job they stand for (against PyTorch autograd).

A baseline that computes less than propop does would flatter propop; one that
computes something else would make every ratio meaningless.
"""

import json

import numpy as np
import pytest

import propop as pp
from benchmarks.baselines import TightBackward, TightMLP, TightRNN, TightRNNForward, torch_mlp

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("r", [3, 1])  # one sample: the gradients as outer products
@pytest.mark.parametrize("blas", [False, True])
@pytest.mark.parametrize("widths", [(5, 6, 6, 4), (5, 5, 5, 5)], ids=["unequal", "stacked"])
def test_the_tight_mlp_loop_is_autograd(widths, blas, r):
    net = pp.FNN.random(widths, activation="tanh", seed=0, bias=0.1)
    rng = np.random.default_rng(1)
    x, t = rng.standard_normal((5, r)), rng.standard_normal((widths[-1], r))
    loop = TightMLP(net.W, net.b, r, blas=blas)
    for _ in range(2):  # the preallocated arrays are reused without leftovers
        dW, db, dx = loop(x, t)
    W = [torch.tensor(Wk, requires_grad=True) for Wk in net.W]
    b = [torch.tensor(bk, requires_grad=True) for bk in net.b]
    z0 = torch.tensor(x, requires_grad=True)
    z = z0
    for Wk, bk in zip(W, b):
        z = torch.tanh(Wk @ z + bk[:, None])
    (0.5 * ((z - torch.tensor(t)) ** 2).sum()).backward()
    for ours, theirs in zip(list(dW) + list(db) + [dx], W + b + [z0]):
        np.testing.assert_allclose(ours, theirs.grad.numpy(), rtol=1e-12, atol=1e-14)
    job = torch_mlp(net.W, net.b)
    grads = job(torch.tensor(x.T.copy()), torch.tensor(t.T.copy()))
    for ours, theirs in zip(dW, grads):
        np.testing.assert_allclose(ours, theirs.numpy(), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("blas", [False, True])
def test_the_loops_forward_alone_is_the_forward_pass(blas):
    """``loop.forward`` in ``benchmarks.peers``: the states of the sequential pass, no more."""
    net = pp.FNN.random([4, 4, 4, 4], activation="tanh", seed=0, bias=0.1)
    x = np.random.default_rng(1).standard_normal((4, 2))
    loop = TightMLP(net.W, net.b, 2, blas=blas)
    z = torch.tensor(x)
    for Wk, bk, ours in zip(net.W, net.b, loop.forward(x)[1:]):
        z = torch.tanh(torch.tensor(Wk) @ z + torch.tensor(bk)[:, None])
        np.testing.assert_allclose(ours, z.numpy(), rtol=1e-13, atol=1e-15)
    rnn = pp.RNN.random([3, 3], activation="tanh", seed=0)
    xs = np.random.default_rng(2).standard_normal((6, 3, 2))
    cell = torch.nn.RNN(3, 3).double()
    with torch.no_grad():  # the same weights; the bias once (propop's RNN has one)
        for name, value in (("weight_ih_l0", rnn.W[0]), ("weight_hh_l0", rnn.U[0]),
                            ("bias_ih_l0", rnn.b[0]), ("bias_hh_l0", 0 * rnn.b[0])):
            getattr(cell, name).copy_(torch.tensor(value))
        want = cell(torch.tensor(xs).permute(0, 2, 1))[0].permute(0, 2, 1).numpy()
    states = TightRNN(rnn.W[0], rnn.U[0], rnn.b[0], 6, 2, blas=blas).forward(xs)
    np.testing.assert_allclose(states, want, rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("blas", [False, True])
@pytest.mark.parametrize(("m", "r"), [(3, 2), (5, 4), (3, 1)])  # both weight products' forms
def test_the_tight_rnn_loop_is_autograd(m, r, blas):
    rnn = pp.RNN.random([m, 3], activation="tanh", seed=0)
    W, U, b = rnn.W[0], rnn.U[0], rnn.b[0]
    rng = np.random.default_rng(2)
    xs, t = rng.standard_normal((7, m, r)), rng.standard_normal((7, 3, r))
    loop = TightRNN(W, U, b, 7, r, blas=blas)
    loop(xs, t)
    dW, dU, db, dx = loop(xs, t)
    g = pp.backprop(rnn, xs, t)  # propop's sequential reference, itself tested on autograd
    for ours, theirs in ((dW, g.W[0]), (dU, g.U[0]), (db, g.b[0]), (dx, g.x)):
        np.testing.assert_allclose(ours, theirs, rtol=1e-12, atol=1e-14)
    states = TightRNNForward(W, U, b, 7)(xs[:, :, 0])
    np.testing.assert_allclose(states, rnn.forward(xs[:, :, :1]).output[:, :, 0], rtol=1e-14)


@pytest.mark.parametrize("steps", [4, 65535])
def test_autograd_through_torch_rnn_in_kernel_sized_calls_is_propops_gradient(steps,
                                                                             monkeypatch):
    """The PyTorch RNN baseline runs cuDNN-sized calls (4 steps here: three calls)."""
    torch = pytest.importorskip("torch")
    from benchmarks import baselines

    monkeypatch.setattr(baselines, "KERNEL_STEPS", steps)
    rnn = pp.RNN.random([3, 4], activation="tanh", seed=1)
    rng = np.random.default_rng(3)
    xs, t = rng.standard_normal((11, 3, 2)), rng.standard_normal((11, 4, 2))
    job = baselines.torch_rnn(rnn.W[0], rnn.U[0], rnn.b[0])
    dW = job(torch.tensor(xs.transpose(0, 2, 1).copy()), torch.tensor(t.transpose(0, 2, 1).copy()))
    np.testing.assert_allclose(dW.numpy(), pp.backprop(rnn, xs, t).W[0], rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("density", [1.0, 0.5])
def test_the_tight_backward_loop_is_the_sequential_reference(density):
    net = pp.FNN.random([6, 6, 6], activation="tanh", density=density, seed=0)
    trace = net.forward(np.ones((6, 2)))
    eps = np.arange(12.0).reshape(6, 2)
    slopes = [act.df(y) for act, y in zip(net.activations, trace.y)]
    ours = TightBackward(net.W, 2)(slopes, eps)
    for a, b in zip(ours, net.backward(trace, eps)):
        np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-15)


def test_the_chunks_benchmark_measures_every_chunk_size_against_the_loop():
    from benchmarks import chunks

    rows = chunks.rows(layers=16, width=8, r=8)
    names = [row["contender"] for row in rows]
    assert names[:2] == ["loop", "substitution"] and len(names) == 2 + len(chunks.CHUNKS)
    assert all(row["error"] < 1e-13 for row in rows)
    memory = {row["contender"]: row["memory_vs_loop"] for row in rows}
    assert memory["loop"] == 1.0
    assert memory["cyclic-reduction, chunk_size=1"] < memory["cyclic-reduction, chunk_size=None"]
    assert "| loop |" in chunks.table(rows)


def test_the_fresh_memory_benchmark_sets_glibc_only_in_its_kept_rounds(monkeypatch):
    import subprocess

    from benchmarks import fresh_memory

    seen = []

    def run(command, env, **kwargs):
        seen.append(({name: env.get(name) for name in fresh_memory.KEEP},
                     "--keep-freed" in command))
        kept = env.get("MALLOC_TRIM_THRESHOLD_") is not None
        function = "--keep-freed" in command
        median = 0.002 if kept else 0.003 if function else 0.005
        out = {"propop": {"median": median, "faults": 3000 * (not kept and not function),
                          "system": 0.0}, "loop": {"median": 0.001, "faults": 0, "system": 0}}
        return subprocess.CompletedProcess(command, 0, stdout=json.dumps(out) + "\n")

    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "1")  # the parent's own is not passed on
    monkeypatch.setattr(fresh_memory.subprocess, "run", run)
    row = fresh_memory.row("mlp l=4 n=3 r=2", rounds=2)
    unset = {name: None for name in fresh_memory.KEEP}
    assert seen == [(unset, False), (fresh_memory.KEEP, False), (unset, True)] * 2
    text = fresh_memory.table([row])
    assert ("| mlp l=4 n=3 r=2 | 5.0 (5.0-5.0) | 3000, 0.0 | 2.0 (2.0-2.0) | 0, 0.0 | "
            "3.0 (3.0-3.0) | 0, 0.0 | 1.0 |") in text


def test_the_fresh_memory_benchmark_times_every_call_and_both_jobs():
    from benchmarks import fresh_memory

    calls = []
    result = fresh_memory.measure(lambda: calls.append(1), calls=5)
    assert len(calls) == 7 and result["median"] >= 0 and result["faults"] >= 0
    propop, loop = fresh_memory.jobs("mlp l=4 n=3 r=2")
    dW = np.stack(loop()[0])
    np.testing.assert_allclose(np.stack(propop().W), dW, rtol=1e-12, atol=1e-14)
    rnn, rnn_loop = fresh_memory.jobs("rnn H=3 r=2 tau=7")
    np.testing.assert_allclose(rnn().W[0], rnn_loop()[0], rtol=1e-12, atol=1e-14)
    newton, sequential = fresh_memory.jobs("newton H=3 tau=9")
    np.testing.assert_allclose(newton().z[1], sequential(), rtol=1e-12, atol=1e-14)
    train, none = fresh_memory.jobs("train l=2 n=3 batch=2")
    assert none is None and len(train()[1].steps) == 8


def test_the_fresh_memory_benchmark_refuses_an_unknown_case_by_name(capsys):
    from benchmarks import fresh_memory

    with pytest.raises(SystemExit) as exit_:
        fresh_memory.main(["--child", "mlp l=2 n=3 r=4"])
    assert exit_.value.code == 2
    assert "invalid choice: 'mlp l=2 n=3 r=4'" in capsys.readouterr().err


def _hot(x):
    for _ in range(40):
        np.sin(x)


def test_the_profiles_charge_a_kernel_to_the_function_that_calls_it():
    pytest.importorskip("pyinstrument")
    from benchmarks import profiles

    x = np.ones(100_000)
    result = profiles.profile(lambda: (_hot(x), len(x)), seconds=0.3, top=3)
    first = result["functions"][0]
    assert first["function"].startswith("_hot (") and first["share"] > 0.8
    assert result["calls"] >= 3 and sum(f["share"] for f in result["functions"]) <= 1.0 + 1e-12
    assert abs(first["ms_per_call"] - 1e3 * first["share"] * result["total_s"]) < 1e-9
    text = profiles.table([{"case": "a case", "target": "a target", **result}])
    assert f"`{first['function']}` | {first['ms_per_call']:.2f} |" in text
    assert "(misses: a target;" in text and f"over {result['calls']} calls" in text
    assert set(profiles.CASES) >= {"GRU Newton forward in=2 H=2 batch=16 tau=10000, "
                                   "cyclic-reduction"}


@pytest.mark.parametrize("tau", [1, 2, 3, 8, 13, 64])
def test_the_reduction_floor_solves_the_recurrence_it_times(tau):
    """``profiles.odd_even`` is the chain's solution, the sequential loop's.

    So its time is that of the arithmetic a reduction cannot skip, not of something less.
    """
    from benchmarks import profiles

    rng = np.random.default_rng(tau)
    A, g = rng.uniform(-1, 1, (tau, 3, 3)), rng.standard_normal((tau, 3))
    want = [g[0]]
    for s in range(1, tau):
        want.append(A[s] @ want[-1] + g[s])
    np.testing.assert_allclose(profiles.odd_even(A, g), np.array(want), rtol=1e-12,
                               atol=1e-12)
    floor = profiles.reduction_floor(3, tau, 2, repeats=2)
    assert floor["seconds"] > 0 and floor["iterations"] == 2
    text = profiles.table([], floor)
    assert f"tau {tau}): odd-even" in text and "2 times" in text


def test_the_benchmarks_record_the_processor_and_its_vector_unit(tmp_path):
    """``benchmarks.common.cpu_model`` reads the first processor of ``/proc/cpuinfo``."""
    from benchmarks.common import cpu_model, describe, environment

    first = "processor\t: 0\nmodel name\t: Some CPU 9000\nflags\t\t: fpu sse avx2 avx512f\n"
    info = tmp_path / "cpuinfo"
    info.write_text(first + "\nprocessor\t: 1\nmodel name\t: Other\nflags\t\t: fpu\n")
    assert cpu_model(str(info)) == "Some CPU 9000, AVX-512"
    info.write_text(first.replace(" avx512f", ""))
    assert cpu_model(str(info)) == "Some CPU 9000, AVX2"
    info.write_text("processor\t: 0\n")
    assert cpu_model(str(info)) == "unknown, no AVX2"
    env = dict(environment(), cpu="Some CPU 9000, AVX2")
    assert describe(env).startswith(f"{env['machine']} (Some CPU 9000, AVX2), ")
    assert "(" not in describe({k: v for k, v in env.items() if k != "cpu"}).split(",")[0]


def test_the_fresh_memory_benchmark_calls_keep_freed_in_its_child(monkeypatch):
    from benchmarks import fresh_memory

    calls = []
    monkeypatch.setattr(pp.allocator, "keep_freed", lambda: calls.append(1) or True)
    out = fresh_memory.child("mlp l=2 n=3 r=2", keep_freed=True)
    assert calls == [1] and set(out) == {"propop", "loop"}
    monkeypatch.setattr(pp.allocator, "keep_freed", lambda: False)  # not glibc: said so
    with pytest.raises(SystemExit, match="not glibc"):
        fresh_memory.child("mlp l=2 n=3 r=2", keep_freed=True)
