"""Prometheus metrics on ``/metrics`` (a port of its own, as Triton's 8002), in Triton's names.

The values are read from the models' statistics at each scrape, so the core keeps no metric
objects. The text exposition format is written here rather than by prometheus-client, whose
exposition renames a counter family ``<name>_total`` in its HELP/TYPE lines: dashboards query
Triton's exact names (``nv_inference_count``, not ``nv_inference_count_total``). The server is
the standard library's threaded one in a daemon thread, as prometheus-client's own
``start_http_server`` is; a scrape only reads counters."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from .repository import Repository

# (name, help, value of a model's Statistics); durations in microseconds, cumulative
COUNTERS = [
    ("nv_inference_request_success", "Number of successful inference requests, all batch sizes",
     lambda s: s.success.count),
    ("nv_inference_request_failure", "Number of failed inference requests, all batch sizes",
     lambda s: s.fail.count),
    ("nv_inference_count", "Number of inferences performed (a batch of n is n inferences)",
     lambda s: s.inference_count),
    ("nv_inference_exec_count", "Number of model executions performed",
     lambda s: s.execution_count),
    ("nv_inference_request_duration_us", "Cumulative inference request duration in microseconds",
     lambda s: (s.success.ns + s.fail.ns) // 1000),
    ("nv_inference_queue_duration_us", "Cumulative inference queuing duration in microseconds",
     lambda s: s.queue.ns // 1000),
    ("nv_inference_compute_infer_duration_us",
     "Cumulative compute inference duration in microseconds", lambda s: s.compute_infer.ns // 1000),
]


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def exposition(repository: Repository) -> str:
    """The Prometheus text format of every loaded model's counters."""
    models = repository.models()
    stats = {id(m): m.scheduler.statistics() for m in models}
    lines = []
    for name, help_text, value in COUNTERS:
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} counter"]
        for m in models:
            v = value(stats[id(m)])
            lines.append(f'{name}{{model="{_label(m.name)}",version="{_label(m.version)}"}} {v}')
    name = "nv_inference_pending_request_count"
    lines += [f"# HELP {name} Instantaneous number of pending requests awaiting execution",
              f"# TYPE {name} gauge"]
    for m in models:
        lines.append(f'{name}{{model="{_label(m.name)}",version="{_label(m.version)}"}} '
                     f"{m.scheduler.pending()}")
    return "\n".join(lines) + "\n"


def start_metrics_server(repository: Repository, host: str, port: int) -> ThreadingHTTPServer:
    """Serve ``/metrics`` on ``host:port`` from a daemon thread; ``shutdown()`` stops it."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if self.path.split("?")[0] != "/metrics":
                self.send_error(404, "only /metrics is served here")
                return
            body = exposition(repository).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args) -> None:  # noqa: A002 - scrapes are not logged
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="onnxrun-serve-metrics",
                     daemon=True).start()
    return server
