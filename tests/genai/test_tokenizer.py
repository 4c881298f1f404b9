"""onnxrun.genai.Tokenizer against onnxruntime-genai's tokenizer on the same folder."""

from __future__ import annotations

import numpy as np
import pytest

import onnxrun.genai as rg

TEXTS = ["The model runs café 日本語 🙂", "Привет мир, как дела? 中文文本", "a", "👍🏽 → ∑ ∞ €",
         "  leading spaces and\nnew lines\t tabs"]


@pytest.fixture(scope="module")
def pair(genai_folder, og):
    folder = genai_folder("llama", "fp32")
    return rg.Tokenizer(rg.Model(folder)), og.Tokenizer(og.Model(folder))


def test_encode_decode_equal_onnxruntime_genai(pair):
    mine, theirs = pair
    for text in TEXTS:
        ids = mine.encode(text)
        assert ids.dtype == np.int32
        assert ids.tolist() == theirs.encode(text).tolist(), text
        assert mine.decode(ids) == theirs.decode(ids) == text


def test_batch_equal_onnxruntime_genai(pair):
    mine, theirs = pair
    got, want = mine.encode_batch(TEXTS), theirs.encode_batch(TEXTS)
    np.testing.assert_array_equal(got.as_numpy(), want.as_numpy())
    assert mine.decode_batch(got) == theirs.decode_batch(want)
    assert mine.eos_token_ids.tolist() == theirs.eos_token_ids.tolist()
    assert mine.pad_token_id == theirs.pad_token_id
    assert mine.to_token_id("<pad>") == theirs.to_token_id("<pad>")


def test_stream_decode_splits_multibyte_characters_as_onnxruntime_genai(pair):
    mine, theirs = pair
    for text in TEXTS:
        ids = mine.encode(text)
        s1, s2 = mine.create_stream(), theirs.create_stream()
        got = [s1.decode(int(i)) for i in ids]
        assert got == [s2.decode(int(i)) for i in ids], text
        assert "".join(got) == text
        assert "\ufffd" not in "".join(got)


def test_stream_of_random_tokens_equals_onnxruntime_genai(pair):
    """Arbitrary token runs, bytes that never form a character included: dropped as genai drops
    them."""
    mine, theirs = pair
    ids = np.random.default_rng(0).integers(4, 500, size=3000)
    s1, s2 = mine.create_stream(), theirs.create_stream()
    assert [s1.decode(int(i)) for i in ids] == [s2.decode(int(i)) for i in ids]


def test_chat_template_equals_onnxruntime_genai(genai_folder, og):
    import json

    folder = genai_folder("qwen2", "fp32")
    template = ('{% for message in messages %}{{ "<|im_start|>" + message["role"] + "\\n" + '
                'message["content"] + "<|im_end|>\\n" }}{% endfor %}'
                '{% if add_generation_prompt %}{{ "<|im_start|>assistant\\n" }}{% endif %}')
    messages = json.dumps([{"role": "system", "content": "You are helpful."},
                           {"role": "user", "content": "What color is the sky? café"}])
    mine, theirs = rg.Tokenizer(rg.Model(folder)), og.Tokenizer(og.Model(folder))
    for gen_prompt in (True, False):
        assert mine.apply_chat_template(messages, template_str=template,
                                        add_generation_prompt=gen_prompt) == \
            theirs.apply_chat_template(messages, template_str=template,
                                       add_generation_prompt=gen_prompt)
    with pytest.raises(RuntimeError, match="chat template"):
        mine.apply_chat_template(messages)  # the folder has none
