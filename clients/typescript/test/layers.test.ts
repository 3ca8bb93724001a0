/**
 * No import circle among the package's modules, as `tests/test_layers.py` holds for the Python
 * side: a circle makes the modules one unit that cannot be read, tested or loaded apart (and an
 * ESM circle can hand a module another's bindings before they are set). Type-only imports
 * count: they are the same dependency for a reader. Read from the sources, not the build.
 */

import assert from "node:assert/strict";
import { readdirSync, readFileSync } from "node:fs";
import { dirname, join, relative, resolve } from "node:path";
import { test } from "node:test";
import { PACKAGE_ROOT } from "./support/serve.js";

const SRC = join(PACKAGE_ROOT, "src");

/** Every static `import ... from "./x.js"` / `export ... from` / `import "./x.js"` target. */
const IMPORT = /(?:^|\n)\s*(?:import|export)\s+(?:[^;"']*?\sfrom\s+)?["'](\.{1,2}\/[^"']+)["']/g;

function sources(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((entry) => {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) return sources(path);
    return entry.name.endsWith(".ts") ? [path] : [];
  });
}

/** module (path under src/) -> the modules it imports. */
function importGraph(): Map<string, string[]> {
  const graph = new Map<string, string[]>();
  for (const file of sources(SRC)) {
    const text = readFileSync(file, "utf8");
    const targets = [...text.matchAll(IMPORT)].map((m) =>
      relative(SRC, resolve(dirname(file), (m[1] ?? "").replace(/\.js$/, ".ts"))),
    );
    graph.set(relative(SRC, file), [...new Set(targets)].sort());
  }
  return graph;
}

/** The strongly connected components of more than one module (or a module importing itself). */
function circles(graph: Map<string, string[]>): string[][] {
  const index = new Map<string, number>();
  const low = new Map<string, number>();
  const stack: string[] = [];
  const onStack = new Set<string>();
  const found: string[][] = [];
  const visit = (node: string): void => {
    index.set(node, index.size);
    low.set(node, index.get(node) ?? 0);
    stack.push(node);
    onStack.add(node);
    for (const next of graph.get(node) ?? []) {
      if (!index.has(next)) {
        visit(next);
        low.set(node, Math.min(low.get(node) ?? 0, low.get(next) ?? 0));
      } else if (onStack.has(next)) {
        low.set(node, Math.min(low.get(node) ?? 0, index.get(next) ?? 0));
      }
    }
    if (low.get(node) === index.get(node)) {
      const component: string[] = [];
      for (let top = stack.pop(); top !== undefined; top = stack.pop()) {
        onStack.delete(top);
        component.push(top);
        if (top === node) break;
      }
      if (component.length > 1 || (graph.get(node) ?? []).includes(node)) {
        found.push(component.sort());
      }
    }
  };
  for (const node of [...graph.keys()].sort()) if (!index.has(node)) visit(node);
  return found;
}

test("the import graph is read: the edges the client is known to have are there", () => {
  const graph = importGraph();
  assert.ok(graph.get("client.ts")?.includes("sessions.ts"), "client.ts -> sessions.ts not seen");
  assert.ok(graph.get("index.ts")?.includes("errors.ts"), "an export-from edge not seen");
  assert.ok(graph.get("transport/node.ts")?.includes("errors.ts"), "a ../ edge not seen");
  // A circle is found when there is one (the check can fail).
  assert.deepEqual(
    circles(
      new Map([
        ["a.ts", ["b.ts"]],
        ["b.ts", ["a.ts"]],
        ["c.ts", ["a.ts"]],
      ]),
    ),
    [["a.ts", "b.ts"]],
  );
});

test("no module of src/ is part of an import circle", () => {
  assert.deepEqual(circles(importGraph()), []);
});
