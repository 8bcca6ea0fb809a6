"""An unexpected exception inside a solve on one rank ends the job on every rank.

Run under ``mpiexec -n 2 python -m mpi4py tests/mpi/check_abort.py METHOD``; the
job must end (not hang) with a non-zero status and rank 1's traceback.
"""

import pathlib
import sys

from mpi4py import MPI

import propop as pp
from propop.distributed.system import DistributedSystem

sys.path.insert(0, str(pathlib.Path(__file__).parents[1]))
from cases import Case  # noqa: E402

def main(method: str) -> None:
    """Prepare, break rank 1 after the checks, then solve."""
    net, trace, eps, _ = Case((5, 6, 4, 6, 3), r=3).problem()
    plan = pp.prepare(pp.backward_system(net, trace, eps), method)
    if MPI.COMM_WORLD.Get_rank() == 1:  # rank 1 breaks after the checks, mid-solve
        def broken(self, *args, **kwargs):
            raise RuntimeError("injected fault on rank 1")

        DistributedSystem.solve_local = broken
        DistributedSystem.exchange = broken
        DistributedSystem.receive = broken
        DistributedSystem.own = broken
    plan.solve()
    print("not reached: the job should have been aborted")


if __name__ == "__main__":
    main(sys.argv[1])
