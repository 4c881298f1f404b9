"""Sparse tensors with onnxruntime's API (``SparseTensor``, ``OrtSparseFormat``), and how a
session meets them.

onnxrun's kernels compute on dense arrays: a model input declared ``sparse_tensor`` takes a
SparseTensor (or an OrtValue holding one) and is densified as it is fed; a model output declared
``sparse_tensor`` is handed back as a COO SparseTensor of the result's non-zero elements (linear
indices). Results are those of a sparse engine; only the memory of the dense intermediate
differs.
"""

from __future__ import annotations

import enum
from typing import Any

import numpy as np

from .. import dtypes
from ..errors import InvalidArgument
from ..proto import onnx


class OrtSparseFormat(enum.IntEnum):
    ORT_SPARSE_UNDEFINED = 0
    ORT_SPARSE_COO = 1
    ORT_SPARSE_CSRC = 2
    ORT_SPARSE_BLOCK_SPARSE = 4

    def __str__(self) -> str:
        return f"OrtSparseFormat.{self.name}"


def _read_only(arr: np.ndarray) -> np.ndarray:
    view = arr.view()
    view.flags.writeable = False
    return view


def _check_cpu(ort_device: Any) -> None:
    device_type = ort_device.device_type() if hasattr(ort_device, "device_type") else 0
    if device_type != 0:
        raise RuntimeError(f"sparse tensors live on the CPU with onnxrun, not on {ort_device}")


def _indices(arr: Any, what: str) -> np.ndarray:
    idx = np.asarray(arr)
    if idx.dtype != np.int64:
        raise InvalidArgument(f"{what} must be int64, got {idx.dtype}")
    return idx


class SparseCooView:
    def __init__(self, indices: np.ndarray) -> None:
        self._indices = indices

    def indices(self) -> np.ndarray:
        """Linear indices ([nnz]) or coordinates ([nnz, rank]), read-only."""
        return _read_only(self._indices)


class SparseCsrView:
    def __init__(self, inner: np.ndarray, outer: np.ndarray) -> None:
        self._inner, self._outer = inner, outer

    def inner(self) -> np.ndarray:
        """Column of each value, read-only."""
        return _read_only(self._inner)

    def outer(self) -> np.ndarray:
        """Row starts (rows + 1 entries), read-only."""
        return _read_only(self._outer)


class SparseBlockSparseView:
    def __init__(self, indices: np.ndarray) -> None:
        self._indices = indices

    def indices(self) -> np.ndarray:
        """Block coordinates ([2, blocks]), read-only."""
        return _read_only(self._indices)


class SparseTensor:
    """A sparse tensor on the CPU in one of onnxruntime's formats. The arrays given are used
    as they are (not copied); views returned are read-only."""

    def __init__(self, fmt: OrtSparseFormat, dense_shape: list[int], values: np.ndarray,
                 indices: tuple[np.ndarray, ...]) -> None:
        self._format, self._dense_shape = fmt, dense_shape
        self._values, self._indices = values, indices

    # -- construction ----------------------------------------------------------------------------
    @staticmethod
    def _values(values: Any) -> np.ndarray:
        arr = np.asarray(values)
        if arr.dtype.kind in "US":
            arr = arr.astype(object)
        if arr.ndim != 1:
            raise InvalidArgument(f"sparse values must be 1-D, got shape {list(arr.shape)}")
        dtypes.elem_type(arr.dtype)  # a type tensors can have
        return arr

    @staticmethod
    def sparse_coo_from_numpy(dense_shape: Any, values: Any, coo_indices: Any,
                              ort_device: Any = None) -> SparseTensor:
        """COO: ``coo_indices`` are linear indices ([nnz]) or coordinates ([nnz, rank])."""
        _check_cpu(ort_device)
        shape = [int(d) for d in dense_shape]
        vals = SparseTensor._values(values)
        idx = _indices(coo_indices, "coo indices")
        nnz = len(vals)
        size = int(np.prod(shape, dtype=np.int64))
        if idx.ndim == 1 and len(idx) == nnz:
            linear = idx
        elif idx.ndim == 2 and idx.shape == (nnz, len(shape)):
            if nnz and ((idx < 0).any() or (idx >= np.array(shape)).any()):
                raise InvalidArgument(f"coo coordinates outside the dense shape {shape}")
            linear = np.ravel_multi_index(idx.T, shape) if nnz else idx.reshape(0)
        else:
            raise InvalidArgument(
                f"coo indices of shape {list(idx.shape)} for {nnz} values of a {shape} tensor: "
                f"expected [{nnz}] or [{nnz}, {len(shape)}]")
        if nnz and ((linear < 0).any() or (linear >= size).any()):
            raise InvalidArgument(f"coo indices outside the {size} elements of shape {shape}")
        return SparseTensor(OrtSparseFormat.ORT_SPARSE_COO, shape, vals, (idx,))

    @staticmethod
    def sparse_csr_from_numpy(dense_shape: Any, values: Any, inner_indices: Any,
                              outer_indices: Any, ort_device: Any = None) -> SparseTensor:
        """CSR of a 2-D tensor: ``inner_indices`` the column of each value, ``outer_indices``
        where each row starts (rows + 1 entries)."""
        _check_cpu(ort_device)
        shape = [int(d) for d in dense_shape]
        vals = SparseTensor._values(values)
        inner = _indices(inner_indices, "inner indices")
        outer = _indices(outer_indices, "outer indices")
        if len(shape) != 2:
            raise InvalidArgument(f"CSR needs a 2-D dense shape, got {shape}")
        if inner.shape != (len(vals),) or outer.shape != (shape[0] + 1,):
            raise InvalidArgument(
                f"CSR of shape {shape} with {len(vals)} values needs {len(vals)} inner and "
                f"{shape[0] + 1} outer indices, got {inner.size} and {outer.size}")
        if (outer[0] != 0 or outer[-1] != len(vals) or (np.diff(outer) < 0).any()
                or (inner < 0).any() or (inner >= shape[1]).any()):
            raise InvalidArgument("CSR indices are not consistent with the shape and values")
        return SparseTensor(OrtSparseFormat.ORT_SPARSE_CSRC, shape, vals, (inner, outer))

    @staticmethod
    def blocksparse_from_numpy(dense_shape: Any, values: Any, indices: Any,
                               ort_device: Any = None) -> SparseTensor:
        """Block sparse: ``values`` [blocks, block_rows, block_cols, ...], ``indices``
        [2, blocks] the block coordinates."""
        _check_cpu(ort_device)
        shape = [int(d) for d in dense_shape]
        vals = np.asarray(values)
        idx = _indices(indices, "block indices")
        if vals.ndim < 3 or idx.ndim != 2 or idx.shape != (2, vals.shape[0]) or len(shape) < 2:
            raise InvalidArgument(
                f"block sparse needs values [blocks, rows, cols] and indices [2, blocks], got "
                f"{list(vals.shape)} and {list(idx.shape)}")
        rows, cols = vals.shape[1:3]
        if idx.size and ((idx < 0).any() or ((idx[0] + 1) * rows > shape[0]).any()
                         or ((idx[1] + 1) * cols > shape[1]).any()):
            raise InvalidArgument(f"block indices outside the dense shape {shape}")
        return SparseTensor(OrtSparseFormat.ORT_SPARSE_BLOCK_SPARSE, shape, vals, (idx,))

    @staticmethod
    def from_dense(arr: np.ndarray) -> SparseTensor:
        """The COO tensor of ``arr``'s non-zero (non-empty, for strings) elements."""
        flat = arr.reshape(-1)
        linear = np.flatnonzero(flat != "" if arr.dtype == object else flat)
        return SparseTensor(OrtSparseFormat.ORT_SPARSE_COO, list(arr.shape), flat[linear],
                            (linear.astype(np.int64),))

    # -- inspection ------------------------------------------------------------------------------
    def format(self) -> OrtSparseFormat:
        return self._format

    def dense_shape(self) -> list[int]:
        return list(self._dense_shape)

    def data_type(self) -> str:
        elem = dtypes.elem_type(self._values.dtype)
        return f"sparse_tensor({dtypes.elem_name(elem)})"

    def device_name(self) -> str:
        return "cpu"

    def values(self) -> np.ndarray:
        return _read_only(self._values)

    def as_coo_view(self) -> SparseCooView:
        self._expect(OrtSparseFormat.ORT_SPARSE_COO)
        return SparseCooView(self._indices[0])

    def as_csrc_view(self) -> SparseCsrView:
        self._expect(OrtSparseFormat.ORT_SPARSE_CSRC)
        return SparseCsrView(*self._indices)

    def as_blocksparse_view(self) -> SparseBlockSparseView:
        self._expect(OrtSparseFormat.ORT_SPARSE_BLOCK_SPARSE)
        return SparseBlockSparseView(self._indices[0])

    def to_cuda(self, ort_device: Any) -> SparseTensor:
        raise RuntimeError("onnxrun has no CUDA device: sparse tensors stay on the CPU")

    def _expect(self, fmt: OrtSparseFormat) -> None:
        if self._format != fmt:
            raise RuntimeError(f"this sparse tensor is {self._format}, not {fmt}")

    def to_dense(self) -> np.ndarray:
        """The dense array (onnxrun extension; how a session takes sparse inputs)."""
        vals = self._values
        if self._format == OrtSparseFormat.ORT_SPARSE_BLOCK_SPARSE:
            out = np.zeros(self._dense_shape, dtype=vals.dtype)
            rows, cols = vals.shape[1:3]
            for (r, c), block in zip(self._indices[0].T, vals, strict=True):
                out[r * rows:(r + 1) * rows, c * cols:(c + 1) * cols] = block
            return out
        out = np.zeros(self._dense_shape, dtype=vals.dtype)
        if vals.dtype == object:
            out[...] = ""
        flat = out.reshape(-1)
        if self._format == OrtSparseFormat.ORT_SPARSE_COO:
            idx = self._indices[0]
            linear = idx if idx.ndim == 1 else np.ravel_multi_index(idx.T, self._dense_shape)
            flat[linear] = vals
        else:
            inner, outer = self._indices
            rows = np.repeat(np.arange(self._dense_shape[0]), np.diff(outer))
            flat[rows * self._dense_shape[1] + inner] = vals
        return out

    def __repr__(self) -> str:
        return (f"SparseTensor({self._format.name}, {self.data_type()}, "
                f"dense_shape={self._dense_shape}, nnz={len(self._values)})")


def densify_io(proto: onnx.ModelProto, model: Any) -> dict[str, onnx.TypeProto]:
    """Make the model's sparse graph inputs and outputs dense for the engine: their types in
    ``proto`` (which must be the session's own copy) and in the IR become tensor types. Also
    reads a Constant whose ``value`` holds a sparse tensor (onnxruntime accepts it; ONNX names
    that attribute ``sparse_value``). Returns the declared types of the names changed."""
    sparse: dict[str, onnx.TypeProto] = {}
    for vi in [*proto.graph.input, *proto.graph.output]:
        if vi.type.HasField("sparse_tensor_type"):
            declared = onnx.TypeProto()
            declared.CopyFrom(vi.type)
            sparse[vi.name] = declared
            dense = onnx.TypeProto()
            dense.tensor_type.elem_type = declared.sparse_tensor_type.elem_type
            if declared.sparse_tensor_type.HasField("shape"):
                dense.tensor_type.shape.CopyFrom(declared.sparse_tensor_type.shape)
            vi.type.CopyFrom(dense)
    for node in proto.graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            for a in node.attribute:
                if a.name == "value" and a.type == onnx.AttributeProto.SPARSE_TENSOR:
                    a.name = "sparse_value"
    if sparse:
        for v in [*model.graph.inputs, *model.graph.outputs]:
            if v.name in sparse:
                v.type = next(vi.type for vi in [*proto.graph.input, *proto.graph.output]
                              if vi.name == v.name)
    return sparse


def has_sparse_io(proto: onnx.ModelProto) -> bool:
    return any(vi.type.HasField("sparse_tensor_type")
               for vi in [*proto.graph.input, *proto.graph.output]) or any(
        a.type == onnx.AttributeProto.SPARSE_TENSOR and a.name == "value"
        for n in proto.graph.node if n.op_type == "Constant" for a in n.attribute)


__all__ = ["OrtSparseFormat", "SparseTensor"]
