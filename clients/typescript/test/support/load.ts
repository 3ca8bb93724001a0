/**
 * Many calls at once, each ending in one word: what the load test (`many_calls.test.ts`) asserts
 * and the load bench (`bench/many_calls.ts`) counts. A call is `ok` (its result has all of its
 * output), `result:<status>`, `error:<code>` (a `PtcError`), `not-a-PtcError`, or `hung`: not
 * settled a few seconds after its own deadline, which the SDK must never let happen.
 */

import { type PtcClient, PtcError } from "../../src/index.js";
import type { InputFile } from "../../src/types.js";

export interface PlannedCall {
  /** Over `client.stream` (ExecuteStream), else `client.execute` (the unary Execute). */
  streamed: boolean;
  /** Seconds the script sleeps before it prints. */
  sleepS: number;
  /** Bytes of stdout the script prints, all of which an `ok` result carries. */
  stdoutBytes: number;
  /** Bytes of the one input file the request carries (none when 0). */
  fileBytes: number;
  deadlineMs: number;
}

export interface Ended {
  outcome: string;
  /** The error's message or the result's stderr, for a report. */
  detail: string;
  ms: number;
}

/** How long after its own deadline a call that has not settled counts as hung. */
export const HUNG_AFTER_DEADLINE_MS = 5_000;

/** One call as planned, ended: never rejects, and a call still pending is `hung`. */
export function call(client: PtcClient, plan: PlannedCall): Promise<Ended> {
  let timer: NodeJS.Timeout | undefined;
  const hung = new Promise<Ended>((done) => {
    const ms = plan.deadlineMs + HUNG_AFTER_DEADLINE_MS;
    timer = setTimeout(() => done({ outcome: "hung", detail: "", ms }), ms);
  });
  return Promise.race([ended(client, plan), hung]).finally(() => clearTimeout(timer));
}

async function ended(client: PtcClient, plan: PlannedCall): Promise<Ended> {
  const script =
    `import sys, time\ntime.sleep(${plan.sleepS})\n` +
    `sys.stdout.write('x' * ${plan.stdoutBytes})`;
  const options = {
    deadlineMs: plan.deadlineMs,
    limits: { stdoutBytes: Math.max(plan.stdoutBytes, 1024) * 2, wallTimeMs: plan.deadlineMs },
    files:
      plan.fileBytes > 0
        ? [{ name: "in.bin", content: new Uint8Array(plan.fileBytes) } satisfies InputFile]
        : [],
  };
  const started = Date.now();
  try {
    const result = plan.streamed
      ? await client.stream(script, options).result
      : await client.execute(script, options);
    const whole = result.status === "ok" && result.stdout.length === plan.stdoutBytes;
    return {
      outcome: whole ? "ok" : `result:${result.status}`,
      detail: result.stderr.slice(-200),
      ms: Date.now() - started,
    };
  } catch (error) {
    return {
      outcome: error instanceof PtcError ? `error:${error.code}` : "not-a-PtcError",
      detail: error instanceof Error ? error.message : String(error),
      ms: Date.now() - started,
    };
  }
}

/** How many calls ended each way, e.g. `{ ok: 250, "error:unavailable": 3 }`. */
export function tally(ends: readonly Ended[]): Record<string, number> {
  const counts: Record<string, number> = {};
  for (const end of ends) counts[end.outcome] = (counts[end.outcome] ?? 0) + 1;
  return counts;
}
