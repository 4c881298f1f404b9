"""The extended-level fusions on real exports: the BERT-style encoder and the GPT-style decoder
of tests/models end with one attention node per layer and one LayerNorm-type node per sublayer,
compute what the unoptimized model computes, and the saved optimized model runs in
onnxruntime."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import ort_int8
import pytest

import onnxrun

MODELS = Path(__file__).resolve().parent.parent / "models"
LEVELS = onnxrun.GraphOptimizationLevel
LAYER_NORMS = {"LayerNormalization", "SkipLayerNormalization", "SimplifiedLayerNormalization",
               "SkipSimplifiedLayerNormalization"}
# name -> (layers, LayerNorm-type nodes: one per sublayer + the embeddings' / final one)
EXPECTED = {"bert_tiny": (2, 5), "gpt_tiny": (2, 5)}


def cases(name: str) -> list[dict[str, np.ndarray]]:
    data = np.load(MODELS / f"{name}.inputs.npz")
    found: dict[str, dict[str, np.ndarray]] = {}
    for key in data.files:
        case, input_name = key.split("/", 1)
        found.setdefault(case, {})[input_name] = data[key]
    return [found[c] for c in sorted(found)]


def _plain_options() -> onnxrun.SessionOptions:
    opts = onnxrun.SessionOptions()
    opts.graph_optimization_level = LEVELS.ORT_DISABLE_ALL
    return opts


def session(name: str, level, path: Path | None = None) -> onnxrun.InferenceSession:
    opts = onnxrun.SessionOptions()
    opts.graph_optimization_level = level
    if path is not None:
        opts.optimized_model_filepath = str(path)
    return onnxrun.InferenceSession(str(MODELS / f"{name}.onnx"), opts)


@pytest.fixture(scope="module", params=sorted(EXPECTED))
def reference(request):
    name = request.param
    plain = session(name, LEVELS.ORT_DISABLE_ALL)
    return name, [(feeds, plain.run(None, feeds)) for feeds in cases(name)]


@pytest.mark.parametrize("level", [LEVELS.ORT_ENABLE_EXTENDED, LEVELS.ORT_ENABLE_ALL])
def test_one_attention_and_one_norm_per_sublayer(reference, level, tmp_path):
    name, expected = reference
    path = tmp_path / f"{name}.optimized.onnx"
    sess = session(name, level, path)
    saved = onnx.load(str(path))
    counts = Counter(n.op_type for n in saved.graph.node)
    layers, norms = EXPECTED[name]
    assert counts["Attention"] == layers, counts
    assert sum(counts[op] for op in LAYER_NORMS) == norms, counts
    assert counts["Softmax"] == 0 and counts["Erf"] == 0 and counts["Tanh"] <= 1, counts
    assert "AttentionFusion" in sess.get_optimization_report().format()

    reloaded = onnxrun.InferenceSession(str(path), _plain_options())
    sessions = [sess, reloaded]
    # a model saved at the layout level holds onnxrun's own operators (ai.onnxrun: the
    # MatMul + BiasGelu), as onnxruntime's holds its NCHWc ones: onnxrun's to load
    if all(n.domain != "ai.onnxrun" for n in saved.graph.node):
        ort_opts = ort.SessionOptions()
        ort_opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        sessions.append(ort.InferenceSession(str(path), ort_opts,
                                             providers=["CPUExecutionProvider"]))
    else:
        assert level == LEVELS.ORT_ENABLE_ALL
    for feeds, want in expected:
        for s in sessions:
            outputs = s.run(None, feeds)
            for got, ref in zip(outputs, want, strict=True):
                np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)


def test_attention_fusion_can_be_turned_off(reference):
    name, expected = reference
    opts = onnxrun.SessionOptions()
    opts.graph_optimization_level = LEVELS.ORT_ENABLE_EXTENDED
    opts.add_session_config_entry("optimization.disable_specified_optimizers",
                                  "AttentionFusion")
    sess = onnxrun.InferenceSession(str(MODELS / f"{name}.onnx"), opts)
    assert "AttentionFusion" not in sess.get_optimization_report().format()
    feeds, want = expected[0]
    for got, ref in zip(sess.run(None, feeds), want, strict=True):
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)


# Older-opset exports of the same architectures: LayerNormalization decomposed into
# ReduceMean/Sub/Pow/Sqrt/Div (before opset 17), and (opset 13) a Reshape whose output ONNX
# shape inference leaves unranked.
OLD_EXPORTS = {"bert_tiny": ("BertTiny", 13), "gpt_tiny": ("GptTiny", 14)}


def _export_old(name: str, path: Path) -> None:
    import importlib.util
    import warnings

    torch = pytest.importorskip("torch")
    script = MODELS.parent.parent / "scripts" / "generate_models.py"
    spec = importlib.util.spec_from_file_location("_generate_models", script)
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    cls, opset = OLD_EXPORTS[name]
    torch.manual_seed(0)
    model = getattr(gen, cls)().eval()
    gen.randomize_norms(model, torch.Generator().manual_seed(1))
    example = cases(name)[0]
    axes = {k: {0: "batch", 1: "sequence"} for k in example}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, tuple(torch.from_numpy(v) for v in example.values()),
                          str(path), dynamo=False, opset_version=opset,
                          input_names=list(example), dynamic_axes=axes)


@pytest.mark.parametrize("name", sorted(OLD_EXPORTS))
def test_older_opset_exports_fuse_too(name, tmp_path):
    source, saved = tmp_path / f"{name}.onnx", tmp_path / f"{name}.optimized.onnx"
    _export_old(name, source)
    assert "ReduceMean" in {n.op_type for n in onnx.load(str(source)).graph.node}
    opts = onnxrun.SessionOptions()
    opts.optimized_model_filepath = str(saved)
    sess = onnxrun.InferenceSession(str(source), opts)  # default level: ORT_ENABLE_ALL
    counts = Counter(n.op_type for n in onnx.load(str(saved)).graph.node)
    layers, norms = EXPECTED[name]
    assert counts["Attention"] == layers and counts["ReduceMean"] == 0, counts
    assert sum(counts[op] for op in LAYER_NORMS) == norms, counts
    plain = onnxrun.InferenceSession(str(source), _plain_options())
    sessions = [sess]
    if all(n.domain != "ai.onnxrun" for n in onnx.load(str(saved)).graph.node):  # see above
        sessions.append(ort.InferenceSession(str(saved), providers=["CPUExecutionProvider"]))
    for feeds in cases(name):
        want = plain.run(None, feeds)
        for s in sessions:
            for got, ref in zip(s.run(None, feeds), want, strict=True):
                np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_dynamic_int8_exports_fuse_to_one_attention_and_norm_per_sublayer(name, tmp_path):
    """quantize_dynamic's output: every MatMul an integer product. Each layer's attention becomes
    MultiHeadAttention on the quantized projections, each product one fused integer kernel."""
    from onnxrun.quantization import quantize_dynamic

    source, saved = tmp_path / "int8.onnx", tmp_path / "int8.optimized.onnx"
    quantize_dynamic(MODELS / f"{name}.onnx", source)
    opts = onnxrun.SessionOptions()
    opts.optimized_model_filepath = str(saved)
    sess = onnxrun.InferenceSession(str(source), opts)
    counts = Counter(n.op_type for n in onnx.load(str(saved)).graph.node)
    layers, norms = EXPECTED[name]
    assert counts["MultiHeadAttention"] == layers, counts
    assert sum(counts[op] for op in LAYER_NORMS) == norms, counts
    assert counts["MatMulInteger"] == counts["Softmax"] == 0, counts
    plain = onnxrun.InferenceSession(str(source), _plain_options())
    ort_opts = ort.SessionOptions()
    ort_opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    ort_sess = ort_int8.session(saved, ort_opts)  # exact 8-bit products on every CPU
    for feeds in cases(name):
        want = plain.run(None, feeds)
        for s in (sess, ort_sess):
            for got, ref in zip(s.run(None, feeds), want, strict=True):
                np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
