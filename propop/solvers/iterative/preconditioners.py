"""Preconditioners for the Krylov methods: ``M=`` (paper section 3.2, scaling as preconditioning).

A preconditioner is built once per operator, by a method's ``init``, from a
spec (docs/index.md, "Solving"): a name, a ``(name, {options})`` tuple, or a function
``R -> M^{-1} R`` on ``(N, k)`` arrays. The methods apply it on the right, so
the residuals they watch are the true ones.

- ``"diagonal"``: the paper's ``D^{-1}`` / ``E^{-1}``, the inverse of the block
  diagonal. Every method sees the unit-diagonal form, where it is the identity:
  the scaling is applied once, to every system, before a method runs
  (:mod:`propop.systems.make_system`); kept so that the paper's name works.
- ``"block-jacobi"`` (``group=g``): an exact solve of every group of ``g``
  consecutive blocks (layers), the couplings between groups dropped; ``g = 1``
  is ``"diagonal"``, ``g = nblocks`` the exact inverse.
- ``"air"``: PyAMG's approximate ideal restriction AMG
  (``pyamg.classical.air_solver``), one V-cycle per application, for
  experiments. Its set-up, one hierarchy per sample, costs far more than a
  direct solve of these systems; it warns so.
"""

from __future__ import annotations

import inspect
import time
import warnings
from collections.abc import Callable
from typing import Any

from ...systems import assemble
from ...systems.triangular import TriangularSystem
from ..direct.substitution import substitute
from ..options import OptionError, check_spec

__all__ = ["preconditioner"]

def preconditioner(operator: Any, spec: Any) -> Callable[[Any], Any] | None:
    """The function ``R -> M^{-1} R`` that ``spec`` names for ``operator`` (``None``: none).

    ``operator`` is canonical (scaled form, 2-D: :mod:`propop.systems.make_system`)
    and the function applies to its ``(N, c)`` blocks. Built once, by a method's
    ``init``. Raises ``ValueError`` for an unknown name or bad options.
    """
    named = check_spec(spec)
    if named is None:
        return spec
    name, options = named
    build = {"diagonal": _diagonal, "block-jacobi": _block_jacobi, "air": _air}[name]
    known = list(inspect.signature(build).parameters)[1:]
    unknown = sorted(set(options) - set(known)) if "options" not in known else []
    if unknown:
        listed = ", ".join(known) if known else "none"
        raise OptionError(f"M: preconditioner {name!r} has no option {unknown[0]!r}; its "
                          f"options are {listed}")
    return build(operator, **options)


def _diagonal(operator: Any) -> None:
    """``D^{-1}``: the identity on the scaled form every method sees, so nothing to apply."""
    return None


def _block_jacobi(operator: Any, group: int = 2) -> Callable[[Any], Any]:
    """An exact solve of each group of ``group`` consecutive blocks (in solve order)."""
    if int(group) != group or group < 1:
        raise OptionError(f"M: block-jacobi's group must be an integer >= 1, got {group}")
    position = {k: i // int(group) for i, k in enumerate(operator.blocks.order())}
    within = operator.restricted(lambda row, col: position[row] == position[col])
    within.blocks.steps  # noqa: B018 (built here, once, for every application)

    def apply(R: Any) -> Any:  # unchecked: the outer method judges its own residual
        return substitute(TriangularSystem.of(within, R, check=False))

    return apply


def _air(operator: Any, **options: Any) -> Callable[[Any], Any]:
    """One AIR V-cycle per sample; the hierarchies are built here, at a cost."""
    from pyamg.classical import air_solver

    start = time.perf_counter()
    samples = [operator.sample(0)] if operator.shares_matrix else \
        [operator.sample(i) for i in range(operator.samples)]
    cycles = [air_solver(assemble.csr(s, None), **options).aspreconditioner(cycle="V")
              for s in samples]
    warnings.warn(f"the AIR preconditioner took {time.perf_counter() - start:.2f} s to set "
                  f"up {len(cycles)} hierarchies; a direct solve of this system is cheaper, "
                  "use it for experiments", stacklevel=5)
    xp = operator.backend.xp

    def apply(R: Any) -> Any:
        columns = [cycles[min(j, len(cycles) - 1)] @ R[:, j] for j in range(R.shape[1])]
        return xp.stack([xp.asarray(c) for c in columns], axis=1)

    return apply
