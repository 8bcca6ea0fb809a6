"""Activation functions: f, f', and their linearisations (paper eqs. forw_diag, back_diag).

An :class:`Activation` knows ``f`` and ``f'``. From these it derives the two
elementwise linearisations ``f(y) ~= a * y + beta`` that the forward systems use
(docs/math.md, eqs. (20) and (27)):

- ``secant`` (the paper's ``d = y / f(y)``, stored as its reciprocal
  ``a = f(y) / y``), with the limits at ``y = 0`` that make it exact at the
  point: ``a = f'(0)`` where ``f(0) = 0``, and ``a = 0, beta = f(0)`` where
  ``f(0) != 0`` (the paper's breakdown case, removed);
- ``newton``: ``a = f'(y)``, ``beta = f(y) - f'(y) y``.

Activations are found by name in a registry that users can extend with
:func:`register_activation`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import backend

__all__ = [
    "Activation",
    "register_activation",
    "get_activation",
    "available_activations",
    "LINEARIZATIONS",
]

LINEARIZATIONS = ("secant", "newton")

ArrayFunction = Callable[[Any], Any]


@dataclass(frozen=True)
class Activation:
    """An elementwise activation function with its derivative.

    Parameters
    ----------
    name : str
        Registry name.
    f, df : callable
        ``f(y)`` and ``f'(y)``, elementwise, written with the array module of
        their argument (``backend.namespace(y)``) so they run on any backend.
    gain : float
        Weight-scale factor that keeps the signal's variance through a layer
        (as ``torch.nn.init.calculate_gain``); used by ``FNN.random``.
    description : str
        One line for listings.
    df_of_output : callable, optional
        ``f'(y)`` from ``z = f(y)``, where ``df`` is that same formula applied
        to ``f(y)`` (tanh: ``1 - z^2``): then the value is the same, bit for bit,
        and a trace that holds ``z`` need not evaluate ``f`` again.
    elementwise : str, optional
        The name of ``f`` in the array module where ``f`` is that very
        function (``"tanh"``): sequential loops then call it directly,
        writing into their output (:meth:`writer`).
    """

    name: str
    f: ArrayFunction
    df: ArrayFunction
    gain: float = 1.0
    description: str = ""
    df_of_output: ArrayFunction | None = None
    elementwise: str | None = None

    def writer(self, xp: Any) -> Callable[..., Any]:
        """``write(y, out=z)`` that stores ``f(y)`` in ``z``, resolved once for ``xp``.

        The array module's own function where there is one (no dispatch per
        call: the sequential loops call it once per layer or time step); the
        standard's functions take no ``out=``.
        """
        standard = getattr(xp, "__name__", "") == "array_api_strict"
        direct = getattr(xp, self.elementwise, None) if self.elementwise and not standard \
            else None
        if direct is not None:
            return direct
        f = self.f

        def write(y: Any, out: Any) -> Any:
            out[...] = f(y)
            return out

        return write

    def __call__(self, y: Any) -> Any:
        """``f(y)``."""
        return self.f(y)

    def secant(self, y: Any) -> tuple[Any, Any]:
        """Return ``(a, beta)`` with ``f(y) = a * y + beta`` and ``a = f(y) / y``.

        ``a`` is the reciprocal of the paper's ``d_ii = y_i / f(y_i)`` (eq.
        forw_diag). Where ``f(y) / y`` does not exist or overflows, the limit
        ``a = f'(0)`` is used if ``f(y) = 0``; otherwise ``a = 0`` and
        ``beta = f(y)``, so the linearisation is exact at ``y`` in every case.
        """
        xp = backend.namespace(y)
        fy = self.f(y)
        with backend.quiet(xp):
            ratio = fy / y
        undefined = ~xp.isfinite(ratio)
        a = xp.where(undefined, xp.where(fy == 0, self.df(y), 0), ratio)
        beta = xp.where(undefined & (fy != 0), fy, 0)
        return backend.astype(a, y.dtype), backend.astype(beta, y.dtype)

    def newton(self, y: Any) -> tuple[Any, Any]:
        """Return ``(a, beta)`` of the tangent: ``a = f'(y)``, ``beta = f(y) - f'(y) y``.

        ``f(y)`` is evaluated once: where ``df_of_output`` exists the slope is read
        from it (the same value, bit for bit).
        """
        fy = self.f(y)
        a = self.df(y) if self.df_of_output is None else self.df_of_output(fy)
        beta = a * y
        beta *= -1
        beta += fy  # f(y) - a y, in the product's own array
        return a, beta

    def linearize(self, y: Any, linearization: str) -> tuple[Any, Any]:
        """Return ``(a, beta)`` for ``linearization`` in :data:`LINEARIZATIONS`."""
        if linearization not in LINEARIZATIONS:
            raise ValueError(
                f"unknown linearization {linearization!r}; choose one of {LINEARIZATIONS}"
            )
        return self.secant(y) if linearization == "secant" else self.newton(y)


_REGISTRY: dict[str, Activation] = {}


def register_activation(activation: Activation) -> Activation:
    """Add ``activation`` to the registry under ``activation.name``.

    Raises
    ------
    ValueError
        If the name is taken.

    Examples
    --------
    >>> import numpy as np
    >>> swish = Activation("swish-doc", lambda y: y / (1 + np.exp(-y)),
    ...                    lambda y: (1 + np.exp(-y) + y * np.exp(-y)) / (1 + np.exp(-y)) ** 2)
    >>> register_activation(swish).name
    'swish-doc'
    """
    if activation.name in _REGISTRY:
        raise ValueError(f"activation {activation.name!r} is already registered")
    _REGISTRY[activation.name] = activation
    return activation


def get_activation(spec: str | Activation) -> Activation:
    """Return the activation named ``spec`` (or ``spec`` itself if it is one).

    Raises
    ------
    KeyError
        For an unknown name; the message lists the known ones.
    """
    if isinstance(spec, Activation):
        return spec
    try:
        return _REGISTRY[spec]
    except (KeyError, TypeError):
        raise KeyError(
            f"unknown activation {spec!r}; known: {', '.join(sorted(_REGISTRY))}"
        ) from None


def available_activations() -> list[str]:
    """Names of the registered activations, sorted."""
    return sorted(_REGISTRY)


def _xp(y: Any) -> Any:
    return backend.of(y).xp


def _one_minus_square(z: Any) -> Any:
    """``1 - z^2`` in one new array (tanh's derivative from its value)."""
    out = z * z
    out *= -1
    out += 1
    return out


def _sigmoid(y: Any) -> Any:
    """``1 / (1 + exp(-y))`` to full relative accuracy in both tails."""
    xp = _xp(y)
    e = xp.exp(-abs(y))
    return xp.where(y >= 0, 1 / (1 + e), e / (1 + e))


_LEAKY_SLOPE = 0.01
# Above this, softplus is y itself: PyTorch's F.softplus (threshold=20 at beta=1), where
# log(1 + exp(y)) is y + 2e-9 or less
SOFTPLUS_THRESHOLD = 20.0
_GELU_C = math.sqrt(2 / math.pi)
_GELU_K = 0.044715


def _gelu(y: Any) -> Any:
    """``0.5 y (1 + tanh(u)) = y sigmoid(2u)``, ``u = c (y + k y^3)``: no cancellation."""
    return y * _sigmoid(2 * _GELU_C * (y + _GELU_K * y**3))


def _gelu_df(y: Any) -> Any:
    s = _sigmoid(2 * _GELU_C * (y + _GELU_K * y**3))
    t = _sigmoid(-2 * _GELU_C * (y + _GELU_K * y**3))
    return s + 2 * y * s * t * _GELU_C * (1 + 3 * _GELU_K * y * y)


def _gelu_erf(y: Any) -> Any:
    """``y Phi(y) = 0.5 y (1 + erf(y / sqrt(2)))``: PyTorch's default ``nn.GELU()``."""
    return 0.5 * y * (1 + backend.erf(y / math.sqrt(2)))


def _gelu_erf_df(y: Any) -> Any:
    """``Phi(y) + y phi(y)``."""
    phi = _xp(y).exp(-0.5 * y * y) / math.sqrt(2 * math.pi)
    return 0.5 * (1 + backend.erf(y / math.sqrt(2))) + y * phi


def _silu_df(y: Any) -> Any:
    """``s (1 + y (1 - s))``, ``s = sigmoid(y)``."""
    s = _sigmoid(y)
    return s * (1 + y * _sigmoid(-y))


def _softplus(y: Any) -> Any:
    """``log(1 + exp(y))``, and ``y`` itself above PyTorch's threshold (``F.softplus``'s)."""
    xp = _xp(y)
    return xp.where(y > SOFTPLUS_THRESHOLD, y, xp.log1p(xp.exp(-abs(y))) + xp.maximum(y, 0))


def _softplus_df(y: Any) -> Any:
    """``sigmoid(y)``, and one above the threshold (where ``f`` is ``y``), as PyTorch's."""
    return _xp(y).where(y > SOFTPLUS_THRESHOLD, 1.0, _sigmoid(y))


for _activation in (
    Activation("identity", lambda y: y, lambda y: _xp(y).ones_like(y), 1.0, "f(y) = y"),
    Activation(
        "relu",
        lambda y: _xp(y).maximum(y, 0),
        lambda y: backend.astype(y > 0, y.dtype),
        math.sqrt(2),
        "max(y, 0); f'(0) = 0 as in PyTorch",
    ),
    Activation(
        "leaky_relu",
        lambda y: _xp(y).where(y > 0, y, _LEAKY_SLOPE * y),
        lambda y: _xp(y).where(y > 0, 1.0, _LEAKY_SLOPE * _xp(y).ones_like(y)),
        math.sqrt(2 / (1 + _LEAKY_SLOPE**2)),
        f"y if y > 0 else {_LEAKY_SLOPE} y",
    ),
    Activation("tanh", lambda y: _xp(y).tanh(y), lambda y: _one_minus_square(_xp(y).tanh(y)),
               1.0, "tanh(y)", df_of_output=lambda z: _one_minus_square(z), elementwise="tanh"),
    Activation("sigmoid", _sigmoid, lambda y: _sigmoid(y) * _sigmoid(-y), 1.0,
               "1 / (1 + exp(-y))"),
    Activation("softplus", _softplus, _softplus_df, 1.0,
               f"log(1 + exp(y)); y above {SOFTPLUS_THRESHOLD:g}, as PyTorch's"),
    Activation(
        "elu",
        lambda y: _xp(y).where(y > 0, y, _xp(y).expm1(_xp(y).minimum(y, 0))),
        lambda y: _xp(y).where(y > 0, 1.0, _xp(y).exp(_xp(y).minimum(y, 0))),
        1.0,
        "y if y > 0 else exp(y) - 1",
    ),
    Activation("gelu", _gelu, _gelu_df, 1.0,
               "GELU, tanh approximation (PyTorch approximate='tanh')"),
    Activation("gelu_erf", _gelu_erf, _gelu_erf_df, 1.0,
               "GELU, exact: y Phi(y) (PyTorch's default nn.GELU())"),
    Activation("silu", lambda y: y * _sigmoid(y), _silu_df, 1.0, "y sigmoid(y) (SiLU, swish)"),
    Activation("exp", lambda y: _xp(y).exp(y), lambda y: _xp(y).exp(y), 1.0,
               "exp(y) (a softmax's last step)", df_of_output=lambda z: z * 1,
               elementwise="exp"),
):
    register_activation(_activation)
