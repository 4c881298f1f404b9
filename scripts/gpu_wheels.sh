#!/usr/bin/env bash
# The wheels the GPU lane needs that the GPU machine's image lacks (it reaches no registry):
# downloaded here into .gpu-wheels/ (git-ignored), carried there by the device tool's `carry`.
# docs/GPU.md: "Run the GPU lane". Carry both: run(..., carry=[".gpu-wheels", ".gpu-genai"]).
set -euo pipefail
cd "$(dirname "$0")/.."
dest=.gpu-wheels
mkdir -p "$dest"
pip=${PIP:-.venv/bin/python -m pip}
# pure Python: one wheel for every interpreter
$pip download -q --no-deps --only-binary=:all: -d "$dest" \
  array-api-compat array-api-strict threadpoolctl pytest iniconfig pluggy packaging pygments \
  exceptiongroup tomli
# ml_dtypes is compiled: one wheel per CPython the image may have
for v in 3.10 3.11 3.12 3.13; do
  $pip download -q --no-deps --only-binary=:all: --python-version "$v" \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 -d "$dest" ml_dtypes
done
# nvidia-cudnn-frontend (the cuDNN convolution path, cupy/cudnn.py): compiled, 12 MB a wheel, so
# only for the image's CPython (GPU_PY; its versions.txt from an earlier lane run says which)
$pip download -q --no-deps --only-binary=:all: --python-version "${GPU_PY:-3.12}" \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 -d "$dest" \
  nvidia-cudnn-frontend || echo "nvidia-cudnn-frontend: no wheel for ${GPU_PY:-3.12}"
du -sh "$dest"
# onnxruntime-genai builder folders for tests/cuda/test_genai.py and the benchmark's LLM decode
# rows (the image has no onnxruntime-genai to build them): the tiny ones and llama "small", built
# here by tests/genai/make_models.py (the genai-test extra) into .gpu-genai/ (git-ignored, 7 MB;
# the device tool carries 64 MiB in all)
py=${PYTHON:-.venv/bin/python}
genai=.gpu-genai
mkdir -p "$genai"
"$py" - "$genai" <<'PY'
import shutil, sys
from pathlib import Path
sys.path.insert(0, "tests/genai")
import make_models
missing = make_models.missing_packages()
if missing:
    sys.exit(f"genai folders skipped: pip install -e '.[genai-test]' ({', '.join(missing)})")
dest = Path(sys.argv[1])
recipes = [(a, "tiny", f) for a in ("llama", "qwen2", "phi3") for f in ("fp32", "int4")]
for arch, size, fmt in recipes + [("llama", "small", "int4")]:
    out = dest / f"{arch}-{size}-{fmt}"
    if not out.exists():
        shutil.copytree(make_models.build(arch, size, fmt), out)
PY
du -sh "$genai"
