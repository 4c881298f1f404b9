// tests/pyodide/profile_models.py inside Pyodide in Node.js: onnxrun from this checkout's src/
// (no wheel build), numpy and SciPy (its OpenBLAS) from the shared wheels, protobuf's wheel from
// WORK/wheels (tests/pyodide/lane.sh puts it there).
//
//   node tests/pyodide/profile_node.mjs --work .pyodide --shared ../shared/pyodide-0.27.7
//        [--no-scipy] -- MODEL.onnx [...] [--runs 3] [--cprofile 25]
import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";
import { parseArgs } from "node:util";

const { values: a, positionals } = parseArgs({
  options: { work: { type: "string" }, shared: { type: "string" }, "no-scipy": { type: "boolean" } },
  allowPositionals: true,
});
const here = path.dirname(new URL(import.meta.url).pathname);
const work = path.resolve(a.work);
const pyodideDir = path.join(work, "node_modules/pyodide");
const { loadPyodide } = createRequire(import.meta.url)(path.join(pyodideDir, "pyodide.js"));
const py = await loadPyodide({
  indexURL: pyodideDir + path.sep, packageCacheDir: path.resolve(a.shared),
  stdout: (s) => console.log(s), stderr: (s) => console.error(s),
});
await py.loadPackage(["numpy", "micropip", ...(a["no-scipy"] ? [] : ["scipy"])],
  { messageCallback: () => {} });
const mount = (host, at) => {
  py.FS.mkdirTree(at);
  py.FS.mount(py.FS.filesystems.NODEFS, { root: fs.realpathSync(host) }, at);
};
mount(path.join(work, "wheels"), "/wheels");
mount(path.resolve(here, "../../src"), "/src");
mount(here, "/runner");
// model paths: each one's folder mounted under /m<i>
const args = positionals.map((p, i) => {
  if (p.startsWith("--") || !p.endsWith(".onnx")) return p;
  mount(path.dirname(path.resolve(p)), `/m${i}`);
  return `/m${i}/${path.basename(p)}`;
});
py.globals.set("_pure", py.toPy(fs.readdirSync(path.join(work, "wheels"))
  .filter((f) => f.startsWith("protobuf-")).map((f) => "emfs:/wheels/" + f)));
py.globals.set("_args", py.toPy(args));
await py.runPythonAsync(`
import micropip, sys
await micropip.install(list(_pure), deps=False, index_urls=[])
sys.path[:0] = ["/src", "/runner"]
import profile_models
profile_models.main(list(_args))
`);
