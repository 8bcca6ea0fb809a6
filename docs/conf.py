"""Sphinx configuration: the Markdown guide (MyST), numpydoc docstrings, generated pages.

Build: ``python -m sphinx -W -b html docs docs/_build/html`` (``-W``: every warning,
such as a broken reference, fails the build; ``tests/test_docs.py`` runs it).

The notebooks run through myst-nb's cache (jupyter-cache), kept in
``docs/_build/.jupyter_cache/<key>``: jupyter-cache re-runs a notebook whose code
changed, and the key, a hash of propop's source and the versions of the libraries the
notebooks use, makes any change to propop re-run them all, so no page shows outputs of
code that is gone. MathJax comes from the ``jupyter-server-mathjax`` package (MathJax 2,
the Jupyter project's bundle) and is copied into the build: the math renders offline.
"""

import hashlib
import importlib.metadata
import pathlib
import shutil
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import propop  # noqa: E402
from propop.solvers import available  # noqa: E402

project = "propop"
author = "the propop developers"
release = propop.__version__ if hasattr(propop, "__version__") else "0"
extensions = ["myst_nb", "sphinx.ext.autodoc", "numpydoc", "sphinx.ext.mathjax"]
NOTEBOOK_LIBRARIES = ("numpy", "scipy", "pyamg", "torch", "matplotlib", "scikit-learn")
source_suffix = {".md": "myst-nb", ".rst": "restructuredtext"}
exclude_patterns = ["_build", "conf.py"]
# the notebooks, jupytext py:percent files copied in at every build, run with their outputs
nb_custom_formats = {".py": ["jupytext.reads", {"fmt": "py:percent"}]}
nb_execution_mode = "cache"
nb_execution_timeout = 600
nb_execution_raise_on_error = True
numpydoc_show_class_members = False
numpydoc_validation_checks: set = set()
autodoc_typehints = "none"
autodoc_member_order = "bysource"
myst_heading_anchors = 3
myst_enable_extensions = ["dollarmath", "amsmath"]
mathjax_path = "mathjax/MathJax.js?config=TeX-AMS-MML_HTMLorMML-full"
mathjax2_config = {"TeX": {"Macros": {"bm": ["\\boldsymbol{#1}", 1]}},
                   # MyST marks pages ignored and their math "math": MathJax 2's names
                   "tex2jax": {"ignoreClass": "tex2jax_ignore|mathjax_ignore",
                               "processClass": "tex2jax_process|mathjax_process|math"
                                               "|output_area"},
                   # the fonts the package bundles (as Jupyter's own configuration)
                   "HTML-CSS": {"availableFonts": [], "imageFont": None,
                                "preferredFont": None, "webFont": "STIX-Web"}}
html_theme = "alabaster"


def _solver_catalogue() -> None:
    """Write ``solvers.md`` from the registry, so the catalogue is never stale."""
    lines = ["# Solver catalogue", "",
             "Generated from `propop.solvers.available()` at every build.", "",
             "| name | kind | exact | runs on | needs | description |",
             "|---|---|---|---|---|---|"]
    for s in available():
        needs = ", ".join(s.requires) or "-"
        lines.append(f"| `{s.name}` | {s.kind} | {'yes' if s.exact else 'no'} | "
                     f"{s.tested} | {needs} | {s.description} |")
    (ROOT / "docs" / "solvers.md").write_text("\n".join(lines) + "\n")


def _benchmark_tables() -> None:
    """Write ``benchmarks.md`` from the committed results in ``benchmarks/results``.

    Per benchmark: the table it formatted from its rows, the number of rows and the
    machine from the JSON of the same run, and any figure it drew.
    """
    import json

    parts = ["# Benchmark tables", "",
             "The measured tables of `benchmarks/` as committed, with the machine each "
             "JSON records; each script's docstring says what it measures, and "
             "`python -m benchmarks.NAME --save` reruns it.", ""]
    results = ROOT / "benchmarks" / "results"
    for path in sorted(results.glob("*.json")):
        data = json.loads(path.read_text())
        env = data.get("environment", {})
        machine = ", ".join(f"{k} {env[k]}" for k in ("machine", "cpu_count", "python",
                                                      "numpy", "scipy") if k in env)
        table = path.with_suffix(".md")
        parts += [f"## {path.stem}", "", f"`python -m benchmarks.{path.stem}`: "
                  f"{len(data.get('rows', []))} rows; {machine}.", ""]
        if table.exists():
            parts += [table.read_text().strip(), ""]
        figure = path.with_suffix(".png")
        if figure.exists():
            parts += [f"![{path.stem}](../benchmarks/results/{figure.name})", ""]
    (ROOT / "docs" / "benchmarks.md").write_text("\n".join(parts) + "\n")


def _notebooks() -> None:
    """Copy ``notebooks/*.py`` into ``docs/notebooks`` and list them on one page."""
    folder = ROOT / "docs" / "notebooks"
    folder.mkdir(exist_ok=True)
    names = []
    for path in sorted((ROOT / "notebooks").glob("*.py")):
        (folder / path.name).write_text(path.read_text())
        names.append(f"notebooks/{path.stem}")
    (ROOT / "docs" / "notebooks.md").write_text(
        "# Notebooks\n\nThe notebooks in `notebooks/`, run at every build with their "
        "outputs (`pip install -e \".[notebooks]\"` runs them in Jupyter).\n\n"
        "```{toctree}\n:maxdepth: 1\n\n" + "\n".join(names) + "\n```\n")


def _code_key() -> str:
    """A hash of propop's source and the notebooks' libraries' versions: the cache's key."""
    digest = hashlib.sha256()
    for path in sorted((ROOT / "propop").rglob("*.py")):
        digest.update(path.relative_to(ROOT).as_posix().encode() + path.read_bytes())
    for name in NOTEBOOK_LIBRARIES:
        try:
            digest.update(f"{name} {importlib.metadata.version(name)}".encode())
        except importlib.metadata.PackageNotFoundError:
            digest.update(f"{name} missing".encode())
    return digest.hexdigest()[:16]


def _mathjax(app, exception) -> None:
    """Copy the MathJax of ``jupyter-server-mathjax`` into the build's ``_static/mathjax``."""
    if exception is None and app.builder.format == "html":
        import jupyter_server_mathjax

        source = pathlib.Path(jupyter_server_mathjax.__file__).parent / "static"
        shutil.copytree(source, pathlib.Path(app.outdir) / "_static" / "mathjax",
                        dirs_exist_ok=True)


def setup(app) -> None:
    """Sphinx's hook: the bundled MathJax once the pages are written."""
    app.connect("build-finished", _mathjax)


nb_execution_cache_path = str(ROOT / "docs" / "_build" / ".jupyter_cache" / _code_key())
_solver_catalogue()
_benchmark_tables()
_notebooks()
