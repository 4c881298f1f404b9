"""Calibration: the ranges of a model's activations over sample inputs, for static quantization.

The model runs on onnxrun with the tensors to calibrate added as graph outputs; each batch that a
:class:`CalibrationDataReader` yields updates running statistics (min/max, or a histogram), and
:meth:`CalibraterBase.compute_data` turns them into ranges:

- ``MinMax``: the smallest and largest value seen (or, with ``moving_average``, the mean of the
  per-batch extremes, as onnxruntime's tool computes it),
- ``Entropy``: the symmetric threshold whose 128-level quantization of the value histogram has
  the least KL divergence from it (TensorRT's method), searched over all candidates at once,
- ``Percentile``: the range holding ``percentile`` % of the values (of their magnitudes by default).

The classes and their arguments are onnxruntime's (``create_calibrator``,
``MinMaxCalibrater``...). A text progress bar over the batches goes to stderr.
"""

from __future__ import annotations

import abc
import itertools
import json
import math
import os
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import onnx
from onnx import ModelProto, TensorProto

from .quant_types import CalibrationMethod

_FLOAT_TYPES = (TensorProto.FLOAT, TensorProto.FLOAT16)
# Batches of values kept before they are folded into a histogram: up to this many bytes, the
# histogram is built once over all of them, exactly as onnxruntime's tool builds it.
_PENDING_BYTES = 256 << 20


class CalibrationDataReader(metaclass=abc.ABCMeta):
    """Yields calibration inputs: ``get_next()`` returns a feed dict, then None when done."""

    @classmethod
    def __subclasshook__(cls, subclass):
        return (hasattr(subclass, "get_next") and callable(subclass.get_next)) or NotImplemented

    @abc.abstractmethod
    def get_next(self) -> dict:
        """The next input feed (name -> array), or None when the data is exhausted."""
        raise NotImplementedError

    def __iter__(self):
        return self

    def __next__(self):
        result = self.get_next()
        if result is None:
            raise StopIteration
        return result

    def __len__(self):
        raise NotImplementedError

    def set_range(self, start_index: int, end_index: int):
        raise NotImplementedError


class FeedsDataReader(CalibrationDataReader):
    """A reader over a list of feed dicts; ``rewind()`` starts it over."""

    def __init__(self, feeds: Iterable[Mapping[str, np.ndarray]]) -> None:
        self.feeds = [dict(f) for f in feeds]
        self.start, self.end = 0, len(self.feeds)
        self.rewind()

    def get_next(self) -> dict | None:
        if self.pos >= self.end:
            return None
        self.pos += 1
        return self.feeds[self.pos - 1]

    def rewind(self) -> None:
        self.pos = self.start

    def __len__(self) -> int:
        return self.end - self.start

    def set_range(self, start_index: int, end_index: int) -> None:
        self.start, self.end = max(0, start_index), min(len(self.feeds), end_index)
        self.rewind()


class TensorData:
    """Calibration result of one tensor: ``lowest``/``highest`` and, for histogram methods,
    ``hist``/``hist_edges``."""

    _allowed = frozenset(["avg", "std", "lowest", "highest", "hist", "hist_edges", "bins"])
    _floats = frozenset(["avg", "std", "lowest", "highest", "hist_edges"])

    def __init__(self, **kwargs: Any) -> None:
        self._attrs = list(kwargs)
        for k, v in kwargs.items():
            if k not in self._allowed:
                raise ValueError(f"unexpected value {k!r} not in {sorted(self._allowed)}")
            if k in self._floats:
                v = np.asarray(v)
                if v.dtype.kind != "f":
                    v = v.astype(np.float32)
            setattr(self, k, v)

    @property
    def range_value(self) -> tuple[np.ndarray, np.ndarray]:
        if "lowest" not in self._attrs or "highest" not in self._attrs:
            raise AttributeError(f"no range in {self._attrs}")
        return self.lowest, self.highest

    @property
    def avg_std(self) -> tuple[np.ndarray, np.ndarray]:
        if "avg" not in self._attrs or "std" not in self._attrs:
            raise AttributeError(f"no avg/std in {self._attrs}")
        return self.avg, self.std

    def to_dict(self) -> dict[str, Any]:
        return {**{k: getattr(self, k) for k in self._attrs}, "CLS": type(self).__name__}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TensorData:
        """The inverse of :meth:`to_dict` after a JSON round trip (``save_tensors_data``)."""
        return cls(**{k: _from_json(v) for k, v in d.items() if k != "CLS"})

    def __repr__(self) -> str:
        parts = ", ".join(f"{k}={getattr(self, k)!r}" for k in self._attrs
                          if k in ("lowest", "highest", "avg", "std"))
        return f"TensorData({parts})"


class TensorsData(Mapping):
    """Tensor name -> :class:`TensorData`, with the method that computed them."""

    def __init__(self, calibration_method: CalibrationMethod,
                 data: Mapping[str, TensorData | tuple]) -> None:
        self.calibration_method = calibration_method
        self.data: dict[str, TensorData] = {}
        for k, v in data.items():
            if isinstance(v, tuple):  # (lowest, highest[, hist, hist_edges]), onnxruntime's form
                if len(v) == 4:
                    v = TensorData(lowest=v[0], highest=v[1], hist=v[2], hist_edges=v[3])
                elif len(v) == 2:
                    v = TensorData(lowest=v[0], highest=v[1])
                else:
                    raise TypeError(f"unexpected tuple of {len(v)} items for {k!r}")
            if not isinstance(v, TensorData):
                raise TypeError(f"unexpected {type(v)} for {k!r}")
            self.data[k] = v

    def __getitem__(self, key: str) -> TensorData:
        return self.data[key]

    def __setitem__(self, key: str, value: TensorData) -> None:
        self.data[key] = value

    def __iter__(self):
        return iter(self.data)

    def __len__(self) -> int:
        return len(self.data)

    def __contains__(self, key: object) -> bool:
        return key in self.data

    def to_dict(self) -> dict[str, Any]:
        return {"CLS": type(self).__name__, "data": self.data,
                "calibration_method": self.calibration_method}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TensorsData:
        method = d["calibration_method"]
        if isinstance(method, Mapping):  # {"CLS": "CalibrationMethod", "value": "...MinMax"}
            method = CalibrationMethod[str(method["value"]).split(".")[-1]]
        elif isinstance(method, str):
            method = CalibrationMethod[method.split(".")[-1]]
        return cls(method, {k: TensorData.from_dict(v) for k, v in d["data"].items()})


class CalibrationCacheEncoder(json.JSONEncoder):
    """JSON for calibration results: arrays keep their dtype, enums their name."""

    def default(self, obj: Any) -> Any:
        if isinstance(obj, (TensorData, TensorsData)):
            return obj.to_dict()
        if isinstance(obj, np.ndarray):
            return {"data": obj.tolist(), "dtype": str(obj.dtype), "CLS": "numpy.array"}
        if isinstance(obj, CalibrationMethod):
            return {"CLS": type(obj).__name__, "value": str(obj)}
        if isinstance(obj, np.integer):
            return int(obj)
        if isinstance(obj, np.floating):
            return float(obj)
        return super().default(obj)


def _from_json(v: Any) -> Any:
    if isinstance(v, Mapping) and v.get("CLS") == "numpy.array":
        return np.array(v["data"], dtype=np.dtype(v["dtype"]))
    if isinstance(v, float):
        return np.array(v, dtype=np.float32)
    return v


def save_tensors_data(tensors_data: TensorsData, path: str | Path, *,
                      smooth_quant: bool = False) -> None:
    """Write calibration results as JSON (atomically: a temporary file, then renamed), with
    ``smooth_quant`` recorded so that a run with another setting does not reuse them."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {**tensors_data.to_dict(), "smooth_quant": bool(smooth_quant)}
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".calibcache_", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(payload, f, cls=CalibrationCacheEncoder)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_tensors_data(path: str | Path) -> TensorsData:
    """Calibration results written by :func:`save_tensors_data`."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"Calibration cache not found: {path}")
    if not path.is_file():
        raise ValueError(f"Calibration cache path is not a file: {path}")
    with path.open() as f:
        return TensorsData.from_dict(json.load(f))


def rel_entr(pk: np.ndarray, qk: np.ndarray) -> np.ndarray:
    """Element-wise ``pk * log(pk / qk)`` (0 where pk is 0, inf where only qk is 0)."""
    pk, qk = np.asarray(pk), np.asarray(qk)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(pk > 0, pk * np.log(pk / np.where(qk > 0, qk, 1)), 0.0)
    return np.where((pk > 0) & (qk <= 0), np.inf, np.where((pk < 0) | (qk < 0), np.inf, out))


def entropy(pk: np.ndarray, qk: np.ndarray, base: float | None = None, axis: int = 0
            ) -> np.ndarray:
    """Kullback-Leibler divergence of the normalized ``pk`` from the normalized ``qk`` (as
    ``scipy.stats.entropy(pk, qk)``, without depending on scipy)."""
    if base is not None and base <= 0:
        raise ValueError(f"base={base} must be a positive number or None")
    pk = np.asarray(pk, dtype=np.float32)
    pk = pk / np.sum(pk, axis=axis, keepdims=True)
    qk = np.asarray(qk, dtype=np.float32)
    pk, qk = np.broadcast_arrays(pk, qk)
    qk = qk / np.sum(qk, axis=axis, keepdims=True)
    s = np.sum(rel_entr(pk, qk), axis=axis)
    if base is not None:
        s = s / np.log(base)
    return np.asarray(s).astype(pk.dtype)


# -- progress -----------------------------------------------------------------------------------


class Progress:
    """A one-line text progress bar (``label [#####.....] i/n batches``) on stderr."""

    WIDTH = 30

    def __init__(self, total: int | None, label: str = "Calibrating",
                 stream: TextIO | None = None, enabled: bool = True) -> None:
        self.total, self.label, self.enabled = total, label, enabled
        self.stream = stream if stream is not None else sys.stderr
        self.count = 0
        self.t0 = time.perf_counter()
        self._last = -1.0
        self._drawn = -1
        if enabled:
            self._draw(force=True)

    def update(self, n: int = 1) -> None:
        self.count += n
        if self.enabled:
            self._draw()

    def _draw(self, force: bool = False, end: str = "") -> None:
        now = time.perf_counter()
        if not force and now - self._last < 0.1 and self.count != self.total:
            return  # redraw at most 10 times a second
        self._last = now
        self._drawn = self.count
        elapsed = now - self.t0
        if self.total:
            done = min(self.count, self.total)
            fill = int(self.WIDTH * done / self.total)
            bar = "#" * fill + "." * (self.WIDTH - fill)
            text = f"{self.label} [{bar}] {done}/{self.total} batches"
        else:
            text = f"{self.label}: {self.count} batches"
        self.stream.write(f"\r{text} ({elapsed:.1f}s){end}")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            if self._drawn == self.count:
                self.stream.write("\n")
                self.stream.flush()
            else:
                self._draw(force=True, end="\n")
            self.enabled = False


def _reader_length(reader: Any) -> int | None:
    try:
        n = len(reader)
    except (NotImplementedError, TypeError, AttributeError):
        return None
    return n if isinstance(n, int) and n >= 0 else None


# -- calibraters --------------------------------------------------------------------------------


def _load(model: str | Path | ModelProto) -> ModelProto:
    """A copy of the model (it gets extra outputs), shape-inferred to type every tensor."""
    m = model if isinstance(model, ModelProto) else onnx.load(str(model))
    try:
        return onnx.shape_inference.infer_shapes(m)
    except Exception:  # noqa: BLE001 - a model shape inference rejects is calibrated as it is
        out = ModelProto()
        out.CopyFrom(m)
        return out


class CalibraterBase:
    """Runs a model on onnxrun with the tensors to calibrate as extra outputs."""

    def __init__(self, model_path: str | Path | ModelProto,
                 op_types_to_calibrate: Sequence[str] | None = None,
                 augmented_model_path: str | Path | None = None, symmetric: bool = False,
                 use_external_data_format: bool = False, per_channel: bool = False) -> None:
        self.model = _load(model_path)
        self.op_types_to_calibrate = op_types_to_calibrate
        self.augmented_model_path = augmented_model_path
        self.symmetric = symmetric
        self.use_external_data_format = use_external_data_format
        self.per_channel = per_channel
        self.execution_providers = ["CPUExecutionProvider"]
        self.infer_session = None
        self.show_progress = True
        self.tensors_to_calibrate: list[str] = []
        self._from_inputs: list[str] = []  # graph inputs to calibrate: read from the feeds
        self._outputs: list[str] = []  # the added outputs, in the session's output order

    def select_tensors_to_calibrate(self, model: ModelProto) -> tuple[set[str], dict[str, Any]]:
        """Float inputs and outputs of the nodes to calibrate (initializers excluded)."""
        value_infos = {vi.name: vi for vi in model.graph.value_info}
        value_infos.update({o.name: o for o in model.graph.output})
        value_infos.update({i.name: i for i in model.graph.input})
        initializers = {t.name for t in model.graph.initializer}
        tensors = set()
        for node in model.graph.node:
            if self.op_types_to_calibrate and node.op_type not in self.op_types_to_calibrate:
                continue
            for name in itertools.chain(node.input, node.output):
                vi = value_infos.get(name)
                if (vi is not None and vi.type.HasField("tensor_type")
                        and vi.type.tensor_type.elem_type in _FLOAT_TYPES
                        and name not in initializers):
                    tensors.add(name)
        return tensors, value_infos

    def augment_graph(self) -> None:
        """Add the tensors to calibrate as graph outputs (graph inputs are read from the feeds)."""
        tensors, value_infos = self.select_tensors_to_calibrate(self.model)
        inputs = {i.name for i in self.model.graph.input}
        outputs = {o.name for o in self.model.graph.output}
        self.tensors_to_calibrate = sorted(tensors)
        self._from_inputs = [t for t in self.tensors_to_calibrate if t in inputs]
        for t in self.tensors_to_calibrate:
            if t not in inputs and t not in outputs:
                self.model.graph.output.append(value_infos[t])
        if self.augmented_model_path:
            onnx.save(self.model, str(self.augmented_model_path),
                      save_as_external_data=self.use_external_data_format)

    def get_augment_model(self) -> ModelProto:
        return self.model

    def set_execution_providers(self, execution_providers=("CPUExecutionProvider",)) -> None:
        self.execution_providers = list(execution_providers)
        self.create_inference_session()

    def create_inference_session(self) -> None:
        from ..api.options import GraphOptimizationLevel, SessionOptions
        from ..api.session import InferenceSession

        options = SessionOptions()
        # the tensors as the model computes them: no fusion may hide one
        options.graph_optimization_level = GraphOptimizationLevel.ORT_DISABLE_ALL
        self.infer_session = InferenceSession(self.model, options,
                                              providers=self.execution_providers)
        self._outputs = [o.name for o in self.infer_session.get_outputs()]

    def _batches(self, data_reader: CalibrationDataReader):
        """(tensor name -> value) for each batch of the reader, with the progress bar."""
        if self.infer_session is None:
            self.create_inference_session()
        wanted = set(self.tensors_to_calibrate)
        progress = Progress(_reader_length(data_reader), enabled=self.show_progress)
        try:
            while True:
                feeds = data_reader.get_next()
                if not feeds:
                    break
                values = self.infer_session.run(None, feeds)
                batch = {n: v for n, v in zip(self._outputs, values, strict=True) if n in wanted}
                for name in self._from_inputs:
                    batch[name] = np.asarray(feeds[name])
                yield batch
                progress.update()
        finally:
            progress.close()

    def collect_data(self, data_reader: CalibrationDataReader) -> None:
        raise NotImplementedError

    def compute_data(self) -> TensorsData:
        raise NotImplementedError


class MinMaxCalibrater(CalibraterBase):
    """Ranges from the extremes of each tensor; with ``moving_average``, the per-batch extremes
    are averaged (and successive ``collect_data`` calls blended with ``averaging_constant``)."""

    def __init__(self, model_path, op_types_to_calibrate=None, augmented_model_path=None,
                 symmetric=False, use_external_data_format=False, moving_average=False,
                 averaging_constant=0.01, max_intermediate_outputs=None, per_channel=False
                 ) -> None:
        super().__init__(model_path, op_types_to_calibrate, augmented_model_path, symmetric,
                         use_external_data_format, per_channel)
        if moving_average and not 0 <= averaging_constant <= 1:
            raise ValueError("invalid averaging constant, which should not be < 0 or > 1")
        self.moving_average = moving_average
        self.averaging_constant = averaging_constant
        self.max_intermediate_outputs = max_intermediate_outputs
        self.calibrate_tensors_range: TensorsData | None = None

    def augment_graph(self) -> None:
        """Each tensor to calibrate gets ``ReduceMin`` / ``ReduceMax`` (over all axes but the
        channel axis 1 with ``per_channel``) and a flattening Reshape, whose outputs
        ``<tensor>_ReduceMin`` / ``<tensor>_ReduceMax`` become graph outputs: the session
        returns the extremes, not the tensors (onnxruntime's augmented graph)."""
        tensors, value_infos = self.select_tensors_to_calibrate(self.model)
        g = self.model.graph
        taken = {t.name for t in g.initializer} | {o for n in g.node for o in n.output}
        shape = "ReduceMinMax_flat_shape"
        while shape in taken:
            shape += "_"
        g.initializer.append(onnx.numpy_helper.from_array(np.array([-1], np.int64), shape))
        opset = next((o.version for o in self.model.opset_import
                      if o.domain in ("", "ai.onnx")), 13)
        self.tensors_to_calibrate = []
        self._from_inputs = []
        for t in sorted(tensors):
            vi = value_infos[t].type.tensor_type
            axes = None
            if self.per_channel and vi.HasField("shape") and len(vi.shape.dim) > 1:
                axes = [0, *range(2, len(vi.shape.dim))]
            for op in ("ReduceMin", "ReduceMax"):
                out = f"{t}_{op}"
                inputs, attrs = [t], {"keepdims": 1}
                if axes is not None and opset >= 18:
                    axes_name = f"{out}_axes"
                    g.initializer.append(onnx.numpy_helper.from_array(
                        np.array(axes, np.int64), axes_name))
                    inputs.append(axes_name)
                elif axes is not None:
                    attrs["axes"] = axes
                g.node.append(onnx.helper.make_node(op, inputs, [f"{out}_Reshape"], out, **attrs))
                g.node.append(onnx.helper.make_node("Reshape", [f"{out}_Reshape", shape], [out],
                                                    f"{out}_Reshape"))
                g.output.append(onnx.helper.make_tensor_value_info(out, vi.elem_type, [None]))
                self.tensors_to_calibrate.append(out)
        if self.augmented_model_path:
            onnx.save(self.model, str(self.augmented_model_path),
                      save_as_external_data=self.use_external_data_format)

    def _extremes(self, name: str, batch: dict) -> tuple[np.ndarray, np.ndarray]:
        lo = np.asarray(batch[f"{name}_ReduceMin"])
        hi = np.asarray(batch[f"{name}_ReduceMax"])
        if lo.size and np.all(np.isposinf(lo)) and np.all(np.isneginf(hi)):
            z = np.zeros((), lo.dtype)  # an empty tensor: the reductions' identities
            return z, z
        if not self.per_channel:
            return lo.reshape(()), hi.reshape(())
        return (lo.reshape(()) if lo.size == 1 else lo), (hi.reshape(()) if hi.size == 1 else hi)

    def collect_data(self, data_reader: CalibrationDataReader) -> None:
        lo: dict[str, np.ndarray] = {}
        hi: dict[str, np.ndarray] = {}
        dtypes: dict[str, np.dtype] = {}
        count = 0
        for batch in self._batches(data_reader):
            count += 1
            names = [k[:-len("_ReduceMin")] for k in batch if k.endswith("_ReduceMin")]
            for name in names:
                bmin, bmax = self._extremes(name, batch)
                v = bmin
                if name not in lo:
                    dtypes[name] = np.asarray(v).dtype
                    lo[name], hi[name] = bmin.astype(np.float64), bmax.astype(np.float64)
                elif self.moving_average:  # summed here, averaged below
                    lo[name] = lo[name] + bmin
                    hi[name] = hi[name] + bmax
                else:
                    lo[name] = np.fmin(lo[name], bmin)
                    hi[name] = np.fmax(hi[name], bmax)
        if count == 0:
            if self.calibrate_tensors_range is None:
                raise ValueError("No data is collected.")
            return
        ranges = {}
        for name in lo:
            a, b = lo[name], hi[name]
            if self.moving_average:
                a, b = a / count, b / count
            if self.symmetric:
                m = np.fmax(np.abs(a), np.abs(b))
                a, b = -m, m
            ranges[name] = (np.asarray(a).astype(dtypes[name]), np.asarray(b).astype(dtypes[name]))
        self._merge(ranges)

    def _merge(self, ranges: dict[str, tuple[np.ndarray, np.ndarray]]) -> None:
        old = self.calibrate_tensors_range
        if old is not None:
            for name, (a, b) in list(ranges.items()):
                if name not in old:
                    continue
                oa, ob = old[name].range_value
                if self.moving_average:
                    c = self.averaging_constant
                    a, b = oa + c * (a - oa), ob + c * (b - ob)
                else:
                    a, b = np.minimum(oa, a), np.maximum(ob, b)
                ranges[name] = (a, b)
        self.calibrate_tensors_range = TensorsData(
            CalibrationMethod.MinMax,
            {k: TensorData(lowest=a, highest=b) for k, (a, b) in ranges.items()})

    def compute_data(self) -> TensorsData:
        if self.calibrate_tensors_range is None:
            raise ValueError("No data is collected.")
        return self.calibrate_tensors_range


class HistogramCalibrater(CalibraterBase):
    """Histograms of each tensor's values, then a range per ``method``."""

    def __init__(self, model_path, op_types_to_calibrate=None, augmented_model_path=None,
                 use_external_data_format=False, method="percentile", symmetric=False,
                 num_bins=128, num_quantized_bins=2048, percentile=99.999, scenario="same"
                 ) -> None:
        super().__init__(model_path, op_types_to_calibrate, augmented_model_path, symmetric,
                         use_external_data_format)
        self.method = method
        self.num_bins = num_bins
        self.num_quantized_bins = num_quantized_bins
        self.percentile = percentile
        self.scenario = scenario
        self.collector: HistogramCollector | None = None

    def collect_data(self, data_reader: CalibrationDataReader) -> None:
        if self.collector is None:
            self.collector = HistogramCollector(self.method, self.symmetric, self.num_bins,
                                                self.num_quantized_bins, self.percentile,
                                                self.scenario)
        pending: dict[str, list[np.ndarray]] = {}
        size = 0
        count = 0
        for batch in self._batches(data_reader):
            count += 1
            for name, v in batch.items():
                v = np.asarray(v)
                pending.setdefault(name, []).append(v.reshape(-1))
                size += v.nbytes
            if size > _PENDING_BYTES:  # fold into the histograms, keep the memory bounded
                self.collector.collect(pending)
                pending, size = {}, 0
        if pending:
            self.collector.collect(pending)
        if count == 0 and not self.collector.histogram_dict:
            raise ValueError("No data is collected.")

    def compute_data(self) -> TensorsData:
        if self.collector is None or not self.collector.histogram_dict:
            raise ValueError("No collector created and can't generate calibration data.")
        methods = {"entropy": CalibrationMethod.Entropy,
                   "percentile": CalibrationMethod.Percentile,
                   "distribution": CalibrationMethod.Distribution}
        return TensorsData(methods[self.method], self.collector.compute_collection_result())


class EntropyCalibrater(HistogramCalibrater):
    def __init__(self, model_path, op_types_to_calibrate=None, augmented_model_path=None,
                 use_external_data_format=False, method="entropy", symmetric=False,
                 num_bins=128, num_quantized_bins=128) -> None:
        super().__init__(model_path, op_types_to_calibrate, augmented_model_path,
                         use_external_data_format, method=method, symmetric=symmetric,
                         num_bins=num_bins, num_quantized_bins=num_quantized_bins)


class PercentileCalibrater(HistogramCalibrater):
    def __init__(self, model_path, op_types_to_calibrate=None, augmented_model_path=None,
                 use_external_data_format=False, method="percentile", symmetric=False,
                 num_bins=2048, percentile=99.999) -> None:
        super().__init__(model_path, op_types_to_calibrate, augmented_model_path,
                         use_external_data_format, method=method, symmetric=symmetric,
                         num_bins=num_bins, percentile=percentile)


class DistributionCalibrater(HistogramCalibrater):
    def __init__(self, model_path, op_types_to_calibrate=None, augmented_model_path=None,
                 use_external_data_format=False, method="distribution", num_bins=128,
                 scenario="same") -> None:
        super().__init__(model_path, op_types_to_calibrate, augmented_model_path,
                         use_external_data_format, method=method, num_bins=num_bins,
                         scenario=scenario)


# -- histograms ---------------------------------------------------------------------------------


def _flat(arrays: list[np.ndarray]) -> np.ndarray:
    return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)


class HistogramCollector:
    """Per-tensor histograms, merged over batches as onnxruntime's collector merges them."""

    def __init__(self, method, symmetric, num_bins, num_quantized_bins, percentile, scenario):
        self.histogram_dict: dict[str, tuple] = {}
        self.method = method
        self.symmetric = symmetric
        self.num_bins = num_bins
        self.num_quantized_bins = num_quantized_bins
        self.percentile = percentile
        self.scenario = scenario

    def get_histogram_dict(self) -> dict[str, tuple]:
        return self.histogram_dict

    def collect(self, name_to_arr: Mapping[str, list[np.ndarray]]) -> None:
        if self.method in ("entropy", "distribution"):
            self.collect_value(name_to_arr)
        elif self.method == "percentile":
            if self.symmetric:
                self.collect_absolute_value(name_to_arr)
            else:
                self.collect_value(name_to_arr)
        else:
            raise ValueError("Only 'entropy', 'percentile' or 'distribution' methods are supported")

    def collect_absolute_value(self, name_to_arr) -> None:
        """Histograms of |x| from 0; a later larger value appends bins of the same width."""
        for name, arrays in name_to_arr.items():
            data = _flat(arrays)
            lo, hi = _extremes(data)
            a = np.abs(data)
            if name not in self.histogram_dict:
                hist, edges = np.histogram(a, bins=self.num_bins)
                self.histogram_dict[name] = (hist, edges.astype(data.dtype), lo, hi)
                continue
            old_hist, edges, old_lo, old_hi = self.histogram_dict[name]
            amax = np.nanmax(a) if a.size else 0
            if amax > edges[-1]:
                width = edges[1] - edges[0]
                more = np.arange(edges[-1] + width, amax + width, width)
                edges = np.hstack((edges, more))
            hist, edges = np.histogram(a, bins=edges)
            hist[:len(old_hist)] += old_hist
            self.histogram_dict[name] = (hist, edges.astype(data.dtype), min(old_lo, lo),
                                         max(old_hi, hi))

    def collect_value(self, name_to_arr) -> None:
        """Histograms over [-t, t] (t the largest magnitude seen), widened by whole bins."""
        for name, arrays in name_to_arr.items():
            data = _flat(arrays)
            lo, hi = _extremes(data)
            threshold = np.array(max(abs(lo), abs(hi)), dtype=data.dtype)
            if name in self.histogram_dict:
                self.histogram_dict[name] = self._merge(self.histogram_dict[name], data, lo, hi,
                                                        threshold)
            else:
                hist, edges = np.histogram(data, self.num_bins, range=(-threshold, threshold))
                self.histogram_dict[name] = (hist, edges, lo, hi, threshold)

    @staticmethod
    def _merge(old, data, new_lo, new_hi, new_threshold):
        old_hist, old_edges, old_lo, old_hi, old_threshold = old
        if new_threshold <= old_threshold:
            hist, _ = np.histogram(data, len(old_hist), range=(-old_threshold, old_threshold))
            return (hist + old_hist, old_edges, min(old_lo, new_lo), max(old_hi, new_hi),
                    old_threshold)
        if old_threshold == 0:
            hist, edges = np.histogram(data, len(old_hist), range=(-new_threshold, new_threshold))
            hist += old_hist
        else:
            n_old = len(old_hist)
            stride = 2 * old_threshold / n_old
            half = int((new_threshold - old_threshold) // stride + 1)
            n_new = n_old + 2 * half
            new_threshold = half * stride + old_threshold
            hist, edges = np.histogram(data, n_new, range=(-new_threshold, new_threshold))
            hist[half:n_new - half] += old_hist
        return hist, edges, min(old_lo, new_lo), max(old_hi, new_hi), new_threshold

    def compute_collection_result(self) -> dict[str, tuple]:
        if not self.histogram_dict:
            raise ValueError("Histogram has not been collected. Please run collect() first.")
        if self.method == "entropy":
            return self.compute_entropy()
        if self.method == "percentile":
            return self.compute_percentile()
        if self.method == "distribution":
            return self.compute_distribution()
        raise ValueError("Only 'entropy', 'percentile' or 'distribution' methods are supported")

    def compute_percentile(self) -> dict[str, tuple]:
        if not 0 <= self.percentile <= 100:
            raise ValueError("Invalid percentile. Must be in range 0 <= percentile <= 100.")
        result = {}
        for name, (hist, edges, lo, hi, *_) in self.histogram_dict.items():
            total = hist.sum()
            cdf = np.cumsum(hist / total) if total else np.ones(len(hist))
            if self.symmetric:
                right = np.searchsorted(cdf, self.percentile / 100.0)
                t = (-np.array(edges[right], edges.dtype), np.array(edges[right], edges.dtype))
            else:
                cut = (100.0 - self.percentile) / 200.0
                r, left = np.searchsorted(cdf, 1.0 - cut), np.searchsorted(cdf, cut)
                t = (np.array(edges[left], edges.dtype), np.array(edges[r], edges.dtype))
            a, b = t
            if a < lo:
                a = np.asarray(lo)
            if b > hi:
                b = np.asarray(hi)
            result[name] = (a, b, hist, edges)
        return result

    def compute_entropy(self) -> dict[str, tuple]:
        result = {}
        for name, histogram in self.histogram_dict.items():
            a, b = self.get_entropy_threshold(histogram, self.num_quantized_bins)
            result[name] = (a, b, histogram[0], histogram[1])
        return result

    def compute_distribution(self) -> dict[str, TensorData]:
        result = {}
        for name, (hist, edges, *_) in self.histogram_dict.items():
            if self.scenario == "same":
                values = (edges[:-1] + edges[1:]) * 0.5
            elif self.scenario == "p3":
                mid = (edges[:-1] + edges[1:]) * 0.5
                values = np.cbrt(mid)
            else:
                raise ValueError("Invalid scenario. Must be in {'same', 'p3'}.")
            total = max(hist.sum(), 1)
            avg = (hist * values).sum() / total
            std = math.sqrt(max(float((hist * values ** 2).sum() / total - avg ** 2), 0.0))
            result[name] = TensorData(
                avg=np.array(avg, edges.dtype), std=np.array(std, edges.dtype), hist=hist,
                hist_edges=edges, lowest=edges.min(), highest=edges.max())
        return result

    @staticmethod
    def get_entropy_threshold(histogram, num_quantized_bins: int) -> tuple[np.ndarray, ...]:
        """The (low, high) edges of the candidate slice of the histogram whose quantization to
        ``num_quantized_bins`` levels diverges least (KL) from it, every candidate at once.

        The candidates are the slices centered on the zero bin, from ``num_quantized_bins`` bins
        wide to the whole histogram; values outside a slice are folded into its end bins. Each
        slice is merged into levels of ``len // num_quantized_bins`` bins, spread back over the
        non-empty bins of the level (in integers, as onnxruntime does), both distributions are
        smoothed (empty bins get 1e-4) and compared.
        """
        hist, edges, lo, hi = histogram[0], histogram[1], histogram[2], histogram[3]
        hist = np.asarray(hist, np.int64)
        nb = hist.size
        zero = nb // 2
        half = num_quantized_bins // 2
        Q = num_quantized_bins
        if zero < half:  # fewer bins than levels: nothing to search
            return np.asarray(lo), np.asarray(hi)
        ii = np.arange(half, zero + 1)  # candidate half-widths
        start = zero - ii
        end = np.minimum(zero + ii + 1, nb)
        length = end - start
        L = int(length.max())
        k = np.arange(L)
        valid = k[None, :] < length[:, None]
        idx = np.minimum(start[:, None] + k[None, :], nb - 1)
        sliced = np.where(valid, hist[idx], 0)
        cs = np.concatenate([[0], np.cumsum(hist)])
        p = sliced.copy()
        p[:, 0] += cs[start]  # left outliers
        rows = np.arange(ii.size)
        p[rows, length - 1] += cs[nb] - cs[end]  # right outliers
        nonzero = (p != 0) & valid

        merged = length // Q  # bins per level (>= 1)
        bounds = merged[:, None] * np.arange(Q + 1)[None, :]  # level j covers [b_j, b_j+1)
        scs = np.concatenate([np.zeros((ii.size, 1), np.int64), np.cumsum(sliced, axis=1)], 1)
        ncs = np.concatenate([np.zeros((ii.size, 1), np.int64), np.cumsum(nonzero, axis=1)], 1)
        level = np.take_along_axis(scs, bounds, 1)
        levels = np.diff(level, axis=1)
        levels[:, -1] += scs[rows, length] - level[:, -1]  # the remainder joins the last level
        norms = np.diff(np.take_along_axis(ncs, bounds, 1), axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            per_bin = np.where(norms != 0, levels // np.maximum(norms, 1), 0)
        j = np.minimum(k[None, :] // merged[:, None], Q - 1)
        covered = k[None, :] < (merged * Q)[:, None]
        q = np.where(covered & valid, np.take_along_axis(per_bin, j, 1), 0)

        def smooth(d: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            # in float64: candidates whose divergences differ in float32 noise only are
            # ranked by their true values
            zeros = (d == 0) & valid
            nonzeros = (d != 0) & valid
            nz = zeros.sum(axis=1).astype(np.float64)
            nnz = nonzeros.sum(axis=1).astype(np.float64)
            eps = 1e-4
            eps1 = np.where(nnz > 0, eps * nz / np.maximum(nnz, 1), 0)
            s = d.astype(np.float64) + eps * zeros - eps1[:, None] * nonzeros
            return np.where(valid, s, 0), nnz > 0

        ps, p_ok = smooth(p)
        qs, q_ok = smooth(q)
        ps = ps / ps.sum(axis=1, keepdims=True)
        qs = qs / np.where(q_ok, qs.sum(axis=1), 1)[:, None]
        with np.errstate(divide="ignore", invalid="ignore"):
            terms = np.where(valid, ps * np.log(ps / qs), 0)
        div = np.where(p_ok & q_ok, terms.sum(axis=1), np.inf)
        best = int(np.argmin(div))
        a = np.asarray(edges[start[best]])
        b = np.asarray(edges[end[best]])
        if a < lo:
            a = np.asarray(lo)
        if b > hi:
            b = np.asarray(hi)
        return a, b


def _extremes(data: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if data.size == 0:
        z = np.array(0, dtype=data.dtype)
        return z, z
    return np.nanmin(data), np.nanmax(data)


def create_calibrator(model: str | Path | ModelProto,
                      op_types_to_calibrate: Sequence[str] | None = None,
                      augmented_model_path: str | Path | None = None,
                      calibrate_method: CalibrationMethod = CalibrationMethod.MinMax,
                      use_external_data_format: bool = False, providers=None,
                      extra_options: Mapping[str, Any] | None = None) -> CalibraterBase:
    """A calibrater for ``calibrate_method``, its model augmented and its session created."""
    extra = dict(extra_options or {})
    calibrator: CalibraterBase
    if calibrate_method == CalibrationMethod.MinMax:
        calibrator = MinMaxCalibrater(
            model, op_types_to_calibrate, augmented_model_path,
            use_external_data_format=use_external_data_format,
            symmetric=extra.get("symmetric", False),
            moving_average=extra.get("moving_average", False),
            averaging_constant=extra.get("averaging_constant", 0.01),
            max_intermediate_outputs=extra.get("max_intermediate_outputs"),
            per_channel=extra.get("per_channel", False))
    elif calibrate_method == CalibrationMethod.Entropy:
        calibrator = EntropyCalibrater(
            model, op_types_to_calibrate, augmented_model_path,
            use_external_data_format=use_external_data_format,
            symmetric=extra.get("symmetric", False), num_bins=extra.get("num_bins", 128),
            num_quantized_bins=extra.get("num_quantized_bins", 128))
    elif calibrate_method == CalibrationMethod.Percentile:
        calibrator = PercentileCalibrater(
            model, op_types_to_calibrate, augmented_model_path,
            use_external_data_format=use_external_data_format,
            symmetric=extra.get("symmetric", True), num_bins=extra.get("num_bins", 2048),
            percentile=extra.get("percentile", 99.999))
    elif calibrate_method == CalibrationMethod.Distribution:
        calibrator = DistributionCalibrater(
            model, op_types_to_calibrate, augmented_model_path,
            use_external_data_format=use_external_data_format,
            num_bins=extra.get("num_bins", 2048), scenario=extra.get("scenario", "same"))
    else:
        raise ValueError(f"Unsupported calibration method {calibrate_method}")
    calibrator.show_progress = bool(extra.get("show_progress", True))
    calibrator.augment_graph()
    if providers:
        calibrator.execution_providers = list(providers)
    calibrator.create_inference_session()
    return calibrator


__all__ = [
    "CalibraterBase", "CalibrationDataReader", "CalibrationMethod", "DistributionCalibrater",
    "EntropyCalibrater", "FeedsDataReader", "HistogramCalibrater", "HistogramCollector",
    "MinMaxCalibrater", "PercentileCalibrater", "Progress", "TensorData", "TensorsData",
    "create_calibrator",
]
