"""benchmarks.versus compares two trees fairly: the same job, the right tree, drift taken out."""

import json
import pathlib
import subprocess

import numpy as np
import pytest

import propop as pp
from benchmarks import versus, versus_child

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_the_drift_meter_of_an_mlp_is_its_whole_job():
    net = pp.FNN.random([4, 4, 4, 4], activation="tanh", seed=3, bias=0.1)
    x, t = np.random.default_rng(0).standard_normal((2, 4, 3))
    dW = versus_child.tight_mlp(list(net.W), list(net.b), x, t)()
    g = pp.backprop(net, x, t, method="substitution")
    np.testing.assert_allclose(dW, np.stack(g.W), rtol=1e-12, atol=1e-14)


def test_the_drift_meter_of_a_recurrence_is_the_elman_recurrence():
    states = versus_child.tight_elman(3, 5, 2)()
    rng = np.random.default_rng(2)
    W, U = rng.standard_normal((2, 3, 3)) / np.sqrt(3)
    b, xs = rng.standard_normal((3, 1)), rng.standard_normal((5, 3, 2))
    h = np.zeros((3, 2))
    for s in range(5):
        h = np.tanh(W @ xs[s] + U @ h + b)
        np.testing.assert_allclose(states[s + 1], h, rtol=1e-13, atol=1e-15)


def test_a_process_times_every_job_and_the_loop_and_fingerprints_each_answer():
    out = versus_child.measure("quick MLP l=3 n=4 r=2", 0.0, repeats=5)
    assert set(out["medians"]) == {*versus_child.METHODS, "loop"} and out["rounds"] == 5
    net = pp.FNN.random([4] * 4, activation="tanh", seed=0, bias=0.1)
    x, t = np.random.default_rng(1).standard_normal((2, 4, 2))
    W0 = pp.backprop(net, x, t).W[0]
    for squares, first in out["fingerprints"].values():
        assert squares == pytest.approx(float(np.sum(W0 * W0)), rel=1e-12)
        assert first == pytest.approx(float(W0[0, 0]), rel=1e-12)


def test_a_child_process_imports_the_tree_it_is_given():
    out = versus.child(ROOT, "quick Elman Newton forward H=3 tau=9", 0.0, timeout=300)
    assert pathlib.Path(out["propop"]).resolve().parent == ROOT / "propop"


def _fake_run(propop_file, prints):
    def run(args, env, capture_output, text, cwd, timeout):
        out = {"propop": propop_file, "medians": {"substitution": 1.0, "loop": 1.0},
               "rounds": 5, "fingerprints": prints}
        return subprocess.CompletedProcess(args, 0, stdout=json.dumps(out) + "\n")
    return run


def test_a_child_that_imported_another_propop_is_refused(monkeypatch, tmp_path):
    monkeypatch.setattr(versus.subprocess, "run", _fake_run(pp.__file__, {}))
    with pytest.raises(RuntimeError, match="imported propop from"):
        versus.child(tmp_path, "quick MLP l=3 n=4 r=2", 0.0)


def test_trees_whose_answers_differ_are_refused(monkeypatch):
    answers = iter([[1.0, 0.5], [1.0 + 1e-6, 0.5]])

    def child(tree, case, seconds):
        return {"medians": {"auto": 1.0, "loop": 1.0}, "fingerprints": {"auto": next(answers)}}

    monkeypatch.setattr(versus, "child", child)
    with pytest.raises(RuntimeError, match="auto: the two trees' answers differ"):
        versus.row("quick MLP l=3 n=4 r=2", ROOT, ROOT, 1, 0.0)


def test_the_ratio_takes_out_each_process_drift():
    def run(job, loop):
        return {"medians": {"cyclic-reduction": job, "loop": loop}}

    # old: 10 ms at a 5 ms loop (2x); new: 12 ms at a 10 ms loop (1.2x): 0.6x, though
    # the raw new time is longer; a second round 1.0x; the median of the two rounds
    rows = [{"case": "c", "runs": {"old": [run(0.010, 0.005), run(0.010, 0.010)],
                                   "new": [run(0.012, 0.010), run(0.010, 0.010)]}}]
    assert versus.summary(rows[0], "cyclic-reduction") == pytest.approx((10.0, 11.0, 0.8))
    assert "| c | cyclic-reduction | 10.0 | 11.0 | 0.80x | faster |" in versus.table(rows, "x")
    rows[0]["runs"]["new"] = [run(0.024, 0.010), run(0.010, 0.010)]  # 1.2x and 1.0x
    assert "| 1.10x | **slower** |" in versus.table(rows, "x")


def test_the_command_needs_an_old_tree_or_quick(capsys):
    with pytest.raises(SystemExit) as exit_:
        versus.main([])
    assert exit_.value.code == 2 and "--old PATH is needed" in capsys.readouterr().err



def test_an_old_tree_without_propop_is_refused_by_name(capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_:
        versus.main(["--old", str(tmp_path)])
    assert exit_.value.code == 2 and "no propop package there" in capsys.readouterr().err


def test_a_child_that_fails_is_reported_with_its_last_line(monkeypatch):
    def run(args, env, capture_output, text, cwd, timeout):
        return subprocess.CompletedProcess(args, 1, stdout="", stderr="Traceback\nKeyError: 'x'\n")

    monkeypatch.setattr(versus.subprocess, "run", run)
    with pytest.raises(RuntimeError, match="quick MLP l=3 n=4 r=2 in .*: KeyError: 'x'$"):
        versus.child(ROOT, "quick MLP l=3 n=4 r=2", 0.0)
