/**
 * The package as a user gets it: `npm pack`'s tarball installed into an empty directory with
 * nothing else from the checkout (its dependencies from the registry), then run there against
 * a real `ptc serve`: a first execution of our own, and the README's first TypeScript example
 * (its types stripped by esbuild, its address pointed at the test's server).
 */

import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, test } from "node:test";
import { transform } from "esbuild";
import { PACKAGE_ROOT, REPO_ROOT, type Serving, startServe } from "./support/serve.js";

let serving: Serving;
let dir: string;

before(async () => {
  dir = mkdtempSync(join(tmpdir(), "ptc-ts-pack-"));
  serving = await startServe("--allow-degraded");
  execFileSync("npm", ["pack", "--silent", "--pack-destination", dir], {
    cwd: PACKAGE_ROOT,
    stdio: "pipe",
  });
  const [tarball] = readdirSync(dir).filter((name) => name.endsWith(".tgz"));
  assert.ok(tarball, "npm pack made no tarball");
  const app = join(dir, "app");
  execFileSync("mkdir", [app]);
  writeFileSync(
    join(app, "package.json"),
    JSON.stringify({ name: "app", private: true, type: "module" }),
  );
  execFileSync("npm", ["install", "--silent", "--no-audit", "--no-fund", join(dir, tarball)], {
    cwd: app,
    stdio: "pipe",
  });
});

after(async () => {
  await serving?.stop();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

function run(file: string, code: string): string {
  const path = join(dir, "app", file);
  writeFileSync(path, code);
  return execFileSync("node", [path], { cwd: join(dir, "app"), encoding: "utf8", timeout: 60_000 });
}

test("the tarball holds the built package and nothing of the checkout's", () => {
  const listed = execFileSync(
    "tar",
    ["-tzf", join(dir, readdirSync(dir).find((n) => n.endsWith(".tgz")) ?? "")],
    {
      encoding: "utf8",
    },
  ).split("\n");
  assert.ok(listed.includes("package/dist/src/index.js"));
  assert.ok(listed.includes("package/dist/src/transport/node.js"));
  assert.ok(listed.includes("package/dist/src/gen/ptc/sandbox/v1/sandbox_pb.js"));
  const foreign = listed.filter(
    (name) =>
      /^package\/(src|test|bench|node_modules|dist\/test)\//.test(name) ||
      /(?<!\.d)\.ts$/.test(name),
  );
  assert.deepEqual(foreign, []);
});

test("installed from the tarball, a first execution runs against ptc serve", () => {
  const out = run(
    "first.mjs",
    `import { PtcClient } from "ptc-sandbox";
const client = new PtcClient({ address: ${JSON.stringify(serving.address)} });
const result = await client.execute("print(6 * 7)");
console.log(result.status, result.stdout.trim());
client.close();
`,
  );
  assert.equal(out, "ok 42\n");
});

test("the README's first TypeScript example runs from the installed tarball", async (t) => {
  const readme = readFileSync(join(REPO_ROOT, "README.md"), "utf8");
  const section = readme.split(/^#+ .*TypeScript.*$/m)[1];
  const example =
    section === undefined ? undefined : /```(?:ts|typescript)\n([\s\S]*?)```/.exec(section)?.[1];
  if (example === undefined) {
    t.skip("README.md has no TypeScript section with a ```ts example yet");
    return;
  }
  const code = example.replaceAll(
    /https?:\/\/127\.0\.0\.1:50051|127\.0\.0\.1:50051/g,
    serving.address,
  );
  const js = await transform(code, { loader: "ts", format: "esm" });
  run("readme.mjs", js.code);
});

test("with AI SDK 6 installed beside it, ptc-sandbox/ai runs in its loop, over a session", () => {
  // No --legacy-peer-deps: the install succeeds only if the peer range admits AI SDK 6.
  execFileSync("npm", ["install", "--silent", "--no-audit", "--no-fund", "ai@6.0.333", "zod@4"], {
    cwd: join(dir, "app"),
    stdio: "pipe",
  });
  const out = run(
    "ai6.mjs",
    `import assert from "node:assert/strict";
import { createRequire } from "node:module";
import { generateText, stepCountIs } from "ai";
import { MockLanguageModelV3 } from "ai/test";
import { PtcClient } from "ptc-sandbox";
import { aiExecuteTool, ExecuteTool } from "ptc-sandbox/ai";

const client = new PtcClient({ address: ${JSON.stringify(serving.address)} });
const usage = {
  inputTokens: { total: 1, noCache: 1, cacheRead: 0, cacheWrite: 0 },
  outputTokens: { total: 1, text: 1, reasoning: 0 },
};
const call = (id, code) => ({
  content: [{ type: "tool-call", toolCallId: id, toolName: "execute_python", input: JSON.stringify({ code }) }],
  finishReason: { unified: "tool-calls", raw: undefined },
  usage,
  warnings: [],
});
const answer = {
  content: [{ type: "text", text: "done" }],
  finishReason: { unified: "stop", raw: undefined },
  usage,
  warnings: [],
};
const core = await ExecuteTool.create({ client, session: true });
const model = new MockLanguageModelV3({ doGenerate: [call("c1", "x = 41"), call("c2", "print(x + 1)"), answer] });
const result = await generateText({
  model,
  tools: { execute_python: aiExecuteTool(core) },
  prompt: "Keep x.",
  stopWhen: stepCountIs(4),
});
await core.close();
client.close();
const given = model.doGenerateCalls[2].prompt
  .filter((m) => m.role === "tool")
  .flatMap((m) => m.content.map((p) => p.output.type + ":" + p.output.value));
console.log(createRequire(import.meta.url)("ai/package.json").version, result.text);
console.log(JSON.stringify(given));
`,
  );
  assert.equal(
    out,
    [
      "6.0.333 done",
      JSON.stringify([
        "text:status: ok · exit code 0 · 0 tool calls",
        "text:status: ok · exit code 0 · 0 tool calls\n--- stdout ---\n42",
      ]),
      "",
    ].join("\n"),
  );
});
