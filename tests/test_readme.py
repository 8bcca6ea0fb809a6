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


def test_readme_pytorch_example_trains_as_torch_nn_alone(capsys):
    """The ``py`` block (the torch extra), and the same script without propop's two lines."""
    pytest = __import__("pytest")
    pytest.importorskip("torch")
    code = re.search(r"```py\n(.*?)```", README.read_text(), re.S).group(1)
    exec(compile(code, "README.md", "exec"), {})
    ours = capsys.readouterr().out.splitlines()
    iterations, status = ours[1].split()
    assert 1 <= int(iterations) <= 50 and status == "CONVERGED"
    plain = re.sub(r"ptorch\.parallelize\(model, [^)]*\)", "model", code)
    plain = re.sub(r"ptorch\.GRU\(([^)]*), mode=\"newton\", ", r"torch.nn.GRU(\1, ", plain)
    assert "ptorch." not in plain.replace("import propop.torch as ptorch", "")
    exec(compile(plain.rsplit("print(rnn.last", 1)[0], "README.md", "exec"), {})
    theirs = capsys.readouterr().out.splitlines()
    assert abs(float(ours[0]) - float(theirs[0])) <= 1e-10 * abs(float(theirs[0]))


def test_readme_counts_the_activations_there_are():
    import propop as pp

    count = len(pp.available_activations())
    assert f"{count} activations" in " ".join(README.read_text().split())
