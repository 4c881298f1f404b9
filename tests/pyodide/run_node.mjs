// The Node.js lane: ONNX node conformance cases inside Pyodide (tests/pyodide/conformance.py),
// onnxrun installed from its wheel by micropip, offline.
//
//   node tests/pyodide/run_node.mjs --pyodide node_modules/pyodide --shared ../shared/pyodide-0.27.7
//        --wheels WHEEL_DIR --cases CASES_DIR [--json OUT] [-k REGEX]
import path from "node:path";
import { parseArgs } from "node:util";
import { mount, startPyodide } from "./pyodide_env.mjs";

const { values: a } = parseArgs({
  options: {
    pyodide: { type: "string" }, shared: { type: "string" }, wheels: { type: "string" },
    cases: { type: "string" }, json: { type: "string" }, k: { type: "string", default: "" },
  },
});
const here = path.dirname(new URL(import.meta.url).pathname);
const t0 = performance.now();
const py = await startPyodide({
  pyodideDir: path.resolve(a.pyodide), sharedDir: path.resolve(a.shared),
  // Pillow: the ImageDecoder cases; SciPy: its OpenBLAS, which onnxrun's float products then
  // use (providers/cpu/blas.py), so the cases check that path inside WebAssembly too.
  wheelDir: path.resolve(a.wheels), packages: ["pillow", "scipy"],
});
console.log(`Pyodide ${py.version} ready, onnxrun installed: ${((performance.now() - t0) / 1000).toFixed(1)} s`);
mount(py, path.resolve(a.cases), "/cases");
mount(py, here, "/runner");
const args = ["/cases", "-k", a.k];
if (a.json) {
  mount(py, path.dirname(path.resolve(a.json)), "/out");
  args.push("--json", "/out/" + path.basename(a.json));
}
py.globals.set("_args", py.toPy(args));
const rc = await py.runPythonAsync(`
import sys
sys.path.insert(0, "/runner")
import conformance
conformance.main(list(_args))
`);
console.log(`total ${((performance.now() - t0) / 1000).toFixed(0)} s`);
process.exit(rc ?? 0);
