"""The documentation builds with Sphinx, warnings as errors, and lists every solver.

The build executes every notebook (jupytext py:percent files) in a Jupyter kernel
through myst-nb, an error in any cell failing it: the one execution of the
notebooks per test run, none where the cache of ``docs/conf.py`` holds this code's
outputs (``tests/test_notebooks.py``, run first by ``.ci/run``, fills it), checked
here for their figures and results.
"""

import pathlib
import subprocess
import sys

import pytest

import propop as pp

ROOT = pathlib.Path(__file__).parents[1]


@pytest.mark.slow  # a minute and more: .ci/run runs it after the README's test command
def test_docs_build_without_warnings(tmp_path):
    pytest.importorskip("sphinx")
    result = subprocess.run([sys.executable, "-m", "sphinx", "-W", "-q", "-b", "html",
                             str(ROOT / "docs"), str(tmp_path)],
                            capture_output=True, text=True, timeout=600)  # a hang guard: the build
    # takes about a minute here (61 s measured), so 600 s is room for a loaded 2-core
    # machine (5x and more) while a hang still ends within CI's 20 minutes
    assert result.returncode == 0, result.stderr
    catalogue = (tmp_path / "solvers.html").read_text()
    for s in pp.solvers.available():
        assert f"<code class=\"docutils literal notranslate\"><span class=\"pre\">{s.name}" \
            in catalogue, s.name
    api = (tmp_path / "api.html").read_text()
    assert "propop.solvers.iterative.block.BlockGMRES" in api
    math = (tmp_path / "math.html").read_text()
    assert math.count('class="math notranslate nohighlight"') >= 47  # rendered by MathJax
    assert 'src="_static/mathjax/MathJax.js?config=TeX-AMS-MML_HTMLorMML-full"' in math
    assert "cdn" not in math.lower()  # offline: MathJax is bundled, not fetched
    assert '"webFont": "STIX-Web"' in math  # the fonts it bundles
    for part in ("MathJax.js", "config/TeX-AMS-MML_HTMLorMML-full.js",
                 "jax/output/HTML-CSS/fonts/STIX-Web/fontdata.js"):
        assert (tmp_path / "_static" / "mathjax" / part).is_file(), part
    assert "the forward system, Jacobian form" in math and "forw_prop_sys_jacobian" in math
    for number in range(1, 48):  # every numbered equation of the paper has its section
        assert f'id="eq-{number}"' in math, number
    notebooks = sorted((ROOT / "notebooks").glob("*.py"))
    assert notebooks
    for path in notebooks:  # executed at the build: the outputs and the figures are there
        page = (tmp_path / "notebooks" / f"{path.stem}.html").read_text()
        assert "<img" in page and "CONVERGED" in page, path.stem
        assert "Traceback" not in page, path.stem
        first = path.read_text().split("# %%")[1]  # the first cell: a markdown title
        assert first.startswith(" [markdown]\n# # "), path.stem
