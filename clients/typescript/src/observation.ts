/**
 * The observation: what the model reads after its script ran, bounded and honest about cuts.
 *
 * The same text as the Python SDK's (`sandbox/integrations/observation.py`), character for
 * character, so an agent reads the same answer whichever SDK its builder chose; the shared
 * vectors in `tests/data/observation_vectors.json` are checked by both test suites. Sections, in
 * order: a status line (status, exit code, call counts by status), the script's stdout, one line
 * per tool call, the violations, the script's error and the tail of stderr. Every section has a
 * budget (`ObservationBudget`); whatever does not fit is replaced by an explicit marker that says
 * how much was cut (bytes and lines of output, which calls by number), and the whole text has a
 * hard byte ceiling with a final marker of its own. Long output keeps its head and its tail;
 * failed calls are shown before ok ones; a result is cut to its tool's declared summary fields.
 *
 * Python's text semantics (code points, its line boundaries, its rounding, its JSON) live in
 * `observation/pytext.ts` and `observation/pyjson.ts`; this module is the layout. It imports
 * nothing from Node.
 */

import {
  dumpsCompact,
  fromJs,
  loadsLikePython,
  type PyValue,
  summarize,
} from "./observation/pyjson.js";
import {
  clipBytes,
  codePoints,
  pyFixed,
  pyIntegral,
  pyLen,
  pyRstrip,
  rstripChars,
  splitLines,
  utf8Size,
} from "./observation/pytext.js";
import { errorLine, type ScriptSource, scriptFrames } from "./observation/traceback.js";

export type { ScriptSource } from "./observation/traceback.js";

/** Size bounds of one observation; bytes are UTF-8 bytes. The defaults are Python's. */
export interface ObservationBudget {
  readonly maxBytes: number;
  readonly stdoutBytes: number;
  readonly stdoutLines: number;
  readonly stderrBytes: number;
  readonly calls: number;
  readonly callChars: number;
}

export const DEFAULT_BUDGET: ObservationBudget = Object.freeze({
  maxBytes: 12_000,
  stdoutBytes: 6_000,
  stdoutLines: 200,
  stderrBytes: 1_000,
  calls: 30,
  callChars: 240,
});

/**
 * One recorded call as the observation reads it. `argumentsJson` and `resultJson` are the JSON
 * texts the server sent; with them the line is exactly Python's. Without them the parsed
 * `arguments` and `result` are printed, where an integral float (`1.0`) reads as an int (`1`).
 */
export interface ObservedCall {
  readonly seq: number | bigint;
  readonly tool: string;
  readonly status: string;
  readonly argumentsJson?: string;
  readonly resultJson?: string;
  readonly arguments?: unknown;
  readonly result?: unknown;
  readonly error?: string | null;
}

export interface ObservedViolation {
  readonly limit: string;
  readonly limitValue: number;
  /** What was measured; absent when nothing was. */
  readonly observed?: number | null;
  readonly unit: string;
  readonly action: string;
  readonly detail?: string;
  readonly evidence?: string;
}

export interface ObservedOutputFile {
  readonly name: string;
  readonly size?: number | bigint;
  readonly sizeBytes?: number | bigint;
  readonly sha256: string;
}

export interface ObservedOmittedOutput {
  readonly name: string;
  readonly reason: string;
  readonly size?: number | bigint | null;
  readonly sizeBytes?: number | bigint | null;
}

/** The fields of an execution's result the observation shows; `ExecutionResult` has them. */
export interface ObservedResult {
  readonly status: string;
  readonly exitCode: number;
  readonly stdout: string;
  readonly stderr: string;
  readonly calls: readonly ObservedCall[];
  readonly violations: readonly ObservedViolation[];
  readonly error?: {
    readonly type: string;
    readonly message: string;
    readonly line?: number;
  } | null;
  /** A session's cell: the repr of its final bare expression. */
  readonly value?: string | null;
  readonly sessionLost?: string;
  readonly outputFiles?: readonly ObservedOutputFile[];
  readonly omittedOutputs?: readonly ObservedOmittedOutput[];
}

export interface ObservationOptions {
  /** Per tool, the fields of its result to show (`x-ptc.summary_fields`). */
  readonly summaryFields?: Readonly<Record<string, readonly string[]>>;
  /** Bounds; any left out take `DEFAULT_BUDGET`'s. */
  readonly budget?: Partial<ObservationBudget>;
  /** The script that ran, so a traceback shows its lines. */
  readonly script?: ScriptSource;
}

/** The text the model reads back for `result`. */
export function renderObservation(
  result: ObservedResult,
  options: ObservationOptions = {},
): string {
  const budget: ObservationBudget = { ...DEFAULT_BUDGET, ...options.budget };
  const fields = options.summaryFields ?? {};
  const source: ScriptSource = options.script ?? { text: "" };
  const stderr = result.stderr ? scriptFrames(result.stderr, source) : "";
  const parts = [statusLine(result)];
  if (result.stdout) parts.push(`--- stdout ---\n${headTail(result.stdout, budget, "stdout")}`);
  if (result.value !== undefined && result.value !== null) {
    parts.push(`--- value ---\n${headTail(result.value, budget, "value")}`);
  }
  if (result.sessionLost) parts.push(`--- session lost ---\n${result.sessionLost}`);
  if (result.calls.length > 0) parts.push(callsSection(result.calls, fields, budget));
  if (result.violations.length > 0) {
    parts.push(["--- violations ---", ...result.violations.map(violationLine)].join("\n"));
  }
  if ((result.outputFiles?.length ?? 0) > 0 || (result.omittedOutputs?.length ?? 0) > 0) {
    parts.push(outputs(result));
  }
  const error = result.error ?? null;
  if (error !== null) {
    const where = errorLine(result.stderr, error.line ?? 0, source);
    parts.push(`--- error ---\n${error.type}: ${error.message}${where}`);
  }
  if (stderr && error === null) {
    parts.push(`--- stderr ---\n${tail(stderr, budget.stderrBytes, "stderr")}`);
  } else if (stderr) {
    // The traceback's last lines name the error already shown; keep the tail only.
    parts.push(`--- stderr (tail) ---\n${tail(stderr, budget.stderrBytes, "stderr")}`);
  }
  return cap(parts.join("\n"), budget.maxBytes);
}

function plural(count: number, noun: string): string {
  return count === 1 ? `${count} ${noun}` : `${count} ${noun}s`;
}

function statusLine(result: ObservedResult): string {
  const counts = new Map<string, number>();
  for (const call of result.calls) counts.set(call.status, (counts.get(call.status) ?? 0) + 1);
  const byStatus = [...counts.entries()]
    .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))
    .map(([status, n]) => `${n} ${status}`)
    .join(", ");
  const calls = plural(result.calls.length, "tool call") + (byStatus ? ` (${byStatus})` : "");
  return `status: ${result.status} · exit code ${result.exitCode} · ${calls}`;
}

/** A number as written by hand: no exponent, no trailing zeros, integers without a point. */
function plain(value: number): string {
  if (Number.isInteger(value)) return pyIntegral(value);
  return rstripChars(rstripChars(pyFixed(value, 6), "0"), ".");
}

const BINARY_UNITS: readonly [string, number][] = [
  ["GiB", 2 ** 30],
  ["MiB", 2 ** 20],
  ["KiB", 2 ** 10],
];

function quantity(value: number | bigint | null | undefined, unit: string): string {
  if (value === null || value === undefined) return "not measured";
  const n = Number(value);
  if (unit === "bytes") {
    const text = `${typeof value === "bigint" ? value.toString() : plain(n)} bytes`;
    for (const [name, size] of BINARY_UNITS) {
      if (n >= size) {
        const scaled = n / size;
        const shown = Number.isInteger(scaled) ? plain(scaled) : pyFixed(scaled, 1);
        return `${text} (${shown} ${name})`;
      }
    }
    return text;
  }
  if (unit === "count" || unit === "") return plain(n);
  return `${plain(n)} ${unit}`;
}

function violationLine(v: ObservedViolation): string {
  const limit = quantity(v.limitValue, v.unit);
  const seen = quantity(v.observed, v.unit);
  if (v.limit === "expected_calls") {
    // A check of the finished script's call log, not a resource the sandbox stopped.
    const what = v.detail ? `expected_calls: ${v.detail}` : "expected_calls: not met";
    return `${what} (checked after the script ended)`;
  }
  let detail = v.detail ? `: ${v.detail}` : "";
  if (v.evidence === "guest") {
    detail += " (reported from inside the sandbox; the host could not confirm it)";
  }
  return `${v.limit}: limit ${limit}, observed ${seen}, action ${v.action}${detail}`;
}

function outputs(result: ObservedResult): string {
  const lines = ["--- output files ---"];
  for (const f of result.outputFiles ?? []) {
    lines.push(
      `outputs/${f.name}: ${quantity(f.sizeBytes ?? f.size ?? 0, "bytes")}, sha256 ${f.sha256}`,
    );
  }
  for (const o of result.omittedOutputs ?? []) {
    const raw = o.sizeBytes ?? o.size ?? null;
    const size = raw === null ? "" : `, ${quantity(raw, "bytes")}`;
    if (o.reason === "more") {
      lines.push(`and ${raw === null ? "None" : String(raw)} more files not returned`);
    } else {
      lines.push(`outputs/${o.name}: not returned (${o.reason}${size})`);
    }
  }
  return lines.join("\n");
}

function headTail(text: string, budget: ObservationBudget, name: string): string {
  const lines = splitLines(text, true);
  if (utf8Size(text) <= budget.stdoutBytes && lines.length <= budget.stdoutLines) {
    return rstripChars(text, "\n");
  }
  const halfBytes = Math.floor(budget.stdoutBytes / 2);
  const halfLines = Math.max(Math.floor(budget.stdoutLines / 2), 1);
  const head: string[] = [];
  let used = 0;
  for (const line of lines.slice(0, halfLines)) {
    if (used + utf8Size(line) > halfBytes) {
      if (head.length === 0) head.push(clipBytes(line, halfBytes)); // one huge line: its start
      break;
    }
    head.push(line);
    used += utf8Size(line);
  }
  const tailLines: string[] = [];
  used = 0;
  for (const line of lines.slice(head.length).slice(-halfLines).reverse()) {
    if (used + utf8Size(line) > halfBytes) {
      if (tailLines.length === 0) tailLines.push(clipBytes(line, halfBytes, true));
      break;
    }
    tailLines.push(line);
    used += utf8Size(line);
  }
  tailLines.reverse();
  const kept = head.join("") + tailLines.join("");
  const droppedBytes = utf8Size(text) - utf8Size(kept);
  const whole = [...head, ...tailLines].filter((x) => x.endsWith("\n")).length;
  const droppedLines = Math.max(lines.length - whole, 0);
  const marker = `[... cut from ${name}: ${droppedBytes} bytes, ${droppedLines} lines ...]\n`;
  let headText = head.join("");
  if (headText && !headText.endsWith("\n")) headText += "\n";
  return rstripChars(headText + marker + tailLines.join(""), "\n");
}

function tail(text: string, limit: number, name: string): string {
  if (utf8Size(text) <= limit) return rstripChars(text, "\n");
  const kept = clipBytes(text, limit, true);
  const dropped = utf8Size(text) - utf8Size(kept);
  return `[... cut from ${name}: first ${dropped} bytes ...]\n${rstripChars(kept, "\n")}`;
}

function callArguments(call: ObservedCall): PyValue {
  return call.argumentsJson !== undefined
    ? loadsLikePython(call.argumentsJson)
    : fromJs(call.arguments);
}

function callResult(call: ObservedCall): PyValue {
  return call.resultJson !== undefined ? loadsLikePython(call.resultJson) : fromJs(call.result);
}

function callLine(
  call: ObservedCall,
  fields: Readonly<Record<string, readonly string[]>>,
  limit: number,
): string {
  let args = dumpsCompact(callArguments(call));
  const room = Math.max(Math.floor(limit / 3), 40);
  const argsLength = pyLen(args);
  if (argsLength > room) {
    args = `${codePoints(args).slice(0, room).join("")}... [${argsLength - room} chars of arguments cut]`;
  }
  let outcome: string;
  if (call.status === "ok") {
    const declared = Object.hasOwn(fields, call.tool) ? (fields[call.tool] ?? []) : [];
    outcome = `ok ${dumpsCompact(summarize(callResult(call), declared))}`;
  } else {
    outcome = pyRstrip(`${call.status} ${call.error ?? ""}`);
  }
  let line = `#${call.seq} ${call.tool}(${args}) -> ${outcome}`;
  const points = codePoints(line);
  if (points.length > limit) {
    line = `${points.slice(0, limit).join("")} [... ${points.length - limit} chars cut]`;
  }
  return line;
}

function callsSection(
  calls: readonly ObservedCall[],
  fields: Readonly<Record<string, readonly string[]>>,
  budget: ObservationBudget,
): string {
  let header = `--- calls (${calls.length}) ---`;
  if (calls.some((c) => Object.hasOwn(fields, c.tool) && (fields[c.tool]?.length ?? 0) > 0)) {
    header += "\n(results of tools with declared summary fields show only those fields)";
  }
  const chosen = [...choose(calls, budget.calls)].sort((a, b) => a - b);
  const lines = [header];
  let previous = 0;
  for (const index of chosen) {
    if (index > previous) lines.push(gap(calls, previous, index));
    const call = calls[index];
    if (call !== undefined) lines.push(callLine(call, fields, budget.callChars));
    previous = index + 1;
  }
  if (previous < calls.length) lines.push(gap(calls, previous, calls.length));
  return lines.join("\n");
}

/** Indices to show: failed calls first, then the first and last ok calls. */
function choose(calls: readonly ObservedCall[], limit: number): Set<number> {
  const all = calls.map((_, i) => i);
  if (calls.length <= limit) return new Set(all);
  const failed = all.filter((i) => calls[i]?.status !== "ok").slice(0, Math.max(limit, 0));
  const chosen = new Set(failed);
  const rest = all.filter((i) => !chosen.has(i));
  const room = limit - chosen.size;
  const head = Math.floor((room + 1) / 2);
  for (const i of rest.slice(0, Math.max(head, 0))) chosen.add(i);
  if (room - head > 0) for (const i of rest.slice(-(room - head))) chosen.add(i);
  return chosen;
}

function gap(calls: readonly ObservedCall[], start: number, end: number): string {
  const first = calls[start]?.seq;
  const last = calls[end - 1]?.seq;
  const span = start === end - 1 ? `#${first}` : `#${first}..#${last}`;
  return `[... ${end - start} calls cut: ${span} ...]`;
}

function cap(text: string, limit: number): string {
  if (utf8Size(text) <= limit) return text;
  const markerRoom = 80;
  const kept = clipBytes(text, Math.max(limit - markerRoom, 0));
  const dropped = utf8Size(text) - utf8Size(kept);
  return `${rstripChars(kept, "\n")}\n[... observation cut: last ${dropped} bytes ...]`;
}

/** The declared summary fields of a manifest's tools (`x-ptc.summary_fields`), by tool name. */
export function summaryFieldsOf(manifest: unknown): Record<string, readonly string[]> {
  const tools = Array.isArray(manifest)
    ? manifest
    : manifest !== null && typeof manifest === "object" && "tools" in manifest
      ? (manifest as { tools: unknown }).tools
      : [];
  const out: Record<string, readonly string[]> = {};
  if (!Array.isArray(tools)) return out;
  for (const tool of tools as unknown[]) {
    if (tool === null || typeof tool !== "object") continue;
    const entry = tool as Record<string, unknown>;
    const fn = (entry.function ?? entry) as Record<string, unknown>;
    const name = typeof fn.name === "string" ? fn.name : null;
    const ptc = (entry["x-ptc"] ?? fn["x-ptc"]) as Record<string, unknown> | undefined;
    const summary = ptc?.summary_fields;
    if (name !== null && Array.isArray(summary) && summary.every((f) => typeof f === "string")) {
      if (summary.length > 0) out[name] = summary as string[];
    }
  }
  return out;
}
