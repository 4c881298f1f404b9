"""fp16 folders of onnxruntime-genai's builder (``-p fp16 -e cpu``): onnxrun's greedy tokens against
onnxruntime-genai's.

The builder makes the folder (MultiHeadAttention, fp16 weights and cache), but
onnxruntime-genai 0.18 (onnxruntime 1.2x CPU) fails on its second step: "Non-zero status code
returned while running Cast node. Name:'InsertedPrecisionFreeCast_/model/layers.1/attn/v_proj/
repeat_kv/Reshape_4/output_0' ... Shape mismatch attempting to re-use buffer. {1,1,64} !=
{1,18,64}" (also with enable_mem_pattern off and ORT_DISABLE_ALL). So the comparison covers the
prompt step (logits, first token) while the oracle fails, and all 64 tokens once it runs.
"""

from __future__ import annotations

import numpy as np
import pytest

import onnxrun.genai as rg

NEW = 64
_TEXT = ("The model runs fast on the river city, café naïve 日本語のテキスト and 🙂 emoji. "
         "Attention heads read the key value cache; a quantized block weight is int4. ") * 4


def _generate(mod, folder, n):
    model = mod.Model(folder)
    ids = mod.Tokenizer(model).encode(_TEXT)[:n]
    params = mod.GeneratorParams(model)
    params.set_search_options(max_length=n + NEW)
    gen = mod.Generator(model, params)
    gen.append_tokens(ids)
    logits = gen.get_logits().copy()
    error = None
    try:
        while not gen.is_done():
            gen.generate_next_token()
    except RuntimeError as exc:  # the oracle's failure above, never onnxrun's
        if mod is rg:
            raise
        error = str(exc)
    return gen.get_sequence(0).tolist(), logits, error


@pytest.mark.parametrize("n", [1, 17])
def test_fp16_tokens_equal_onnxruntime_genai(genai_folder, og, n):
    folder = genai_folder("llama", "fp16")
    want, want_logits, og_error = _generate(og, folder, n)
    got, got_logits, _ = _generate(rg, folder, n)
    assert got_logits.dtype == np.float32 and got_logits.shape == want_logits.shape
    np.testing.assert_allclose(got_logits, want_logits, atol=2e-2, rtol=2e-2)
    assert len(got) == n + NEW
    if og_error is not None:
        assert "Shape mismatch attempting to re-use buffer" in og_error, og_error
        assert len(want) == n + 1  # genai chose the first token before failing
        assert got[:len(want)] == want
    else:
        assert got == want
