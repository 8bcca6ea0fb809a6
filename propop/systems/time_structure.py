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
        """``A x`` or ``A^T x`` with one product per template (any form, any batch)."""
        xp = system.backend.xp
        per, batch = len(self.sizes), x.shape[1:]
        X = xp.reshape(x, (self.tau, sum(self.sizes)) + batch)
        offsets = [sum(self.sizes[:k]) for k in range(per)]
        layers = [X[:, o: o + n, ...] for o, n in zip(offsets, self.sizes)]
        scales = system.periodic_scales(per)
        paper = system.form == "paper"
        out = [xk / s if paper and s is not None else xp.asarray(xk, copy=True)
               for xk, s in zip(layers, scales)]
        for t in self.templates:
            scale = None if paper else scales[t.row]
            if transpose:  # out_col[s + offset] -= M^T (scale_row x_row)[s]
                source = layers[t.row] if scale is None else scale * layers[t.row]
                out[t.col] -= _shifted(xp, backend.over_time(xp.matrix_transpose(t.M), source),
                                       -t.offset)
            else:  # out_row[s] -= scale_row[s] (M x_col[s + offset])
                product = _shifted(xp, backend.over_time(t.M, layers[t.col]), t.offset)
                out[t.row] -= product if scale is None else scale * product
        return xp.reshape(xp.concat(out, axis=1), tuple(x.shape))


def _shifted(xp: Any, Y: Any, offset: int) -> Any:
    """``Y[s + offset]`` at step ``s``, zero where that step does not exist."""
    if offset == 0:
        return Y
    out = xp.zeros_like(Y)
    if offset > 0:
        out[:-offset, ...] = Y[offset:, ...]
    else:
        out[-offset:, ...] = Y[:offset, ...]
    return out
