"""Input checks whose messages name the culprit (layer, block, argument)."""

from __future__ import annotations

from typing import Any

from . import backend

__all__ = ["require_finite", "require_shape", "require_density"]


def require_finite(array: Any, what: str) -> None:
    """Raise ``ValueError`` naming ``what`` and the first bad index if ``array`` has NaN/Inf."""
    be = backend.of(array)
    data = array.data if be.sparse.issparse(array) else array
    finite = be.xp.isfinite(data)
    if bool(finite.all()):
        return
    flat = int(be.xp.argmin(finite.reshape(-1)))
    if be.sparse.issparse(array):
        coo = array.tocoo()
        where = (int(coo.row[flat]), int(coo.col[flat]))
    else:
        where = tuple(int(i) for i in be.xp.unravel_index(flat, array.shape))
    raise ValueError(f"{what} contains NaN or Inf (first at index {where})")


def require_density(density: float) -> float:
    """``density`` as a float, or ``ValueError`` unless it lies in ``(0, 1]``."""
    if not 0 < density <= 1:
        raise ValueError(f"density must lie in (0, 1], got {density}")
    return float(density)


def require_shape(array: Any, shape: tuple, what: str, why: str = "") -> None:
    """Raise ``ValueError`` if ``array.shape != shape``; ``None`` in ``shape`` matches any size."""
    ok = len(array.shape) == len(shape) and all(
        want is None or have == want for have, want in zip(array.shape, shape)
    )
    if not ok:
        expected = "(" + ", ".join("r" if s is None else str(s) for s in shape)
        expected += ",)" if len(shape) == 1 else ")"
        raise ValueError(f"{what} has shape {tuple(array.shape)}, expected {expected}{why}")
