"""Every notebook runs top to bottom twice in one kernel, as a researcher re-runs it.

The docs build (``tests/test_docs.py``) runs each notebook once, fresh; here each
runs twice in the same kernel, so that a cell that only works once (a name
registered twice, a figure or a file that already exists, state a second pass
trips over) fails. Marked slow: ``.ci/run`` runs it after the README's test command.
"""

import copy
import pathlib

import pytest

ROOT = pathlib.Path(__file__).parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.py"))


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_a_notebook_runs_twice_in_one_kernel(path, monkeypatch):
    jupytext = pytest.importorskip("jupytext")
    nbclient = pytest.importorskip("nbclient")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    notebook = jupytext.read(path)
    notebook.cells = notebook.cells + copy.deepcopy(notebook.cells)
    nbclient.NotebookClient(notebook, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}}).execute()
    outputs = [o for cell in notebook.cells if cell.cell_type == "code"
               for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    half = len(notebook.cells) // 2
    for first, second in zip(notebook.cells[:half], notebook.cells[half:]):
        assert first.source == second.source
        if first.cell_type == "code":  # the second pass ran every cell the first did
            assert second.get("execution_count") is not None, path.stem
