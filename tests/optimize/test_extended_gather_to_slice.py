"""GatherToSliceFusion: Gather(data, Range(start, limit, step)) -> Slice."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.numpy_helper
import onnx.parser
import onnxruntime as ort
import pytest

import onnxrun

EXTENDED = onnxrun.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
rng = np.random.default_rng(0)


def build(text: str, **inits: np.ndarray) -> onnx.ModelProto:
    model = onnx.parser.parse_model(text)
    model.graph.initializer.extend(onnx.numpy_helper.from_array(v, k) for k, v in inits.items())
    return model


def optimized(model: onnx.ModelProto, feeds: dict, tmp_path, level=EXTENDED):
    """Optimize and run. Outputs must equal the unoptimized run's, and onnxruntime must load
    the saved optimized model and agree. Returns ({pass: {change: count}}, saved model)."""
    opts = onnxrun.SessionOptions()
    opts.graph_optimization_level = onnxrun.GraphOptimizationLevel.ORT_DISABLE_ALL
    expected = onnxrun.InferenceSession(model.SerializeToString(), opts).run(None, feeds)
    opts = onnxrun.SessionOptions()
    opts.graph_optimization_level = level
    opts.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    sess = onnxrun.InferenceSession(model.SerializeToString(), opts)
    ort_opts = ort.SessionOptions()
    ort_opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    ort_sess = ort.InferenceSession(opts.optimized_model_filepath, ort_opts,
                                    providers=["CPUExecutionProvider"])
    for outputs in (sess.run(None, feeds), ort_sess.run(None, feeds)):
        for got, want in zip(outputs, expected, strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    changes = {name: dict(p.changes) for name, p in sess.get_optimization_report().passes.items()
               if p.changes}
    return changes, onnx.load(opts.optimized_model_filepath)


def ops(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node]


TABLE = rng.standard_normal((10, 4)).astype(np.float32)
FEEDS = {"ids": np.array([[1, 2, 3, 4, 5, 6]], np.int64)}


def positions_model(start: int = 0, step: int = 1, outs: str = "float[p, q] y",
                    axis: int = 0):
    table = "table" if axis == 0 else "table_t"
    return build(f"""<ir_version: 8, opset_import: ["" : 17]>
g (int64[1, seq] ids) => ({outs}) {{
    shape = Shape(ids)
    one = Constant <value = int64 {{1}}> ()
    n = Gather <axis = 0> (shape, one)
    start = Constant <value = int64 {{{start}}}> ()
    step = Constant <value = int64 {{{step}}}> ()
    r = Range(start, n, step)
    y = Gather <axis = {axis}> ({table}, r)
}}""", table=TABLE, table_t=TABLE.T.copy())


@pytest.mark.parametrize("axis", [0, 1])
def test_gather_of_range_fires(axis, tmp_path):
    changes, model = optimized(positions_model(step=2, axis=axis), FEEDS, tmp_path)
    assert changes["GatherToSliceFusion"] == {"Gather(Range)->Slice": 1}
    assert "Range" not in ops(model) and "Slice" in ops(model)


def test_negative_start_does_not_fire(tmp_path):
    # Gather reads index -2 as the second-to-last row; Slice would read from there to the limit
    changes, model = optimized(positions_model(start=-2), FEEDS, tmp_path)
    assert "GatherToSliceFusion" not in changes
    assert "Range" in ops(model)


def test_range_read_elsewhere_does_not_fire(tmp_path):
    model = positions_model(outs="float[p, q] y, int64[m] r")
    changes, opt = optimized(model, FEEDS, tmp_path)
    assert "GatherToSliceFusion" not in changes
