"""Networks and systems the tests share, as a table (SciPy's ``Case`` habit).

Ids read like ``fnn-tanh-sparse-r3-float64``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import propop as pp

# Shadow residual r0 (the library's BiCG family): breakdown on systems whose right-hand side
# lives in one block, as backward systems' does (docs/index.md, "Solving"); they must say so.
BREAK_DOWN = frozenset({"scipy.bicgstab", "scipy.cgs", "scipy.tfqmr", "scipy.qmr", "scipy.bicg",
                        "pyamg.bicgstab"})
# The normal equations (LSQR, LSMR: the condition number squared) may reach maxiter, and must
# say so.
SLOW = frozenset({"scipy.lsqr", "scipy.lsmr"})


def excused(method: str, solution: pp.Solution) -> bool:
    """Whether ``solution`` failed as ``method`` may fail here: said, with its status."""
    allowed = (pp.Status.BREAKDOWN, pp.Status.MAX_ITER) if method in BREAK_DOWN else \
        (pp.Status.MAX_ITER,) if method in SLOW else ()
    return not solution.converged and solution.status in allowed and bool(solution.message)


ACTIVATIONS = ("identity", "relu", "leaky_relu", "tanh", "sigmoid", "softplus", "elu", "gelu",
               "gelu_erf", "silu")  # hidden-layer activations; "exp" (a softmax's) overflows


@dataclass(frozen=True)
class Case:
    """An FNN with input, batch size (``None`` for one vector) and dtype."""

    sizes: tuple
    activation: str = "tanh"
    density: float = 1.0
    r: int | None = 3
    dtype: str = "float64"
    seed: int = 0

    @property
    def id(self) -> str:
        kind = "sparse" if self.density < 1 else "dense"
        batch = "vec" if self.r is None else f"r{self.r}"
        return f"fnn-{self.activation}-{kind}-l{len(self.sizes) - 1}-{batch}-{self.dtype}"

    def net(self) -> pp.FNN:
        return pp.FNN.random(self.sizes, activation=self.activation, density=self.density,
                             seed=self.seed, dtype=self.dtype, bias=0.1)

    def data(self) -> tuple[np.ndarray, np.ndarray]:
        """Input ``x`` and target ``t`` (columns are samples)."""
        rng = np.random.default_rng(self.seed + 1)
        shape = () if self.r is None else (self.r,)
        x = rng.standard_normal((self.sizes[0],) + shape).astype(self.dtype)
        t = rng.standard_normal((self.sizes[-1],) + shape).astype(self.dtype)
        return x, t

    def problem(self) -> tuple:
        """``(net, trace, eps, backward reference v)``."""
        net = self.net()
        x, t = self.data()
        trace = net.forward(x)
        eps = pp.loss_gradient(trace.output, t)
        return net, trace, eps, net.backward(trace, eps)


# l = 1, 2, odd and even; dense and sparse; batch of one vector, of 1 and of 3;
# unequal widths; both dtypes.
CASES = [
    Case((5, 4)),
    Case((5, 7, 3), activation="relu", r=None),
    Case((6, 6, 6, 6), activation="sigmoid", r=1),
    Case((4, 9, 5, 8, 3), activation="gelu", density=0.5),
    Case((8, 8, 8, 8, 8, 8, 8), activation="tanh", density=0.3, r=None),
    Case((6, 5, 7, 4), activation="elu", dtype="float32"),
    Case((7, 7, 7, 7, 7), activation="leaky_relu", density=0.4, r=2, dtype="float32"),
    Case((3, 10, 10, 2), activation="softplus", r=4),
]


def tolerance(dtype: str) -> float:
    """Relative agreement expected of exact methods."""
    return 1e-10 if dtype == "float64" else 2e-4


def relative_error(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300))


def gpu_backends() -> list:
    """``(kind, device)`` of the GPU backends, pytest params marked ``gpu``, skipped without one.

    ``python -m pytest -m gpu`` runs them on a machine with CuPy or PyTorch CUDA.
    """
    import importlib.util

    import pytest

    cupy_ok = importlib.util.find_spec("cupy") is not None and _cupy_devices() > 0
    torch_ok = importlib.util.find_spec("torch") is not None and _torch_cuda()
    return [pytest.param("cupy", None, marks=[pytest.mark.gpu, pytest.mark.skipif(
                not cupy_ok, reason="needs CuPy and a CUDA device")], id="cupy"),
            pytest.param("torch", "cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
                not torch_ok, reason="needs PyTorch with CUDA")], id="torch-cuda")]


def _cupy_devices() -> int:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount()
    except Exception:  # no driver, no device: the GPU tests skip
        return 0


def _torch_cuda() -> bool:
    import torch

    return torch.cuda.is_available()
