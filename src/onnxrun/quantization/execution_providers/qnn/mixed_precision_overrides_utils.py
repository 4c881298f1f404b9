"""Mixed precision: the overrides that make a QDQ model with some tensors in another
activation type valid.

An operator reads and writes one activation type. When the user overrides a tensor to another
type (say uint16 in a uint8 model), the operators that produce and consume it must run in that
type too: their other inputs are converted to it (a ``convert`` entry for those consumers only),
and their outputs converted back to the default type for the consumers that stay in it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import onnx

from ...quant_types import QuantType
from ...tensor_quant_overrides import QuantTypeInfo, TensorQuantOverridesHelper

_FLOATS = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16)


@dataclass
class TensorTypeRequest:
    """The type a tensor's producer wants to write (None: the default) and the type a set of
    its consumers wants to read (None: the default for all)."""

    producer: QuantTypeInfo | None
    consumers: tuple[QuantTypeInfo, set[str]] | None


class MixedPrecisionTensorQuantOverridesFixer:
    """Completes user overrides that change some activations' types (see the module doc)."""

    def __init__(self, overrides: TensorQuantOverridesHelper,
                 producers: dict[str, onnx.NodeProto], consumers: dict[str, list[onnx.NodeProto]],
                 value_infos: dict[str, onnx.ValueInfoProto],
                 initializers: dict[str, onnx.TensorProto]) -> None:
        self.overrides = overrides
        self.producers = producers
        self.consumers = consumers
        self.value_infos = value_infos
        self.initializers = initializers

    @staticmethod
    def create_from_model(overrides: TensorQuantOverridesHelper, model: onnx.ModelProto,
                          default_activation_qtype: QuantType
                          ) -> MixedPrecisionTensorQuantOverridesFixer:
        model = onnx.shape_inference.infer_shapes(model)
        initializers = {t.name: t for t in model.graph.initializer}
        value_infos = {vi.name: vi for vi in model.graph.value_info}
        value_infos.update({o.name: o for o in model.graph.output})
        value_infos.update({i.name: i for i in model.graph.input})
        ok, why = overrides.is_valid(initializers, set(value_infos), default_activation_qtype)
        if not ok:
            logging.getLogger("onnxrun.quantization").error(
                "invalid tensor quantization overrides:\n%s", overrides.pprint_str(indent=4))
            raise ValueError(why)
        producers: dict[str, onnx.NodeProto] = {}
        consumers: dict[str, list[onnx.NodeProto]] = {}
        for node in model.graph.node:
            for name in node.input:
                if name:
                    consumers.setdefault(name, []).append(node)
            for name in node.output:
                producers[name] = node
        return MixedPrecisionTensorQuantOverridesFixer(overrides, producers, consumers,
                                                       value_infos, initializers)

    def apply(self, default_activation_qtype: QuantType,
              default_activation_symmetric: bool) -> None:
        """Fix the overrides in place: add the conversions each type request needs."""
        default = QuantTypeInfo(default_activation_qtype)
        requests = self.get_desired_tensor_types(default_activation_qtype,
                                                 default_activation_symmetric)
        for name, req in requests.items():
            everyone = {n.name for n in self.consumers.get(name, [])}
            if req.producer is not None and not req.consumers:
                self._update_converted_tensor(name, req.producer, default, everyone)
            elif req.producer is None and req.consumers:
                produced = self.overrides.get_node_output_qtype_info(name,
                                                                     default_activation_qtype)
                wanted, readers = req.consumers
                if produced != wanted:
                    self._update_converted_tensor(name, produced, wanted, readers)
                elif not self._check_nodes_are_not_convert_consumers(name, readers):
                    raise ValueError(f"Tensor override for '{name}' converts the type for "
                                     "consumers that need the original type.")
            elif req.producer is not None:
                wanted, readers = req.consumers
                if req.producer != wanted:
                    self._update_converted_tensor(name, req.producer, wanted, readers)
                elif everyone - readers:
                    self._update_converted_tensor(name, req.producer, default,
                                                  everyone - readers)
                elif name not in self.overrides:
                    self.overrides[name] = [{}]
                    req.producer.save_to_dict(self.overrides[name][0])
            else:
                raise ValueError(f"TypeRequest for tensor {name} has no producer or consumers.")
        ok, why = self.overrides.is_valid(self.initializers, set(self.value_infos),
                                          default_activation_qtype)
        if not ok:
            raise ValueError(why)

    def get_desired_tensor_types(self, default_activation_qtype: QuantType,
                                 default_activation_symmetric: bool
                                 ) -> dict[str, TensorTypeRequest]:
        """For each overridden activation of a non-default type, every input and output of its
        producer and consumers is asked to be of that type."""
        requests: dict[str, TensorTypeRequest] = {}
        default = QuantTypeInfo(default_activation_qtype, default_activation_symmetric)
        for name, lst in self.overrides.items():
            if not self._quantizable(name) or name in self.initializers or len(lst) != 1:
                continue
            info = QuantTypeInfo.load_from_dict(lst[0], default.quant_type)
            if info == default or "convert" in lst[0]:
                continue
            if name in self.producers:
                self._add_type_requests_for_node(requests, info, self.producers[name])
            for node in self.consumers.get(name, []):
                self._add_type_requests_for_node(requests, info, node)
        return requests

    def _add_type_requests_for_node(self, requests: dict[str, TensorTypeRequest],
                                    info: QuantTypeInfo, node: onnx.NodeProto) -> None:
        for name in node.output:
            if not self._quantizable(name):
                continue
            req = requests.setdefault(name, TensorTypeRequest(None, None))
            if req.producer is not None and req.producer != info:
                raise ValueError(f"Tensor {name} has multiple types.")
            req.producer = info
        for name in node.input:
            if not name or name in self.initializers or not self._quantizable(name):
                continue
            req = requests.setdefault(name, TensorTypeRequest(None, None))
            if req.consumers is None:
                req.consumers = (info, set())
            if req.consumers[0] != info:
                raise ValueError(f"Tensor {name} has consumers requesting different types.")
            if not node.name:
                raise ValueError(f"Node of type {node.op_type} with output 0 {node.output[0]} "
                                 "does not have a name!")
            req.consumers[1].add(node.name)

    def _update_converted_tensor(self, name: str, produced: QuantTypeInfo,
                                 consumed: QuantTypeInfo, readers: set[str]) -> None:
        if not self.overrides.get(name):
            self.overrides[name] = [{}]
            produced.save_to_dict(self.overrides[name][0])
        d = self.overrides[name][0]
        if produced != QuantTypeInfo.load_from_dict(d):
            raise ValueError(f"Desired producer quant_type for {name} doesn't match existing "
                             "type.")
        if not readers:
            return
        if "convert" not in d:
            d["convert"] = {}
            consumed.save_to_dict(d["convert"])
        if consumed != QuantTypeInfo.load_from_dict(d["convert"]):
            raise ValueError(f"Desired consumer quant_type for {name} doesn't match existing "
                             "type.")
        d["convert"].setdefault("recv_nodes", set()).update(readers)

    def _check_nodes_are_not_convert_consumers(self, name: str, node_names: set[str]) -> bool:
        d = (self.overrides.get(name) or [{}])[0]
        conv = d.get("convert")
        if conv is None:
            return True
        if "recv_nodes" not in conv:
            return False
        return not conv["recv_nodes"] & node_names

    def _quantizable(self, name: str) -> bool:
        if name in self.initializers:
            return self.initializers[name].data_type in _FLOATS
        vi = self.value_infos.get(name)
        return vi is not None and vi.type.HasField("tensor_type") \
            and vi.type.tensor_type.elem_type in _FLOATS


__all__ = ["MixedPrecisionTensorQuantOverridesFixer", "TensorTypeRequest"]
