"""Build onnxruntime-genai model folders offline, for the genai tests and benchmarks.

A recipe is an architecture (llama, qwen2, phi3), a size (tiny, small, 0.5b) and a format: int4,
fp32 or fp16 through onnxruntime-genai's model builder (GroupQueryAttention, MatMulNBits; fp16
with ``-e cpu`` is built, but with MultiHeadAttention and no shared KV buffer), or
``optimum`` / ``optimum-nopos``: a plain-ONNX export through torch.onnx with Hugging Face
Optimum's names (``past_key_values.%d.key`` / ``present.%d.key``; with or without a
``position_ids`` input: without, the graph derives positions from the attention mask) and a
genai_config.json written here as a user would. Each folder is built from:

- a checkpoint with random weights saved by transformers (seeded, so the folder is the same on
  every machine with the same versions);
- a byte-level BPE tokenizer trained with ``tokenizers`` on text generated here (several
  scripts, so tokens that split multi-byte characters occur);
- onnxruntime-genai's builder (``python -m onnxruntime_genai.models.builder``) for int4 / fp32,
  or torch.onnx's exporter for the plain-ONNX formats.

Folders are cached under ``$ONNXRUN_GENAI_MODELS`` (default ``~/.cache/onnxrun/genai-models``)
keyed by a hash of the recipe and the versions of the packages that make them. Needs torch,
transformers, tokenizers and onnxruntime-genai (the ``genai-test`` extra)::

    python tests/genai/make_models.py --arch llama --size tiny --format int4
    python tests/genai/make_models.py --all-tiny
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import sys
import tempfile
from pathlib import Path

ARCHS = ("llama", "qwen2", "phi3")
FORMATS = ("int4", "fp32", "fp16", "optimum", "optimum-nopos")
# Recipe format version: bump when the build below changes what it writes.
_RECIPE_VERSION = 2

# hidden, layers, heads, kv heads, intermediate, vocab
SIZES = {
    "tiny": dict(hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128, vocab=512),
    # the overhead model: 4 layers, hidden 256
    "small": dict(hidden=256, layers=4, heads=8, kv_heads=4, intermediate=768, vocab=4096),
    # about 0.5B parameters (Qwen2.5-0.5B's shape with a smaller vocabulary)
    "0.5b": dict(hidden=896, layers=24, heads=14, kv_heads=2, intermediate=4864, vocab=32000),
}
CONTEXT = {"tiny": 512, "small": 2048, "0.5b": 2048}

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<pad>"]
EOS, PAD = "<|endoftext|>", "<pad>"
# a second EOS id (onnxruntime-genai accepts a list): the chat end marker
EOS2 = "<|im_end|>"

_WORDS = (
    "the a model token layer cache prompt answer question runs fast slow memory weight "
    "attention head rotary embedding query key value batch sequence length beam sample greedy "
    "onnx runtime python numpy kernel graph node tensor shape float int block quantized "
    "river mountain city light stone paper window garden morning evening winter summer"
).split()
# several scripts, so byte-level BPE merges split and join multi-byte characters
_FOREIGN = (
    "café naïve façade crème brûlée Ærø smörgåsbord Straße Übermut",
    "Привет мир, как дела? Москва Санкт-Петербург",
    "Γειά σου κόσμε, ελληνικά γράμματα",
    "日本語のテキスト、東京と京都。漢字とひらがな",
    "中文文本，北京和上海。你好世界",
    "한국어 텍스트 서울 부산",
    "emoji 🙂 🚀 🌍 ✨ 👍🏽 and symbols € £ ¥ § ¶ → ∑ ∞",
    "עברית ועוד العربية نص",
)


def corpus(n_lines: int = 4000, seed: int = 0) -> list[str]:
    """Deterministic training text for the tokenizer."""
    rng = random.Random(seed)
    lines = []
    for i in range(n_lines):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(4, 16))]
        if i % 3 == 0:
            words.insert(rng.randint(0, len(words)), rng.choice(_FOREIGN))
        if i % 7 == 0:
            words.append(str(rng.randint(0, 100000)))
        line = " ".join(words)
        lines.append(line[0].upper() + line[1:] + rng.choice([".", "?", "!", ",", ":"]))
    return lines


def _versions() -> dict[str, str]:
    import importlib.metadata as md

    return {p: md.version(p) for p in ("torch", "transformers", "tokenizers", "onnxruntime-genai")}


def cache_root() -> Path:
    root = os.environ.get("ONNXRUN_GENAI_MODELS")
    return Path(root) if root else Path.home() / ".cache" / "onnxrun" / "genai-models"


def recipe_key(arch: str, size: str, fmt: str, extra: dict | None = None) -> str:
    recipe = {"v": _RECIPE_VERSION, "arch": arch, "size": size, "format": fmt,
              "extra": extra or {}, "versions": _versions()}
    digest = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]
    return f"{arch}-{size}-{fmt}-{digest}"


def missing_packages() -> list[str]:
    """The packages a build needs that are not installed (empty when it can run)."""
    import importlib.util

    need = {"torch": "torch", "transformers": "transformers", "tokenizers": "tokenizers",
            "onnxruntime_genai": "onnxruntime-genai", "onnxruntime": "onnxruntime"}
    return [pkg for mod, pkg in need.items() if importlib.util.find_spec(mod) is None]


def train_tokenizer(vocab: int, out: Path) -> None:
    """A byte-level BPE tokenizer.json + tokenizer_config.json in ``out``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(corpus(), trainer=trainer)
    tok.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "Qwen2Tokenizer", "model_max_length": 32768,
        "eos_token": EOS, "pad_token": PAD, "bos_token": None, "unk_token": None,
        "add_bos_token": False, "add_prefix_space": False, "clean_up_tokenization_spaces": False,
        "errors": "replace",
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2))


def _hf_config(arch: str, size: str, tok_dir: Path):
    import transformers
    from tokenizers import Tokenizer

    s = SIZES[size]
    tok = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    ids = {t: tok.token_to_id(t) for t in SPECIALS}
    common = dict(
        vocab_size=tok.get_vocab_size(), hidden_size=s["hidden"],
        num_hidden_layers=s["layers"], num_attention_heads=s["heads"],
        num_key_value_heads=s["kv_heads"], intermediate_size=s["intermediate"],
        max_position_embeddings=CONTEXT[size], eos_token_id=[ids[EOS], ids[EOS2]],
        pad_token_id=ids[PAD], bos_token_id=ids[EOS], tie_word_embeddings=False,
        rms_norm_eps=1e-5,
    )
    if arch == "llama":
        return transformers.LlamaConfig(**common, rope_theta=10000.0)
    if arch == "qwen2":
        return transformers.Qwen2Config(**common, rope_theta=1000000.0)
    if arch == "phi3":
        return transformers.Phi3Config(**common, rope_theta=10000.0,
                                       original_max_position_embeddings=CONTEXT[size])
    raise ValueError(f"unknown architecture {arch!r}; expected one of {ARCHS}")


def save_checkpoint(arch: str, size: str, out: Path, seed: int = 0) -> None:
    """A Hugging Face checkpoint with random weights (and its tokenizer) in ``out``."""
    import torch
    import transformers

    out.mkdir(parents=True, exist_ok=True)
    train_tokenizer(SIZES[size]["vocab"], out)
    config = _hf_config(arch, size, out)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    # random init at std 0.02 gives near-uniform logits; scale up so greedy choices are clear
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.08 if "embed" not in name else 1.0)
        # special tokens score 0: EOS stays possible but rare, so runs reach their max_length
        model.lm_head.weight[[config.pad_token_id, *config.eos_token_id]] = 0.0
    model.save_pretrained(out, safe_serialization=True)
    transformers.GenerationConfig(eos_token_id=config.eos_token_id,
                                  pad_token_id=config.pad_token_id).save_pretrained(out)


def run_builder(ckpt: Path, out: Path, precision: str, extra: dict | None = None) -> None:
    """onnxruntime-genai's builder, run in this process (its command line, without paying for
    a second import of torch and transformers)."""
    import contextlib
    import io
    import runpy

    with tempfile.TemporaryDirectory() as cache:
        argv = ["builder", "-i", str(ckpt), "-o", str(out), "-p", precision, "-e", "cpu",
                "-c", cache]
        if extra:
            argv += ["--extra_options", *(f"{k}={v}" for k, v in extra.items())]
        log = io.StringIO()
        saved = sys.argv
        try:
            sys.argv = argv
            with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
                runpy.run_module("onnxruntime_genai.models.builder", run_name="__main__")
        except BaseException as exc:
            raise RuntimeError(f"model builder failed ({' '.join(argv)}):\n"
                               f"{log.getvalue()[-3000:]}") from exc
        finally:
            sys.argv = saved
        if not (out / "genai_config.json").exists():
            raise RuntimeError("model builder wrote no genai_config.json:\n"
                               f"{log.getvalue()[-3000:]}")


def export_plain(ckpt: Path, out: Path, position_ids: bool = True) -> None:
    """Optimum-style plain ONNX (MatMul, Softmax attention; the cache is past in, present out)
    through torch.onnx, and the genai_config.json a user writes for it."""
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    cfg = model.config
    layers = cfg.num_hidden_layers
    head = cfg.hidden_size // cfg.num_attention_heads
    kv = cfg.num_key_value_heads

    class Decoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.m = model

        def forward(self, input_ids, attention_mask, *rest):
            if position_ids:
                pos, past = rest[0], rest[1:]
            else:  # positions from the mask, as Optimum's exports without position_ids do
                pos = (attention_mask.cumsum(-1) - 1).clamp(min=0)[:, -input_ids.shape[1]:]
                past = rest
            cache = transformers.DynamicCache(config=cfg)
            for i in range(layers):
                cache.update(past[2 * i], past[2 * i + 1], i)
            res = self.m(input_ids=input_ids, attention_mask=attention_mask, position_ids=pos,
                         past_key_values=cache, use_cache=True)
            flat = [res.logits]
            for layer in res.past_key_values.layers:
                flat += [layer.keys, layer.values]
            return tuple(flat)

    batch, seq, past_len = 2, 3, 4
    feeds = [torch.randint(0, 100, (batch, seq)),
             torch.ones(batch, past_len + seq, dtype=torch.int64)]
    names_in = ["input_ids", "attention_mask"]
    dyn = {"input_ids": {0: "batch_size", 1: "sequence_length"},
           "attention_mask": {0: "batch_size", 1: "total_sequence_length"},
           "logits": {0: "batch_size", 1: "sequence_length"}}
    if position_ids:
        feeds.append(torch.arange(past_len, past_len + seq).expand(batch, seq))
        names_in.append("position_ids")
        dyn["position_ids"] = {0: "batch_size", 1: "sequence_length"}
    past_names = [f"past_key_values.{i}.{t}" for i in range(layers) for t in ("key", "value")]
    present_names = [f"present.{i}.{t}" for i in range(layers) for t in ("key", "value")]
    feeds += [torch.randn(batch, kv, past_len, head) for _ in past_names]
    dyn.update({n: {0: "batch_size", 2: "past_sequence_length"} for n in past_names})
    dyn.update({n: {0: "batch_size", 2: "total_sequence_length"} for n in present_names})
    out.mkdir(parents=True)
    import contextlib
    import io
    import warnings

    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        torch.onnx.export(Decoder(), tuple(feeds), str(out / "model.onnx"),
                          input_names=names_in + past_names,
                          output_names=["logits", *present_names], dynamic_axes=dyn,
                          opset_version=17, dynamo=False)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(ckpt / name, out / name)
    eos = cfg.eos_token_id if isinstance(cfg.eos_token_id, list) else [cfg.eos_token_id]
    inputs = {"input_ids": "input_ids", "attention_mask": "attention_mask",
              "past_key_names": "past_key_values.%d.key",
              "past_value_names": "past_key_values.%d.value"}
    if position_ids:
        inputs["position_ids"] = "position_ids"
    config = {
        "model": {
            "type": cfg.model_type, "context_length": cfg.max_position_embeddings,
            "vocab_size": cfg.vocab_size, "eos_token_id": eos, "pad_token_id": cfg.pad_token_id,
            "bos_token_id": cfg.bos_token_id,
            "decoder": {
                "filename": "model.onnx", "head_size": head, "hidden_size": cfg.hidden_size,
                "num_attention_heads": cfg.num_attention_heads, "num_key_value_heads": kv,
                "num_hidden_layers": layers, "session_options": {"provider_options": []},
                "inputs": inputs,
                "outputs": {"logits": "logits", "present_key_names": "present.%d.key",
                            "present_value_names": "present.%d.value"},
            },
        },
        "search": {"max_length": cfg.max_position_embeddings,
                   "past_present_share_buffer": False},
    }
    (out / "genai_config.json").write_text(json.dumps(config, indent=2))


def checkpoint(arch: str, size: str, root: Path) -> Path:
    """The cached Hugging Face checkpoint (random weights, trained tokenizer) of a recipe."""
    final = root / recipe_key(arch, size, "hf")
    if (final / "config.json").exists():
        return final
    root.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".build-", dir=root))
    try:
        save_checkpoint(arch, size, work / "hf")
        _publish(work / "hf", final, "config.json")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return final


def _publish(built: Path, final: Path, marker: str) -> None:
    try:
        built.rename(final)  # atomic: a concurrent build of the same recipe wins or loses whole
    except OSError:
        if not (final / marker).exists():
            raise


def build(arch: str, size: str = "tiny", fmt: str = "fp32", extra: dict | None = None,
          root: Path | None = None) -> Path:
    """The cached model folder of a recipe, building it first if needed."""
    if arch not in ARCHS or size not in SIZES or fmt not in FORMATS:
        raise ValueError(f"unknown recipe {arch}/{size}/{fmt}")
    root = root or cache_root()
    final = root / recipe_key(arch, size, fmt, extra)
    if (final / "genai_config.json").exists():
        return final
    ckpt = checkpoint(arch, size, root)
    work = Path(tempfile.mkdtemp(prefix=".build-", dir=root))
    try:
        out = work / "out"
        if fmt.startswith("optimum"):
            export_plain(ckpt, out, position_ids=fmt == "optimum")
        else:
            run_builder(ckpt, out, fmt, extra)
        _publish(out, final, "genai_config.json")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return final


LORA_RANK = 4
LORA_ADAPTERS = ("adapter_a", "adapter_b")


def build_lora(arch: str = "llama", size: str = "tiny", root: Path | None = None) -> Path:
    """A LoRA folder as Olive writes them, made from the fp32 builder folder: each MLP
    ``down_proj`` and the ``lm_head`` MatMul get a LoRA path (``x @ lora_A @ lora_B`` added to the
    product) whose weights are graph inputs with zero initializers, so the base model runs
    unchanged and an adapter file overrides them by name. Beside model.onnx: two adapter files
    (``adapter_a`` / ``adapter_b``.onnx_adapter, seeded random weights written with onnxruntime's
    AdapterFormat) of different ranks, large enough to change the greedy tokens."""
    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    root = root or cache_root()
    final = root / recipe_key(arch, size, "lora", {"rank": LORA_RANK})
    if (final / "genai_config.json").exists():
        return final
    base = build(arch, size, "fp32", root=root)
    work = Path(tempfile.mkdtemp(prefix=".build-", dir=root))
    try:
        out = work / "out"
        shutil.copytree(base, out, ignore=shutil.ignore_patterns("model.onnx*"))
        m = onnx.load(str(base / "model.onnx"))  # external data loaded in memory
        g = m.graph
        shapes = {t.name: list(t.dims) for t in g.initializer}
        targets = [n for n in g.node if n.op_type == "MatMul"
                   and (n.name.endswith("down_proj/MatMul") or n.name == "/lm_head/MatMul")]
        rng = np.random.default_rng(7)
        adapters: dict[str, dict[str, np.ndarray]] = {a: {} for a in LORA_ADAPTERS}
        nodes = list(g.node)
        for node in targets:
            k, n = shapes[node.input[1]]
            stem = node.input[1].removesuffix(".MatMul.weight")
            a_name, b_name = f"{stem}.lora_A.weight", f"{stem}.lora_B.weight"
            for name, dims in ((a_name, [k, "lora_rank"]), (b_name, ["lora_rank", n])):
                g.input.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, dims))
            g.initializer.append(numpy_helper.from_array(
                np.zeros((k, LORA_RANK), np.float32), a_name))
            g.initializer.append(numpy_helper.from_array(
                np.zeros((LORA_RANK, n), np.float32), b_name))
            base_out = node.output[0]
            node.output[0] = f"{node.name}/base_output_0"
            lora = [helper.make_node("MatMul", [node.input[0], a_name], [f"{node.name}/lora_A"]),
                    helper.make_node("MatMul", [f"{node.name}/lora_A", b_name],
                                     [f"{node.name}/lora_B"]),
                    helper.make_node("Add", [node.output[0], f"{node.name}/lora_B"],
                                     [base_out])]
            nodes[nodes.index(node) + 1:nodes.index(node) + 1] = lora
            for i, adapter in enumerate(LORA_ADAPTERS):
                rank = LORA_RANK * (i + 1)
                adapters[adapter][a_name] = rng.normal(0, 0.5, (k, rank)).astype(np.float32)
                adapters[adapter][b_name] = rng.normal(0, 0.5, (rank, n)).astype(np.float32)
        del g.node[:]
        g.node.extend(nodes)
        onnx.save(m, str(out / "model.onnx"), save_as_external_data=True,
                  location="model.onnx.data")
        for adapter, params in adapters.items():
            fmt = ort.AdapterFormat()
            fmt.set_adapter_version(1)
            fmt.set_model_version(1)
            fmt.set_parameters({k: ort.OrtValue.ortvalue_from_numpy(v) for k, v in params.items()})
            fmt.export_adapter(str(out / f"{adapter}.onnx_adapter"))
        _publish(out, final, "genai_config.json")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return final


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arch", choices=ARCHS, default="llama")
    ap.add_argument("--size", choices=tuple(SIZES), default="tiny")
    ap.add_argument("--format", choices=FORMATS, default="int4")
    ap.add_argument("--extra", nargs="*", default=[], metavar="KEY=VALUE",
                    help="builder --extra_options (e.g. accuracy_level=4 block_size=64)")
    ap.add_argument("--all-tiny", action="store_true", help="every tiny folder the tests use")
    args = ap.parse_args(argv)
    missing = missing_packages()
    if missing:
        print(f"missing packages: {', '.join(missing)} (pip install -e '.[genai-test]')",
              file=sys.stderr)
        return 2
    if args.all_tiny:
        for arch in ARCHS:
            for fmt in ("int4", "fp32"):
                print(build(arch, "tiny", fmt))
        return 0
    extra = dict(kv.split("=", 1) for kv in args.extra)
    print(build(args.arch, args.size, args.format, extra or None))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
