"""Shared pytest configuration: prints the ONNX conformance pass count after the run."""

from __future__ import annotations


def pytest_terminal_summary(terminalreporter, exitstatus, config):  # noqa: ARG001
    counts = {"passed": 0, "failed": 0, "xfailed": 0, "xpassed": 0, "skipped": 0}
    for outcome in counts:
        for report in terminalreporter.stats.get(outcome, []):
            if "test_conformance.py" in getattr(report, "nodeid", ""):
                counts[outcome] += 1
    total = sum(counts.values())
    if total:
        ran = total - counts["skipped"]
        share = 100.0 * counts["passed"] / ran if ran else 0.0
        terminalreporter.write_sep(
            "=", f"ONNX conformance: {counts['passed']}/{ran} passed ({share:.2f}%), "
            f"{counts['xfailed']} expected failures, {counts['failed']} failed, "
            f"{counts['skipped']} skipped",
        )
