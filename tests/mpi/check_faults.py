"""Faults injected on one rank: every rank raises, none hangs.

Run under ``mpiexec -n 2 python -m mpi4py -m pytest tests/mpi/check_faults.py``
(``tests/test_mpi.py`` launches it with a timeout). Rank 1 misbehaves; rank 1
must raise its own error and rank 0 a ``RankError`` naming rank 1, or every
rank the same ``ValueError`` where the ranks disagree. Each test ends with a
collective solve that must still work: nobody is left waiting.
"""

import numpy as np
import pytest
from mpi4py import MPI

import propop as pp
from propop.distributed import RankError
from cases import Case

RANK, SIZE = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
METHODS = ["mpi.substitution", "mpi.cyclic-reduction", "mpi.jacobi", "mpi.gmres",
           "mpi.bicgstab"]
ITERATIVE = ["mpi.jacobi", "mpi.gmres", "mpi.bicgstab"]


def problem(eps_shift=0.0, r=3):
    net, trace, eps, _ = Case((5, 6, 4, 6, 3), r=r, activation="tanh").problem()
    return net, trace, pp.backward_system(net, trace, eps + eps_shift)


def everyone_fails(call, error, match):
    """Rank 1 raises ``error`` matching ``match``; rank 0 a RankError naming rank 1."""
    if RANK == 1:
        with pytest.raises(error, match=match):
            call()
    else:
        with pytest.raises(RankError, match=f"rank 1 failed, so every rank stops: .*{match}"):
            call()
    still_works()


def still_works():
    _, _, system = problem()
    assert pp.solve(system, "mpi.substitution", check=True).info["ranks"] == SIZE


@pytest.mark.parametrize("method", METHODS)
def test_a_bad_tolerance_on_one_rank_stops_every_rank(method):
    _, _, system = problem()
    everyone_fails(lambda: pp.solve(system, method, rtol=-1 if RANK == 1 else None),
                   ValueError, "rtol must be a number in")


@pytest.mark.parametrize("method", METHODS)
def test_an_unknown_option_on_one_rank_stops_every_rank(method):
    _, _, system = problem()
    options = {"restrat": 3} if RANK == 1 else {}
    everyone_fails(lambda: pp.solve(system, method, **options), TypeError,
                   "has no option 'restrat'")


@pytest.mark.parametrize("method", ITERATIVE)
def test_an_x0_of_the_wrong_shape_on_one_rank_stops_every_rank(method):
    _, _, system = problem()
    x0 = np.zeros(5) if RANK == 1 else None
    everyone_fails(lambda: pp.solve(system, method, x0=x0), ValueError, "x0 has shape")


@pytest.mark.parametrize("method", METHODS)
def test_nan_input_on_one_rank_stops_every_rank(method):
    net, trace, _ = problem()
    x = np.array(trace.x)
    if RANK == 1:
        x[2, 1] = np.nan
    everyone_fails(lambda: pp.backprop(net, x, np.zeros((3, 3)), method=method), ValueError,
                   "x contains NaN")


@pytest.mark.parametrize("method", METHODS)
def test_different_systems_are_refused_on_every_rank(method):
    _, _, system = problem(eps_shift=1e-3 if RANK == 1 else 0.0)
    with pytest.raises(ValueError, match="rank 1's right-hand side differs from rank 0's"):
        pp.solve(system, method)
    still_works()


@pytest.mark.parametrize("method", METHODS)
def test_a_batch_of_another_shape_is_refused_on_every_rank(method):
    _, _, system = problem(r=4 if RANK == 1 else 3)
    with pytest.raises(ValueError, match="rank 1's structure differs from rank 0's"):
        pp.solve(system, method)
    still_works()


@pytest.mark.parametrize("method", ITERATIVE)
def test_different_options_are_refused_on_every_rank(method):
    _, _, system = problem()
    with pytest.raises(ValueError, match="rank 1's options differs from rank 0's"):
        pp.solve(system, method, maxiter=5 + RANK)
    still_works()


class CallbackError(Exception):
    pass


@pytest.mark.parametrize("method", ITERATIVE)
def test_a_raising_callback_on_one_rank_stops_every_rank(method):
    _, _, system = problem()
    calls = []

    def callback(x):
        calls.append(1)
        if RANK == 1:
            raise CallbackError("the callback gave up")

    everyone_fails(lambda: pp.solve(system, method, callback=callback), CallbackError,
                   "the callback gave up")
    assert len(calls) == 1  # every rank stopped at the same call


def test_data_parallel_backprop_refuses_different_batches_and_agrees_on_failures():
    from propop.distributed import backprop

    net, trace, _ = problem()
    x = np.array(trace.x) + (1e-3 if RANK == 1 else 0.0)
    with pytest.raises(ValueError, match="rank 1's x differs from rank 0's"):
        backprop(net, x, np.zeros((3, 3)))
    bad = np.array(trace.x)
    if RANK == 1:
        bad[0, pp.distributed.partition(3, SIZE)[1][0]] = np.inf  # in rank 1's own share
    everyone_fails(lambda: backprop(net, bad, np.zeros((3, 3))), ValueError,
                   "contains NaN or Inf")
    with pytest.raises(ValueError, match="splits one system over the ranks"):
        backprop(net, trace.x, np.zeros((3, 3)), method="mpi.jacobi")


def test_different_methods_on_different_ranks_are_refused_on_every_rank():
    _, _, system = problem()
    method = "mpi.jacobi" if RANK == 1 else "mpi.gmres"
    with pytest.raises(ValueError, match="rank 1's method differs from rank 0's"):
        pp.solve(system, method)
    still_works()


@pytest.mark.parametrize("method", ITERATIVE)
def test_a_callback_on_rank_0_only_logs_and_every_rank_finishes(method):
    _, _, system = problem()
    seen = []
    callback = (lambda x: seen.append(float(np.linalg.norm(x)))) if RANK == 0 else None
    sol = pp.solve(system, method, callback=callback, check=True)
    assert sol.converged
    assert (len(seen) >= 1) if RANK == 0 else not seen
    still_works()


@pytest.mark.parametrize("method", METHODS)
def test_a_plan_given_a_nan_right_hand_side_on_one_rank_stops_every_rank(method):
    _, _, system = problem()
    plan = pp.prepare(system, method)
    rhs = np.array(system.rhs)
    if RANK == 1:
        rhs[0, 0] = np.nan
    everyone_fails(lambda: plan.solve(rhs), ValueError, "rhs contains NaN")
    assert plan.solve(system.rhs).converged
