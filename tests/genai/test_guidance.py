"""Constrained decoding (GeneratorParams.set_guidance on llguidance) against onnxruntime-genai,
whose CPU package has it: the same tokens for regex, JSON schema and Lark grammars, greedy,
sampled and batched, and the same errors."""

from __future__ import annotations

import json

import pytest

import onnxrun.genai as rg
from onnxrun import errors

pytest.importorskip("llguidance")

SCHEMA = json.dumps({"type": "object", "properties": {"a": {"type": "integer"},
                                                      "b": {"type": "string"}},
                     "required": ["a", "b"]})
CASES = {
    "regex": ("regex", "[a-z ]+"),
    "regex-ends": ("regex", "(cat|dog)[0-9]{3}"),
    "json": ("json_schema", SCHEMA),
    "lark": ("lark_grammar", 'start: "yes" | "no"'),
}


def _run(mod, folder, kind, data, prompts=("The model",), ff=False, **options):
    model = mod.Model(folder)
    tok = mod.Tokenizer(model)
    params = mod.GeneratorParams(model)
    params.set_search_options(max_length=40, batch_size=len(prompts), **options)
    params.set_guidance(kind, data, ff)
    gen = mod.Generator(model, params)
    gen.append_tokens(tok.encode_batch(list(prompts)) if len(prompts) > 1 else
                      tok.encode(prompts[0]))
    while not gen.is_done():
        gen.generate_next_token()
    return [gen.get_sequence(i).tolist() for i in range(len(prompts))]


@pytest.mark.parametrize("case", list(CASES))
def test_guided_tokens_equal_onnxruntime_genai(genai_folder, og, case):
    folder = genai_folder("llama", "fp32")
    kind, data = CASES[case]
    want = _run(og, folder, kind, data)
    assert _run(rg, folder, kind, data) == want
    free = _run(og, folder, "", "")[0]  # neither type nor data: no guidance, as genai
    assert _run(rg, folder, "", "")[0] == free != want[0]


@pytest.mark.parametrize("mode", ["batch", "sample", "ff", "beam"])
def test_guided_batch_sample_ff_equal_onnxruntime_genai(genai_folder, og, mode):
    folder = genai_folder("llama", "fp32")
    kw = {"batch": dict(prompts=("The model", "Attention heads read")),
          "sample": dict(do_sample=True, top_k=20, random_seed=3),
          "ff": dict(ff=True), "beam": dict(num_beams=2)}[mode]
    kind, data = CASES["regex-ends" if mode == "ff" else "regex"]
    assert _run(rg, folder, kind, data, **kw) == _run(og, folder, kind, data, **kw)


def test_guided_rewind_starts_the_grammar_over(genai_folder, og):
    folder = genai_folder("llama", "fp32")
    seqs = []
    for mod in (og, rg):
        model = mod.Model(folder)
        params = mod.GeneratorParams(model)
        params.set_search_options(max_length=30)
        params.set_guidance("regex", "(cat|dog)[0-9]{3}")
        gen = mod.Generator(model, params)
        ids = mod.Tokenizer(model).encode("The model")
        gen.append_tokens(ids)
        for _ in range(2):
            gen.generate_next_token()
        gen.rewind_to(0)
        gen.append_tokens(ids)
        while not gen.is_done():
            gen.generate_next_token()
        seqs.append(gen.get_sequence(0).tolist())
    assert seqs[0] == seqs[1]


@pytest.mark.parametrize("kind,data,match", [
    ("regex", "", "Guidance type and data must be provided together"),
    ("", "[a-z]+", "Guidance type and data must be provided together"),
    ("xml", "a", r"Unsupported guidance type: xml \(only json_schema, regex, and lark_grammar"),
    ("regex", "(unclosed", "(?s)Error creating grammar: .*unclosed group"),
    ("json_schema", "{not json", "Error creating grammar: key must be a string"),
])
def test_guidance_errors_match_onnxruntime_genai(genai_folder, og, kind, data, match):
    folder = genai_folder("llama", "fp32")
    for mod, error in ((og, RuntimeError), (rg, errors.RuntimeException)):
        model = mod.Model(folder)
        params = mod.GeneratorParams(model)
        params.set_guidance(kind, data)
        with pytest.raises(error, match=match):
            mod.Generator(model, params)
