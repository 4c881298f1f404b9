"""The engine's decode steps after the first: its own feeds run without checks
(InferenceSession._runner) and GroupQueryAttention's seqlens_k / total_sequence_length computed
from the attention mask (genai/mask.py) instead of the model's mask subgraph. The values and
the logits must be the model's own, to the bit; any other subgraph keeps its steps."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

import onnxrun
from onnxrun.genai.mask import mask_values

MASKS = [np.ones((1, 7), np.int64), np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], np.int64),
         np.ones((3, 1), np.int64)]


def _chain_values(program, slots, mask_name, mask):
    """The values of ``slots`` as the model's own steps compute them from ``mask``."""
    mask_slot = program.input_slots[[v.name for v in program.graph.inputs].index(mask_name)]
    return program.run(program.plan(tuple(slots)), [(mask_slot, mask)])


@pytest.mark.parametrize("fmt", ["int4", "fp32"])
def test_builder_mask_values_are_the_models(genai_folder, fmt):
    import onnxrun.genai as og

    model = og.Model(genai_folder("llama", fmt))
    got = mask_values(model.session._program, model.attention_mask,
                      model.input_dtypes[model.attention_mask])
    assert got is not None and len(got) == 2  # seqlens_k and total_sequence_length
    for mask in MASKS:
        expect = _chain_values(model.session._program, [s for s, _ in got],
                               model.attention_mask, mask)
        for (_, f), e in zip(got, expect, strict=True):
            v = f(mask)
            assert isinstance(v, np.ndarray) and v.dtype == e.dtype and v.shape == e.shape
            np.testing.assert_array_equal(v, e)


def _steps(og, folder, prompts, checked: bool, monkeypatch, n=6):
    """Each step's logits, with the decode steps on the runner, or all checked runs."""
    model = og.Model(folder)
    if checked:
        monkeypatch.setattr(type(model), "step_runner", lambda *a: None)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=12, do_sample=False, batch_size=len(prompts))
    gen = og.Generator(model, params)
    width = max(map(len, prompts))
    gen.append_tokens(np.array([p + [0] * (width - len(p)) for p in prompts], np.int32))
    out = []
    for _ in range(n):
        gen.generate_next_token()
        out.append(gen.get_logits())
    monkeypatch.undo()
    return out, model


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_runner_logits_equal_checked_runs(genai_folder, monkeypatch, arch):
    import onnxrun.genai as og

    folder = genai_folder(arch, "int4")
    prompts = [[5, 9, 14], [7, 3, 21, 8, 2]]  # padded on the right, as genai pads
    fast, model = _steps(og, folder, prompts, False, monkeypatch)
    assert model._step_runs and all(v is not None and len(v[1]) == 2
                                    for v in model._step_runs.values())
    slow, _ = _steps(og, folder, prompts, True, monkeypatch)
    for a, b in zip(fast, slow, strict=True):
        np.testing.assert_array_equal(a, b)


def test_runner_holds_blas_only_where_a_kernel_may_call_it(genai_folder, monkeypatch):
    """The builder's int4 decode step calls no BLAS (MatMulNBits' compiled products,
    GroupQueryAttention's compiled kernels, the compiled norms, element-wise ops): its runner
    leaves BLAS's count alone (a hold reads and sets it twice a step); a plan with a float
    MatMul holds it, as session.run does."""
    import onnxrun.genai as og
    from onnxrun.api import session as session_module

    holds = []
    enter = session_module._BlasHeld.__enter__

    def spy(self):
        holds.append(1)
        enter(self)

    monkeypatch.setattr(session_module._BlasHeld, "__enter__", spy)
    model = og.Model(genai_folder("llama", "int4"))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=16, do_sample=False)
    gen = og.Generator(model, params)
    gen.append_tokens(np.array([[5, 9, 14]], np.int32))
    gen.generate_next_token()  # the prompt's logits: its checked run held BLAS
    before = len(holds)
    assert before == 1
    for _ in range(4):
        gen.generate_next_token()
    assert len(holds) == before  # the runner's steps
    X = helper.make_tensor_value_info("x", TP.FLOAT, [2, 4])
    Y = helper.make_tensor_value_info("y", TP.FLOAT, [2, 3])
    w = numpy_helper.from_array(np.ones((4, 3), np.float32), "w")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g", [X], [Y], [w])
    sess = onnxrun.InferenceSession(helper.make_model(g).SerializeToString())
    run = sess._runner(["y"], ["x"])
    y = run([np.ones((2, 4), np.float32)], None)[0]
    np.testing.assert_array_equal(y, np.full((2, 3), 4, np.float32))
    assert len(holds) == before + 1


def _gqa_model(chain: str) -> onnxrun.InferenceSession:
    """GroupQueryAttention whose seqlens_k and total_sequence_length come from the mask
    through ``chain``: "builder" (the builder's subgraph), "attr_axes" (opset 11's axes
    attribute), or variants that mask.py must leave to the model."""
    H, N, NKV = 8, 2, 1
    one = numpy_helper.from_array(np.array([1], np.int64), "one")
    idx = numpy_helper.from_array(np.array(1, np.int64), "idx")
    reduce_op = "ReduceMax" if chain == "reducemax" else "ReduceSum"
    opset = 11 if chain in ("keepdims", "attr_axes") else 18
    if opset == 11:
        red = helper.make_node(reduce_op, ["mask"], ["s"], axes=[1],
                               keepdims=int(chain == "keepdims"))
    else:
        red = helper.make_node(reduce_op, ["mask", "one"], ["s"], keepdims=0)
    shape_of = "s" if chain == "shape_of_sum" else "mask"
    nodes = [red, helper.make_node("Sub", ["s", "one"], ["s1"]),
             helper.make_node("Cast", ["s1"], ["sk"], to=TP.INT32),
             helper.make_node("Shape", [shape_of], ["shp"]),
             helper.make_node("Gather", ["shp", "idx"], ["t"], axis=0),
             helper.make_node("Cast", ["t"], ["tot"], to=TP.INT32)]
    if chain == "keepdims":
        nodes.insert(3, helper.make_node("Squeeze", ["sk"], ["sk1"], axes=[1]))
        nodes[2].output[0] = "sk"
    names = ["q", "", "", "pk", "pv", "sk1" if chain == "keepdims" else "sk", "tot"]
    nodes.append(helper.make_node("GroupQueryAttention", names, ["y", "pko", "pvo"],
                                  domain="com.microsoft", num_heads=N, kv_num_heads=NKV))
    ins = [helper.make_tensor_value_info("q", TP.FLOAT, [1, 1, (N + 2 * NKV) * H]),
           helper.make_tensor_value_info("mask", TP.INT64, [1, "T"]),
           helper.make_tensor_value_info("pk", TP.FLOAT, [1, NKV, "P", H]),
           helper.make_tensor_value_info("pv", TP.FLOAT, [1, NKV, "P", H])]
    outs = [helper.make_tensor_value_info(n, TP.FLOAT, None) for n in ("y", "pko", "pvo")]
    g = helper.make_graph(nodes, "g", ins, outs, initializer=[one, idx])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset),
                                            helper.make_opsetid("com.microsoft", 1)])
    return onnxrun.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("chain,found", [("builder", True), ("attr_axes", True),
                                         ("keepdims", False),
                                         ("reducemax", False), ("shape_of_sum", False)])
def test_other_mask_subgraphs(chain, found):
    """Only the operators mask.py knows are computed by the engine (a Squeeze, a ReduceMax,
    the shape of another value: the model's steps run)."""
    sess = _gqa_model(chain)
    got = mask_values(sess._program, "mask", np.dtype(np.int64))
    assert (got is not None) == found
    if got is not None:
        for mask in MASKS[:1]:
            expect = _chain_values(sess._program, [s for s, _ in got], "mask", mask)
            for (_, f), e in zip(got, expect, strict=True):
                np.testing.assert_array_equal(f(mask), e)
                assert f(mask).dtype == e.dtype and f(mask).shape == e.shape


def test_runner_feeds_computed_values_and_skips_their_steps():
    sess = _gqa_model("builder")
    got = mask_values(sess._program, "mask", np.dtype(np.int64))
    run = sess._runner(["y"], ["q", "mask", "pk", "pv"], [s for s, _ in got])
    plan = sess._program.plan(sess._fetch_slots(["y"]), known=frozenset(s for s, _ in got))
    assert [s.node.op_type for s in plan.steps] == ["GroupQueryAttention"]
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 1, 32)).astype(np.float32)
    pk = rng.standard_normal((1, 1, 6, 8)).astype(np.float32)
    pv = rng.standard_normal((1, 1, 6, 8)).astype(np.float32)
    mask = np.ones((1, 6), np.int64)
    expect = sess.run(["y"], {"q": q, "mask": mask, "pk": pk.copy(), "pv": pv.copy()})[0]
    y = run([q, mask, pk.copy(), pv.copy(), *[f(mask) for _, f in got]], None)[0]
    np.testing.assert_array_equal(y, expect)
