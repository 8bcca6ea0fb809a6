"""The Newton family of forward passes: Newton on the whole network, DEER and its kin.

:func:`forward` (:mod:`.forward`) and the damped (Levenberg-Marquardt) step of
:mod:`.damped`.
"""

from .loop import forward

__all__ = ["forward"]
