"""propop inside a PyTorch training loop (optional: torch).

``import propop.torch as ptorch``:

- ``ptorch.parallelize(module)``: any traceable module whose backward (and, if
  asked, forward) is propop's solve, its parameters and names its own
  (:mod:`.parallel`);
- drop-in ``ptorch.GRU``, ``ptorch.LSTM`` and ``ptorch.RNN``: ``torch.nn``'s
  modules whose forward is a member of the Newton family and whose backward is
  propop's solve (:mod:`.recurrent`).
"""

from __future__ import annotations

from .parallel import FORWARDS, parallelize
from .recurrent import GRU, LSTM, MODES, RNN, from_module

__all__ = ["parallelize", "FORWARDS", "GRU", "LSTM", "RNN", "MODES", "from_module"]
