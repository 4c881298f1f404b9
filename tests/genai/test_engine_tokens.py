"""The engine under onnxrun.genai: a builder folder run by a plain KV-cache loop on
onnxrun.InferenceSession gives onnxruntime-genai's greedy tokens (int4: MatMulNBits at
accuracy_level 4 quantizes activations as MLAS does; fp32; GroupQueryAttention on a growing
cache), for every architecture the test material builds."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

import onnxrun

sys.path.insert(0, str(Path(__file__).parent))
import make_models  # noqa: E402

NEW_TOKENS = 64


def _folder(arch: str, fmt: str, extra: dict | None = None) -> str:
    missing = make_models.missing_packages()
    if missing:
        pytest.skip(f"genai model folders need {', '.join(missing)} "
                    "(pip install -e '.[genai-test]')")
    return str(make_models.build(arch, "tiny", fmt, extra))


def _oracle(og, folder: str, prompt: list[int]) -> list[int]:
    model = og.Model(folder)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(prompt) + NEW_TOKENS, do_sample=False)
    gen = og.Generator(model, params)
    gen.append_tokens(np.array([prompt], np.int32))
    while not gen.is_done():
        gen.generate_next_token()
    return [int(t) for t in gen.get_sequence(0)[len(prompt):]]


def _greedy(sess: onnxrun.InferenceSession, cfg: dict, prompt: list[int]) -> list[int]:
    """Greedy decoding with the cache fed back (present -> past), as a user's loop does."""
    dec = cfg["decoder"]
    layers, kv, head = dec["num_hidden_layers"], dec["num_key_value_heads"], dec["head_size"]
    names = [o.name for o in sess.get_outputs()]
    inputs = {i.name for i in sess.get_inputs()}
    past = {f"past_key_values.{i}.{t}": np.zeros((1, kv, 0, head), np.float32)
            for i in range(layers) for t in ("key", "value")}
    ids, total, out = np.array([prompt], np.int64), len(prompt), []
    while len(out) < NEW_TOKENS:
        feed = {"input_ids": ids, "attention_mask": np.ones((1, total), np.int64), **past}
        if "position_ids" in inputs:
            feed["position_ids"] = np.arange(total - ids.shape[1], total)[None]
        res = dict(zip(names, sess.run(None, feed), strict=True))
        out.append(int(res["logits"][0, -1].argmax()))
        past = {k: res[k.replace("past_key_values", "present")] for k in past}
        ids, total = np.array([[out[-1]]], np.int64), total + 1
    return out


@pytest.mark.parametrize("fmt", ["int4", "fp32"])
@pytest.mark.parametrize("arch", make_models.ARCHS)
def test_greedy_tokens_equal_onnxruntime_genai(arch, fmt):
    og = pytest.importorskip("onnxruntime_genai")
    folder = _folder(arch, fmt)
    cfg = json.loads(Path(folder, "genai_config.json").read_text())["model"]
    sess = onnxrun.InferenceSession(str(Path(folder, cfg["decoder"]["filename"])))
    rng = np.random.default_rng(0)
    for length in (1, 17, 300):
        prompt = [int(cfg["bos_token_id"])] + [
            int(t) for t in rng.integers(5, cfg["vocab_size"], length - 1)]
        assert _greedy(sess, cfg, prompt) == _oracle(og, folder, prompt), (arch, fmt, length)


@pytest.mark.parametrize("extra", [{"block_size": 64}, {"block_size": 128},
                                   {"block_size": 128, "accuracy_level": 1}],
                         ids=["block64", "block128", "block128-level1"])
def test_int4_block_sizes_and_levels(extra):
    """Builder folders with other MatMulNBits blocks (level 4: MLAS's int8 kernels for 64+)
    and a level with float activations (MLAS's CompFp32): a prompt's logits are onnxruntime's
    bit for bit (every operator exact; before, 65-85% of them differed in the last bits), and
    the greedy tokens onnxruntime-genai's."""
    og = pytest.importorskip("onnxruntime_genai")
    ort = pytest.importorskip("onnxruntime")
    from ort_bits import assert_ort_bits

    folder = _folder("llama", "int4", extra)
    cfg = json.loads(Path(folder, "genai_config.json").read_text())["model"]
    path = str(Path(folder, cfg["decoder"]["filename"]))
    sess = onnxrun.InferenceSession(path)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    ref = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    dec = cfg["decoder"]
    rng = np.random.default_rng(1)
    feed = {"input_ids": rng.integers(5, cfg["vocab_size"], (1, 40)),
            "attention_mask": np.ones((1, 40), np.int64),
            **{f"past_key_values.{i}.{t}": np.zeros((1, dec["num_key_value_heads"], 0,
                                                     dec["head_size"]), np.float32)
               for i in range(dec["num_hidden_layers"]) for t in ("key", "value")}}
    assert_ort_bits(sess.run(["logits"], feed)[0], ref.run(["logits"], feed)[0],
                    err=f"logits {extra}")
    for length in (1, 17, 300):
        prompt = [int(cfg["bos_token_id"])] + [
            int(t) for t in rng.integers(5, cfg["vocab_size"], length - 1)]
        assert _greedy(sess, cfg, prompt) == _oracle(og, folder, prompt), (extra, length)
