"""Layers with Jacobians, the pieces of a :class:`~propop.Graph` (the Jacobian form).

Every layer maps flat inputs (``(n,)`` or ``(n, r)``, features in PyTorch's C order
``(channels, height, width)``, samples as columns) to a flat output, and belongs to
one of two kinds, which decide how it enters a triangular system:

- **linear** (:class:`Linear`): ``z = sum_i J_i x_i + bias`` with Jacobians ``J_i``
  shared by all samples: :class:`Dense`, :class:`TokenDense`, :class:`Conv1d`, :class:`Conv2d`,
  :class:`AvgPool2d`, :class:`Add`, :class:`Concat`, :class:`LinearMap`,
  :class:`BatchNorm` (evaluation mode), :class:`Windows`. Their blocks hold the
  gradient with respect to their output, and they give parameter gradients.
- **diagonal** (:class:`Diagonal`): ``z = A (d(x) * x)`` near ``x``, a shared matrix
  ``A`` after a per-sample diagonal: :class:`Activation` (``A = I``,
  ``d = f'``), :class:`WindowMaximum` and :class:`MaxPool2d` (``A`` sums each
  window, ``d`` marks its maximum) and :class:`LogSumExp` (``A`` sums each group,
  ``d`` is the softmax). Their blocks hold the input-side quantity, so the per-sample part is
  the row scaling of the paper's scaled form and no per-sample matrix is ever built.
  :class:`Multiply` (``A`` sums the two halves of ``[a; b]``, ``d = [b; a]``) and
  :class:`Power` are diagonal too: products of two values (gates, LayerNorm,
  :func:`layer_norm_over`) enter with exact Jacobians and no per-sample matrix.

:meth:`Layer.jacobian` returns the full Jacobian for one sample (a ``scipy.sparse``
array) for checks and experiments. Convolutions and pooling build their sparse
Jacobians once, from index arrays.
"""

from .base import Diagonal, Layer, Linear
from .dense import (Activation, Add, BatchNorm, Concat, Dense, LinearMap, LogSumExp,
                    TokenDense, softmax_over)
from .products import (ElementwiseAffine, Multiply, Power, broadcast_to, cumsum_over,
                       einsum_of, entry_groups, layer_norm_over, matmul_of, moments_over,
                       permutation, product_of, reduction_over)
from .spatial import AvgPool2d, Conv1d, Conv2d, MaxPool2d, WindowMaximum, Windows, max_pool

__all__ = ["Layer", "Linear", "Diagonal", "Dense", "Conv1d", "Conv2d", "AvgPool2d",
           "MaxPool2d", "WindowMaximum", "Windows", "max_pool", "Add", "Concat", "LinearMap",
           "BatchNorm", "LogSumExp", "softmax_over", "Activation", "Multiply", "Power",
           "ElementwiseAffine", "reduction_over", "broadcast_to", "layer_norm_over",
           "product_of", "TokenDense", "permutation", "matmul_of", "moments_over",
           "entry_groups", "einsum_of", "cumsum_over"]
