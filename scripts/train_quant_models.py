"""Train the small models that ``tests/test_quantization.py`` quantizes, on datasets that ship
with scikit-learn (no download), and save them under ``tests/models/quant/``.

Run ``python scripts/train_quant_models.py`` (needs torch and scikit-learn; the package and the
tests never import this file). Each model is trained on CPU from a fixed seed, exported with
torch's TorchScript exporter (``torch.onnx.export(..., dynamo=False)``, opset 17), and saved
next to ``<name>.npz`` holding its held-out test split (``x_test``, ``y_test``) and a few
training samples for calibration (``x_calib``), so the tests need neither torch nor sklearn:

- ``digits_cnn``: a small CNN (three 3x3 convolutions with ReLU, a max pooling, a residual Add,
  global average pooling, a linear classifier) on the 8x8 handwritten digits (1797 images, 10
  classes); input ``image`` float32 [batch, 1, 8, 8] with pixels scaled to [0, 1].
- ``cancer_mlp``: an MLP (30 -> 64 -> 32 -> 2 with ReLU) on the Wisconsin breast cancer table
  (569 rows, 30 features), standardization built into the graph (Sub, Div); input ``features``
  float32 [batch, 30].

The script prints each model's float accuracy on its test split (onnxruntime's, when installed,
must agree with torch's).
"""

from __future__ import annotations

import argparse
import random
import warnings
from pathlib import Path

import numpy as np
import onnx
import torch
from sklearn.datasets import load_breast_cancer, load_digits
from sklearn.model_selection import train_test_split
from torch import nn

OUT_DIR = Path(__file__).resolve().parent.parent / "tests" / "models" / "quant"
SEED = 2024


def seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


class DigitsCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.conv3 = nn.Conv2d(32, 32, 3, padding=1)
        self.fc = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.conv1(x))
        x = self.pool(torch.relu(self.conv2(x)))
        x = torch.relu(self.conv3(x) + x)  # residual: an Add of two activations
        x = torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1)
        return self.fc(x)


class CancerMLP(nn.Module):
    def __init__(self, mean: np.ndarray, std: np.ndarray) -> None:
        super().__init__()
        self.register_buffer("mean", torch.from_numpy(mean.astype(np.float32)))
        self.register_buffer("std", torch.from_numpy(std.astype(np.float32)))
        self.net = nn.Sequential(nn.Linear(30, 64), nn.ReLU(), nn.Linear(64, 32), nn.ReLU(),
                                 nn.Linear(32, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net((x - self.mean) / self.std)


def train(model: nn.Module, x: np.ndarray, y: np.ndarray, epochs: int, lr: float,
          batch: int = 32) -> None:
    opt = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=1e-4)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    gen = torch.Generator().manual_seed(SEED)
    model.train()
    for _ in range(epochs):
        order = torch.randperm(len(xt), generator=gen)
        for i in range(0, len(xt), batch):
            idx = order[i:i + batch]
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(xt[idx]), yt[idx])
            loss.backward()
            opt.step()
    model.eval()


def accuracy(model: nn.Module, x: np.ndarray, y: np.ndarray) -> float:
    with torch.no_grad():
        return float((model(torch.from_numpy(x)).argmax(1).numpy() == y).mean())


def export(model: nn.Module, name: str, input_name: str, example: np.ndarray) -> Path:
    path = OUT_DIR / f"{name}.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (torch.from_numpy(example),), str(path), dynamo=False,
                          opset_version=17, input_names=[input_name], output_names=["logits"],
                          dynamic_axes={input_name: {0: "batch"}, "logits": {0: "batch"}},
                          do_constant_folding=True)
    m = onnx.load(str(path))
    m.producer_name, m.producer_version = "pytorch", torch.__version__
    m.doc_string = f"onnxrun quantization test model {name} (scripts/train_quant_models.py)"
    onnx.checker.check_model(m, full_check=True)
    onnx.save(m, str(path))
    return path


def check_with_onnxruntime(path: Path, input_name: str, x: np.ndarray, y: np.ndarray,
                           expected: float) -> None:
    try:
        import onnxruntime as ort
    except ImportError:
        return
    logits = ort.InferenceSession(str(path)).run(None, {input_name: x})[0]
    acc = float((logits.argmax(1) == y).mean())
    if abs(acc - expected) > 1e-9:
        raise SystemExit(f"{path.name}: onnxruntime's accuracy {acc} != torch's {expected}")


def make_digits() -> None:
    seed_all(SEED)
    data = load_digits()
    x = (data.images / 16.0).astype(np.float32)[:, None]  # [N, 1, 8, 8] in [0, 1]
    y = data.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.2, random_state=SEED,
                                                        stratify=y)
    model = DigitsCNN()
    train(model, x_train, y_train, epochs=30, lr=3e-3)
    acc = accuracy(model, x_test, y_test)
    path = export(model, "digits_cnn", "image", x_test[:2])
    check_with_onnxruntime(path, "image", x_test, y_test, acc)
    np.savez_compressed(OUT_DIR / "digits_cnn.npz", x_test=x_test, y_test=y_test,
                        x_calib=x_train[:128])
    print(f"digits_cnn: test accuracy {acc:.4f} on {len(y_test)} images, "
          f"{path.stat().st_size} bytes")


def make_cancer() -> None:
    seed_all(SEED + 1)
    data = load_breast_cancer()
    x = data.data.astype(np.float32)
    y = data.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.3, random_state=SEED,
                                                        stratify=y)
    model = CancerMLP(x_train.mean(0), x_train.std(0) + 1e-6)
    train(model, x_train, y_train, epochs=60, lr=1e-3)
    acc = accuracy(model, x_test, y_test)
    path = export(model, "cancer_mlp", "features", x_test[:2])
    check_with_onnxruntime(path, "features", x_test, y_test, acc)
    np.savez_compressed(OUT_DIR / "cancer_mlp.npz", x_test=x_test, y_test=y_test,
                        x_calib=x_train[:128])
    print(f"cancer_mlp: test accuracy {acc:.4f} on {len(y_test)} rows, "
          f"{path.stat().st_size} bytes")


MODELS = {"digits_cnn": make_digits, "cancer_mlp": make_cancer}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", choices=[[], *MODELS], help="models (default: all)")
    args = parser.parse_args()
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)  # reproducible float sums
    for name in args.names or MODELS:
        MODELS[name]()


if __name__ == "__main__":
    main()
