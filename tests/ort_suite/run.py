"""The onnxruntime test-suite lane: onnxruntime's own Python tests, run on onnxrun.

Runs onnxruntime's tests from ``../shared/onnxruntime-tests`` (or ``$ORT_SUITE_DIR``) through
``onnxrun.compat`` with that folder's runner, ``run_ort_pytests.sh``, then compares each test's
outcome with what onnxruntime itself passes (``ort_passed.txt``, committed; regenerate it with
``--write-baseline``). The lane fails when a test onnxruntime passes does not pass on onnxrun
and ``exclusions.toml`` does not list it, each entry with its reason: ``out_of_scope`` (what
onnxrun does not set out to do), ``flaky`` (fails at random on onnxruntime itself: unseeded
random data against a fixed tolerance) or ``pending`` (in scope, not fixed yet: remove the
entry with the fix; the lane names entries that pass again). An unexpected failure's file runs
once more: a test that passes then is named as flaky and does not fail the lane (many of
onnxruntime's tests draw unseeded random data; a regression fails both times).

    python tests/ort_suite/run.py            # every file the runner runs by default (CI)
    python tests/ort_suite/run.py --files "onnxruntime_test_scatternd.py quantization/test_qdq.py"
    python tests/ort_suite/run.py --results DIR   # compare results already in DIR/onnxrun
    python tests/ort_suite/run.py --update-pending   # [pending] := what fails now

Without the suite folder it prints why it skipped and exits 0.
"""

from __future__ import annotations

import argparse
import fnmatch
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
EXCLUSIONS = HERE / "exclusions.toml"
BASELINE = HERE / "ort_passed.txt"
BACKEND_SERIES = "onnx_backend_test_series"

# The runner's default files: its default list, every quantization/test_*.py, and the ONNX
# backend series (see the runner's header).
DEFAULT_FILES = """onnxruntime_test_python.py onnxruntime_test_python_iobinding.py
onnxruntime_test_python_sparse_matmul.py onnxruntime_test_python_backend.py
onnxruntime_test_python_backend_mlops.py onnxruntime_test_python_mlops.py
onnxruntime_test_python_nested_control_flow_op.py onnxruntime_test_python_ort_parallel.py
onnxruntime_test_python_symlink_data.py onnxruntime_test_python_global_threadpool.py
onnxruntime_test_scatternd.py onnxruntime_test_float8.py
onnxruntime_test_python_symbolic_shape_infer.py onnxruntime_test_python_compile_api.py
onnxruntime_test_python_autoep.py onnxruntime_test_python_ep_compatibility.py
transformers/test_float16.py""".split()

def suite_dir() -> Path:
    """$ORT_SUITE_DIR, else ../shared/onnxruntime-tests beside the checkout (for a git
    worktree, beside its main checkout too)."""
    if os.environ.get("ORT_SUITE_DIR"):
        return Path(os.environ["ORT_SUITE_DIR"])
    candidates = [REPO.parent / "shared" / "onnxruntime-tests"]
    try:
        common = subprocess.run(["git", "rev-parse", "--path-format=absolute",
                                 "--git-common-dir"], cwd=REPO, capture_output=True,
                                text=True, timeout=30).stdout.strip()
        if common:
            candidates.append(Path(common).parent.parent / "shared" / "onnxruntime-tests")
    except (OSError, subprocess.SubprocessError):
        pass
    return next((c for c in candidates if c.is_dir()), candidates[0])


def all_default_files(suite: Path) -> list[str]:
    quant = sorted(p.name for p in (suite / "onnxruntime/test/python/quantization").glob(
        "test_*.py"))
    return DEFAULT_FILES + [f"quantization/{q}" for q in quant] + [BACKEND_SERIES]


def slug(file: str) -> str:
    """The runner's name for a file's results: quantization/test_x.py -> quantization__test_x."""
    s = file.replace("/", "__")
    return s[:-3] if s.endswith(".py") else s


def test_id(file: str, nodeid: str) -> str:
    """``file::Class::test`` whatever folder pytest ran the file from."""
    _, sep, rest = nodeid.partition("::")
    return f"{file}::{rest}" if sep else f"{file}::<collection>"


# -- data ------------------------------------------------------------------------------------

@dataclass
class Exclusions:
    out_of_scope: dict[str, str] = field(default_factory=dict)  # pattern -> reason
    pending: dict[str, str] = field(default_factory=dict)
    flaky: dict[str, str] = field(default_factory=dict)  # fail at random on onnxruntime too

    @classmethod
    def load(cls, path: Path = EXCLUSIONS) -> Exclusions:
        data = tomllib.loads(path.read_text())
        unknown = set(data) - {"out_of_scope", "pending", "flaky"}
        if unknown:
            raise ValueError(f"{path}: unknown sections {sorted(unknown)}")
        ex = cls(dict(data.get("out_of_scope", {})), dict(data.get("pending", {})),
                 dict(data.get("flaky", {})))
        for section in (ex.out_of_scope, ex.pending, ex.flaky):
            for pattern, reason in section.items():
                if not isinstance(reason, str) or not reason.strip():
                    raise ValueError(f"{path}: '{pattern}' has no reason")
                if "::" not in pattern:
                    raise ValueError(f"{path}: '{pattern}' is not FILE::TEST (a pattern)")
        return ex

    @staticmethod
    def _match(section: dict[str, str], tid: str) -> str | None:
        for pattern in section:
            if fnmatch.fnmatchcase(tid, pattern):
                return pattern
        return None

    def scope_pattern(self, tid: str) -> str | None:
        return self._match(self.out_of_scope, tid)

    def pending_pattern(self, tid: str) -> str | None:
        return self._match(self.pending, tid)

    def flaky_pattern(self, tid: str) -> str | None:
        return self._match(self.flaky, tid)


def load_baseline(path: Path = BASELINE) -> tuple[list[str], set[str]]:
    """(the comment lines: onnxruntime's summary line and provenance, the passed test ids)."""
    notes, passed = [], set()
    for line in path.read_text().splitlines():
        if line.startswith("#"):
            notes.append(line[1:].strip())
        elif line.strip():
            passed.add(line.strip())
    return notes, passed


def read_results(results_dir: Path, files: list[str]) -> dict[str, tuple[str, str]]:
    """test id -> (outcome, message) for ``files`` from the runner's per-file JSON."""
    out: dict[str, tuple[str, str]] = {}
    for f in files:
        path = results_dir / f"{slug(f)}.json"
        if not path.exists():
            out[f"{f}::<collection>"] = ("error", f"no results ({path} missing)")
            continue
        data = json.loads(path.read_text())
        if not data.get("results"):
            out[f"{f}::<collection>"] = ("error", data.get("note", "no tests ran"))
        for nodeid, (outcome, msg) in data["results"].items():
            if msg.startswith("COLLECTION:"):
                out[f"{f}::<collection>"] = ("error", msg)
            else:
                out[test_id(f, nodeid)] = (outcome, msg)
    return out


@dataclass
class Comparison:
    expected: int = 0          # onnxruntime passes it, in the files run, not out of scope
    passed: int = 0            # ... and onnxrun passes it too
    out_of_scope: int = 0
    pending: list[str] = field(default_factory=list)          # expected, failing, listed
    flaky_failed: list[str] = field(default_factory=list)     # failed, listed as flaky
    regressions: list[tuple[str, str, str]] = field(default_factory=list)  # id, outcome, msg
    pending_now_passing: list[str] = field(default_factory=list)
    passed_on_rerun: list[tuple[str, str, str]] = field(default_factory=list)  # as regressions

    @property
    def rate(self) -> float:
        return self.passed / self.expected if self.expected else 1.0


def compare(results: dict[str, tuple[str, str]], baseline: set[str], exclusions: Exclusions,
            files: list[str]) -> Comparison:
    c = Comparison()
    ran = set(files)
    broken_files = {tid.split("::")[0] for tid, (o, _) in results.items()
                    if tid.endswith("::<collection>") and o == "error"}
    for tid in sorted(baseline):
        file = tid.split("::")[0]
        if file not in ran:
            continue
        if exclusions.scope_pattern(tid):
            c.out_of_scope += 1
            continue
        c.expected += 1
        outcome, msg = results.get(tid, ("missing", ""))
        if outcome == "missing" and file in broken_files:
            outcome, msg = "error", results[f"{file}::<collection>"][1]
        if outcome == "passed":
            c.passed += 1
            if exclusions.pending_pattern(tid):
                c.pending_now_passing.append(tid)
        elif exclusions.pending_pattern(tid):
            c.pending.append(tid)
        elif exclusions.flaky_pattern(tid):
            c.flaky_failed.append(tid)
        else:
            c.regressions.append((tid, outcome, msg))
    return c


def settle_by_rerun(c: Comparison, rerun: dict[str, tuple[str, str]]) -> None:
    """Move the regressions that passed when their file ran again to ``passed_on_rerun``."""
    for entry in list(c.regressions):
        if rerun.get(entry[0], ("missing", ""))[0] == "passed":
            c.regressions.remove(entry)
            c.passed_on_rerun.append(entry)


# -- running ---------------------------------------------------------------------------------

def run_suite(suite: Path, files: list[str], work: Path) -> int:
    env = dict(os.environ, ORTPY_DIR=str(work), ORTPY_VENV=str(Path(sys.prefix)),
               ONNXRUN_MAIN=str(REPO), ORT_TEST_FILES=" ".join(files),
               ORTPY_FILE_TIMEOUT=os.environ.get("ORTPY_FILE_TIMEOUT", "1200"))
    env.pop("PYTHONPATH", None)
    return subprocess.call(["bash", str(suite / "run_ort_pytests.sh"), "onnxrun"], env=env,
                           cwd=REPO)


def write_baseline(ort_results: Path, files: list[str], summary: str) -> int:
    results = read_results(ort_results, files)
    passed = sorted(t for t, (o, _) in results.items() if o == "passed")
    BASELINE.write_text(
        "# The tests onnxruntime passes under run_ort_pytests.sh (engine ort), one id a line.\n"
        f"# {summary}\n" + "".join(f"{t}\n" for t in passed))
    print(f"wrote {len(passed)} ids to {BASELINE}")
    return 0


def write_pending(c: Comparison, exclusions: Exclusions, files: list[str],
                  path: Path = EXCLUSIONS) -> None:
    """Rewrite the [pending] section: the unexpected failures join it (their message as the
    reason), entries that pass now leave it, entries for files not run stay."""
    ran = set(files)
    keep = {p: r for p, r in exclusions.pending.items()
            if p.split("::")[0] not in ran
            or any(fnmatch.fnmatchcase(t, p) for t in c.pending)}
    for tid, outcome, msg in c.regressions:
        # glob.escape: a parametrized id's [..] would be a character set to fnmatch
        keep[glob.escape(tid)] = f"not passing yet ({outcome}: {msg.strip()[:120]})"
    text = path.read_text()
    head = text[:text.index("[pending]")] + "[pending]\n"
    body = "".join(f"{json.dumps(p)} = {json.dumps(r)}\n" for p, r in sorted(keep.items()))
    path.write_text(head + body)
    print(f"wrote {len(keep)} [pending] entries to {path}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", help="space-separated files (runner's ORT_TEST_FILES)")
    ap.add_argument("--results", type=Path,
                    help="compare the results already in DIR/onnxrun instead of running")
    ap.add_argument("--work", type=Path,
                    help="the runner's work folder, kept (default: a temp dir, removed)")
    ap.add_argument("--write-baseline", type=Path, metavar="ORT_RESULTS",
                    help="write ort_passed.txt from the ort engine's results folder")
    ap.add_argument("--summary", default="", help="with --write-baseline: ort's summary line")
    ap.add_argument("--update-pending", action="store_true",
                    help="rewrite exclusions.toml's [pending] from this run's failures")
    args = ap.parse_args(argv)

    suite = suite_dir()
    if not (suite / "run_ort_pytests.sh").exists():
        print(f"ort suite lane SKIPPED: no onnxruntime test suite at {suite} "
              "(set ORT_SUITE_DIR to a folder holding run_ort_pytests.sh)")
        return 0
    files = args.files.split() if args.files else all_default_files(suite)
    if args.write_baseline:
        return write_baseline(args.write_baseline, all_default_files(suite), args.summary)

    notes, baseline = load_baseline()
    exclusions = Exclusions.load()
    if args.results:
        c = compare(read_results(args.results / "onnxrun", files), baseline, exclusions, files)
    else:
        work = args.work or Path(tempfile.mkdtemp(prefix="onnxrun-ort-suite-"))
        try:
            rc = run_suite(suite, files, work)
            if rc not in (0, 1):
                print(f"ort suite lane: the runner failed (exit {rc})")
                return 2
            c = compare(read_results(work / "results" / "onnxrun", files), baseline, exclusions,
                        files)
            failed_files = sorted({tid.split("::")[0] for tid, _, _ in c.regressions})
            if failed_files and not args.update_pending:
                print(f"ort suite lane: running {len(failed_files)} file(s) with unexpected "
                      "failures once more")
                if run_suite(suite, failed_files, work / "rerun") in (0, 1):
                    settle_by_rerun(c, read_results(work / "rerun" / "results" / "onnxrun",
                                                    failed_files))
        finally:
            if args.work is None:
                shutil.rmtree(work, ignore_errors=True)

    print()
    for note in notes[1:]:
        print(f"ort (committed baseline, all default files): {note}")
    print(f"ort suite lane: {len(files)} files; onnxruntime passes {c.expected + c.out_of_scope}"
          f" of them, {c.out_of_scope} out of scope; onnxrun passes {c.passed} of the other "
          f"{c.expected} ({100 * c.rate:.1f}%), {len(c.pending)} pending (listed), "
          f"{len(c.passed_on_rerun)} passed only when run again, {len(c.regressions)} unexpected "
          "failures")
    for tid in c.pending_now_passing:
        print(f"  passes now, remove from [pending]: {tid}")
    for tid in c.flaky_failed:
        print(f"  failed this time, listed as flaky (fails at random on onnxruntime too): {tid}")
    for tid, outcome, msg in c.passed_on_rerun:
        print(f"  FLAKY, not listed: {outcome} once, passed when its file ran again: {tid}: "
              f"{msg[:160]} (list it under [flaky] if onnxruntime fails it at random too)")
    for tid, outcome, msg in c.regressions[:200]:
        print(f"  UNEXPECTED {outcome}: {tid}: {msg[:160]}")
    if len(c.regressions) > 200:
        print(f"  ... and {len(c.regressions) - 200} more")
    if args.update_pending:
        write_pending(c, exclusions, files)
        return 0
    return 1 if c.regressions else 0


if __name__ == "__main__":
    raise SystemExit(main())
