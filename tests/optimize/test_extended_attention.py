"""AttentionFusion: exported multi-head self-attention blocks -> com.microsoft Attention."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper
import pytest
from extended_helpers import ops, optimized

rng = np.random.default_rng(0)


B, S, N, H = 2, 5, 2, 4
D = N * H
F = onnx.TensorProto.FLOAT
I64 = onnx.TensorProto.INT64


def const(name: str, value, dtype=np.float32) -> onnx.NodeProto:
    arr = np.asarray(value, dtype)
    return oh.make_node("Constant", [], [name], value=onnx.numpy_helper.from_array(arr, name))


def attention_model(kind="bert", mask="padding", dynamic=True, scale_on="product",
                    weights_const=True, probs_out=False, bad_reshape=False, causal_upper=0,
                    causal_k=0):
    """A self-attention block written the way TorchScript exports HF BERT (separate q/k/v
    projections, padding mask) and GPT-2 (one qkv projection + Split, causal Trilu mask)."""
    nodes, inits = [], {}
    batch, seq = ("batch", "seq") if dynamic else (B, S)  # constant targets need static shapes
    inputs = [oh.make_tensor_value_info("x", F, [batch, seq, D])]
    outputs = [oh.make_tensor_value_info("y", F, [batch, seq, D])]
    if kind == "bert":
        for p in "qkv":
            inits[f"W{p}"] = rng.standard_normal((D, D)).astype(np.float32) / 3
            inits[f"b{p}"] = rng.standard_normal(D).astype(np.float32) / 3
            nodes += [oh.make_node("MatMul", ["x", f"W{p}"], [f"{p}m"]),
                      oh.make_node("Add", [f"b{p}", f"{p}m"], [f"{p}p"])]
    else:
        inits["Wqkv"] = rng.standard_normal((D, 3 * D)).astype(np.float32) / 3
        inits["bqkv"] = rng.standard_normal(3 * D).astype(np.float32) / 3
        nodes += [oh.make_node("MatMul", ["x", "Wqkv"], ["qkvm"]),
                  oh.make_node("Add", ["qkvm", "bqkv"], ["qkv"]),
                  const("split", [D, D, D], np.int64),
                  oh.make_node("Split", ["qkv", "split"], ["qp", "kp", "vp"], axis=-1)]
    if not weights_const:
        name = "Wq" if kind == "bert" else "Wqkv"
        inputs.append(oh.make_tensor_value_info(name, F, list(inits[name].shape)))
    # [B, S, N, H] targets, computed from the input's shape as exporters do
    if dynamic:
        nodes += [oh.make_node("Shape", ["x"], ["shape"]), const("i0", 0, np.int64),
                  const("i1", 1, np.int64), const("ax0", [0], np.int64),
                  oh.make_node("Gather", ["shape", "i0"], ["b0"], axis=0),
                  oh.make_node("Gather", ["shape", "i1"], ["s0"], axis=0),
                  oh.make_node("Unsqueeze", ["b0", "ax0"], ["b1"]),
                  oh.make_node("Unsqueeze", ["s0", "ax0"], ["s1"]),
                  const("nh", [N, H], np.int64), const("minus1", [-1], np.int64)]
        first = ["s1", "b1"] if bad_reshape else ["b1", "s1"]
        nodes += [oh.make_node("Concat", [*first, "nh"], ["heads_shape"], axis=0),
                  oh.make_node("Concat", ["b1", "s1", "minus1"], ["merge_shape"], axis=0)]
    else:
        nodes += [const("heads_shape", [B, S, N, H], np.int64),
                  const("merge_shape", [B, S, D], np.int64)]
    for p, perm in (("q", [0, 2, 1, 3]), ("k", [0, 2, 3, 1]), ("v", [0, 2, 1, 3])):
        nodes += [oh.make_node("Reshape", [f"{p}p", "heads_shape"], [f"{p}r"]),
                  oh.make_node("Transpose", [f"{p}r"], [f"{p}t"], perm=perm)]
    scale = 1.0 / np.sqrt(H)
    if scale_on == "product":
        nodes += [oh.make_node("MatMul", ["qt", "kt"], ["qk"]), const("sqrt_h", np.sqrt(H)),
                  oh.make_node("Div", ["qk", "sqrt_h"], ["scores"])]
    else:  # q and k scaled by H ** -0.25 each
        nodes += [const("c", scale ** 0.5), oh.make_node("Mul", ["qt", "c"], ["qs"]),
                  oh.make_node("Mul", ["kt", "c"], ["ks"]),
                  oh.make_node("MatMul", ["qs", "ks"], ["scores"])]
    masked = "scores"
    if mask in ("padding", "both"):
        inputs.append(oh.make_tensor_value_info("mask", I64, [batch, seq]))
        nodes += [const("ax1", [1], np.int64), const("ax2", [2], np.int64),
                  oh.make_node("Unsqueeze", ["mask", "ax1"], ["m1"]),
                  oh.make_node("Unsqueeze", ["m1", "ax2"], ["m2"]),
                  oh.make_node("Cast", ["m2"], ["mf"], to=F), const("one", 1.0),
                  oh.make_node("Sub", ["one", "mf"], ["inv"]), const("big", -10000.0),
                  oh.make_node("Mul", ["inv", "big"], ["madd"]),
                  oh.make_node("Add", [masked, "madd"], ["padded"])]
        masked = "padded"
    if mask in ("causal", "both"):
        if dynamic:
            nodes += [oh.make_node("Concat", ["s1", "s1"], ["square"], axis=0)]
        else:
            nodes += [const("square", [S, S], np.int64)]
        nodes += [oh.make_node("ConstantOfShape", ["square"], ["ones"],
                               value=onnx.numpy_helper.from_array(np.array([True]))),
                  const("diag", causal_k, np.int64),
                  oh.make_node("Trilu", ["ones", "diag"], ["tril"], upper=causal_upper),
                  oh.make_node("Not", ["tril"], ["future"]), const("ninf", -np.inf),
                  oh.make_node("Where", ["future", "ninf", masked], ["causal"])]
        masked = "causal"
    if mask == "causal_add":  # a constant additive mask, as static-shape exports fold it
        future = np.triu(np.full((1, 1, S, S), -1e9, np.float32), 1)
        nodes += [const("future", future), oh.make_node("Add", [masked, "future"], ["causal"])]
        masked = "causal"
    if mask == "bias4d":  # a free-form additive bias: no Attention mask format says that
        inputs.append(oh.make_tensor_value_info("bias", F, [1, 1, S, S]))
        nodes.append(oh.make_node("Add", [masked, "bias"], ["biased"]))
        masked = "biased"
    nodes += [oh.make_node("Softmax", [masked], ["probs"], axis=-1),
              oh.make_node("MatMul", ["probs", "vt"], ["ctx"]),
              oh.make_node("Transpose", ["ctx"], ["ctxt"], perm=[0, 2, 1, 3]),
              oh.make_node("Reshape", ["ctxt", "merge_shape"], ["merged"])]
    inits["Wo"] = rng.standard_normal((D, D)).astype(np.float32) / 3
    nodes.append(oh.make_node("MatMul", ["merged", "Wo"], ["y"]))
    if probs_out:
        outputs.append(oh.make_tensor_value_info("probs", F, None))
    graph = oh.make_graph(nodes, "attention", inputs, outputs,
                          [onnx.numpy_helper.from_array(v, k) for k, v in inits.items()
                           if weights_const or k not in ("Wq", "Wqkv")])
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])
    model.ir_version = 8
    feeds = {"x": rng.standard_normal((B, S, D)).astype(np.float32)}
    if mask in ("padding", "both"):
        feeds["mask"] = np.array([[1] * S, [1] * (S - 2) + [0] * 2], np.int64)
    if mask == "causal_add":  # a constant additive mask, as static-shape exports fold it
        future = np.triu(np.full((1, 1, S, S), -1e9, np.float32), 1)
        nodes += [const("future", future), oh.make_node("Add", [masked, "future"], ["causal"])]
        masked = "causal"
    if mask == "bias4d":
        feeds["bias"] = rng.standard_normal((1, 1, S, S)).astype(np.float32)
    if not weights_const:
        feeds["Wq" if kind == "bert" else "Wqkv"] = inits["Wq" if kind == "bert" else "Wqkv"]
    return model, feeds


def attention_node(model):
    found = [n for n in model.graph.node if n.op_type == "Attention"]
    assert len(found) == 1, ops(model)
    return found[0], {a.name: oh.get_attribute_value(a) for a in found[0].attribute}


@pytest.mark.parametrize("dynamic", [True, False])
def test_bert_style_with_padding_mask_fires(dynamic, tmp_path):
    changes, opt = optimized(*attention_model("bert", "padding", dynamic), tmp_path)
    assert changes["AttentionFusion"] == {"Attention": 1}
    node, attrs = attention_node(opt)
    assert node.domain == "com.microsoft" and attrs["num_heads"] == N
    assert attrs["unidirectional"] == 0 and attrs["mask_filter_value"] == -10000.0
    assert attrs["scale"] == pytest.approx(1 / np.sqrt(H))
    assert sorted(ops(opt)) == ["Attention", "Cast", "MatMul"]  # mask as int32, out-projection


@pytest.mark.parametrize("dynamic", [True, False])
def test_gpt_style_with_causal_mask_fires(dynamic, tmp_path):
    changes, opt = optimized(*attention_model("gpt", "causal", dynamic), tmp_path)
    node, attrs = attention_node(opt)
    assert attrs["unidirectional"] == 1 and len(node.input) == 3
    assert sorted(ops(opt)) == ["Attention", "MatMul"]


def test_constant_additive_causal_mask_fires(tmp_path):
    changes, opt = optimized(*attention_model("gpt", "causal_add", dynamic=False), tmp_path)
    node, attrs = attention_node(opt)
    assert attrs["unidirectional"] == 1 and attrs["mask_filter_value"] == -1e9


def test_padding_and_causal_masks_together_fire(tmp_path):
    changes, opt = optimized(*attention_model("gpt", "both"), tmp_path)
    node, attrs = attention_node(opt)
    assert attrs["unidirectional"] == 1 and len(node.input) == 4


def test_scale_split_over_q_and_k_fires(tmp_path):
    changes, opt = optimized(*attention_model("bert", "none", scale_on="qk"), tmp_path)
    node, attrs = attention_node(opt)
    assert attrs["scale"] == pytest.approx(1 / np.sqrt(H))


def test_unknown_additive_mask_does_not_fire(tmp_path):
    changes, opt = optimized(*attention_model("bert", "bias4d"), tmp_path)
    assert "AttentionFusion" not in changes
    assert "Softmax" in ops(opt)


@pytest.mark.parametrize("upper, k", [(1, 0), (0, 1)])
def test_other_triangular_masks_do_not_fire(upper, k, tmp_path):
    model, feeds = attention_model("gpt", "causal", causal_upper=upper, causal_k=k)
    changes, opt = optimized(model, feeds, tmp_path)
    assert "AttentionFusion" not in changes


@pytest.mark.parametrize("kind, mask", [("bert", "padding"), ("gpt", "causal"),
                                        ("gpt", "both")])
def test_runtime_weights_fuse_to_multi_head_attention(kind, mask, tmp_path):
    """Q, K and V not from constant weights (a quantized model's integer products, weights fed
    at run time): the block becomes MultiHeadAttention on the projected values."""
    changes, opt = optimized(*attention_model(kind, mask, weights_const=False), tmp_path)
    assert changes["AttentionFusion"] == {"MultiHeadAttention": 1}
    (node,) = [n for n in opt.graph.node if n.op_type == "MultiHeadAttention"]
    attrs = {a.name: oh.get_attribute_value(a) for a in node.attribute}
    assert node.domain == "com.microsoft" and attrs["num_heads"] == N
    assert attrs["unidirectional"] == int(mask != "padding")
    assert attrs["scale"] == pytest.approx(1 / np.sqrt(H))
    assert (len(node.input) == 5) == (mask in ("padding", "both"))
    assert "Softmax" not in ops(opt) and "Transpose" not in ops(opt)


def test_probabilities_read_elsewhere_do_not_fire(tmp_path):
    changes, opt = optimized(*attention_model("bert", "padding", probs_out=True), tmp_path)
    assert "AttentionFusion" not in changes
    assert "Softmax" in ops(opt)


def test_constant_targets_with_dynamic_input_do_not_fire(tmp_path):
    # Reshape to a constant [2, 5, N, H] of a [batch, seq] input could regroup the batches
    model, feeds = attention_model("bert", "none", dynamic=False)
    for v in list(model.graph.input) + list(model.graph.output):
        v.type.tensor_type.shape.dim[0].dim_param = "batch"
    changes, opt = optimized(model, feeds, tmp_path)
    assert "AttentionFusion" not in changes


def test_heads_reshape_of_other_dimensions_does_not_fire(tmp_path):
    # [S, B, N, H] instead of [B, S, N, H]: the batches would mix
    model, feeds = attention_model("bert", "none", bad_reshape=True)
    changes, opt = optimized(model, feeds, tmp_path)
    assert "AttentionFusion" not in changes
