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
