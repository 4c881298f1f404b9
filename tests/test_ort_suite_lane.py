"""The onnxruntime test-suite lane (tests/ort_suite/run.py): its data and its verdicts."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

RUN = Path(__file__).parent / "ort_suite" / "run.py"
spec = importlib.util.spec_from_file_location("ort_suite_run", RUN)
lane = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = lane  # dataclasses look their module up there
spec.loader.exec_module(lane)


def test_exclusions_and_baseline_are_well_formed():
    ex = lane.Exclusions.load()
    assert ex.out_of_scope, "the issue's out-of-scope tests are listed"
    notes, passed = lane.load_baseline()
    assert any(n.startswith("ort: ") for n in notes), "onnxruntime's summary line is recorded"
    assert len(passed) > 1000
    files = {t.split("::")[0] for t in passed}
    # every pattern names a file of the suite, and matches at least one test onnxruntime passes
    for pattern in [*ex.out_of_scope, *ex.pending, *ex.flaky]:
        assert pattern.split("::")[0] in files or "*" in pattern.split("::")[0], pattern
        assert any(lane.fnmatch.fnmatchcase(t, pattern) for t in passed), pattern


def test_bad_exclusions_are_refused(tmp_path: Path):
    bad = tmp_path / "x.toml"
    bad.write_text('[out_of_scope]\n"a.py::t" = ""\n')
    with pytest.raises(ValueError, match="no reason"):
        lane.Exclusions.load(bad)
    bad.write_text('[out_of_scope]\n"a.py" = "why"\n')
    with pytest.raises(ValueError, match="FILE::TEST"):
        lane.Exclusions.load(bad)
    bad.write_text('[skip]\n"a.py::t" = "why"\n')
    with pytest.raises(ValueError, match="unknown sections"):
        lane.Exclusions.load(bad)


def _results(tmp_path: Path, file: str, results: dict) -> Path:
    (tmp_path / f"{lane.slug(file)}.json").write_text(json.dumps({"results": results}))
    return tmp_path


def test_verdicts(tmp_path: Path):
    f = "quantization/test_x.py"
    baseline = {f"{f}::T::{n}" for n in ("ok", "broken", "scope", "pending", "fixed")}
    baseline.add("other.py::T::not_run")
    ex = lane.Exclusions({f"{f}::T::scope": "why"}, {f"{f}::T::pend*": "todo",
                                                     f"{f}::T::fixed": "todo"})
    d = _results(tmp_path, f, {
        # nodeids as pytest wrote them, from whatever folder it ran in
        f"/elsewhere/{f}::T::ok": ["passed", ""],
        f"{f}::T::broken": ["failed", "AssertionError: 1 != 2"],
        f"{f}::T::scope": ["failed", "x"],
        f"{f}::T::pending": ["error", "y"],
        f"{f}::T::fixed": ["passed", ""],
        f"{f}::T::new": ["failed", "not in the baseline: onnxruntime does not pass it"],
    })
    c = lane.compare(lane.read_results(d, [f]), baseline, ex, [f])
    assert (c.expected, c.passed, c.out_of_scope) == (4, 2, 1)
    assert c.pending == [f"{f}::T::pending"] and c.pending_now_passing == [f"{f}::T::fixed"]
    assert c.regressions == [(f"{f}::T::broken", "failed", "AssertionError: 1 != 2")]


def test_a_flaky_test_that_fails_is_named_not_counted_against_onnxrun(tmp_path: Path):
    f = "quantization/test_x.py"
    baseline = {f"{f}::T::flaky_fails", f"{f}::T::flaky_passes", f"{f}::T::plain"}
    ex = lane.Exclusions(flaky={f"{f}::T::flaky_*": "unseeded random data"})
    d = _results(tmp_path, f, {f"{f}::T::flaky_fails": ["failed", "tolerance"],
                               f"{f}::T::flaky_passes": ["passed", ""],
                               f"{f}::T::plain": ["failed", "tolerance"]})
    c = lane.compare(lane.read_results(d, [f]), baseline, ex, [f])
    assert c.flaky_failed == [f"{f}::T::flaky_fails"] and c.passed == 1
    assert [t for t, _, _ in c.regressions] == [f"{f}::T::plain"]  # only listed ones are let go
    assert lane.Exclusions.load().flaky  # the committed list has its section


def test_a_file_that_does_not_import_fails_each_of_its_tests(tmp_path: Path):
    f = "a.py"
    d = _results(tmp_path, f, {f: ["error", "COLLECTION: ModuleNotFoundError: x"]})
    c = lane.compare(lane.read_results(d, [f, "b.py"]), {f"{f}::T::t", "b.py::T::t"},
                     lane.Exclusions(), [f, "b.py"])
    assert [(t, o) for t, o, _ in c.regressions] == [("a.py::T::t", "error"),
                                                     ("b.py::T::t", "error")]
    assert "ModuleNotFoundError" in c.regressions[0][2] and "missing" in c.regressions[1][2]


def test_lane_skips_without_the_suite(monkeypatch, tmp_path: Path, capsys):
    monkeypatch.setenv("ORT_SUITE_DIR", str(tmp_path / "absent"))
    assert lane.main([]) == 0
    assert "SKIPPED: no onnxruntime test suite at" in capsys.readouterr().out


def test_update_pending_rewrites_only_the_pending_section(tmp_path: Path):
    toml = tmp_path / "exclusions.toml"
    toml.write_text('# head\n[out_of_scope]\n"a.py::T::s" = "why"\n\n[pending]\n'
                    '"a.py::T::fixed" = "todo"\n"a.py::T::still" = "kept reason"\n'
                    '"z.py::T::other" = "file not run"\n')
    ex = lane.Exclusions.load(toml)
    c = lane.Comparison(pending=["a.py::T::still"], pending_now_passing=["a.py::T::fixed"],
                        regressions=[("a.py::T::new", "failed", 'AssertionError: "x"\n'),
                                     ("a.py::T::p[True]", "error", "E")])
    lane.write_pending(c, ex, ["a.py"], toml)
    again = lane.Exclusions.load(toml)
    assert again.out_of_scope == {"a.py::T::s": "why"}
    assert again.pending == {"a.py::T::still": "kept reason", "z.py::T::other": "file not run",
                             "a.py::T::new": 'not passing yet (failed: AssertionError: "x")',
                             "a.py::T::p[[]True]": "not passing yet (error: E)"}
    assert again.pending_pattern("a.py::T::p[True]") == "a.py::T::p[[]True]"
    assert toml.read_text().startswith("# head\n")


def _lane_with_fake_runner(monkeypatch, tmp_path: Path, outcomes_per_run: list[dict]) -> list:
    """lane.main on a suite folder whose runner reports ``outcomes_per_run[i]`` on its i-th call."""
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "run_ort_pytests.sh").write_text("")
    monkeypatch.setenv("ORT_SUITE_DIR", str(suite))
    f = "quantization/test_x.py"
    monkeypatch.setattr(lane, "load_baseline", lambda: (["ort: recorded"],
                                                        {f"{f}::T::a", f"{f}::T::b"}))
    monkeypatch.setattr(lane.Exclusions, "load", classmethod(lambda cls: cls()))
    calls = []

    def fake_run_suite(suite_, files, work):
        calls.append(files)
        out = Path(work) / "results" / "onnxrun"
        out.mkdir(parents=True)
        _results(out, f, outcomes_per_run[len(calls) - 1])
        return 1

    monkeypatch.setattr(lane, "run_suite", fake_run_suite)
    return calls


def test_a_failure_that_passes_when_its_file_runs_again_is_named_flaky(monkeypatch, tmp_path,
                                                                       capsys):
    f = "quantization/test_x.py"
    calls = _lane_with_fake_runner(monkeypatch, tmp_path, [
        {f"{f}::T::a": ["failed", "tolerance"], f"{f}::T::b": ["passed", ""]},
        {f"{f}::T::a": ["passed", ""], f"{f}::T::b": ["passed", ""]}])
    assert lane.main(["--files", f]) == 0
    assert calls == [[f], [f]]  # the failing file ran once more, alone
    assert f"FLAKY, not listed: failed once, passed when its file ran again: {f}::T::a" in \
        capsys.readouterr().out


def test_a_failure_that_fails_again_fails_the_lane(monkeypatch, tmp_path, capsys):
    f = "quantization/test_x.py"
    run = {f"{f}::T::a": ["failed", "AssertionError"], f"{f}::T::b": ["passed", ""]}
    calls = _lane_with_fake_runner(monkeypatch, tmp_path, [run, run])
    assert lane.main(["--files", f]) == 1
    assert len(calls) == 2
    assert f"UNEXPECTED failed: {f}::T::a" in capsys.readouterr().out


def test_no_rerun_when_nothing_failed(monkeypatch, tmp_path):
    f = "quantization/test_x.py"
    calls = _lane_with_fake_runner(monkeypatch, tmp_path, [
        {f"{f}::T::a": ["passed", ""], f"{f}::T::b": ["passed", ""]}])
    assert lane.main(["--files", f]) == 0 and len(calls) == 1
