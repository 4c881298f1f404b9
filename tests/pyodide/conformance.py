"""ONNX node conformance cases from files, without the onnx package: the runner of the Pyodide
lane (run_node.mjs), also run on CPython (with and without onnx) to give the counts it is
compared with.

Cases are the folders ``python -m onnx.backend.test.cmd_tools generate-data`` writes
(``node/<case>/model.onnx``, ``test_data_set_N/{input,output}_K.pb``). Each runs through
``onnxrun.InferenceSession`` and is compared as onnx's backend runner compares (same dtype,
``assert_allclose`` with rtol 1e-3, atol 1e-7; two bfloat16 ULPs for bfloat16; strings equal).

    python tests/pyodide/conformance.py DATA_DIR [--block onnx,ml_dtypes] [--json OUT]

``--block`` makes those modules unimportable first (the Pyodide situation on CPython).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
import traceback

# The same exclusions as tests/test_conformance.py: not about the engine.
EXCLUDED = [
    r"^test_bernoulli",  # random draws cannot match numpy's stream
    r"^test_resize_downsample_scales_(linear|cubic)_align_corners",  # onnx vs onnxruntime
    r"^test_loop16_seq_none",  # compared by tests/test_conformance.py itself
]


class _Blocker:
    """A meta-path finder that makes the named top-level modules unimportable."""

    def __init__(self, names: set[str]) -> None:
        self.names = names

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in self.names:
            raise ImportError(f"{name} is blocked (conformance.py --block)")
        return None


def block(names: set[str]) -> None:
    for n in list(sys.modules):
        if n.split(".")[0] in names:
            raise RuntimeError(f"{n} is already imported: --block must come first")
    sys.meta_path.insert(0, _Blocker(names))


def _read(path: str, tp):
    """A .pb file as the value the model's type ``tp`` (TypeProto) says it holds."""
    from onnxrun.ir.serde import tensor_to_array
    from onnxrun.proto import onnx

    with open(path, "rb") as f:
        data = f.read()
    kind = tp.WhichOneof("value") if tp is not None else "tensor_type"
    if kind == "sequence_type":
        msg = onnx.SequenceProto()
        msg.ParseFromString(data)
        return _seq(msg)
    if kind == "optional_type":
        msg = onnx.OptionalProto()
        msg.ParseFromString(data)
        return _optional(msg)
    if kind == "map_type":
        msg = onnx.MapProto()
        msg.ParseFromString(data)
        return _map(msg)
    t = onnx.TensorProto()
    t.ParseFromString(data)
    return tensor_to_array(t)


def _seq(msg):
    from onnxrun.ir.serde import tensor_to_array

    k = msg.elem_type
    if k == msg.TENSOR:
        return [tensor_to_array(t) for t in msg.tensor_values]
    if k == msg.SEQUENCE:
        return [_seq(s) for s in msg.sequence_values]
    if k == msg.MAP:
        return [_map(m) for m in msg.map_values]
    if k == msg.OPTIONAL:
        return [_optional(o) for o in msg.optional_values]
    return []


def _optional(msg):
    from onnxrun.ir.serde import tensor_to_array

    k = msg.elem_type
    if k == msg.TENSOR:
        return tensor_to_array(msg.tensor_value)
    if k == msg.SEQUENCE:
        return _seq(msg.sequence_value)
    if k == msg.MAP:
        return _map(msg.map_value)
    if k == msg.OPTIONAL:
        return _optional(msg.optional_value)
    return None


def _map(msg):

    keys = list(msg.string_keys) if len(msg.string_keys) else list(msg.keys)
    return dict(zip(keys, _seq(msg.values), strict=True))


def _compare(expected, got, where: str) -> None:
    import numpy as np

    if isinstance(expected, list):
        assert isinstance(got, list), f"{where}: expected a sequence, got {type(got).__name__}"
        assert len(got) == len(expected), f"{where}: {len(got)} elements, not {len(expected)}"
        for i, (e, g) in enumerate(zip(expected, got, strict=True)):
            _compare(e, g, f"{where}[{i}]")
        return
    if isinstance(expected, dict):
        assert isinstance(got, dict) and set(got) == set(expected), f"{where}: map keys differ"
        for k in expected:
            _compare(expected[k], got[k], f"{where}[{k!r}]")
        return
    if expected is None:
        assert got is None, f"{where}: expected None"
        return
    got = np.asarray(got)
    assert got.dtype == expected.dtype, f"{where}: dtype {got.dtype}, expected {expected.dtype}"
    assert got.shape == expected.shape, f"{where}: shape {got.shape}, expected {expected.shape}"
    if expected.dtype == object or expected.dtype.kind in "USb":
        np.testing.assert_array_equal(got, expected)
    else:
        rtol = max(1e-3, 2**-6) if expected.dtype.name == "bfloat16" else 1e-3
        if expected.dtype.kind == "V":  # other ml_dtypes narrow types: compare as float32
            got, expected = got.astype(np.float32), expected.astype(np.float32)
        np.testing.assert_allclose(got, expected, rtol=rtol, atol=1e-7)


def run_case(case_dir: str) -> tuple[str, str]:
    """('pass' | 'fail' | 'error', message) for one case folder."""
    import onnxrun
    from onnxrun.proto import onnx

    with open(os.path.join(case_dir, "model.onnx"), "rb") as f:
        data = f.read()
    mp = onnx.ModelProto()
    mp.ParseFromString(data)
    try:
        sess = onnxrun.InferenceSession(data)
    except Exception as e:
        return "error", f"{type(e).__name__}: {_short(e)}"
    init = {t.name for t in mp.graph.initializer}
    inputs = [vi for vi in mp.graph.input if vi.name not in init]
    sets = sorted(d for d in os.listdir(case_dir) if d.startswith("test_data_set_"))
    for ds in sets:
        folder = os.path.join(case_dir, ds)
        feeds = {}
        for i, vi in enumerate(inputs):
            path = os.path.join(folder, f"input_{i}.pb")
            if os.path.exists(path):
                feeds[vi.name] = _read(path, vi.type)
        expected = []
        for i, vi in enumerate(mp.graph.output):
            path = os.path.join(folder, f"output_{i}.pb")
            if os.path.exists(path):
                expected.append(_read(path, vi.type))
        try:
            got = sess.run(None, feeds)
        except Exception as e:
            return "error", f"{type(e).__name__}: {_short(e)}"
        try:
            for i, e in enumerate(expected):
                _compare(e, got[i], f"output {i}")
        except AssertionError as e:
            return "fail", _short(e)
    return "pass", ""


def _short(e: BaseException) -> str:
    text = " ".join(str(e).split())[:300]
    # Where in onnxrun it failed (the innermost frame of the first cause inside onnxrun).
    cause = e.__cause__ or e.__context__ or e
    frames = [f for f in traceback.extract_tb(cause.__traceback__) if "onnxrun" in f.filename]
    if frames:
        f = frames[-1]
        text += f" [at {f.filename.split('onnxrun/')[-1]}:{f.lineno}]"
    return text


def run_all(data_dir: str, pattern: str = "", log=print) -> dict[str, tuple[str, str]]:
    node = os.path.join(data_dir, "node")
    names = sorted(os.listdir(node))
    excluded = re.compile("|".join(EXCLUDED))
    wanted = re.compile(pattern) if pattern else None
    results: dict[str, tuple[str, str]] = {}
    t0 = time.perf_counter()
    for k, name in enumerate(names):
        if excluded.search(name) or (wanted and not wanted.search(name)):
            continue
        try:
            results[name] = run_case(os.path.join(node, name))
        except Exception as e:  # the runner's own reading of a case
            results[name] = ("error", f"runner: {type(e).__name__}: {_short(e)}")
            if os.environ.get("CONFORMANCE_TRACE"):
                traceback.print_exc()
        if log and (k + 1) % 250 == 0:
            log(f"  {k + 1}/{len(names)} cases, {time.perf_counter() - t0:.0f} s")
    return results


def summary(results: dict[str, tuple[str, str]]) -> str:
    passed = sum(1 for s, _ in results.values() if s == "pass")
    return f"conformance: {passed} of {len(results)} cases pass"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data_dir")
    ap.add_argument("--block", default="", help="comma-separated modules made unimportable")
    ap.add_argument("--json", help="write {case: [status, message]} here")
    ap.add_argument("-k", default="", help="regex: only the cases it matches")
    args = ap.parse_args(argv)
    if args.block:
        block(set(args.block.split(",")))
    import onnxrun.proto

    print(f"onnx package in use: {onnxrun.proto.HAVE_ONNX}")
    results = run_all(args.data_dir, args.k)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=0, sort_keys=True)
    print(summary(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
