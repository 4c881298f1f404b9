"""Generate the small real-world test models under ``tests/models/``.

Run with ``python scripts/generate_models.py`` (needs torch; the package and the tests never
import this file). Every model gets random weights from a fixed seed, is exported with
torch's TorchScript exporter (``torch.onnx.export(..., dynamo=False)``), and is saved next to
``<name>.inputs.npz``: deterministic sample inputs, so the tests need neither torch nor a
random generator. The npz holds one or more cases; key ``"<case>/<input name>"`` (cases
``"0"``, ``"1"``, ... differ in batch/sequence size to exercise the dynamic axes).

``if_model.onnx`` is built with ``onnx.helper`` directly: the TorchScript exporter only emits
``If`` for scripted modules, and a hand-built graph controls exactly what the branches capture.
"""

from __future__ import annotations

import argparse
import collections
import math
import random
import warnings
from pathlib import Path

import numpy as np
import onnx
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper, numpy_helper
from torch import nn

OUT_DIR = Path(__file__).resolve().parent.parent / "tests" / "models"
SEED = 1234


def seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def randomize_norms(module: nn.Module, gen: torch.Generator) -> None:
    """Give LayerNorm/BatchNorm non-trivial affine parameters and running statistics."""
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, nn.LayerNorm | nn.BatchNorm2d):
                m.weight.copy_(1.0 + 0.1 * torch.randn(m.weight.shape, generator=gen))
                m.bias.copy_(0.1 * torch.randn(m.bias.shape, generator=gen))
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.copy_(0.1 * torch.randn(m.running_mean.shape, generator=gen))
                m.running_var.copy_(0.5 + torch.rand(m.running_var.shape, generator=gen))


# -- BERT-style encoder -------------------------------------------------------------------------

class BertSelfAttention(nn.Module):
    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)
        self.value = nn.Linear(hidden, hidden)
        self.out = nn.Linear(hidden, hidden)
        self.norm = nn.LayerNorm(hidden, eps=1e-12)

    def split(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        return x.view(b, s, self.heads, self.head_dim).permute(0, 2, 1, 3)

    def forward(self, x: torch.Tensor, additive_mask: torch.Tensor) -> torch.Tensor:
        q, k, v = self.split(self.query(x)), self.split(self.key(x)), self.split(self.value(x))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim)
        probs = torch.softmax(scores + additive_mask, dim=-1)
        ctx = torch.matmul(probs, v).permute(0, 2, 1, 3).contiguous()
        ctx = ctx.view(ctx.shape[0], ctx.shape[1], -1)
        return self.norm(self.out(ctx) + x)


class BertLayer(nn.Module):
    def __init__(self, hidden: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.attention = BertSelfAttention(hidden, heads)
        self.intermediate = nn.Linear(hidden, ffn)
        self.act = nn.GELU()  # exact (erf) GELU, as BERT
        self.output = nn.Linear(ffn, hidden)
        self.norm = nn.LayerNorm(hidden, eps=1e-12)

    def forward(self, x: torch.Tensor, additive_mask: torch.Tensor) -> torch.Tensor:
        h = self.attention(x, additive_mask)
        return self.norm(self.output(self.act(self.intermediate(h))) + h)


class BertTiny(nn.Module):
    def __init__(self, vocab=256, hidden=64, heads=4, layers=2, ffn=128, max_pos=64, types=2):
        super().__init__()
        self.word = nn.Embedding(vocab, hidden)
        self.position = nn.Embedding(max_pos, hidden)
        self.token_type = nn.Embedding(types, hidden)
        self.norm = nn.LayerNorm(hidden, eps=1e-12)
        self.layers = nn.ModuleList(BertLayer(hidden, heads, ffn) for _ in range(layers))
        self.pooler = nn.Linear(hidden, hidden)

    def forward(self, input_ids, attention_mask, token_type_ids):
        seq = input_ids.shape[1]
        pos = torch.arange(seq, dtype=torch.long, device=input_ids.device).unsqueeze(0)
        x = self.word(input_ids) + self.position(pos) + self.token_type(token_type_ids)
        x = self.norm(x)
        # HF's extended attention mask: 0 where attended, dtype-min where padded.
        ext = attention_mask[:, None, None, :].to(x.dtype)
        ext = (1.0 - ext) * torch.finfo(x.dtype).min
        for layer in self.layers:
            x = layer(x, ext)
        pooled = torch.tanh(self.pooler(x[:, 0]))
        return x, pooled


def bert_inputs(rng: np.random.Generator, batch: int, seq: int, vocab: int = 256):
    ids = rng.integers(0, vocab, size=(batch, seq), dtype=np.int64)
    mask = np.ones((batch, seq), dtype=np.int64)
    for b in range(1, batch):  # right padding of varying length, row 0 unpadded
        mask[b, seq - min(3 * b, seq - 1):] = 0
    types = np.zeros((batch, seq), dtype=np.int64)
    types[:, seq // 2:] = 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}


# -- GPT-style decoder --------------------------------------------------------------------------

class GptBlock(nn.Module):
    def __init__(self, hidden: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.ln1 = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.ln2 = nn.LayerNorm(hidden)
        self.fc = nn.Linear(hidden, ffn)
        self.act = nn.GELU(approximate="tanh")  # GPT-2's "gelu_new"
        self.fc_out = nn.Linear(ffn, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(h, dim=-1)
        q, k, v = (t.view(b, s, self.heads, self.head_dim).transpose(1, 2) for t in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))
        causal = torch.tril(torch.ones(s, s, dtype=torch.bool, device=x.device))
        scores = scores.masked_fill(~causal, float("-inf"))
        att = F.softmax(scores, dim=-1) @ v
        x = x + self.proj(att.transpose(1, 2).reshape(b, s, h))
        return x + self.fc_out(self.act(self.fc(self.ln2(x))))


class GptTiny(nn.Module):
    def __init__(self, vocab=256, hidden=64, heads=4, layers=2, ffn=128, max_pos=64):
        super().__init__()
        self.wte = nn.Embedding(vocab, hidden)
        self.wpe = nn.Embedding(max_pos, hidden)
        self.blocks = nn.ModuleList(GptBlock(hidden, heads, ffn) for _ in range(layers))
        self.ln_f = nn.LayerNorm(hidden)
        with torch.no_grad():
            self.wte.weight.mul_(0.1)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.wte(input_ids) + self.wpe(pos)[None]
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x) @ self.wte.weight.t()  # tied LM head


# -- MobileNetV2-style CNN with an upsampling head ---------------------------------------------

def conv_bn(cin: int, cout: int, k: int, stride: int, groups: int = 1, act: bool = True):
    layers = [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False),
              nn.BatchNorm2d(cout)]
    if act:
        layers.append(nn.ReLU6())
    return nn.Sequential(*layers)


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand: int) -> None:
        super().__init__()
        mid = cin * expand
        self.use_res = stride == 1 and cin == cout
        self.block = nn.Sequential(
            conv_bn(cin, mid, 1, 1),
            conv_bn(mid, mid, 3, stride, groups=mid),  # depthwise
            conv_bn(mid, cout, 1, 1, act=False),  # linear bottleneck
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.block(x)
        return x + y if self.use_res else y


class MobileNetTiny(nn.Module):
    def __init__(self, classes: int = 10, seg_classes: int = 3) -> None:
        super().__init__()
        self.stem = conv_bn(3, 8, 3, 2)  # 32x32
        self.features = nn.Sequential(
            InvertedResidual(8, 8, 1, 1),
            InvertedResidual(8, 12, 2, 4),  # 16x16
            InvertedResidual(12, 12, 1, 4),
            InvertedResidual(12, 16, 2, 4),  # 8x8
            InvertedResidual(16, 16, 1, 4),
        )
        # A BatchNorm not preceded by a Conv survives the exporter's Conv+BN fusion.
        self.post_norm = nn.BatchNorm2d(16)
        self.classifier = nn.Linear(16, classes)
        self.up1 = nn.Upsample(scale_factor=2, mode="nearest")  # 16x16
        self.head1 = conv_bn(16, 12, 3, 1)
        self.deconv = nn.ConvTranspose2d(12, 8, kernel_size=4, stride=2, padding=1)  # 32x32
        self.head2 = nn.Conv2d(8, seg_classes, 1)

    def forward(self, x: torch.Tensor):
        f = self.post_norm(self.features(self.stem(x)))
        logits = self.classifier(torch.flatten(F.adaptive_avg_pool2d(f, 1), 1))
        y = self.head1(self.up1(f))
        y = F.relu(self.deconv(y))
        y = F.interpolate(self.head2(y), scale_factor=2.0, mode="bilinear",
                          align_corners=False)  # 64x64
        return logits, y


# -- recurrent models ---------------------------------------------------------------------------

class LstmModel(nn.Module):
    def __init__(self, vocab=100, emb=16, hidden=24, classes=5):
        super().__init__()
        self.emb = nn.Embedding(vocab, emb)
        self.lstm = nn.LSTM(emb, hidden, num_layers=2, bidirectional=True, batch_first=True)
        self.fc = nn.Linear(2 * hidden, classes)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(self.emb(input_ids))
        return self.fc(out)


class GruModel(nn.Module):
    def __init__(self, features=12, hidden=20, out=4):
        super().__init__()
        self.gru = nn.GRU(features, hidden, num_layers=1, batch_first=True)
        self.fc = nn.Linear(hidden, out)

    def forward(self, x: torch.Tensor):
        seq_out, h_n = self.gru(x)
        return self.fc(seq_out), h_n


# -- export helpers -----------------------------------------------------------------------------

def export(model: nn.Module, name: str, example: dict[str, np.ndarray], output_names: list[str],
           dynamic_axes: dict[str, dict[int, str]], opset: int) -> Path:
    model.eval()
    path = OUT_DIR / f"{name}.onnx"
    args = tuple(torch.from_numpy(v) for v in example.values())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model, args, str(path), dynamo=False, opset_version=opset,
            input_names=list(example), output_names=output_names, dynamic_axes=dynamic_axes,
            do_constant_folding=True,
        )
    m = onnx.load(str(path))
    m.producer_name, m.producer_version = "pytorch", torch.__version__
    m.doc_string = f"onnxrun test model {name}, generated by scripts/generate_models.py"
    onnx.checker.check_model(m, full_check=True)
    onnx.save(m, str(path))
    return path


def save_inputs(name: str, cases: list[dict[str, np.ndarray]]) -> None:
    flat = {f"{i}/{k}": v for i, case in enumerate(cases) for k, v in case.items()}
    np.savez_compressed(OUT_DIR / f"{name}.inputs.npz", **flat)


def check_against_torch(model: nn.Module, path: Path, cases: list[dict[str, np.ndarray]]) -> None:
    """Sanity check with onnxruntime when it is installed (not required to generate)."""
    try:
        import onnxruntime as ort
    except ImportError:
        return
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for case in cases:
        with torch.no_grad():
            ref = model(*(torch.from_numpy(v) for v in case.values()))
        ref = [ref] if isinstance(ref, torch.Tensor) else list(ref)
        got = sess.run(None, case)
        for r, g in zip(ref, got, strict=True):
            np.testing.assert_allclose(g, r.numpy(), rtol=1e-3, atol=1e-4)


# -- the models ---------------------------------------------------------------------------------

def make_bert(rng: np.random.Generator, gen: torch.Generator) -> None:
    model = BertTiny()
    randomize_norms(model, gen)
    cases = [bert_inputs(rng, 2, 16), bert_inputs(rng, 3, 11)]
    axes = {k: {0: "batch", 1: "sequence"} for k in cases[0]}
    axes |= {"last_hidden_state": {0: "batch", 1: "sequence"}, "pooler_output": {0: "batch"}}
    path = export(model, "bert_tiny", cases[0], ["last_hidden_state", "pooler_output"], axes, 17)
    check_against_torch(model, path, cases)
    save_inputs("bert_tiny", cases)


def make_gpt(rng: np.random.Generator, gen: torch.Generator) -> None:
    model = GptTiny()
    randomize_norms(model, gen)
    cases = [{"input_ids": rng.integers(0, 256, size=(b, s), dtype=np.int64)}
             for b, s in [(2, 12), (1, 20)]]
    axes = {"input_ids": {0: "batch", 1: "sequence"}, "logits": {0: "batch", 1: "sequence"}}
    path = export(model, "gpt_tiny", cases[0], ["logits"], axes, 17)
    check_against_torch(model, path, cases)
    save_inputs("gpt_tiny", cases)


def make_mobilenet(rng: np.random.Generator, gen: torch.Generator) -> None:
    model = MobileNetTiny()
    randomize_norms(model, gen)
    # Quantized to 1/16 steps, as decoded images are, so the npz compresses well.
    cases = [{"input": np.round(rng.standard_normal((b, 3, 64, 64)) * 16).astype(np.float32) / 16}
             for b in (2, 1)]
    axes = {"input": {0: "batch"}, "logits": {0: "batch"}, "segmentation": {0: "batch"}}
    path = export(model, "mobilenet_tiny", cases[0], ["logits", "segmentation"], axes, 13)
    check_against_torch(model, path, cases)
    save_inputs("mobilenet_tiny", cases)


def make_lstm(rng: np.random.Generator, gen: torch.Generator) -> None:
    model = LstmModel()
    cases = [{"input_ids": rng.integers(0, 100, size=(b, s), dtype=np.int64)}
             for b, s in [(3, 10), (1, 7)]]
    axes = {"input_ids": {0: "batch", 1: "sequence"}, "logits": {0: "batch", 1: "sequence"}}
    path = export(model, "lstm_model", cases[0], ["logits"], axes, 14)
    check_against_torch(model, path, cases)
    save_inputs("lstm_model", cases)


def make_gru(rng: np.random.Generator, gen: torch.Generator) -> None:
    model = GruModel()
    cases = [{"input": rng.standard_normal((b, s, 12), dtype=np.float32)}
             for b, s in [(2, 9), (4, 5)]]
    axes = {"input": {0: "batch", 1: "sequence"}, "output": {0: "batch", 1: "sequence"},
            "h_n": {1: "batch"}}
    path = export(model, "gru_model", cases[0], ["output", "h_n"], axes, 14)
    check_against_torch(model, path, cases)
    save_inputs("gru_model", cases)


def make_if_model(rng: np.random.Generator, gen: torch.Generator) -> None:
    """y = (sum(x) > 0) ? relu(x @ W + b) * scale : nested-If(x - b ...) ; z = y + 1.

    Both branches read outer-scope values (the initializers W, b and the graph-level ``scale``
    computed before the If); the else-branch nests a second If that reads ``x`` from two scopes
    up, so implicit inputs are captured across nested subgraphs.
    """
    W = numpy_helper.from_array(rng.standard_normal((4, 4), dtype=np.float32), "W")
    b = numpy_helper.from_array(rng.standard_normal((4,), dtype=np.float32), "b")
    two = numpy_helper.from_array(np.array(2.0, dtype=np.float32), "two")
    zero = numpy_helper.from_array(np.array(0.0, dtype=np.float32), "zero")
    f32 = TensorProto.FLOAT

    then_g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["t_mm"]),
         helper.make_node("Add", ["t_mm", "b"], ["t_add"]),
         helper.make_node("Relu", ["t_add"], ["t_relu"]),
         helper.make_node("Mul", ["t_relu", "scale"], ["then_out"])],
        "then_branch", [], [helper.make_tensor_value_info("then_out", f32, ["N", 4])])

    inner_then = helper.make_graph(
        [helper.make_node("Sub", ["x", "b"], ["it_out"])],
        "inner_then", [], [helper.make_tensor_value_info("it_out", f32, ["N", 4])])
    inner_else = helper.make_graph(
        [helper.make_node("Abs", ["x"], ["ie_abs"]),
         helper.make_node("Neg", ["ie_abs"], ["ie_out"])],
        "inner_else", [], [helper.make_tensor_value_info("ie_out", f32, ["N", 4])])
    else_g = helper.make_graph(
        [helper.make_node("ReduceMax", ["x"], ["e_max"], keepdims=0),
         helper.make_node("Greater", ["e_max", "zero"], ["e_cond"]),
         helper.make_node("If", ["e_cond"], ["e_if"], then_branch=inner_then,
                          else_branch=inner_else),
         helper.make_node("Mul", ["e_if", "two"], ["else_out"])],
        "else_branch", [], [helper.make_tensor_value_info("else_out", f32, ["N", 4])])

    graph = helper.make_graph(
        [helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
         helper.make_node("Greater", ["total", "zero"], ["cond"]),
         helper.make_node("ReduceMean", ["x"], ["scale"], axes=[1], keepdims=1),
         helper.make_node("If", ["cond"], ["y"], then_branch=then_g, else_branch=else_g),
         helper.make_node("Add", ["y", "two"], ["z"])],
        "if_model",
        [helper.make_tensor_value_info("x", f32, ["N", 4])],
        [helper.make_tensor_value_info("y", f32, ["N", 4]),
         helper.make_tensor_value_info("z", f32, ["N", 4])],
        initializer=[W, b, two, zero],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              producer_name="onnx.helper", ir_version=8)
    model.doc_string = "onnxrun test model if_model, generated by scripts/generate_models.py"
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(OUT_DIR / "if_model.onnx"))

    base = rng.standard_normal((3, 4), dtype=np.float32)
    pos, neg = np.abs(base) + 0.1, -np.abs(base) - 0.1
    mixed = neg.copy()
    mixed[0, 0] = 0.5  # sum < 0 but max > 0: outer else, inner then
    cases = [{"x": pos}, {"x": neg[:2]}, {"x": mixed}]
    save_inputs("if_model", cases)


MODELS = {
    "bert_tiny": make_bert,
    "gpt_tiny": make_gpt,
    "mobilenet_tiny": make_mobilenet,
    "lstm_model": make_lstm,
    "gru_model": make_gru,
    "if_model": make_if_model,
}


def all_nodes(graph: onnx.GraphProto):
    """Nodes of ``graph`` and of its subgraphs, recursively."""
    for node in graph.node:
        yield node
        for a in node.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                yield from all_nodes(a.g)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help=f"models (default: all of {', '.join(MODELS)})")
    args = parser.parse_args()
    unknown = set(args.names) - set(MODELS)
    if unknown:
        parser.error(f"unknown model(s): {', '.join(sorted(unknown))}")
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    torch.use_deterministic_algorithms(True)
    for name in args.names or list(MODELS):
        # Each model has its own seed, so regenerating one leaves the others unchanged.
        seed = SEED + list(MODELS).index(name)
        seed_all(seed)
        rng = np.random.default_rng(seed)
        gen = torch.Generator().manual_seed(seed)
        MODELS[name](rng, gen)
        path = OUT_DIR / f"{name}.onnx"
        ops = collections.Counter(n.op_type for n in all_nodes(onnx.load(str(path)).graph))
        print(f"{name}: {path.stat().st_size / 1024:.1f} KiB; "
              + ", ".join(f"{k} {v}" for k, v in sorted(ops.items())))


if __name__ == "__main__":
    main()
