"""Count the nodes left by onnxrun's graph optimizer at each level, next to onnxruntime's, and
write the table into docs/OPTIMIZATION.md (between ``<!-- node-counts:begin -->`` and
``<!-- node-counts:end -->``).

    python benchmarks/optimizer_node_counts.py            # measure, rewrite the doc's table
    python benchmarks/optimizer_node_counts.py --dry-run  # print the table, leave the doc alone

Models: the nine light model-zoo CNNs shipped in the onnx package
(onnx/backend/test/data/light) and the small exported models of tests/models/ (BERT, GPT,
MobileNet, LSTM, GRU, If) when present.

onnxrun: nodes after optimization at levels 0 (disable), 1 (basic), 2 (extended) and 99 (all),
from the session's optimization report. onnxruntime: nodes of the model it saves with
``optimized_model_filepath`` at ORT_ENABLE_BASIC and ORT_ENABLE_EXTENDED (CPU provider). Nodes
inside subgraphs count in both. For each model, the operators whose counts differ between
onnxrun's extended level and onnxruntime's are listed below the table.
"""

from __future__ import annotations

import argparse
import collections
import re
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import onnx

import onnxrun

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "OPTIMIZATION.md"
BEGIN, END = "<!-- node-counts:begin -->", "<!-- node-counts:end -->"
LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
LEVELS = {"disable": 0, "basic": 1, "extended": 2, "all": 99}


def models() -> list[tuple[str, Path]]:
    found = [(p.stem[len("light_"):], p) for p in sorted(LIGHT.glob("light_*.onnx"))]
    found += [(p.stem, p) for p in sorted((ROOT / "tests" / "models").glob("*.onnx"))]
    return found


def _nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    for node in graph.node:
        yield node
        for a in node.attribute:
            for g in [a.g] if a.HasField("g") else a.graphs:
                yield from _nodes(g)


def histogram(path: str) -> collections.Counter:
    model = onnx.load(path, load_external_data=False)
    return collections.Counter(
        (f"{n.domain}:" if n.domain not in ("", "ai.onnx") else "") + n.op_type
        for n in _nodes(model.graph)
    )


def onnxrun_counts(path: Path, folder: str) -> tuple[dict[str, int], collections.Counter]:
    counts: dict[str, int] = {}
    extended = collections.Counter()
    for word, level in LEVELS.items():
        so = onnxrun.SessionOptions()
        so.graph_optimization_level = level
        saved = f"{folder}/onnxrun_{level}.onnx"
        so.optimized_model_filepath = saved if word == "extended" else ""
        report = onnxrun.InferenceSession(str(path), so).get_optimization_report()
        counts[word] = report.nodes_after
        if word == "extended":
            extended = histogram(saved)
    return counts, extended


def onnxruntime_counts(path: Path, folder: str) -> tuple[dict[str, int], collections.Counter]:
    import onnxruntime as ort

    ort.set_default_logger_severity(3)
    counts: dict[str, int] = {}
    extended = collections.Counter()
    for word, level in (("basic", ort.GraphOptimizationLevel.ORT_ENABLE_BASIC),
                        ("extended", ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED)):
        so = ort.SessionOptions()
        so.graph_optimization_level = level
        saved = f"{folder}/ort_{word}.onnx"
        so.optimized_model_filepath = saved
        ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        hist = histogram(saved)
        counts[word] = sum(hist.values())
        if word == "extended":
            extended = hist
    return counts, extended


def difference(ours: collections.Counter, theirs: collections.Counter) -> str:
    ops = sorted({*ours, *theirs}, key=lambda op: (-abs(ours[op] - theirs[op]), op))
    parts = [f"{op} {ours[op]} vs {theirs[op]}" for op in ops if ours[op] != theirs[op]]
    return "; ".join(parts) if parts else "same operators"


def measure() -> tuple[list[str], list[str]]:
    header = ("| model | onnxrun disable | onnxrun basic | onnxrun extended | onnxrun all "
              "| onnxruntime basic | onnxruntime extended |")
    rows = [header, "|" + "---|" * 7]
    notes = []
    for name, path in models():
        with tempfile.TemporaryDirectory() as folder:
            ours, ours_ext = onnxrun_counts(path, folder)
            theirs, theirs_ext = onnxruntime_counts(path, folder)
        rows.append(f"| {name} | {ours['disable']} | {ours['basic']} | {ours['extended']} | "
                    f"{ours['all']} | {theirs['basic']} | {theirs['extended']} |")
        notes.append(f"- **{name}** (onnxrun extended vs onnxruntime extended): "
                     f"{difference(ours_ext, theirs_ext)}")
        print(rows[-1], file=sys.stderr)
    return rows, notes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="print, leave the doc alone")
    args = parser.parse_args()
    import onnxruntime as ort

    rows, notes = measure()
    block = "\n".join([
        f"Measured with onnxrun {onnxrun.__version__} and onnxruntime {ort.__version__} by "
        "`python benchmarks/optimizer_node_counts.py`.",
        "",
        *rows,
        "",
        "Operators whose counts differ at the extended level (onnxrun vs onnxruntime):",
        "",
        *notes,
    ])
    if args.dry_run:
        print(block)
        return
    text = DOC.read_text()
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
    if not pattern.search(text):
        raise SystemExit(f"{DOC} has no {BEGIN} ... {END} block")
    DOC.write_text(pattern.sub(lambda _: f"{BEGIN}\n{block}\n{END}", text))
    print(f"updated {DOC.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
