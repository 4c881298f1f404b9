"""Model folders for the genai tests: built once per machine by make_models.py (cached outside the
repository), or the tests skip saying which package is missing."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import make_models  # noqa: E402


@pytest.fixture(scope="session")
def genai_folder():
    missing = make_models.missing_packages()
    built: dict = {}

    def get(arch: str, fmt: str = "fp32", size: str = "tiny"):
        if missing:
            pytest.skip(f"genai model folders need {', '.join(missing)} "
                        "(pip install -e '.[genai-test]')")
        key = (arch, fmt, size)
        if key not in built:
            built[key] = make_models.build(arch, size, fmt)
        return str(built[key])

    return get


@pytest.fixture(scope="session")
def og():
    """onnxruntime-genai, the oracle."""
    return pytest.importorskip("onnxruntime_genai")
