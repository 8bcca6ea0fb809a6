"""Shared pytest options: ``--runslow`` enables tests marked ``slow``."""

import pytest


def pytest_addoption(parser):
    parser.addoption("--runslow", action="store_true", help="run tests marked slow")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--runslow"):
        return
    skip = pytest.mark.skip(reason="slow: run with --runslow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _registry_as_it_was():
    """Each test leaves the solver registry (the process's) as it found it.

    A name a test registered is removed and one it replaced restored; built-in and
    library methods loaded on first look-up stay (their modules are imported once).
    """
    from propop.solvers import registry

    before = dict(registry._REGISTRY)
    yield
    for name in list(registry._REGISTRY):
        if name in before:
            registry._REGISTRY[name] = before[name]
        elif name not in registry.BUILTIN and name.split(".")[0] not in registry.LIBRARY_PREFIXES:
            del registry._REGISTRY[name]


def pytest_collection_finish(session):
    """Freeze what collection made (the modules, PyTorch among them) out of the collector's way.

    ``gc.freeze`` moves every tracked object to a permanent generation that later
    collections skip: a ``gc.collect()`` in a test (the memory tests call it before
    measuring) then walks the objects made since, not the imported libraries'
    hundreds of thousands, and so do the collections Python starts by itself.
    Objects made by tests are collected as before.
    """
    import gc

    gc.collect()
    gc.freeze()
