"""Notebooks (jupytext py:percent) run headless as scripts."""

import pathlib
import runpy

import pytest

NOTEBOOKS = sorted((pathlib.Path(__file__).parents[1] / "notebooks").glob("*.py"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs(path, capsys):
    runpy.run_path(str(path), run_name="__main__")
    out = capsys.readouterr().out
    assert "Traceback" not in out and "CONVERGED" in out
