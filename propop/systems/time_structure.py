"""The Kronecker-like structure of RNN systems: the same blocks at every time step.

An RNN system (eqs. forw_prop_sys_rnn, back_prop_sys_rnn) is, per sample,
``A = I - sum_t diag(s_row(t)) (Shift_t kron M_t)``: each **template** ``t`` couples
layer ``row`` at step ``s`` to layer ``col`` at step ``s + offset`` through one
matrix ``M`` shared by all steps (``W`` within a step, ``offset = 0``; ``U``
across steps, ``offset = -1`` forward or ``+1`` backward). Applying ``A`` then
takes one product per template over all time steps and samples at once: the
operator never loops over time.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from .. import backend
from .._checks import as_coupling


__all__ = ["Template", "TimeStructure"]


@dataclass(frozen=True)
class Template:
    """Layer ``row`` at step ``s`` reads ``M @`` layer ``col`` at step ``s + offset``."""

    row: int
    col: int
    offset: int
    M: Any


@dataclass(frozen=True)
class TimeStructure:
    """``tau`` steps of ``sizes`` (one step's block sizes) coupled by ``templates``."""

    tau: int
    sizes: tuple
    templates: tuple

    def canonical(self) -> TimeStructure:
        """The structure with canonical template matrices (itself if they are already)."""
        templates = tuple(dataclasses.replace(t, M=as_coupling(
            t.M, f"template (layer {t.row} reads layer {t.col})")) for t in self.templates)
        if all(a.M is b.M for a, b in zip(templates, self.templates)):
            return self
        return dataclasses.replace(self, templates=templates)

    def edges(self) -> list[tuple[int, int, Any]]:
        """The explicit ``(row block, column block, matrix)`` list, time-major blocks."""
        per = len(self.sizes)
        return [(s * per + t.row, (s + t.offset) * per + t.col, t.M)
                for s in range(self.tau) for t in self.templates
                if 0 <= s + t.offset < self.tau]

    def apply(self, system: Any, x: Any, transpose: bool = False) -> Any:
        """``A x`` or ``A^T x`` with one product per template (any form, any batch).

        One copy of ``x`` is the result: each template's product covers only the
        steps it couples and is subtracted into that copy's rows (a fresh array the
        size of ``x`` costs its page faults, the arithmetic here being light).
        """
        xp = system.backend.xp
        per, batch = len(self.sizes), x.shape[1:]
        X = xp.reshape(x, (self.tau, sum(self.sizes)) + batch)
        starts = [sum(self.sizes[:k]) for k in range(per + 1)]
        layer = [slice(a, b) for a, b in zip(starts, starts[1:])]
        scales = system.periodic_scales(per)
        paper = system.form == "paper"
        out = xp.asarray(X, copy=True)
        for k, s in enumerate(scales):
            if paper and s is not None:  # the paper form's diagonal, 1 / s
                out[:, layer[k], ...] /= s
        for t in self.templates:
            rows, cols = _steps(self.tau, t.offset)  # step s reads step s + offset
            scale = None if paper or scales[t.row] is None else scales[t.row][rows, ...]
            if transpose:  # out_col[s + offset] -= M^T (scale_row x_row)[s]
                source = X[rows, layer[t.row], ...]
                product = backend.over_time(xp.matrix_transpose(t.M), source if scale is None
                                            else scale * source)
                out[cols, layer[t.col], ...] -= product
            else:  # out_row[s] -= scale_row[s] (M x_col[s + offset])
                product = backend.over_time(t.M, X[cols, layer[t.col], ...])
                if scale is not None:
                    product *= scale  # a new array, scaled in place
                out[rows, layer[t.row], ...] -= product
        return xp.reshape(out, tuple(x.shape))


def _steps(tau: int, offset: int) -> tuple[slice, slice]:
    """The steps ``s`` that read a step ``s + offset`` of ``tau``, and the steps they read."""
    return (slice(max(0, -offset), tau - max(0, offset)),
            slice(max(0, offset), tau - max(0, -offset)))
