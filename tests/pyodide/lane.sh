#!/usr/bin/env bash
# The browser / Pyodide lanes (docs/ARCHITECTURE.md, "Browser"):
#   1. Node.js: the ONNX node conformance cases inside Pyodide 0.27.7, onnxrun installed from its
#      built wheel by micropip, offline; every case not in node_expected_failures.txt must pass.
#   2. headless Chromium: the demo page (demo/) runs a light-zoo model, outputs checked against
#      the model's expected outputs, screenshot kept ($PYODIDE_WORK/demo.png).
# Needs the shared Pyodide wheels (../shared/pyodide-0.27.7, or $PYODIDE_SHARED); skips, saying
# so, where they are absent. Installs what it needs: npm packages, Debian's
# chromium-headless-shell, protobuf's pure-Python wheel from PyPI.
#   bash tests/pyodide/lane.sh [node|browser|all]
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
WHAT=${1:-all}
SHARED=$(realpath -m "${PYODIDE_SHARED:-../shared/pyodide-0.27.7}")
WORK=$(realpath -m "${PYODIDE_WORK:-.pyodide}")
PY=${PYTHON:-.venv/bin/python}

if [ ! -f "$SHARED/SHA256SUMS" ]; then
  echo "pyodide lanes: skipped: $SHARED is absent (the Pyodide 0.27.7 wheels no registry serves)"
  exit 0
fi
(cd "$SHARED" && sha256sum --quiet -c SHA256SUMS)
if ! command -v node >/dev/null; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm) >/dev/null
fi
mkdir -p "$WORK/wheels"

if [ ! -d "$WORK/node_modules/pyodide" ] || [ ! -d "$WORK/node_modules/puppeteer-core" ] ||
   [ ! -d "$WORK/node_modules/onnxruntime-web" ]; then
  (cd "$WORK" && npm install --no-audit --no-fund --loglevel=error \
     pyodide@0.27.7 puppeteer-core@24 onnxruntime-web@1.30.0 >/dev/null)
fi
rm -f "$WORK"/wheels/*.whl
"$PY" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
  --platform any --python-version 3.12 --implementation py -d "$WORK/wheels" "protobuf==7.36.2"
"$PY" -m pip wheel -q --disable-pip-version-check --no-deps -w "$WORK/wheels" "$ROOT"

rc=0
if [ "$WHAT" = all ] || [ "$WHAT" = node ]; then
  [ -d "$WORK/cases/node" ] || "$PY" tests/pyodide/export_cases.py "$WORK/cases"
  start=$SECONDS
  node tests/pyodide/run_node.mjs --pyodide "$WORK/node_modules/pyodide" --shared "$SHARED" \
    --wheels "$WORK/wheels" --cases "$WORK/cases" --json "$WORK/node_results.json" || rc=1
  "$PY" tests/pyodide/check_results.py "$WORK/node_results.json" \
    tests/pyodide/node_expected_failures.txt || rc=1
  echo "pyodide node lane: $((SECONDS - start)) s"
fi
if [ "$WHAT" = all ] || [ "$WHAT" = browser ]; then
  if ! command -v chromium-headless-shell >/dev/null && ! command -v chromium >/dev/null; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
       chromium-headless-shell) >/dev/null
  fi
  start=$SECONDS
  node tests/pyodide/run_browser.mjs --work "$WORK" --shared "$SHARED" || rc=1
  echo "pyodide browser lane: $((SECONDS - start)) s"
fi
exit $rc
