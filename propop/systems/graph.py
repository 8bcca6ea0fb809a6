"""Systems of computation graphs: eqs. forw_prop_sys_jacobian and back_prop_sys_jacobian.

One block per node in topological order and one off-diagonal block per edge
``p -> k`` (:mod:`propop.networks.graph` says what each block holds). The edge's
matrix, shared by all samples, is ``M = Jk @ Ap``: ``Jk`` the Jacobian of a linear
node ``k`` with respect to that input (the identity for a diagonal node) and ``Ap``
the selection of a diagonal node ``p`` (the identity otherwise). A diagonal node's
per-sample slope is its row scaling. The backward system reads ``M^T``.

The edges' matrices are composed on the host (a convolution's Jacobian is a
SciPy sparse matrix) and meet the graph's backend through
:func:`propop.backend.matrix_on`; slopes and right-hand sides stay where the
graph's values are.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp

from .. import backend
from .._checks import real_array, require_finite
from ..layers.base import scaled_identity, transposed
from ..networks.graph import Graph
from ..networks.trace import Trace
from .builders import backward_system, forward_system
from .triangular import TriangularSystem

__all__: list[str] = []


def _compose(left: Any, right: Any, size: int) -> Any:
    """``left @ right`` where ``None`` is the identity of ``size``; sparse stays sparse."""
    if left is None and right is None:
        return scaled_identity(size)
    if left is None or right is None:
        return left if right is None else right
    out = left @ right
    return sp.csr_array(out) if sp.issparse(left) and sp.issparse(right) else np.asarray(
        out.toarray() if sp.issparse(out) else out)


def _couplings(graph: Graph, like: Any) -> dict:
    """``{(k, p): M}`` for the forward direction, node indices, parallel edges summed.

    On the backend and device of ``like``.
    """
    index = {n: i for i, n in enumerate(graph.order)}
    out: dict[tuple[int, int], Any] = {}
    for p, i, k in graph.edges():
        layer = graph.layers[k]
        J = backend.to_host(layer.jacobians([graph.sizes[index[q]] for q in graph.inputs[k]])[i]
                            ) if layer.linear else None
        M = _compose(J, graph.selection(p), graph.block_sizes[index[p]])
        key = (index[k], index[p])
        out[key] = M if key not in out else out[key] + M
    return {key: backend.matrix_on(M, like) for key, M in out.items()}


def _names(graph: Graph, letter: str) -> list[str]:
    return [f"{letter}[{n}] (input)" if n == "input" else f"{letter}[{n}] ({graph.layers[n]!r})"
            for n in graph.order]


@backward_system.register
def _graph_backward(graph: Graph, trace: Trace, eps: Any, *, form: str = "scaled"
                    ) -> TriangularSystem:
    """Rows ``u_p - d_p * (sum_k M_kp^T u_k) = d_p * (A_p^T eps_p)`` (``d = 1`` if linear)."""
    eps = list(eps) if isinstance(eps, (list, tuple)) else [eps]
    if len(eps) != len(graph.outputs):
        raise ValueError(f"{len(graph.outputs)} outputs need {len(graph.outputs)} eps arrays, "
                         f"got {len(eps)}")
    batch = trace.x.shape[1:]
    index = {n: i for i, n in enumerate(graph.order)}
    scales = [None if graph.is_linear(n) else graph.layers[n].slope(trace.y[index[n]])
              for n in graph.order]
    xp, at = backend.namespace(trace.x), backend.device(trace.x)
    rhs = [xp.zeros((s,) + batch, dtype=trace.x.dtype, device=at) for s in graph.block_sizes]
    for name, e in zip(graph.outputs, eps):
        k = index[name]
        e = real_array(e, f"eps for output {name!r}", graph.dtype)
        require_finite(e, f"eps for output {name!r}")
        if e.shape != (graph.sizes[k],) + batch:
            raise ValueError(f"eps for output {name!r} has shape {e.shape}, expected "
                             f"{(graph.sizes[k],) + batch}")
        A = graph.selection(name)
        rhs[k] = rhs[k] + (e if scales[k] is None else scales[k] * (
            e if A is None else backend.matrix_on(A, e).T @ e))
    edges = [(p, k, transposed(M)) for (k, p), M in _couplings(graph, trace.x).items()]
    return TriangularSystem(None, scales, xp.concat(rhs), lower=False,
                            sizes=graph.block_sizes, form=form, names=_names(graph, "v"),
                            edges=sorted(edges, key=lambda e: (e[1], e[0])),
                            paper_hint=", where a slope is 0 (E = 1/f' does not exist)",
                            rhs_support=[index[name] for name in graph.outputs],
                            check_zeros=False)  # the blocks made from zeros above


@forward_system.register
def _graph_forward(graph: Graph, x: Any, around: Any = None, *, linearization: str = "secant",
                   form: str = "scaled") -> TriangularSystem:
    """Rows ``t_k - a_k * (sum_p M_kp x_p) = beta_k`` (diagonal), ``z_k - sum M x = bias``."""
    x = graph.check_input(x)
    trace = around if isinstance(around, Trace) else graph.trace_from_states(x, None)
    scales, rhs = [None], [x]
    xp = backend.namespace(x)
    for k, name in enumerate(graph.order[1:], start=1):
        layer = graph.layers[name]
        if layer.linear:
            bias = xp.zeros(graph.sizes[k], dtype=x.dtype, device=backend.device(x)) \
                if layer.bias is None else layer.bias
            rhs.append(xp.broadcast_to(bias if x.ndim == 1 else bias[:, None],
                                       (graph.sizes[k],) + tuple(x.shape[1:])))
            scales.append(None)
        else:
            a, beta = layer.linearize(trace.y[k], linearization)
            scales.append(a)
            rhs.append(beta)
    edges = [(k, p, M) for (k, p), M in _couplings(graph, x).items()]
    return TriangularSystem(None, scales, xp.concat(rhs), lower=True,
                            sizes=graph.block_sizes, form=form, names=_names(graph, "z"),
                            edges=sorted(edges, key=lambda e: (e[0], e[1])),
                            paper_hint=", where a slope is 0 so that D does not exist")
