"""onnxruntime-genai's own example script, unchanged, through ``python -m onnxrun.compat``: the
same streamed answers as with onnxruntime-genai itself."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import onnxrun.compat
import onnxrun.genai as rg

EXAMPLE = Path(__file__).parent / "examples" / "model-qa.py"


def _run(args: list[str], stdin: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONIOENCODING": "utf-8"}
    return subprocess.run([sys.executable, *args], input=stdin, capture_output=True, text=True,
                          encoding="utf-8", env=env, timeout=300)


def _answers(stdout: str) -> list[str]:
    # the timing lines (-g) differ by nature; the rest is the conversation
    return [line for line in stdout.splitlines() if not line.startswith("Prompt length")]


def test_model_qa_runs_unchanged_through_compat(genai_folder, og):
    folder = genai_folder("qwen2", "fp32")
    args = [str(EXAMPLE), "-m", folder, "-e", "cpu", "-l", "120", "-r", "-g"]
    questions = "What color is the sky?\nAnd the sea, café 日本語?\n"
    want = _run(args, questions)
    got = _run(["-m", "onnxrun.compat", *args], questions)
    # the script reads questions until its input ends: both end on EOFError
    assert "EOFError" in want.stderr and "EOFError" in got.stderr, got.stderr[-2000:]
    assert got.stdout.count("Output: ") == 2
    assert _answers(got.stdout) == _answers(want.stdout)
    assert "New tokens per second" in got.stdout


def test_compat_maps_onnxruntime_genai():
    onnxrun.compat.install()
    try:
        import onnxruntime_genai as og

        assert og is rg
        assert og.is_cuda_available() is False
    finally:
        onnxrun.compat.uninstall()
    assert sys.modules.get("onnxruntime_genai") is not rg
