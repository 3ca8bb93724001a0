/**
 * The shared observation vectors (tests/data/observation_vectors.json, written from the Python
 * SDK by scripts/gen_observation_vectors.py): the TypeScript observation renders each one exactly
 * as Python did. The Python suite checks the same file (tests/integrations/
 * test_observation_vectors.py), so neither language can change the text alone.
 */

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";

import { type ObservedResult, renderObservation } from "../src/observation.js";

interface WireCall {
  seq: number;
  tool: string;
  arguments_json?: string;
  result_json?: string;
  status: string;
  error?: string;
}

interface Vector {
  name: string;
  result: {
    status?: string;
    exit_code?: number;
    stdout?: string;
    stderr?: string;
    calls?: WireCall[];
    violations?: {
      limit: string;
      limit_value: number;
      observed: number | null;
      unit: string;
      action: string;
      detail: string;
      evidence: string;
    }[];
    error?: { type: string; message: string; line: number } | null;
    value?: string | null;
    session_lost?: string;
    output_files?: { name: string; size: number; sha256: string }[];
    omitted_outputs?: { name: string; reason: string; size: number | null }[];
  };
  budget?: Record<string, number>;
  summary_fields?: Record<string, string[]>;
  script?: { text: string; prelude_lines?: number };
  observation: string;
}

const VECTORS = new URL("../../../../tests/data/observation_vectors.json", import.meta.url);
const vectors = JSON.parse(readFileSync(VECTORS, "utf8")) as Vector[];

/** The vector's result as the client hands it over: what `ExecutionResult` carries. */
function observed(v: Vector): ObservedResult {
  const r = v.result;
  return {
    status: r.status ?? "ok",
    exitCode: r.exit_code ?? 0,
    stdout: r.stdout ?? "",
    stderr: r.stderr ?? "",
    calls: (r.calls ?? []).map((c) => ({
      seq: c.seq,
      tool: c.tool,
      status: c.status,
      argumentsJson: c.arguments_json ?? "",
      resultJson: c.result_json ?? "",
      error: c.error ?? "",
    })),
    violations: (r.violations ?? []).map((x) => ({
      limit: x.limit,
      limitValue: x.limit_value,
      observed: x.observed ?? undefined,
      unit: x.unit,
      action: x.action,
      detail: x.detail,
      evidence: x.evidence,
    })),
    error: r.error ?? undefined,
    value: r.value ?? undefined,
    sessionLost: r.session_lost ?? "",
    outputFiles: (r.output_files ?? []).map((f) => ({
      name: f.name,
      sizeBytes: f.size,
      sha256: f.sha256,
    })),
    omittedOutputs: (r.omitted_outputs ?? []).map((o) => ({
      name: o.name,
      reason: o.reason,
      sizeBytes: o.size ?? undefined,
    })),
  };
}

function budget(v: Vector): Record<string, number> | undefined {
  if (v.budget === undefined) return undefined;
  const camel = (k: string) => k.replace(/_([a-z])/g, (_, c: string) => c.toUpperCase());
  return Object.fromEntries(Object.entries(v.budget).map(([k, n]) => [camel(k), n]));
}

test("the vectors are there and many", () => {
  assert.ok(vectors.length >= 50, `only ${vectors.length} vectors`);
});

for (const v of vectors) {
  test(`observation vector: ${v.name}`, () => {
    const text = renderObservation(observed(v), {
      budget: budget(v),
      summaryFields: v.summary_fields,
      script:
        v.script === undefined
          ? undefined
          : { text: v.script.text, preludeLines: v.script.prelude_lines ?? 0 },
    });
    assert.equal(text, v.observation);
  });
}
