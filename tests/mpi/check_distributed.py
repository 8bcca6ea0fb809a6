"""Run under ``mpiexec -n P python -m mpi4py -m pytest tests/mpi/check_distributed.py``.

Every rank builds the same systems; the distributed solves must equal the
single-process substitution to 1e-12. ``tests/test_mpi.py`` launches this file.
"""

import math

import numpy as np
import pytest
from mpi4py import MPI

import propop as pp
from cases import Case, relative_error

SIZE = MPI.COMM_WORLD.Get_size()
EXACTISH = {"mpi.substitution", "mpi.cyclic-reduction", "mpi.jacobi"}  # exact in nblocks steps
TOLERANCE = {"mpi.substitution": 1e-12, "mpi.cyclic-reduction": 1e-12, "mpi.jacobi": 1e-12,
             "mpi.gmres": 1e-10, "mpi.bicgstab": 1e-9}
METHODS = ["mpi.substitution", "mpi.cyclic-reduction", "mpi.jacobi", "mpi.gmres",
           "mpi.bicgstab"]


def fnn_system(depth=9, r=3, lower=False):
    net, trace, eps, _ = Case((5,) + (6, 4) * (depth // 2) + (3,) * (depth % 2), r=r,
                              activation="tanh").problem()
    if lower:
        return pp.forward_system(net, trace.x, around=trace)
    return pp.backward_system(net, trace, eps)


def rnn_system(tau=12, r=2):
    rnn = pp.RNN.random([3, 4, 4], activation="tanh", seed=0)
    trace = rnn.forward(np.random.default_rng(1).standard_normal((tau, 3, r)))
    return pp.backward_system(rnn, trace, np.ones_like(trace.output))


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("r", [None, 3])
@pytest.mark.parametrize("lower", [False, True])
def test_fnn_systems_equal_the_single_process_solve(method, r, lower):
    system = fnn_system(r=r, lower=lower)  # 10 blocks: uneven over 4 ranks
    sol = pp.solve(system, method, rtol=1e-14 if method in EXACTISH else 1e-12, check=True)
    assert relative_error(sol.x, pp.solve(system, "substitution").x) < TOLERANCE[method]
    assert sol.info["ranks"] == SIZE
    if method == "mpi.cyclic-reduction":
        assert sol.info["rank_levels"] == (math.ceil(math.log2(SIZE)) if SIZE > 1 else 0)


@pytest.mark.parametrize("method", METHODS)
def test_rnn_systems_split_over_time(method):
    system = rnn_system()
    sol = pp.solve(system, method, rtol=1e-14 if method in EXACTISH else 1e-12, check=True)
    assert relative_error(sol.x, pp.solve(system, "substitution").x) < TOLERANCE[method]


def test_more_ranks_than_blocks_is_a_clear_error():
    tiny = fnn_system(depth=1, r=None)  # 2 blocks
    if SIZE > 2:
        with pytest.raises(ValueError, match=f"{SIZE} ranks for 2 blocks"):
            pp.solve(tiny, "mpi.substitution")
    else:
        assert pp.solve(tiny, "mpi.substitution").converged


@pytest.mark.parametrize("model", ["fnn", "rnn", "graph"])
def test_data_parallel_gradients_equal_the_whole_batch(model):
    from propop.distributed import backprop

    rng = np.random.default_rng(3)
    if model == "fnn":
        net = pp.FNN.random([4, 6, 3], activation="tanh", seed=0, density=0.6)
        x, t = rng.standard_normal((4, 7)), rng.standard_normal((3, 7))
    elif model == "rnn":
        net = pp.RNN.random([3, 4], activation="tanh", seed=0)
        x, t = rng.standard_normal((5, 3, 7)), rng.standard_normal((5, 4, 7))
    else:
        net = pp.Graph.residual_mlp(4, 2, seed=0)
        x, t = rng.standard_normal((4, 7)), rng.standard_normal((4, 7))
    whole = pp.backprop(net, x, t)
    split = backprop(net, x, t, method="substitution")
    assert relative_error(split.x, whole.x) < 1e-12
    for name in ("W", "U", "b"):
        for a, b in zip(getattr(split, name, ()), getattr(whole, name, ())):
            a = a.toarray() if hasattr(a, "toarray") else a
            b = b.toarray() if hasattr(b, "toarray") else b
            assert relative_error(a, b) < 1e-12
    for node, grads in getattr(whole, "parameters", {}).items():
        for key, value in grads.items():
            assert relative_error(split.parameters[node][key], value) < 1e-12


def test_a_system_scattered_from_rank_0_holds_the_same_rows():
    from propop.distributed import DistributedSystem

    system = fnn_system(r=2)
    here = DistributedSystem(system)
    sent = DistributedSystem.scatter(system if MPI.COMM_WORLD.Get_rank() == 0 else None)
    assert sent.blocks == here.blocks and sent.imports == here.imports
    imported = {k: np.ones((system.sizes[k], 2)) for k in sent.imports}
    rhs = sent.own(system.scaled().rhs) + sent.external_rhs(imported, 2)
    np.testing.assert_array_equal(sent.solve_local(rhs), here.solve_local(rhs))
