"""IOBinding: bind inputs and (pre-allocated) outputs once, run many times."""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from ..dtypes import value_type_string
from ..errors import InvalidArgument
from ..proto import onnx
from .ortvalue import OrtValue, _device, _owner, array_from_pointer


class _Session(Protocol):
    """What a binding needs of its InferenceSession (which imports this module)."""

    def get_outputs(self) -> list[Any]: ...

    def run(self, output_names: Any, input_feed: Any, run_options: Any = None) -> list[Any]: ...

    def _run_bound(self, output_names: Any, input_feed: Any, run_options: Any) -> list[Any]:
        """As run, but outputs a device produces stay on the device."""
        ...


class IOBinding:
    def __init__(self, session: _Session) -> None:
        self._session = session
        self._inputs: dict[str, Any] = {}
        # name -> preallocated array (results are written into it, host or device) or None
        # (engine allocates); outputs bound to a device without a buffer stay on it
        self._outputs: dict[str, Any] = {}
        self._device_outputs: dict[str, Any] = {}  # name -> device object
        self._results: list[OrtValue] = []

    # -- inputs ----------------------------------------------------------------------------------
    def bind_cpu_input(self, name: str, arr_on_cpu: Any) -> None:
        self._inputs[name] = np.asarray(arr_on_cpu)

    def bind_input(self, name: str, device_type: str, device_id: int, element_type: Any,
                   shape: Any, buffer_ptr: int) -> None:
        dev = _device(device_type, device_id)
        _check_not_string(name, element_type)
        if dev is None:
            self._inputs[name] = array_from_pointer(buffer_ptr, shape, element_type)
        else:
            self._inputs[name] = dev.from_pointer(buffer_ptr, tuple(int(d) for d in shape),
                                                  _np_dtype(element_type))

    def bind_ortvalue_input(self, name: str, ortvalue: OrtValue) -> None:
        self._inputs[name] = ortvalue._value  # a device tensor stays on its device

    def clear_binding_inputs(self) -> None:
        self._inputs.clear()

    # -- outputs ---------------------------------------------------------------------------------
    def bind_output(self, name: str, device_type: str = "cpu", device_id: int = 0,
                    element_type: Any = None, shape: Any = None, buffer_ptr: int | None = None
                    ) -> None:
        dev = _device(device_type, device_id)
        self._device_outputs.pop(name, None)
        if buffer_ptr is not None:
            if element_type is None or shape is None:
                raise ValueError("bind_output with buffer_ptr needs element_type and shape")
            _check_not_string(name, element_type)
            if dev is None:
                self._outputs[name] = array_from_pointer(buffer_ptr, shape, element_type)
            else:
                self._outputs[name] = dev.from_pointer(
                    buffer_ptr, tuple(int(d) for d in shape), _np_dtype(element_type))
        else:
            self._outputs[name] = None
            if dev is not None:
                self._device_outputs[name] = dev

    def bind_ortvalue_output(self, name: str, ortvalue: OrtValue) -> None:
        if not ortvalue.is_tensor():
            raise ValueError("bind_ortvalue_output needs a tensor OrtValue")
        self._device_outputs.pop(name, None)
        self._outputs[name] = ortvalue._value

    def clear_binding_outputs(self) -> None:
        self._outputs.clear()
        self._device_outputs.clear()

    # -- results ---------------------------------------------------------------------------------
    def synchronize_inputs(self) -> None:
        """Wait for the work queued on the bound device inputs (host values need none)."""
        for value in self._inputs.values():
            dev = _owner(value)
            if dev is not None:
                dev.synchronize()

    def synchronize_outputs(self) -> None:
        """A run ends synchronized with its stream: nothing is left in flight."""
        for value in self._results:
            dev = _owner(value._value)
            if dev is not None:
                dev.synchronize()

    def get_outputs(self) -> list[OrtValue]:
        """The outputs as OrtValues; those bound to a device stay there."""
        return list(self._results)

    def copy_outputs_to_cpu(self) -> list[Any]:
        out = []
        for v in self._results:
            value = v.numpy()  # a device tensor is copied to the host here
            out.append(value.copy() if isinstance(value, np.ndarray) and _owner(v._value) is None
                       else value)
        return out

    def _run(self, run_options: Any) -> None:
        names = list(self._outputs) or [o.name for o in self._session.get_outputs()]
        values = self._session._run_bound(names, self._inputs, run_options)
        results = []
        for name, value in zip(names, values, strict=True):
            target = self._outputs.get(name)
            dev = _owner(value)
            if target is not None:
                target_dev = _owner(target)
                if target_dev is None:
                    value = dev.to_host(value) if dev is not None else value
                    _check_bound_output(name, target, value)
                    np.copyto(target, value)
                else:
                    host = dev.to_host(value) if dev is not None else value
                    _check_bound_output(name, target_dev.to_host(target), host)
                    target_dev.copy_into(target, value if dev is not None
                                         else target_dev.to_device(value))
                value = target
            elif name in self._device_outputs:
                if dev is None and isinstance(value, np.ndarray):
                    value = self._device_outputs[name].to_device(value)
            elif dev is not None:
                value = dev.to_host(value)
            results.append(OrtValue(value))
        self._results = results


def _np_dtype(element_type: Any) -> np.dtype:
    from ..dtypes import np_dtype

    return np_dtype(element_type) if isinstance(element_type, int) else np.dtype(element_type)


def _check_not_string(name: str, element_type: Any) -> None:
    """A raw buffer holds no Python strings: binding one as a string tensor would read
    arbitrary memory as object pointers. Refused as onnxruntime refuses it (RuntimeError)."""
    is_string = (element_type == onnx.TensorProto.STRING if isinstance(element_type, int)
                 else np.dtype(element_type).kind in "USO")
    if is_string:
        raise InvalidArgument(
            f"'{name}': Only binding non-string Tensors is supported through a buffer pointer; "
            "bind a string tensor with bind_cpu_input or bind_ortvalue_input")


def _check_bound_output(name: str, buffer: np.ndarray, value: Any) -> None:
    """A bound output buffer must have the type and shape of what the model produced: an
    InvalidArgument (a RuntimeError, as onnxruntime raises, and a ValueError) with
    onnxruntime's wording, naming the output."""
    if not isinstance(value, np.ndarray):
        raise InvalidArgument(
            f"output '{name}' is a {value_type_string(value)}, which cannot be written into a "
            "bound tensor buffer"
        )
    if buffer.dtype != value.dtype:
        raise InvalidArgument(
            f"Unexpected output data type for '{name}'. Actual: ({value_type_string(buffer)}) , "
            f"expected: ({value_type_string(value)})"
        )
    if buffer.ndim != value.ndim:
        raise InvalidArgument(
            f"Invalid rank for output: {name} Got: {buffer.ndim} Expected: {value.ndim} "
            f"(bound buffer shape {list(buffer.shape)}, output shape {list(value.shape)})"
        )
    bad = [f"index: {i} Got: {got} Expected: {want}"
           for i, (got, want) in enumerate(zip(buffer.shape, value.shape, strict=True))
           if got != want]
    if bad:
        raise InvalidArgument(
            f"Got invalid dimensions for output: {name} for the following indices: "
            f"{'; '.join(bad)} (bound buffer shape {list(buffer.shape)}, output shape "
            f"{list(value.shape)})"
        )
