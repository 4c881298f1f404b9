"""The ONNX backend conformance suite, run through onnxrun's ``onnx.backend`` implementation.

Covers every node case that the installed onnx package defines (onnx.backend.test.case.node) and
the data-based simple / pytorch-converted / pytorch-operator model cases, with the suite's own
tolerances. The light model zoo runs in test_zoo.py; the "real" models need a download.

Every case onnxrun does not pass is in EXPECTED_FAILURES below, with its reason. The pass count
is printed at the end of the pytest run (see conftest.py).
"""

from __future__ import annotations

import onnx.backend.test

import onnxrun.backend

# Pattern (regex on the unittest name) -> why onnxrun does not pass it. Keep this list short and
# every reason true: a case listed here is a known gap, not a hidden one.
EXPECTED_FAILURES: dict[str, str] = {
}

# Not failures: cases that are not about onnxrun (downloads, or models run elsewhere).
EXCLUDED: dict[str, str] = {
    r"^test_.*_real_.*": "real-world models need a download (no network in tests)",
    r"^test_(bvlc_alexnet|densenet121|inception_v1|inception_v2|resnet50|shufflenet|squeezenet|"
    r"vgg19|zfnet512)_.*": "the light model zoo runs in tests/test_zoo.py",
}

backend_test = onnx.backend.test.BackendTest(onnxrun.backend, __name__)
for pattern in EXCLUDED:
    backend_test.exclude(pattern)
for pattern in EXPECTED_FAILURES:
    backend_test.xfail(pattern)

globals().update(backend_test.test_cases)
