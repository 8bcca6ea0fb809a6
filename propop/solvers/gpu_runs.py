"""The methods that have run on a GPU, as recorded by a GPU run.

``python -m benchmarks.gpu --device cuda --record`` on a machine with a GPU rewrites
``RUNS`` with every native method that agreed with NumPy there on every layout of
``benchmarks.systems``, on CuPy, on PyTorch CUDA or both, with the device and library
versions. Until a method is listed here, ``propop solvers`` and the docs say that its
GPU backends have not yet run on a GPU. Recorded 2026-11-26 on an NVIDIA H200; a later
run there of ``pytest -m gpu`` (every native method on both backends, networks, recurrences
and graphs moved there): 233 passed, none failed.
"""

RUNS: dict[str, str] = {
    'auto':
        'NVIDIA H200, every layout, float64: PyTorch 2.11.0+cu130 CUDA, CuPy 14.2.0',
    'batched-bicgstab':
        'NVIDIA H200, every layout, float64: PyTorch 2.11.0+cu130 CUDA, CuPy 14.2.0',
    'batched-gmres':
        'NVIDIA H200, every layout, float64: PyTorch 2.11.0+cu130 CUDA, CuPy 14.2.0',
    'bicgstab':
        'NVIDIA H200, every layout, float64: PyTorch 2.11.0+cu130 CUDA, CuPy 14.2.0',
    'block-bicgstab':
        'NVIDIA H200, every layout, float64: PyTorch 2.11.0+cu130 CUDA, CuPy 14.2.0',
    'block-gmres':
        'NVIDIA H200, every layout, float64: PyTorch 2.11.0+cu130 CUDA, CuPy 14.2.0',
    'cyclic-reduction':
        'NVIDIA H200, every layout, float64: PyTorch 2.11.0+cu130 CUDA, CuPy 14.2.0',
    'hybrid':
        'NVIDIA H200, every layout, float64: PyTorch 2.11.0+cu130 CUDA, CuPy 14.2.0',
    'jacobi':
        'NVIDIA H200, every layout, float64: PyTorch 2.11.0+cu130 CUDA, CuPy 14.2.0',
    'level-scheduled':
        'NVIDIA H200, every layout, float64: PyTorch 2.11.0+cu130 CUDA, CuPy 14.2.0',
    'parallel-cyclic-reduction':
        'NVIDIA H200, every layout, float64: PyTorch 2.11.0+cu130 CUDA, CuPy 14.2.0',
    'richardson':
        'NVIDIA H200, every layout, float64: PyTorch 2.11.0+cu130 CUDA, CuPy 14.2.0',
    'substitution':
        'NVIDIA H200, every layout, float64: PyTorch 2.11.0+cu130 CUDA, CuPy 14.2.0',
}
