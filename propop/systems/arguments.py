"""The ways a system's coefficients may be given, read once into one storage.

:class:`~propop.TriangularSystem`'s constructor takes a chain's couplings one per
block, general edges, a time structure of repeated templates (RNNs), or the
stacks of a chain of one width; it always has. This module checks what was
given, once, and reads it into a :mod:`.layout` and the storage of
:mod:`.coefficients`: whatever the caller gave, an operator holds a layout,
dense stacks or a sparse list of couplings, and block-indexed stacks of
scalings. It also promotes every coefficient to one floating type.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

from .. import backend
from .._checks import require_finite
from .coefficients import DenseCouplings, IdentityCouplings, Scalings, couplings_of
from .layout import ChainLayout, GraphLayout, Template, TimeLayout

__all__ = ["read", "one_dtype"]


def read(coupling: Sequence[Any] | None, row_scale: Sequence[Any] | None, *, lower: bool,
         sizes: tuple, edges: Sequence[tuple[int, int, Any]] | None, structure: Any,
         layer_scales: Sequence[Any] | None, coupling_stack: Any, scale_stack: Any,
         samples: int | None, name: Callable[[int], str]) -> tuple:
    """``(layout, couplings, scalings)`` of the constructor's arguments, checked.

    See :class:`~propop.TriangularSystem` for the arguments; exactly one of
    ``coupling``, ``edges``, ``structure`` and ``coupling_stack`` gives the
    couplings, and at most one of ``row_scale``, ``layer_scales`` and
    ``scale_stack`` the scalings. ``name(k)`` names block ``k`` in messages.
    """
    if min(sizes if structure is None else structure.sizes, default=0) < 1:
        raise ValueError(f"block sizes must be >= 1, got {sizes}")
    _require_one(coupling, row_scale, edges, structure, layer_scales, coupling_stack,
                 scale_stack)
    identity = isinstance(coupling_stack, str)
    if identity and (coupling_stack != "identity" or scale_stack is None):
        raise ValueError(f"coupling_stack={coupling_stack!r}: the one name it takes is "
                         "'identity', with the diagonals as scale_stack (a chain "
                         "x_k = c_k + s_k * x_(k-1))")
    if identity:  # a chain of one width whose couplings are the identity
        layout = ChainLayout(lower, sizes)
    else:
        layout, couplings = _couplings(coupling, lower=lower, sizes=sizes, edges=edges,
                                       structure=structure, coupling_stack=coupling_stack,
                                       samples=samples, name=name)
    scalings = _scalings(row_scale, layer_scales, scale_stack, layout, samples, name)
    if identity:
        S = scalings.stacks[0]
        eye = backend.namespace(S).eye(sizes[0], dtype=S.dtype, device=backend.device(S))
        couplings = IdentityCouplings(eye, len(sizes) - 1)
    return layout, couplings, scalings


def _require_one(coupling: Any, row_scale: Any, edges: Any, structure: Any,
                 layer_scales: Any, coupling_stack: Any, scale_stack: Any) -> None:
    if coupling_stack is not None and (coupling is not None or edges is not None):
        raise ValueError("give coupling_stack instead of coupling or edges, not both")
    if scale_stack is not None and (row_scale is not None or layer_scales is not None):
        raise ValueError("give scale_stack instead of row_scale, not both")
    if structure is not None:
        if coupling is not None or edges is not None:
            raise ValueError("a structure gives the couplings: no coupling or edges too")
        if (row_scale is None) == (layer_scales is None):
            raise ValueError("give either row_scale or layer_scales with a structure")
    elif coupling_stack is None and (coupling is None) == (edges is None):
        raise ValueError("give either coupling (a chain) or edges, not both")


def _reads(row: int, col: int, name: Callable[[int], str], stored: str = "") -> str:
    """A coupling in messages: its position and the blocks it joins, by their names."""
    return f"coupling ({row}, {col}){stored}, by which {name(row)} reads {name(col)},"


def _couplings(coupling: Any, *, lower: bool, sizes: tuple, edges: Any, structure: Any,
               coupling_stack: Any, samples: int | None, name: Callable[[int], str]) -> tuple:
    """The layout and the couplings' storage, each coupling's shape checked against it.

    Each coupling is checked finite, named by the blocks it joins (``name``).
    """
    if coupling_stack is not None:
        stack = _checked_stack(coupling_stack, "coupling_stack", (), sizes, samples)
        layout = ChainLayout(lower, sizes)
        if not backend.all_finite(stack):  # one sum; each coupling only where it is not
            for j in range(stack.shape[0]):
                require_finite(stack[j, ...], _reads(*layout.pair(j), name,
                                                     f" (coupling_stack[{j}])"))
        return layout, DenseCouplings([stack])
    if structure is not None:
        templates = tuple(Template(t.row, t.col, t.offset, i)
                          for i, t in enumerate(structure.templates))
        layout = TimeLayout(lower, tuple(map(int, structure.sizes)), int(structure.tau),
                            templates)
        if sizes != layout.sizes:
            raise ValueError(f"the blocks' sizes are not the structure's {structure.sizes} "
                             f"repeated over {structure.tau} steps")
        matrices = [t.M for t in structure.templates]
        where = lambda i: _template(templates[i])  # noqa: E731
    elif coupling is not None:
        layout = ChainLayout(lower, sizes)
        matrices, where = list(coupling), lambda j: _reads(*layout.pair(j), name)
    else:
        edges = list(edges)
        layout = GraphLayout(lower, sizes, tuple((int(row), int(col), j)
                                                 for j, (row, col, _) in enumerate(edges)))
        matrices = [M for _, _, M in edges]
        where = lambda j: _reads(int(edges[j][0]), int(edges[j][1]), name)  # noqa: E731
    couplings = couplings_of(matrices, where)
    layout.check(couplings.shape)
    _require_finite_couplings(couplings.arrays(), where)
    return layout, couplings


def _template(t: Template) -> str:
    """A time structure's template in messages: which layer reads which, and when.

    (An RNN's ``W[k - 1]`` is layer ``k`` reading layer ``k - 1`` at the same step,
    its ``U[k - 1]`` layer ``k`` reading itself one step away.)
    """
    steps = "one step" if abs(t.offset) == 1 else f"{abs(t.offset)} steps"
    when = "at the same step" if t.offset == 0 else (
        f"{steps} {'earlier' if t.offset < 0 else 'later'}")
    return f"template (layer {t.row} reads layer {t.col} {when})"


def _require_finite_couplings(arrays: Sequence[Any], where: Callable[[int], str]) -> None:
    """Every coupling finite (a sum of each, one synchronisation), else the first named.

    ``arrays``: coupling ``j``'s matrix, or its stack of one (:func:`couplings_of`).
    Each is summed where it is: a transposed weight is a view, which a concatenation
    (:func:`_all_finite`'s for small arrays) would copy, at twice the time.
    """
    unique = {id(M): M.data if backend.is_sparse(M) else M for M in arrays}  # shared once
    if not unique:
        return
    xp = backend.namespace(next(iter(unique.values())))
    with backend.quiet(xp):  # NaN and Inf survive the sums; an overflow checks the entries
        if math.isfinite(float(sum(xp.sum(a) for a in unique.values()))):
            return
    for j, M in enumerate(arrays):
        require_finite(M if backend.is_sparse(M) or M.ndim == 2 else M[0, ...], where(j))


def _scalings(row_scale: Any, layer_scales: Any, scale_stack: Any, layout: Any,
              samples: int | None, name: Callable[[int], str]) -> Scalings:
    """The row scalings' storage, each checked for shape, type and finiteness."""
    nb = layout.nblocks
    if scale_stack is not None:
        stack = _checked_stack(scale_stack, "scale_stack",
                               (samples, 1) if samples is not None else (None,),
                               layout.sizes, samples)
        scalings = Scalings([stack], 1, nb)
    elif layer_scales is not None:
        scalings = Scalings(_checked_layers(layer_scales, layout, samples), 0, nb)
    elif row_scale is not None:
        scalings = Scalings.per_block(_checked_rows(row_scale, layout.sizes, samples, name))
    else:
        scalings = Scalings.unscaled(nb)
    arrays = scalings.arrays()
    if arrays and not _all_finite(arrays):
        for k in range(nb):
            if scalings[k] is not None:
                require_finite(scalings[k], f"{name(k)}: row scaling")
    return scalings


def _all_finite(arrays: tuple) -> bool:
    """Whether every entry of ``arrays`` is finite: one sum of sums, one synchronisation.

    Small arrays (a layer's scalings, one per block) are concatenated and summed
    once, large ones (a graph's broadcast products) summed where they are, not
    copied. NaN and Inf survive the sums (:func:`propop.backend.all_finite`);
    where the total is not finite (or overflowed), each part's entries decide.
    """
    xp = backend.namespace(arrays[0])
    if len(arrays) == 1:
        return backend.all_finite(arrays[0], xp)
    large = [a for a in arrays if math.prod(a.shape) >= backend.SMALL_FINITE]
    small = [xp.reshape(a, (-1,)) for a in arrays if math.prod(a.shape) < backend.SMALL_FINITE]
    parts = large + ([xp.concat(small)] if small else [])
    with backend.quiet(xp):
        if math.isfinite(float(sum(xp.sum(a) for a in parts))):
            return True
    return all(backend.all_finite(a, xp) for a in parts)


def _checked_stack(stack: Any, what: str, columns: tuple, sizes: tuple,
                   samples: int | None) -> Any:
    """``stack`` checked once: couplings ``(nb - 1[, r], n, n)``, scalings ``(nb - 1, n[, c])``.

    ``columns`` are the allowed trailing sizes of a scaling (``None``: no axis).
    """
    nb, n = len(sizes), sizes[0]
    shape = tuple(getattr(stack, "shape", ()))
    want_r = True
    if not columns and len(shape) == 4 and samples is not None:  # per sample
        shape, want_r = shape[:1] + shape[2:], shape[1] == samples
    trailing = shape[2:] or (None,)
    want = (nb - 1, n) + (n,) * (not columns)
    fits = want_r and shape[:2 + (not columns)] == want and (
        len(trailing) == 1 and (trailing[0] in columns or not columns))
    if set(sizes) != {n} or not fits or not backend.is_real_floating(stack):
        shapes = " or ".join(str(want + ((c,) if c else ())) for c in columns) or (
            f"{want} or, per sample, ({nb - 1}, r, {n}, {n})")
        raise ValueError(f"{what} must be a real floating array of shape {shapes} for "
                         f"{nb} blocks of one width, got {getattr(stack, 'shape', None)} "
                         f"and block sizes {sorted(set(sizes))}")
    return stack


def _checked_layers(layer_scales: Sequence[Any], layout: TimeLayout,
                    samples: int | None) -> list:
    """A time layout's scalings, one stack ``(tau, n_k[, c])`` per layer of a step."""
    per, tau = layout.per, layout.tau
    if len(layer_scales) != per:
        raise ValueError(f"{per} layers need {per} layer scalings, got {len(layer_scales)}")
    batch = () if samples is None else (samples,)
    for k, s in enumerate(layer_scales):
        want = (tau, layout.step_sizes[k]) + batch
        if s is not None and (not backend.is_real_floating(s)
                              or (s.shape != want and s.shape != want[:2] + (1,))):
            raise ValueError(f"layer {k}: stacked scalings have shape "
                             f"{getattr(s, 'shape', None)}, expected {want} (time, "
                             "features[, samples]) of a real floating type")
    return list(layer_scales)


def _checked_rows(row_scale: Sequence[Any], sizes: tuple, samples: int | None,
                  name: Callable[[int], str]) -> list:
    """One scaling per block: ``None``, ``(n_k,)``, or ``(n_k, r)`` / ``(n_k, 1)``."""
    row_scale = list(row_scale)
    if len(row_scale) != len(sizes):
        raise ValueError(f"{len(sizes)} blocks need {len(sizes)} row scalings; got "
                         f"{len(row_scale)}")
    for k, s in enumerate(row_scale):
        if s is None:
            continue
        if not backend.is_real_floating(s):
            raise ValueError(f"{name(k)}: row scaling must be a real floating array")
        want = (sizes[k],) if samples is None else (sizes[k], samples)
        if s.shape != want and not (samples is not None and s.shape == (sizes[k], 1)):
            raise ValueError(f"{name(k)}: row scaling has shape {s.shape}, expected {want}")
    return row_scale


def one_dtype(coupling: Any, row_scale: Any, rhs: Any, edges: Any, structure: Any,
              layer_scales: Any, coupling_stack: Any, scale_stack: Any) -> tuple:
    """Every coefficient and the right-hand side in one floating type, the widest given.

    A float64 right-hand side with float32 couplings (or the reverse) would be
    solved in a mix of precisions and miss the float64 tolerance: the arrays are
    promoted once, here, and the system's dtype is that one type.
    """
    arrays = [rhs, coupling_stack, scale_stack, *(coupling or ()), *(row_scale or ()),
              *(layer_scales or ()), *(M for _, _, M in edges or ()),
              *(t.M for t in (structure.templates if structure is not None else ()))]
    present = [a for a in arrays if a is not None]
    backend.of(*present)  # mixed backends are named before dtypes are compared
    kinds = {a.dtype for a in present if backend.is_real_floating(a)}
    if len(kinds) <= 1:
        return (coupling, row_scale, rhs, edges, structure, layer_scales, coupling_stack,
                scale_stack)
    wide = max(kinds, key=lambda d: backend.eps(d) ** -1)

    def cast(a: Any) -> Any:
        return a if a is None or not backend.is_real_floating(a) else backend.astype(a, wide)

    def each(items: Any) -> Any:
        return None if items is None else [cast(a) for a in items]

    if structure is not None:
        structure = dataclasses.replace(structure, templates=tuple(
            dataclasses.replace(t, M=cast(t.M)) for t in structure.templates))
    return (each(coupling), each(row_scale), cast(rhs),
            None if edges is None else [(i, j, cast(M)) for i, j, M in edges], structure,
            each(layer_scales), cast(coupling_stack), cast(scale_stack))
