"""The methods that have run on a GPU, as recorded by a GPU run; none yet.

``python -m benchmarks.gpu --record`` on a machine with a GPU rewrites ``RUNS`` with
every native method whose GPU tests passed there, and the device and library
versions they passed on. Until a method is listed here, ``propop solvers`` and the
docs say that its GPU backends have not yet run on a GPU.
"""

RUNS: dict[str, str] = {}
