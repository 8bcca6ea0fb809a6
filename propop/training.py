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

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from . import backend
from ._checks import real_array, real_number, require_finite
from .losses import loss_value
from .networks.fnn import FNN
from .networks.graph import Graph
from .networks.rnn import RNN
from .progress import bar
from .newton.loop import forward as propagate
from .propagation import backprop
from .solvers.plan import check_keywords
from .solvers.solution import ConvergenceError, Status

__all__ = ["train", "History", "OPTIMIZERS", "parameters"]

OPTIMIZERS = ("sgd", "momentum", "adam")


@dataclass
class History:
    """What :func:`train` saw: one entry per epoch and one per step."""

    epochs: list = field(default_factory=list)  # loss, accuracy, test_accuracy, seconds
    steps: list = field(default_factory=list)  # seconds, the solve's facts, errors

    def __repr__(self) -> str:
        """One line: epochs, steps and the last epoch's numbers."""
        last = self.epochs[-1] if self.epochs else {}
        shown = ", ".join(f"{k}={v:.4g}" for k, v in last.items() if isinstance(v, float))
        return (f"History({len(self.epochs)} epochs, {len(self.steps)} steps"
                + (f"; last epoch: {shown}" if shown else "") + ")")


def parameters(model: Any) -> dict:
    """The trainable arrays of ``model`` by name (``W0``, ``U0``, ``b0`` or ``node.W``).

    A graph's tied parameters (:meth:`~propop.Graph.ties`) appear once, under
    their first node's name.
    """
    if isinstance(model, Graph):
        return {f"{node}.{name}": model.layers[node].parameters()[name]
                for (node, name), first in model.ties().items() if first == (node, name)}
    return _by_name(model, model)


def _by_name(model: Any, arrays: Any) -> dict:
    """``W0, b0, ...`` (and ``U0``) of an FNN's or RNN's ``arrays`` (the model or gradients)."""
    names = ("W", "U", "b") if isinstance(model, RNN) else ("W", "b")
    return {f"{n}{k}": v for n in names for k, v in enumerate(getattr(arrays, n))}


def _gradients(model: Any, g: Any) -> dict:
    """The gradients by :func:`parameters`' names; a tie's parts summed into its first."""
    if not isinstance(model, Graph):
        return _by_name(model, g)
    ties, out = model.ties(), {}
    for node, grads in g.parameters.items():
        for name, value in grads.items():
            key = "{}.{}".format(*ties[(node, name)])
            out[key] = value if key not in out else out[key] + value
    return out


def _rebuilt(model: Any, params: dict) -> Any:
    """``model`` with ``params`` (a new FNN or RNN; a graph's layers updated in place)."""
    if isinstance(model, Graph):  # every node of a tie gets the one new array
        for (node, name), first in model.ties().items():
            model.layers[node].set_parameter(name, params["{}.{}".format(*first)])
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
        lr, momentum, eps = (real_number(v, k) for k, v in
                             (("lr", lr), ("momentum", momentum), ("eps", eps)))
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise ValueError(f"betas must be two numbers in [0, 1), got {betas!r}")
        betas = tuple(real_number(b, "each of betas") for b in betas)
        if not 0 < lr < np.inf:
            raise ValueError(f"lr must be a finite number > 0, got {lr}")
        if not 0 <= momentum < np.inf:
            raise ValueError(f"momentum must be a finite number >= 0, got {momentum}")
        if not all(0 <= beta < 1 for beta in betas):
            raise ValueError(f"betas must be two numbers in [0, 1), got {betas}")
        if not 0 < eps < np.inf:
            raise ValueError(f"eps must be a finite number > 0, got {eps}")
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
            root = backend.namespace(v).sqrt(v / (1 - b2**self.t))
            change = (m / (1 - b1**self.t)) / (root + self.eps)
        new = values - self.lr * change
        if not sparse:
            return new
        if hasattr(p, "with_data"):  # a CSR tensor: its transpose's pattern comes along
            return p.with_data(new)
        return type(p)((new, p.indices, p.indptr), shape=p.shape)  # SciPy's, cupyx's


@dataclass(frozen=True)
class _Passes:
    """How each step propagates: the loss, the backward solver, the forward pass."""

    loss: str
    method: str
    options: dict
    forward: str | None
    forward_options: dict
    gradient_error: bool
    reduction: str
    check: bool | None


def train(model: Any, x: Any, y: Any, *, epochs: int = 1, batch_size: int = 32,
          lr: float = 0.1, optimizer: str = "sgd", momentum: float = 0.9,
          betas: tuple = (0.9, 0.999), eps: float = 1e-8, loss: str = "cross_entropy",
          method: str = "substitution", solver_options: dict | None = None,
          forward: str | None = None, forward_options: dict | None = None,
          gradient_error: bool = False, x_test: Any = None, y_test: Any = None,
          shuffle: bool = True, seed: int = 0, progress: bool | str = "auto",
          reduction: str = "mean", check: bool | None = None,
          **options: Any) -> tuple[Any, History]:
    """Train ``model`` by mini-batch gradient descent; returns ``(model, history)``.

    Every step solves the backward system (eq. back_prop_sys) of its mini-batch
    with ``method`` and updates the parameters with the gradient of the batch's
    loss: for ``optimizer="sgd"`` and cross-entropy, the paper's
    ``W_new = W - alpha / r dW-bar`` (section 1).

    Parameters
    ----------
    model : FNN, RNN or Graph
    x, y : arrays
        Inputs and targets with samples on the last axis (labels ``(n,)`` for
        ``"cross_entropy"``).
    epochs, batch_size : int
        Passes over the data, and samples per step.
    lr, optimizer, momentum, betas, eps
        ``optimizer`` is ``"sgd"``, ``"momentum"`` or ``"adam"``, with PyTorch's
        update rules (``momentum`` as ``torch.optim.SGD(momentum=...)``, ``betas``
        and ``eps`` as ``torch.optim.Adam``'s).
    loss : {"cross_entropy", "mse"}
    method, solver_options : str, dict
        The backward solver and its options, e.g. ``"jacobi", {"maxiter": 8}``:
        a truncated solve that stops at a ``maxiter`` you give gives an
        approximate gradient on purpose, as in :func:`propop.backprop`;
        breakdown or overflow raise ``ConvergenceError``.
    forward, forward_options : str or None, dict
        ``None``: the sequential reference forward pass. A solver name: Newton's
        method on the forward system (eq. forw_prop_sys), each linear step solved
        by that method, :func:`propop.forward` with ``forward_options`` (such as
        ``rtol`` or ``maxiter``).
    gradient_error : bool
        Record each step's relative gradient error against the exact gradient
        (sequential forward and backward passes).
    x_test, y_test : arrays, optional
        Evaluated after every epoch (``test_loss``, ``test_accuracy``).
    shuffle, seed : bool, int
        Deterministic shuffling of the samples each epoch: the same seed gives
        the same batches and the same result.
    progress : {"auto", True, False}
        A bar over the steps (:mod:`propop.progress`); ``"auto"`` shows it only
        in a terminal or a Jupyter kernel.
    reduction : {"mean", "sum"}
        The loss of a mini-batch: ``"mean"`` (default) as PyTorch's
        ``nn.CrossEntropyLoss()`` and ``nn.MSELoss()``, ``"sum"`` the paper's
        summed loss (:mod:`propop.losses`); the reported ``loss`` is the same.
    check : bool, optional
        As :func:`propop.backprop`'s: ``None`` raises on a failed solve unless it
        ran out of a ``maxiter`` you gave.
    **options
        More options of the backward solver, as for :func:`propop.backprop`:
        ``method="jacobi", maxiter=8`` is ``solver_options={"maxiter": 8}``.

    Returns
    -------
    model : FNN, RNN or Graph
        The trained model (a new FNN or RNN; a Graph's layers updated in place).
    history : History
        ``history.epochs[e]``: ``loss``, ``accuracy`` (labels only), ``test_*``,
        ``seconds``. ``history.steps[t]``: ``seconds``, and the backward solve's
        ``iterations``, ``levels``, ``status`` and ``solve_seconds``;
        ``forward_iterations`` (Newton forward only) and ``gradient_error``
        (when asked).

    Examples
    --------
    >>> import numpy as np, propop as pp
    >>> net = pp.FNN.random([4, 8, 3], activation="tanh", seed=0)
    >>> x, y = np.random.default_rng(0).random((4, 60)), np.arange(60) % 3
    >>> model, history = pp.train(net, x, y, epochs=2, batch_size=20, method="jacobi",
    ...                           maxiter=1, gradient_error=True)
    >>> len(history.epochs), len(history.steps), history.steps[0]["status"]
    (2, 6, 'MAX_ITER')
    """
    kind = model.backend.name
    x, y = _as_data(x, "x", kind), _as_targets(y, "y", kind)
    if (x_test is None) != (y_test is None):
        raise ValueError("x_test and y_test go together: give both or neither")
    if x_test is not None:
        x_test, y_test = (_as_data(x_test, "x_test", kind),
                          _as_targets(y_test, "y_test", kind))
    r = np.shape(x)[-1]
    if int(batch_size) != batch_size or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size}")
    if int(epochs) != epochs or epochs < 1:
        raise ValueError(f"epochs must be an integer >= 1, got {epochs}")
    _check_data(x, y, x_test, y_test)
    _check_labels(model, y, loss)
    opt = _Optimizer(optimizer, lr, momentum, betas, eps)
    check_keywords(train, method, options)
    twice = set(options) & set(solver_options or {})
    if twice:
        raise ValueError(f"solver options {sorted(twice)} given both as keywords and in "
                         "solver_options")
    passes = _Passes(loss, method, {**(solver_options or {}), **options}, forward,
                     forward_options or {}, gradient_error, reduction, check)
    rng = np.random.default_rng(seed)
    history = History()
    steps = int(np.ceil(r / batch_size))
    with bar(progress, epochs * steps, "training") as shown:
        for epoch in range(epochs):
            start = time.perf_counter()
            order = rng.permutation(r) if shuffle else np.arange(r)
            for first in range(0, r, batch_size):
                index = order[first: first + batch_size]
                with _at(epoch, len(history.steps), lr):
                    model = _step(model, _samples(x, index), _columns(y, index), passes,
                                  opt, history)
                shown.update()
            history.epochs.append(dict(_evaluate(model, x, y, loss, reduction),
                                       seconds=time.perf_counter() - start,
                                       **_test(model, x_test, y_test, loss, reduction)))
            shown.set_postfix_str(f"loss {history.epochs[-1]['loss']:.3g}")
    return model, history


@contextlib.contextmanager
def _at(epoch: int, steps: int, lr: float) -> Iterator[None]:
    """A failed step's error, said to be of this epoch and step (the weights it had)."""
    where = f"pp.train, epoch {epoch + 1}, step {steps + 1} (after {steps} updates, lr={lr:g}): "
    try:
        yield
    except ConvergenceError as error:
        raise ConvergenceError(replace(error.solution, message=where + error.solution.message)
                               ) from None
    except ValueError as error:
        raise ValueError(where + str(error)) from None


def _step(model: Any, xb: Any, yb: Any, passes: _Passes, opt: _Optimizer,
          history: History) -> Any:
    """One optimiser step on a mini-batch; appends the step's record to ``history``."""
    start = time.perf_counter()
    record: dict = {}
    trace = None
    if passes.forward is not None:
        trace = propagate(model, xb, passes.forward, **passes.forward_options)
        record["forward_iterations"] = trace.info["iterations"]
    g = backprop(model, xb, yb, passes.loss, passes.method, check=passes.check, trace=trace,
                 reduction=passes.reduction, **passes.options)
    if g.solution.status in (Status.BREAKDOWN, Status.NONFINITE):
        raise ConvergenceError(g.solution)
    grads = _gradients(model, g)
    record.update(iterations=g.solution.iterations, levels=g.solution.levels,
                  status=g.solution.status.name, solve_seconds=g.solution.time)
    if passes.gradient_error:
        exact = _gradients(model, backprop(model, xb, yb, passes.loss, "substitution",
                                           reduction=passes.reduction))
        record["gradient_error"] = _relative(grads, exact)
    model = _rebuilt(model, opt.step(parameters(model), grads))
    history.steps.append(dict(record, seconds=time.perf_counter() - start))
    return model


def _relative(a: dict, b: dict) -> float:
    host = lambda M: np.asarray(backend.to_host(backend.dense(M)))  # noqa: E731
    num = sum(float(np.linalg.norm(host(a[k]) - host(b[k]))) ** 2 for k in b)
    den = sum(float(np.linalg.norm(host(b[k]))) ** 2 for k in b)
    return float(np.sqrt(num / max(den, 1e-300)))


def _samples(a: Any, index: np.ndarray) -> Any:
    """The samples ``index`` (host integers) of ``a``, samples on its last axis."""
    if isinstance(a, np.ndarray):
        return a[..., index]
    return backend.namespace(a).take(a, backend.like(index, a), axis=a.ndim - 1)


def _columns(y: Any, index: Any) -> Any:
    return [_samples(t, index) for t in y] if isinstance(y, list) else _samples(
        y if hasattr(y, "dtype") else np.asarray(y), index)


def _output(model: Any, trace: Any) -> Any:
    return model.output_values(trace)[0] if isinstance(model, Graph) else trace.output


def _evaluate(model: Any, x: Any, y: Any, loss: str, reduction: str) -> dict:
    """The loss (as ``reduction``) and, for labels, the accuracy."""
    out = _output(model, model.forward(x))
    xp = backend.namespace(out)
    if isinstance(model, RNN):  # features on axis 1: every other axis holds samples
        value = loss_value(xp.moveaxis(out, 1, 0), xp.moveaxis(y, 1, 0)
                           if tuple(np.shape(y)) == tuple(out.shape) else y, loss, reduction)
    else:
        value = loss_value(out, y, loss, reduction)
    result = {"loss": float(value)}
    if np.ndim(y) == 1:
        labels = y if backend.of(y).name == backend.of(out).name else backend.like(
            np.asarray(y), out)
        hits = xp.argmax(out, axis=0) == labels
        result["accuracy"] = float(xp.mean(xp.astype(hits, out.dtype)))
    return result


def _test(model: Any, x: Any, y: Any, loss: str, reduction: str) -> dict:
    if x is None:
        return {}
    scores = _evaluate(model, x, y, loss, reduction)
    return {f"test_{k}": v for k, v in scores.items()}


def _as_data(x: Any, what: str, kind: str) -> Any:
    """Inputs as a real array of backend ``kind`` with samples on its last axis (one or more).

    A model's inputs live where its arrays do, as a PyTorch module's live on its
    device: ``ValueError`` naming both otherwise.
    """
    x = _where(real_array(x, what), what, kind)
    if x.ndim < 1 or x.shape[-1] == 0:
        raise ValueError(f"{what} has shape {tuple(x.shape)}: no samples on its last axis")
    return x


def _where(a: Any, what: str, kind: str) -> Any:
    """``a`` itself if it is an array of backend ``kind``, else ``ValueError`` naming both."""
    if backend.of(a).name != kind:
        raise ValueError(f"{what} is a {backend.of(a).name} array but the model's arrays are "
                         f"{kind}'s: move the data there (propop.backend.convert({what}, "
                         f"{kind!r})), or the model with .to()")
    return a


def _as_targets(y: Any, what: str, kind: str) -> Any:
    """Targets as arrays (a list of them for several outputs); integer labels stay integers.

    Labels may be host integers for a model on any backend (moved a batch at a time);
    other targets live where the model's arrays do, as :func:`_as_data`'s inputs.
    """
    if isinstance(y, list) and y and np.ndim(y[0]) >= 1 and hasattr(y[0], "shape"):
        return [_as_targets(t, f"{what}[{i}]", kind) for i, t in enumerate(y)]
    labels = np.asarray(y) if not hasattr(y, "dtype") else y
    if backend.kind(labels.dtype) in "iu":
        return labels
    return _where(real_array(y, what), what, kind)


def _check_data(x: Any, y: Any, x_test: Any, y_test: Any) -> None:
    """Finite inputs and targets, as many targets as samples (test set alike)."""
    for inputs, targets, name in ((x, y, ""), (x_test, y_test, "_test")):
        if inputs is None:
            continue
        require_finite(inputs, f"x{name}")
        for t in targets if isinstance(targets, list) else [targets]:
            require_finite(t, f"y{name}")
            if np.shape(t)[-1] != np.shape(inputs)[-1]:
                raise ValueError(f"y{name} has {np.shape(t)[-1]} samples (last axis) but "
                                 f"x{name} has {np.shape(inputs)[-1]}")


def _check_labels(model: Any, y: Any, loss: str) -> None:
    """Integer labels must index the output features."""
    if loss != "cross_entropy" or np.ndim(y) != 1:
        return
    classes = model.sizes[-1] if not isinstance(model, Graph) else model.sizes[
        model.order.index(model.outputs[0])]
    y = np.asarray(backend.to_host(y))
    if y.dtype.kind not in "iu" or y.min() < 0 or y.max() >= classes:
        raise ValueError(f"labels must be integers in [0, {classes}) for a model with "
                         f"{classes} outputs; got values in [{y.min()}, {y.max()}]")
