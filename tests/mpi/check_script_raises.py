"""A script that raises on one rank, outside propop, while the others enter a solve.

Run as ``mpiexec -n 2 python -m mpi4py tests/mpi/check_script_raises.py``: mpi4py
aborts the job on the uncaught exception, so rank 0, waiting in the solve's
agreement, does not wait for ever. (Without ``-m mpi4py`` it would: MPI cannot
agree on a call that one rank never makes.)
"""

import pathlib
import sys

from mpi4py import MPI

import propop as pp

sys.path.insert(0, str(pathlib.Path(__file__).parents[1]))
from cases import Case  # noqa: E402

net, trace, eps, _ = Case((5, 6, 4, 3), r=2).problem()
if MPI.COMM_WORLD.Get_rank() == 1:
    raise RuntimeError("the user's own code failed on rank 1")
pp.solve(pp.backward_system(net, trace, eps), "mpi.substitution")
print("not reached: the job should have been aborted")
