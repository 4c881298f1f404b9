"""Per-tensor quantization overrides (``extra_options["TensorQuantOverrides"]``).

The option maps a tensor name to a list of dicts: one dict for per-tensor overrides, or, for a
weight quantized per channel, one dict per channel (or one for all) with ``axis`` in the first.
Each dict may set ``quant_type``, ``scale`` + ``zero_point`` (the parameters themselves),
``rmin`` / ``rmax`` (the range instead of the calibrated one), ``symmetric``, ``reduce_range``
(weights only) and ``convert`` (an activation re-quantized to another type for some consumers).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

from .quant_types import QuantType

_NOT_WITH_SCALE_ZP = ("symmetric", "reduce_range", "rmax", "rmin")


@dataclass(eq=False)
class QuantTypeInfo:
    """A tensor's quantization type; ``symmetric`` / ``reduce_range`` None mean "the default"
    and compare equal to any value."""

    quant_type: QuantType | None
    symmetric: bool | None = None
    reduce_range: bool | None = None
    axis: int | None = None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, QuantTypeInfo):
            return NotImplemented
        return (self.quant_type == other.quant_type and self.axis == other.axis
                and _loose_eq(self.symmetric, other.symmetric)
                and _loose_eq(self.reduce_range, other.reduce_range))

    __hash__ = None  # mutable, compared loosely

    @staticmethod
    def load_from_dict(raw: Mapping[str, Any], default_qtype: QuantType | None = None,
                       default_symmetric: bool | None = None,
                       default_reduce_range: bool | None = None) -> QuantTypeInfo:
        return QuantTypeInfo(raw.get("quant_type", default_qtype),
                             raw.get("symmetric", default_symmetric),
                             raw.get("reduce_range", default_reduce_range), raw.get("axis"))

    def save_to_dict(self, raw: dict[str, Any]) -> None:
        raw["quant_type"] = self.quant_type
        if self.symmetric is not None:
            raw["symmetric"] = self.symmetric
        if self.reduce_range is not None:
            raw["reduce_range"] = self.reduce_range
        if self.axis is not None:
            raw["axis"] = self.axis


class TensorQuantOverridesHelper(MutableMapping):
    """The overrides of ``extra_options["TensorQuantOverrides"]``, validated and queried."""

    def __init__(self, raw_overrides: Mapping[str, list[dict[str, Any]]] | None) -> None:
        self.overrides: dict[str, list[dict[str, Any]]] = dict(raw_overrides or {})

    # -- queries --------------------------------------------------------------------------------

    def has_per_tensor_overrides(self, tensor_name: str) -> bool:
        lst = self.overrides.get(tensor_name)
        return bool(lst) and "axis" not in lst[0]

    def has_per_channel_overrides(self, tensor_name: str) -> bool:
        lst = self.overrides.get(tensor_name)
        return bool(lst) and "axis" in lst[0]

    def overrides_scale_zp(self, tensor_name: str) -> bool:
        lst = self.overrides.get(tensor_name)
        return bool(lst) and "scale" in lst[0] and "zero_point" in lst[0]

    def get_per_tensor_overrides(self, tensor_name: str,
                                 default_val: dict[str, Any] | None = None
                                 ) -> dict[str, Any] | None:
        lst = self.overrides.get(tensor_name, [default_val] if default_val is not None else None)
        if lst and "axis" in lst[0]:
            raise ValueError(f"Expected tensor '{tensor_name}' to use per-tensor quantization "
                             "overrides, but found per-channel overrides.")
        return lst[0] if lst else None

    def get_per_channel_overrides(self, tensor_name: str,
                                  default_val: list[dict[str, Any]] | None = None
                                  ) -> list[dict[str, Any]] | None:
        lst = self.overrides.get(tensor_name, default_val)
        if not lst:
            return None
        if "axis" not in lst[0]:
            raise ValueError(f"Expected tensor '{tensor_name}' to have per-channel quantization "
                             "overrides (axis value is missing).")
        return lst

    def get_quant_types(self) -> set[QuantType]:
        """Every quantization type the overrides name (``convert`` ones included)."""
        types: set[QuantType] = set()
        for lst in self.overrides.values():
            for d in lst:
                if "quant_type" in d:
                    types.add(d["quant_type"])
                if "quant_type" in (d.get("convert") or {}):
                    types.add(d["convert"]["quant_type"])
        return types

    # -- validation -----------------------------------------------------------------------------

    def is_valid(self, initializers: Mapping[str, Any], activation_names: Iterable[str],
                 default_activation_qtype: QuantType | None = None
                 ) -> tuple[bool, str | None]:
        """(True, None), or (False, why) for the first invalid override."""
        activations = set(activation_names)
        for name, lst in self.overrides.items():
            if name not in initializers and name not in activations:
                return False, f"Tensor '{name}' in TensorQuantOverrides is not present in the model"
            if not isinstance(lst, list):
                return False, f"Tensor quantization overrides for '{name}' are not in a list"
            for k, d in enumerate(lst):
                if not isinstance(d, dict):
                    return False, (f"Tensor quantization overrides at index {k} for '{name}' are "
                                   "not in a dict")
                why = _invalid_dict(name, d, name in initializers, k)
                if why:
                    return False, why
            if len(lst) > 1 or (lst and lst[0].get("axis") is not None):
                if name not in initializers:
                    return False, (f"Tensor '{name}' has per-channel overrides, but is not an "
                                   "initializer")
                if "axis" not in lst[0]:
                    return False, (f"Per-channel overrides for tensor '{name}' must set 'axis' "
                                   "in the first dict")
                shape = _dims(initializers[name])
                axis = lst[0]["axis"]
                if shape is not None and not -len(shape) <= axis < len(shape):
                    return False, (f"Axis override {axis} for tensor '{name}' is out of range "
                                   f"for its rank {len(shape)}")
                if shape is not None and len(lst) not in (1, shape[axis]):
                    return False, (f"Per-channel overrides for tensor '{name}' have {len(lst)} "
                                   f"dicts: expected 1 or {shape[axis]} (the channels)")
        return True, None

    def update_tensor_overrides(self, tensor_name: str, new_vals: dict[str, Any],
                                channels: list[int] | None = None, overwrite: bool = True
                                ) -> bool:
        """Set ``new_vals`` in the tensor's override dicts (those of ``channels`` only, when
        given). Without ``overwrite``, nothing changes if any key is already set; returns
        whether the update happened."""
        if not new_vals:
            return False
        chosen = set(channels) if channels is not None else None
        lst = self.overrides.get(tensor_name)
        picked = [d for k, d in enumerate(lst or []) if chosen is None or k in chosen]
        if not overwrite and any(set(new_vals) & set(d) for d in picked):
            return False
        if not lst:
            self.overrides[tensor_name] = [{}]
            picked = [d for k, d in enumerate(self.overrides[tensor_name])
                      if chosen is None or k in chosen]
        for d in picked:
            d.update(new_vals)
        return True

    def get_node_output_qtype_info(self, output_name: str, default_qtype: QuantType | None,
                                   default_symmetric: bool | None = None) -> QuantTypeInfo:
        """The type a node writes ``output_name`` in (before any ``convert``)."""
        if not self.overrides.get(output_name):
            return QuantTypeInfo(default_qtype, default_symmetric)
        d = self.overrides[output_name][0]
        return QuantTypeInfo(d.get("quant_type", default_qtype),
                             d.get("symmetric", default_symmetric))

    def get_node_input_qtype_info(self, input_name: str, node_name: str,
                                  default_qtype: QuantType | None,
                                  default_symmetric: bool | None = None,
                                  default_reduce_range: bool | None = None) -> QuantTypeInfo:
        """The type node ``node_name`` reads ``input_name`` in: a ``convert``'s type when the
        node is one of its ``recv_nodes`` (or it names none), else the produced type."""
        if not self.overrides.get(input_name):
            return QuantTypeInfo(default_qtype, default_symmetric, default_reduce_range)
        d = self.overrides[input_name][0]
        produced = d.get("quant_type", default_qtype)
        conv = d.get("convert")
        if conv is None:
            return QuantTypeInfo(produced, d.get("symmetric", default_symmetric),
                                 d.get("reduce_range", default_reduce_range), d.get("axis"))
        info = QuantTypeInfo(produced, conv.get("symmetric", default_symmetric))
        if "recv_nodes" not in conv or node_name in conv["recv_nodes"]:
            info.quant_type = conv["quant_type"]
        return info

    # -- mapping --------------------------------------------------------------------------------

    def pprint_str(self, indent: int | None = None) -> str:
        import json

        return json.dumps(self.overrides, default=str, indent=indent)

    def empty(self) -> bool:
        return not self.overrides

    def get_dict(self) -> dict[str, list[dict[str, Any]]]:
        return self.overrides

    def __setitem__(self, key: str, value: list[dict]) -> None:
        self.overrides[key] = value

    def __getitem__(self, key: str) -> list[dict]:
        return self.overrides[key]

    def __delitem__(self, key: str) -> None:
        del self.overrides[key]

    def __iter__(self):
        return iter(self.overrides)

    def __len__(self) -> int:
        return len(self.overrides)

    def __str__(self) -> str:
        return self.pprint_str()

    def __repr__(self) -> str:
        return f"TensorQuantOverridesHelper({self.pprint_str()})"


def _loose_eq(a: bool | None, b: bool | None) -> bool:
    return a is None or b is None or a == b


def _dims(init: Any) -> list[int] | None:
    dims = getattr(init, "dims", None)
    return list(dims) if dims is not None else None


def _invalid_dict(name: str, d: Mapping[str, Any], is_initializer: bool, index: int
                  ) -> str | None:
    has_scale, has_zp = "scale" in d, "zero_point" in d
    if has_scale != has_zp:
        return "Must provide both 'scale' and 'zero_point' if one of the overrides is provided"
    if has_scale:
        bad = [k for k in _NOT_WITH_SCALE_ZP if k in d]
        if bad:
            return (f"Tensor override option(s) [{', '.join(bad)}] are invalid with 'scale' and "
                    f"'zero_point' (tensor '{name}')")
    if "reduce_range" in d and not is_initializer:
        return f"Option 'reduce_range' is only supported for initializers, not for '{name}'"
    if "quant_type" in d and not isinstance(d["quant_type"], QuantType):
        return f"'quant_type' of tensor '{name}' must be a QuantType, got {d['quant_type']!r}"
    conv = d.get("convert")
    if conv is not None:
        if is_initializer:
            return f"Cannot use 'convert' override for initializers ('{name}')"
        if "quant_type" not in conv:
            return f"'convert' options (tensor '{name}') must specify a 'quant_type'"
        if conv["quant_type"] == d.get("quant_type"):
            return (f"'convert' quant_type must differ from original quant_type (tensor "
                    f"'{name}')")
    return None


__all__ = ["QuantTypeInfo", "TensorQuantOverridesHelper"]
