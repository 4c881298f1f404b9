"""An application written for onnxruntime, using the API the way published apps do.

    python ort_app.py MODEL.onnx                      # on onnxruntime
    python -m onnxrun.compat ort_app.py MODEL.onnx    # the same file, unchanged, on onnxrun

It prints one JSON object describing everything it saw, so the two runs can be compared.
"""

from __future__ import annotations

import json
import sys
import warnings
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import onnxruntime as ort
from onnxruntime.capi.onnxruntime_pybind11_state import InvalidArgument, NoSuchFile

NUMPY_TYPES = {"tensor(float)": np.float32, "tensor(double)": np.float64,
               "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(bool)": np.bool_}


def make_feeds(session: ort.InferenceSession, batch: int, seed: int) -> dict[str, np.ndarray]:
    """Random inputs shaped from get_inputs(), symbolic dimensions set to ``batch``."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for arg in session.get_inputs():
        shape = [d if isinstance(d, int) else batch for d in arg.shape]
        dtype = NUMPY_TYPES[arg.type]
        if np.issubdtype(dtype, np.floating):
            feeds[arg.name] = rng.standard_normal(shape).astype(dtype)
        else:
            feeds[arg.name] = rng.integers(0, 5, shape).astype(dtype)
    return feeds


def encode(a: np.ndarray) -> dict:
    return {"dtype": str(a.dtype), "shape": list(a.shape), "data": a.ravel().tolist()}


def main() -> None:
    model_path = sys.argv[1]
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.log_severity_level = 3
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        session = ort.InferenceSession(
            model_path, sess_options=options,
            providers=["CUDAExecutionProvider", "CPUExecutionProvider"],
        )
    report: dict = {
        "engine": ort.InferenceSession.__module__.split(".")[0],
        "has_version": isinstance(ort.__version__, str),
        "warned_about_cuda": any("CUDAExecutionProvider" in str(w.message) for w in caught),
        "providers": session.get_providers(),
        "cpu_available": "CPUExecutionProvider" in ort.get_available_providers(),
        "device": ort.get_device(),
        "inputs": [[a.name, a.type, a.shape] for a in session.get_inputs()],
        "outputs": [[a.name, a.type, a.shape] for a in session.get_outputs()],
    }
    meta = session.get_modelmeta()
    report["meta"] = {"producer_name": meta.producer_name, "graph_name": meta.graph_name,
                      "version": meta.version, "custom": meta.custom_metadata_map}

    feeds = make_feeds(session, batch=2, seed=0)
    output_names = [o.name for o in session.get_outputs()]
    outputs = session.run(None, feeds)
    report["run"] = {name: encode(v) for name, v in zip(output_names, outputs, strict=True)}
    report["subset"] = encode(session.run([output_names[-1]], feeds)[0])

    # OrtValues and IOBinding, as latency-minded apps use them.
    io = session.io_binding()
    for name, value in feeds.items():
        io.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(value, "cpu", 0))
    for name in output_names:
        io.bind_output(name, "cpu")
    session.run_with_iobinding(io)
    report["iobinding"] = [encode(a) for a in io.copy_outputs_to_cpu()]
    ort_values = {k: ort.OrtValue.ortvalue_from_numpy(v) for k, v in feeds.items()}
    first = session.run_with_ort_values([output_names[0]], ort_values)[0]
    report["ort_values"] = {"shape": first.shape(), "type": first.data_type(),
                            "data": first.numpy().ravel().tolist()}

    # One session shared by a pool of threads, as web servers do.
    batches = [make_feeds(session, batch=1 + i % 3, seed=i) for i in range(8)]
    with ThreadPoolExecutor(max_workers=4) as pool:
        threaded = list(pool.map(lambda f: session.run(None, f), batches))
    serial = [session.run(None, f) for f in batches]
    report["threads_match_serial"] = all(
        np.array_equal(a, b)
        for t, s in zip(threaded, serial, strict=True) for a, b in zip(t, s, strict=True)
    )
    report["threads"] = [[encode(a) for a in outs] for outs in threaded]

    # Errors, caught the way apps catch them.
    bad = dict(feeds)
    name0 = session.get_inputs()[0].name
    bad[name0] = bad[name0].astype(np.float64)
    try:
        session.run(None, bad)
        report["bad_dtype"] = "no error"
    except InvalidArgument:
        report["bad_dtype"] = "InvalidArgument"
    try:
        ort.InferenceSession(model_path + ".missing", providers=["CPUExecutionProvider"])
        report["missing_model"] = "no error"
    except NoSuchFile:
        report["missing_model"] = "NoSuchFile"

    print(json.dumps(report))


if __name__ == "__main__":
    main()
