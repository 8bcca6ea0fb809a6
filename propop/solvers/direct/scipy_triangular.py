"""SciPy's sparse triangular solve on the explicit matrix: a direct method by rows."""

from __future__ import annotations

from typing import Any

from scipy.sparse.linalg import spsolve_triangular as scipy_solve

from ... import memory
from ..convergence import Tolerance, finish
from ..reduction import footprint
from ..registry import register
from ..solution import Solution

__all__ = ["spsolve_triangular"]


@register("scipy.spsolve_triangular", kind="direct", exact=True)
def spsolve_triangular(system: Any, *, rtol: float | None = None,
                       atol: float = 0.0) -> Solution:
    """SciPy's ``spsolve_triangular`` on the explicit matrix (all samples in one call).

    Row by row: ``levels`` is the number of unknowns of a sample. Checked by its
    true residual as :func:`substitution` is.
    """
    peak = footprint.explicit_matrix(system)
    memory.require(peak, f"scipy.spsolve_triangular with the explicit matrix of "
                   f"{system.nrhs or 1} samples",
                   "use 'substitution', which solves the same system without forming it")
    matrix = system.csr  # built once per system; SciPy works in a copy
    rhs = system.rhs if system.nrhs is None else system.rhs.T.reshape(-1)
    x = scipy_solve(matrix, rhs, lower=system.lower, unit_diagonal=system.form == "scaled")
    if system.nrhs is not None:
        x = x.reshape(system.nrhs, system.size).T
    return finish(system, x, tol=Tolerance.of(system, rtol, atol), levels=system.size,
                  info={"matrix_format": matrix.format, "nnz": matrix.nnz,
                        "peak_bytes": peak}, direct=True)
