"""Structured access logs: one record per request on the ``onnxrun.serve.access`` logger, for
both protocols, at INFO. The fields are the record's attributes (``protocol``, ``method``,
``path``, ``status``, ``model``, ``duration_ms``, ``client``), so a formatter can write them as
JSON (``JsonFormatter``, ``onnxrun serve --log-format json``) and the message reads as a line."""

from __future__ import annotations

import json
import logging
import time

log = logging.getLogger("onnxrun.serve.access")

FIELDS = ("protocol", "method", "path", "status", "model", "duration_ms", "client")


def enabled() -> bool:
    return log.isEnabledFor(logging.INFO)


def record(protocol: str, method: str, path: str, status: str | int, start_ns: int,
           model: str = "", client: str = "") -> None:
    """Log one finished request (``start_ns`` from ``time.perf_counter_ns``)."""
    duration_ms = round((time.perf_counter_ns() - start_ns) / 1e6, 3)
    fields = {"protocol": protocol, "method": method, "path": path, "status": status,
              "model": model, "duration_ms": duration_ms, "client": client}
    log.info("%s %s %s %s %.3f ms %s", protocol, method, path, status, duration_ms, client,
             extra=fields)


class JsonFormatter(logging.Formatter):
    """A record as one JSON object: time, level, logger, message, and the access fields."""

    def format(self, record: logging.LogRecord) -> str:
        out = {"time": self.formatTime(record), "level": record.levelname,
               "logger": record.name, "message": record.getMessage()}
        out.update({k: getattr(record, k) for k in FIELDS if hasattr(record, k)})
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out)
