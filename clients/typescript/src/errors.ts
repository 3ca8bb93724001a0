/**
 * The one error hierarchy of the TypeScript SDK: what a failed *call* raises.
 *
 * A script that fails or breaks a limit is a result (`ExecutionResult.status`), never one of
 * these; these are failures of a request or of the service, as in the Python SDK
 * (`sandbox/errors.py`). A caller switches on `PtcError.code` and never parses a message:
 *
 *     PtcError (code: PtcErrorCode, grpcCode: number)
 *     ├── SessionLostError        code "session_lost"; `reason`, `sessionId`
 *     ├── RateLimitedError        code "rate_limited"; `retryAfterMs` (the server's hint)
 *     └── MessageTooLargeError    code "message_too_large"; `direction`, `side`, `limitBytes`,
 *                                 `sizeBytes`
 *
 * The cases the server only tells apart by status and message (its Python interceptor sends
 * the class's status and a message that starts with the field at fault) are recognised here,
 * in one place, so that the rest of the SDK and its users see codes: "session_lost" (a
 * FAILED_PRECONDITION or NOT_FOUND whose message starts with `session_lost:`),
 * "idempotency_key_reused" (FAILED_PRECONDITION naming `idempotency_key` and "already used"),
 * "draining" (UNAVAILABLE or FAILED_PRECONDITION from a server that is stopping),
 * "rate_limited" (RESOURCE_EXHAUSTED from the server's admission: its rate, queue or session
 * maximum, with the `retry-after` trailer in seconds when it gave one), "message_too_large"
 * (RESOURCE_EXHAUSTED for a message over a size cap: the client's own readMaxBytes or
 * writeMaxBytes, a status without `grpc-status`; or grpc's "Received/Sent message larger than
 * max (size vs. cap)" from the server). The two share a gRPC status but not a remedy: a rate
 * limit passes if the caller waits, a size cap never does, so they must not share a code.
 */

import { Code, ConnectError } from "@connectrpc/connect";

/** What a caller switches on. Every gRPC status has one, plus the SDK's own cases. */
export type PtcErrorCode =
  | "deadline_exceeded" // the call's `deadlineMs` passed (not a script's wall_time limit)
  | "aborted_by_signal" // the caller's AbortSignal fired
  | "cancelled" // the server or a peer cancelled the call
  | "session_lost" // the session ended (lost, closed or expired); see `reason`
  | "idempotency_key_reused" // the key was used before for another script or manifest
  | "rate_limited" // quota, rate or queue full; see `retryAfterMs`
  | "message_too_large" // a request or response over a size cap; see `MessageTooLargeError`
  | "unauthenticated" // missing or unknown API key
  | "permission_denied" // the tenant may not do this
  | "draining" // the server is shutting down: retry on another instance
  | "invalid_argument" // bad script, manifest, limits or field: the message names it
  | "failed_precondition" // the request is valid but what it names cannot serve it
  | "not_found" // no such execution or session for this tenant
  | "unavailable" // no server answered, or it refused for now
  | "transport_unavailable" // no transport in this runtime: pass `transport`
  | "protocol" // the server's answer is not the gRPC protocol (garbage, cut frames)
  | "internal"; // a failure of the service itself (or an unknown status)

/** gRPC status codes, numbered as on the wire (`grpc-status`). */
export const GrpcCode = {
  OK: 0,
  CANCELLED: 1,
  UNKNOWN: 2,
  INVALID_ARGUMENT: 3,
  DEADLINE_EXCEEDED: 4,
  NOT_FOUND: 5,
  ALREADY_EXISTS: 6,
  PERMISSION_DENIED: 7,
  RESOURCE_EXHAUSTED: 8,
  FAILED_PRECONDITION: 9,
  ABORTED: 10,
  OUT_OF_RANGE: 11,
  UNIMPLEMENTED: 12,
  INTERNAL: 13,
  UNAVAILABLE: 14,
  DATA_LOSS: 15,
  UNAUTHENTICATED: 16,
} as const;

export interface PtcErrorOptions {
  grpcCode?: number;
  cause?: unknown;
}

/** Base of every error the SDK raises on purpose. `message` is the server's, unchanged. */
export class PtcError extends Error {
  readonly code: PtcErrorCode;
  /** The gRPC status the server (or the transport) ended the call with; 2 (UNKNOWN) for the
   * SDK's own cases that had no status. */
  readonly grpcCode: number;
  /** Set when retries ran out with the outcome unknown: ask again with this key. */
  idempotencyKey: string | undefined;
  /** How many attempts were made, when the call retried. */
  attempts: number | undefined;

  constructor(code: PtcErrorCode, message: string, options: PtcErrorOptions = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.name = "PtcError";
    this.code = code;
    this.grpcCode = options.grpcCode ?? GrpcCode.UNKNOWN;
  }
}

/** The session named by the call has ended; `reason` is the server's why (e.g. "memory: ..."). */
export class SessionLostError extends PtcError {
  readonly reason: string;
  readonly sessionId: string;

  constructor(message: string, sessionId: string, reason: string, options: PtcErrorOptions = {}) {
    super("session_lost", message, options);
    this.name = "SessionLostError";
    this.sessionId = sessionId;
    this.reason = reason;
  }
}

/** RESOURCE_EXHAUSTED: retry after `retryAfterMs` when the server gave a hint. */
export class RateLimitedError extends PtcError {
  readonly retryAfterMs: number | undefined;

  constructor(message: string, retryAfterMs: number | undefined, options: PtcErrorOptions = {}) {
    super("rate_limited", message, options);
    this.name = "RateLimitedError";
    this.retryAfterMs = retryAfterMs;
  }
}

/** Which message was over its cap and who refused it, with the sizes where they were said. */
export interface MessageTooLargeDetails {
  /** "request": what the caller sent; "response": what the server answered. */
  direction: "request" | "response";
  /** "client": this SDK's readMaxBytes / writeMaxBytes; "server": the server's gRPC limit. */
  side: "client" | "server";
  /** The cap, in bytes. */
  limitBytes: number | undefined;
  /** The message's size, in bytes, when known (a cut read does not always know it). */
  sizeBytes: number | undefined;
}

/**
 * RESOURCE_EXHAUSTED for a message over a size cap: retrying the same call fails the same way.
 * Raise the client's `readMaxBytes` (or ask for less output) for a response; send less for a
 * request.
 */
export class MessageTooLargeError extends PtcError {
  readonly direction: MessageTooLargeDetails["direction"];
  readonly side: MessageTooLargeDetails["side"];
  readonly limitBytes: number | undefined;
  readonly sizeBytes: number | undefined;

  constructor(text: string, details: MessageTooLargeDetails, options: PtcErrorOptions = {}) {
    super("message_too_large", text, options);
    this.name = "MessageTooLargeError";
    this.direction = details.direction;
    this.side = details.side;
    this.limitBytes = details.limitBytes;
    this.sizeBytes = details.sizeBytes;
  }
}

const BY_STATUS: Record<number, PtcErrorCode> = {
  [GrpcCode.CANCELLED]: "cancelled",
  [GrpcCode.INVALID_ARGUMENT]: "invalid_argument",
  [GrpcCode.DEADLINE_EXCEEDED]: "deadline_exceeded",
  [GrpcCode.NOT_FOUND]: "not_found",
  [GrpcCode.PERMISSION_DENIED]: "permission_denied",
  [GrpcCode.FAILED_PRECONDITION]: "failed_precondition",
  [GrpcCode.UNAVAILABLE]: "unavailable",
  [GrpcCode.UNAUTHENTICATED]: "unauthenticated",
  [GrpcCode.OUT_OF_RANGE]: "invalid_argument",
};

// `session_lost: session 's-…' is lost: memory: …` (sandbox/sessions/session.py gone_error),
// or `session_lost: session 's-…' is ending: the server that holds it is shutting down`.
const SESSION_LOST = /^session_lost: session '([^']*)' is (\w+): ?(.*)$/s;
// sandbox/server/fleet.py DRAINING_MESSAGE and sandbox/sessions/manager.py's refusal.
const DRAINING = [/^the server is shutting down/, /^sessions: the server is stopping/];

// grpc core's refusal of a message over the server's max_receive/max_send_message_length:
// `SERVER: Received message larger than max (5242990 vs. 4194304)` (size vs. cap).
const GRPC_TOO_LARGE = /(Received|Sent) message larger than max \((\d+) vs\. (\d+)\)/;
// connect's (and `transport/unary.ts`'s) own refusal, before anything reached the server or
// after a response's prefix declared too much: `message size [N ]is larger than configured
// readMaxBytes M` (or writeMaxBytes).
const CLIENT_TOO_LARGE =
  /message size (?:(\d+) )?is larger than configured (read|write)MaxBytes (\d+)/;

/**
 * The error of this hierarchy for a status the server sent: its code, message and trailers.
 * `retryAfter` is the `retry-after` trailer (seconds as text), when sent.
 */
export function errorFromStatus(
  grpcCode: number,
  message: string,
  retryAfter: string | null = null,
  cause?: unknown,
): PtcError {
  const options = { grpcCode, cause };
  if (grpcCode === GrpcCode.RESOURCE_EXHAUSTED) {
    const tooLarge = GRPC_TOO_LARGE.exec(message);
    if (tooLarge !== null) {
      const [, verb = "", size = "", limit = ""] = tooLarge;
      // The server received our request, or could not send its response.
      const direction = verb === "Received" ? "request" : "response";
      return new MessageTooLargeError(
        message,
        { direction, side: "server", limitBytes: Number(limit), sizeBytes: Number(size) },
        options,
      );
    }
    const seconds = retryAfter === null ? Number.NaN : Number(retryAfter);
    const hint = Number.isFinite(seconds) && seconds >= 0 ? Math.round(seconds * 1000) : undefined;
    return new RateLimitedError(message, hint, options);
  }
  if (grpcCode === GrpcCode.FAILED_PRECONDITION || grpcCode === GrpcCode.NOT_FOUND) {
    const lost = SESSION_LOST.exec(message);
    if (lost !== null) {
      const [, sessionId = "", state = "", why = ""] = lost;
      return new SessionLostError(
        message,
        sessionId,
        state === "lost" ? why : `${state}: ${why}`,
        options,
      );
    }
  }
  if (
    grpcCode === GrpcCode.FAILED_PRECONDITION &&
    /^idempotency_key: .* was already used/s.test(message)
  ) {
    return new PtcError("idempotency_key_reused", message, options);
  }
  if (
    (grpcCode === GrpcCode.UNAVAILABLE || grpcCode === GrpcCode.FAILED_PRECONDITION) &&
    DRAINING.some((pattern) => pattern.test(message))
  ) {
    return new PtcError("draining", message, options);
  }
  return new PtcError(BY_STATUS[grpcCode] ?? "internal", message, options);
}

// What connect-node says when the bytes it read are not the gRPC protocol: a response without
// a gRPC content type or status, a frame it could not parse or that was cut.
const PROTOCOL =
  /unexpected content-type|invalid content-type|missing (?:trailer|grpc-status)|protocol error|premature end|incomplete|unexpected end|invalid grpc-status|HTTP status \d+|ERR_HTTP2_(?:ERROR|PROTOCOL_ERROR|INVALID|STREAM_ERROR|SESSION_ERROR)|protocol/i;

// An HTTP/2 stream reset that refused the call, as Node words it (`Stream closed with error code
// NGHTTP2_REFUSED_STREAM`) and as connect and `transport/unary.ts` do (`http/2 stream closed
// with error code ENHANCE_YOUR_CALM (0xb)`).
const REFUSED = /stream closed with error code (?:NGHTTP2_)?(REFUSED_STREAM|ENHANCE_YOUR_CALM)/i;

/**
 * A stream reset with REFUSED_STREAM (the server did not take the call: RFC 9113, 8.7) or
 * ENHANCE_YOUR_CALM (the server, or Node on this side refusing the server's answer while the
 * connection was over its `maxSessionMemory`, after the server may have run the call), as
 * "unavailable": the call was refused for now, the policy sends it again (an `execute` with the
 * same idempotency key, which returns the first run's result rather than running it twice).
 * Without this, connect's codes made the one "protocol" and the other "message_too_large".
 */
function refusedStream(name: string, message: string, cause: ConnectError): PtcError {
  const what =
    name.toUpperCase() === "REFUSED_STREAM"
      ? "the server refused the HTTP/2 stream (REFUSED_STREAM) before taking the call"
      : "the HTTP/2 stream was reset with ENHANCE_YOUR_CALM (by the server, or by this " +
        "client's HTTP/2 layer refusing the server's answer over its maxSessionMemory): the " +
        "call may have run";
  return new PtcError("unavailable", `${what}: ${message}`, {
    grpcCode: GrpcCode.UNAVAILABLE,
    cause,
  });
}

/**
 * Any failure of a call, as a `PtcError`: the caller's own signal first (`aborted_by_signal`),
 * then a status the server sent, then what the transport saw.
 */
export function toPtcError(error: unknown, signal?: AbortSignal): PtcError {
  if (error instanceof PtcError) return error;
  if (signal?.aborted) {
    return new PtcError(
      "aborted_by_signal",
      `the call was aborted by its AbortSignal: ${reasonText(signal.reason)}`,
      {
        grpcCode: GrpcCode.CANCELLED,
        cause: error,
      },
    );
  }
  if (error instanceof ConnectError) {
    const message = error.rawMessage;
    if (error.code === Code.DeadlineExceeded) {
      return new PtcError("deadline_exceeded", message || "the call's deadline passed", {
        grpcCode: GrpcCode.DEADLINE_EXCEEDED,
        cause: error,
      });
    }
    // A status the server sent comes with its `grpc-status`; without one the failure is the
    // connection's (refused, reset, a TLS handshake that failed: "unavailable", as grpcio says)
    // or the bytes were not gRPC ("protocol").
    if (!error.metadata.has("grpc-status")) {
      const text = `${message} ${causeText(error)}`;
      const refused = REFUSED.exec(text);
      if (refused !== null) return refusedStream(refused[1] ?? "", message, error);
      if (PROTOCOL.test(text)) {
        return new PtcError("protocol", `the server's answer is not gRPC: ${message}`, {
          grpcCode: error.code,
          cause: error,
        });
      }
      // RESOURCE_EXHAUSTED without a status is the client's own size cap: a rate limit only
      // ever comes from the server, with its status.
      if (error.code === Code.ResourceExhausted) return clientTooLarge(message, error);
      if (error.code === Code.Canceled || error.code === Code.Unavailable) {
        return new PtcError("unavailable", `the connection failed: ${message}`, {
          grpcCode: GrpcCode.UNAVAILABLE,
          cause: error,
        });
      }
    }
    return errorFromStatus(error.code, message, error.metadata.get("retry-after"), error);
  }
  const text = error instanceof Error ? error.message : String(error);
  return new PtcError("internal", text, { grpcCode: GrpcCode.UNKNOWN, cause: error });
}

function clientTooLarge(message: string, cause: ConnectError): MessageTooLargeError {
  const match = CLIENT_TOO_LARGE.exec(message);
  const [, size, which, limit] = match ?? [];
  return new MessageTooLargeError(
    message,
    {
      direction: which === "write" ? "request" : "response",
      side: "client",
      limitBytes: limit === undefined ? undefined : Number(limit),
      sizeBytes: size === undefined ? undefined : Number(size),
    },
    { grpcCode: GrpcCode.RESOURCE_EXHAUSTED, cause },
  );
}

function causeText(error: Error): string {
  const cause = error.cause;
  return cause instanceof Error
    ? `${cause.message} ${(cause as { code?: unknown }).code ?? ""}`
    : "";
}

function reasonText(reason: unknown): string {
  if (reason instanceof Error) return reason.message;
  return String(reason);
}
