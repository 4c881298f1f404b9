"""What the basic-pass tests share: build a small model, optimize it through the public API, and
check that results did not change (against the same model at ORT_DISABLE_ALL) and that the
saved optimized model passes onnx's checker and runs in onnxruntime with the same results."""

from __future__ import annotations

import collections
import os
import tempfile
from dataclasses import dataclass

import numpy as np
import onnx
import onnx.parser
from onnx import numpy_helper

import onnxrun

RTOL, ATOL = 1e-4, 1e-5
ORT_DOMAINS = {"", "ai.onnx", "com.microsoft", "ai.onnx.ml"}


def parse(text: str, **initializers: np.ndarray) -> onnx.ModelProto:
    """A model from onnx's text format, plus initializers given as arrays."""
    model = onnx.parser.parse_model(text)
    for name, value in initializers.items():
        model.graph.initializer.append(numpy_helper.from_array(np.asarray(value), name))
    return model


@dataclass
class Result:
    report: onnxrun.optimize.OptimizationReport
    saved: onnx.ModelProto
    outputs: list

    @property
    def ops(self) -> collections.Counter:
        return collections.Counter(n.op_type for n in self.saved.graph.node)

    def changes(self, pass_name: str) -> collections.Counter:
        rep = self.report.passes.get(pass_name)
        return rep.changes if rep is not None else collections.Counter()


def chain(first: str, second: str, elem: str = "float", extra: str = "",
          outputs: str = "") -> str:
    """A [2, 3] model computing ``A = first`` then ``Y = second`` (the chain-folding tests)."""
    return f"""
    <ir_version: 8, opset_import: ["" : 17]>
    g ({elem}[2, 3] X) => ({elem}[2, 3] Y{outputs}) {{
        A = {first}
        Y = {second}
        {extra}
    }}"""


def session(model: onnx.ModelProto, level: int = 1, disabled: tuple[str, ...] = (),
            saved_path: str = "", **dims: int) -> onnxrun.InferenceSession:
    so = onnxrun.SessionOptions()
    so.graph_optimization_level = level
    so.optimized_model_filepath = saved_path
    for name, value in dims.items():
        so.add_free_dimension_override_by_name(name, value)
    return onnxrun.InferenceSession(model.SerializeToString(), so,
                                    disabled_optimizers=list(disabled))


def optimize_and_compare(model: onnx.ModelProto, feeds: dict[str, np.ndarray], level: int = 1,
                         disabled: tuple[str, ...] = (), **dims: int) -> Result:
    """Optimize at ``level`` and assert outputs equal level 0's; the saved model must pass the
    checker and, when onnxruntime knows its domains, give the same outputs there."""
    onnx.checker.check_model(model)
    expected = session(model, 0, **dims).run(None, feeds)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "optimized.onnx")
        sess = session(model, level, disabled, path, **dims)
        saved = onnx.load(path)
    got = sess.run(None, feeds)
    assert_same(got, expected)
    onnx.checker.check_model(saved, full_check=True)
    if {op.domain for op in saved.opset_import} <= ORT_DOMAINS:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        ort_sess = ort.InferenceSession(saved.SerializeToString(), opts,
                                        providers=["CPUExecutionProvider"])
        assert_same(ort_sess.run(None, feeds), expected)
    return Result(sess.get_optimization_report(), saved, got)


def assert_same(got: list, expected: list) -> None:
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        g, e = np.asarray(g), np.asarray(e)
        assert g.dtype == e.dtype and g.shape == e.shape, (g.dtype, g.shape, e.dtype, e.shape)
        np.testing.assert_allclose(g.astype(np.float64), e.astype(np.float64), rtol=RTOL,
                                   atol=ATOL)


def rand(*shape: int, seed: int = 0, low: float | None = None, high: float | None = None
         ) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if low is not None:
        return rng.uniform(low, high, shape).astype(np.float32)
    return rng.standard_normal(shape).astype(np.float32)
