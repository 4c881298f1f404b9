// onnxrun in Pyodide vs onnxruntime-web (WebAssembly, 1 thread), same headless Chromium page,
// same models and inputs, runs interleaved; medians and their ratio (docs/PERFORMANCE.md,
// "In the browser"). Run tests/pyodide/lane.sh once first (it installs the npm packages and
// builds the wheels into .pyodide/).
//
//   node tests/pyodide/bench_browser.mjs --work .pyodide --shared ../shared/pyodide-0.27.7
//        [--quick] [--runs 5] [--scipy]
import fs from "node:fs";
import path from "node:path";
import { execFileSync } from "node:child_process";
import { parseArgs } from "node:util";
import { launch, pyodideRoutes, serve } from "./run_browser.mjs";

const { values: a } = parseArgs({
  options: {
    work: { type: "string" }, shared: { type: "string" }, quick: { type: "boolean" },
    runs: { type: "string", default: "5" }, scipy: { type: "boolean" },
  },
});
const here = path.dirname(new URL(import.meta.url).pathname);
const root = path.resolve(here, "../..");
const work = path.resolve(a.work);
const models = path.join(work, "bench_models");
if (!fs.existsSync(path.join(models, "bert_minilm.onnx"))) {
  execFileSync(path.join(root, ".venv/bin/python"), [path.join(here, "make_bench_models.py"), models],
    { stdio: "inherit" });
}
const zoo = a.quick ? ["squeezenet", "resnet50"]
  : ["bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50", "shufflenet",
     "squeezenet", "vgg19", "zfnet512"];
const cases = [...zoo.map((n) => [`zoo ${n}`, `/models/light_${n}.onnx`]),
  ["MobileNetV2", "/benchmodels/mobilenet_v2.onnx"], ["BERT MiniLM-L6 shape, 1x128", "/benchmodels/bert_minilm.onnx"]];

const server = await serve([...pyodideRoutes(a.shared), ["/benchmodels/", [models]]]);
const base = `http://127.0.0.1:${server.address().port}`;
const wheels = fs.readdirSync(path.join(work, "wheels"));
const own = wheels.find((f) => f.startsWith("onnxrun-"));
const pure = wheels.filter((f) => f !== own && f.endsWith(".whl")).map((f) => "/wheels/" + f);
const { browser, cleanup } = await launch();
const rows = [];
try {
  const page = await browser.newPage();
  page.on("console", (m) => { if (m.type() === "error") console.log("page:", m.text()); });
  await page.goto(`${base}/bench/bench.html?pyodide=/pyodide/&onnxrun=/wheels/${own}&wheels=${pure.join(",")}${a.scipy ? "&scipy=1" : ""}`);
  await page.waitForFunction("window.benchReady || window.benchError", { timeout: 300000 });
  const err = await page.evaluate("window.benchError");
  if (err) throw new Error(err);
  for (const [label, url] of cases) {
    const r = await page.evaluate((u, n) => window.bench(u, n), url, Number(a.runs));
    rows.push([label, r]);
    console.log(`${label}: onnxrun ${r.onnxrun_ms.toFixed(1)} ms, onnxruntime-web ${r.ort_web_ms.toFixed(1)} ms, ` +
      `ratio ${r.ratio.toFixed(2)}x; create ${r.onnxrun_create_ms.toFixed(0)} / ${r.ort_web_create_ms.toFixed(0)} ms; ` +
      `max |diff| ${r.max_abs_diff.toExponential(1)}`);
  }
} finally {
  await browser.close();
  cleanup();
  server.close();
}
console.log("\n| model | onnxrun (Pyodide) | onnxruntime-web (wasm, 1 thread) | ratio | session creation (onnxrun / ort-web) | max abs diff |");
console.log("|---|---|---|---|---|---|");
for (const [label, r] of rows) {
  console.log(`| ${label} | ${r.onnxrun_ms.toFixed(1)} ms | ${r.ort_web_ms.toFixed(1)} ms | ${r.ratio.toFixed(2)}x | ` +
    `${r.onnxrun_create_ms.toFixed(0)} / ${r.ort_web_create_ms.toFixed(0)} ms | ${r.max_abs_diff.toExponential(1)} |`);
}
const g = Math.exp(rows.reduce((s, [, r]) => s + Math.log(r.ratio), 0) / rows.length);
console.log(`\ngeometric mean ratio ${g.toFixed(2)}x over ${rows.length} models (${a.runs} runs each, medians)`);
