"""Architectures as PyTorch exports them, onnxrun next to onnxruntime (issue #18): Hugging Face
transformers' vision and audio models with random weights (no hub: each built from its config,
He-initialized),
exported once by torch.onnx (TorchScript exporter, opset 17), then timed in one process, the
engines alternating.

    python benchmarks/hf_models.py                     # every model, 1 thread
    python benchmarks/hf_models.py --models regnet,efficientnet --threads 1,2 -r 20

Why: the suite's scripted models follow public architectures, but an exporter's own patterns
(ZeroPad2d's pads computed by a constant subgraph, padding="same" as auto_pad SAME_UPPER on 1x1
convolutions, SE blocks, grouped bottlenecks) decide which of onnxrun's paths a real model
takes. Needs torch and transformers (``pip install torch==2.13.0 transformers``); the
exported files go to the cache folder ($ONNXRUN_BENCH_CACHE or ~/.cache/onnxrun-bench/hf).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

from onnxrun.tools.bench import BenchOptions, bench

# name -> (transformers config class, model class, config arguments, input, row label)
MODELS = {
    "efficientnet": ("EfficientNetConfig", "EfficientNetForImageClassification", {},
                     (1, 3, 224, 224), "EfficientNet (default config: B7 widths) 224"),
    "regnet": ("RegNetConfig", "RegNetForImageClassification", {}, (1, 3, 224, 224),
               "RegNet (default config: grouped 3x3, 64 a group) 224"),
    "convnext": ("ConvNextConfig", "ConvNextForImageClassification",
                 {"depths": [3, 3, 9, 3], "hidden_sizes": [96, 192, 384, 768]},
                 (1, 3, 224, 224), "ConvNeXt-T 224"),
    "mobilevit": ("MobileViTConfig", "MobileViTForImageClassification", {}, (1, 3, 224, 224),
                  "MobileViT-S 224"),
    "vit": ("ViTConfig", "ViTForImageClassification",
            {"hidden_size": 192, "num_hidden_layers": 12, "num_attention_heads": 3,
             "intermediate_size": 768}, (1, 3, 224, 224), "ViT-Ti/16 224"),
    "swin": ("SwinConfig", "SwinForImageClassification", {}, (1, 3, 224, 224), "Swin-T 224"),
    "segformer": ("SegformerConfig", "SegformerModel", {}, (1, 3, 512, 512),
                  "SegFormer-B0 512"),
    "mobilenet_v1": ("MobileNetV1Config", "MobileNetV1Model", {}, (1, 3, 224, 224),
                     "MobileNetV1 224"),
    "levit": ("LevitConfig", "LevitModel", {}, (1, 3, 224, 224), "LeViT-128S 224"),
    "poolformer": ("PoolFormerConfig", "PoolFormerModel", {}, (1, 3, 224, 224),
                   "PoolFormer-S12 224"),
    "cvt": ("CvtConfig", "CvtModel", {}, (1, 3, 224, 224), "CvT-13 224"),
    "convnextv2": ("ConvNextV2Config", "ConvNextV2Model",
                   {"depths": [2, 2, 6, 2], "hidden_sizes": [40, 80, 160, 320]},
                   (1, 3, 224, 224), "ConvNeXt-V2-Atto 224"),
    "dinov2": ("Dinov2Config", "Dinov2Model",
               {"hidden_size": 384, "num_hidden_layers": 12, "num_attention_heads": 6},
               (1, 3, 224, 224), "DINOv2-S/14 224"),
    "bit": ("BitConfig", "BitModel", {}, (1, 3, 224, 224), "BiT-R50x1 224 (weight-standardized)"),
    "wav2vec2": ("Wav2Vec2Config", "Wav2Vec2Model",
                 {"hidden_size": 384, "num_hidden_layers": 6, "num_attention_heads": 6,
                  "intermediate_size": 1536}, (1, 16000), "wav2vec2-style encoder (6 x 384), 1 s"),
    "whisper_encoder": ("WhisperConfig", "WhisperModel",
                        {"d_model": 384, "encoder_layers": 4, "encoder_attention_heads": 6,
                         "decoder_layers": 1, "decoder_attention_heads": 6,
                         "encoder_ffn_dim": 1536, "decoder_ffn_dim": 1536},
                        (1, 80, 3000), "Whisper-tiny-style encoder, 30 s"),
}


def export(name: str, folder: Path) -> Path:
    """The model's ONNX file in ``folder``, exported (random weights, seed 0) if missing."""
    path = folder / f"{name}.onnx"
    if path.is_file():
        return path
    import torch
    import transformers

    config_cls, model_cls, args, shape, _ = MODELS[name]
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(getattr(transformers, config_cls)(**args)).eval()
    # He-initialized weights and unit norms: transformers' own initialization leaves some of
    # these models' features at zero (EfficientNet) or subnormal (MobileViT), which would hide
    # any difference between the engines and time subnormal arithmetic
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.Conv1d | torch.nn.Conv2d | torch.nn.Linear):
                torch.nn.init.kaiming_normal_(module.weight)
                if module.bias is not None:
                    torch.nn.init.normal_(module.bias, 0.0, 0.02)
            elif isinstance(module, torch.nn.BatchNorm1d | torch.nn.BatchNorm2d | torch.nn.LayerNorm
                                     | torch.nn.GroupNorm):
                if module.weight is not None:
                    torch.nn.init.ones_(module.weight)
                    torch.nn.init.zeros_(module.bias)
                if isinstance(module, torch.nn.BatchNorm1d | torch.nn.BatchNorm2d):
                    module.momentum = 1.0  # the statistics of the calibration batch below
        # BatchNormalization statistics of one random batch, as training would have set them
        # (without them EfficientNet's activations grow to ~1e4 and onnxruntime's own
        # optimization levels disagree by half of that: no oracle)
        if any(isinstance(m, torch.nn.BatchNorm1d | torch.nn.BatchNorm2d) for m in model.modules()):
            model.train()
            model(torch.randn(4, *shape[1:]))
            model.eval()

    class Wrapped(torch.nn.Module):  # the backbone's features, not the output dict: a
        # randomly initialized classifier (zeros in transformers) would hide any difference
        def __init__(self) -> None:
            super().__init__()
            self.inner = model.encoder if name == "whisper_encoder" else model.base_model

        def forward(self, x):
            return self.inner(x).last_hidden_state

    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f"{name}.onnx.tmp"
    torch.onnx.export(Wrapped(), (torch.randn(*shape),), str(tmp), opset_version=17,
                      input_names=["input"], dynamo=False)
    os.replace(tmp, path)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="", help="comma-separated names (default: all)")
    parser.add_argument("--threads", default="1", help="intra-op thread counts (default 1)")
    parser.add_argument("-r", "--repeat", type=int, default=10, help="timed runs per engine")
    parser.add_argument("--cache", type=Path, default=None, help="where the exports are kept")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.models.split(",") if n.strip()] or list(MODELS)
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        parser.error(f"unknown models {unknown}; known: {', '.join(MODELS)}")
    folder = args.cache or Path(os.environ.get("ONNXRUN_BENCH_CACHE")
                                or Path.home() / ".cache" / "onnxrun-bench") / "hf"
    counts = [int(t) for t in args.threads.split(",")]
    header = "| model | " + " | ".join(
        f"onnxrun {t}T | onnxruntime {t}T | ratio {t}T" for t in counts) + " |"
    rows, ratios = [], {t: [] for t in counts}
    for name in names:
        path = str(export(name, folder))
        cells = []
        for t in counts:
            opts = BenchOptions(repeat=args.repeat, intra_op_threads=t, isolate=False)
            result = bench(path, opts, vs="onnxruntime")
            a, b = (result.engine(e).stats.median for e in ("onnxrun", "onnxruntime"))
            ratios[t].append(a / b)
            cells += [f"{a * 1e3:.2f} ms", f"{b * 1e3:.2f} ms", f"{a / b:.2f}"]
            print(f"{name} {t}T: onnxrun {a * 1e3:.2f} ms, onnxruntime {b * 1e3:.2f} ms, "
                  f"max |diff| {result.max_abs_diff:.2g}", file=sys.stderr)
        rows.append(f"| {MODELS[name][4]} | " + " | ".join(cells) + " |")
    print(header)
    print("|---|" + "---:|" * (3 * len(counts)))
    print("\n".join(rows))
    geo = [f"{statistics.geometric_mean(ratios[t]):.2f}" for t in counts]
    print("| **geometric mean** | " + " | ".join(f" | | **{g}**" for g in geo) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
