#!/usr/bin/env bash
# The wheels the GPU lane needs that the GPU machine's image lacks (it reaches no registry):
# downloaded here into .gpu-wheels/ (git-ignored), carried there by the device tool's `carry`.
# docs/GPU.md: "Run the GPU lane".
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
du -sh "$dest"
