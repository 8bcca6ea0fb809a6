"""Plots draw what they claim: the entries or block pattern, the histories, the levels."""

import math

import numpy as np
import pytest

import propop as pp
from cases import Case

matplotlib = pytest.importorskip("matplotlib", reason="plots need matplotlib")
matplotlib.use("Agg")
from propop import plot  # noqa: E402


def backward(sizes, r=2):
    net, trace, eps, _ = Case(sizes, r=r).problem()
    return pp.backward_system(net, trace, eps)


def test_small_system_shows_every_entry():
    B = backward((4, 5, 3))
    ax = plot.plot_system(B)
    shown = ax.lines[0].get_xydata() if ax.lines else None
    A = B.sample(0).matrix.tocoo()
    assert shown is not None and len(shown) == A.nnz
    assert "upper system, N = 12" in ax.get_title()


def test_a_system_on_pytorch_shows_the_same_entries():
    torch = pytest.importorskip("torch")
    B = backward((4, 5, 3))
    ours = plot.plot_system(B.to("torch")).lines[0].get_xydata()
    assert isinstance(B.to("torch").rhs, torch.Tensor)
    np.testing.assert_array_equal(ours, plot.plot_system(B).lines[0].get_xydata())


def test_large_system_shows_the_block_pattern():
    B = backward((50,) * 45)
    ax = plot.plot_system(B)
    pattern = plot.block_pattern(B)
    upper_bidiagonal = np.eye(45, dtype=bool) | np.eye(45, k=1, dtype=bool)
    np.testing.assert_array_equal(pattern, upper_bidiagonal)
    assert len(ax.lines[0].get_xydata()) == pattern.sum()
    assert "block pattern, 45 blocks" in ax.get_title()


def test_convergence_lines_are_the_residual_histories():
    B = backward((5,) * 7)
    solutions = [pp.solve(B, m) for m in ("jacobi", "bicgstab", "scipy.gmres")]
    ax = plot.plot_convergence(solutions + solutions[:1])
    assert len(ax.lines) == 4
    histories = [np.array(sol.residuals) / sol.residuals[0] for sol in solutions]
    floor = min(h[h > 0].min() for h in histories) / 10  # an exact zero sits at the floor
    for line, history in zip(ax.lines, histories):
        np.testing.assert_allclose(line.get_ydata(), np.maximum(history, floor))
    assert 0 in histories[0]  # Jacobi is exact after l + 1 sweeps: drawn, not dropped
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels[0] == "jacobi (converged)" and labels[3] == "jacobi (converged) #2"
    assert len(set(labels)) == 4 and ax.get_title() == "Residual histories"
    assert len({(line.get_marker(), line.get_linestyle()) for line in ax.lines}) == 4


def test_convergence_takes_labels_or_a_dict_and_puts_every_method_on_applications():
    B = backward((5,) * 7)
    solutions = {"J": pp.solve(B, "jacobi"), "B": pp.solve(B, "bicgstab"),
                 "G": pp.solve(B, "scipy.gmres")}
    ax = plot.plot_convergence(solutions)
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["J", "B", "G"]
    assert ax.get_xlabel().startswith("operator applications")
    for line, sol in zip(ax.lines, solutions.values()):
        x = line.get_xdata()
        assert x[0] == 0 and x[-1] == pytest.approx(sol.levels) and len(x) == len(sol.residuals)
    bicgstab = solutions["B"]  # two products an iteration: its x runs twice as fast
    assert ax.lines[1].get_xdata()[-1] == pytest.approx(2 * bicgstab.iterations)
    sweeps = solutions["J"]
    assert ax.lines[0].get_xdata()[-1] == pytest.approx(sweeps.iterations)
    assert [t.get_text() for t in plot.plot_convergence(
        list(solutions.values()), labels=["a", "b", "c"]).get_legend().get_texts()] == [
        "a", "b", "c"]
    with pytest.raises(ValueError, match="labels: 2 given for 3 solutions"):
        plot.plot_convergence(list(solutions.values()), labels=["a", "b"])
    with pytest.raises(ValueError, match="labelled by its keys"):
        plot.plot_convergence(solutions, labels=["a", "b", "c"])


def test_levels_follow_depth_and_log_depth():
    depths = [1, 2, 3, 8, 31]
    ax = plot.plot_levels(depths)
    by_label = {line.get_label(): line.get_ydata() for line in ax.lines}
    np.testing.assert_array_equal(by_label["substitution"], [d + 1 for d in depths])
    np.testing.assert_array_equal(by_label["cyclic-reduction"],
                                  [math.ceil(math.log2(d + 1)) for d in depths])


def test_training_and_density_plots_draw_the_recorded_values():
    from propop.training import History

    runs = {"exact": History(epochs=[{"loss": 2.0}, {"loss": 1.0}]),
            "jacobi 1": History(epochs=[{"loss": 2.0}, {"loss": 1.5}, {"loss": 1.2}])}
    ax = plot.plot_training(runs, key="loss")
    assert [line.get_label() for line in ax.lines] == ["exact", "jacobi 1"]
    np.testing.assert_array_equal(ax.lines[1].get_xydata(), [[1, 2.0], [2, 1.5], [3, 1.2]])
    assert ax.get_ylabel() == "loss"
    rows = [{"density": 0.5, "test_accuracy": 0.9}, {"density": 0.1, "test_accuracy": 0.7}]
    ax = plot.plot_density(rows, label="magnitude")
    np.testing.assert_array_equal(ax.lines[0].get_xydata(), [[0.5, 0.9], [0.1, 0.7]])
    assert ax.get_xscale() == "log" and ax.get_legend() is not None


def test_newton_histories_are_drawn_one_style_each():
    torch = pytest.importorskip("torch")
    gru = pp.from_torch(torch.nn.GRU(2, 3).double())
    xs = np.random.default_rng(0).standard_normal((10, 2, 2))
    traces = {name: pp.forward(gru, xs, method="substitution", linearization=name)
              for name in ("newton", "quasi", "damped")}
    ax = plot.plot_newton(traces)
    assert [line.get_label() for line in ax.lines] == [
        f"{n} ({t.info['iterations']} iterations)" for n, t in traces.items()]
    assert len({(line.get_marker(), line.get_linestyle()) for line in ax.lines}) == 3
    for line, trace in zip(ax.lines, traces.values()):
        drawn = line.get_ydata()
        assert len(drawn) == trace.info["iterations"] + 1 and (drawn > 0).all()
    assert "Newton family" in ax.get_title()
