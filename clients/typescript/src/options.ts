/**
 * The options of `PtcClient`'s calls, in a module of their own so that the client and its
 * sessions (`sessions.ts`) both import them and neither imports the other: a `Session` speaks to
 * its client through the small `SessionClient` interface declared on its own side, as the
 * Python SDK's sessions do (`sandbox/client/sessions.py`).
 */

import type { OnApproval } from "./stream.js";
import type { ClientTool, JsonSchema, ToolManifest } from "./tools.js";
import type { BackendName, ExecutionStatus, ExpectedCalls, InputFile, Limits } from "./types.js";

export interface CallOptions {
  /** The whole call's time, retries included. Its passing is "deadline_exceeded". */
  deadlineMs?: number;
  signal?: AbortSignal;
}

export type Tools = ToolManifest | ReadonlyArray<ClientTool | JsonSchema>;

export interface ExecuteOptions extends CallOptions {
  /** Server-side manifest entries and/or client tools (which make the call a stream). */
  tools?: Tools;
  limits?: Limits;
  /** At most one execution per key; a retry sends the same. Default: a new UUID per call. */
  idempotencyKey?: string;
  expectedCalls?: ExpectedCalls[];
  files?: InputFile[];
  backend?: BackendName;
  runtime?: string;
  labels?: Record<string, string>;
  policy?: "none" | "restricted";
  /** Run as this session's next cell. */
  sessionId?: string;
}

export interface StreamOptions extends ExecuteOptions {
  onApproval?: OnApproval;
}

export interface ListExecutionsOptions extends CallOptions {
  status?: Exclude<ExecutionStatus, "unspecified">;
  running?: boolean;
  tool?: string;
  violation?: string;
  sessionId?: string;
  since?: Date | number;
  until?: Date | number;
  pageSize?: number;
  pageToken?: string;
}

export interface GenerateStubsOptions extends CallOptions {
  /** Only the compact form is of interest (the module is still returned by the server). */
  compact?: boolean;
}
