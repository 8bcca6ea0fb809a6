"""The solver registry: registration, look-up, listing, entry points, custom functions."""

import importlib.metadata
import sys
import types

import numpy as np
import pytest

import propop as pp
from propop.solvers import registry
from cases import Case

EXPECTED = {"substitution", "scipy.spsolve_triangular", "jacobi", "richardson", "bicgstab",
            "scipy.gmres", "scipy.lgmres", "scipy.bicgstab", "scipy.cgs", "scipy.tfqmr",
            "scipy.gcrotmk", "scipy.qmr", "scipy.bicg", "scipy.lsqr", "scipy.lsmr",
            "pyamg.gmres", "pyamg.fgmres", "pyamg.bicgstab"}


def test_every_method_of_the_foundation_is_registered():
    infos = pp.solvers.available()
    assert EXPECTED <= {s.name for s in infos}
    for s in infos:
        assert s.kind in pp.solvers.KINDS and s.description and callable(s.method.compute)
        assert set(s.backends) <= {"numpy", "cupy", "torch", "array_api_strict"}
    assert pp.solvers.info("substitution").exact and not pp.solvers.info("jacobi").exact


def test_register_rejects_duplicates_and_bad_kinds():
    with pytest.raises(ValueError, match="solver 'jacobi' is already registered"):
        pp.solvers.register("jacobi", kind="iterative", exact=False)(lambda s: None)
    with pytest.raises(ValueError, match="kind must be one of"):
        pp.solvers.register("x", kind="magic", exact=False)
    with pytest.raises(ValueError, match="unknown backends"):
        pp.solvers.register("x", kind="direct", exact=True, backends=("tpu",))


def test_a_registered_function_is_solved_with_by_name_and_raises_on_failure():
    @pp.solvers.register("test.never", kind="iterative", exact=False)
    def never(system, **options):
        """Returns the zero vector and admits it."""
        return pp.Solution(x=np.zeros_like(system.rhs), status=pp.Status.MAX_ITER,
                           message="gave up")

    net, trace, eps, _ = Case((3, 2)).problem()
    B = pp.backward_system(net, trace, eps)
    assert pp.solvers.info("test.never").description == "Returns the zero vector and admits it."
    assert pp.solve(B, "test.never").method == "test.never"
    with pytest.raises(pp.ConvergenceError, match="test.never: gave up"):
        pp.solve(B, "test.never", check=True)
    registry._REGISTRY.pop("test.never")


def test_a_plain_function_can_be_passed_as_method():
    net, trace, eps, v = Case((3, 4, 2)).problem()
    B = pp.backward_system(net, trace, eps)
    sol = pp.solve(B, pp.solvers.get("substitution"))
    assert sol.method == "substitution" and sol.converged


def test_entry_points_are_loaded_on_first_look_up(monkeypatch):
    module = types.ModuleType("propop_plugin_test")

    def load():
        pp.solvers.register("plugin.direct", kind="direct", exact=True)(
            pp.solvers.get("substitution"))
        return module

    point = types.SimpleNamespace(load=load, name="plugin")
    monkeypatch.setattr(registry, "_ENTRY_POINTS_LOADED", False)
    monkeypatch.setattr(registry, "entry_points",
                        lambda group: [point] if group == "propop.solvers" else [])
    monkeypatch.setitem(sys.modules, "propop_plugin_test", module)
    assert "plugin.direct" in {s.name for s in pp.solvers.available()}
    registry._REGISTRY.pop("plugin.direct")
    assert importlib.metadata.entry_points  # the real look-up stays importable


def test_method_names_in_messages_are_registered():
    """Advice such as "use 'scipy.gmres'" must name methods that exist."""
    import pathlib
    import re

    names = {s.name for s in pp.solvers.available()}
    package = pathlib.Path(pp.__file__).parent
    quoted = set()
    for path in package.rglob("*.py"):
        text = path.read_text()
        quoted.update(re.findall(r"(?:use|try|or) '([a-z.-]+)'", text))
        quoted.update(re.findall(r"'([a-z]+(?:[.-][a-z]+)+)'", text))
    assert {"substitution", "scipy.gmres"} <= quoted, "the patterns are out of date"
    from propop.activations import LINEARIZATIONS
    from propop.networks.recurrence import LINEARIZATIONS as CELL_LINEARIZATIONS
    from propop.newton.damped import DAMPED

    not_methods = {"fnn", "rnn", "swish-doc"}  # network kinds, a doctest's activation
    not_methods |= set(LINEARIZATIONS) | set(CELL_LINEARIZATIONS) | set(DAMPED)
    not_methods |= set(pp.backend.KINDS)  # backends, named in .to()'s messages
    assert quoted - not_methods <= names


def test_a_method_whose_optional_module_is_missing_is_listed_and_skipped():
    from propop import cli

    with pytest.raises(ValueError, match="must name the extra"):
        pp.solvers.register("test.needs", kind="direct", exact=True, needs=("x",))
    pp.solvers.register("test.needs", kind="direct", exact=True, needs=("no_such_module_xyz",),
                        extra="mpi")(pp.solvers.get("substitution"))
    try:
        info = pp.solvers.info("test.needs")
        assert not info.available and info.missing == ("no_such_module_xyz",)
        net, trace, eps, _ = Case((3, 4, 2)).problem()
        with pytest.raises(ImportError, match=r"needs no_such_module_xyz: pip install "
                                              r"propop\[mpi\]"):
            pp.solve(pp.backward_system(net, trace, eps), "test.needs")
        assert "| test.needs | direct | yes | numpy | no: pip install propop[mpi] |" in \
            cli.experiments.solvers_table()
        rows = cli.experiments.experiment(layers=2, width=4, batch=2, repeats=1)
        assert "test.needs" not in {row.method for row in rows}
        assert "substitution" in {row.method for row in rows}
        note = cli.experiments.unavailable_note()
        assert "test.needs" in note and "propop[mpi]" in note
    finally:
        registry._REGISTRY.pop("test.needs")


def test_importing_propop_imports_no_optional_package():
    import subprocess

    optional = ["torch", "matplotlib", "tqdm", "sklearn", "mpi4py", "jax", "cupy"]
    code = f"import sys, propop; print([m for m in {optional} if m in sys.modules])"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True)
    assert result.stdout.strip() == "[]"
