"""The GPU benchmark of issue 15: onnxrun's CUDAExecutionProvider against PyTorch on the same GPU.

    python benchmarks/gpu.py [--quick] [--out gpu.json] [--models resnet50_b1 bert_base ...]

Networks are defined here in PyTorch and exported to ONNX on the machine (no download): the
same weights run in both. Per model: PyTorch eager, PyTorch with a CUDA graph, torch.compile
(``--compile``: minutes of compilation), onnxrun without and with CUDA graphs (inputs and
outputs on the device through IOBinding), onnxrun with its convolutions on the implicit GEMM
where cuDNN's frontend would take them (``onnxrun CUDA GEMM conv``), onnxruntime-gpu where its
CUDA provider is installed; onnxrun's outputs against its CPU provider's; session creation
time and device memory. Then an LLM decode step through onnxrun.genai
(``append_provider("cuda")`` against the CPU provider, ms per token) on the builder folders
scripts/gpu_wheels.sh carries in ``.gpu-genai/``, and the light zoo. Medians of interleaved
rounds, in milliseconds; results go to stdout as a Markdown table and, row by row, to
``--out`` (JSON lines), so a run cut short keeps its rows.

``--device stand-in`` runs the same code on array-api-strict's stand-in device with tiny
shapes and PyTorch on the CPU: a check of this script on machines without a GPU (its timings
mean nothing).
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import io
import json
import math
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

import onnxrun  # noqa: E402
from onnxrun.providers.cuda import device as cuda_device  # noqa: E402

# -- networks (PyTorch) ---------------------------------------------------------------------------


def networks(torch, tiny: bool):
    nn = torch.nn
    F = torch.nn.functional

    class Bottleneck(nn.Module):
        def __init__(self, cin, width, stride):
            super().__init__()
            cout = width * 4
            self.c1, self.b1 = nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width)
            self.c2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
            self.b2 = nn.BatchNorm2d(width)
            self.c3, self.b3 = nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout)
            self.down = None
            if stride != 1 or cin != cout:
                self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                          nn.BatchNorm2d(cout))

        def forward(self, x):
            y = F.relu(self.b1(self.c1(x)))
            y = F.relu(self.b2(self.c2(y)))
            y = self.b3(self.c3(y))
            return F.relu(y + (x if self.down is None else self.down(x)))

    class ResNet50(nn.Module):
        def __init__(self):
            super().__init__()
            base = 8 if tiny else 64
            self.stem = nn.Sequential(nn.Conv2d(3, base, 7, 2, 3, bias=False), nn.BatchNorm2d(base),
                                      nn.ReLU(), nn.MaxPool2d(3, 2, 1))
            layers, cin = [], base
            for i, (n, stride) in enumerate([(3, 1), (4, 2), (6, 2), (3, 2)]):
                width = base * 2 ** i
                for j in range(1 if tiny else n):
                    layers.append(Bottleneck(cin, width, stride if j == 0 else 1))
                    cin = width * 4
            self.layers = nn.Sequential(*layers)
            self.fc = nn.Linear(cin, 1000)

        def forward(self, x):
            y = self.layers(self.stem(x))
            return self.fc(torch.flatten(F.adaptive_avg_pool2d(y, 1), 1))

    class Block(nn.Module):
        """A post-norm BERT layer written with plain operators (the exporter's graph is then
        what onnxruntime's fusions expect)."""

        def __init__(self, d, heads, ff, causal=False):
            super().__init__()
            self.h, self.causal = heads, causal
            self.qkv, self.o = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.n1, self.n2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.f1, self.f2 = nn.Linear(d, ff), nn.Linear(ff, d)

        def attend(self, x, past=None):
            B, S, D = x.shape
            q, k, v = self.qkv(x).split(D, dim=-1)
            q, k, v = (t.reshape(B, S, self.h, D // self.h).transpose(1, 2) for t in (q, k, v))
            present = None
            if past is not None:
                k = torch.cat([past[0], k], dim=2)
                v = torch.cat([past[1], v], dim=2)
                present = torch.stack([k, v])
            s = q @ k.transpose(-1, -2) / math.sqrt(D // self.h)
            a = (s.softmax(-1) @ v).transpose(1, 2).reshape(B, S, D)
            return self.o(a), present

        def forward(self, x, past=None):
            a, present = self.attend(x, past)
            x = self.n1(x + a)
            x = self.n2(x + self.f2(F.gelu(self.f1(x))))
            return x if past is None else (x, present)

    class Encoder(nn.Module):
        def __init__(self, d, heads, ff, layers, vocab=30522):
            super().__init__()
            self.emb, self.pos = nn.Embedding(vocab, d), nn.Embedding(512, d)
            self.norm = nn.LayerNorm(d)
            self.blocks = nn.ModuleList(Block(d, heads, ff) for _ in range(layers))

        def forward(self, ids):
            pos = torch.arange(ids.shape[1], device=ids.device)
            x = self.norm(self.emb(ids) + self.pos(pos))
            for b in self.blocks:
                x = b(x)
            return x

    class DecoderStep(nn.Module):
        """A GPT-2-shaped decoder's step: one new token per sequence against a KV cache."""

        def __init__(self, d, heads, layers, vocab=50257):
            super().__init__()
            self.emb = nn.Embedding(vocab, d)
            self.blocks = nn.ModuleList(Block(d, heads, 4 * d) for _ in range(layers))
            self.head = nn.Linear(d, vocab, bias=False)

        def forward(self, ids, past):
            x = self.emb(ids)
            presents = []
            for i, b in enumerate(self.blocks):
                x, p = b(x, past[i])
                presents.append(p)
            return self.head(x), torch.stack(presents)

    return ResNet50, Encoder, DecoderStep


def cases(torch, tiny: bool, quick: bool):
    ResNet50, Encoder, DecoderStep = networks(torch, tiny)
    img = 32 if tiny else 224
    seq = 16 if tiny else 128
    L = 2 if tiny else 12
    d = 64 if tiny else 768
    past = 8 if tiny else 128
    gen = np.random.default_rng(0)
    out = [
        ("resnet50_b1", ResNet50, {"x": gen.standard_normal((1, 3, img, img), np.float32)}),
        ("resnet50_b32", ResNet50,
         {"x": gen.standard_normal((4 if tiny else 32, 3, img, img), np.float32)}),
        ("bert_base_8x128", lambda: Encoder(d, 4 if tiny else 12, 4 * d, L),
         {"ids": gen.integers(0, 30522, (8, seq))}),
        ("minilm_8x128", lambda: Encoder(d // 2, 4 if tiny else 12, 2 * d, L // 2),
         {"ids": gen.integers(0, 30522, (8, seq))}),
        ("gpt_decoder_step_b8_past128", lambda: DecoderStep(d, 4 if tiny else 12, L),
         {"ids": gen.integers(0, 50257, (8, 1)),
          "past": (0.1 * gen.standard_normal((L, 2, 8, 4 if tiny else 12, past,
                                              d // (4 if tiny else 12)))).astype(np.float32)}),
    ]
    return out[:3] if quick else out


def export(torch, module, feeds) -> bytes:
    args = tuple(torch.from_numpy(v) for v in feeds.values())
    buf = io.BytesIO()
    with torch.no_grad():
        torch.onnx.export(module, args, buf, input_names=list(feeds), opset_version=17,
                          do_constant_folding=True, dynamo=False)
    return buf.getvalue()


# -- timing ----------------------------------------------------------------------------------------


def rel_diff(got: np.ndarray, want: np.ndarray) -> float:
    """The largest difference relative to the reference's largest magnitude."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.max(np.abs(got - want), initial=0.0) / (np.max(np.abs(want), initial=0.0)
                                                             or 1.0))


def median_ms(fns: dict, rounds: int, warm: int = 3) -> dict:
    """Median milliseconds per call of each function, timed round-robin (interleaved)."""
    for fn in fns.values():
        for _ in range(warm):
            fn()
    times = {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            t = time.perf_counter()
            fn()
            times[k].append((time.perf_counter() - t) * 1e3)
    return {k: statistics.median(v) for k, v in times.items()}


def torch_runners(torch, module, feeds, on_gpu: bool, compile_: bool) -> dict:
    dev = "cuda" if on_gpu else "cpu"
    module = module.to(dev).eval()
    inputs = [torch.from_numpy(v).to(dev) for v in feeds.values()]
    sync = torch.cuda.synchronize if on_gpu else (lambda: None)
    runners = {}

    def eager():
        with torch.inference_mode():
            module(*inputs)
        sync()

    runners["torch eager"] = eager
    if on_gpu:
        static = [t.clone() for t in inputs]
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.inference_mode(), torch.cuda.stream(s):
            for _ in range(3):
                module(*static)
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.inference_mode(), torch.cuda.graph(graph):
            module(*static)

        def replay():
            graph.replay()
            sync()

        replay.inputs = static  # the graph reads these addresses: they live as long as it
        runners["torch CUDA graph"] = replay
    if compile_:
        compiled = torch.compile(module, mode="max-autotune-no-cudagraphs")

        def run_compiled():
            with torch.inference_mode():
                compiled(*inputs)
            sync()

        runners["torch.compile"] = run_compiled
    return runners


def cudnn_available(stand_in: bool) -> bool:
    if stand_in:
        return False
    from onnxrun.providers.cuda.cupy import cudnn

    return cudnn.available()


def onnxrun_runners(model: bytes, feeds: dict, graphs: bool, gemm_conv: bool = False
                    ) -> tuple[dict, dict]:
    """onnxrun with device-resident inputs and outputs (IOBinding). ``gemm_conv``: the
    convolutions on the implicit GEMM even where cuDNN (nvidia-cudnn-frontend) imports."""
    providers = [("CUDAExecutionProvider", {"enable_cuda_graph": "1" if graphs else "0"}),
                 "CPUExecutionProvider"]
    t = time.perf_counter()
    if gemm_conv:
        from onnxrun.providers.cuda.cupy import cudnn

        with cudnn.disabled():
            sess = onnxrun.InferenceSession(model, providers=providers)
    else:
        sess = onnxrun.InferenceSession(model, providers=providers)
    created = (time.perf_counter() - t) * 1e3
    binding = sess.io_binding()
    for name, value in feeds.items():
        binding.bind_ortvalue_input(name, onnxrun.OrtValue.ortvalue_from_numpy(value, "cuda", 0))
    for o in sess.get_outputs():
        binding.bind_output(o.name, "cuda")

    def run():
        sess.run_with_iobinding(binding)

    run()
    placed = sess.get_optimization_report().placement
    info = {"create_ms": round(created, 1), "nodes": dict(placed.nodes),
            "copies": len(placed.copies), "outputs": binding.copy_outputs_to_cpu()}
    label = "onnxrun CUDA graph" if graphs else "onnxrun CUDA"
    if gemm_conv:
        label = "onnxrun CUDA GEMM conv"
    return {label: run}, info


def ort_gpu_runner(model: bytes, feeds: dict) -> dict:
    try:
        import onnxruntime as ort
    except ImportError:
        return {}
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return {}
    sess = ort.InferenceSession(model, providers=["CUDAExecutionProvider"])
    binding = sess.io_binding()
    for name, value in feeds.items():
        binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(value, "cuda", 0))
    for o in sess.get_outputs():
        binding.bind_output(o.name, "cuda")
    return {"onnxruntime-gpu": lambda: sess.run_with_iobinding(binding)}


def genai_folders(stand_in: bool) -> list[str]:
    """The builder folders of the LLM decode rows: scripts/gpu_wheels.sh's .gpu-genai/ (llama
    small int4; the tiny ones on the stand-in)."""
    root = os.path.join(os.path.dirname(__file__), "..", ".gpu-genai")
    return sorted(glob.glob(os.path.join(root, "*-tiny-*" if stand_in else "*-small-*")))


def genai_row(path: str, card: str, rounds: int, prompt: int = 32, new: int = 32) -> dict:
    """An LLM decode step through onnxrun.genai, append_provider("cuda") against the CPU
    provider, interleaved: milliseconds per generated token (the prompt not counted), and the
    first logits' largest difference."""
    import onnxrun.genai as rg

    models, first = {}, {}
    for label, cuda in (("onnxrun CUDA", True), ("onnxrun CPU", False)):
        config = rg.Config(path)
        if cuda:
            config.clear_providers()
            config.append_provider("cuda")
        t = time.perf_counter()
        models[label] = rg.Model(config)
        first[label + " create_ms"] = round((time.perf_counter() - t) * 1e3, 1)
    ids = np.random.default_rng(0).integers(10, 200, (1, prompt)).astype(np.int32)
    logits = {}

    def decode(label: str) -> float:
        model = models[label]
        params = rg.GeneratorParams(model)
        params.set_search_options(max_length=prompt + new)
        gen = rg.Generator(model, params)
        gen.append_tokens(ids)
        logits[label] = gen.get_output("logits").reshape(-1)
        gen.generate_next_token()
        t = time.perf_counter()
        while not gen.is_done():
            gen.generate_next_token()
        return (time.perf_counter() - t) * 1e3 / (new - 1)

    times = {k: [] for k in models}
    for _ in range(rounds):
        for label in models:
            times[label].append(decode(label))
    want = logits["onnxrun CPU"]
    row = {"model": f"genai {os.path.basename(path)} decode (ms/token)", "card": card,
           "max_rel_diff_vs_cpu": rel_diff(logits["onnxrun CUDA"], want),
           "create_ms": first["onnxrun CUDA create_ms"]}
    row.update({f"{k} ms": round(statistics.median(v), 3) for k, v in times.items()})
    return row


def device_memory_mb() -> float | None:
    try:
        import cupy

        return round(cupy.get_default_memory_pool().total_bytes() / 2 ** 20, 1)
    except Exception:  # noqa: BLE001 - no CuPy: nothing to report
        return None


# -- main ------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="three models, fewer rounds")
    ap.add_argument("--compile", action="store_true", help="also torch.compile (slow)")
    ap.add_argument("--models", nargs="*", help="only these (names as in the table)")
    ap.add_argument("--out", help="JSON lines, one per row, written as rows finish")
    ap.add_argument("--device", choices=["cuda", "stand-in"], default="cuda")
    args = ap.parse_args(argv)
    stand_in = args.device == "stand-in"
    ctx = cuda_device.stand_in() if stand_in else contextlib.nullcontext()
    rounds = 5 if stand_in else (20 if args.quick else 50)
    out = open(args.out, "a", encoding="utf-8") if args.out else None
    rows = []

    def emit(row):
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "outputs"}), flush=True)
        if out:
            out.write(json.dumps(row) + "\n")
            out.flush()

    with ctx:
        if "CUDAExecutionProvider" not in onnxrun.get_available_providers():
            print("no CUDA device: CuPy finds no GPU (see docs/GPU.md)", file=sys.stderr)
            return 2
        card = "array-api-strict stand-in"
        if not stand_in:
            import cupy

            card = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
        print(f"# onnxrun GPU benchmark on {card}, {time.strftime('%Y-%m-%d %H:%M')}",
              flush=True)
        try:
            import torch
        except ImportError:
            torch = None
        if torch is not None:
            torch.manual_seed(0)
            for name, make, feeds in cases(torch, stand_in, args.quick):
                if args.models and name not in args.models:
                    continue
                module = make().eval()
                model = export(torch, module, feeds)
                ref = onnxrun.InferenceSession(model, providers=["CPUExecutionProvider"])
                want = ref.run(None, feeds)
                fns = torch_runners(torch, module, feeds, not stand_in, args.compile)
                row = {"model": name, "card": card}
                for graphs in (False, True):
                    try:
                        runner, info = onnxrun_runners(model, feeds, graphs)
                    except Exception as e:  # noqa: BLE001 - reported in the row
                        row[f"error{' graphs' if graphs else ''}"] = f"{type(e).__name__}: {e}"
                        continue
                    fns.update(runner)
                    got = info.pop("outputs")
                    diffs = [rel_diff(g, w) for g, w in zip(got, want, strict=True)]
                    row["max_rel_diff_vs_cpu"] = max(row.get("max_rel_diff_vs_cpu", 0.0),
                                                     *diffs)
                    row[f"rel_diff_per_output{' (graphs)' if graphs else ''}"] = diffs
                    row.update({f"{k}{' (graphs)' if graphs else ''}": v
                                for k, v in info.items()})
                if cudnn_available(stand_in):  # both convolution paths, side by side
                    runner, _ = onnxrun_runners(model, feeds, False, gemm_conv=True)
                    fns.update(runner)
                fns.update(ort_gpu_runner(model, feeds))
                row.update({f"{k} ms": round(v, 3) for k, v in median_ms(fns, rounds).items()})
                row["device_memory_mb"] = device_memory_mb()
                if not stand_in:
                    peak = torch.cuda.max_memory_allocated()
                    row["torch_max_memory_mb"] = round(peak / 2 ** 20, 1)
                emit(row)
        else:
            print("PyTorch is not installed: PyTorch rows skipped", file=sys.stderr)
        for path in genai_folders(stand_in):
            name = os.path.basename(path)
            if args.models and f"genai {name}" not in args.models:
                continue
            emit(genai_row(path, card, 3 if stand_in or args.quick else 7))
        import onnx

        light = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
        for path in sorted(glob.glob(os.path.join(light, "light_*.onnx"))):
            name = os.path.basename(path)[6:-5]
            if args.models and name not in args.models or stand_in and name != "squeezenet":
                continue
            model = onnx.load(path)
            feeds = {}
            inits = {t.name for t in model.graph.initializer}
            for vi in model.graph.input:
                if vi.name not in inits:
                    shape = [dd.dim_value or 1 for dd in vi.type.tensor_type.shape.dim]
                    n = int(np.prod(shape))
                    feeds[vi.name] = (np.arange(n).reshape(shape) / n).astype(np.float32)
            data = model.SerializeToString()
            want = onnxrun.InferenceSession(data, providers=["CPUExecutionProvider"]).run(
                None, feeds)[0]
            row, fns = {"model": f"zoo {name}", "card": card}, {}
            for graphs in (False, True):
                runner, info = onnxrun_runners(data, feeds, graphs)
                fns.update(runner)
                row["max_rel_diff_vs_cpu"] = max(row.get("max_rel_diff_vs_cpu", 0.0),
                                                 rel_diff(info.pop("outputs")[0], want))
                row.update({f"{k}{' (graphs)' if graphs else ''}": v for k, v in info.items()})
            if cudnn_available(stand_in):
                fns.update(onnxrun_runners(data, feeds, False, gemm_conv=True)[0])
            row.update({f"{k} ms": round(v, 3) for k, v in median_ms(fns, rounds).items()})
            emit(row)
    print_table(rows)
    return 0


def print_table(rows: list[dict]) -> None:
    cols = ["torch eager ms", "torch CUDA graph ms", "torch.compile ms", "onnxrun CUDA ms",
            "onnxrun CUDA graph ms", "onnxrun CUDA GEMM conv ms", "onnxruntime-gpu ms",
            "onnxrun CPU ms"]
    print("\n| model | " + " | ".join(c[:-3] for c in cols) + " | create ms | rel diff |")
    print("|---" * (len(cols) + 3) + "|")
    for r in rows:
        cells = [str(r.get(c, "-")) for c in cols]
        diff = r.get("max_rel_diff_vs_cpu", "-")
        diff = f"{diff:.1e}" if isinstance(diff, float) else diff
        print(f"| {r['model']} | " + " | ".join(cells) + f" | {r.get('create_ms', '-')} | "
              f"{diff} |")


if __name__ == "__main__":
    sys.exit(main())
