"""The ``onnxrun serve`` process: the REST endpoint (uvicorn), the gRPC endpoint and the metrics
server over one repository, on one event loop, and their graceful stop.

At SIGTERM / SIGINT the models refuse new requests (503 / UNAVAILABLE) and run what is queued
at once (no batching delay), both endpoints stop accepting and let the requests in flight
finish, then the models' instances stop. A second signal stops at once."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from collections.abc import Callable

from .metrics import start_metrics_server
from .repository import Repository

log = logging.getLogger("onnxrun.serve")

GRACE_S = 30.0  # how long requests in flight may take to finish after a stop signal


def serve(repository: Repository, host: str = "127.0.0.1", http_port: int = 8000,
          grpc_port: int = 8001, metrics_port: int = 8002, log_level: str = "info") -> None:
    """Serve ``repository`` until SIGTERM / SIGINT: HTTP on ``http_port``, gRPC on
    ``grpc_port`` and Prometheus metrics on ``metrics_port`` (0 turns each off). Signal
    handlers are installed only while it runs, and only from the main thread."""
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        runner.run(_serve(repository, host, http_port, grpc_port, metrics_port, log_level))


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop where it is installed (uvicorn[standard] brings it; about 100 us
    less CPU per request than asyncio's own), for this server's loop only: the process's
    event loop policy is left as it is."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


async def _serve(repository: Repository, host: str, http_port: int, grpc_port: int,
                 metrics_port: int, log_level: str) -> None:
    loop = asyncio.get_running_loop()
    http = None
    if http_port:
        import uvicorn

        from .http import create_app

        class HttpServer(uvicorn.Server):
            @contextlib.contextmanager
            def capture_signals(self):
                yield  # the signals stop both endpoints together: _serve's handlers

        # access_log off: onnxrun.serve.access logs both protocols' requests alike
        http = HttpServer(uvicorn.Config(create_app(repository), host=host, port=http_port,
                                         log_level=log_level, access_log=False,
                                         timeout_graceful_shutdown=int(GRACE_S)))
    grpc_server = None
    if grpc_port:
        from .grpc import start_server
        grpc_server = await start_server(repository, host, grpc_port)
    metrics = start_metrics_server(repository, host, metrics_port) if metrics_port else None
    stopped = asyncio.Event()
    grpc_stop: list[asyncio.Task] = []
    force = []

    def stop() -> None:
        if stopped.is_set():  # a second signal: stop now, not waiting for what runs
            force.append(True)
            if http is not None:
                http.force_exit = True
            if grpc_server is not None:
                loop.create_task(grpc_server.stop(None))
            return
        log.info("onnxrun serve: stopping (requests in flight finish, new ones are refused)")
        stopped.set()
        repository.shutdown()
        if http is not None:
            http.should_exit = True
        if grpc_server is not None:
            grpc_stop.append(loop.create_task(grpc_server.stop(GRACE_S)))

    signals = (signal.SIGINT, signal.SIGTERM)
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for sig in signals:
            previous[sig] = signal.getsignal(sig)
            loop.add_signal_handler(sig, stop)
    try:
        if grpc_server is not None:
            log.info("onnxrun serve: gRPC on %s:%d", host, grpc_port)
        if http is not None:
            await http.serve()
        else:
            await stopped.wait()
    finally:
        for sig, handler in previous.items():
            loop.remove_signal_handler(sig)
            signal.signal(sig, handler)
        if grpc_server is not None:
            await (grpc_stop[0] if grpc_stop and not force else grpc_server.stop(
                None if force else GRACE_S))
        if metrics is not None:
            metrics.shutdown()
        if not force:  # else the instances' (daemon) threads end with the process
            await asyncio.to_thread(repository.close)
