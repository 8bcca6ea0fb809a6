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
    "FAMILIES",
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
    domain : float, optional
        For a function defined on ``y > domain`` alone (``log``: 0): there
        :meth:`linearize` takes the tangent or secant at ``domain + 1`` instead,
        finite, where a Newton iterate (one from zeros) is outside; ``None``: the
        whole line.
    """

    name: str
    f: ArrayFunction
    df: ArrayFunction
    gain: float = 1.0
    description: str = ""
    df_of_output: ArrayFunction | None = None
    elementwise: str | None = None
    domain: float | None = None

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
        Where ``f(0) != 0`` (a sigmoid) ``a`` grows as ``1 / y`` near zero (267 at
        ``y = 0.0019``): such rows make the forward system ill-conditioned, and a
        reduction's rounding in float32 can miss ``rtol`` (named by
        :func:`propop.forward`); Newton's tangents have bounded slopes.
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
        if self.domain is not None:  # a point inside stands in for one outside
            xp = backend.namespace(y)
            y = xp.where(y > self.domain, y, xp.asarray(self.domain + 1.0, dtype=y.dtype))
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


def get_activation(spec: str | Activation, **settings: float) -> Activation:
    """Return the activation named ``spec`` (or ``spec`` itself if it is one).

    ``settings`` are a family's own, with PyTorch's names and defaults
    (:data:`FAMILIES`): ``get_activation("leaky_relu", negative_slope=0.2)`` is
    ``nn.LeakyReLU(0.2)``, ``get_activation("elu", alpha=0.5)``,
    ``get_activation("softplus", beta=2)``, ``get_activation("hardtanh", min_val=0)``;
    at the defaults it is the registered activation itself.

    Raises
    ------
    KeyError
        For an unknown name; the message lists the known ones.
    TypeError
        For a setting the family does not have, or settings of a name that has none.
    """
    if isinstance(spec, Activation) and not settings:
        return spec
    if settings:
        return _member(spec, settings)
    try:
        return _REGISTRY[spec]
    except (KeyError, TypeError):
        raise KeyError(
            f"unknown activation {spec!r}; known: {', '.join(sorted(_REGISTRY))}"
        ) from None


def _member(name: Any, settings: dict) -> Activation:
    """The member of family ``name`` at ``settings`` (the defaults elsewhere), made once."""
    if name not in FAMILIES:
        families = "; ".join(f"{k} ({', '.join(v[1])})" for k, v in FAMILIES.items())
        raise TypeError(f"activation {name!r} takes no settings; those that do: {families}")
    make, defaults = FAMILIES[name]
    unknown = sorted(set(settings) - set(defaults))
    if unknown:
        raise TypeError(f"activation {name!r} has no setting {unknown[0]!r}; its settings "
                        f"are {', '.join(f'{k}={v!r}' for k, v in defaults.items())}")
    values = {k: _real(settings.get(k, v), k) for k, v in defaults.items()}
    if values == defaults:
        return _REGISTRY[name]
    key = (name, tuple(values.values()))
    if key not in _MEMBERS:
        changed = ", ".join(f"{k}={v!r}" for k, v in values.items() if v != defaults[k])
        _MEMBERS[key] = make(f"{name}({changed})", **values)
    return _MEMBERS[key]


def _real(value: Any, what: str) -> float:
    """A setting as a float (infinite ones too: a clamp's open side), never NaN."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) and not hasattr(
            value, "__float__"):
        raise TypeError(f"activation setting {what} must be a number, got {value!r}")
    value = float(value)
    if value != value:
        raise ValueError(f"activation setting {what} must be a number, got NaN")
    return value


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


# Above this, softplus is y itself: PyTorch's F.softplus (threshold=20 at beta=1), where
# log(1 + exp(y)) is y + 2e-9 or less
SOFTPLUS_THRESHOLD = 20.0
# nn.SELU's constants (Klambauer et al. 2017), as PyTorch writes them
_SELU_ALPHA, _SELU_SCALE = 1.6732632423543772848170429916717, 1.0507009873554804934193349852946
_GELU_C = math.sqrt(2 / math.pi)
_GELU_K = 0.044715


def _gelu(y: Any) -> Any:
    """``0.5 y (1 + tanh(u)) = y sigmoid(2u)``, ``u = c (y + k y^3)``: no cancellation."""
    return y * _sigmoid(2 * _GELU_C * (y + _GELU_K * y**3))


def _gelu_df(y: Any) -> Any:
    s = _sigmoid(2 * _GELU_C * (y + _GELU_K * y**3))
    t = _sigmoid(-2 * _GELU_C * (y + _GELU_K * y**3))
    return s + 2 * y * s * t * _GELU_C * (1 + 3 * _GELU_K * y * y)


_TWO_OVER_SQRT_PI = 2 / math.sqrt(math.pi)  # erf's slope at 0


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


def _log1p_exp(y: Any) -> Any:
    """``log(1 + exp(y))`` without overflow (no threshold)."""
    xp = _xp(y)
    return xp.log1p(xp.exp(-abs(y))) + xp.maximum(y, 0)


def leaky_relu(name: str, negative_slope: float) -> Activation:
    """``y if y > 0 else negative_slope y``, as ``nn.LeakyReLU`` (slope ``negative_slope`` at 0)."""
    s = negative_slope
    return Activation(name, lambda y: _xp(y).where(y > 0, y, s * y),
                      lambda y: _xp(y).where(y > 0, 1.0, s * _xp(y).ones_like(y)),
                      math.sqrt(2 / (1 + s**2)), f"y if y > 0 else {s:g} y")


def elu(name: str, alpha: float, scale: float = 1.0, input_scale: float = 1.0) -> Activation:
    """PyTorch's ELU kernel: ``scale y`` above 0, ``alpha scale (exp(input_scale y) - 1)`` below.

    ``nn.ELU(alpha)`` is ``scale = input_scale = 1``, ``nn.CELU(alpha)`` ``input_scale =
    1 / alpha``, ``nn.SELU`` its fixed ``alpha`` and ``scale``; the slope at 0 is the left one,
    as PyTorch's backward takes it.
    """
    neg, k = alpha * scale, input_scale

    def f(y: Any) -> Any:
        xp = _xp(y)
        return xp.where(y > 0, scale * y, neg * xp.expm1(k * xp.minimum(y, 0)))

    def df(y: Any) -> Any:
        xp = _xp(y)
        return xp.where(y > 0, scale * xp.ones_like(y), neg * k * xp.exp(k * xp.minimum(y, 0)))

    inner = "y" if k == 1 else f"{k:g} y"
    return Activation(name, f, df, 0.75 if name == "selu" else 1.0,
                      ("y" if scale == 1 else f"{scale:g} y") + f" if y > 0 else {neg:g} "
                      f"(exp({inner}) - 1)")


def _celu(name: str, alpha: float) -> Activation:
    if alpha == 0:
        raise ValueError("celu: alpha must be non-zero (CELU divides by it)")
    return elu(name, alpha, input_scale=1 / alpha)


def softplus(name: str, beta: float, threshold: float) -> Activation:
    """``log(1 + exp(beta y)) / beta``, and ``y`` itself where ``beta y > threshold``.

    As ``F.softplus(y, beta, threshold)``: value and slope (``sigmoid(beta y)``, one
    above the threshold).
    """
    if beta == 0:
        raise ValueError("softplus: beta must be non-zero (it divides by beta)")

    def f(y: Any) -> Any:
        return _xp(y).where(beta * y > threshold, y, _log1p_exp(beta * y) / beta)

    def df(y: Any) -> Any:
        return _xp(y).where(beta * y > threshold, 1.0, _sigmoid(beta * y))

    return Activation(name, f, df, 1.0, f"log(1 + exp({beta:g} y)) / {beta:g}; y above "
                      f"{threshold:g} / {beta:g}, as PyTorch's")


def hardtanh(name: str, min_val: float, max_val: float) -> Activation:
    """``y`` clipped to ``[min_val, max_val]``; slope 1 strictly inside, 0 at and beyond the ends.

    As ``nn.Hardtanh``; ``nn.ReLU6`` is ``hardtanh(0, 6)``.
    """
    if not min_val < max_val:
        raise ValueError(f"hardtanh: min_val {min_val} must be below max_val {max_val}")

    def f(y: Any) -> Any:
        xp = _xp(y)
        return xp.minimum(xp.maximum(y, min_val), max_val)

    return Activation(name, f, lambda y: backend.astype((y > min_val) & (y < max_val),
                                                        y.dtype),
                      1.0, f"y clipped to [{min_val:g}, {max_val:g}]")


def clamp(name: str, min: float, max: float) -> Activation:  # noqa: A002 (PyTorch's names)
    """``torch.clamp(y, min, max)``, an infinite side open.

    Slope 1 from ``min`` to ``max``, both included, as PyTorch's backward
    (``hardtanh``'s excludes them).
    """
    if not min <= max:
        raise ValueError(f"clamp: min {min} must not exceed max {max}")

    def f(y: Any) -> Any:
        xp = _xp(y)
        y = y if min == -math.inf else xp.maximum(y, min)
        return y if max == math.inf else xp.minimum(y, max)

    return Activation(name, f, lambda y: backend.astype((y >= min) & (y <= max), y.dtype),
                      1.0, f"y clamped to [{min:g}, {max:g}], slope 1 at both ends")


def _mish_df(y: Any) -> Any:
    """``t + y sigmoid(y) (1 - t^2)``, ``t = tanh(softplus(y))``."""
    t = _xp(y).tanh(_log1p_exp(y))
    return t + y * _sigmoid(y) * _one_minus_square(t)


def _hardswish_df(y: Any) -> Any:
    """0 up to -3, ``y / 3 + 1/2`` strictly between, 1 from 3 on: PyTorch's at the kinks."""
    xp = _xp(y)
    return xp.where(y <= -3, 0.0, xp.where(y < 3, y / 3 + 0.5, 1.0))


# the families whose members have settings: name -> (make, PyTorch's defaults)
FAMILIES: dict[str, tuple[Callable[..., Activation], dict[str, float]]] = {
    "leaky_relu": (leaky_relu, {"negative_slope": 0.01}),
    "elu": (elu, {"alpha": 1.0}),
    "celu": (_celu, {"alpha": 1.0}),
    "softplus": (softplus, {"beta": 1.0, "threshold": SOFTPLUS_THRESHOLD}),
    "hardtanh": (hardtanh, {"min_val": -1.0, "max_val": 1.0}),
    "clamp": (clamp, {"min": -math.inf, "max": math.inf}),
}
_MEMBERS: dict[tuple, Activation] = {}  # (family, settings) -> its member, made once

for _activation in (
    Activation("identity", lambda y: y, lambda y: _xp(y).ones_like(y), 1.0, "f(y) = y"),
    Activation(
        "relu",
        lambda y: _xp(y).maximum(y, 0),
        lambda y: backend.astype(y > 0, y.dtype),
        math.sqrt(2),
        "max(y, 0); f'(0) = 0 as in PyTorch",
    ),
    Activation("tanh", lambda y: _xp(y).tanh(y), lambda y: _one_minus_square(_xp(y).tanh(y)),
               1.0, "tanh(y)", df_of_output=lambda z: _one_minus_square(z), elementwise="tanh"),
    Activation("sigmoid", _sigmoid, lambda y: _sigmoid(y) * _sigmoid(-y), 1.0,
               "1 / (1 + exp(-y))"),
    Activation("gelu", _gelu, _gelu_df, 1.0,
               "GELU, tanh approximation (PyTorch approximate='tanh')"),
    Activation("gelu_erf", _gelu_erf, _gelu_erf_df, 1.0,
               "GELU, exact: y Phi(y) (PyTorch's default nn.GELU())"),
    Activation("silu", lambda y: y * _sigmoid(y), _silu_df, 1.0, "y sigmoid(y) (SiLU, swish)"),
    Activation("exp", lambda y: _xp(y).exp(y), lambda y: _xp(y).exp(y), 1.0,
               "exp(y) (a softmax's last step)", df_of_output=lambda z: z * 1,
               elementwise="exp"),
    *(make(name, **defaults) for name, (make, defaults) in FAMILIES.items()),
    elu("selu", _SELU_ALPHA, _SELU_SCALE),
    hardtanh("relu6", 0.0, 6.0),
    Activation("mish", lambda y: y * _xp(y).tanh(_log1p_exp(y)), _mish_df, 1.0,
               "y tanh(softplus(y))"),
    Activation("softsign", lambda y: y / (1 + abs(y)), lambda y: 1 / (1 + abs(y)) ** 2, 1.0,
               "y / (1 + |y|)"),
    Activation("hardsigmoid", lambda y: _xp(y).minimum(_xp(y).maximum(y / 6 + 0.5, 0.0), 1.0),
               lambda y: backend.astype((y > -3) & (y < 3), y.dtype) / 6, 1.0,
               "relu6(y + 3) / 6; slope 1/6 strictly inside (-3, 3) (PyTorch's backward "
               "takes float32's 1/6, 3e-8 from it, in float64 too)"),
    Activation("hardswish", lambda y: y * _xp(y).minimum(_xp(y).maximum(y + 3, 0.0), 6.0) / 6,
               _hardswish_df, 1.0, "y relu6(y + 3) / 6"),
    Activation("tanhshrink", lambda y: y - _xp(y).tanh(y),
               lambda y: _xp(y).tanh(y) ** 2, 1.0, "y - tanh(y)"),
    Activation("logsigmoid", lambda y: -_log1p_exp(-y), lambda y: _sigmoid(-y), 1.0,
               "log(sigmoid(y)) = -softplus(-y)"),
    Activation("sin", lambda y: _xp(y).sin(y), lambda y: _xp(y).cos(y), 1.0,
               "sin(y) (SIREN's)", elementwise="sin"),
    Activation("cos", lambda y: _xp(y).cos(y), lambda y: -_xp(y).sin(y), 1.0, "cos(y)",
               elementwise="cos"),
    Activation("abs", lambda y: abs(y), lambda y: _xp(y).sign(y), 1.0,
               "|y|; slope 0 at 0, as PyTorch's", elementwise="abs"),
    Activation("erf", backend.erf, lambda y: _TWO_OVER_SQRT_PI * _xp(y).exp(-y * y), 1.0,
               "erf(y) (a GELU written by hand: 0.5 y (1 + erf(y / sqrt 2)))"),
):
    register_activation(_activation)

# Functions defined on part of the line (log for y > 0, log1p for y > -1): no activations
# of a network (FNN.random, the CLI's --activation take every registered one), but nodes
# a traced model computes (propop.from_torch); out of the domain the graph's forward
# names the node
PARTIAL = {f.name: f for f in (
    Activation("log", lambda y: _xp(y).log(y), lambda y: 1 / y, 1.0, "log(y), y > 0",
               elementwise="log", domain=0.0),
    Activation("log1p", lambda y: _xp(y).log1p(y), lambda y: 1 / (1 + y), 1.0,
               "log(1 + y), y > -1", elementwise="log1p", domain=-1.0))}
