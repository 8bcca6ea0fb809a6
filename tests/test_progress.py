"""Progress bars: silent by default, tqdm when asked, a clear error without tqdm."""

import importlib.util
import sys
import types

import numpy as np
import pytest

import propop as pp
from propop import progress
from propop.newton import loop as newton_forward
from propop.solvers import plan
from cases import Case


def system():
    net, trace, eps, _ = Case((6,) * 7, r=3).problem()
    return pp.backward_system(net, trace, eps)


def test_silent_by_default(capsys):
    pp.solve(system(), "jacobi")
    assert capsys.readouterr().err == ""
    assert isinstance(progress.bar("auto", 3, "x"), progress.Silent)  # not a terminal


def recording(monkeypatch, module):
    """Keep the bars ``module`` makes, to read their counts afterwards."""
    made = []
    monkeypatch.setattr(module, "bar", lambda *args: made.append(progress.bar(*args))
                        or made[-1])
    return made


def test_a_bar_advances_with_the_iterations(monkeypatch, capsys):
    made = recording(monkeypatch, plan)
    seen = []
    sol = pp.solve(system(), "jacobi", maxiter=20, progress=True, callback=seen.append)
    assert "jacobi" in capsys.readouterr().err
    assert made[0].n == sol.iterations == len(seen) and made[0].total == 20


def test_newton_forward_shows_its_iterations(monkeypatch, capsys):
    made = recording(monkeypatch, newton_forward)
    net = pp.FNN.random([4, 6, 6, 3], activation="tanh", seed=0)
    trace = pp.forward(net, np.ones((4, 2)), progress=True)
    assert "newton forward" in capsys.readouterr().err
    assert made[0].n == trace.info["iterations"] and made[0].total == 3


def test_missing_tqdm_and_bad_values_are_named(monkeypatch):
    with pytest.raises(ValueError, match="progress must be one of"):
        pp.solve(system(), "jacobi", progress="yes")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "tqdm" else real(name, *a))
    with pytest.raises(ImportError, match=r"pip install \"propop\[progress\]\""):
        pp.solve(system(), "jacobi", progress=True)
    assert isinstance(progress.bar("auto", 3, "x"), progress.Silent)


def test_auto_shows_a_bar_in_a_jupyter_kernel_only(monkeypatch, capsys):
    net = pp.FNN.random([4, 5, 3], activation="tanh", seed=0)
    x, y = np.ones((4, 6)), np.arange(6) % 3
    pp.train(net, x, y, batch_size=3)  # progress="auto": silent here, not a terminal
    assert capsys.readouterr().err == "" and not progress.interactive()
    monkeypatch.setitem(sys.modules, "ipykernel", object())  # imported is not a kernel
    assert not progress.interactive()
    kernel_shell = types.SimpleNamespace(kernel=object())
    monkeypatch.setitem(sys.modules, "IPython",
                        types.SimpleNamespace(get_ipython=lambda: kernel_shell))
    assert progress.interactive()
    pp.train(net, x, y, batch_size=3)
    assert "training" in capsys.readouterr().err
