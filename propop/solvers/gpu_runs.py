"""The methods that have run on a GPU, as recorded by a GPU run.

``python -m benchmarks.gpu --device cuda --record`` on a machine with a GPU rewrites
``RUNS`` with every native method that agreed with NumPy there on every layout of
``benchmarks.systems``, on CuPy, on PyTorch CUDA or both, and every SciPy adapter with a
CuPy path on CuPy, with the device and library versions. Agreeing means the same status
as the method's own run on NumPy, and where that converged, the solution within 1e-9
(exact methods) or 1e-6 (iterative ones) of substitution's. Until a method is listed
here, ``propop solvers`` and the docs say that its GPU backends have not yet run on a GPU.
Recorded 2026-11-26 on an NVIDIA H200, in the same session as a run there of
``pytest -m gpu`` (every native method on both backends, networks, recurrences and
graphs moved there): 233 passed, none failed. That run had the eight layouts of
``benchmarks.systems`` then; its two layouts of sparse couplings (an MLP of sparse
weights, a convolution), added on 2026-12-07 with PyTorch's CSR tensors
(:mod:`propop.torch_sparse`), have not yet run on a GPU.
"""

RUNS: dict[str, str] = {
    'auto':
        ('NVIDIA H200, 8 layouts (not sparse, conv), float64: CuPy 14.2.0, '
         'PyTorch 2.11.0+cu130 CUDA'),
    'batched-bicgstab':
        ('NVIDIA H200, 8 layouts (not sparse, conv), float64: CuPy 14.2.0, '
         'PyTorch 2.11.0+cu130 CUDA'),
    'batched-gmres':
        ('NVIDIA H200, 8 layouts (not sparse, conv), float64: CuPy 14.2.0, '
         'PyTorch 2.11.0+cu130 CUDA'),
    'bicgstab':
        ('NVIDIA H200, 8 layouts (not sparse, conv), float64: CuPy 14.2.0, '
         'PyTorch 2.11.0+cu130 CUDA'),
    'block-bicgstab':
        ('NVIDIA H200, 8 layouts (not sparse, conv), float64: CuPy 14.2.0, '
         'PyTorch 2.11.0+cu130 CUDA'),
    'block-gmres':
        ('NVIDIA H200, 8 layouts (not sparse, conv), float64: CuPy 14.2.0, '
         'PyTorch 2.11.0+cu130 CUDA'),
    'cyclic-reduction':
        ('NVIDIA H200, 8 layouts (not sparse, conv), float64: CuPy 14.2.0, '
         'PyTorch 2.11.0+cu130 CUDA'),
    'hybrid':
        ('NVIDIA H200, 8 layouts (not sparse, conv), float64: CuPy 14.2.0, '
         'PyTorch 2.11.0+cu130 CUDA'),
    'jacobi':
        ('NVIDIA H200, 8 layouts (not sparse, conv), float64: CuPy 14.2.0, '
         'PyTorch 2.11.0+cu130 CUDA'),
    'level-scheduled':
        ('NVIDIA H200, 8 layouts (not sparse, conv), float64: CuPy 14.2.0, '
         'PyTorch 2.11.0+cu130 CUDA'),
    'parallel-cyclic-reduction':
        ('NVIDIA H200, 8 layouts (not sparse, conv), float64: CuPy 14.2.0, '
         'PyTorch 2.11.0+cu130 CUDA'),
    'richardson':
        ('NVIDIA H200, 8 layouts (not sparse, conv), float64: CuPy 14.2.0, '
         'PyTorch 2.11.0+cu130 CUDA'),
    'scipy.cgs':
        ('NVIDIA H200, 8 layouts (not sparse, conv), float64: CuPy 14.2.0; '
         'BREAKDOWN on fnn-unequal, graph, '
         'linear, as on NumPy'),
    'scipy.gmres':
        'NVIDIA H200, 8 layouts (not sparse, conv), float64: CuPy 14.2.0',
    'scipy.lsmr':
        ('NVIDIA H200, 8 layouts (not sparse, conv), float64: CuPy 14.2.0; '
         'MAX_ITER on fnn-unequal, fnn-stacked, '
         'per-sample, rnn, gru, graph, diagonal, as on NumPy'),
    'substitution':
        ('NVIDIA H200, 8 layouts (not sparse, conv), float64: CuPy 14.2.0, '
         'PyTorch 2.11.0+cu130 CUDA'),
}
