"""The ``propop`` command: tables, the demo, and one-line errors with exit status 2."""

import subprocess
import sys

import numpy as np
import pytest

import propop as pp
from propop import cli


HANG = 1800  # seconds: a guard against a hung process, not a speed check


def run(*args):
    return subprocess.run([sys.executable, "-m", "propop", *args], capture_output=True,
                          text=True, timeout=HANG)


def test_solvers_lists_the_registry(capsys):
    assert cli.main(["solvers"]) == 0
    out = capsys.readouterr().out
    for s in pp.solvers.available():
        assert f"| {s.name} | {s.kind} |" in out


def test_run_prints_a_row_per_method_with_small_errors(capsys):
    assert cli.main(["run", "--layers", "3", "--width", "8", "--batch", "2", "--repeats", "1",
                     "--method", "substitution,jacobi,scipy.gmres"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| ") and "CONVERGED" in line]
    assert len(rows) == 3
    assert "| substitution | yes | CONVERGED | 0 | 4 |" in out
    errors = [float(row.split("|")[6]) for row in rows]
    assert max(errors) < 1e-9


def test_experiment_rows_against_the_reference():
    rows = cli.experiments.experiment(layers=2, width=6, batch=3,
                                      methods=["substitution", "bicgstab"], repeats=1,
                                      density=0.5, dtype="float32")
    assert [r.method for r in rows] == ["substitution", "bicgstab"]
    assert rows[0].error < 1e-5 and rows[0].levels == 3 and rows[1].iterations >= 1


@pytest.mark.parametrize(("args", "message"), [
    (["run", "--method", "nope"], "unknown solver 'nope'"),
    (["run", "--layers", "0"], "must be >= 1"),
    (["run", "--density", "1.5"], "must lie in (0, 1]"),
    (["run", "--activation", "swish"], "invalid choice: 'swish'"),
    (["frobnicate"], "invalid choice"),
])
def test_bad_arguments_give_one_line_and_exit_2(args, message):
    result = run(*args)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0]


def test_demo_announces_each_section_and_reads_each_table():
    result = run("demo")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    titles = [title for title, _ in cli.demos.sections()]
    for k, title in enumerate(titles, start=1):
        start = out.index(f"[{k}/{len(titles)}] {title}\n")
        assert out.index(f"[{k}/{len(titles)}] done in ", start) > start
    for table in cli.tables.QUICK:
        shown = out.split(table.title)[1].split("done in")[0]
        for method in table.settings["methods"]:
            assert f"| {method} | " in shown and f"| {method} | " + \
                ("yes" if pp.solvers.info(method).exact else "no") + " | CONVERGED |" in shown
        assert "\nWhy: " in shown
    depth = out.split(cli.tables.QUICK[0].title)[1].split("Why:")[1]
    assert "cyclic reduction takes 11 levels where substitution takes 1025" in depth
    assert "propop demo --full runs every registered method" in out
    training = [line.split("|") for line in out.split("Training a 6-layer")[1].splitlines()
                if line.startswith("| ") and line.split("|")[2].strip() in ("exact", "1", "6")]
    assert len(training) == len(cli.demos.QUICK_TRAINING)
    accuracy = {(r[1].strip(), r[2].strip()): float(r[4]) for r in training}
    error = {(r[1].strip(), r[2].strip()): float(r[5]) for r in training}
    assert accuracy["substitution", "exact"] > 0.85
    assert accuracy["cyclic-reduction", "exact"] == accuracy["substitution", "exact"]
    assert error["jacobi", "6"] < 1e-12 < 0.5 < error["jacobi", "1"]
    vanishing = out.split("Vanishing gradients:")[1].split("Memory guard")[0]
    for method in ("jacobi", "bicgstab", "batched-gmres", "scipy.gmres",
                   "scipy.sparse.linalg.gcrotmk (the function)"):
        assert f"| {method} | CONVERGED |" in vanishing
    assert "| scipy.bicgstab | BREAKDOWN |" in vanishing
    unchecked = vanishing.split("Nothing unchecked:")[1]
    drift = float(unchecked.split("fresh network's to ")[1].split(";")[0])
    assert drift < 1e-14 and "judged INACCURATE" in unchecked
    assert "solves APPROXIMATE" in unchecked
    assert "raised MemoryBudgetError before allocating" in out
    storage = out.split("One storage:")[1].split("Plan once")[0]
    assert "| FNN of width 8 | chain (5 blocks) | 1 dense stack(s) | chain, equal-widths, " \
        "stacked |" in storage and "| time (30 blocks) |" in storage
    tensors = out.split("PyTorch tensors, one code path:")[1].split("PyTorch in")[0]
    rows = [row.split("|") for row in tensors.splitlines() if row.startswith("| ") and
            "torch.Tensor" in row]
    assert len(rows) == 10 and max(float(row[4]) for row in rows) < 1e-12
    assert sum("residual graph" in row[1] for row in rows) == 2
    assert sum(row[1].strip() == "CNN: conv, batch norm, max pool" for row in rows) == 2
    trained = tensors.split("pp.train on PyTorch tensors")[1].split("\n")[0]
    assert float(trained.split("weights ")[1].split()[0]) < 1e-12
    sparse = [row.split("|") for row in tensors.splitlines()
              if row.startswith("| FNN of sparse")]
    assert len(sparse) == 2 and all("CSRTensor" in row[3] for row in sparse)
    assert max(float(row[4]) for row in sparse) < 1e-12
    own = out.split("Your own models.")[1].split("\n")[0]
    assert "pre-norm SwiGLU unit (LayerNorm, a product of two tensors)" in own
    differences = own.split("largest difference: ")[1].rstrip(".").split(", ")
    assert len(differences) == 2 and max(float(d.split()[1]) for d in differences) < 1e-12
    attention = out.split("Self-attention over 6 tokens")[1].split("\n")[0]
    assert "causal masked_fill(-inf)" in attention
    assert float(attention.split("every gradient ")[1].split()[0]) < 1e-12
    assert float(attention.split("iterations, ")[1].split()[0]) < 1e-12
    hand = out.split("Operations written by hand")[1].split("\n")[0]
    assert "Annotated Transformer's LayerNorm" in hand and "amax with ties" in hand
    assert "GELU from erf" in hand and "log-softmax from exp and log" in hand
    assert float(hand.split("every gradient ")[1].split()[0]) < 1e-12
    cell = out.split("Your own cell, written for one sample")[1].split("\n")[0]
    assert "512 steps of 8 samples" in cell  # against the user's loop, computed apart
    assert float(cell.split("largest difference ")[1].rstrip(".")) < 1e-12
    loop = out.split("PyTorch in the loop:")[1].split("(the GRU's")[0]
    rows = [row.split("|") for row in loop.splitlines() if "propop cyclic-reduction" in row]
    assert len(rows) == 2 and max(float(row[4]) for row in rows) < 1e-12


def test_demo_full_runs_every_method_on_four_networks(monkeypatch, capsys):
    reported, trained = [], []
    monkeypatch.setattr(cli.demos, "report", lambda settings: reported.append(settings) or [])
    monkeypatch.setattr(cli.demos, "training", lambda *args: trained.append(args))
    for name in ("storage", "plans", "auto", "backends", "torch_loop", "models", "trust"):
        monkeypatch.setattr(cli.demos, name, lambda: None)
    assert cli.main(["demo", "--full"]) == 0
    assert [s["network"] for s in reported] == ["fnn", "rnn", "fnn", "graph"]
    assert all(s["methods"] is None for s in reported)  # every registered method
    assert (reported[0]["layers"], reported[0]["width"], reported[0]["batch"]) == (6, 256, 32)
    assert trained == [(cli.demos.DEMO_TRAINING, 4)]
    out = capsys.readouterr().out
    assert "[12/12] Training on the digits" in out and "propop demo --full: 12 sections" in out


def test_demo_full_training_table_prunes_and_truncates(capsys):
    cli.demos.training()
    out = capsys.readouterr().out
    training = [line.split("|") for line in out.splitlines() if line.startswith("| ") and
                line.split("|")[2].strip() in ("exact", "1", "3", "6")]
    assert len(training) == len(cli.demos.DEMO_TRAINING)
    accuracy = {(r[1].strip(), r[2].strip(), r[3].strip()): float(r[4]) for r in training}
    error = {(r[1].strip(), r[2].strip(), r[3].strip()): float(r[5]) for r in training}
    assert accuracy["substitution", "exact", "1.00"] > 0.85
    assert error["jacobi", "6", "1.00"] < 1e-12 < 0.5 < error["jacobi", "1", "1.00"]
    assert 0 < error["jacobi", "3", "1.00"] < error["jacobi", "1", "1.00"]
    assert accuracy["substitution", "exact", "0.10"] > 0.5
    assert accuracy["cyclic-reduction", "exact", "0.10"] == accuracy[
        "substitution", "exact", "0.10"]


def test_run_an_rnn_reports_what_does_not_apply(capsys):
    assert cli.main(["run", "--network", "rnn", "--layers", "2", "--width", "4", "--batch",
                     "2", "--tau", "6", "--repeats", "1", "--method",
                     "substitution,hybrid,cyclic-reduction,parallel-cyclic-reduction"]) == 0
    out = capsys.readouterr().out
    assert "tanh RNN over 6 time steps" in out
    assert "| parallel-cyclic-reduction | yes | N/A (needs a chain) |" in out
    rows = [line for line in out.splitlines() if "CONVERGED" in line]
    assert len(rows) == 3 and max(float(row.split("|")[6]) for row in rows) < 1e-9


def test_demo_training_says_what_it_needs_without_scikit_learn(monkeypatch, capsys):
    from propop import data

    def missing(*args, **kwargs):
        raise ImportError('digits() needs scikit-learn: pip install "propop[data]"')

    monkeypatch.setattr(data, "digits", missing)
    cli.demos.training()
    out = capsys.readouterr().out
    assert "Training on the digits skipped" in out and "propop[data]" in out
    assert "| backward method |" not in out


@pytest.mark.parametrize(("args", "words"), [
    (["run", "--network", "rnn", "--density", "0.1"],
     "--density applies to --network fnn, not rnn"),
    (["run", "--network", "graph", "--dtype", "float32"],
     "--dtype applies to --network fnn or rnn, not graph"),
    (["explain", "--tau", "5"], "--tau applies to --network rnn, not fnn"),
    (["run", "--layers", "abc"], "argument --layers: invalid positive integer value: 'abc'"),
    (["run", "--rtol", "-1"], "argument --rtol: must be >= 0, got -1.0"),
    (["run", "--method", "GMRES"], "unknown solver 'GMRES' (did you mean 'scipy.gmres'"),
    (["train", "--prune", "magnitude"], "--prune needs --density below 1"),
    (["train", "--stages", "3"], "--stages applies with --prune"),
    (["train", "--maxiter", "3"], "--maxiter applies to iterative methods; substitution is "
                                  "direct"),
    (["train", "--layers", "abc"], "--layers takes comma-separated positive widths"),
    (["train", "--method", "scipy.gmre"], "did you mean 'scipy.gmres'"),
    (["train", "--device", "cuda"], "--device applies to --backend torch, not numpy"),
    (["train", "--backend", "array_api_strict", "--density", "0.5"],
     "--backend array_api_strict has no sparse arrays"),
    (["train", "--backend", "jax"], "argument --backend: invalid choice: 'jax'"),
    (["run", "--method", "hybrid,substitution", "--network", "graph", "--layers", "1",
      "--width", "4", "--batch", "1", "--repeats", "5", "--rtol", "1e-8", "--atol", "x"],
     "argument --atol: invalid tolerance value: 'x'"),
])
def test_every_option_is_honoured_or_refused_in_one_line(args, words, capsys):
    with pytest.raises(SystemExit) as stopped:
        cli.main(args)
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("propop: error: ") and words in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_version_help_defaults_and_tolerances(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--version"])
    assert capsys.readouterr().out.strip() == f"propop {pp.__version__}"
    with pytest.raises(SystemExit):
        cli.main(["demo", "--help"])
    assert "--full" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        cli.main(["run", "--help"])
    text = capsys.readouterr().out
    for option in ("--layers", "--width", "--batch", "--density", "--rtol", "--repeats"):
        line = next(line for line in text.splitlines() if line.strip().startswith(option))
        assert line  # every option listed
    assert "(default: 256)" in text and "(default: 5)" in text
    assert cli.main(["run", "--layers", "2", "--width", "4", "--batch", "2", "--method",
                     "jacobi", "--rtol", "1e-6"]) == 0
    out = capsys.readouterr().out
    assert ", rtol=1e-06;" in out and "| jacobi | no | CONVERGED |" in out


@pytest.mark.parametrize("options", [["--density", "0.5"], ["--optimizer", "adam", "--lr", "0.01"],
                                     ["--method", "jacobi", "--maxiter", "1"]],
                         ids=["sparse", "adam", "truncated"])
def test_train_on_pytorch_prints_what_numpy_prints(options, capsys):
    """``--backend torch``: the network, data and solves there; the same losses and accuracies."""
    pytest.importorskip("torch")
    tables = {}
    for kind in ("numpy", "torch"):
        assert cli.main(["train", "--epochs", "2", "--layers", "8", *options,
                         "--backend", kind]) == 0
        out = capsys.readouterr().out
        assert out.splitlines()[0].endswith(f"on {kind}")
        rows = [[float(v) for v in line.split("|")[1:5]] for line in out.splitlines()
                if line.startswith("| ") and line.split("|")[1].strip().isdigit()]
        tables[kind] = (rows, out.strip().splitlines()[-1].split(",")[1:])  # density, steps
    assert len(tables["torch"][0]) == 2 and tables["torch"][1] == tables["numpy"][1]
    np.testing.assert_allclose(tables["torch"][0], tables["numpy"][0], rtol=0, atol=2e-4)


def test_a_failed_training_solve_is_one_line_not_a_traceback():
    result = run("train", "--method", "scipy.bicgstab", "--epochs", "1", "--layers", "8")
    assert "Traceback" not in result.stderr
    assert result.returncode in (0, 2)
    if result.returncode == 2:
        assert result.stderr.startswith("propop: error: ")
        assert len(result.stderr.strip().splitlines()) == 1


def test_the_demo_counts_native_methods_and_adapters_of_the_gpu_record(monkeypatch):
    """The demo's GPU sentence counts the recorded SciPy adapters apart from native methods."""
    from propop.cli import demos
    from propop.solvers import gpu_runs

    monkeypatch.setattr(gpu_runs, "RUNS", {"substitution": "Stub GPU, every layout",
                                           "jacobi": "Stub GPU, every layout",
                                           "scipy.gmres": "Stub GPU, every layout"})
    assert demos._gpu_runs() == ("2 native methods and 1 SciPy adapters (CuPy's namesakes) "
                                 "ran on an Stub GPU and agreed with NumPy")
    monkeypatch.setattr(gpu_runs, "RUNS", {"substitution": "Stub GPU, every layout"})
    assert demos._gpu_runs() == "1 native methods ran on an Stub GPU and agreed with NumPy"
    monkeypatch.setattr(gpu_runs, "RUNS", {})
    assert demos._gpu_runs() == "not yet run on a GPU"
