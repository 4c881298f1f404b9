"""onnxrun.genai with ``config.append_provider("cuda")``: a builder folder (tests/genai's tiny
ones) generates on the CUDA provider, every node on the device but the shape arithmetic, the
KV cache a device buffer written in place; fp32 greedy tokens equal the CPU provider's, int4
logits within tolerance of them (the CPU quantizes A to int8 at accuracy_level 4, onnxruntime's
CUDA provider does not)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import onnxrun
import onnxrun.genai as rg
from onnxrun import errors
from onnxrun.providers.cuda import device

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "genai"))
import make_models  # noqa: E402

PROMPT = np.array([[5, 17, 42, 99, 7, 300, 12]], np.int32)
# shape arithmetic, and the mask -> seqlens_k chain only host inputs read (partition.py)
SHAPE_MATH = {"Shape", "Gather", "Cast", "Size", "Squeeze", "Unsqueeze", "Concat", "Sub", "Add",
              "ReduceSum"}


# the folders scripts/gpu_wheels.sh builds for the GPU machine, which cannot build them
CARRIED = Path(__file__).resolve().parent.parent.parent / ".gpu-genai"


@pytest.fixture(scope="module")
def folder():
    missing = make_models.missing_packages()
    built = {}

    def get(arch: str, fmt: str) -> str:
        if (arch, fmt) not in built:
            carried = CARRIED / f"{arch}-tiny-{fmt}"
            if carried.is_dir():
                built[arch, fmt] = str(carried)
            elif missing:
                pytest.skip(f"genai model folders need {', '.join(missing)} (the genai-test "
                            "extra), or scripts/gpu_wheels.sh's .gpu-genai/")
            else:
                built[arch, fmt] = str(make_models.build(arch, "tiny", fmt))
        return built[arch, fmt]

    return get


def _model(path: str, cuda: bool) -> rg.Model:
    config = rg.Config(path)
    if cuda:
        config.clear_providers()
        config.append_provider("cuda")
    return rg.Model(config)


def _greedy(model: rg.Model, max_length: int = 40) -> list[int]:
    params = rg.GeneratorParams(model)
    params.set_search_options(max_length=max_length)
    gen = rg.Generator(model, params)
    gen.append_tokens(PROMPT)
    while not gen.is_done():
        gen.generate_next_token()
    return gen.get_sequence(0).tolist()


def _forced_logits(model: rg.Model, tokens: list[int]) -> list[np.ndarray]:
    """The logits after the prompt and after each of ``tokens`` fed one at a time."""
    params = rg.GeneratorParams(model)
    params.set_search_options(max_length=PROMPT.shape[1] + len(tokens) + 1)
    gen = rg.Generator(model, params)
    gen.append_tokens(PROMPT)
    out = [gen.get_output("logits").reshape(-1)]
    for t in tokens:
        gen.append_tokens(np.array([[t]], np.int32))
        out.append(gen.get_output("logits").reshape(-1))
    return out


@pytest.mark.parametrize("arch", ["llama", "qwen2", "phi3"])
def test_fp32_greedy_tokens_equal_the_cpu_providers(on_device, folder, arch):
    path = folder(arch, "fp32")
    want = _greedy(_model(path, cuda=False))
    model = _model(path, cuda=True)
    assert model.device_type == "CUDA" and rg.is_cuda_available()
    got = _greedy(model)
    placed = model.session.get_optimization_report().placement
    assert got == want
    assert placed.nodes["CUDAExecutionProvider"] > 20, placed.format()


@pytest.mark.parametrize("arch", ["llama", "qwen2", "phi3"])
def test_int4_logits_within_tolerance_and_every_node_on_the_device(on_device, folder, arch):
    path = folder(arch, "int4")
    tokens = _greedy(_model(path, cuda=False), 24)[PROMPT.shape[1]:]
    want = _forced_logits(_model(path, cuda=False), tokens)
    so = onnxrun.SessionOptions()
    so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    got = _forced_logits(_model(path, cuda=True), tokens)
    sess = onnxrun.InferenceSession(str(Path(path) / "model.onnx"), so,
                                    providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    scale = max(float(np.abs(w).max()) for w in want)
    for step, (g, w) in enumerate(zip(got, want, strict=True)):
        assert float(np.abs(g - w).max()) < 0.02 * scale, f"step {step}"
    placed: dict[str, set[str]] = {}
    for sg in sess.get_provider_graph_assignment_info():  # one entry per node
        placed.setdefault(sg.ep_name, set()).update(n.op_type for n in sg.get_nodes())
    assert placed.get("CPUExecutionProvider", set()) <= SHAPE_MATH, placed
    assert {"MatMulNBits", "GroupQueryAttention", "SkipSimplifiedLayerNormalization"} <= \
        placed["CUDAExecutionProvider"]


def test_the_kv_cache_stays_on_the_device(on_device, folder, monkeypatch):
    """A decode step moves only its ids, mask and logits: no copy of the cache either way."""
    path = folder("llama", "fp32")
    model = _model(path, cuda=True)
    params = rg.GeneratorParams(model)
    params.set_search_options(max_length=20)
    gen = rg.Generator(model, params)
    gen.append_tokens(PROMPT)
    gen.generate_next_token()
    backend = model.session._device.backend
    moved = []
    for name in ("to_host", "to_device"):
        real = getattr(type(backend), name)

        def counted(self, x, real=real, name=name):
            moved.append((name, tuple(x.shape)))
            return real(self, x)

        monkeypatch.setattr(type(backend), name, counted)
    gen.generate_next_token()
    cache = (1, model.kv_heads, 20, model.head_size)
    assert moved and cache not in [shape for _, shape in moved], moved


@pytest.mark.parametrize("arch", ["llama", "phi3"])
def test_beam_search_on_the_device(on_device, folder, arch):
    """Beams keep the cache as present -> past (no shared buffer): the CPU provider's beams."""
    path = folder(arch, "fp32")
    got = []
    for cuda in (False, True):
        model = _model(path, cuda)
        params = rg.GeneratorParams(model)
        params.set_search_options(max_length=24, num_beams=3, num_return_sequences=2)
        gen = rg.Generator(model, params)
        gen.append_tokens(PROMPT)
        while not gen.is_done():
            gen.generate_next_token()
        got.append([gen.get_sequence(i).tolist() for i in range(2)])
    assert got[0] == got[1]


def test_cuda_without_a_device_is_refused(folder):
    if device.cupy_gpu_count():
        pytest.skip("CuPy finds a GPU")
    config = rg.Config(folder("llama", "fp32"))
    config.append_provider("cuda")
    with pytest.raises(errors.EPFail, match="CUDAExecutionProvider is not available"):
        rg.Model(config)
    assert not rg.is_cuda_available()
