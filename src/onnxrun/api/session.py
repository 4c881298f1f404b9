"""InferenceSession: load -> validate -> optimize -> partition -> plan, then run many times."""

from __future__ import annotations

import contextlib
import copy
import functools
import gc
import logging
import os
import sys
import threading
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from .. import dtypes, threads
from ..errors import Fail, InvalidArgument, InvalidGraph, InvalidProtobuf
from ..expand import expand_functions
from ..ir import Model, Value, model_to_proto
from ..load import load_model
from ..memcpy import insert_copies
from ..optimize import OptimizationReport, optimize
from ..partition import partition
from ..plan import Program
from ..profile import Profiler
from ..proto import onnx
from ..providers import CPU, ExecutionProvider, available_providers, create_provider
from ..specialize import attach as specialize_shapes
from ..validate import validate
from . import devices, sparse, thread_pools
from .iobinding import IOBinding
from .options import (
    ExecutionMode,
    GraphOptimizationLevel,
    RunOptions,
    SessionOptions,
    options_from_model,
)
from .ortvalue import OrtValue
from .sparse import SparseTensor

logger = logging.getLogger("onnxrun")

# Providers onnxruntime knows: asking for one that onnxrun lacks warns and falls back to CPU, as
# onnxruntime does for a provider its build lacks; any other name is an error.
_KNOWN_PROVIDERS = {
    "CUDAExecutionProvider", "TensorrtExecutionProvider", "ROCMExecutionProvider",
    "MIGraphXExecutionProvider", "OpenVINOExecutionProvider", "DnnlExecutionProvider",
    "CoreMLExecutionProvider", "DmlExecutionProvider", "QNNExecutionProvider",
    "XnnpackExecutionProvider", "WebGpuExecutionProvider", "NnapiExecutionProvider",
    "AzureExecutionProvider", "ACLExecutionProvider", "ArmNNExecutionProvider",
}


class NodeArg:
    """An input or output of the model as onnxruntime describes it."""

    __slots__ = ("name", "type", "shape")

    def __init__(self, name: str, type: str, shape: list[int | str | None] | None) -> None:  # noqa: A002
        self.name = name
        self.type = type
        self.shape = shape

    def __repr__(self) -> str:
        return f"NodeArg(name='{self.name}', type='{self.type}', shape={self.shape})"


class ModelMetadata:
    def __init__(self, model: Model) -> None:
        self.producer_name = model.producer_name
        self.graph_name = model.graph.name
        self.domain = model.domain
        self.description = model.doc_string
        self.graph_description = model.graph.doc_string
        self.version = model.model_version
        self.custom_metadata_map = dict(model.metadata_props)


_RECORD_ASSIGNMENT = "session.record_ep_graph_assignment_info"


class OrtEpAssignedNode:
    """A node as get_provider_graph_assignment_info reports it."""

    __slots__ = ("domain", "name", "op_type")

    def __init__(self, domain: str, name: str, op_type: str) -> None:
        self.domain, self.name, self.op_type = domain, name, op_type

    def __repr__(self) -> str:
        return f"OrtEpAssignedNode(domain='{self.domain}', op_type='{self.op_type}', " \
               f"name='{self.name}')"


class OrtEpAssignedSubgraph:
    """Nodes an execution provider runs (get_provider_graph_assignment_info)."""

    __slots__ = ("ep_name", "_nodes")

    def __init__(self, ep_name: str, nodes: list[OrtEpAssignedNode]) -> None:
        self.ep_name = ep_name
        self._nodes = nodes

    def get_nodes(self) -> list[OrtEpAssignedNode]:
        return list(self._nodes)

    def __repr__(self) -> str:
        return f"OrtEpAssignedSubgraph(ep_name='{self.ep_name}', nodes={self._nodes})"


class _InputSpec:
    """What run() checks a fed value against."""

    __slots__ = ("name", "slot", "kind", "dtype", "shape", "has_default", "sparse", "map_key",
                 "fixed")

    def __init__(self, value: Value, slot: int, has_default: bool, sparse: bool = False) -> None:
        self.name = value.name
        self.sparse = sparse  # declared sparse: takes a SparseTensor, densified
        self.slot = slot
        self.has_default = has_default
        tp = value.type
        self.kind = tp.WhichOneof("value") if tp is not None else None
        self.map_key = tp.map_type.key_type if self.kind == "map_type" else None
        self.dtype: np.dtype | None = None
        self.shape: list[int | str | None] | None = None
        if self.kind == "tensor_type":
            try:
                self.dtype = dtypes.np_dtype(tp.tensor_type.elem_type)
            except TypeError:
                self.dtype = None
            self.shape = dtypes.type_shape(tp)
        # a host array of the declared dtype passes when these (axis, size) pairs hold; None:
        # every value takes _check_value's whole path (a string type, an unknown rank)
        self.fixed: tuple[tuple[int, int], ...] | None = None
        if self.kind == "tensor_type" and self.dtype is not None and self.dtype.kind != "O" \
                and self.shape is not None and not sparse:
            self.fixed = tuple((i, d) for i, d in enumerate(self.shape)
                               if isinstance(d, int) and d >= 0)


class InferenceSession:
    """Runs an ONNX model. Same constructor and methods as ``onnxruntime.InferenceSession``."""

    def __init__(
        self,
        path_or_bytes: str | os.PathLike | bytes | onnx.ModelProto,
        sess_options: SessionOptions | None = None,
        providers: Sequence[str | tuple[str, dict[str, Any]]] | None = None,
        provider_options: Sequence[dict[str, Any]] | None = None,
        **kwargs: Any,
    ) -> None:
        self._sess_options = sess_options if sess_options is not None else SessionOptions()
        self._model_path = path_or_bytes if isinstance(path_or_bytes, str | os.PathLike) else None
        self._source = (path_or_bytes, kwargs)  # set_providers builds the session again
        self._enable_fallback = True
        self._create(providers, provider_options)

    def _create(self, providers: Any, provider_options: Any) -> None:
        """Create the session for these providers; if a device provider fails to start, fall
        back to the CPU provider with onnxruntime's warning (unless disable_fallback())."""
        try:
            self._providers = self._create_providers(providers, provider_options)
        except RuntimeError as e:
            if not self._enable_fallback or isinstance(e, InvalidArgument) or not any(
                    _provider_name(p) != CPU for p in providers or ()):
                raise
            fallback = [CPU]
            warnings.warn(f"EP Error {e} when using {[_provider_name(p) for p in providers]}",
                          RuntimeWarning, stacklevel=3)
            warnings.warn(f"Falling back to {fallback} and retrying.", RuntimeWarning,
                          stacklevel=3)
            self._providers = self._create_providers(fallback, None)
        path_or_bytes, kwargs = self._source
        t_start, t_start_wall = time.perf_counter_ns(), time.time_ns()

        try:
            with _collector_paused():
                model, t_loaded = self._prepare(path_or_bytes, kwargs.get("disabled_optimizers"))
        except UnicodeDecodeError as e:
            # protobuf decodes string fields when they are first read, anywhere in the pipeline
            raise InvalidProtobuf(f"Failed to load model: a string field is not UTF-8 ({e})") from e
        opts = self._sess_options  # the model's own options may have replaced them
        self._profiler = None
        if opts.enable_profiling:
            self._profiler = Profiler(opts.profile_file_prefix, (t_start, t_start_wall))
            kind = "uri" if self._model_path is not None else "array"
            self._profiler.session_event(f"model_loading_{kind}", t_start, t_loaded)
            self._profiler.session_event("session_initialization", t_start,
                                         time.perf_counter_ns())

        g = model.graph
        initializer_ids = {id(v) for v in g.initializers.values()}
        self._input_specs = [
            _InputSpec(v, s, id(v) in initializer_ids, v.name in self._sparse_types)
            for v, s in zip(g.inputs, self._program.input_slots, strict=True)
        ]
        self._sparse_outputs = {v.name for v in g.outputs if v.name in self._sparse_types}
        self._inputs_by_name = {spec.name: spec for spec in self._input_specs}
        self._output_slot = {
            v.name: s for v, s in zip(g.outputs, self._program.output_slots, strict=True)
        }
        self._output_names = [v.name for v in g.outputs]
        self._all_fetches = tuple(self._program.output_slots)
        # BLAS at one thread during runs (_BlasHeld); a device's kernels leave it alone
        self._blas_threads = _BLAS_HELD if self._device is None else contextlib.nullcontext()
        # enable_cpu_mem_arena is stored, not acted on: glibc's malloc settings belong to the host
        # process (docs/PERFORMANCE.md, "Memory": the GLIBC_TUNABLES opt-in and its figures).

    def _prepare(self, path_or_bytes: Any, disabled_optimizers: Any) -> tuple[Model, int]:
        """Steps 1-5: load, validate, optimize, partition, plan (sets the program and model).
        Returns the model and when loading ended."""
        opts = self._sess_options
        # 1. load
        ext_dir = opts._config.get("session.model_external_initializers_file_folder_path")
        proto, model = load_model(
            path_or_bytes, ext_dir, opts._external_files,
            {n: opts._initializers[n] for n in opts._external_initializers})
        t_loaded = time.perf_counter_ns()
        if os.environ.get("ORT_LOAD_CONFIG_FROM_MODEL") == "1":
            opts = self._sess_options = options_from_model(opts, model.metadata_props)
        self._threads = thread_pools.for_session(opts)
        self._sparse_types: dict[str, onnx.TypeProto] = {}
        if sparse.has_sparse_io(proto):
            if proto is path_or_bytes:  # the caller's ModelProto: left as it is
                proto = onnx.ModelProto()
                proto.CopyFrom(path_or_bytes)
            self._sparse_types = sparse.densify_io(proto, model)
        self._apply_option_overrides(model)
        if opts._free_dim_by_name or opts._free_dim_by_denotation:
            proto = _with_overridden_dims(proto, model)
        # 2. validate
        validate(proto, model, has_kernel=lambda op_type, opset: any(
            p.registry.lookup("", op_type, opset) is not None for p in self._providers),
            released_opsets_only=opts._config.get("session.allow_released_opsets_only") != "0",
            min_inputs=self._min_inputs,
            # a model file is what a later process loads again (one built in memory seldom is)
            cache=self._model_path is not None)
        del proto
        # 3. optimize
        self._device = next((p for p in self._providers if p.device != "cpu"), None)
        unwanted = set().union(*(p.unwanted_passes(model) for p in self._providers))
        if unwanted:
            disabled_optimizers = {*(disabled_optimizers or ()), *unwanted}
        model, self._optimization_report = optimize(
            model, int(opts.graph_optimization_level), opts, disabled_optimizers
        )
        if opts.optimized_model_filepath:
            _save_optimized(model, opts.optimized_model_filepath, opts._config)
        # 4. partition (operators defined as ONNX functions are expanded first), 5. plan
        expand_functions(model, self._providers)
        assignment = partition(model, self._providers)
        # 4b. copies between host and device, once
        self._placement = insert_copies(model, assignment)
        self._optimization_report.placement = self._placement
        self._assignment_info = None
        if opts._config.get(_RECORD_ASSIGNMENT) == "1":
            # onnxruntime reports each node the CPU provider runs as a subgraph of its own
            self._assignment_info = [
                OrtEpAssignedSubgraph(assignment[id(n)].name,
                                      [OrtEpAssignedNode(n.domain, n.name, n.op_type)])
                for n in model.graph.nodes]
        self._pool = self._own_pool = None
        if opts.execution_mode == ExecutionMode.ORT_PARALLEL and threads.available():
            self._pool = self._threads.pool  # the global inter-op pool
            if self._pool is None:
                workers = self._threads.inter_op_num_threads or os.cpu_count() or 2
                self._pool = self._own_pool = ThreadPoolExecutor(
                    max_workers=workers, thread_name_prefix="onnxrun-inter-op")
        specialize = opts.graph_optimization_level != GraphOptimizationLevel.ORT_DISABLE_ALL and \
            opts._config.get("onnxrun.shape_specialization", "1") != "0"
        kernel_opts = opts
        if self._threads.intra_op_num_threads != opts.intra_op_num_threads:
            # Kernels read their thread count from the options: the global pool's here.
            kernel_opts = copy.copy(opts)
            kernel_opts.intra_op_num_threads = self._threads.intra_op_num_threads
        self._program = Program(model.graph, model, assignment, kernel_opts, pool=self._pool)
        if opts.graph_optimization_level >= GraphOptimizationLevel.ORT_ENABLE_LAYOUT:
            # the layout level's work is done by the convolution kernels as they are prepared
            layouts = [bool(s.kernel.channels_last) for s in self._program.steps
                       if hasattr(s.kernel, "channels_last")]
            self._optimization_report.layout = (sum(layouts), len(layouts))
        if specialize:
            specialize_shapes(self._program)
        self._graphs = None
        if self._device is not None and self._device.enable_cuda_graph:
            from ..providers.cuda.graphs import GraphRunner, check_capturable

            check_capturable(self._program.full_plan.steps, set(self._program.input_slots),
                             {self._program.slot_of(v) for v in model.graph.initializers.values()})
            self._graphs = GraphRunner(self._device.backend)
        self._model = model
        return model, t_loaded

    def __del__(self) -> None:
        pool = getattr(self, "_own_pool", None)
        if pool is not None:
            pool.shutdown(wait=False)

    # -- construction helpers ---------------------------------------------------------------------
    def _create_providers(self, providers: Any, provider_options: Any) -> list[ExecutionProvider]:
        available = available_providers()
        names, options = check_and_normalize_provider_args(providers, provider_options, available)
        chosen: list[ExecutionProvider] = []
        for name, opts in zip(names, options, strict=True):
            if name in available:
                chosen.append(create_provider(name, opts))
            elif name not in _KNOWN_PROVIDERS:
                # RuntimeError as in onnxruntime, and ValueError: it is a bad argument
                raise InvalidArgument(f"Unknown Provider Type: {name}")
            # else: a provider this build lacks (warned about above): the CPU provider runs
        if all(p.name != CPU for p in chosen):
            chosen.append(create_provider(CPU))  # CPU is always the fallback
        return chosen

    def _min_inputs(self, op_type: str, opset: int) -> int | None:
        """The fewest inputs any provider's kernel of an ai.onnx operator runs with (None:
        none runs it): validation's input counts where onnx's checker is not there."""
        found = [k.min_inputs for p in self._providers
                 if (k := p.registry.lookup("", op_type, opset)) is not None]
        return min(found) if found else None

    def _apply_option_overrides(self, model: Model) -> None:
        opts = self._sess_options
        g = model.graph
        for name, arr in opts._initializers.items():
            v = g.initializers.get(name)
            if v is None:
                v = next((x for x in g.inputs if x.name == name), None)
                if v is None:
                    raise InvalidArgument(
                        f"add_initializer: '{name}' is neither an initializer nor an input"
                    )
                g.inputs.remove(v)
                g.initializers[name] = v
            v.const_value = arr
        by_name, by_denotation = dict(opts._free_dim_by_name), opts._free_dim_by_denotation
        for v in g.inputs:  # a denoted dimension's symbol is that value everywhere too
            if by_denotation and v.type is not None and v.type.HasField("tensor_type"):
                for d in v.type.tensor_type.shape.dim:
                    if d.dim_param and d.denotation in by_denotation:
                        by_name.setdefault(d.dim_param, by_denotation[d.denotation])
        if by_name or by_denotation:
            # A named dimension is one value everywhere: outputs report it fixed too, as in ORT.
            for v in [*g.inputs, *g.outputs]:
                if v.type is not None and v.type.HasField("tensor_type"):
                    # A copy: the IR's types may be messages of the caller's ModelProto.
                    tp = onnx.TypeProto()
                    tp.CopyFrom(v.type)
                    v.type = tp
                    for d in v.type.tensor_type.shape.dim:
                        if d.WhichOneof("value") == "dim_value":
                            continue
                        value = by_name.get(d.dim_param) if d.dim_param else None
                        if value is None and d.denotation:
                            value = by_denotation.get(d.denotation)
                        if value is not None:
                            d.dim_value = value

    # -- introspection ----------------------------------------------------------------------------
    def get_inputs(self) -> list[NodeArg]:
        return [self._node_arg(v) for v, spec in zip(self._model.graph.inputs, self._input_specs,
                                                      strict=True) if not spec.has_default]

    def get_overridable_initializers(self) -> list[NodeArg]:
        return [self._node_arg(v) for v, spec in zip(self._model.graph.inputs, self._input_specs,
                                                      strict=True) if spec.has_default]

    def get_outputs(self) -> list[NodeArg]:
        return [self._node_arg(v) for v in self._model.graph.outputs]

    def _node_arg(self, v: Value) -> NodeArg:
        tp = self._sparse_types.get(v.name, v.type)  # as declared: sparse I/O run dense
        shape = dtypes.type_shape(tp)
        # onnxruntime reports an unknown rank as [] (and an unknown dimension as None).
        return NodeArg(v.name, dtypes.type_string(tp), [] if shape is None else shape)

    def get_input_memory_infos(self) -> list[devices.OrtMemoryInfo]:
        """Where each input of get_inputs() is expected: CPU memory, from the session's arena
        when enable_cpu_mem_arena is on (as onnxruntime reports it)."""
        return [self._cpu_memory_info() for _ in self.get_inputs()]

    def get_output_memory_infos(self) -> list[devices.OrtMemoryInfo]:
        """Where each output of get_outputs() is produced (see get_input_memory_infos)."""
        return [self._cpu_memory_info() for _ in self.get_outputs()]

    def get_input_epdevices(self) -> list[None]:
        """The plugin-EP device of each input: None, onnxrun registers no EP devices."""
        return [None for _ in self.get_inputs()]

    def _cpu_memory_info(self) -> devices.OrtMemoryInfo:
        allocator = (devices.OrtAllocatorType.ORT_ARENA_ALLOCATOR
                     if self._sess_options.enable_cpu_mem_arena
                     else devices.OrtAllocatorType.ORT_DEVICE_ALLOCATOR)
        return devices.OrtMemoryInfo("Cpu", allocator, 0, devices.OrtMemType.DEFAULT)

    def get_optimization_report(self) -> OptimizationReport:
        """What the graph optimizer did to this session's model (onnxrun extension)."""
        return self._optimization_report

    def get_modelmeta(self) -> ModelMetadata:
        return ModelMetadata(self._model)

    def get_providers(self) -> list[str]:
        return [p.name for p in self._providers]

    def get_provider_options(self) -> dict[str, dict[str, str]]:
        return {p.name: {k: str(v) for k, v in p.options.items()} for p in self._providers}

    def get_provider_graph_assignment_info(self) -> list[OrtEpAssignedSubgraph]:
        """The nodes of the optimized graph each execution provider runs, one subgraph per
        node. Needs the session config entry "session.record_ep_graph_assignment_info" = "1"."""
        if self._assignment_info is None:
            raise Fail(
                f"Session configuration entry '{_RECORD_ASSIGNMENT}' must be set to \"1\" to "
                "retrieve EP graph assignment information.")
        return list(self._assignment_info)

    def get_session_options(self) -> SessionOptions:
        return self._sess_options

    def set_providers(self, providers: Any = None, provider_options: Any = None) -> None:
        """Build the session again for these providers (onnxruntime does the same)."""
        if self._model_path is None and not isinstance(self._source[0], bytes | onnx.ModelProto):
            raise RuntimeError("set_providers needs the model the session was created from")
        self._create(providers, provider_options)

    def disable_fallback(self) -> None:
        """A device provider that fails to start raises instead of falling back to CPU."""
        self._enable_fallback = False

    def enable_fallback(self) -> None:
        """A device provider that fails to start falls back to CPU, with a warning."""
        self._enable_fallback = True

    def end_profiling(self) -> str:
        """Write the profile recorded so far and return its file name ("" when not profiling)."""
        if self._profiler is None:
            return ""
        return self._profiler.end()

    def get_profiling_start_time_ns(self) -> int:
        return self._profiler.start_wall_ns if self._profiler is not None else 0

    # -- running ----------------------------------------------------------------------------------
    def run(
        self,
        output_names: Sequence[str] | None,
        input_feed: Mapping[str, Any],
        run_options: RunOptions | None = None,
    ) -> list[Any]:
        """Compute ``output_names`` (all outputs when None) from ``input_feed``."""
        if type(input_feed) is not dict and not isinstance(input_feed, Mapping):  # (ABC check:
            raise InvalidArgument(  # ~1 us)
                f"input_feed must be a dict of input name -> value, got {type(input_feed).__name__}"
            )
        if run_options is not None and run_options._active_adapters:
            input_feed = _with_adapter_parameters(input_feed, run_options._active_adapters)
        feeds = self._check_feeds(input_feed)
        results = self._run_feeds(self._fetch_slots(output_names), feeds, run_options)
        if self._device is not None:
            results = [self._device.to_host(r) for r in results]
        return self._caller_outputs(results, feeds, output_names)

    def _caller_outputs(self, results: list[Any], feeds: list[tuple[int, Any]],
                        output_names: Sequence[str] | None) -> list[Any]:
        """Host results as the caller gets them (device arrays pass through)."""
        outputs = [_as_output(r) for r in results]
        if self._sparse_outputs:
            for i, name in enumerate(output_names or self._output_names):
                if name in self._sparse_outputs and isinstance(outputs[i], np.ndarray):
                    outputs[i] = SparseTensor.from_dense(outputs[i])
        # An output may be a view of a fed array (Identity, Reshape of an input): hand back a
        # buffer of its own, as onnxruntime does, so writing to one never changes the other.
        fed = [v for _, v in feeds if isinstance(v, np.ndarray)]
        if fed:
            for i, out in enumerate(outputs):
                if isinstance(out, np.ndarray) and not _own_memory(out, fed) and \
                        any(np.may_share_memory(out, f) for f in fed):
                    outputs[i] = out.copy()
        return outputs

    def _run_feeds(self, fetches: tuple[int, ...], feeds: list[tuple[int, Any]],
                   run_options: Any) -> list[Any]:
        """The run itself: outputs a device provider produces stay on the device."""
        # Kernels follow IEEE semantics (log(0) = -inf, a fully masked softmax row = nan), as
        # onnxruntime does: numpy's floating-point warnings would only be noise here.
        with np.errstate(all="ignore"), self._blas_threads:
            if self._device is None:
                if self._profiler is None:
                    return self._program.run_fetches(fetches, feeds, run_options)
                return self._run_profiled(fetches, feeds, run_options)
            with self._device.backend.run_stream():
                if self._profiler is not None:
                    return self._run_profiled(fetches, feeds, run_options)
                if self._graphs is not None:
                    program = self._program
                    plan = program.plan(fetches)
                    return self._graphs.run(fetches, feeds, lambda f: program.run(
                        plan, f, (), run_options))
                return self._program.run_fetches(fetches, feeds, run_options)

    def _runner(self, output_names: Sequence[str], input_names: Sequence[str],
                computed: Sequence[int] = ()) -> Callable[[Sequence[Any], Any], list[Any]] | None:
        """For onnxrun's own callers that build every feed themselves and only read the
        results (onnxrun.genai's decode steps, after a first checked run): ``run(values,
        run_options)`` with the values of ``input_names`` then of ``computed`` (slots of
        intermediate values the caller computes: the steps that make them are left out).
        No feed checks, no shape specialization (a decode step's shapes are new each step:
        it never pays), the results as the kernels made them (not copied away from the feeds
        nor made writable: the caller never writes them nor hands them out). None where a
        run needs more than that (a device provider, the profiler, sparse outputs)."""
        if self._device is not None or self._profiler is not None or self._sparse_outputs:
            return None
        program = self._program
        slots = [self._inputs_by_name[n].slot for n in input_names] + list(computed)
        fetches = self._fetch_slots(output_names)
        # no memory pattern: a decode step's shapes are new each step, so it never records
        # one, and asking costs a shape signature per run
        plan = program.plan(fetches, known=frozenset(computed))._replace(memory=None)
        run_plan = program.run
        # no BLAS hold where no kernel may call BLAS: a hold reads and sets its count twice
        # (~25 us of a small model's decode step)
        blas = self._blas_threads if any(may_call_blas(step.kernel) for step in plan.steps) \
            else contextlib.nullcontext()

        def run(values: Sequence[Any], run_options: Any) -> list[Any]:
            with np.errstate(all="ignore"), blas:
                results = run_plan(plan, list(zip(slots, values, strict=True)), (), run_options)
            return [r if r.__class__ is np.ndarray else _as_output(r) for r in results]

        return run

    def _run_profiled(self, fetches: Any, feeds: Any, run_options: Any) -> list[Any]:
        profiler = self._profiler
        token = profiler.activate()
        start = time.perf_counter_ns()
        try:
            return self._program.run_fetches(fetches, feeds, run_options)
        finally:
            profiler.session_event("model_run", start, time.perf_counter_ns())
            profiler.deactivate(token)

    def _run_bound(self, output_names: Sequence[str] | None, input_feed: Mapping[str, Any],
                   run_options: RunOptions | None) -> list[Any]:
        """IOBinding's run: the outputs a device produces stay on the device."""
        feeds = self._check_feeds(input_feed)
        results = self._run_feeds(self._fetch_slots(output_names), feeds, run_options)
        return self._caller_outputs(results, feeds, output_names)

    def run_async(self, output_names: Sequence[str] | None, input_feed: Mapping[str, Any],
                  callback: Any, user_data: Any, run_options: RunOptions | None = None) -> None:
        """Run on a worker thread, then call ``callback(results, user_data, err)``: the outputs
        as numpy arrays and ``err`` "" , or ``[]`` and the error message, as onnxruntime does.
        Input names are checked at once (an unknown name raises here); every other failure
        goes to the callback."""
        if isinstance(input_feed, Mapping):
            self._check_feed_names(input_feed)

        def task() -> None:
            try:
                results = self.run(output_names, input_feed, run_options)
            except Exception as e:  # noqa: BLE001 - delivered to the callback, as onnxruntime
                results, err = [], str(e)
            else:
                err = ""
            try:
                callback(results, user_data, err)
            except Exception:  # noqa: BLE001 - nobody to raise it to on this thread
                logger.exception("run_async: the callback raised")

        if threads.available():
            _async_workers().submit(task)
        else:  # no threads (Pyodide): run now, the callback contract unchanged
            task()

    def run_with_ort_values(
        self,
        output_names: Sequence[str] | None,
        input_dict_ort_values: Mapping[str, OrtValue],
        run_options: RunOptions | None = None,
    ) -> list[OrtValue]:
        if self._device is None:
            feed = {k: (v.numpy() if isinstance(v, OrtValue) else v)
                    for k, v in input_dict_ort_values.items()}
            return [OrtValue(r) for r in self.run(output_names, feed, run_options)]
        feeds = self._check_feeds(dict(input_dict_ort_values))
        results = self._run_feeds(self._fetch_slots(output_names), feeds, run_options)
        return [OrtValue(r if self._device is not None and self._device.backend.is_device_array(r)
                         else _as_output(r)) for r in results]

    def io_binding(self) -> IOBinding:
        return IOBinding(self)

    def run_with_iobinding(self, iobinding: IOBinding, run_options: RunOptions | None = None
                           ) -> None:
        iobinding._run(run_options)

    def _fetch_slots(self, output_names: Sequence[str] | None) -> tuple[int, ...]:
        if not output_names:
            return self._all_fetches
        if isinstance(output_names, str):
            raise InvalidArgument("output_names must be a list of names, not a single string")
        slots = []
        for name in output_names:
            s = self._output_slot.get(name)
            if s is None:
                raise InvalidArgument(
                    f"Invalid output name: '{name}'. Model outputs are: {self._output_names}"
                )
            slots.append(s)
        return tuple(slots)

    def _check_feed_names(self, input_feed: Mapping[str, Any]) -> None:
        for name in input_feed:
            if name not in self._inputs_by_name:
                expected = [s.name for s in self._input_specs if not s.has_default]
                raise InvalidArgument(
                    f"Invalid input name: '{name}'. The model's inputs are: {expected}"
                )

    def _device_for(self, spec: _InputSpec) -> tuple[Any, bool] | None:
        """(device, whether a CPU node reads the input) for sessions with a device provider."""
        if self._device is None:
            return None
        return self._device.backend, spec.name in self._placement.host_fed

    def _check_feeds(self, input_feed: Mapping[str, Any]) -> list[tuple[int, Any]]:
        feeds: list[tuple[int, Any]] = []
        for name, value in input_feed.items():
            spec = self._inputs_by_name.get(name)
            if spec is None:
                self._check_feed_names(input_feed)  # raises, listing the expected names
            fixed = spec.fixed
            if fixed is not None and type(value) is np.ndarray and self._device is None and \
                    value.dtype == spec.dtype and value.ndim == len(spec.shape):
                shape = value.shape  # the usual feed: one comparison per declared dimension
                for i, d in fixed:
                    if shape[i] != d:
                        break
                else:
                    feeds.append((spec.slot, value))
                    continue
            feeds.append((spec.slot, _check_value(spec, value, self._device_for(spec))))
        if len(feeds) < len(self._input_specs):
            missing = [s.name for s in self._input_specs
                       if not s.has_default and s.name not in input_feed]
            if missing:
                raise InvalidArgument(
                    f"Required inputs ({missing}) are missing from input feed "
                    f"({list(input_feed)})."
                )
        return feeds


def check_and_normalize_provider_args(
    providers: Sequence[str | tuple[str, dict[Any, Any]]] | None,
    provider_options: Sequence[dict[Any, Any]] | None,
    available_provider_names: Sequence[str],
) -> tuple[list[str], list[dict[str, str]]]:
    """onnxruntime's check of the ``providers`` / ``provider_options`` arguments: returns the
    provider names in order and one options dict each (keys and values as strings). A provider
    is a name or a ``(name, options)`` tuple; ``provider_options``, when given, pairs with names
    only. Malformed arguments raise ValueError; a name not in ``available_provider_names``
    warns, a repeated one warns and is dropped."""
    if providers is None:
        return [], []
    if not isinstance(providers, Sequence) or isinstance(providers, str):
        raise ValueError("'providers' should be a sequence of provider names or "
                         "(name, options) tuples.")
    pairs: list[tuple[str, Any]] = []
    if provider_options is not None:
        if not isinstance(provider_options, Sequence) or isinstance(provider_options, str):
            raise ValueError("'provider_options' should be a sequence.")
        if len(providers) != len(provider_options):
            raise ValueError("'providers' and 'provider_options' should be the same length if "
                             "both are given.")
        if not all(isinstance(p, str) for p in providers):
            raise ValueError("Only string values for 'providers' are supported if "
                             "'provider_options' is given.")
        if not all(isinstance(o, dict) for o in provider_options):
            raise ValueError("'provider_options' values must be dicts.")
        pairs = list(zip(providers, provider_options, strict=True))
    else:
        for p in providers:
            if isinstance(p, str):
                pairs.append((p, {}))
            elif (isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str)
                  and isinstance(p[1], dict)):
                pairs.append(p)
            else:
                raise ValueError("'providers' values must be either strings or (string, dict) "
                                 f"tuples, got {p!r}.")
    normalized: dict[str, dict[str, str]] = {}
    for name, options in pairs:
        if name not in available_provider_names:
            warnings.warn(f"Specified provider '{name}' is not in available provider names. "
                          f"Available providers: '{', '.join(available_provider_names)}'",
                          stacklevel=5)
        if name in normalized:
            warnings.warn(f"Duplicate provider '{name}' encountered, ignoring.", stacklevel=5)
            continue
        normalized[name] = {str(k): str(v) for k, v in options.items()}
    return list(normalized), list(normalized.values())


def _save_optimized(model: Model, path: str | os.PathLike, config: dict[str, str]) -> None:
    """``optimized_model_filepath``: the optimized model, its initializers of at least
    "session.optimized_model_external_initializers_min_size_in_bytes" (1024) bytes in the file
    "session.optimized_model_external_initializers_file_name" beside it when that is set."""
    proto = model_to_proto(model)
    name = config.get("session.optimized_model_external_initializers_file_name")
    if name:
        if os.path.isabs(name) or os.path.normpath(name).startswith(".."):
            raise InvalidArgument(
                f"session.optimized_model_external_initializers_file_name '{name}': a file name "
                "relative to the optimized model's folder is expected")
        min_size = int(config.get(
            "session.optimized_model_external_initializers_min_size_in_bytes", "1024"))
        data_path = os.path.join(os.path.dirname(os.fspath(path)), name)
        with open(data_path, "wb") as f:
            for t in proto.graph.initializer:
                if t.HasField("raw_data") and len(t.raw_data) >= min_size:
                    offset = f.tell()
                    f.write(t.raw_data)
                    onnx.external_data_helper.set_external_data(t, name, offset, len(t.raw_data))
                    t.ClearField("raw_data")
                    t.data_location = onnx.TensorProto.EXTERNAL
    onnx.save(proto, path)


def _with_adapter_parameters(input_feed: Mapping[str, Any], adapters: list[Any]
                             ) -> dict[str, Any]:
    """The feed and the active LoRA adapters' parameters. A name given twice binds as in
    onnxruntime 1.32 (measured): an active adapter's value replaces the feed's, and among
    adapters the first activated wins."""
    feed = dict(input_feed)
    bound_by_adapter: set[str] = set()
    for adapter in adapters:
        for name, value in adapter.parameters().items():
            if name not in bound_by_adapter:
                feed[name] = value
                bound_by_adapter.add(name)
    return feed


def _with_overridden_dims(proto: onnx.ModelProto, model: Model) -> onnx.ModelProto:
    """A weightless copy of the model whose inputs and outputs carry the free-dimension
    overrides, so shape inference (and then constant folding of Shape subgraphs) sees them."""
    from ..validate import skeleton

    skel = skeleton(proto)
    types = {v.name: v.type for v in [*model.graph.inputs, *model.graph.outputs]
             if v.type is not None}
    for vi in [*skel.graph.input, *skel.graph.output]:
        if vi.name in types:
            vi.type.CopyFrom(types[vi.name])
    return skel


def _check_value(spec: _InputSpec, value: Any, device: tuple[Any, bool] | None = None) -> Any:
    if isinstance(value, OrtValue):
        value = value._value  # a device tensor stays on its device
    if device is not None and spec.kind == "tensor_type":
        backend, host_read = device
        if not backend.is_device_array(value) and not isinstance(value, np.ndarray) and \
                hasattr(value, "__dlpack_device__") and value.__dlpack_device__()[0] != 1:
            value = backend.from_dlpack(value)  # a CUDA tensor of another library: no copy
        if backend.is_device_array(value):
            _check_device_value(spec, value, backend)
            if not host_read:
                return value
            value = backend.to_host(value)
    elif isinstance(value, np.ndarray) or value is None:
        pass
    elif _is_foreign_device_array(value):
        raise InvalidArgument(f"input '{spec.name}' is on a device, and this session has no "
                              "device provider: feed a host array or add CUDAExecutionProvider")
    if value is None and spec.kind != "optional_type":  # None is an absent optional's value
        raise InvalidArgument(f"input '{spec.name}' was fed None: it needs a value")
    if isinstance(value, SparseTensor):
        if not spec.sparse:
            raise InvalidArgument(
                f"input '{spec.name}' is a dense tensor, a SparseTensor was given")
        value = value.to_dense()
    if spec.kind == "map_type":
        _check_map_keys(spec, value)
    if spec.kind != "tensor_type":
        return value  # sequences, maps, optionals: checked by the kernels that read them
    if not isinstance(value, np.ndarray) and hasattr(value, "__dlpack__"):
        value = OrtValue.from_dlpack(value).numpy()  # a tensor of another library, not copied
    expected = spec.dtype
    if not isinstance(value, np.ndarray):
        try:
            value = np.asarray(value, dtype=expected)  # lists and scalars take the model's type
        except (TypeError, ValueError, OverflowError) as e:
            raise InvalidArgument(
                f"input '{spec.name}': cannot convert {type(value).__name__} to "
                f"{dtypes.tensor_type_string(dtypes.elem_type(expected))}: {e}"
            ) from None
    if expected is not None and expected.kind == "O" and value.dtype.kind in "OUS":
        value = _as_strings(spec, value)
    elif expected is not None and value.dtype != expected:
        if expected.kind == "O" and value.dtype.kind == "V":
            value = _void_as_strings(spec.name, value)
        else:
            raise InvalidArgument(
                f"Unexpected input data type for '{spec.name}'. Actual: "
                f"({dtypes.value_type_string(value)}) , expected: "
                f"({dtypes.tensor_type_string(dtypes.elem_type(expected))})"
            )
    shape = spec.shape
    if shape is not None:
        if value.ndim != len(shape):
            raise InvalidArgument(
                f"Invalid rank for input: {spec.name} Got: {value.ndim} Expected: {len(shape)} "
                f"(expected shape {shape}, got {list(value.shape)})"
            )
        bad = [
            f"index: {i} Got: {got} Expected: {want}"
            for i, (got, want) in enumerate(zip(value.shape, shape, strict=True))
            # a negative dim_value is free, as onnxruntime reads it (onnx.helper writes -1)
            if isinstance(want, int) and want >= 0 and got != want
        ]
        if bad:
            raise InvalidArgument(
                f"Got invalid dimensions for input: {spec.name} for the following indices: "
                f"{'; '.join(bad)} (expected shape {shape}, got {list(value.shape)})"
            )
    return value


# Python key types a map input takes, by its ONNX key type, and onnxruntime's C++ type name.
_MAP_KEYS = {onnx.TensorProto.INT64: ((int, np.integer), "int64_t"),
             onnx.TensorProto.STRING: ((str,), "std::string")}


def _is_foreign_device_array(value: Any) -> bool:
    try:
        return hasattr(value, "__dlpack_device__") and value.__dlpack_device__()[0] != 1
    except Exception:  # noqa: BLE001 - an object whose protocol fails is not a device array
        return False


def _check_device_value(spec: _InputSpec, value: Any, backend: Any) -> None:
    """A device feed: the dtype and shape checks of host feeds, on its metadata."""
    dtype = backend.dtype_of(value)
    if spec.dtype is not None and dtype != spec.dtype:
        raise InvalidArgument(
            f"Unexpected input data type for '{spec.name}'. Actual: "
            f"(tensor({dtypes.elem_name(dtypes.elem_type(dtype))})) , expected: "
            f"({dtypes.tensor_type_string(dtypes.elem_type(spec.dtype))})")
    shape = spec.shape
    if shape is not None and (len(value.shape) != len(shape) or any(
            isinstance(w, int) and w >= 0 and g != w
            for g, w in zip(value.shape, shape, strict=False))):
        raise InvalidArgument(f"Got invalid dimensions for input: {spec.name} (expected shape "
                              f"{shape}, got {list(value.shape)})")


def _provider_name(p: Any) -> str:
    return p[0] if isinstance(p, tuple) else str(p)


def _check_map_keys(spec: _InputSpec, value: Any) -> None:
    if not isinstance(value, Mapping):
        raise InvalidArgument(
            f"input '{spec.name}' is a map: a dict was expected, got {type(value).__name__}")
    accepted, c_type = _MAP_KEYS.get(spec.map_key, ((object,), ""))
    for key in value:
        if not isinstance(key, accepted) or isinstance(key, bool):
            # onnxruntime's words (a RuntimeError there; InvalidArgument is one)
            raise InvalidArgument(
                f"Unexpected key type  {type(key)}, it cannot be linked to C type {c_type} "
                f"(input '{spec.name}')")


def _void_as_strings(name: str, value: np.ndarray) -> np.ndarray:
    """np.void items fed to a string input: each item's bytes are one UTF-8 string, as
    onnxruntime reads them."""
    out = np.empty(value.shape, dtype=object)
    flat = out.reshape(-1)
    for i, item in enumerate(value.reshape(-1)):
        try:
            flat[i] = bytes(item).decode("utf-8")
        except UnicodeDecodeError as e:
            raise InvalidArgument(
                f"input '{name}': item {i} of the np.void array is not UTF-8 text: {e}") from None
    return out


def _as_strings(spec: _InputSpec, value: np.ndarray) -> np.ndarray:
    """A string input as onnxruntime takes it: an array of str, each element that is not one
    written as ``str()`` writes it (``['a', 3, None]`` -> ``['a', '3', 'None']``); bytes arrays
    decoded as UTF-8."""
    if value.dtype.kind == "U":
        return value.astype(object)
    if value.dtype.kind == "S":
        try:
            return np.char.decode(value, "utf-8").astype(object)
        except UnicodeDecodeError as e:
            raise InvalidArgument(f"input '{spec.name}': a string is not UTF-8 ({e})") from None
    flat = value.reshape(-1)
    if all(type(s) is str for s in flat):
        return value
    out = np.empty(value.shape, dtype=object)
    out.reshape(-1)[:] = [s if type(s) is str else str(s) for s in flat]
    return out


def _own_memory(out: np.ndarray, fed: list[np.ndarray]) -> bool:
    """Whether ``out`` is (a view of) an array that allocated its memory itself, as every
    fed array did, and is none of them: then no two share memory (np.may_share_memory's
    bounds checks, ~1 us a pair, are for the other cases)."""
    own = out if out.base is None else out.base
    return own.__class__ is np.ndarray and own.flags.owndata and \
        all(f.flags.owndata and f is not own for f in fed)


def _as_output(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        # Constants are read-only and may be shared by the plan: hand the caller its own copy.
        value = value if value.flags.writeable else value.copy()
        # As onnxruntime's outputs (views of the OrtValue that owns the memory), an output is a
        # view whose base owns the data (``out.base``; resizing it in place is refused).
        return value.view() if value.base is None else value
    if isinstance(value, np.generic):
        return np.asarray(value)
    if isinstance(value, list):
        return [_as_output(v) for v in value]
    return value



_gc_lock = threading.Lock()
_gc_pausers = 0
_gc_was_enabled = False


@contextlib.contextmanager
def _collector_paused():
    """Python's cyclic garbage collector off while sessions are being created (the IR makes
    many objects and no cycles worth finding: one full collection was 35 ms of DenseNet-121's
    creation), back to its previous state when the last creation in progress ends."""
    global _gc_pausers, _gc_was_enabled
    with _gc_lock:
        if _gc_pausers == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_pausers += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_pausers -= 1
            if _gc_pausers == 0 and _gc_was_enabled:
                gc.enable()


@functools.cache
def _async_workers() -> ThreadPoolExecutor:
    """The threads run_async runs on, shared by every session (created on first use)."""
    return ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2),
                              thread_name_prefix="onnxrun-async")


_blas_found: tuple[int, list[Any]] | None = None  # (len(sys.modules) then, the libraries)


def _blas_libraries() -> list[Any]:
    """The BLAS libraries of the process, through threadpoolctl (a dependency: without it
    ``intra_op_num_threads`` could not hold). Imported and scanned at the first run that needs
    it; the scan of every loaded shared library is redone only when modules were imported
    since: an import may load another BLAS (scipy's, torch's)."""
    global _blas_found
    if _blas_found is None or _blas_found[0] != len(sys.modules):
        try:
            from threadpoolctl import ThreadpoolController
        except ImportError:  # Pyodide (no threads there: nothing to limit)
            _blas_found = (len(sys.modules), [])
            return []
        libs = ThreadpoolController().select(user_api="blas").lib_controllers
        _blas_found = (len(sys.modules), [_direct(lib) for lib in libs])
    return _blas_found[1]


class _OpenBLASCount:
    """An OpenBLAS (pthreads) library's thread count through its own functions. threadpoolctl
    (3.8) lets only one Python thread set OpenBLAS's count, the first that did, while it lives:
    sets from other threads (runs on them) are dropped without a word, so a run on another
    thread could neither hold BLAS nor give the host's count back. Ours go under _BlasHeld's
    lock."""

    def __init__(self, get: Any, set_: Any) -> None:
        self._get, self._set = get, set_

    @property
    def num_threads(self) -> int:
        return int(self._get())

    def set_num_threads(self, n: int) -> None:
        self._set(n)


def _direct(lib: Any) -> Any:
    """``lib`` (a threadpoolctl controller), or for OpenBLAS on pthreads its own functions."""
    if getattr(lib, "internal_api", "") != "openblas" or \
            getattr(lib, "threading_layer", "") == "openmp":
        return lib
    import ctypes

    dll = getattr(lib, "dynlib", None)  # the library threadpoolctl opened
    if dll is None:
        return lib
    for prefix in ("openblas", "scipy_openblas"):
        for suffix in ("", "64_"):
            get = getattr(dll, f"{prefix}_get_num_threads{suffix}", None)
            set_ = getattr(dll, f"{prefix}_set_num_threads{suffix}", None)
            if get is not None and set_ is not None:
                get.restype, set_.restype = ctypes.c_int, None
                set_.argtypes = [ctypes.c_int]
                return _OpenBLASCount(get, set_)
    return lib


class _BlasHeld:
    """BLAS held to one thread while any run is in progress, whatever the sessions'
    ``intra_op_num_threads``: onnxrun's own threads carry a session's intra-op work (the
    compiled kernels' ranges, and ``blas.matmul``'s ranges of rows or columns, one BLAS thread
    in each), so no second pool takes their cores (OpenBLAS's idle threads spin ~0.1 s after
    each call), and runs that overlap on sessions with different thread counts want the same
    setting (a count per session let the first run's hold for all of them, and OpenBLAS's
    spinning cost up to ~10x the CPU time). BLAS's count is process-wide: the host's own
    count comes back when the last overlapping run ends. The state is the one instance's
    (_BLAS_HELD): class attributes written per run invalidate the class's attribute caches
    (a hold and release: 5.1 -> 3.9 us, best of 15 x 2000)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._depth = 0
        self._active: list[Any] = []  # the libraries set to one thread, and their counts before
        self._saved: list[int] = []

    def __enter__(self) -> None:
        with self._lock:
            if self._depth == 0:
                # Looked up at the run, not at session creation: threadpoolctl's scan of the
                # loaded libraries then costs a session nothing until it runs.
                active, saved = [], []
                for lib in _blas_libraries():
                    n = lib.num_threads
                    if n != 1:
                        lib.set_num_threads(1)
                        active.append(lib)
                        saved.append(n)
                self._active, self._saved = active, saved
                # OpenBLAS 0.3.31 ignores the sets of other threads once the main thread has
                # set its count: then its products stay whole (two cut ones would queue for
                # its threads), see blas.matmul
                _cpu_blas().one_thread = all(lib.num_threads == 1 for lib in active)
            self._depth += 1

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self._depth -= 1
            if self._depth == 0:
                for lib, n in zip(self._active, self._saved, strict=True):
                    lib.set_num_threads(n)
                self._active, self._saved = [], []
                _blas_module.one_thread = False


_BLAS_HELD = _BlasHeld()


def may_call_blas(kernel: Any) -> bool:
    """Whether a step's kernel may call a BLAS library (a run then holds BLAS to one thread,
    _BlasHeld; the engine's runner leaves the hold out of plans where none may): numpy's
    element-wise ufuncs never do (matmul has a signature); a kernel (or a partial's function)
    says it does not with ``calls_blas = False``, an attribute or a property of what it was
    prepared with."""
    if isinstance(kernel, np.ufunc):
        return kernel.signature is not None
    flag = getattr(kernel, "calls_blas", None)
    if flag is None:
        flag = getattr(getattr(kernel, "func", None), "calls_blas", None)
    return flag is not False


_blas_module: Any = None


def _cpu_blas() -> Any:
    """providers.cpu.blas, imported at the first run (the CPU kernels load lazily), then held:
    an import statement per run cost ~0.5 us twice."""
    global _blas_module
    if _blas_module is None:
        from ..providers.cpu import blas

        _blas_module = blas
    return _blas_module


__all__ = ["InferenceSession", "InvalidGraph", "ModelMetadata", "NodeArg"]
