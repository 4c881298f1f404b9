"""Step 1 of a session: turn a path, bytes or ModelProto into onnxrun's IR.

External data is read here, under one rule: a tensor's ``location`` must name a file inside the
model's folder. Absolute paths, ``..`` escapes and symlinks leading out are refused before any
byte is read, and offset/length are checked against the file's size.
"""

from __future__ import annotations

import os
from pathlib import Path

import onnx
import onnx.inliner
from google.protobuf.message import DecodeError
from onnx import TensorProto

from .errors import InvalidGraph, InvalidProtobuf, NoSuchFile
from .ir import Model, model_from_proto

ModelSource = str | os.PathLike | bytes | bytearray | memoryview | onnx.ModelProto


class ExternalDataReader:
    """Reads tensors' external data from files under ``base_dir`` and nowhere else."""

    def __init__(self, base_dir: str | os.PathLike | None) -> None:
        self.base_dir = Path(base_dir).resolve() if base_dir is not None else None

    def __call__(self, tensor: TensorProto) -> bytes:
        info = {e.key: e.value for e in tensor.external_data}
        location = info.get("location", "")
        if self.base_dir is None:
            raise InvalidGraph(
                f"tensor '{tensor.name}' keeps its data in external file '{location}', but the "
                "model was given as bytes: load it from its path, or set the session config entry "
                "'session.model_external_initializers_file_folder_path'"
            )
        if not location:
            raise InvalidGraph(f"tensor '{tensor.name}' is external but names no location")
        if os.path.isabs(location) or location.startswith(("/", "\\")) or "\x00" in location:
            raise InvalidGraph(
                f"tensor '{tensor.name}': external data location '{location}' is an absolute "
                "path; only files inside the model's folder may be read"
            )
        path = (self.base_dir / location).resolve()
        if not path.is_relative_to(self.base_dir):
            raise InvalidGraph(
                f"tensor '{tensor.name}': external data location '{location}' points outside "
                f"the model's folder '{self.base_dir}'; refused"
            )
        if not path.is_file():
            raise NoSuchFile(f"tensor '{tensor.name}': external data file '{path}' not found")
        try:
            offset = int(info.get("offset", "0") or 0)
            length = int(info["length"]) if info.get("length") else None
        except ValueError:
            raise InvalidGraph(
                f"tensor '{tensor.name}': malformed external data offset/length"
            ) from None
        size = path.stat().st_size
        if (
            offset < 0
            or offset > size
            or (length is not None and (length < 0 or offset + length > size))
        ):
            raise InvalidGraph(
                f"tensor '{tensor.name}': external data range offset={offset} length={length} "
                f"exceeds the {size} bytes of '{path.name}'"
            )
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read(size - offset if length is None else length)
        return data


def parse_model(source: ModelSource) -> tuple[onnx.ModelProto, Path | None]:
    """Parse the source into a ModelProto (external data not yet read) and the model's folder."""
    if isinstance(source, onnx.ModelProto):
        return source, None
    if isinstance(source, bytes | bytearray | memoryview):
        return _parse_bytes(bytes(source), "<bytes>"), None
    if isinstance(source, str | os.PathLike):
        path = Path(source)
        if not path.exists():
            raise NoSuchFile(f"Load model from {os.fspath(source)} failed: file does not exist")
        if not path.is_file():
            raise NoSuchFile(f"Load model from {os.fspath(source)} failed: not a file")
        return _parse_bytes(path.read_bytes(), os.fspath(source)), path.resolve().parent
    raise TypeError(
        "InferenceSession expects a model path (str or PathLike), serialized bytes or an "
        f"onnx.ModelProto, got {type(source).__name__}"
    )


def _parse_bytes(data: bytes, origin: str) -> onnx.ModelProto:
    mp = onnx.ModelProto()
    try:
        mp.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as e:
        raise InvalidProtobuf(
            f"Load model from {origin} failed: protobuf parsing failed ({e})"
        ) from None
    # Random bytes can parse as a message that is almost empty; a model has a graph and a version.
    if not mp.HasField("graph") or mp.ir_version <= 0:
        raise InvalidProtobuf(
            f"Load model from {origin} failed: the data is not an ONNX model "
            f"(ir_version={mp.ir_version}, graph "
            f"{'present' if mp.HasField('graph') else 'missing'})"
        )
    return mp


def load_model(
    source: ModelSource, external_data_dir: str | os.PathLike | None = None
) -> tuple[onnx.ModelProto, Model]:
    """Parse and convert a model. Returns the proto (for validation) and the IR."""
    mp, folder = parse_model(source)
    if len(mp.functions):
        # Model-local functions run by expansion: inline them once, at load.
        try:
            mp = onnx.inliner.inline_local_functions(mp)
        except Exception as e:
            raise InvalidGraph(f"model-local functions could not be inlined: {e}") from None
    reader = ExternalDataReader(external_data_dir if external_data_dir is not None else folder)
    return mp, model_from_proto(mp, reader)
