"""``onnxrun generate``: the streamed answer is onnxruntime-genai's, the figures are printed."""

from __future__ import annotations

from onnxrun.tools.cli import main


def _og_answer(og, folder, prompt, new):
    model = og.Model(folder)
    tok = og.Tokenizer(model)
    ids = tok.encode(prompt)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(ids) + new)
    gen = og.Generator(model, params)
    gen.append_tokens(ids)
    stream, text = tok.create_stream(), []
    while not gen.is_done():
        gen.generate_next_token()
        text.append(stream.decode(gen.get_next_tokens()[0]))
    return "".join(text)


def test_generate_streams_the_same_answer(genai_folder, og, capsys):
    folder = genai_folder("llama", "int4")
    prompt = "The model runs café 日本語"
    assert main(["generate", folder, "-p", prompt, "-n", "40", "--threads", "1"]) == 0
    captured = capsys.readouterr()
    assert captured.out == _og_answer(og, folder, prompt, 40) + "\n"
    assert "prompt:" in captured.err and "decode: 40 tokens" in captured.err
    assert "tokens/s" in captured.err


def test_generate_batch_and_beams(genai_folder, capsys):
    folder = genai_folder("qwen2", "fp32")
    assert main(["generate", folder, "-p", "a", "-p", "The model runs", "-n", "8"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("[0] ") and "\n[1] " in out and "[2] " not in out
    assert main(["generate", folder, "-p", "a", "-n", "8", "--num-beams", "3"]) == 0
    assert capsys.readouterr().out.startswith("[0] ")


def test_generate_errors_are_one_line(genai_folder, tmp_path, capsys):
    assert main(["generate", str(tmp_path), "-p", "x"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("onnxrun: error: Error opening") and "genai_config.json" in err
    assert err.count("\n") == 1
    folder = genai_folder("llama", "fp32")
    assert main(["generate", folder, "-p", "x", "--max-length", "1"]) == 1
    assert "leaves no room" in capsys.readouterr().err
    assert main(["generate", folder, "-p", "x", "--do-sample", "--top-p", "3"]) == 1
    assert "top_p must be between 0.0 and 1.0" in capsys.readouterr().err
