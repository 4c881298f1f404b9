"""Write the ONNX node conformance cases the installed onnx defines to files, for runners that
cannot import onnx (the Pyodide lane): ``OUT/node/<case>/model.onnx`` and
``test_data_set_N/{input,output}_K.pb``, the layout of onnx's ``cmd_tools generate-data``.

    python tests/pyodide/export_cases.py OUT
"""

from __future__ import annotations

import os
import sys

import onnx
from onnx import numpy_helper
from onnx.backend.test.case.node import collect_testcases


def _proto(value, vi: onnx.ValueInfoProto) -> bytes:
    t = vi.type
    if t.HasField("map_type"):
        return numpy_helper.from_dict(value, vi.name).SerializeToString()
    if t.HasField("sequence_type"):
        return numpy_helper.from_list(value, vi.name).SerializeToString()
    if t.HasField("optional_type"):
        return numpy_helper.from_optional(value, vi.name).SerializeToString()
    if isinstance(value, onnx.TensorProto):
        return value.SerializeToString()
    return numpy_helper.from_array(value, vi.name).SerializeToString()


def main(out: str) -> int:
    n = 0
    for case in collect_testcases(None):
        folder = os.path.join(out, "node", case.name)
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "model.onnx"), "wb") as f:
            f.write(case.model.SerializeToString())
        graph = case.model.graph
        init = {t.name for t in graph.initializer}
        inputs = [vi for vi in graph.input if vi.name not in init]
        for i, (ins, outs) in enumerate(case.data_sets):
            ds = os.path.join(folder, f"test_data_set_{i}")
            os.makedirs(ds, exist_ok=True)
            for j, v in enumerate(ins):
                with open(os.path.join(ds, f"input_{j}.pb"), "wb") as f:
                    f.write(_proto(v, inputs[j]))
            for j, v in enumerate(outs):
                with open(os.path.join(ds, f"output_{j}.pb"), "wb") as f:
                    f.write(_proto(v, graph.output[j]))
        n += 1
    print(f"wrote {n} node cases to {out}/node")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
