"""Training with pluggable backward solvers (paper section 1: ``W <- W - alpha/r dW``).

:func:`train` runs mini-batch SGD (or momentum, or Adam, with PyTorch's update
rules) on an FNN, RNN or Graph. The backward pass of every step is a
:func:`propop.backprop` with any registered method and its options: ``method=
"jacobi", solver_options={"maxiter": 8}`` trains with truncated, approximate
gradients on purpose (the paper: "we can choose whether we want to solve these
problems approximately or exactly"), and ``gradient_error=True`` measures how far
each step's gradient is from the exact one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .losses import loss_value
from .networks.fnn import FNN
from .networks.graph import Graph
from .networks.rnn import RNN
from .progress import bar
from .propagation import backprop
from .solvers.solution import ConvergenceError, Status

__all__ = ["train", "History", "OPTIMIZERS", "parameters"]

OPTIMIZERS = ("sgd", "momentum", "adam")


@dataclass
class History:
    """What :func:`train` saw: one entry per epoch and one per step."""

    epochs: list = field(default_factory=list)  # loss, accuracy, test_accuracy, seconds
    steps: list = field(default_factory=list)  # seconds, iterations, levels, status, error


def parameters(model: Any) -> dict:
    """The trainable arrays of ``model`` by name (``W0``, ``U0``, ``b0`` or ``node.W``)."""
    if isinstance(model, Graph):
        return {f"{node}.{name}": value for node, layer in model.layers.items()
                if layer.linear for name, value in layer.parameters().items()}
    return _by_name(model, model)


def _by_name(model: Any, arrays: Any) -> dict:
    """``W0, b0, ...`` (and ``U0``) of an FNN's or RNN's ``arrays`` (the model or gradients)."""
    names = ("W", "U", "b") if isinstance(model, RNN) else ("W", "b")
    return {f"{n}{k}": v for n in names for k, v in enumerate(getattr(arrays, n))}


def _gradients(model: Any, g: Any) -> dict:
    if isinstance(model, Graph):
        return {f"{node}.{name}": v for node, grads in g.parameters.items()
                for name, v in grads.items()}
    return _by_name(model, g)


def _rebuilt(model: Any, params: dict) -> Any:
    """``model`` with ``params`` (a new FNN or RNN; a graph's layers updated in place)."""
    if isinstance(model, Graph):
        for key, value in params.items():
            node, name = key.rsplit(".", 1)
            model.layers[node].set_parameter(name, value)
        return model
    depth = len(model.W)
    pick = [[params[f"{n}{k}"] for k in range(depth)] for n in ("W", "U", "b")
            if f"{n}0" in params]
    if isinstance(model, RNN):
        return RNN(*pick, activation=model.activations)
    return FNN(*pick, activation=model.activations)


class _Optimizer:
    """SGD, momentum and Adam as ``torch.optim`` defines them, on dense or sparse arrays."""

    def __init__(self, name: str, lr: float, momentum: float, betas: tuple, eps: float) -> None:
        if name not in OPTIMIZERS:
            raise ValueError(f"unknown optimizer {name!r}; choose one of {OPTIMIZERS}")
        if not lr > 0:
            raise ValueError(f"lr must be > 0, got {lr}")
        self.name, self.lr, self.momentum, self.betas, self.eps = name, lr, momentum, betas, eps
        self.state: dict = {}
        self.t = 0

    def step(self, params: dict, grads: dict) -> dict:
        """New parameters from the gradients (one optimiser step)."""
        self.t += 1
        return {k: self._update(k, p, grads[k]) for k, p in params.items()}

    def _update(self, key: str, p: Any, g: Any) -> Any:
        sparse = hasattr(p, "toarray")
        values, grad = (p.data, g.data) if sparse else (p, g)
        if self.name == "sgd":
            change = grad
        elif self.name == "momentum":
            buffer = self.state[key] = grad if key not in self.state else (
                self.momentum * self.state[key] + grad)
            change = buffer
        else:
            b1, b2 = self.betas
            m, v = self.state.get(key, (0 * grad, 0 * grad))
            m, v = b1 * m + (1 - b1) * grad, b2 * v + (1 - b2) * grad * grad
            self.state[key] = (m, v)
            change = (m / (1 - b1**self.t)) / (np.sqrt(v / (1 - b2**self.t)) + self.eps)
        new = values - self.lr * change
        if not sparse:
            return new
        out = p.copy()
        out.data = new
        return out


def train(model: Any, x: Any, y: Any, *, epochs: int = 1, batch_size: int = 32,
          lr: float = 0.1, optimizer: str = "sgd", momentum: float = 0.9,
          betas: tuple = (0.9, 0.999), eps: float = 1e-8, loss: str = "cross_entropy",
          method: str = "substitution", solver_options: dict | None = None,
          gradient_error: bool = False, x_test: Any = None, y_test: Any = None,
          shuffle: bool = True, seed: int = 0, progress: bool | str = False
          ) -> tuple[Any, History]:
    """Train ``model`` by mini-batch gradient descent; returns ``(model, history)``.

    Parameters
    ----------
    model : FNN, RNN or Graph
    x, y : arrays
        Inputs and targets with samples on the last axis (labels ``(n,)`` for
        ``"cross_entropy"``).
    batch_size : int
        Samples per step; the gradient is the batch mean (``dW / r``).
    optimizer : {"sgd", "momentum", "adam"}
        PyTorch's update rules (``momentum`` as ``torch.optim.SGD(momentum=...)``).
    method, solver_options : str, dict
        The backward solver and its options, e.g. ``"jacobi", {"maxiter": 8}``:
        a truncated solve that stops at ``maxiter`` gives an approximate
        gradient on purpose; breakdown or overflow raise ``ConvergenceError``.
    gradient_error : bool
        Record each step's relative gradient error against the exact gradient.
    x_test, y_test : arrays, optional
        Evaluated after every epoch (``test_accuracy``).
    shuffle, seed : bool, int
        Deterministic shuffling of the samples each epoch.
    progress : {False, True, "auto"}
        A bar over the steps (:mod:`propop.progress`).
    """
    r = np.shape(x)[-1]
    if int(batch_size) != batch_size or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size}")
    if int(epochs) != epochs or epochs < 1:
        raise ValueError(f"epochs must be an integer >= 1, got {epochs}")
    _check_labels(model, y, loss)
    opt = _Optimizer(optimizer, lr, momentum, betas, eps)
    rng = np.random.default_rng(seed)
    history = History()
    steps = int(np.ceil(r / batch_size))
    with bar(progress, epochs * steps, "training") as shown:
        for _ in range(epochs):
            start = time.perf_counter()
            order = rng.permutation(r) if shuffle else np.arange(r)
            for first in range(0, r, batch_size):
                index = order[first: first + batch_size]
                model = _step(model, x[..., index], _columns(y, index), loss, method,
                              solver_options or {}, opt, gradient_error, history)
                shown.update()
            history.epochs.append(dict(_evaluate(model, x, y, loss), seconds=time.perf_counter()
                                       - start, **_test(model, x_test, y_test, loss)))
    return model, history


def _step(model: Any, xb: Any, yb: Any, loss: str, method: str, options: dict, opt: _Optimizer,
          gradient_error: bool, history: History) -> Any:
    start = time.perf_counter()
    g = backprop(model, xb, yb, loss, method, check=False, **options)
    if g.solution.status in (Status.BREAKDOWN, Status.NONFINITE):
        raise ConvergenceError(g.solution)
    r = np.shape(xb)[-1]
    grads = {k: v / r for k, v in _gradients(model, g).items()}
    record = {"iterations": g.solution.iterations, "levels": g.solution.levels,
              "status": g.solution.status.name}
    if gradient_error:
        exact = _gradients(model, backprop(model, xb, yb, loss, "substitution"))
        record["gradient_error"] = _relative(grads, {k: v / r for k, v in exact.items()})
    model = _rebuilt(model, opt.step(parameters(model), grads))
    history.steps.append(dict(record, seconds=time.perf_counter() - start))
    return model


def _relative(a: dict, b: dict) -> float:
    def dense(v: Any) -> Any:
        return v.toarray() if hasattr(v, "toarray") else np.asarray(v)

    num = sum(float(np.linalg.norm(dense(a[k]) - dense(b[k]))) ** 2 for k in b)
    den = sum(float(np.linalg.norm(dense(b[k]))) ** 2 for k in b)
    return float(np.sqrt(num / max(den, 1e-300)))


def _columns(y: Any, index: Any) -> Any:
    return [t[..., index] for t in y] if isinstance(y, list) else np.asarray(y)[..., index]


def _output(model: Any, trace: Any) -> Any:
    return model.output_values(trace)[0] if isinstance(model, Graph) else trace.output


def _evaluate(model: Any, x: Any, y: Any, loss: str) -> dict:
    """Mean loss over the samples and, for labels, the accuracy."""
    out = _output(model, model.forward(x))
    r = np.shape(x)[-1]
    if isinstance(model, RNN):  # features on axis 1: one loss per step
        value = sum(loss_value(out[s], np.asarray(y)[s], loss) for s in range(out.shape[0]))
    else:
        value = loss_value(out, y, loss)
    result = {"loss": float(value) / r}
    if np.ndim(y) == 1:
        result["accuracy"] = float(np.mean(np.argmax(out, axis=0) == y))
    return result


def _test(model: Any, x: Any, y: Any, loss: str) -> dict:
    if x is None:
        return {}
    scores = _evaluate(model, x, y, loss)
    return {f"test_{k}": v for k, v in scores.items()}


def _check_labels(model: Any, y: Any, loss: str) -> None:
    """Integer labels must index the output features."""
    if loss != "cross_entropy" or np.ndim(y) != 1:
        return
    classes = model.sizes[-1] if not isinstance(model, Graph) else model.sizes[
        model.order.index(model.outputs[0])]
    y = np.asarray(y)
    if y.dtype.kind not in "iu" or y.min() < 0 or y.max() >= classes:
        raise ValueError(f"labels must be integers in [0, {classes}) for a model with "
                         f"{classes} outputs; got values in [{y.min()}, {y.max()}]")
