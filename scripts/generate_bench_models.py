"""Generate the benchmark suite's PyTorch-exported models (random weights) into a cache folder.

Run ``python scripts/generate_bench_models.py [--out DIR] [NAME ...]`` (needs torch; never
imported by the package or the tests). The models are too large for git, so they go to
``$ONNXRUN_BENCH_CACHE`` or ``~/.cache/onnxrun-bench/`` unless ``--out`` says otherwise, one
folder per model: ``NAME/model.onnx`` and one ``NAME/<input>.npy`` per input (realistic values:
token ids over the whole vocabulary, an attention mask of ones and zeros, images in [-1, 1]),
which ``onnxrun bench --input`` and ``benchmarks/run_suite.py`` read.

The building blocks are those of ``scripts/generate_models.py`` (the small test models), at
realistic sizes:

- ``bert_minilm_l6``: BERT encoder in MiniLM-L6's configuration (6 layers, hidden 384, 12 heads,
  intermediate 1536, vocabulary 30522), inputs ``input_ids``/``attention_mask``/
  ``token_type_ids`` of 2 x 128 tokens; dynamic batch and sequence.
- ``gpt_decoder``: GPT-2-style decoder (4 layers, hidden 256, 8 heads, MLP 1024, vocabulary
  8192, tied LM head), 1 x 32 tokens; dynamic batch and sequence.
- ``mobilenet_v2``: MobileNetV2 (width 1.0, inverted residual blocks with depthwise 3x3 convs,
  1000 classes), 1 x 3 x 224 x 224; dynamic batch.
- ``lstm_tagger``: embedding (10000 x 128), 2-layer bidirectional LSTM (hidden 256), per-token
  classifier (10 classes), 1 x 128 tokens; dynamic batch and sequence.

Every model is exported with the TorchScript exporter (``dynamo=False``) and checked against
torch with onnxruntime when it is installed.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import warnings
from pathlib import Path

import numpy as np
import onnx
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import generate_models as gm  # noqa: E402  (the test models' building blocks)

SEED = 4321


def default_cache() -> Path:
    return Path(os.environ.get("ONNXRUN_BENCH_CACHE") or Path.home() / ".cache" / "onnxrun-bench")


class MobileNetV2(nn.Module):
    """MobileNetV2 (Sandler et al. 2018), width 1.0, from generate_models' blocks (whose t=1 block
    keeps its 1x1 expansion conv, a small difference from the paper)."""

    # expansion t, output channels c, repeats n, first stride s
    SETTINGS = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
                (6, 160, 3, 2), (6, 320, 1, 1)]

    def __init__(self, classes: int = 1000) -> None:
        super().__init__()
        layers: list[nn.Module] = [gm.conv_bn(3, 32, 3, 2)]
        cin = 32
        for t, c, n, s in self.SETTINGS:
            for i in range(n):
                layers.append(gm.InvertedResidual(cin, c, s if i == 0 else 1, t))
                cin = c
        layers.append(gm.conv_bn(cin, 1280, 1, 1))
        self.features = nn.Sequential(*layers)
        self.dropout = nn.Dropout(0.2)
        self.classifier = nn.Linear(1280, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.flatten(nn.functional.adaptive_avg_pool2d(self.features(x), 1), 1)
        return self.classifier(self.dropout(x))


def make_bert(rng: np.random.Generator, gen: torch.Generator):
    vocab = 30522
    model = gm.BertTiny(vocab=vocab, hidden=384, heads=12, layers=6, ffn=1536, max_pos=512)
    gm.randomize_norms(model, gen)
    feeds = gm.bert_inputs(rng, 2, 128, vocab=vocab)
    axes = {k: {0: "batch", 1: "sequence"} for k in feeds}
    axes |= {"last_hidden_state": {0: "batch", 1: "sequence"}, "pooler_output": {0: "batch"}}
    return model, feeds, ["last_hidden_state", "pooler_output"], axes, 17


def make_gpt(rng: np.random.Generator, gen: torch.Generator):
    vocab = 8192
    model = gm.GptTiny(vocab=vocab, hidden=256, heads=8, layers=4, ffn=1024, max_pos=128)
    gm.randomize_norms(model, gen)
    feeds = {"input_ids": rng.integers(0, vocab, size=(1, 32), dtype=np.int64)}
    axes = {"input_ids": {0: "batch", 1: "sequence"}, "logits": {0: "batch", 1: "sequence"}}
    return model, feeds, ["logits"], axes, 17


def make_mobilenet(rng: np.random.Generator, gen: torch.Generator):
    model = MobileNetV2()
    gm.randomize_norms(model, gen)
    feeds = {"input": rng.uniform(-1, 1, size=(1, 3, 224, 224)).astype(np.float32)}
    axes = {"input": {0: "batch"}, "logits": {0: "batch"}}
    return model, feeds, ["logits"], axes, 13


def make_lstm(rng: np.random.Generator, gen: torch.Generator):
    vocab = 10000
    model = gm.LstmModel(vocab=vocab, emb=128, hidden=256, classes=10)
    feeds = {"input_ids": rng.integers(0, vocab, size=(1, 128), dtype=np.int64)}
    axes = {"input_ids": {0: "batch", 1: "sequence"}, "logits": {0: "batch", 1: "sequence"}}
    return model, feeds, ["logits"], axes, 14


MODELS = {
    "bert_minilm_l6": make_bert,
    "gpt_decoder": make_gpt,
    "mobilenet_v2": make_mobilenet,
    "lstm_tagger": make_lstm,
}


def export(model: nn.Module, folder: Path, feeds: dict[str, np.ndarray], output_names: list[str],
           dynamic_axes: dict[str, dict[int, str]], opset: int) -> Path:
    model.eval()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "model.onnx"
    args = tuple(torch.from_numpy(v) for v in feeds.values())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, args, str(path), dynamo=False, opset_version=opset,
                          input_names=list(feeds), output_names=output_names,
                          dynamic_axes=dynamic_axes, do_constant_folding=True)
    m = onnx.load(str(path))
    m.producer_name, m.producer_version = "pytorch", torch.__version__
    m.doc_string = (f"onnxrun benchmark model {folder.name} (random weights), generated by "
                    "scripts/generate_bench_models.py")
    onnx.checker.check_model(m)
    onnx.save(m, str(path))
    for name, value in feeds.items():
        np.save(folder / f"{name}.npy", value)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help=f"models (default: all of {', '.join(MODELS)})")
    parser.add_argument("--out", type=Path, default=None,
                        help="cache folder "
                        "(default $ONNXRUN_BENCH_CACHE or ~/.cache/onnxrun-bench)")
    parser.add_argument("--no-check", action="store_true",
                        help="skip the comparison with torch through onnxruntime")
    args = parser.parse_args()
    unknown = set(args.names) - set(MODELS)
    if unknown:
        parser.error(f"unknown model(s): {', '.join(sorted(unknown))}")
    out = args.out or default_cache()
    for name in args.names or list(MODELS):
        seed = SEED + list(MODELS).index(name)  # one seed per model: regenerate one alone
        gm.seed_all(seed)
        rng = np.random.default_rng(seed)
        gen = torch.Generator().manual_seed(seed)
        model, feeds, output_names, axes, opset = MODELS[name](rng, gen)
        path = export(model, out / name, feeds, output_names, axes, opset)
        if not args.no_check:
            gm.check_against_torch(model, path, [feeds])
        ops = collections.Counter(n.op_type for n in gm.all_nodes(onnx.load(str(path)).graph))
        print(f"{name}: {path} ({path.stat().st_size / 2**20:.1f} MiB); "
              + ", ".join(f"{k} {v}" for k, v in sorted(ops.items())))


if __name__ == "__main__":
    main()
