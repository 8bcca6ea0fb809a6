"""method="auto": the cost model's choice, its reasons, the memory guard, and calibration."""

import json
import math

import numpy as np
import pytest
import scipy.sparse as sp

import propop as pp
from propop import calibration
from propop.solvers.selection import calibration as constants
from propop.solvers.selection import cost
from propop.cli import main
from propop.solvers.selection import auto


def fnn_system(layers=64, width=8, r=1, density=1.0):
    net = pp.FNN.random([width] * (layers + 1), activation="tanh", density=density, seed=0)
    rng = np.random.default_rng(1)
    trace = net.forward(rng.standard_normal((width, r)))
    return pp.backward_system(net, trace, rng.standard_normal((width, r)))


def rnn_system(tau=64, hidden=4, r=2):
    rnn = pp.RNN.random([3, hidden], activation="tanh", seed=0)
    trace = rnn.forward(np.random.default_rng(1).standard_normal((tau, 3, r)))
    return pp.backward_system(rnn, trace, np.ones_like(trace.output))


def model(fastest: str) -> constants.Calibration:
    """Constants under which ``fastest`` costs one second less than every other method."""
    cheap, dear = [0.0, 0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]
    return constants.Calibration(
        {family: {m: cheap if m == fastest else dear for m in auto.CANDIDATES}
         for family in ("chain", "time")}, "a test model")


@pytest.fixture(autouse=True)
def no_stored_calibration(tmp_path, monkeypatch):
    """Every test reads no calibration of the machine running it unless it stores one."""
    monkeypatch.setenv("PROPOP_CALIBRATION", str(tmp_path / "calibration.json"))


@pytest.mark.parametrize("system", [fnn_system(), fnn_system(r=4), rnn_system(),
                                    fnn_system(width=32, r=3, density=0.2)],
                         ids=["fnn", "fnn-batch", "rnn", "sparse"])
def test_auto_is_exact_and_says_what_it_chose(system):
    solution = pp.solve(system, "auto")
    reference = pp.solve(system, "substitution").x
    assert solution.converged and solution.method == "auto"
    assert np.linalg.norm(solution.x - reference) <= 1e-12 * np.linalg.norm(reference)
    chosen = solution.info["auto"]
    assert chosen["method"] in auto.CANDIDATES and chosen["method"] in chosen["reason"]
    assert chosen["method"] == min(chosen["predicted_seconds"],
                                   key=chosen["predicted_seconds"].get)
    assert "defaults measured on the development machine" in chosen["calibration"]


@pytest.mark.parametrize("fastest", auto.CANDIDATES)
def test_the_choice_follows_the_model(fastest):
    choice = auto.choose(fnn_system(), calibration=model(fastest))
    assert choice.method == fastest and choice.predicted[fastest] == 0.0
    assert set(choice.predicted) == set(auto.CANDIDATES) and choice.excluded == {}


def test_rnn_systems_leave_out_pcr_and_follow_the_model():
    for fastest in auto.CANDIDATES[:2]:
        choice = auto.choose(rnn_system(), calibration=model(fastest))
        assert choice.method == fastest
        assert choice.excluded == {"parallel-cyclic-reduction": "does not apply to this system"}


@pytest.mark.parametrize("layers", [1, 2])
def test_time_counts_are_substitutions_products_and_the_layers_reduced(layers):
    """Substitution's products a step, and the layers cyclic reduction reduces.

    The backward layer reads U^T from the next step and W^T from the layer above, the
    forward one W from the layer below and U from the step before; a forward system's
    input layer leads and is not reduced.
    """
    tau = 40
    rnn = pp.RNN.random([3] + [4] * layers, activation="tanh", seed=0)
    xs = np.random.default_rng(1).standard_normal((tau, 3))
    trace = rnn.forward(xs)
    backward = pp.backward_system(rnn, trace, np.ones_like(trace.output))
    forward = pp.forward_system(rnn, xs, trace, linearization="newton")
    assert auto.work(backward, "substitution").steps == tau * (2 * layers - 1)
    assert auto.work(forward, "substitution").steps == tau * 2 * layers
    levels = math.ceil(math.log2(tau)) + (math.ceil(math.log2(layers)) if layers > 1 else 0)
    assert auto.work(forward, "cyclic-reduction").steps == levels
    assert auto.work(backward, "cyclic-reduction").steps == levels
    assert auto.work(forward, "cyclic-reduction").flops == \
        auto.work(backward, "cyclic-reduction").flops  # the same chains, each way


def test_counts_are_the_cost_models():
    system = fnn_system(layers=100, width=8, r=3)
    substitution = auto.work(system, "substitution")
    assert substitution.steps == 101 and substitution.flops == 2 * 100 * 8 * 8 * 3
    reduction = auto.work(system, "cyclic-reduction")
    assert reduction.steps == math.ceil(math.log2(101))
    assert reduction.flops == cost.cyclic_reduction_flops(system.sizes, 3, shared=False)
    assert auto.work(system, "parallel-cyclic-reduction").flops == \
        cost.parallel_cyclic_reduction_flops(system.sizes, 3, shared=False)
    shared = auto.work(fnn_system(layers=100, width=8, r=1), "cyclic-reduction")
    assert shared.flops == cost.cyclic_reduction_flops(system.sizes, 1, shared=True)
    assert shared.features() == (1.0, shared.steps, shared.flops, shared.flops / 8)
    net = pp.FNN.random([4, 6, 3, 5], activation="tanh", seed=0)  # unequal widths
    x = np.random.default_rng(0).standard_normal((4, 2))  # two samples, two matrices
    unequal = pp.backward_system(net, net.forward(x), np.ones((5, 2)))
    assert auto.work(unequal, "substitution").flops == 2 * 2 * (4 * 6 + 6 * 3 + 3 * 5)
    assert auto.work(unequal, "cyclic-reduction").flops == \
        cost.cyclic_reduction_flops([4, 6, 3, 5], 2, shared=False)


def test_over_the_memory_budget_a_reduction_is_left_out_with_the_reason():
    system = fnn_system(layers=256, width=8)
    with pp.memory.limit(20_000):
        choice = auto.choose(system, calibration=model("cyclic-reduction"))
    assert choice.method in ("substitution", "parallel-cyclic-reduction")
    assert "over the memory budget" in choice.excluded["cyclic-reduction"]
    with pp.memory.limit(10_000):
        solution = pp.solve(system, "auto")
    assert solution.converged and solution.info["auto"]["method"] == "substitution"


def test_graphs_and_sparse_couplings_take_substitution_and_say_why():
    net = pp.Graph.residual_mlp(6, 3, "tanh", 0)
    trace = net.forward(np.ones((6, 2)))
    graph = pp.backward_system(net, trace, net.loss_gradient(trace, np.zeros((6, 2))))
    choice = auto.choose(graph, calibration=model("cyclic-reduction"))
    assert choice.method == "substitution" and "substitution not modelled" in choice.reason
    assert choice.excluded == {m: "does not apply to this system" for m in auto.CANDIDATES[1:]}
    W = [sp.random_array((16, 16), density=0.2, random_state=k, format="csr") + sp.eye_array(16)
         for k in range(5)]
    sparse = pp.FNN([w.tocsr() for w in W], [np.zeros(16)] * 5, "tanh")
    system = pp.backward_system(sparse, sparse.forward(np.ones(16)), np.ones(16))
    choice = auto.choose(system, calibration=model("cyclic-reduction"))
    assert choice.method == "substitution" and "sparse" in choice.excluded["cyclic-reduction"]


def test_candidates_are_checked():
    system = fnn_system()
    assert pp.solve(system, "auto", candidates="substitution").info["auto"]["method"] == \
        "substitution"
    with pytest.raises(ValueError, match="candidates must be drawn from"):
        pp.solve(system, "auto", candidates=("jacobi",))
    with pytest.raises(TypeError, match="no option 'candidate'.*did you mean 'candidates'"):
        pp.solve(system, "auto", candidate=("substitution",))


def test_a_plan_keeps_its_choice_for_every_right_hand_side():
    system = fnn_system(r=2)
    plan = pp.prepare(system, "auto")
    rhs = np.random.default_rng(5).standard_normal(system.rhs.shape)
    ours = plan.solve(rhs)
    reference = pp.solve(system.with_rhs(rhs), "substitution").x
    assert np.linalg.norm(ours.x - reference) <= 1e-12 * np.linalg.norm(reference)
    assert ours.info["auto"] == plan.solve().info["auto"]


def test_backprop_and_forward_take_auto():
    net = pp.FNN.random([5, 7, 7, 3], activation="tanh", seed=0)
    x, t = np.ones((5, 2)), np.zeros((3, 2))
    g, reference = pp.backprop(net, x, t, method="auto"), pp.backprop(net, x, t)
    for a, b in zip(g.W, reference.W):
        assert np.linalg.norm(a - b) <= 1e-12 * np.linalg.norm(b)
    tr = pp.forward(net, x, method="auto")
    assert np.abs(tr.output - net.forward(x).output).max() < 1e-10


def test_calibration_is_stored_read_and_fitted(tmp_path, monkeypatch):
    where = tmp_path / "calibration.json"
    monkeypatch.setenv("PROPOP_CALIBRATION", str(where))
    measured = calibration.calibrate(quick=True, progress=False)
    stored = json.loads(where.read_text())
    assert stored["features"] == list(constants.FEATURES)
    loaded = constants.load()
    assert loaded.coefficients == measured.coefficients and str(where) in loaded.source
    for row in loaded.measurements:  # the stored predictions are the model's
        assert all(c >= 0 and math.isfinite(c)
                   for c in loaded.coefficients[row["family"]][row["method"]])
        assert loaded.predict(row["family"], row["method"], row["features"]) == \
            pytest.approx(row["predicted"])
    assert str(where) in pp.solve(fnn_system(), "auto").info["auto"]["calibration"]


def test_a_broken_calibration_file_is_named(tmp_path, monkeypatch):
    where = tmp_path / "calibration.json"
    monkeypatch.setenv("PROPOP_CALIBRATION", str(where))
    where.write_text("{not json")
    with pytest.raises(ValueError, match="calibration.json is not a propop calibration"):
        constants.load()
    where.write_text(json.dumps({"coefficients": {"chain": {"substitution": [1.0]}}}))
    with pytest.raises(ValueError, match="every method needs 4 constants"):
        constants.load()
    with pytest.raises(KeyError, match="no constants for 'cyclic-reduction'.*propop calibrate"):
        constants.load_default().predict("tree", "cyclic-reduction", (1, 1, 1, 1))


def test_explain_and_the_cli_say_what_auto_takes(tmp_path, capsys):
    text = pp.solvers.explain(fnn_system(), file=None)
    assert "method='auto' takes" in text
    assert main(["explain", "--layers", "4", "--width", "8", "--batch", "2"]) == 0
    assert "method='auto' takes" in capsys.readouterr().out
    where = tmp_path / "mine.json"
    assert main(["calibrate", "--quick", "--output", str(where)]) == 0
    out = capsys.readouterr().out
    assert "| FNN l=16 n=8 r=1 | substitution |" in out and str(where) in out
    assert json.loads(where.read_text())["coefficients"]["chain"]["substitution"]
