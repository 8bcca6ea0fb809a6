"""PyTorch interoperation (optional: torch): modules in by ``torch.fx``, weights back out.

:func:`from_torch` and :func:`state_dict` import PyTorch when called
(:mod:`propop.interop.torch_import`, :mod:`propop.interop.torch_trace`).
"""

from __future__ import annotations

from typing import Any

__all__ = ["from_torch", "state_dict"]


def _torch_import() -> Any:
    """:mod:`.torch_import`, or an ``ImportError`` that names the extra to install."""
    try:
        from . import torch_import
    except ModuleNotFoundError as error:
        if error.name != "torch":
            raise
        raise ImportError('importing PyTorch models needs PyTorch: pip install "propop[torch]" '
                          "(on a machine without a GPU: pip install torch==2.13.0 first)"
                          ) from None
    return torch_import


def from_torch(module: Any, input_shape: Any = None) -> Any:
    """A propop network with a PyTorch module's weights (:func:`.torch_import.from_torch`)."""
    return _torch_import().from_torch(module, input_shape)


def state_dict(network: Any) -> Any:
    """A network's parameters under PyTorch's names (:func:`.torch_import.state_dict`).

    ``module.load_state_dict(pp.state_dict(net), strict=False)`` writes them back
    into the module ``net`` came from.
    """
    return _torch_import().state_dict(network)
