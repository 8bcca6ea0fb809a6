"""propop's benchmarks: ratios against a baseline measured in the same run.

Run one as ``python -m benchmarks.<name>``; results land in ``benchmarks/results``.

Every library runs on the same number of threads: importing this package (which
``python -m benchmarks.<name>`` does before anything imports NumPy) sets the
BLAS, OpenMP and XLA thread variables to one unless the environment sets them,
and the PyTorch contenders call ``torch.set_num_threads`` with the same count
(:func:`benchmarks.common.threads`). The tables record the settings.
"""

import os

for _name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_name, "1")
os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false "
                                   "intra_op_parallelism_threads=1")
