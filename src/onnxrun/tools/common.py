"""What the ``onnxrun`` commands share: their error type, option parsing, the inputs they read
or generate, and how they print values, sizes and tables. Each command module imports this one;
``cli.py`` only dispatches."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from onnx import TensorProto, numpy_helper

from .. import dtypes

PROG = "onnxrun"


class CliError(Exception):
    """A mistake in the command line itself (a malformed --dim, an unknown input name...)."""


def flatten(text: str) -> str:
    """Text on one line: its lines stripped and joined by spaces."""
    return " ".join(line.strip() for line in text.splitlines() if line.strip())


def one_line(error: BaseException) -> str:
    """An error's message on one line (its type's name when it has none)."""
    return flatten(str(error)) or type(error).__name__


def parse_assignments(items: Sequence[str] | None, option: str) -> dict[str, str]:
    """``["a=1", "b=x.npy"]`` -> ``{"a": "1", "b": "x.npy"}``; the name may not be empty."""
    result: dict[str, str] = {}
    for item in items or ():
        name, sep, value = item.partition("=")  # a file path may hold "=", names rarely do
        if not sep or not name or not value:
            raise CliError(f"{option} expects NAME=VALUE, got '{item}'")
        result[name] = value
    return result


def parse_dims(items: Sequence[str] | None) -> dict[str, int]:
    """``--dim NAME=VALUE`` options: symbolic dimensions' values, integers >= 0."""
    dims: dict[str, int] = {}
    for name, text in parse_assignments(items, "--dim").items():
        try:
            dims[name] = int(text)
        except ValueError:
            raise CliError(f"--dim {name}={text}: the value must be an integer") from None
        if dims[name] < 0:
            raise CliError(f"--dim {name}={text}: the value must be >= 0")
    return dims


def format_shape(shape: list[int | str | None] | None) -> str:
    if shape is None:
        return "unknown rank"
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


def format_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def table(rows: list[tuple[str, ...]], indent: str = "  ") -> list[str]:
    """Rows of cells as aligned lines (the last column is not padded)."""
    if not rows:
        return []
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return [
        indent + "  ".join(c.ljust(w) for c, w in zip(r[:-1], widths, strict=True)) + "  " + r[-1]
        for r in rows
    ]


# ------------------------------------------------------------------------------------------------
# inputs: read from files or generated

DTYPE_BY_NAME: dict[str, np.dtype] = {}
for _elem in TensorProto.DataType.values():
    try:
        DTYPE_BY_NAME[dtypes.elem_name(_elem)] = dtypes.np_dtype(_elem)
    except TypeError:
        pass
DTYPE_BY_NAME["string"] = np.dtype(object)


def element_name(type_string: str) -> str | None:
    """``tensor(float)`` (or ``optional(tensor(float))``) -> ``float``; None for other types."""
    m = re.fullmatch(r"(?:optional\()?tensor\((\w+)\)\)?", type_string)
    return m.group(1) if m else None


def resolve_shape(shape: list[int | str | None], dims: Mapping[str, int]) -> tuple[int, ...]:
    """Fixed dimensions as declared, named ones from --dim, every other one 1."""
    return tuple(d if isinstance(d, int) else dims.get(d, 1) if isinstance(d, str) else 1
                 for d in shape)


# Sub-byte integers hold fewer values than 0..9.
_INT_HIGH = {"int4": 8, "uint4": 16, "int2": 2, "uint2": 4}


def generate_input(element: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """A random tensor: floats standard normal, integers 0..9 (valid as small indices), random
    booleans, strings "a"."""
    dtype = DTYPE_BY_NAME[element]
    if element == "string":
        return np.full(shape, "a", dtype=object)
    if element == "bool":
        return rng.random(shape) < 0.5
    if element.startswith(("int", "uint")):
        return rng.integers(0, _INT_HIGH.get(element, 10), size=shape).astype(dtype)
    if element.startswith("complex"):
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
    return rng.standard_normal(shape).astype(np.float32).astype(dtype)


def load_input(path: str) -> Any:
    """Read an input value from ``.npy`` or ``.pb`` (a serialized TensorProto)."""
    p = Path(path)
    if not p.is_file():
        raise CliError(f"input file '{path}' does not exist")
    if p.suffix == ".pb":
        tensor = TensorProto()
        try:
            tensor.ParseFromString(p.read_bytes())
            return numpy_helper.to_array(tensor)
        except Exception as e:
            raise CliError(f"'{path}' is not a serialized TensorProto: {one_line(e)}") from None
    try:
        return np.load(p, allow_pickle=False)
    except Exception as e:
        raise CliError(f"cannot read '{path}' as a .npy array: {one_line(e)}") from None


def make_feeds(session: Any, files: Mapping[str, str] | None = None,
               dims: Mapping[str, int] | None = None, seed: int = 0
               ) -> tuple[dict[str, Any], list[str]]:
    """A session's inputs: read from ``files`` (input name -> path), the others generated
    (``generate_input``, symbolic dimensions from ``dims``, else 1). Returns the feeds and one
    line per input saying where it came from."""
    files, dims = dict(files or {}), dict(dims or {})
    inputs = session.get_inputs()
    known = {a.name for a in [*inputs, *session.get_overridable_initializers()]}
    unknown = [n for n in files if n not in known]
    if unknown:
        raise CliError(f"--input {unknown[0]}: the model has no input of that name; its "
                       f"inputs are {[a.name for a in inputs]}")
    rng = np.random.default_rng(seed)
    feeds: dict[str, Any] = {}
    lines = []
    for name, path in files.items():
        feeds[name] = load_input(path)
        lines.append(f"{name}: {describe(feeds[name])} (from {path})")
    for a in inputs:
        if a.name in feeds:
            continue
        element = element_name(a.type)
        if element is None or element not in DTYPE_BY_NAME:
            raise CliError(f"input '{a.name}' has type {a.type}, which cannot be generated: "
                           f"give it with --input {a.name}=FILE.npy")
        feeds[a.name] = generate_input(element, resolve_shape(a.shape or [], dims), rng)
        lines.append(f"{a.name}: {describe(feeds[a.name])} (random)")
    return feeds, lines


def describe(value: Any) -> str:
    """``float32 [1, 1000]``: a value's dtype and shape."""
    if isinstance(value, list):
        return f"sequence of {len(value)}"
    arr = np.asarray(value)
    return f"{arr.dtype} {format_shape(list(arr.shape))}"
