// Pyodide in Node.js, offline, with onnxrun installed from its built wheel by micropip.
//
// Pyodide's core comes from the npm package (indexURL); its packages (numpy, micropip...) from
// the shared folder of wheels checked against pyodide-lock.json (packageCacheDir: Pyodide loads
// a package from there when it is present, and checks its sha256); the pure-Python wheels
// (protobuf, onnxrun itself) are installed by micropip from the Emscripten file system, so no
// index is ever asked.
import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";

export async function startPyodide({ pyodideDir, sharedDir, wheelDir, packages = [] }) {
  const require = createRequire(import.meta.url);
  const { loadPyodide } = require(path.join(pyodideDir, "pyodide.js"));
  const py = await loadPyodide({
    indexURL: pyodideDir + path.sep,
    packageCacheDir: sharedDir,
    stdout: (s) => console.log(s),
    stderr: (s) => console.error(s),
  });
  await py.loadPackage(["numpy", "micropip", ...packages], { messageCallback: () => {} });
  py.FS.mkdirTree("/wheels");
  py.FS.mount(py.FS.filesystems.NODEFS, { root: fs.realpathSync(wheelDir) }, "/wheels");
  const wheels = fs.readdirSync(wheelDir).filter((f) => f.endsWith(".whl"));
  const pure = wheels.filter((f) => !f.startsWith("onnxrun-"));
  const onnxrun = wheels.filter((f) => f.startsWith("onnxrun-"));
  if (onnxrun.length !== 1) throw new Error(`expected one onnxrun wheel in ${wheelDir}`);
  py.globals.set("_pure", py.toPy(pure.map((f) => "emfs:/wheels/" + f)));
  py.globals.set("_own", "emfs:/wheels/" + onnxrun[0]);
  // Dependencies first (no index: each is a file), then onnxrun with deps=True: micropip
  // checks its requirements (onnx and ml_dtypes are excluded by markers on Emscripten).
  await py.runPythonAsync(`
import micropip
await micropip.install(list(_pure), deps=False, index_urls=[])
await micropip.install(_own, index_urls=[])
`);
  return py;
}

export function mount(py, hostDir, at) {
  py.FS.mkdirTree(at);
  py.FS.mount(py.FS.filesystems.NODEFS, { root: fs.realpathSync(hostDir) }, at);
}
