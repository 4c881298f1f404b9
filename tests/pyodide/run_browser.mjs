// The browser lane: the demo page (demo/index.html) in headless Chromium through puppeteer-core.
// A local server serves the page, Pyodide's core (npm) merged with the shared Pyodide wheels,
// and the wheels micropip installs (protobuf's, onnxrun's); the test picks light_densenet121 and
// its expected output in the page's file inputs as a user would, runs it on the test pattern,
// and requires the page to say the output matches. The screenshot is kept: WORK/demo.png.
//
//   node tests/pyodide/run_browser.mjs --work .pyodide --shared ../shared/pyodide-0.27.7
//        [--model light_densenet121] [--models DIR]
import fs from "node:fs";
import http from "node:http";
import path from "node:path";
import { execFileSync } from "node:child_process";
import { createRequire } from "node:module";
import { parseArgs } from "node:util";

const { values: a } = parseArgs({
  strict: false,  // bench_browser.mjs imports this module with options of its own
  options: {
    work: { type: "string" }, shared: { type: "string" },
    // densenet121: its expected output (0.461) goes through every layer; most light-zoo
    // models output a constant 0.001 whatever they compute.
    model: { type: "string", default: "light_densenet121" }, models: { type: "string" },
    timeout: { type: "string", default: "300" },
  },
});
const here = path.dirname(new URL(import.meta.url).pathname);
const root = path.resolve(here, "../..");
const work = path.resolve(a.work);
const require = createRequire(path.join(work, "node_modules", "x.js"));
const puppeteer = require("puppeteer-core");

// The light zoo ships inside the onnx package of the project's environment.
const modelsDir = a.models || execFileSync(path.join(root, ".venv/bin/python"), ["-c",
  "import onnx, os; print(os.path.join(os.path.dirname(onnx.__file__), 'backend/test/data/light'))",
]).toString().trim();

export function serve(routes) {
  const types = { ".html": "text/html", ".js": "text/javascript", ".mjs": "text/javascript",
    ".wasm": "application/wasm", ".json": "application/json", ".py": "text/plain" };
  const server = http.createServer((req, res) => {
    const url = decodeURIComponent(new URL(req.url, "http://x").pathname);
    for (const [prefix, dirs] of routes) {
      if (!url.startsWith(prefix)) continue;
      const rel = path.normalize(url.slice(prefix.length)).replace(/^(\.\.[/\\])+/, "");
      for (const dir of dirs) {
        const file = path.join(dir, rel);
        if (file.startsWith(dir) && fs.existsSync(file) && fs.statSync(file).isFile()) {
          res.writeHead(200, { "Content-Type": types[path.extname(file)] || "application/octet-stream",
            "Cross-Origin-Opener-Policy": "same-origin", "Cross-Origin-Embedder-Policy": "require-corp" });
          fs.createReadStream(file).pipe(res);
          return;
        }
      }
    }
    res.writeHead(404).end();
  });
  return new Promise((resolve) => server.listen(0, "127.0.0.1", () => resolve(server)));
}

export function chromium() {
  for (const p of ["/usr/bin/chromium-headless-shell", "/usr/bin/chromium"]) {
    if (fs.existsSync(p)) return p;
  }
  throw new Error("no chromium-headless-shell or chromium (apt-get install chromium-headless-shell)");
}

export async function launch() {
  const userDir = fs.mkdtempSync(path.join(work, "chrome-"));
  const browser = await puppeteer.launch({
    executablePath: chromium(), headless: true, userDataDir: userDir,
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
      "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  });
  return { browser, cleanup: () => fs.rmSync(userDir, { recursive: true, force: true }) };
}

export function pyodideRoutes(shared) {
  return [
    ["/pyodide/", [path.join(work, "node_modules/pyodide"), path.resolve(shared)]],
    ["/wheels/", [path.join(work, "wheels")]],
    ["/demo/", [path.join(root, "demo")]],
    ["/models/", [modelsDir]],
    ["/ort/", [path.join(work, "node_modules/onnxruntime-web/dist")]],
    ["/bench/", [here]],
  ];
}

async function main() {
  const server = await serve(pyodideRoutes(a.shared));
  const base = `http://127.0.0.1:${server.address().port}`;
  const wheels = fs.readdirSync(path.join(work, "wheels"));
  const own = wheels.find((f) => f.startsWith("onnxrun-"));
  const pure = wheels.filter((f) => f !== own && f.endsWith(".whl")).map((f) => "/wheels/" + f);
  const url = `${base}/demo/index.html?pyodide=/pyodide/&onnxrun=/wheels/${own}&wheels=${pure.join(",")}`;
  const { browser, cleanup } = await launch();
  const limit = Number(a.timeout) * 1000;
  let ok = false;
  try {
    const page = await browser.newPage();
    await page.setViewport({ width: 1100, height: 1000 });
    page.on("console", (m) => { if (m.type() === "error") console.log("page:", m.text()); });
    await page.goto(url);
    await page.waitForFunction("window.demoState.ready || window.demoState.error", { timeout: limit });
    const err0 = await page.evaluate("window.demoState.error");
    if (err0) throw new Error("the page could not start: " + err0);
    const model = path.join(modelsDir, `${a.model}.onnx`);
    await (await page.$("#model")).uploadFile(model);
    await page.waitForFunction("!document.getElementById('run').disabled || window.demoState.error", { timeout: limit });
    await (await page.$("#expected")).uploadFile(path.join(modelsDir, `${a.model}_output_0.pb`));
    await page.click("input[name=mode][value=pattern]");
    await page.click("#run");
    await page.waitForFunction("window.demoState.result || window.demoState.error", { timeout: limit });
    const state = await page.evaluate("window.demoState");
    await page.screenshot({ path: path.join(work, "demo.png"), fullPage: true });
    if (state.error) throw new Error("the page failed: " + state.error);
    const check = state.result.check;
    ok = Boolean(check && check.matches);
    const top = state.result.outputs[0].top?.map((t) => t.class).join(", ");
    console.log(`browser lane: ${a.model} in the demo page: run ${state.result.run_ms.toFixed(0)} ms, ` +
      `session ${state.result.load_ms.toFixed(0)} ms, top classes ${top}; expected output ` +
      `${ok ? "matches" : "DOES NOT MATCH"} (max abs diff ${check?.max_abs_diff}); screenshot ${path.join(work, "demo.png")}`);
  } finally {
    await browser.close();
    cleanup();
    server.close();
  }
  console.log(`browser lane: ${ok ? "passed" : "FAILED"}`);
  process.exit(ok ? 0 : 1);
}

if (import.meta.url === `file://${process.argv[1]}`) await main();
