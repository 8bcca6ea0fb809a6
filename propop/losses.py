"""Loss functions and their gradients at the output layer.

Paper eqs. def_loss_component, def_loss_softmax and gradient_z_output_layer.

Samples are columns: ``output`` is ``(m,)`` or ``(m, r)`` (or ``(m, tau, r)``: every
axis after the first is a sample axis). ``reduction="sum"`` (default) is the
paper's convention: ``E = 1/2 sum ||z - t||^2`` or ``-sum t log p`` over samples
(the Delta-W-bar of eq. gradient_w_hidden_layer). ``reduction="mean"`` is
PyTorch's default: ``nn.MSELoss()``, the mean of ``(z - t)^2`` over all entries,
and ``nn.CrossEntropyLoss()``, the mean over samples; gradients then match
autograd's of those modules.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from . import backend
from ._checks import real_array, require_finite

__all__ = ["LOSSES", "REDUCTIONS", "loss_gradient", "loss_value", "require_steps_target"]

LOSSES = ("mse", "cross_entropy")
REDUCTIONS = ("sum", "mean")


def _check(output: Any, target: Any, loss: str, reduction: str = "sum") -> Any:
    """Validate the pair and return the target as an array of ``output``'s shape."""
    xp = backend.namespace(output)
    if loss not in LOSSES:
        raise ValueError(f"unknown loss {loss!r}; choose one of {LOSSES}")
    if reduction not in REDUCTIONS:
        raise ValueError(f"unknown reduction {reduction!r}; choose one of {REDUCTIONS}")
    if loss == "cross_entropy" and tuple(np.shape(target)) == tuple(output.shape[1:]):
        labels = target if hasattr(target, "dtype") and backend.of(target).name == \
            backend.of(output).name else backend.like(np.asarray(target), output)
        return _one_hot(xp, labels, output)
    target = real_array(target, "target", output.dtype)
    if target.shape != output.shape:
        raise ValueError(
            f"target has shape {tuple(target.shape)}, expected {tuple(output.shape)} (the "
            "output's)" + (f" or integer labels of shape {tuple(output.shape[1:])}"
                           if loss == "cross_entropy" else ""))
    require_finite(target, "target")
    return target


def require_steps_target(output: Any, target: Any, loss: str) -> None:
    """A recurrent network's target, checked in the shapes its caller sees, or raise.

    ``output`` is ``(tau, k[, r])``, steps first; the target is shaped like it (or
    features first, ``(k, tau[, r])``), or integer labels ``(tau[, r])`` for
    ``"cross_entropy"``. Named here, before the features move to axis 0 for
    :func:`loss_gradient`, whose message would give the moved shapes.
    """
    shape, want = tuple(np.shape(target)), tuple(output.shape)
    labels = want[:1] + want[2:]
    if shape in (want, (want[1], want[0]) + want[2:]) or (loss == "cross_entropy" and
                                                          shape == labels):
        return
    raise ValueError(f"target has shape {shape}, expected {want} (the output's: steps, "
                     "features[, samples])" + (f" or integer labels of shape {labels}"
                                               if loss == "cross_entropy" else ""))


def _one_hot(xp: Any, labels: Any, output: Any) -> Any:
    """Integer ``labels`` as one-hot columns of ``output``'s dtype, on its device."""
    m = output.shape[0]
    if backend.kind(labels.dtype) not in "iu":
        raise ValueError(f"integer labels expected, got dtype {labels.dtype}")
    if math.prod(labels.shape):
        low, high = int(xp.min(labels)), int(xp.max(labels))
        if low < 0 or high >= m:
            raise ValueError(f"labels must lie in [0, {m}), got range [{low}, {high}]")
    classes = xp.reshape(xp.arange(m, device=backend.device(output)), (m,) + (1,) * labels.ndim)
    return xp.astype(classes == labels, output.dtype)


def _softmax(output: Any) -> Any:
    xp = backend.namespace(output)
    e = xp.exp(output - xp.max(output, axis=0, keepdims=True))
    return e / xp.sum(e, axis=0, keepdims=True)


def _scale(output: Any, loss: str, reduction: str) -> float:
    """What the summed loss is multiplied by for ``reduction`` (module docstring)."""
    if reduction == "sum":
        return 1.0
    size = math.prod(output.shape)
    samples = max(size // max(output.shape[0], 1), 1) if output.ndim > 1 else 1
    return 1.0 / samples if loss == "cross_entropy" else 2.0 / max(size, 1)


def loss_gradient(output: Any, target: Any, loss: str = "mse", reduction: str = "sum") -> Any:
    """Return ``eps = dE/dz^(l)``, the right-hand side of the backward system.

    Parameters
    ----------
    output : array, shape (m,) or (m, r)
        The network's output ``z^(l)``.
    target : array
        Same shape as ``output``; for ``"cross_entropy"`` also one-hot rows,
        probabilities, or integer labels of shape ``output.shape[1:]``.
    loss : {"mse", "cross_entropy"}
        ``"mse"``: ``E = 1/2 ||z - t||^2``, gradient ``z - t``.
        ``"cross_entropy"``: softmax over the features then ``E = -sum t log p``
        (eqs. def_loss_component, def_loss_softmax), gradient ``p - t``
        (eq. gradient_z_output_layer).
    reduction : {"sum", "mean"}
        ``"sum"``: the above; ``"mean"``: PyTorch's default reductions (module
        docstring).

    Examples
    --------
    >>> import numpy as np
    >>> loss_gradient(np.array([1.0, 2.0]), np.array([0.5, 2.0]))
    array([0.5, 0. ])
    """
    target = _check(output, target, loss, reduction)
    gradient = output - target if loss == "mse" else (
        _softmax(output) * backend.namespace(output).sum(target, axis=0) - target)
    scale = _scale(output, loss, reduction)
    return gradient if scale == 1 else gradient * scale


def loss_value(output: Any, target: Any, loss: str = "mse", reduction: str = "sum") -> float:
    """Return the loss ``E`` (see :func:`loss_gradient`), summed or a mean."""
    xp = backend.namespace(output)
    target = _check(output, target, loss, reduction)
    if loss == "mse":
        return float(0.5 * xp.sum((output - target) ** 2)) * _scale(output, loss, reduction)
    shifted = output - xp.max(output, axis=0, keepdims=True)
    log_p = shifted - xp.log(xp.sum(xp.exp(shifted), axis=0, keepdims=True))
    return float(-xp.sum(target * log_p)) * _scale(output, loss, reduction)
