#!/usr/bin/env bash
# The prepared GPU run of issue 31: one call of about 11 minutes on the device machine.
#
# The machine has PyTorch (CUDA), CuPy, JAX, SciPy and pytest but not propop's other
# needs, and reaches no registry. Before the call, here, in the repository's root:
#
#   echo /.whl/ >> .git/info/exclude; mkdir -p .whl
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux_2_28_x86_64 -d .whl \
#     pyamg==5.4.1 array-api-compat==1.16.0 array-api-strict==2.6.1
#
# then run `bash benchmarks/gpu_session.sh` there with `.whl` carried. What it writes
# under $OUT comes back (8 files at most): the device, the GPU tests' log, the recorded
# registry run (propop/solvers/gpu_runs.py, to commit), the GPU benchmark's and the
# training step's tables. Each stage has its own time limit, so that a slow one
# leaves the others their time.
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import torch, cupy, jax; print(torch.__version__, cupy.__version__, jax.__version__)"
} > "$OUT/device.txt" 2>&1

# every native method on CuPy and PyTorch CUDA against NumPy, the moved networks too
timeout 300 python3 -m pytest -m gpu -q -p no:cacheprovider tests 2>&1 \
  | tee "$OUT/pytest-gpu.log" | tail -3

# the registry on every layout of benchmarks.systems (sparse and conv included), recorded,
# then the grids' rows until the deadline, merged into the saved table
timeout 200 python3 -m benchmarks.gpu --device cuda --record --deadline 150 --merge 2>&1 \
  | tee "$OUT/gpu-record.log" | tail -3
cp propop/solvers/gpu_runs.py benchmarks/results/gpu.json benchmarks/results/gpu.md "$OUT/"

# a training step on the device: autograd, parallelize on the host and backend="torch"
timeout 150 python3 -m benchmarks.training_step --device cuda 2>&1 \
  | tee "$OUT/training_step.log" | tail -3
cp benchmarks/results/training_step.json "$OUT/" 2>/dev/null
