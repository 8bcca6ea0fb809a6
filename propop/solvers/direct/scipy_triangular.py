"""SciPy's sparse triangular solve on the explicit matrix: a direct method by rows."""

from __future__ import annotations

from typing import Any

from scipy.sparse.linalg import spsolve_triangular as scipy_solve

from ... import memory
from ...systems import assemble
from ..convergence import Tolerance, finish
from ..reduction import footprint
from ..method import Method
from ..registry import register
from ..solution import Solution

__all__ = ["SpsolveTriangular"]


@register("scipy.spsolve_triangular", kind="direct", exact=True)
class SpsolveTriangular(Method):
    """SciPy's ``spsolve_triangular`` on the explicit matrix (all samples in one call).

    Row by row: ``levels`` is the number of unknowns of a sample. Checked by its
    true residual as :func:`substitution` is. ``init`` builds the explicit matrix
    for the operator's samples (another number of columns of a shared matrix
    builds its own on the first solve, then keeps it).
    """

    def init(self, operator: Any, *, rtol: float | None = None, atol: float = 0.0) -> dict:
        """The memory guard, then the explicit matrix."""
        peak = footprint.explicit_matrix(operator)
        memory.require(peak, f"scipy.spsolve_triangular with the explicit matrix of "
                       f"{operator.samples} samples",
                       "use 'substitution', which solves the same system without forming it")
        assemble.csr(operator, operator.samples)
        return dict(rtol=rtol, atol=atol, peak=peak)

    def compute(self, state: dict, system: Any) -> Solution:
        """SciPy's solve of the stacked samples (it works in a copy of the matrix)."""
        matrix = system.csr
        x = scipy_solve(matrix, system.rhs.T.reshape(-1), lower=system.lower,
                        unit_diagonal=True)
        x = x.reshape(system.nrhs, system.size).T
        return finish(system, x, tol=Tolerance.of(system, state["rtol"], state["atol"]),
                      levels=system.size, direct=True,
                      info={"matrix_format": matrix.format, "nnz": matrix.nnz,
                            "peak_bytes": state["peak"]})
