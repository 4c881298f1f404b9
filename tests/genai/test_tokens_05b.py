"""The 0.5B-parameter int4 folder (Qwen2 shape, accuracy_level 4: every MatMulNBits quantizes its
input to int8, so one last-bit difference upstream flips a code and grows layer by layer):
greedy tokens equal onnxruntime-genai's, which takes every float op feeding those products bit
for bit (MatMulNBits, the RMS norms, SiLU, GroupQueryAttention: compiled/gqa.py). Slow: it
builds the folder once (make_models.py) and decodes 64 tokens per prompt with both engines
(``pytest -m slow``; CI deselects it)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

import onnxrun

sys.path.insert(0, str(Path(__file__).parent))
from test_engine_tokens import NEW_TOKENS, _greedy  # noqa: E402

pytestmark = pytest.mark.slow


def _oracle(og, model, prompt: list[int]) -> list[int]:
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(prompt) + NEW_TOKENS, do_sample=False)
    gen = og.Generator(model, params)
    gen.append_tokens(np.array([prompt], np.int32))
    while not gen.is_done():
        gen.generate_next_token()
    return [int(t) for t in gen.get_sequence(0)[len(prompt):]]


def _threaded(folder: str, threads: int, root: Path) -> str:
    """``folder`` with genai_config.json asking for ``threads`` intra-op threads."""
    view = root / "view"
    view.mkdir()
    for f in Path(folder).iterdir():
        if f.name != "genai_config.json":
            (view / f.name).symlink_to(f.resolve())
    cfg = json.loads(Path(folder, "genai_config.json").read_text())
    cfg["model"]["decoder"].setdefault("session_options", {})["intra_op_num_threads"] = threads
    (view / "genai_config.json").write_text(json.dumps(cfg))
    return str(view)


# 2 threads: onnxruntime's GroupQueryAttention splits heads, rows (and key blocks where heads
# are fewer than threads) over its threads; onnxrun's on spin.py's workers, the same numbers
@pytest.mark.parametrize("threads", [1, 2])
def test_05b_int4_greedy_tokens_equal_onnxruntime_genai(genai_folder, og, threads, tmp_path):
    folder = genai_folder("qwen2", "int4", "0.5b")
    cfg = json.loads(Path(folder, "genai_config.json").read_text())["model"]
    so = onnxrun.SessionOptions()
    so.intra_op_num_threads = threads
    sess = onnxrun.InferenceSession(str(Path(folder, cfg["decoder"]["filename"])), so)
    model = og.Model(_threaded(folder, threads, tmp_path))
    rng = np.random.default_rng(0)
    for length in (1, 17, 300):  # 300: two of onnxruntime's KV blocks in the prompt
        prompt = [int(cfg["bos_token_id"])] + [
            int(t) for t in rng.integers(5, cfg["vocab_size"], length - 1)]
        assert _greedy(sess, cfg, prompt) == _oracle(og, model, prompt), length
