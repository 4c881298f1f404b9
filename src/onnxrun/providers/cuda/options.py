"""CUDAExecutionProvider's options: onnxruntime's names and defaults, and what onnxrun does with
each (docs/GPU.md has the table)."""

from __future__ import annotations

from typing import Any

from ...errors import InvalidArgument

SIZE_MAX = 18446744073709551615

# name -> (onnxruntime's default, honoured?)
DEFAULTS: dict[str, tuple[str, bool]] = {
    "device_id": ("0", True),
    "gpu_mem_limit": (str(SIZE_MAX), True),  # a CuPy memory pool of its own
    "arena_extend_strategy": ("kNextPowerOfTwo", False),  # CuPy's pool grows its own way
    "cudnn_conv_algo_search": ("EXHAUSTIVE", False),  # convolutions are GEMMs, no cuDNN search
    "do_copy_in_default_stream": ("1", False),  # copies run on the run's own stream
    "use_tf32": ("1", False),  # GEMMs use CuPy's compute type (CUPY_TF32 decides)
    "enable_cuda_graph": ("0", True),
    "cudnn_conv_use_max_workspace": ("1", False),
    "cudnn_conv1d_pad_to_nc1d": ("0", False),
    "enable_skip_layer_norm_strict_mode": ("0", False),
    "prefer_nhwc": ("0", False),
    "tunable_op_enable": ("0", False),
    "tunable_op_tuning_enable": ("0", False),
    "tunable_op_max_tuning_duration_ms": ("0", False),
    "has_user_compute_stream": ("0", False),
    "use_ep_level_unified_stream": ("0", False),
    "fuse_conv_bias": ("0", False),
    "sdpa_kernel": ("0", False),
}

_CHOICES = {
    "arena_extend_strategy": ("kNextPowerOfTwo", "kSameAsRequested"),
    "cudnn_conv_algo_search": ("EXHAUSTIVE", "HEURISTIC", "DEFAULT"),
}
_BOOLEANS = {"do_copy_in_default_stream", "use_tf32", "enable_cuda_graph",
             "cudnn_conv_use_max_workspace", "cudnn_conv1d_pad_to_nc1d",
             "enable_skip_layer_norm_strict_mode", "prefer_nhwc", "tunable_op_enable",
             "tunable_op_tuning_enable", "has_user_compute_stream",
             "use_ep_level_unified_stream", "fuse_conv_bias"}


def parse(options: dict[str, Any] | None) -> dict[str, str]:
    """Every option as a string (given ones checked as onnxruntime checks them)."""
    result = {k: d for k, (d, _) in DEFAULTS.items()}
    for key, value in (options or {}).items():
        key = str(key)
        text = str(value)
        if isinstance(value, bool):
            text = "1" if value else "0"
        if key not in DEFAULTS:
            raise InvalidArgument(f"[CUDAExecutionProvider] Unknown provider option: '{key}'. "
                                  f"Known options: {sorted(DEFAULTS)}")
        if key in _CHOICES and text not in _CHOICES[key]:
            raise InvalidArgument(f"[CUDAExecutionProvider] {key} must be one of "
                                  f"{list(_CHOICES[key])}, got '{text}'")
        if key in _BOOLEANS and text not in ("0", "1", "True", "False", "true", "false"):
            raise InvalidArgument(f"[CUDAExecutionProvider] {key} must be 0 or 1, got '{text}'")
        if key in ("device_id", "gpu_mem_limit", "tunable_op_max_tuning_duration_ms",
                   "sdpa_kernel"):
            try:
                if int(text) < 0:
                    raise ValueError
            except ValueError:
                raise InvalidArgument(f"[CUDAExecutionProvider] {key} must be a non-negative "
                                      f"integer, got '{text}'") from None
        if key in _BOOLEANS:
            text = "1" if text in ("1", "True", "true") else "0"
        result[key] = text
    return result


def flag(options: dict[str, str], key: str) -> bool:
    return options[key] == "1"
