"""What the extended-level fusion tests share: build a model from onnx text, optimize it at a
level, check the outputs against the unoptimized run and onnxruntime on the saved file (with
exact 8-bit products: ``ort_int8``)."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.numpy_helper
import onnx.parser
import onnxruntime as ort
import ort_int8

import onnxrun

EXTENDED = onnxrun.GraphOptimizationLevel.ORT_ENABLE_EXTENDED


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
    ort_sess = ort_int8.session(opts.optimized_model_filepath, ort_opts)
    for outputs in (sess.run(None, feeds), ort_sess.run(None, feeds)):
        for got, want in zip(outputs, expected, strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    changes = {name: dict(p.changes) for name, p in sess.get_optimization_report().passes.items()
               if p.changes}
    return changes, onnx.load(opts.optimized_model_filepath)


def ops(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node]


def level_session(model: onnx.ModelProto, level, disabled=(), threads: int = 1, saved=None):
    """An onnxrun session of ``model`` at ``level``, the passes named in ``disabled`` off,
    ``threads`` intra-op threads; ``saved``: where the optimized model is written."""
    so = onnxrun.SessionOptions()
    so.graph_optimization_level = level
    so.intra_op_num_threads = threads
    if disabled:
        so.add_session_config_entry("optimization.disable_specified_optimizers",
                                    ",".join(disabled))
    if saved is not None:
        so.optimized_model_filepath = str(saved)
    return onnxrun.InferenceSession(model.SerializeToString(), so)
