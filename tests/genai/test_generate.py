"""onnxrun.genai against onnxruntime-genai on the same folders: the same tokens."""

from __future__ import annotations

import numpy as np
import pytest

import onnxrun.genai as rg
from onnxrun import errors

ARCHS = ("llama", "qwen2", "phi3")
NEW = 64
_TEXT = ("The model runs fast on the river city, café naïve 日本語のテキスト and 🙂 emoji. "
         "Attention heads read the key value cache; a quantized block weight is int4. ") * 40

def _prompt(mod, model, n: int) -> np.ndarray:
    ids = mod.Tokenizer(model).encode(_TEXT)
    assert len(ids) >= n
    return ids[:n]


def _generate(mod, folder, prompt, **options):
    model = mod.Model(folder)
    params = mod.GeneratorParams(model)
    params.set_search_options(**options)
    gen = mod.Generator(model, params)
    if isinstance(prompt, list):
        gen.append_tokens(mod.Tokenizer(model).encode_batch(prompt))
        rows = len(prompt)
    else:
        gen.append_tokens(_prompt(mod, model, prompt) if isinstance(prompt, int) else prompt)
        rows = options.get("num_return_sequences", 1)
    while not gen.is_done():
        gen.generate_next_token()
    return [gen.get_sequence(i).tolist() for i in range(rows)]


def _cases():
    for arch in ARCHS:
        for fmt in ("fp32", "int4"):
            for n in (1, 17, 300, "batch3"):
                yield pytest.param(arch, fmt, n, id=f"{arch}-{fmt}-{n}")


@pytest.mark.parametrize("arch,fmt,n", list(_cases()))
def test_greedy_tokens_equal_onnxruntime_genai(genai_folder, og, arch, fmt, n):
    folder = genai_folder(arch, fmt)
    if n == "batch3":
        prompt = ["The model", "Attention heads read the key value cache, café 日本語", "🙂"]
        longest = max(len(og.Tokenizer(og.Model(folder)).encode(p)) for p in prompt)
        opts = dict(max_length=longest + NEW, batch_size=3)
    else:
        prompt, opts = n, dict(max_length=n + NEW)
    want = _generate(og, folder, prompt, **opts)
    got = _generate(rg, folder, prompt, **opts)
    assert all(len(w) == opts["max_length"] for w in want)  # EOS did not cut the comparison
    assert got == want


@pytest.mark.parametrize("options", [
    dict(do_sample=True, top_k=20, random_seed=7),
    dict(do_sample=True, top_k=30, top_p=0.8, temperature=0.7, random_seed=3),
    dict(do_sample=True, top_k=5, temperature=1.5, random_seed=123),
    dict(do_sample=True, top_k=0, top_p=0.7, random_seed=7),
    dict(do_sample=True, top_k=0, top_p=0.95, temperature=0.5, random_seed=11),
], ids=["top_k", "top_k_top_p_temperature", "top_k_hot", "top_p_only", "top_p_cold"])
def test_seeded_sampling_equals_onnxruntime_genai(genai_folder, og, options):
    folder = genai_folder("llama", "fp32")
    assert _generate(rg, folder, 17, max_length=17 + NEW, **options) == \
        _generate(og, folder, 17, max_length=17 + NEW, **options)


def test_seeded_sampling_repeats_and_seeds_differ(genai_folder):
    folder = genai_folder("llama", "fp32")
    a = _generate(rg, folder, 5, max_length=40, do_sample=True, top_k=50, random_seed=1)
    b = _generate(rg, folder, 5, max_length=40, do_sample=True, top_k=50, random_seed=1)
    c = _generate(rg, folder, 5, max_length=40, do_sample=True, top_k=50, random_seed=2)
    assert a == b and a != c


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("options", [
    dict(num_beams=4, num_return_sequences=2),
    dict(num_beams=3, num_return_sequences=3, length_penalty=0.5, early_stopping=False),
], ids=["beams4", "beams3_no_early_stop"])
def test_beam_search_equals_onnxruntime_genai(genai_folder, og, arch, options):
    folder = genai_folder(arch, "fp32")
    assert _generate(rg, folder, 9, max_length=40, **options) == \
        _generate(og, folder, 9, max_length=40, **options)


def test_penalties_and_kv_modes_equal_onnxruntime_genai(genai_folder, og):
    folder = genai_folder("qwen2", "fp32")
    for options in (dict(repetition_penalty=1.3, min_length=50),
                    dict(past_present_share_buffer=False)):
        assert _generate(rg, folder, 12, max_length=60, **options) == \
            _generate(og, folder, 12, max_length=60, **options), options


def test_eos_list_stops_each_row(genai_folder, og):
    """Several EOS ids: a row stops at any of them and is padded after it."""
    folder = genai_folder("llama", "fp32")
    cfg_tokens = _generate(og, folder, 3, max_length=20)[0]
    eos = cfg_tokens[10]  # make a token the model produces an EOS
    results = []
    for mod in (og, rg):
        config = mod.Config(folder)
        config.overlay(f'{{"model": {{"eos_token_id": [0, {eos}]}}}}')
        model = mod.Model(config)
        params = mod.GeneratorParams(model)
        params.set_search_options(max_length=20)
        gen = mod.Generator(model, params)
        gen.append_tokens(_prompt(mod, model, 3))
        while not gen.is_done():
            gen.generate_next_token()
        results.append(gen.get_sequence(0).tolist())
    assert results[0] == results[1]
    # the last row to finish stops the search before its EOS is appended, as in genai
    assert results[1] == cfg_tokens[:10]


def test_rewind_and_continue_equal_onnxruntime_genai(genai_folder, og):
    folder = genai_folder("phi3", "fp32")
    out = []
    for mod in (og, rg):
        model = mod.Model(folder)
        params = mod.GeneratorParams(model)
        params.set_search_options(max_length=60)
        gen = mod.Generator(model, params)
        gen.append_tokens(_prompt(mod, model, 8))
        for _ in range(10):
            gen.generate_next_token()
        gen.rewind_to(12)
        for _ in range(5):
            gen.generate_next_token()
        gen.append_tokens(np.array([40, 41, 42], np.int32))
        for _ in range(5):
            gen.generate_next_token()
        out.append((gen.get_sequence(0).tolist(), gen.get_next_tokens().tolist()))
    assert out[0] == out[1]


def test_generator_outputs_and_options(genai_folder, og):
    folder = genai_folder("llama", "fp32")
    model = rg.Model(folder)
    params = rg.GeneratorParams(model)
    params.set_search_options(max_length=30, batch_size=2)
    assert params.get_search_options() == {
        **og.GeneratorParams(og.Model(folder)).get_search_options(), "max_length": 30.0,
        "batch_size": 2.0}
    gen = rg.Generator(model, params)
    gen.append_tokens(rg.Tokenizer(model).encode_batch(["The model", "ab"]))
    assert gen.get_logits().shape == (2, 1, model.vocab_size)
    gen.generate_next_token()
    assert gen.get_output("logits").shape == (2, 1, model.vocab_size)
    assert gen.get_output("present.0.key").shape == (2, 2, 30, 16)  # the shared buffer
    assert gen.token_count() == 5


def test_terminate_session(genai_folder):
    model = rg.Model(genai_folder("llama", "fp32"))
    params = rg.GeneratorParams(model)
    params.set_search_options(max_length=30)
    gen = rg.Generator(model, params)
    gen.append_tokens(np.array([5, 6, 7], np.int32))
    gen.set_runtime_option("terminate_session", "1")
    with pytest.raises(RuntimeError, match="Terminated"):
        gen.generate_next_token()
    gen.set_runtime_option("terminate_session", "0")
    gen.generate_next_token()
    assert gen.token_count() == 4


def test_bad_input_is_a_clear_error(genai_folder, tmp_path):
    with pytest.raises(errors.NoSuchFile, match="genai_config.json"):
        rg.Model(str(tmp_path))
    (tmp_path / "genai_config.json").write_text("{not json")
    with pytest.raises(errors.InvalidArgument, match="genai_config.json"):
        rg.Model(str(tmp_path))
    folder = genai_folder("llama", "fp32")
    config = rg.Config(folder)
    config.append_provider("cuda")
    with pytest.raises(errors.EPFail, match="cuda"):
        rg.Model(config)
    model = rg.Model(folder)
    params = rg.GeneratorParams(model)
    with pytest.raises(RuntimeError, match='Unknown value "foo"'):
        params.set_search_options(foo=1)
    params.set_search_options(max_length=10, do_sample=True, top_p=2.0)
    gen = rg.Generator(model, params)
    with pytest.raises(RuntimeError, match="GenerateNextToken called with no prior state"):
        gen.generate_next_token()
    with pytest.raises(RuntimeError, match="exceeds max length"):
        gen.append_tokens(np.arange(11, dtype=np.int32))
    with pytest.raises(RuntimeError, match="out of range"):
        gen.append_tokens(np.array([1, 100000], np.int32))
    gen.append_tokens(np.array([1, 2], np.int32))
    with pytest.raises(RuntimeError, match="top_p must be between 0.0 and 1.0"):
        gen.generate_next_token()
    with pytest.raises(RuntimeError, match="out of range"):
        gen.get_sequence(1)
    bad = rg.GeneratorParams(model)
    bad.set_search_options(num_beams=2, num_return_sequences=3)
    with pytest.raises(RuntimeError, match="num_return_sequences"):
        rg.Generator(model, bad)


@pytest.mark.parametrize("fmt", ["optimum", "optimum-nopos"])
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_plain_onnx_export_equals_onnxruntime_genai(genai_folder, og, arch, fmt):
    """Optimum-style exports (plain attention, past/present exchanged, genai_config.json written
    by the user), with and without position_ids: greedy, a padded batch, beams."""
    folder = genai_folder(arch, fmt)
    batch = ["The model", "Attention heads read the key value cache, café", "🙂"]
    for prompt, options in ((17, dict(max_length=17 + NEW)),
                            (batch, dict(max_length=40, batch_size=3)),
                            (9, dict(max_length=30, num_beams=3, num_return_sequences=2))):
        assert _generate(rg, folder, prompt, **options) == \
            _generate(og, folder, prompt, **options), options


def test_inputs_fed_and_module_helpers(genai_folder, og):
    folder = genai_folder("llama", "fp32")
    got = []
    for mod in (og, rg):
        model = mod.Model(folder)
        params = mod.GeneratorParams(model)
        params.set_search_options(max_length=12, batch_size=2)
        gen = mod.Generator(model, params)
        gen.append_tokens(mod.Tokenizer(model).encode_batch(["The model", "ab"]))
        gen.generate_next_token()
        gen.generate_next_token()
        got.append((gen.get_input("attention_mask").tolist(), gen.get_input("input_ids").tolist()))
    assert got[0] == got[1]
    assert rg.is_cuda_available() is og.is_cuda_available() is False
    with pytest.raises(errors.EPFail):
        rg.register_execution_provider_library("CUDAExecutionProvider", "/nonexistent.so")
    rg.set_log_options(enabled=True, model_input_values=False)  # accepted, as genai accepts it


def test_optimum_folder_without_genai_config(genai_folder, og, tmp_path):
    """An Optimum-style export folder with Hugging Face's config.json but no genai_config.json:
    the configuration is derived, and the tokens are those of the user-written one."""
    import json
    import shutil

    folder = genai_folder("qwen2", "optimum")
    for name in ("model.onnx", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(f"{folder}/{name}", tmp_path / name)
    written = json.loads(open(f"{folder}/genai_config.json").read())["model"]
    hf = {"model_type": "qwen2", "max_position_embeddings": written["context_length"],
          "vocab_size": written["vocab_size"], "eos_token_id": written["eos_token_id"],
          "pad_token_id": written["pad_token_id"], "bos_token_id": written["bos_token_id"],
          "hidden_size": written["decoder"]["hidden_size"],
          "num_attention_heads": written["decoder"]["num_attention_heads"],
          "num_key_value_heads": written["decoder"]["num_key_value_heads"],
          "num_hidden_layers": written["decoder"]["num_hidden_layers"]}
    (tmp_path / "config.json").write_text(json.dumps(hf))
    assert _generate(rg, str(tmp_path), 17, max_length=17 + NEW) == \
        _generate(og, folder, 17, max_length=17 + NEW)
