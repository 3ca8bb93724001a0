/**
 * The SDK's typed results and options: plain objects with camelCase fields, one per message of
 * the contract (`proto/ptc/sandbox/v1/sandbox.proto`), units in the names as in the proto.
 * JSON that travels as text (arguments, results) is parsed once here, and kept as text too
 * (`argumentsJson`, `resultJson`), so nothing the script produced is lost to a re-encoding.
 */

export type ExecutionStatus =
  | "ok"
  | "error"
  | "limit_exceeded"
  | "rejected"
  | "cancelled"
  | "interrupted"
  | "failed"
  | "unspecified";

export type CallStatus =
  | "ok"
  | "error"
  | "invalid_arguments"
  | "refused"
  | "denied"
  | "cancelled"
  | "unspecified";

export type ViolationAction =
  | "killed"
  | "truncated"
  | "refused"
  | "reported"
  | "interrupted"
  | "unspecified";

export type ViolationEvidence = "kernel" | "host" | "guest" | "unspecified";

export type BackendName = "process" | "docker" | "gvisor";

/** Every limit of one execution, each optional: unset means the server's default. */
export interface Limits {
  wallTimeMs?: number;
  cpuTimeMs?: number;
  memoryBytes?: number;
  processes?: number;
  stdoutBytes?: number;
  stderrBytes?: number;
  fileSizeBytes?: number;
  maxToolCalls?: number;
  openFiles?: number;
  callLogBytes?: number;
  inputFiles?: number;
  inputBytes?: number;
  outputFiles?: number;
  outputFileBytes?: number;
  outputBytes?: number;
}

export interface ToolCall {
  seq: number;
  /** The tool's original name. */
  tool: string;
  arguments: unknown;
  argumentsJson: string;
  status: CallStatus;
  /** The result, parsed, when `status` is "ok". */
  result: unknown;
  resultJson: string;
  /** The error, when `status` is not "ok". */
  error: string;
  startOffsetUs: number;
  durationUs: number;
  idempotencyKey: string;
}

export interface Violation {
  /** wall_time, cpu_time, memory, processes, stdout_bytes, ..., expected_calls, protocol. */
  limit: string;
  limitValue: number;
  /** What was measured, in `unit`; undefined when nothing was. */
  observed: number | undefined;
  unit: string;
  action: ViolationAction;
  detail: string;
  evidence: ViolationEvidence;
}

export interface Usage {
  wallTimeMs: number;
  cpuTimeMs: number;
  peakMemoryBytes: number;
  stdoutBytes: number;
  stderrBytes: number;
  toolCalls: number;
}

export interface ScriptError {
  type: string;
  message: string;
  /** 0 when unknown. */
  line: number;
}

export interface LimitAdjustment {
  limit: string;
  requested: number;
  applied: number;
  action: string;
}

export interface FileDigest {
  name: string;
  sizeBytes: number;
  sha256: string;
}

export interface OutputFile extends FileDigest {
  content: Uint8Array;
}

export interface OmittedOutput {
  name: string;
  reason: string;
  sizeBytes: number | undefined;
  limitValue: number | undefined;
  detail: string;
}

/** One file the script finds in its working directory. */
export interface InputFile {
  name: string;
  /** Bytes, or text written as UTF-8. */
  content: Uint8Array | string;
}

export interface ExpectedCalls {
  tool: string;
  min?: number;
  max?: number;
}

/** The full result of one execution. A failing script is a result, never an error. */
export interface ExecutionResult {
  executionId: string;
  status: ExecutionStatus;
  exitCode: number;
  stdout: string;
  stderr: string;
  calls: ToolCall[];
  violations: Violation[];
  usage: Usage;
  error: ScriptError | undefined;
  backend: BackendName | "unspecified";
  isolation: string[];
  effectiveLimits: Limits;
  adjustments: LimitAdjustment[];
  /** Milliseconds since the epoch; 0 when not set. */
  startedAtMs: number;
  finishedAtMs: number;
  sessionId: string;
  /** In a session: the repr of the cell's final bare expression, if any. */
  value: string | undefined;
  /** Set when the session ended during this execution: why. */
  sessionLost: string;
  inputFiles: FileDigest[];
  outputFiles: OutputFile[];
  omittedOutputs: OmittedOutput[];
}

/** A recorded execution as the audit store keeps it. */
export interface ExecutionRecord {
  result: ExecutionResult;
  tenant: string;
  script: string;
  scriptSha256: string;
  manifestSha256: string;
  prevHash: string;
  recordHash: string;
  labels: Record<string, string>;
  replayOf: string;
  runtime: string;
  idempotencyKey: string;
  /** Why a record is `interrupted` with no result: the server that held it stopped responding
   * (named, with when it was last seen), or it handed its session over. Empty otherwise. */
  interruptedReason: string;
}

export type SessionState = "active" | "closed" | "expired" | "lost" | "unspecified";

export interface SessionInfo {
  sessionId: string;
  state: SessionState;
  endReason: string;
  backend: BackendName | "unspecified";
  limits: Limits;
  idleTimeoutMs: number;
  maxLifetimeMs: number;
  maxExecutions: number;
  executionIds: string[];
  runningExecutionId: string;
  createdAtMs: number;
  lastUsedAtMs: number;
  endedAtMs: number;
  isolation: string[];
  runtime: string;
}

export interface Stubs {
  /** The module scripts import as `tools`. */
  module: string;
  /** The same with bodies elided, for a model's prompt. */
  compact: string;
  /** Python name → original tool name. */
  names: Record<string, string>;
  warnings: string[];
  manifestHash: string;
}

export interface ExecutionPage {
  records: ExecutionRecord[];
  /** Empty on the last page. */
  nextPageToken: string;
}
