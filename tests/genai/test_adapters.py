"""LoRA adapters (og.Adapters, Generator.set_active_adapter) against onnxruntime-genai: the same
tokens with no adapter, each adapter active, and after an unload; the same errors."""

from __future__ import annotations

import gc

import make_models
import pytest

import onnxrun.genai as rg
from onnxrun import errors

PROMPT = "The model runs fast on the river"


@pytest.fixture(scope="module")
def lora_folder(genai_folder):
    genai_folder("llama", "fp32")  # skips with the reason when the build packages are missing
    return make_models.build_lora("llama", "tiny")


def _session(mod, folder):
    model = mod.Model(str(folder))
    adapters = mod.Adapters(model)
    for name in make_models.LORA_ADAPTERS:
        adapters.load(str(folder / f"{name}.onnx_adapter"), name)
    ids = mod.Tokenizer(model).encode(PROMPT)

    def generate(active):
        params = mod.GeneratorParams(model)
        params.set_search_options(max_length=48)
        gen = mod.Generator(model, params)
        if active:
            gen.set_active_adapter(adapters, active)
        gen.append_tokens(ids)
        while not gen.is_done():
            gen.generate_next_token()
        return gen.get_sequence(0).tolist()

    return adapters, generate


def test_adapter_tokens_equal_onnxruntime_genai(lora_folder, og):
    og_adapters, og_gen = _session(og, lora_folder)
    rg_adapters, rg_gen = _session(rg, lora_folder)
    runs = {}
    for active in (None, "adapter_a", "adapter_b", None, "adapter_a"):  # active, switched, off
        want, got = og_gen(active), rg_gen(active)
        assert got == want, active
        runs.setdefault(active, want)
    assert len({tuple(v) for v in runs.values()}) == 3  # each adapter changes the tokens
    gc.collect()
    for adapters in (og_adapters, rg_adapters):
        adapters.unload("adapter_a")
    assert rg_gen(None) == og_gen(None) == runs[None]
    assert rg_gen("adapter_b") == og_gen("adapter_b") == runs["adapter_b"]


def test_adapter_errors_match_onnxruntime_genai(lora_folder, og):
    for mod, error in ((og, RuntimeError), (rg, errors.RuntimeException)):
        model = mod.Model(str(lora_folder))
        adapters = mod.Adapters(model)
        path = str(lora_folder / "adapter_a.onnx_adapter")
        adapters.load(path, "a")
        with pytest.raises(error, match="Adapter already loaded: a"):
            adapters.load(path, "a")
        with pytest.raises(error, match="Adapter not found: zz"):
            adapters.unload("zz")
        params = mod.GeneratorParams(model)
        params.set_search_options(max_length=16)
        gen = mod.Generator(model, params)
        with pytest.raises(error, match="Adapter not found: zz"):
            gen.set_active_adapter(adapters, "zz")
        gen.set_active_adapter(adapters, "a")
        with pytest.raises(error, match="Adapter still in use: a"):
            adapters.unload("a")
        with pytest.raises(error, match="single Adapters container"):
            gen.set_active_adapter(mod.Adapters(model), "a")
        del gen
        gc.collect()
        adapters.unload("a")  # the generator's reference went with it
        with pytest.raises(RuntimeError):
            adapters.load(str(lora_folder / "missing.onnx_adapter"), "m")
