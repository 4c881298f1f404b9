"""onnxruntime-genai's Python API on onnxrun: run the model folders of its model builder.

    import onnxrun.genai as og
    model = og.Model("folder")              # genai_config.json, model.onnx, tokenizer.json
    tokenizer = og.Tokenizer(model)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=200)
    generator = og.Generator(model, params)
    generator.append_tokens(tokenizer.encode("prompt"))
    while not generator.is_done():
        generator.generate_next_token()
    print(tokenizer.decode(generator.get_sequence(0)))

``import onnxruntime_genai`` gives this module once ``onnxrun.compat.install()`` has run.
Parts: ``config`` (genai_config.json), ``model`` (the decoder session), ``state`` (KV cache,
mask, positions), ``search`` (greedy, sampling, beam), ``generator`` (the loop),
``tokenizer`` (the ``tokenizers`` library).
"""

from __future__ import annotations

from .. import errors
from .adapters import Adapters
from .config import Config
from .generator import Generator, GeneratorParams
from .model import Model
from .tensors import NamedTensors, Tensor
from .tokenizer import Tokenizer, TokenizerStream

__all__ = [
    "Adapters", "Config", "Generator", "GeneratorParams", "Model", "NamedTensors", "Tensor",
    "Tokenizer", "TokenizerStream", "is_cuda_available", "is_dml_available",
    "is_openvino_available", "is_qnn_available", "is_rocm_available", "is_webgpu_available",
    "set_log_options",
    "set_log_callback", "set_current_gpu_device_id", "get_current_gpu_device_id",
    "enable_telemetry_events", "disable_telemetry_events", "register_execution_provider_library",
    "unregister_execution_provider_library",
]

_log_options: dict = {}


def set_log_options(**options) -> None:
    """Accepted as onnxruntime-genai accepts them (enabled, model_input_values, ...); onnxrun.genai
    writes no log of its own."""
    _log_options.update(options)


def set_log_callback(callback) -> None:  # noqa: ARG001 - nothing is logged
    return None


def is_cuda_available() -> bool:
    """Whether ``append_provider("cuda")`` can run: the CUDA provider finds a device."""
    from .. import get_available_providers

    return "CUDAExecutionProvider" in get_available_providers()


def is_dml_available() -> bool:
    return False


def is_rocm_available() -> bool:
    return False


def is_openvino_available() -> bool:
    return False


def is_qnn_available() -> bool:
    return False


def is_webgpu_available() -> bool:
    return False


def set_current_gpu_device_id(device_id: int) -> None:
    raise errors.EPFail(f"no GPU device {device_id}: onnxrun.genai runs on the CPU")


def get_current_gpu_device_id() -> int:
    raise errors.EPFail("no GPU device: onnxrun.genai runs on the CPU")


def enable_telemetry_events() -> None:
    return None


def disable_telemetry_events() -> None:
    return None


def register_execution_provider_library(name: str, path: str) -> None:  # noqa: ARG001
    raise errors.EPFail(f"cannot register {name}: onnxrun.genai runs on the CPU and loads no "
                        "execution provider libraries")


def unregister_execution_provider_library(name: str) -> None:
    raise errors.InvalidArgument(f"execution provider library {name} is not registered")
