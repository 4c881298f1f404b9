"""``onnxrun serve MODEL_REPOSITORY [--http-port 8000] [--grpc-port 8001] [--metrics-port 8002]
[--host HOST]``:
serve the models of a Triton-style model repository (or one ``.onnx`` file) on the KServe v2
inference protocol, with Prometheus metrics; see ``onnxrun.serve``.
Needs ``pip install "onnxrun[serve]"``."""

from __future__ import annotations

import argparse
import logging
from typing import Any

from .common import CliError


def cmd_serve(args: argparse.Namespace) -> int:
    try:
        if args.http_port:
            import starlette  # noqa: F401
            import uvicorn  # noqa: F401
        if args.grpc_port:
            import grpc  # noqa: F401
            import grpc_tools  # noqa: F401
    except ImportError as e:
        raise CliError(f"onnxrun serve needs its extra: pip install \"onnxrun[serve]\" ({e})") \
            from None
    from ..serve.access import JsonFormatter
    from ..serve.repository import Repository
    from ..serve.server import serve

    handler = logging.StreamHandler()
    if args.log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(levelname)s: %(message)s"))
    logging.basicConfig(level=args.log_level.upper(), handlers=[handler])
    if not args.access_log:
        logging.getLogger("onnxrun.serve.access").setLevel(logging.WARNING)
    repository = Repository(args.model_repository)
    if not repository.entries:
        raise CliError(f"no model found in '{args.model_repository}' (expected "
                       "<name>/<version>/model.onnx folders or an .onnx file)")
    serve(repository, host=args.host, http_port=args.http_port, grpc_port=args.grpc_port,
          metrics_port=args.metrics_port, log_level=args.log_level)
    return 0


def add_parser(sub: Any, parents: list[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    p = sub.add_parser("serve", parents=parents,
                       help="serve models on the KServe v2 / Triton inference protocol")
    p.add_argument("model_repository",
                   help="a folder of <name>/<version>/model.onnx (+ config.pbtxt), or one .onnx")
    p.add_argument("--http-port", type=int, default=8000,
                   help="HTTP/REST port (default 8000; 0 turns HTTP off)")
    p.add_argument("--grpc-port", type=int, default=8001,
                   help="gRPC port (default 8001; 0 turns gRPC off)")
    p.add_argument("--metrics-port", type=int, default=8002,
                   help="Prometheus /metrics port (default 8002; 0 turns metrics off)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1; 0.0.0.0 for all)")
    p.add_argument("--log-level", default="info",
                   choices=["critical", "error", "warning", "info", "debug"])
    p.add_argument("--log-format", default="text", choices=["text", "json"],
                   help="log lines as text or as JSON objects (access logs with their fields)")
    p.add_argument("--no-access-log", dest="access_log", action="store_false",
                   help="no access log record per request (logger onnxrun.serve.access)")
    p.set_defaults(func=cmd_serve)
    return p
