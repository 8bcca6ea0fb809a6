"""Notebooks (jupytext py:percent) executed in a real Jupyter kernel, figures included."""

import importlib.util
import pathlib

import pytest

jupytext = pytest.importorskip("jupytext", reason="the notebooks run with jupytext")
nbclient = pytest.importorskip("nbclient", reason="the notebooks run in a kernel")
if importlib.util.find_spec("ipykernel") is None:  # found, not imported: this is no kernel
    pytest.skip("the notebooks run in an IPython kernel", allow_module_level=True)

NOTEBOOKS = sorted((pathlib.Path(__file__).parents[1] / "notebooks").glob("*.py"))


def outputs(notebook, kind):
    """Every output of ``kind`` (``"stream"``, ``"display_data"``, ...) in cell order."""
    return [out for cell in notebook.cells if cell.cell_type == "code"
            for out in cell.get("outputs", []) if out["output_type"] == kind]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_in_a_kernel_and_shows_a_figure(path):
    notebook = jupytext.read(path)
    nbclient.NotebookClient(notebook, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}}).execute()
    text = "".join(out.get("text", "") for out in outputs(notebook, "stream"))
    assert "CONVERGED" in text and "Traceback" not in text
    figures = [out for out in outputs(notebook, "display_data") if "image/png" in out["data"]]
    assert figures, "every notebook shows its key result as a figure"
    first = notebook.cells[0]
    assert first.cell_type == "markdown" and first.source.startswith("# ")  # a title
    assert not any(out["output_type"] == "execute_result" and "Notebook" in
                   str(out["data"].get("text/plain", "")) for cell in notebook.cells
                   if cell.cell_type == "code" for out in cell.get("outputs", []))
