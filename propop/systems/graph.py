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

import collections
import weakref
from typing import Any

import numpy as np
import scipy.sparse as sp

from .. import backend
from .._checks import canonical_matrix, real_array, require_finite
from ..layers.base import scaled_identity, transposed
from ..layers.patterns import Pattern
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


# graph -> {(row, col, backend, device, dtype, transposed): (layers, M)}: the couplings
# of the edges into structural nodes, made once per graph and backend (a weak key: a
# graph's own go with it)
_KEPT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _structural(layer: Any) -> bool:
    """Whether the couplings into a node of ``layer`` are its structure alone.

    A diagonal node's (its selection) and a structural linear layer's
    (:attr:`~propop.layers.base.Linear.structural`: no values in its Jacobians).
    """
    return not layer.linear or layer.structural


def _couplings(graph: Graph, like: Any, transpose: bool = False) -> dict:
    """``{(k, p): M}`` of the forward direction (``M^T`` if ``transpose``), parallel edges summed.

    Node indices; on the backend and device of ``like``; a transposed sparse
    coupling as a canonical CSR array. The couplings into structural nodes
    (:func:`_structural`) are kept for the graph and backend while the graph
    holds the same layers; those into a node with values in its Jacobian (a
    weight) are made from its current values at every call: a layer whose Jacobian
    is a fixed pattern of its values (:meth:`~propop.layers.base.Linear.patterns`: a
    convolution, a token-wise linear map, a scaling) forms it on its values' device,
    transposed or times the predecessor's selection (the pattern of ``J A`` made
    once), with no trip through the host and no transpose made per call.
    """
    index = {n: i for i, n in enumerate(graph.order)}
    sizes, block_sizes = graph.sizes, graph.block_sizes
    kept = _KEPT.setdefault(graph, {})
    on = (backend.of(like).name, str(backend.device(like)), str(like.dtype), transpose)
    out: dict[tuple[int, int], Any] = {}
    made: dict[tuple[int, int], Any] = {}
    stamps: dict[tuple[int, int], tuple] = {}  # the layers an edge's coupling is made of
    edges = list(graph.edges())
    parallel = collections.Counter((index[k], index[p]) for p, _, k in edges)
    ready = set()  # couplings made from their layer's pattern: oriented, on its device
    for p, i, k in edges:
        key, layer = (index[k], index[p]), graph.layers[k]
        stamps[key] = stamp = (layer, graph.layers.get(p))
        hit = kept.get(key + on)
        if hit is not None and all(a is b for a, b in zip(hit[0], stamp)):
            out[key] = hit[1]
            continue
        A = graph.selection(p)
        sizes_k = [sizes[index[q]] for q in graph.inputs[k]]
        patterns = layer.patterns(sizes_k) if layer.linear and parallel[key] == 1 else None
        if patterns is not None and (A is None or sp.issparse(A)):
            pattern, values = patterns[i]
            pattern = _pattern_of(kept, key, stamp, pattern, A)
            made[key] = (pattern.T if transpose else pattern).matrix(values)
            ready.add(key)
            continue
        J = layer.jacobians(sizes_k)[i] if layer.linear else None
        if J is not None and A is not None and key not in made and not backend.is_sparse(J) \
                and backend.of(J).name != "numpy":  # a dense weight there: composed there
            made[key] = J @ backend.kept_on(graph.layers[p], "selection", A, J)
            continue
        if J is not None and (A is not None or key in made):  # composed on the host
            J = backend.to_host(J)
        M = _compose(J, A, block_sizes[index[p]])
        made[key] = M if key not in made else backend.to_host(made[key]) + M
    for key, M in made.items():
        M = _placed(M, like, transpose and key not in ready)
        if _structural(stamps[key][0]):
            kept[key + on] = (stamps[key], M)
        out[key] = M
    return out


def _pattern_of(kept: dict, key: tuple, stamp: tuple, pattern: Pattern, A: Any) -> Pattern:
    """The pattern of ``J A`` (``J``'s own without a selection ``A``), made once an edge.

    Kept with the graph's couplings while the edge's layers are the same.
    """
    if A is None:
        return pattern
    hit = kept.get(key + ("pattern",))
    if hit is None or hit[1] is not pattern or not all(a is b for a, b in zip(hit[0], stamp)):
        hit = kept[key + ("pattern",)] = (stamp, pattern, pattern.times(A))
    return hit[2]


def _placed(M: Any, like: Any, flip: bool) -> Any:
    """``M`` (``M^T`` if ``flip``) on ``like``'s backend and device; a sparse one canonical CSR.

    A matrix on the host is transposed there (SciPy's transpose, not one per call
    on the device); one already on the graph's device (a weight) stays there,
    coupled through its transposed view.
    """
    host = backend.of(M).name == "numpy"  # composed there, or a NumPy graph's own
    if flip and host:
        M = transposed(M)
    M = backend.matrix_on(M, like)
    if flip and not host:
        M = transposed(M)
    return canonical_matrix(M, "a coupling") if backend.is_sparse(M) and \
        M.format != "csr" else M  # SciPy's and CuPy's transposes are CSC


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
    xp, sizes = backend.namespace(trace.x), graph.block_sizes
    offsets = np.cumsum((0,) + sizes)
    rhs = xp.zeros((int(offsets[-1]),) + batch, dtype=trace.x.dtype,
                   device=backend.device(trace.x))  # one array; the outputs' blocks written
    for name, e in zip(graph.outputs, eps):
        k = index[name]
        e = real_array(e, f"eps for output {name!r}", graph.dtype)
        require_finite(e, f"eps for output {name!r}")
        if e.shape != (graph.sizes[k],) + batch:
            raise ValueError(f"eps for output {name!r} has shape {e.shape}, expected "
                             f"{(graph.sizes[k],) + batch}")
        A = graph.selection(name)
        block = slice(int(offsets[k]), int(offsets[k + 1]))
        rhs[block, ...] = rhs[block, ...] + (e if scales[k] is None else scales[k] * (
            e if A is None else backend.matrix_on(A, e).T @ e))
    edges = [(p, k, M) for (k, p), M in _couplings(graph, trace.x, transpose=True).items()]
    return TriangularSystem(None, scales, rhs, lower=False, sizes=sizes, form=form,
                            names=_names(graph, "v"),
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
