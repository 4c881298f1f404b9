"""A library never changes its host process globally: after onnxrun has created and run a
session (``enable_cpu_mem_arena`` on, the default), the host's malloc behaves as it did without
onnxrun. Each case runs in a fresh interpreter, since malloc's settings are per process."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

# Allocates and frees ~250 MB of numpy buffers (15 x 16 MiB, every page touched) and reports how
# much of it stays resident. "onnxrun" first creates and runs a session with default options.
# ctypes.CDLL is spied on, since that is how Python code reaches glibc's mallopt. 16 MiB blocks
# are mapped and unmapped by glibc's defaults unless something freed a mapped block larger than
# that (its threshold adapts, up to 32 MiB), and 240 MiB stays under the 256 MiB trim threshold
# onnxrun used to set: with that setting they would all stay resident.
HOST = textwrap.dedent("""
    import ctypes, json, os, sys

    reached = []

    class Spy(ctypes.CDLL):
        def __getattr__(self, name):
            reached.append(name)
            return super().__getattr__(name)

        def __getitem__(self, name):
            reached.append(name)
            return super().__getitem__(name)

    ctypes.CDLL = Spy
    import numpy as np

    if sys.argv[1] == "onnxrun":
        import onnx.parser

        import onnxrun

        model = onnx.parser.parse_model('''
            <ir_version: 8, opset_import: ["" : 17]>
            g (float[N, 256] x) => (float[N, 256] y) { t = Relu(x)  y = Mul(t, t) }''')
        sess = onnxrun.InferenceSession(model.SerializeToString())
        for _ in range(3):
            sess.run(None, {"x": np.ones((1024, 256), np.float32)})

    def resident():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    before = resident()
    buffers = [np.ones(16 << 20, np.uint8) for _ in range(15)]
    peak = resident()
    del buffers
    print(json.dumps({"peak": peak - before, "kept": resident() - before,
                      "mallopt": "mallopt" in reached}))
""")


def _host(mode: str) -> dict:
    out = subprocess.run([sys.executable, "-c", HOST, mode], capture_output=True, text=True,
                         timeout=300, check=True).stdout
    return json.loads(out.splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm")
def test_host_gets_its_freed_memory_back():
    alone, with_onnxrun = _host("numpy only"), _host("onnxrun")
    assert alone["peak"] > 200 << 20 and with_onnxrun["peak"] > 200 << 20  # the pages were used
    assert not with_onnxrun["mallopt"], "onnxrun reached glibc's mallopt"
    # what the host frees goes back as it does without onnxrun (it kept ~250 MB when onnxrun
    # set glibc's mmap and trim thresholds for the whole process)
    assert with_onnxrun["kept"] <= alone["kept"] + (32 << 20), (alone, with_onnxrun)
