/**
 * Every `ts` block of README.md and docs/typescript.md runs, so that no TypeScript example drifts
 * from the package (the Python suite's tests/docs/test_docs.py runs the other blocks and leaves
 * these to this test). A block is compiled by esbuild (types stripped, nothing checked), written
 * into a directory inside this package, so that `ptc-sandbox` resolves to the package itself (its
 * `exports`, built in dist/) and the frameworks to its devDependencies, and run by Node against a
 * real `ptc serve` started here, its documented address `127.0.0.1:50051` replaced by this
 * server's. It must exit 0 within a minute. All the blocks are also type-checked together, in
 * strict mode, as a user's project would compile them.
 */

import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { promisify } from "node:util";
import { transform } from "esbuild";
import { PACKAGE_ROOT, REPO_ROOT, type Serving, startServe } from "./support/serve.js";

const run = promisify(execFile);
const DOCUMENTS = ["README.md", join("docs", "typescript.md")];
const FENCE = /^```ts[^\n]*\n([\s\S]*?)^```$/gm;

function blocks(document: string): { line: number; code: string }[] {
  const text = readFileSync(join(REPO_ROOT, document), "utf8");
  return [...text.matchAll(FENCE)].map((m) => ({
    line: text.slice(0, m.index).split("\n").length,
    code: m[1] ?? "",
  }));
}

let serving: Serving;
let dir: string;

before(async () => {
  serving = await startServe("--allow-degraded");
  dir = mkdtempSync(join(PACKAGE_ROOT, ".docs-run-"));
});

after(async () => {
  if (dir) rmSync(dir, { recursive: true, force: true });
  const stopped = await serving?.stop();
  assert.equal(stopped?.code, 0, stopped?.stderr);
});

test("every example type-checks in strict mode", async () => {
  const checked = mkdtempSync(join(PACKAGE_ROOT, ".docs-run-tsc-"));
  try {
    for (const document of DOCUMENTS) {
      for (const { line, code } of blocks(document)) {
        writeFileSync(join(checked, `${document.replaceAll(/\W/g, "_")}_${line}.ts`), code);
      }
    }
    const config = {
      extends: "../tsconfig.json",
      compilerOptions: { noEmit: true, rootDir: "." },
      include: ["*.ts"],
    };
    writeFileSync(join(checked, "tsconfig.json"), JSON.stringify(config));
    const tsc = join(PACKAGE_ROOT, "node_modules", "typescript", "bin", "tsc");
    try {
      await run(process.execPath, [tsc, "-p", join(checked, "tsconfig.json")], { cwd: checked });
    } catch (error) {
      assert.fail(
        `the examples do not type-check:\n${(error as { stdout?: string }).stdout ?? error}`,
      );
    }
  } finally {
    rmSync(checked, { recursive: true, force: true });
  }
});

test("the documents have their TypeScript examples", () => {
  assert.ok(blocks("README.md").length >= 1, "README.md has no ts block");
  assert.ok(blocks(join("docs", "typescript.md")).length >= 8, "docs/typescript.md lost examples");
});

for (const document of DOCUMENTS) {
  describe(document, () => {
    for (const { line, code } of blocks(document)) {
      test(`${document}:${line} runs`, async () => {
        const source = code.replaceAll(/http:\/\/127\.0\.0\.1:50051/g, serving.address);
        const js = await transform(source, { loader: "ts", format: "esm", target: "node20" });
        const file = join(dir, `${document.replaceAll(/\W/g, "_")}_${line}.mjs`);
        writeFileSync(file, js.code);
        try {
          await run(process.execPath, [file], { cwd: dir, timeout: 60_000 });
        } catch (error) {
          const { stdout, stderr } = error as { stdout?: string; stderr?: string };
          assert.fail(`${document}:${line} failed:\n${stdout ?? ""}\n${stderr ?? ""}`);
        }
      });
    }
  });
}
