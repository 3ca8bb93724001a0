/**
 * Between the generated messages (`src/gen`) and the SDK's typed objects (`types.ts`): the one
 * place that knows both. uint64 fields arrive as bigint and leave as numbers (every quantity
 * the service sends fits in 2^53); enums become the lower-case names the Python SDK uses.
 */

import { create } from "@bufbuild/protobuf";
import type { Timestamp } from "@bufbuild/protobuf/wkt";
import { PtcError } from "./errors.js";
import * as pb from "./gen/ptc/sandbox/v1/sandbox_pb.js";
import type {
  BackendName,
  CallStatus,
  ExecutionPage,
  ExecutionRecord,
  ExecutionResult,
  ExecutionStatus,
  Limits,
  SessionInfo,
  SessionState,
  ToolCall,
  Violation,
  ViolationAction,
  ViolationEvidence,
} from "./types.js";

const EXECUTION_STATUS: Record<number, ExecutionStatus> = {
  [pb.ExecutionStatus.OK]: "ok",
  [pb.ExecutionStatus.ERROR]: "error",
  [pb.ExecutionStatus.LIMIT_EXCEEDED]: "limit_exceeded",
  [pb.ExecutionStatus.REJECTED]: "rejected",
  [pb.ExecutionStatus.CANCELLED]: "cancelled",
  [pb.ExecutionStatus.INTERRUPTED]: "interrupted",
  [pb.ExecutionStatus.FAILED]: "failed",
};

export const STATUS_TO_PROTO: Record<
  Exclude<ExecutionStatus, "unspecified">,
  pb.ExecutionStatus
> = {
  ok: pb.ExecutionStatus.OK,
  error: pb.ExecutionStatus.ERROR,
  limit_exceeded: pb.ExecutionStatus.LIMIT_EXCEEDED,
  rejected: pb.ExecutionStatus.REJECTED,
  cancelled: pb.ExecutionStatus.CANCELLED,
  interrupted: pb.ExecutionStatus.INTERRUPTED,
  failed: pb.ExecutionStatus.FAILED,
};

const CALL_STATUS: Record<number, CallStatus> = {
  [pb.CallStatus.OK]: "ok",
  [pb.CallStatus.ERROR]: "error",
  [pb.CallStatus.INVALID_ARGUMENTS]: "invalid_arguments",
  [pb.CallStatus.REFUSED]: "refused",
  [pb.CallStatus.DENIED]: "denied",
  [pb.CallStatus.CANCELLED]: "cancelled",
};

const ACTION: Record<number, ViolationAction> = {
  [pb.ViolationAction.KILLED]: "killed",
  [pb.ViolationAction.TRUNCATED]: "truncated",
  [pb.ViolationAction.REFUSED]: "refused",
  [pb.ViolationAction.REPORTED]: "reported",
  [pb.ViolationAction.INTERRUPTED]: "interrupted",
};

const EVIDENCE: Record<number, ViolationEvidence> = {
  [pb.ViolationEvidence.KERNEL]: "kernel",
  [pb.ViolationEvidence.HOST]: "host",
  [pb.ViolationEvidence.GUEST]: "guest",
};

const BACKEND: Record<number, BackendName> = {
  [pb.Backend.PROCESS]: "process",
  [pb.Backend.DOCKER]: "docker",
  [pb.Backend.GVISOR]: "gvisor",
};

export const BACKEND_TO_PROTO: Record<BackendName, pb.Backend> = {
  process: pb.Backend.PROCESS,
  docker: pb.Backend.DOCKER,
  gvisor: pb.Backend.GVISOR,
};

const SESSION_STATE: Record<number, SessionState> = {
  [pb.SessionState.ACTIVE]: "active",
  [pb.SessionState.CLOSED]: "closed",
  [pb.SessionState.EXPIRED]: "expired",
  [pb.SessionState.LOST]: "lost",
};

const LIMIT_FIELDS = [
  "wallTimeMs",
  "cpuTimeMs",
  "memoryBytes",
  "processes",
  "stdoutBytes",
  "stderrBytes",
  "fileSizeBytes",
  "maxToolCalls",
  "openFiles",
  "callLogBytes",
  "inputFiles",
  "inputBytes",
  "outputFiles",
  "outputFileBytes",
  "outputBytes",
] as const satisfies readonly (keyof Limits)[];

/** The proto Limits for `limits`; each value must be a non-negative integer. */
export function limitsToProto(limits: Limits, where = "limits"): pb.Limits {
  const message = create(pb.LimitsSchema);
  for (const [name, value] of Object.entries(limits)) {
    if (value === undefined) continue;
    if (!(LIMIT_FIELDS as readonly string[]).includes(name)) {
      throw new PtcError(
        "invalid_argument",
        `${where}.${name}: not a limit (known: ${LIMIT_FIELDS.join(", ")})`,
      );
    }
    if (typeof value !== "number" || !Number.isSafeInteger(value) || value < 0) {
      throw new PtcError(
        "invalid_argument",
        `${where}.${name}: a non-negative integer, got ${JSON.stringify(value)}`,
      );
    }
    message[name as (typeof LIMIT_FIELDS)[number]] = BigInt(value);
  }
  return message;
}

export function limitsFromProto(message: pb.Limits | undefined): Limits {
  const limits: Limits = {};
  if (message === undefined) return limits;
  for (const name of LIMIT_FIELDS) {
    const value = message[name];
    if (value !== undefined) limits[name] = Number(value);
  }
  return limits;
}

function parseJson(text: string): unknown {
  if (text === "") return undefined;
  try {
    return JSON.parse(text) as unknown;
  } catch {
    return text; // kept as text: a marker the call log put in place of a result too large
  }
}

function millis(timestamp: Timestamp | undefined): number {
  if (timestamp === undefined) return 0;
  return Number(timestamp.seconds) * 1000 + Math.floor(timestamp.nanos / 1e6);
}

function callFromProto(call: pb.CallRecord): ToolCall {
  return {
    seq: Number(call.seq),
    tool: call.tool,
    arguments: parseJson(call.argumentsJson),
    argumentsJson: call.argumentsJson,
    status: CALL_STATUS[call.status] ?? "unspecified",
    result: parseJson(call.resultJson),
    resultJson: call.resultJson,
    error: call.error,
    startOffsetUs: Number(call.startOffsetUs),
    durationUs: Number(call.durationUs),
    idempotencyKey: call.idempotencyKey,
  };
}

function violationFromProto(violation: pb.Violation): Violation {
  return {
    limit: violation.limit,
    limitValue: violation.limitValue,
    observed: violation.observed,
    unit: violation.unit,
    action: ACTION[violation.action] ?? "unspecified",
    detail: violation.detail,
    evidence: EVIDENCE[violation.evidence] ?? "unspecified",
  };
}

export function resultFromProto(message: pb.ExecutionResult): ExecutionResult {
  const usage = message.usage;
  return {
    executionId: message.executionId,
    status: EXECUTION_STATUS[message.status] ?? "unspecified",
    exitCode: message.exitCode,
    stdout: message.stdout,
    stderr: message.stderr,
    calls: message.calls.map(callFromProto),
    violations: message.violations.map(violationFromProto),
    usage: {
      wallTimeMs: Number(usage?.wallTimeMs ?? 0n),
      cpuTimeMs: Number(usage?.cpuTimeMs ?? 0n),
      peakMemoryBytes: Number(usage?.peakMemoryBytes ?? 0n),
      stdoutBytes: Number(usage?.stdoutBytes ?? 0n),
      stderrBytes: Number(usage?.stderrBytes ?? 0n),
      toolCalls: Number(usage?.toolCalls ?? 0n),
    },
    error:
      message.error === undefined
        ? undefined
        : { type: message.error.type, message: message.error.message, line: message.error.line },
    backend: BACKEND[message.backend] ?? "unspecified",
    isolation: [...message.isolation],
    effectiveLimits: limitsFromProto(message.effectiveLimits),
    adjustments: message.adjustments.map((a) => ({
      limit: a.limit,
      requested: a.requested,
      applied: a.applied,
      action: a.action,
    })),
    startedAtMs: millis(message.startedAt),
    finishedAtMs: millis(message.finishedAt),
    sessionId: message.sessionId,
    value: message.value,
    sessionLost: message.sessionLost,
    inputFiles: message.inputFiles.map((f) => ({
      name: f.name,
      sizeBytes: Number(f.sizeBytes),
      sha256: f.sha256,
    })),
    outputFiles: message.outputFiles.map((f) => ({
      name: f.name,
      sizeBytes: Number(f.sizeBytes),
      sha256: f.sha256,
      content: f.content,
    })),
    omittedOutputs: message.omittedOutputs.map((o) => ({
      name: o.name,
      reason: o.reason,
      sizeBytes: o.sizeBytes === undefined ? undefined : Number(o.sizeBytes),
      limitValue: o.limitValue === undefined ? undefined : Number(o.limitValue),
      detail: o.detail,
    })),
  };
}

export function recordFromProto(message: pb.ExecutionRecord): ExecutionRecord {
  return {
    result: resultFromProto(message.result ?? create(pb.ExecutionResultSchema)),
    tenant: message.tenant,
    script: message.script,
    scriptSha256: message.scriptSha256,
    manifestSha256: message.manifestSha256,
    prevHash: message.prevHash,
    recordHash: message.recordHash,
    labels: { ...message.labels },
    replayOf: message.replayOf,
    runtime: message.runtime,
    idempotencyKey: message.idempotencyKey,
    interruptedReason: message.interruptedReason,
  };
}

export function pageFromProto(message: pb.ListExecutionsResponse): ExecutionPage {
  return { records: message.records.map(recordFromProto), nextPageToken: message.nextPageToken };
}

export function sessionFromProto(message: pb.SessionInfo): SessionInfo {
  return {
    sessionId: message.sessionId,
    state: SESSION_STATE[message.state] ?? "unspecified",
    endReason: message.endReason,
    backend: BACKEND[message.backend] ?? "unspecified",
    limits: limitsFromProto(message.limits),
    idleTimeoutMs: Number(message.idleTimeoutMs),
    maxLifetimeMs: Number(message.maxLifetimeMs),
    maxExecutions: Number(message.maxExecutions),
    executionIds: [...message.executionIds],
    runningExecutionId: message.runningExecutionId,
    createdAtMs: millis(message.createdAt),
    lastUsedAtMs: millis(message.lastUsedAt),
    endedAtMs: millis(message.endedAt),
    isolation: [...message.isolation],
    runtime: message.runtime,
  };
}
