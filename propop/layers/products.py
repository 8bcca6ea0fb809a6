"""Products of two traced values, powers, reductions over features, and LayerNorm from them.

A product ``z = a * b`` of two nodes (a gate, a GLU/SwiGLU unit, a normalisation)
is not linear, and its Jacobian ``[diag(b), diag(a)]`` reads both factors. It
enters a graph as a :class:`Multiply` node on the concatenation ``y = [a; b]``:
a diagonal layer with slope ``d(y) = [b; a]`` and the shared ``A = [I I]``, so that
``dz = A diag(d) dy = b da + a db``, exact, with the per-sample part a row scaling
as every other diagonal layer's. Its input-side block holds ``[a * b; 0]`` at the
point where it is linearised, which ``A`` sums to ``z``.

:class:`Power` is ``(x + shift)^p`` elementwise (a square, ``rsqrt(v + eps)``),
:func:`reduction_over` the sum or mean over dimensions of a sample,
:func:`broadcast_to` the copy of a value over dimensions of size one, and
:func:`layer_norm_over` ``torch.nn.functional.layer_norm`` built from these:
``x - mean``, its square, the mean of that, ``rsqrt(. + eps)`` copied back, the
product, and :class:`ElementwiseAffine` (``weight * . + bias``): every step's
Jacobian exact, so the whole is LayerNorm's.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np
import scipy.sparse as sp

from .. import backend
from .base import Diagonal, _one_input, _weight
from .patterns import Patterned, diagonal
from .dense import Concat, LinearMap
from .spatial import Windows

__all__ = ["Multiply", "Power", "ElementwiseAffine", "reduction_over", "broadcast_to",
           "layer_norm_over", "moments_over", "entry_groups", "product_of", "permutation",
           "matmul_of", "einsum_of", "cumsum_over"]


class Multiply(Diagonal):
    """``z = a * b`` of the two halves of its input ``y = [a; b]`` (see the module docstring)."""

    def __repr__(self) -> str:
        return "Multiply()"

    def output_size(self, sizes: Sequence[int]) -> int:
        """Half the input's size; ``ValueError`` if the input cannot be two halves."""
        _one_input(self, sizes)
        if sizes[0] % 2:
            raise ValueError(f"{self!r} takes the concatenation of two factors of one size, "
                             f"got an input of odd size {sizes[0]}")
        return sizes[0] // 2

    def selection(self, size: int) -> Any:
        """``A = [I I]``: the two halves summed."""
        return _halves(size)

    @staticmethod
    def _factors(y: Any) -> tuple[Any, Any]:
        half = y.shape[0] // 2
        return y[:half, ...], y[half:, ...]

    def forward(self, inputs: Sequence[Any]) -> Any:
        """``a * b``."""
        a, b = self._factors(inputs[0])
        return a * b

    def slope(self, x: Any) -> Any:
        """``d(y) = [b; a]``: each factor's derivative is the other factor."""
        a, b = self._factors(x)
        return backend.namespace(x).concat([b, a])

    def linearize(self, x: Any, linearization: str) -> tuple[Any, Any]:
        """The tangent, exact at ``x``: ``a = [b; a]``, ``beta = [0; -a * b]``.

        ``A (a * y + beta) = b a' + a b' - a b``: the product's linearisation at
        ``(a, b)``, equal to ``a * b`` there (both linearisations are this one).
        """
        a, b = self._factors(x)
        xp = backend.namespace(x)
        return xp.concat([b, a]), xp.concat([xp.zeros_like(a), -a * b])


@functools.lru_cache(maxsize=64)
def _halves(size: int) -> Any:
    half = size // 2
    eye = sp.eye_array(half, format="csr")
    return sp.hstack([eye, eye], format="csr")


class Power(Diagonal):
    """``z = (x + shift)^p`` elementwise: a square (``p = 2``), ``rsqrt(x + eps)`` (``-0.5``).

    Where ``x + shift <= 0`` a power that is not an integer has no real value: NaN
    there, as PyTorch gives, which :meth:`~propop.Graph.forward` names by its node
    and a Newton iterate that strays there reports as non-finite.
    """

    def __init__(self, p: float, shift: float = 0.0) -> None:
        self.p, self.shift = float(p), float(shift)

    def __repr__(self) -> str:
        return f"Power({self.p:g}" + (f", shift={self.shift:g})" if self.shift else ")")

    def output_size(self, sizes: Sequence[int]) -> int:
        """The input's size."""
        _one_input(self, sizes)
        return sizes[0]

    def _power(self, x: Any, p: float) -> Any:
        with backend.quiet(backend.namespace(x)):
            return (x + self.shift) ** p

    def forward(self, inputs: Sequence[Any]) -> Any:
        """``(x + shift)^p``."""
        return self._power(inputs[0], self.p)

    def slope(self, x: Any) -> Any:
        """``p (x + shift)^(p - 1)``."""
        return self.p * self._power(x, self.p - 1)

    def linearize(self, x: Any, linearization: str) -> tuple[Any, Any]:
        """The tangent, exact at ``x``."""
        a = self.slope(x)
        return a, self.forward([x]) - a * x


class ElementwiseAffine(Patterned):
    """``z = weight * x + bias`` with ``weight``, ``bias`` of a sample's last dimensions.

    LayerNorm's affine part, and a traced ``x * p`` or ``x + p`` with a parameter ``p``
    (a layer scale, a learned position embedding): the parameters (``None``: not there,
    a weight of one or a bias of zero; one of them is given) repeat over the sample's
    leading dimensions (``repeats`` copies). They keep their own shape
    (``nn.LayerNorm((4, 5))``'s ``(4, 5)``: so do their gradients and the
    ``state_dict``) and act flattened in C order. With ``spread``, each entry scales
    that many consecutive entries: a channel's of a ``(C, ...)`` sample (PReLU's slopes).
    With ``rows``, the parameters are tables read at those rows (an ``nn.Embedding``
    of constant indices, ``wpe(torch.arange(T))``: ``bias[rows]`` is added, a gather),
    and their gradients are summed back into the rows read, as PyTorch's embedding
    does (between zeros for consecutive rows, by a one-hot product otherwise).
    With ``divides``, the weight divides (a traced ``x / p``, a learned temperature):
    ``1 / weight`` scales, and ``dE/dweight = -sum(grad * x) / weight^2``.
    """

    values = ("w", "b", "S")

    def __init__(self, weight: Any, bias: Any = None, repeats: int = 1,
                 spread: int = 1, rows: Sequence[int] | None = None,
                 divides: bool = False) -> None:
        self.w = None if weight is None else _parameter(weight, "ElementwiseAffine: weight")
        self.b = None if bias is None else _parameter(bias, "ElementwiseAffine: bias")
        if self.w is None and self.b is None:
            raise ValueError("ElementwiseAffine: needs a weight, a bias, or both")
        if self.w is not None and self.b is not None and \
                tuple(self.b.shape) != tuple(self.w.shape):
            raise ValueError(f"ElementwiseAffine: bias of shape {tuple(self.b.shape)} for a "
                             f"weight of shape {tuple(self.w.shape)}")
        if divides and self.w is None:
            raise ValueError("ElementwiseAffine: divides needs a weight")
        self.repeats, self.spread, self.divides = int(repeats), int(spread), bool(divides)
        self.rows = None if rows is None else _indices(rows, self._shape[0])
        # the gradient's scatter: a run of consecutive rows (positions) is placed between
        # zeros (start: its first); other rows are summed by the one-hot S (count, R), S G
        self.start = None if self.rows is None else _first_of_run(self.rows)
        self.S = None if self.rows is None or self.start is not None else \
            _one_hot(self.rows, self._shape[0], self.b if self.w is None else self.w)

    def __repr__(self) -> str:
        spread = "" if self.spread == 1 else f", spread {self.spread}"
        rows = "" if self.rows is None else f", rows of {self._shape[0]}"
        return f"ElementwiseAffine({self._entries} x {self.repeats}{spread}{rows})"

    @property
    def _shape(self) -> tuple:
        """The parameters' own shape."""
        return tuple((self.b if self.w is None else self.w).shape)

    @property
    def _read(self) -> tuple:
        """The shape of the parameters' entries read: the rows' ``(R, ...)`` with ``rows``."""
        return self._shape if self.rows is None else (self.rows.size, *self._shape[1:])

    @property
    def _entries(self) -> int:
        return int(np.prod(self._read))

    def _rows(self, a: Any) -> Any:
        """The entries of a parameter read, flat: ``a[rows]`` (a gather, ``O(R)``)."""
        if self.rows is None:
            return _flat(a)
        table = backend.namespace(a).reshape(a, (a.shape[0], -1))
        return _flat(backend.take_rows(table, backend.kept_on(self, "rows", self.rows, a)))

    def _scatter(self, g: Any) -> Any:
        """The gradient of the rows read, ``(R, ...)``, summed into the table's rows."""
        xp = backend.namespace(g)
        g = xp.reshape(g, (self.rows.size, -1))
        if self.start is None:
            return xp.matmul(self.S, g)
        before, after = (xp.zeros((n, g.shape[1]), dtype=g.dtype, device=backend.device(g))
                         for n in (self.start, self._shape[0] - self.start - self.rows.size))
        return xp.concat([before, g, after])

    def _every(self, a: Any) -> Any:
        """A parameter's value at every entry: its rows read, each spread, then repeated."""
        xp = backend.namespace(a)
        a = self._rows(a) if self.spread == 1 else xp.repeat(self._rows(a), self.spread)
        return a if self.repeats == 1 else xp.tile(a, (self.repeats,))

    @property
    def weight(self) -> Any:
        """The scale of one repeat's entries, flat (``None``: one)."""
        return None if self.w is None else self._scale(self._rows(self.w))

    def _scale(self, w: Any) -> Any:
        """The scale a weight's entries give: themselves, or their reciprocals (``divides``)."""
        return 1.0 / w if self.divides else w

    @property
    def bias(self) -> Any:
        """The offset of every entry."""
        return None if self.b is None else self._every(self.b)

    def output_size(self, sizes: Sequence[int]) -> int:
        """The input's size; ``ValueError`` if it does not fit."""
        _one_input(self, sizes, self._entries * self.spread * self.repeats)
        return sizes[0]

    def patterns(self, sizes: Sequence[int]) -> list:
        """``diag(weight)``, spread and repeated (the identity's diagonal without a weight)."""
        n = self._entries * self.spread * self.repeats
        if self.w is not None:
            return [(diagonal(n), self._scale(self._every(self.w)))]
        xp = backend.namespace(self.b)
        return [(diagonal(n), xp.ones(n, dtype=self.b.dtype, device=backend.device(self.b)))]

    def parameters(self) -> dict:
        """``weight`` and ``bias`` where given (as PyTorch's, in their own shape)."""
        return {k: v for k, v in (("weight", self.w), ("bias", self.b)) if v is not None}

    def set_parameter(self, name: str, value: Any) -> None:
        """Replace ``weight`` or ``bias`` (of the shape it has)."""
        if name not in self.parameters():
            super().set_parameter(name, value)
        value = _parameter(value, f"ElementwiseAffine: {name}")
        if tuple(value.shape) != self._shape:
            raise ValueError(f"ElementwiseAffine: {name} of shape {tuple(value.shape)}, "
                             f"expected {self._shape}")
        setattr(self, "w" if name == "weight" else "b", value)

    def gradients(self, inputs: Sequence[Any], grad: Any) -> dict:
        """``dE/dweight = sum grad * x``, ``dE/dbias = sum grad``, over samples and repeats.

        An entry's spread and the samples are consecutive in ``(N, r)`` C order, so one
        axis holds both. With ``rows``, each row read gets its sum (:meth:`_scatter`).
        """
        x = inputs[0] if inputs[0].ndim == 2 else inputs[0][:, None]
        g = grad if grad.ndim == 2 else grad[:, None]
        parts = (self.repeats, self._entries, -1)
        xp = backend.namespace(g)

        def summed(a: Any) -> Any:
            a = xp.sum(xp.reshape(a, parts), axis=(0, 2))
            return xp.reshape(a if self.rows is None else self._scatter(a), self._shape)

        out = {} if self.w is None else {"weight": -summed(g * x) / (self.w * self.w)
                                         if self.divides else summed(g * x)}
        return out | ({} if self.b is None else {"bias": summed(g)})


def _parameter(a: Any, what: str) -> Any:
    """An elementwise parameter of any shape (a scalar's ``()`` too) as :func:`_weight`."""
    return _weight(a, what, a.ndim if hasattr(a, "ndim") else np.ndim(a))


def _indices(rows: Sequence[int], count: int) -> np.ndarray:
    """``rows`` as flat host indices into a table of ``count`` rows, or ``ValueError``."""
    rows = np.asarray(rows).reshape(-1)
    if rows.size == 0 or not np.issubdtype(rows.dtype, np.integer) or \
            rows.min() < 0 or rows.max() >= count:
        raise ValueError(f"ElementwiseAffine: rows must be indices in [0, {count}), got {rows}")
    return rows.astype(np.int64)


def _first_of_run(rows: np.ndarray) -> int | None:
    """The first row where ``rows`` are consecutive (``arange(start, start + R)``), else None."""
    return int(rows[0]) if np.array_equal(rows, np.arange(rows[0], rows[0] + rows.size)) \
        else None


def _one_hot(rows: np.ndarray, count: int, like: Any) -> Any:
    """``S`` ``(count, R)`` with ``S[rows[j], j] = 1``: the rows' gradients summed, ``S G``."""
    S = np.zeros((count, rows.size))
    S[rows, np.arange(rows.size)] = 1.0
    return backend.like(S, like)


def _flat(a: Any) -> Any:
    """``a`` flat in C order (itself when it is one-dimensional)."""
    return a if a.ndim == 1 else backend.namespace(a).reshape(a, (-1,))


def _groups(shape: Sequence[int], dims: Sequence[int]) -> tuple[Any, int]:
    """Each entry's group when ``dims`` of a sample of ``shape`` are reduced; the group count."""
    index = np.indices(shape).reshape(len(shape), -1)
    kept = [d for d in range(len(shape)) if d not in dims]
    if not kept:
        return np.zeros(index.shape[1], dtype=np.int64), 1
    rest = [shape[d] for d in kept]
    return np.ravel_multi_index(tuple(index[kept]), rest), int(np.prod(rest))


def entry_groups(shape: Sequence[int], dims: Sequence[int]) -> np.ndarray:
    """Each entry's group when ``dims`` of a sample of ``shape`` are reduced (C order)."""
    return _groups(tuple(int(n) for n in shape), dims)[0]


def _group_sums(shape: Sequence[int], dims: Sequence[int]) -> Any:
    """The ``(groups, entries)`` matrix summing ``dims`` of a sample of ``shape``."""
    groups, count = _groups(shape, dims)
    return sp.csr_array((np.ones(groups.size), (groups, np.arange(groups.size))),
                        shape=(count, groups.size))


def reduction_over(shape: Sequence[int], dims: Sequence[int], mean: bool) -> LinearMap:
    """``x.sum(dims)`` (``mean``: ``x.mean(dims)``) of a sample of ``shape``, a linear map."""
    S = _group_sums(shape, dims)
    size = int(np.prod([shape[d] for d in dims])) if dims else 1
    return LinearMap([S / size if mean else S], name="Mean" if mean else "Sum")


def cumsum_over(shape: Sequence[int], dim: int) -> LinearMap:
    """``x.cumsum(dim)`` of a sample of ``shape``: each entry the sum of those before it.

    A linear map, lower triangular within each line along ``dim`` (``L (L + 1) / 2``
    ones a line of ``L`` entries).
    """
    shape = tuple(int(n) for n in shape)
    index = np.moveaxis(np.arange(int(np.prod(shape))).reshape(shape), dim, -1)
    lines = index.reshape(-1, shape[dim])  # each line's entries, in order along dim
    i, j = np.tril_indices(shape[dim])
    rows, cols = lines[:, i].reshape(-1), lines[:, j].reshape(-1)
    return LinearMap([sp.csr_array((np.ones(rows.size), (rows, cols)),
                                   shape=(index.size, index.size))], name="CumulativeSum")


def broadcast_to(shape: Sequence[int], out: Sequence[int]) -> LinearMap:
    """A sample of ``shape`` copied to ``out`` as NumPy's and PyTorch's broadcasting does."""
    shape, out = tuple(shape), tuple(out)
    padded = (1,) * (len(out) - len(shape)) + shape
    source = np.broadcast_to(np.arange(int(np.prod(shape))).reshape(padded), out).reshape(-1)
    P = sp.csr_array((np.ones(source.size), (np.arange(source.size), source)),
                     shape=(source.size, int(np.prod(shape))))
    return LinearMap([P], name="Broadcast")


def permutation(shape: Sequence[int], order: Sequence[int]) -> LinearMap:
    """A sample of ``shape`` with its axes in ``order`` (``x.permute``, ``transpose``)."""
    source = np.arange(int(np.prod(shape))).reshape(tuple(shape)).transpose(order).reshape(-1)
    P = sp.csr_array((np.ones(source.size), (np.arange(source.size), source)),
                     shape=(source.size, source.size))
    return LinearMap([P], name="Permute")


def matmul_of(a: Sequence[int], b: Sequence[int]) -> tuple[tuple, list]:
    """The nodes of ``a @ b`` for samples of shapes ``(..., n, k)`` and ``(..., k, m)``.

    ``(shape, [(suffix, layer, reads)])`` with reads ``"a"`` and ``"b"``: each factor
    copied to ``(..., n, k, m)`` (:func:`broadcast_to`, leading axes broadcast as
    PyTorch's), their elementwise product (:class:`Multiply`) and its sum over ``k``:
    every step exact, the Jacobian's per-sample part a row scaling, as a product's.
    """
    *lead_a, n, k = a
    *lead_b, _, m = b
    full = (*np.broadcast_shapes(tuple(lead_a), tuple(lead_b)), n, k, m)
    parts = [(".a", broadcast_to((*lead_a, n, k, 1), full), ["a"]),
             (".b", broadcast_to((*lead_b, 1, k, m), full), ["b"])]
    parts += product_of(".a", ".b", ".products")
    return full[:-3] + (n, m), parts + [("", reduction_over(full, [len(full) - 2], False),
                                         [".products"])]


def einsum_of(inputs: Sequence[str], output: str, shapes: Sequence[Sequence[int]]
              ) -> tuple[tuple, list]:
    """The nodes of ``torch.einsum`` of one or two samples, subscripts without the batch's.

    ``(shape, [(suffix, layer, reads)])`` with reads ``"0"`` and ``"1"``: each operand
    copied to the joint index space of every letter (:class:`~propop.layers.Windows`;
    a letter repeated in one operand reads its diagonal), their elementwise product
    (:class:`Multiply`, two operands), and one linear map summing the letters the
    output lacks and ordering the rest as it lists them: every step exact, as
    :func:`matmul_of`'s.
    """
    size = {}
    for letters, shape in zip(inputs, shapes):
        if len(letters) != len(shape):
            raise ValueError(f"einsum: subscripts {letters!r} for a sample of shape "
                             f"{tuple(shape)}")
        for letter, n in zip(letters, shape):
            if size.setdefault(letter, int(n)) != int(n):
                raise ValueError(f"einsum: {letter!r} is {size[letter]} and {n} long")
    if set(output) - set(size) or len(set(output)) != len(output):
        raise ValueError(f"einsum: output subscripts {output!r} for inputs {list(inputs)}")
    joint = "".join(size)  # every letter, in order of appearance
    coords = np.indices([size[c] for c in joint]).reshape(len(joint), -1)

    def flat(letters: str, shape: Sequence[int]) -> np.ndarray:
        return np.ravel_multi_index(tuple(coords[joint.index(c)] for c in letters),
                                    tuple(shape)) if letters else np.zeros(coords.shape[1],
                                                                           dtype=np.int64)

    out_shape = tuple(size[c] for c in output)
    parts = [(f".{i}", Windows(flat(s, shape), int(np.prod(shape))), [str(i)])
             for i, (s, shape) in enumerate(zip(inputs, shapes))]
    if len(inputs) == 2:
        parts += product_of(".0", ".1", ".products")
    rows, total = flat(output, out_shape), coords.shape[1]
    sums = sp.csr_array((np.ones(total), (rows, np.arange(total))),
                        shape=(int(np.prod(out_shape)), total))
    return out_shape, parts + [("", LinearMap([sums], name="Contract"),
                                [".products" if len(inputs) == 2 else ".0"])]


def product_of(first: str | None, second: str | None, suffix: str = ""
               ) -> list[tuple[str, Any, list]]:
    """The nodes of ``first * second`` (two values of one size), for a graph builder.

    ``[(suffix, layer, reads)]`` as :func:`~propop.layers.softmax_over`'s: the
    concatenation ``suffix + ".factors"`` and the :class:`Multiply` (``suffix``).
    """
    return [(suffix + ".factors", Concat(), [first, second]),
            (suffix, Multiply(), [suffix + ".factors"])]


def _squares(shape: tuple, reduced: Sequence[int], centred: bool) -> tuple[list, Any, int]:
    """``.centred`` (``x`` less its mean over ``reduced``) if ``centred``, then ``.square``.

    Returns ``(layers, S, n)``: :func:`_group_sums`'s ``S`` and the entries per group.
    """
    S = _group_sums(shape, reduced)
    n = S.shape[1] // S.shape[0]
    centre = LinearMap([sp.eye_array(S.shape[1], format="csr") - (S.T @ S) / n],
                       name="Centre")
    layers = [(".centred", centre, [None])] if centred else []
    return layers + [(".square", Power(2.0), [".centred" if centred else None])], S, n


def moments_over(shape: Sequence[int], dims: Sequence[int], statistic: str,
                 correction: float = 1.0) -> list[tuple[str, Any, list]]:
    """The layers of ``x.var(dims)``, ``x.std(dims)`` or ``x.norm(dim=dims)`` of a sample.

    ``[(suffix, layer, reads)]``: the squares of the centred entries (``var``, ``std``;
    :func:`_squares`) or of the entries (``norm``, the 2-norm), summed over each group
    and divided by ``n - correction`` (Bessel's correction, PyTorch's default 1), and
    for ``std`` and ``norm`` the square root (suffix ``""`` the statistic).
    """
    if statistic not in ("var", "std", "norm"):
        raise ValueError(f"statistic must be one of ('var', 'std', 'norm'), got {statistic!r}")
    layers, S, n = _squares(tuple(int(k) for k in shape), dims, statistic != "norm")
    divisor = 1.0 if statistic == "norm" else n - correction
    if divisor <= 0:
        raise ValueError(f"{statistic} of {n} entries with correction={correction}: no "
                         "entries left to divide by")
    last = "" if statistic == "var" else ".sum"
    layers.append((last, LinearMap([S / divisor], name="Variance" if statistic != "norm"
                                   else "Sum"), [".square"]))
    return layers + ([] if statistic == "var" else [("", Power(0.5), [".sum"])])


def layer_norm_over(shape: Sequence[int], dims: int, eps: float, weight: Any = None,
                    bias: Any = None, centred: bool = True) -> list[tuple[str, Any, list]]:
    """The layers of ``F.layer_norm`` over the last ``dims`` dimensions of a sample's ``shape``.

    ``[(suffix, layer, reads)]`` (``None`` reads the input): ``.centred`` (``x -
    mean``), ``.square``, ``.variance`` (their mean), ``.scale`` (``rsqrt(var +
    eps)``), ``.spread`` (copied back over the normalised entries), the product
    (``.normalised``, with its ``.factors``) and, with ``weight`` or ``bias``, the affine
    ``weight * . + bias`` (suffix ``""``; without, the product is suffix ``""``).
    ``centred=False`` is ``F.rms_norm``: no centring, ``x rsqrt(mean(x^2) + eps)``.
    """
    shape = tuple(int(n) for n in shape)
    layers, S, n = _squares(shape, list(range(len(shape) - dims, len(shape))), centred)
    affine = weight is not None or bias is not None
    last = ".normalised" if affine else ""
    x = ".centred" if centred else None
    layers += [(".variance", LinearMap([S / n], name="Mean"), [".square"]),
               (".scale", Power(-0.5, eps), [".variance"]),
               (".spread", LinearMap([S.T.tocsr()], name="Broadcast"), [".scale"])]
    layers += product_of(x, ".spread", last)
    if affine:
        layers.append(("", ElementwiseAffine(weight, bias, S.shape[0]), [last]))
    return layers
