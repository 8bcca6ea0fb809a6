"""The demo's opening tables: sizes where each method wins, and a line on why the others lose.

``propop demo`` runs a few methods on four networks chosen so that each kind of
method has its ground: a deep narrow FNN (depth dominates: cyclic reduction), a
shallow wide one (width dominates: substitution), an RNN (time dominates) and a
residual graph. Each table is followed by a sentence that reads it with the
measured numbers: the method's levels against substitution's steps, the work
per level, the iterations. ``propop demo --full`` runs every registered method
on the four networks of :data:`FULL`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from .experiments import Row

__all__ = ["Table", "QUICK", "FULL"]

BASE = dict(layers=6, width=256, batch=32, activation="tanh", density=1.0, methods=None,
            dtype="float64", seed=0, repeats=5, network="fnn", tau=100, progress="auto")


@dataclass(frozen=True)
class Table:
    """One of the demo's tables: the experiment's settings and the sentence that reads it.

    ``why`` takes the rows by method name and returns the sentence ("" for none).
    """

    title: str
    settings: dict
    why: Callable[[Mapping[str, Row]], str] = lambda rows: ""


def _times(rows: Mapping[str, Row], name: str) -> str:
    """``name``'s time as a multiple of substitution's, as the tables print it."""
    return f"{rows[name].seconds / rows['substitution'].seconds:.2f}x"


def _outcome(rows: Mapping[str, Row], name: str) -> str:
    """``beats`` or ``loses to`` substitution, as measured here."""
    return "beats" if rows[name].seconds < rows["substitution"].seconds else "loses to"


def _depth(rows: Mapping[str, Row]) -> str:
    cr, sub = rows["cyclic-reduction"], rows["substitution"]
    return (f"Why: cyclic reduction takes {cr.levels} levels where substitution takes "
            f"{sub.levels} sequential steps, and each level is one batched product of all "
            f"its 8x8 blocks: it {_outcome(rows, 'cyclic-reduction')} substitution "
            f"({_times(rows, 'cyclic-reduction')}). Parallel cyclic reduction multiplies "
            f"every block at every level, l log l work against l "
            f"({_times(rows, 'parallel-cyclic-reduction')}); scipy.spsolve_triangular runs "
            f"its {rows['scipy.spsolve_triangular'].levels} rows in compiled code, cheap "
            f"while blocks are this small ({_times(rows, 'scipy.spsolve_triangular')}).")


def _width(rows: Mapping[str, Row]) -> str:
    sub, jacobi = rows["substitution"], rows["jacobi"]
    return (f"Why: with {sub.levels} levels there is little depth to save. Cyclic "
            f"reduction multiplies Jacobian blocks, a 128x128 product per sample per level "
            f"(n^3 r work), where substitution applies them to vectors (n^2 r): "
            f"{_times(rows, 'cyclic-reduction')}, parallel cyclic reduction "
            f"{_times(rows, 'parallel-cyclic-reduction')}. The iterative methods need one "
            f"iteration per layer ({jacobi.iterations}), each a whole operator application "
            f"and more: jacobi {_times(rows, 'jacobi')}, batched-gmres "
            f"{_times(rows, 'batched-gmres')}; SciPy's and PyAMG's solve the 32 samples one "
            f"at a time ({_times(rows, 'scipy.gmres')}, {_times(rows, 'pyamg.gmres')}); "
            f"scipy.spsolve_triangular walks {rows['scipy.spsolve_triangular'].levels} rows "
            f"one by one ({_times(rows, 'scipy.spsolve_triangular')}).")


def _time(rows: Mapping[str, Row]) -> str:
    cr, sub, jacobi = rows["cyclic-reduction"], rows["substitution"], rows["jacobi"]
    return (f"Why: cyclic reduction over time takes {cr.levels} levels for {sub.levels} "
            f"blocks, but on 2 x 16 x 16 blocks per sample the products it forms cost more "
            f"than the steps they save on this CPU ({_times(rows, 'cyclic-reduction')}); "
            f"the iterative methods carry information one step per iteration, "
            f"{jacobi.iterations} iterations for jacobi ({_times(rows, 'jacobi')}), and "
            f"the hybrid (Jacobi over layers, reduction over time) "
            f"{rows['hybrid'].iterations} ({_times(rows, 'hybrid')}).")


def _graph(rows: Mapping[str, Row]) -> str:
    return (f"Why: level-scheduled solves the nodes of each level of the graph together, "
            f"substitution one node at a time; a residual MLP's "
            f"{rows['level-scheduled'].levels} levels hold one node each, so they do the "
            f"same work ({_times(rows, 'level-scheduled')}); jacobi takes one sweep per "
            f"level ({rows['jacobi'].iterations}, {_times(rows, 'jacobi')}).")


QUICK = (
    Table("Where depth dominates: an FNN of 1024 layers of width 8, batch 1",
          dict(BASE, layers=1024, width=8, batch=1, repeats=3, methods=[
              "substitution", "level-scheduled", "cyclic-reduction",
              "parallel-cyclic-reduction", "scipy.spsolve_triangular", "auto"]), _depth),
    Table("Where width dominates: an FNN of 6 layers of width 128, batch 32",
          dict(BASE, width=128, repeats=3, methods=[
              "substitution", "cyclic-reduction", "parallel-cyclic-reduction",
              "scipy.spsolve_triangular", "jacobi", "batched-gmres", "scipy.gmres",
              "pyamg.gmres", "auto"]), _width),
    Table("An RNN: 2 layers of width 16, batch 8, 50 time steps",
          dict(BASE, network="rnn", layers=2, width=16, batch=8, tau=50, repeats=3,
               methods=["substitution", "cyclic-reduction", "hybrid", "jacobi", "bicgstab",
                        "scipy.gmres", "auto"]), _time),
    Table("A computation graph: a residual MLP of 4 blocks of width 64, batch 32",
          dict(BASE, network="graph", layers=4, width=64, repeats=3,
               methods=["substitution", "level-scheduled", "jacobi", "batched-gmres",
                        "auto"]), _graph),
)

FULL = (
    Table("Every method on an FNN of 6 layers of width 256, batch 32", BASE),
    Table("Every method on an RNN: 2 layers of width 16, batch 8, 50 time steps",
          dict(BASE, network="rnn", layers=2, width=16, batch=8, tau=50)),
    Table("Every method on a linear FNN of width 64, whose samples share one matrix",
          dict(BASE, activation="identity", width=64)),
    Table("Every method on a residual MLP graph of 4 blocks of width 64",
          dict(BASE, network="graph", layers=4, width=64)),
)
