/**
 * The package under a bundler and in a runtime without Node: the root entry bundled by esbuild
 * for a neutral (browser-like) platform has no `require(` and no Node built-in in it; the bundle
 * loads in a `node:vm` context that has the web platform's globals (TextEncoder, URL, Headers,
 * AbortController, timers, crypto.randomUUID) and nothing of Node's (no `process`, `require`,
 * `Buffer` or module loader); the first call there fails with "transport_unavailable" saying
 * which transport to pass, and importing it did not.
 */

import assert from "node:assert/strict";
import { join } from "node:path";
import { test } from "node:test";
import { createContext, runInContext } from "node:vm";
import { build } from "esbuild";
import { PACKAGE_ROOT } from "./support/serve.js";

async function bundle(format: "esm" | "iife"): Promise<string> {
  const output = await build({
    entryPoints: [join(PACKAGE_ROOT, "dist", "src", "index.js")],
    bundle: true,
    platform: "neutral",
    mainFields: ["module", "main"],
    format,
    ...(format === "iife" ? { globalName: "ptc" } : {}),
    write: false,
    logLevel: "silent",
  });
  assert.deepEqual(output.errors, []);
  const [file] = output.outputFiles;
  assert.ok(file);
  return file.text;
}

test("the root entry bundles for a neutral platform with no require( and no Node built-in", async () => {
  const code = await bundle("esm");
  assert.ok(code.length > 10_000, "the bundle is suspiciously small");
  assert.doesNotMatch(code, /\brequire\(/);
  assert.doesNotMatch(code, /from\s*["']node:/);
  assert.doesNotMatch(code, /import\(["'](?:node:)?(?:http2|fs|net|tls)["']\)/);
  assert.match(code, /PtcClient/);
});

test("in a context without Node: import succeeds, the first call is transport_unavailable", async () => {
  const code = await bundle("iife");
  const web = {
    TextEncoder,
    TextDecoder,
    URL,
    Headers,
    AbortController,
    AbortSignal,
    DOMException,
    setTimeout,
    clearTimeout,
    queueMicrotask,
    crypto: { randomUUID: () => globalThis.crypto.randomUUID() },
    console,
  };
  const context = createContext({ ...web });
  assert.equal(
    runInContext("typeof process + typeof require + typeof Buffer", context),
    "undefinedundefinedundefined",
  );
  runInContext(code, context); // the import: must not throw
  const ptc = runInContext("ptc", context) as {
    PtcClient: new (options: { address: string }) => { execute(script: string): Promise<unknown> };
  };
  const client = new ptc.PtcClient({ address: "http://127.0.0.1:1" });
  const outcome = await client.execute("print(1)").then(
    () => undefined,
    (error: unknown) => error,
  );
  assert.ok(outcome !== undefined, "the call succeeded without a transport");
  const error = outcome as { code: string; message: string; name: string };
  assert.equal(error.name, "PtcError");
  assert.equal(error.code, "transport_unavailable");
  assert.match(error.message, /pass `transport` to PtcClient/);
});
