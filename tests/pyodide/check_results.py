"""Check a conformance run inside Pyodide against the list of cases expected not to pass there.

    python tests/pyodide/check_results.py RESULTS.json tests/pyodide/node_expected_failures.txt

Every case not listed must pass; every listed case must fail, saying what the list says (the
ml_dtypes cases name ml_dtypes), so the list stays true. ``--write`` regenerates the list from
the results (narrow-type failures only; anything else is a bug to fix, not to list).
"""

from __future__ import annotations

import argparse
import json
import re
import sys

HEADER = """\
# ONNX node conformance cases that pass on CPython but not inside Pyodide 0.27.7, with the reason.
# Most use a narrow type (bfloat16, float8, int4...) that numpy holds only through ml_dtypes,
# which Pyodide 0.27 does not ship: onnxrun raises an error naming ml_dtypes for them. The rest
# are Pyodide's own libraries. Written by tests/pyodide/check_results.py --write (which keeps
# the reasons of the lines that are not about ml_dtypes).
"""


def read_expected(path: str) -> dict[str, str]:
    out = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line and not line.startswith("#"):
                name, _, reason = line.partition(" ")
                out[name] = reason.strip()
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("results")
    ap.add_argument("expected")
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    with open(args.results) as f:
        results = json.load(f)
    if args.write:
        kept = {k: v for k, v in read_expected(args.expected).items() if "ml_dtypes" not in v}
        lines = []
        for name, (status, msg) in sorted(results.items()):
            if status == "pass":
                continue
            m = re.search(r"element type (\w+) needs the ml_dtypes package", msg)
            if m:
                lines.append(f"{name} needs ml_dtypes ({m.group(1)})")
            elif name in kept:
                lines.append(f"{name} {kept[name]}")
            else:
                print("not a narrow-type failure, fix it or list it with its reason: "
                      f"{name}: {msg}")
                return 1
        with open(args.expected, "w") as f:
            f.write(HEADER)
            f.write("\n".join(lines) + "\n")
        print(f"wrote {len(lines)} cases to {args.expected}")
        return 0
    expected = read_expected(args.expected)
    problems = []
    for name, (status, msg) in sorted(results.items()):
        if name in expected:
            if status == "pass":
                problems.append(f"{name}: listed as failing but passes (remove it from the list)")
            elif "ml_dtypes" in expected[name] and "ml_dtypes" not in msg:
                problems.append(f"{name}: fails without naming ml_dtypes: {msg}")
        elif status != "pass":
            problems.append(f"{name}: {status}: {msg}")
    missing = sorted(set(expected) - set(results))
    problems += [f"{name}: listed but not run" for name in missing]
    passed = sum(1 for s, _ in results.values() if s == "pass")
    for p in problems:
        print("  " + p)
    narrow = sum(1 for r in expected.values() if "ml_dtypes" in r)
    print(f"Pyodide conformance: {passed} of {len(results)} cases pass; {len(expected)} listed "
          f"as not passing there ({narrow} need ml_dtypes); {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
