"""The code follows the project's lint rules (ruff, configured in pyproject.toml)."""

import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).parents[1]


@pytest.mark.skipif(shutil.which("ruff") is None and not (pathlib.Path(sys.executable).parent
                                                          / "ruff").exists(),
                    reason="ruff is not installed (it comes with the test extra)")
def test_ruff_passes():
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "propop", "tests",
                             "benchmarks", "notebooks"], cwd=ROOT, capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_documents_cited_are_in_the_repository():
    """Docstrings and docs point to files of this repository, never to one beside it."""
    import re

    sources = [p for folder in ("propop", "tests", "benchmarks", "notebooks", "docs")
               for p in (ROOT / folder).rglob("*") if p.suffix in (".py", ".md")
               and "_build" not in p.parts and p.name != "test_style.py"]
    cited = set()
    for path in sources:
        text = path.read_text()
        assert "DESIGN section" not in text, path  # ../shared/DESIGN.md is not shipped
        cited |= set(re.findall(r"\bdocs/[a-z_]+\.md\b", text))
    assert cited  # the docstrings do cite the docs
    for document in cited:
        assert (ROOT / document).is_file(), document
    pages = [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "notebooks").glob("*.py")]
    named = {path for page in pages if page.name != "benchmarks.md"  # past runs' profiles
             for path in re.findall(r"\bpropop/[a-z_/]+\.py\b", page.read_text())}
    assert named  # the guide names modules by path
    for module in named:
        assert (ROOT / module).is_file(), module  # a module moved: the page says where
