"""PyTorch autograd as an independent reference for gradients."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is the reference for gradient checks")
F = torch.nn.functional

TORCH_ACTIVATIONS = {
    "identity": lambda y: y,
    "relu": torch.relu,
    "leaky_relu": lambda y: F.leaky_relu(y, 0.01),
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
    "softplus": F.softplus,
    "elu": F.elu,
    "gelu": lambda y: F.gelu(y, approximate="tanh"),
    "gelu_erf": F.gelu,
    "silu": F.silu,
    "exp": torch.exp,
    "celu": F.celu,
    "selu": F.selu,
    "hardtanh": F.hardtanh,
    "relu6": F.relu6,
    "mish": F.mish,
    "softsign": F.softsign,
    # F.hardsigmoid's backward takes 1/6 in float32 (0.16666667163, in float64 too): the
    # same function, differentiated by autograd in the tensors' own precision
    "hardsigmoid": lambda y: F.relu6(y + 3) / 6,
    "hardswish": F.hardswish,
    "tanhshrink": F.tanhshrink,
    "logsigmoid": F.logsigmoid,
    "sin": torch.sin,
    "cos": torch.cos,
    "abs": torch.abs,
    "erf": torch.erf,
    "clamp": lambda y: y * 1,  # clamp's defaults: both sides open
}


def dense(a) -> np.ndarray:
    return np.asarray(a.toarray() if hasattr(a, "toarray") else a)


def torch_gradients(net, x, target, loss="mse"):
    """``(output, dW, db, dx)`` of the summed loss by autograd, in float64."""
    W = [torch.tensor(dense(Wk), dtype=torch.float64, requires_grad=True) for Wk in net.W]
    b = [torch.tensor(np.asarray(bk), dtype=torch.float64, requires_grad=True)
         for bk in net.b]
    z0 = torch.tensor(np.asarray(x), dtype=torch.float64, requires_grad=True)
    z = z0
    for Wk, bk, act in zip(W, b, net.activations):
        z = TORCH_ACTIVATIONS[act.name](Wk @ z + (bk if z.ndim == 1 else bk[:, None]))
    t = torch.as_tensor(np.asarray(target))
    if loss == "mse":
        E = 0.5 * ((z - t.to(torch.float64)) ** 2).sum()
    else:  # softmax over features: samples become PyTorch's rows
        logits = z.T if z.ndim == 2 else z[None, :]
        if t.is_floating_point():
            t = (t.T if t.ndim == 2 else t[None, :]).to(torch.float64)
        else:
            t = t.reshape(-1)
        E = F.cross_entropy(logits, t, reduction="sum")
    E.backward()
    return (z.detach().numpy(), [Wk.grad.numpy() for Wk in W],
            [bk.grad.numpy() for bk in b], z0.grad.numpy())
