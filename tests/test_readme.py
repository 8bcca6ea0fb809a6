"""The README's example runs and its claims hold."""

import pathlib
import re

README = pathlib.Path(__file__).parents[1] / "README.md"


def test_readme_starts_with_the_two_commands():
    lines = [line.strip() for line in README.read_text().splitlines() if line.strip()]
    assert lines[1] == "pip install -e . && propop demo"
    assert lines[2] == 'pip install -e ".[test]" && python -m pytest'


def test_readme_example_runs(capsys):
    code = re.search(r"```python\n(.*?)```", README.read_text(), re.S).group(1)
    exec(compile(code, "README.md", "exec"), {})
    out = capsys.readouterr().out
    assert "status=CONVERGED" in out
    assert out.splitlines()[1].endswith(" 4")  # Jacobi: exact after l + 1 = 4 sweeps
    assert out.splitlines()[2] == "2"  # cyclic reduction: ceil(log2(l + 1)) levels
    assert float(out.splitlines()[3].split()[1]) < 1e-12
    assert out.splitlines()[4] == "True"  # a plan's solve for another right-hand side


def test_readme_is_short_and_self_contained():
    text = README.read_text()
    assert len(text.splitlines()) <= 250
    assert "../" not in text and "DESIGN" not in text  # nothing outside the repository
    root = README.parent
    for target in re.findall(r"\]\(([^)#]+)\)", text):  # every link and image exists
        assert (root / target).exists(), target
