"""A plan does a matrix's work once: 20 right-hand sides, no per-matrix work in any solve.

Every registered method (issue "Engine v3, the model", deliverable 3). The
functions that do work on the matrix alone, building views of the operator,
reducing blocks, making preconditioners, partitions or a choice, are counted
while a plan solves: none may run after ``pp.prepare``.
"""

import numpy as np
import pytest

import propop as pp
from cases import Case, excused

# module, attribute: the entry points of per-matrix work
MATRIX_WORK = [
    ("propop.systems.operator", "Operator.view"),
    ("propop.systems.operator", "Operator._with"),
    ("propop.systems.edge_groups", "EdgeGroups.__init__"),
    ("propop.solvers.reduction.chain", "product"),
    ("propop.solvers.reduction.chain", "Chain.of"),
    ("propop.solvers.reduction.sparse", "sparse_chain"),
    ("propop.solvers.reduction.over_time", "_LayerChain.chain"),
    ("propop.solvers.reduction.over_groups", "_group"),
    ("propop.solvers.iterative.preconditioners", "preconditioner"),
    ("propop.solvers.selection.auto", "choose"),
    ("propop.distributed.system", "DistributedSystem.__init__"),
]


def count_matrix_work(monkeypatch):
    """Wrap every entry point of :data:`MATRIX_WORK` with a counter; return the counts."""
    import importlib

    counts = {}
    for module_name, path in MATRIX_WORK:
        module = importlib.import_module(module_name)
        owner, _, name = path.rpartition(".")
        target = getattr(module, owner) if owner else module
        original = getattr(target, name)

        def counted(*args, _original=original, _path=path, **kwargs):
            if _path != "Operator.view" or tuple(args[1:3]) not in args[0]._views:
                counts[_path] = counts.get(_path, 0) + 1  # a view is work when it is built
            return _original(*args, **kwargs)

        if owner:
            monkeypatch.setattr(target, name, counted)
        else:  # a module-level function: patch it where its users look it up too
            monkeypatch.setattr(target, name, counted)
            for other in list(__import__("sys").modules.values()):
                if getattr(other, "__name__", "").startswith("propop") and \
                        getattr(other, name, None) is original:
                    monkeypatch.setattr(other, name, counted)
    return counts


def systems():
    net, trace, eps, _ = Case((5, 6, 6, 4), r=3).problem()
    chain = pp.backward_system(net, trace, eps)
    equal, etrace, eeps, _ = Case((5, 5, 5, 5), r=3).problem()
    stacked = pp.backward_system(equal, etrace, eeps)
    rnn = pp.RNN.random([3, 4, 4], activation="tanh", seed=0)
    rtrace = rnn.forward(np.random.default_rng(1).standard_normal((6, 3, 2)))
    time = pp.backward_system(rnn, rtrace, np.ones_like(rtrace.output))
    one = net.forward(np.repeat(np.random.default_rng(5).standard_normal((5, 1)), 3, axis=1))
    shared = pp.backward_system(net, one, np.ones((4, 3))).shared()
    graph = pp.Graph.residual_mlp(4, 2)
    gtrace = graph.forward(np.ones((4, 2)))
    groups = pp.backward_system(graph, gtrace, np.ones((4, 2)))
    return [stacked, chain, time, shared, groups]


METHODS = [s.name for s in pp.solvers.available() if s.available]
OPTIONS = {"cyclic-reduction": [{}, {"groups": True}, {"sparse": True}]}


@pytest.mark.parametrize("method", METHODS)
def test_twenty_right_hand_sides_do_the_matrix_work_once(method, monkeypatch):
    info = pp.solvers.info(method)
    cases = [(s, o) for s in systems() for o in OPTIONS.get(method, [{}])
             if (info.applies_to(s) or o.get("groups"))
             and not (o.get("groups") and (s.is_chain or s.structure is not None))
             and not (o.get("sparse") and not s.is_chain)]
    assert cases, f"no test system suits {method}"
    rng = np.random.default_rng(7)
    for system, options in cases:
        plan = pp.prepare(system, method, **options)
        counts = count_matrix_work(monkeypatch)
        for _ in range(20):
            solution = plan.solve(rng.standard_normal(system.rhs.shape))
            assert solution.converged or solution.status is pp.Status.BREAKDOWN or \
                excused(method, solution), (method, solution.message)
        assert counts == {}, (method, options, system, counts)
        monkeypatch.undo()


def test_the_architecture_page_example_adds_a_method_that_plans(monkeypatch):
    import pathlib
    import re

    text = (pathlib.Path(__file__).parents[1] / "docs" / "architecture.md").read_text()
    code = re.findall(r"```python\n(.*?)```", text, re.S)[0]
    try:
        exec(code, {})  # registers "dense-lu"
        net = pp.FNN.random([4, 8, 3], activation="tanh", seed=0)
        system = pp.backward_system(net, net.forward(np.ones(4)), np.ones(3))
        plan = pp.prepare(system, "dense-lu")
        rng = np.random.default_rng(0)
        for _ in range(3):
            rhs = rng.standard_normal(system.size)
            solution = plan.solve(rhs)
            reference = pp.solve(system.with_rhs(rhs), "substitution").x
            assert solution.converged and solution.x.shape == rhs.shape
            np.testing.assert_allclose(solution.x, reference, rtol=1e-12, atol=1e-14)
    finally:
        if "dense-lu" in [s.name for s in pp.solvers.available()]:
            pp.solvers.unregister("dense-lu")
