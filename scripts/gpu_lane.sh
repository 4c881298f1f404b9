#!/usr/bin/env bash
# The GPU lane in one command, on a machine with a GPU, CuPy and PyTorch (docs/GPU.md):
# the CUDA provider's tests on CuPy (pytest -m gpu), then benchmarks/gpu.py.
# Results go to $OUT (the device tool brings that folder back), else to ./gpu-results.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu-results}
py=${PYTHON:-$(command -v python3 || command -v python)}
mkdir -p "$out"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true; } | tee "$out/card.txt"
# what the image lacks comes from the carried wheels (scripts/gpu_wheels.sh), never a registry
if [ -d .gpu-wheels ]; then
  PIP_BREAK_SYSTEM_PACKAGES=1 "$py" -m pip install -q --no-index --find-links .gpu-wheels \
    array-api-compat array-api-strict threadpoolctl ml_dtypes pytest 2>&1 | tail -3
  # the cuDNN frontend convolution path, where a wheel for this CPython was carried; without
  # its dependencies (nvidia-cutlass-dsl: its DSL kernels, not the graph API used here)
  PIP_BREAK_SYSTEM_PACKAGES=1 "$py" -m pip install -q --no-index --no-deps \
    --find-links .gpu-wheels nvidia-cudnn-frontend 2>&1 | tail -1
fi
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
"$py" - <<'PY' | tee "$out/versions.txt"
import sys
import cupy, numpy, onnx
print("python", sys.version.split()[0], "cupy", cupy.__version__, "numpy", numpy.__version__,
      "onnx", onnx.__version__)
try:
    import cudnn; print("nvidia-cudnn-frontend", cudnn.__version__, "cudnn", cudnn.backend_version())
except Exception as e:
    print("nvidia-cudnn-frontend: not usable:", type(e).__name__, e)
try:
    import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)
except ImportError:
    print("torch: not installed")
try:
    import onnxruntime as ort; print("onnxruntime", ort.__version__, ort.get_available_providers())
except ImportError:
    print("onnxruntime: not installed")
PY
# PYTEST_ARGS: e.g. "-n 8 --timeout=150" (the image has pytest-xdist and pytest-timeout)
timeout "${TEST_TIMEOUT:-300}" "$py" -m pytest -q -p no:cacheprovider -rfE -m gpu ${PYTEST_ARGS:-} tests/cuda 2>&1 | tee "$out/gpu-tests.txt" | tail -15
tests=${PIPESTATUS[0]}
timeout "${BENCH_TIMEOUT:-240}" "$py" benchmarks/gpu.py ${BENCH_ARGS:-} --out "$out/gpu-bench.jsonl" \
  2>&1 | tee "$out/gpu-bench.txt" | tail -20
bench=${PIPESTATUS[0]}
echo "tests exit $tests, benchmark exit $bench"
[ "$tests" -eq 0 ] && [ "$bench" -eq 0 ]
