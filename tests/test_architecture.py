"""The house rules (docs/architecture.md): no import cycle, floors respected, a lazy front door.

The import graph is read from the source with ``ast``: every ``import`` and
``from ... import`` anywhere in a module, function-level ones included, so that
no cycle hides inside a function.
"""

import ast
import pathlib
import subprocess
import sys

import pytest

PACKAGE = pathlib.Path(__file__).parents[1] / "propop"


def module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: pathlib.Path, modules: set) -> set:
    """The propop modules ``path`` imports, anywhere in its code."""
    here = module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:  # "from package import module" imports the module
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
    return {m for m in found if m in modules and m != here}


def graph() -> dict:
    files = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {m: imports(p, set(files)) for m, p in files.items()}


def cycles(edges: dict) -> list:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    sys.setrecursionlimit(10000)
    for v in edges:
        if v not in index:
            visit(v)
    return out


def test_the_package_has_no_import_cycle():
    assert cycles(graph()) == []


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_solvers_never_import_networks():
    edges = graph()
    upward = {(m, w) for m, ws in edges.items() if m.startswith("propop.solvers")
              for w in ws if w.startswith("propop.networks")}
    assert not upward


def loaded_after(code: str) -> set:
    """The modules a fresh interpreter holds after running ``code``."""
    script = code + "\nimport sys; print(' '.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=True).stdout
    return set(out.split())


HEAVY = {"pyamg", "scipy.sparse.linalg", "torch", "mpi4py", "jax"}
METHOD_PACKAGES = ("propop.solvers.direct", "propop.solvers.reduction",
                   "propop.solvers.iterative", "propop.solvers.selection", "propop.distributed")


def test_import_propop_loads_no_solver_and_nothing_heavy():
    loaded = loaded_after("import propop")
    assert not loaded & HEAVY
    assert not {m for m in loaded if m.startswith(METHOD_PACKAGES)}


def test_a_method_is_loaded_when_asked_for():
    loaded = loaded_after("import numpy as np, propop as pp\n"
                          "net = pp.FNN.random([3, 4, 2])\n"
                          "pp.backprop(net, np.ones(3), np.zeros(2))")
    assert "propop.solvers.direct.substitution" in loaded
    assert not loaded & HEAVY
    assert "propop.solvers.iterative.adapters" not in loaded
    loaded = loaded_after("import numpy as np, propop as pp\n"
                          "net = pp.FNN.random([3, 4, 2])\n"
                          "pp.backprop(net, np.ones(3), np.zeros(2), method='pyamg.gmres')")
    assert {"pyamg", "propop.solvers.iterative.adapters"} <= loaded


def test_every_public_name_resolves():
    import propop as pp

    for name in pp.__all__:
        assert getattr(pp, name) is not None, name
    for name in pp.solvers.__all__:
        assert getattr(pp.solvers, name) is not None, name
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        pp.nope  # noqa: B018
    assert set(pp.__all__) <= set(dir(pp))
