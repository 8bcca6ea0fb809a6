"""Every notebook runs top to bottom twice in one kernel, as a researcher re-runs it.

Each runs twice in the same kernel, so that a cell that only works once (a name
registered twice, a figure or a file that already exists, state a second pass
trips over) fails. The first pass, a fresh run, goes into the docs build's notebook
cache (``docs/conf.py``, keyed by propop's source), so that the docs build after it
(``tests/test_docs.py``) shows these outputs instead of running each notebook again:
``.ci/run`` runs this file first. Marked slow.
"""

import copy
import functools
import importlib.util
import pathlib

import pytest

ROOT = pathlib.Path(__file__).parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.py"))
HANG = 600  # seconds a cell may take: a guard against a hung kernel (cells take < 10 s idle)


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_a_notebook_runs_twice_in_one_kernel(path):
    jupytext = pytest.importorskip("jupytext")
    nbclient = pytest.importorskip("nbclient")
    notebook = jupytext.read(path)
    notebook.cells = notebook.cells + copy.deepcopy(notebook.cells)
    nbclient.NotebookClient(notebook, timeout=HANG, kernel_name="python3", record_timing=False,
                            resources={"metadata": {"path": str(path.parent)}}).execute()
    outputs = [o for cell in notebook.cells if cell.cell_type == "code"
               for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    half = len(notebook.cells) // 2
    for first, second in zip(notebook.cells[:half], notebook.cells[half:]):
        assert first.source == second.source
        if first.cell_type == "code":  # the second pass ran every cell the first did
            assert second.get("execution_count") is not None, path.stem
    notebook.cells = notebook.cells[:half]
    _cache(notebook, ROOT / "docs" / "notebooks" / path.name)


def _cache(notebook, uri):
    """Store a fresh run's outputs where the docs build looks for them."""
    jupyter_cache = pytest.importorskip("jupyter_cache")
    from jupyter_cache.base import CacheBundleIn

    cache = jupyter_cache.get_cache(_cache_path())
    cache.cache_notebook_bundle(CacheBundleIn(notebook, str(uri)), check_validity=False,
                                overwrite=True)


@functools.cache
def _cache_path() -> str:
    """The docs build's notebook cache (``docs/conf.py``: a hash of propop's source)."""
    spec = importlib.util.spec_from_file_location("docs_conf", ROOT / "docs" / "conf.py")
    conf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conf)
    return conf.nb_execution_cache_path
