"""Scale-out with MPI (mpi4py): block rows partitioned over ranks (paper section 3.2).

Each rank owns a contiguous range of block rows in solve order (layers, or time
steps of an RNN) and only neighbours talk. :class:`DistributedSystem` holds a
rank's rows; the ``mpi.*`` methods of the registry solve with it. Needs the
``mpi`` extra (``mpi4py`` and ``mpich``); run scripts as ``mpiexec -n P python -m mpi4py
script.py``, so that an uncaught exception on one rank aborts the job.
"""

from .data_parallel import backprop
from .guard import RankError
from .system import DistributedSystem, partition

__all__ = ["DistributedSystem", "partition", "backprop", "RankError"]
