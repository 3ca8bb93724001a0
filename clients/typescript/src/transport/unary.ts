/**
 * The Node transport's unary calls, made here over `node:http2` rather than by connect-node's
 * gRPC transport. Why: measured against a hand-made gRPC call on the same HTTP/2 connection
 * (`bench/bare_grpc.ts`), connect-node spent about 0.5 ms of JavaScript per unary call
 * (ListSessions p50 1.1 ms against 0.63 ms bare; `node --cpu-prof`: its async-iterable pipes
 * and envelope transforms, a linked AbortController and a DOMException per call, `Headers`
 * objects), which put the SDK's unary overhead far above the Python SDK's, whose grpcio client
 * costs about what the bare call does. A unary gRPC call is one length-prefixed message each
 * way and a status in the trailers: small enough to own.
 *
 * What does not change:
 * - the connection: the stream comes from connect-node's session manager, the one the
 *   bidirectional `ExecuteStream` (still connect's) uses, with its reconnects and TLS;
 * - the wire: the request headers connect sends (`content-type`, `te: trailers`,
 *   `grpc-timeout` for a deadline, the caller's headers such as `authorization`);
 * - the errors, which `toPtcError` reads: a status the server sent is parsed by connect's own
 *   `findTrailerError` (status, message, `grpc-status-details-bin`, the trailers as metadata,
 *   so `retry-after` still reaches a `RateLimitedError`), and a failure of the connection or
 *   of the bytes is a `ConnectError` with the code and the cause connect-node gives it (a
 *   reset by its HTTP/2 code, a Node error by its `code`, a cut message as
 *   "protocol error: incomplete envelope"), so that "protocol", "unavailable" and the retry
 *   policy's outcome-unknown cases are told apart as before;
 * - the deadline (`deadline_exceeded` when it passes, the stream cancelled) and the caller's
 *   `AbortSignal` (the stream cancelled at once, the call rejected).
 */

import type { ClientHttp2Stream, IncomingHttpHeaders, OutgoingHttpHeaders } from "node:http2";
import type { DescMethodUnary } from "@bufbuild/protobuf";
import {
  create,
  type DescMessage,
  fromBinary,
  isMessage,
  type MessageInitShape,
  type MessageShape,
  toBinary,
} from "@bufbuild/protobuf";
import { Code, ConnectError, type Transport, type UnaryResponse } from "@connectrpc/connect";
import { codeFromHttpStatus, findTrailerError } from "@connectrpc/connect/protocol-grpc";
import type { GrpcTransportOptions } from "@connectrpc/connect-node";
import type { WriteBudget } from "./budget.js";
import { writeInPieces } from "./pieces.js";

type SessionManager = NonNullable<GrpcTransportOptions["sessionManager"]>;

/** What a unary call needs from its transport. */
export interface UnaryOptions {
  sessionManager: SessionManager;
  /** Largest response message, in bytes. */
  readMaxBytes: number;
  /** What the connection's streams may have handed Node unwritten (`budget.ts`). */
  budget: WriteBudget;
}

const NGHTTP2_CANCEL = 0x8;
const NGHTTP2_INTERNAL_ERROR = 0x2;
const USER_AGENT = "ptc-sandbox-ts";
/** The largest value `grpc-timeout` carries (8 digits). */
const MAX_TIMEOUT = 99_999_999;

/** connect's `Transport.unary`, over the session manager's HTTP/2 streams. */
export function createUnary(options: UnaryOptions): Transport["unary"] {
  return <I extends DescMessage, O extends DescMessage>(
    method: DescMethodUnary<I, O>,
    signal: AbortSignal | undefined,
    timeoutMs: number | undefined,
    header: ConstructorParameters<typeof Headers>[0],
    input: MessageInitShape<I>,
  ): Promise<UnaryResponse<I, O>> => {
    const message = isMessage(input, method.input) ? input : create(method.input, input);
    const body = toBinary(method.input, message as MessageShape<I>);
    const frame = new Uint8Array(5 + body.byteLength);
    new DataView(frame.buffer).setUint32(1, body.byteLength);
    frame.set(body, 5);
    const deadline = timeoutMs !== undefined && timeoutMs > 0 ? timeoutMs : undefined;
    const path = `/${method.parent.typeName}/${method.name}`;
    return new Call(options, signal, deadline)
      .run(path, requestHeaders(header, deadline), frame, (bytes) =>
        fromBinary(method.output, bytes),
      )
      .then((done) => ({
        stream: false as const,
        service: method.parent,
        method,
        get header() {
          return done.header;
        },
        message: done.message,
        get trailer() {
          return done.trailer;
        },
      }));
  };
}

function requestHeaders(
  header: ConstructorParameters<typeof Headers>[0],
  timeoutMs: number | undefined,
) {
  const out: OutgoingHttpHeaders = {};
  if (header !== undefined) {
    const entries =
      header instanceof Headers || Array.isArray(header)
        ? [...(header instanceof Headers ? header.entries() : header)]
        : Object.entries(header);
    for (const [key, value] of entries) {
      out[key.toLowerCase()] =
        typeof value === "string" ? value : [...(value as string[])].join(", ");
    }
  }
  out["content-type"] = "application/grpc+proto";
  out["user-agent"] ??= USER_AGENT;
  out.te = "trailers";
  if (timeoutMs !== undefined) {
    out["grpc-timeout"] = `${Math.min(Math.ceil(timeoutMs), MAX_TIMEOUT)}m`;
  }
  return out;
}

/** The HTTP/2 headers (or trailers) without pseudo-headers, as connect's `Headers`. */
function webHeaders(node: IncomingHttpHeaders | undefined): Headers {
  const out = new Headers();
  if (node === undefined) return out;
  for (const [key, value] of Object.entries(node)) {
    if (key.startsWith(":") || value === undefined) continue;
    if (Array.isArray(value)) for (const v of value) out.append(key, v);
    else out.set(key, String(value));
  }
  return out;
}

/** A Node error (or its causes) as connect-node codes it: the same code, the error as cause. */
function fromNodeError(reason: unknown): ConnectError {
  if (reason instanceof ConnectError) return reason;
  const codes = new Set<string>();
  for (let e: unknown = reason; e instanceof Error && codes.size < 8; e = e.cause) {
    const code = (e as { code?: unknown }).code;
    if (typeof code === "string") codes.add(code);
    if (e.cause === e) break;
  }
  const has = (...names: string[]) => names.some((n) => codes.has(n));
  let code = Code.Internal;
  if (has("ERR_STREAM_WRITE_AFTER_END", "ERR_STREAM_DESTROYED", "ERR_HTTP2_INVALID_STREAM"))
    code = Code.Aborted;
  else if (has("ECONNRESET")) code = Code.Aborted;
  else if (has("ETIMEDOUT", "ENOTFOUND", "EAI_AGAIN", "ECONNREFUSED")) code = Code.Unavailable;
  const error = ConnectError.from(reason, code);
  if (error !== reason) error.cause = reason;
  return error;
}

/** The HTTP/2 error codes (RFC 9113, section 7), by number. */
const H2_ERRORS = (
  "NO_ERROR PROTOCOL_ERROR INTERNAL_ERROR FLOW_CONTROL_ERROR SETTINGS_TIMEOUT STREAM_CLOSED " +
  "FRAME_SIZE_ERROR REFUSED_STREAM CANCEL COMPRESSION_ERROR CONNECT_ERROR ENHANCE_YOUR_CALM " +
  "INADEQUATE_SECURITY HTTP_1_1_REQUIRED"
).split(" ");

/** A stream that ended with an HTTP/2 reset, coded as connect-node codes one (none for
 * NO_ERROR and STREAM_CLOSED, nor for a code it does not know). */
function fromResetCode(rstCode: number): ConnectError | undefined {
  const name = H2_ERRORS[rstCode];
  if (name === undefined || rstCode === 0 || rstCode === 5) return undefined;
  const code =
    rstCode === 7
      ? Code.Unavailable
      : rstCode === 8
        ? Code.Canceled
        : rstCode === 11
          ? Code.ResourceExhausted
          : rstCode >= 12
            ? Code.PermissionDenied
            : Code.Internal;
  return new ConnectError(
    `http/2 stream closed with error code ${name} (0x${rstCode.toString(16)})`,
    code,
  );
}

interface Done<T> {
  header: Headers;
  message: T;
  trailer: Headers;
}

/** One unary call: settles once, with the first of its answer, its failure, the deadline or
 * the signal; whatever settles it also ends the stream and drops its timer and listener. */
class Call {
  private settled = false;
  private stream: ClientHttp2Stream | undefined;
  private timer: ReturnType<typeof setTimeout> | undefined;
  private onAbort: (() => void) | undefined;
  private reject: (error: ConnectError) => void = () => undefined;

  constructor(
    private readonly options: UnaryOptions,
    private readonly signal: AbortSignal | undefined,
    private readonly timeoutMs: number | undefined,
  ) {}

  run<T>(
    path: string,
    headers: OutgoingHttpHeaders,
    frame: Uint8Array,
    parse: (bytes: Uint8Array) => T,
  ): Promise<Done<T>> {
    return new Promise<Done<T>>((resolve, reject) => {
      this.reject = reject;
      const signal = this.signal;
      if (signal !== undefined) {
        if (signal.aborted) return this.fail(ConnectError.from(signal.reason, Code.Canceled));
        this.onAbort = () => this.fail(ConnectError.from(signal.reason, Code.Canceled));
        signal.addEventListener("abort", this.onAbort, { once: true });
      }
      if (this.timeoutMs !== undefined) {
        this.timer = setTimeout(
          () => this.fail(new ConnectError("the operation timed out", Code.DeadlineExceeded)),
          this.timeoutMs,
        );
      }
      this.options.sessionManager.request("POST", path, headers, {}).then(
        (stream) => {
          if (this.settled) {
            stream.close(NGHTTP2_CANCEL);
            return;
          }
          this.stream = stream;
          this.exchange(stream, frame, parse, (done) => {
            if (this.finish()) resolve(done);
          });
        },
        (reason: unknown) => this.fail(fromNodeError(reason)),
      );
    });
  }

  private exchange<T>(
    stream: ClientHttp2Stream,
    frame: Uint8Array,
    parse: (bytes: Uint8Array) => T,
    resolve: (done: Done<T>) => void,
  ): void {
    const chunks: Buffer[] = [];
    let received = 0;
    let head: IncomingHttpHeaders | undefined;
    let tail: IncomingHttpHeaders | undefined;
    stream.on("response", (headers) => {
      head = headers;
      const status = Number(headers[":status"]);
      if (status !== 200) {
        this.fail(
          new ConnectError(`HTTP ${status}`, codeFromHttpStatus(status), webHeaders(headers)),
        );
        return;
      }
      const type = String(headers["content-type"] ?? "");
      if (!/^application\/grpc(?:\+proto)?(?:;.*)?$/i.test(type)) {
        this.fail(new ConnectError(`unsupported content type ${type}`, Code.Unknown));
        return;
      }
      const encoding = headers["grpc-encoding"];
      if (encoding !== undefined && String(encoding).toLowerCase() !== "identity") {
        this.fail(
          new ConnectError(
            `unsupported response encoding "${encoding}"`,
            Code.Internal,
            webHeaders(headers),
          ),
        );
      }
    });
    // The answer's one message declares its length in its 5-byte prefix: a message over
    // readMaxBytes is refused as soon as the prefix is in, naming its size (connect's wording,
    // which `errors.ts` reads back as "message_too_large").
    let declared: number | undefined;
    stream.on("data", (chunk: Buffer) => {
      received += chunk.byteLength;
      chunks.push(chunk);
      if (declared === undefined && received >= 5) {
        declared = Buffer.concat(chunks, received).readUInt32BE(1);
      }
      const max = this.options.readMaxBytes;
      if ((declared ?? 0) > max || received > max + 5) {
        const size = declared !== undefined && declared > max ? `${declared} ` : "";
        this.fail(
          new ConnectError(
            `message size ${size}is larger than configured readMaxBytes ${max}`,
            Code.ResourceExhausted,
          ),
        );
        return;
      }
      this.options.sessionManager.notifyResponseByteRead(stream);
    });
    stream.on("trailers", (trailers) => {
      tail = trailers;
    });
    stream.on("error", (error) => this.fail(fromNodeError(error)));
    // A whole answer (headers, then trailers) settles at its end; anything else waits for the
    // stream's close, whose reset code says what cut it (a connection refused by TLS, a reset).
    const settle = () => {
      let outcome: Done<T> | ConnectError;
      try {
        outcome = this.answer(Buffer.concat(chunks, received), head, tail, parse);
      } catch (error) {
        outcome = fromNodeError(error);
      }
      if (outcome instanceof ConnectError) this.fail(outcome);
      else resolve(outcome);
    };
    let ended = false;
    stream.on("end", () => {
      ended = true;
      if (!this.settled && head !== undefined && tail !== undefined) settle();
    });
    stream.on("close", () => {
      if (this.settled) return;
      const reset = fromResetCode(stream.rstCode ?? 0);
      if (reset !== undefined) this.fail(reset);
      else if (ended && head !== undefined) settle();
      else
        this.fail(
          new ConnectError("protocol error: the stream closed before its end", Code.Internal),
        );
    });
    // In pieces within the connection's budget (`pieces.ts`, `budget.ts`): whole, a large
    // message, or many at once, would leave the server's answers unread. The last piece ends
    // the request; a write that fails is the stream's end, which its own events settle.
    writeInPieces(
      stream,
      this.options.budget,
      (piece, done, last) => (last ? stream.end(piece, done) : stream.write(piece, done)),
      frame,
      () => undefined,
    );
  }

  /** The answer's message, or the error its status (else its bytes) makes of it. */
  private answer<T>(
    body: Buffer,
    head: IncomingHttpHeaders | undefined,
    tail: IncomingHttpHeaders | undefined,
    parse: (bytes: Uint8Array) => T,
  ): Done<T> | ConnectError {
    // A trailers-only answer (an error, mostly) carries its status in the headers.
    const statusFrom = tail ?? head;
    const ok =
      statusFrom?.["grpc-status"] === "0" && statusFrom["grpc-status-details-bin"] === undefined;
    if (!ok) {
      const header = webHeaders(head);
      const trailer = tail === undefined ? header : webHeaders(tail);
      const status = findTrailerError(trailer);
      if (status !== undefined) {
        if (trailer !== header) {
          header.forEach((value, key) => {
            status.metadata.append(key, value);
          });
        }
        return status;
      }
      if (!trailer.has("grpc-status")) {
        return new ConnectError("protocol error: missing status", Code.Internal);
      }
    }
    const messages: Uint8Array[] = [];
    for (let at = 0; at < body.byteLength; ) {
      if (body.byteLength - at < 5) {
        return new ConnectError("protocol error: incomplete envelope", Code.InvalidArgument);
      }
      const flags = body[at] ?? 0;
      const length = body.readUInt32BE(at + 1);
      if (body.byteLength - at - 5 < length) {
        return new ConnectError("protocol error: incomplete envelope", Code.InvalidArgument);
      }
      if (flags !== 0) {
        return new ConnectError(
          `protocol error: unexpected envelope flags ${flags} (no compression was asked for)`,
          Code.Internal,
        );
      }
      messages.push(body.subarray(at + 5, at + 5 + length));
      at += 5 + length;
    }
    if (messages.length > 1) {
      return new ConnectError(
        "protocol error: received extra output message for unary method",
        Code.Unimplemented,
      );
    }
    const only = messages[0];
    if (only === undefined) {
      return new ConnectError(
        "protocol error: missing output message for unary method",
        Code.Unimplemented,
      );
    }
    // The headers as `Headers` only when read (a caller's onHeader/onTrailer): most never are.
    return {
      get header() {
        return webHeaders(head);
      },
      message: parse(only),
      get trailer() {
        return webHeaders(tail);
      },
    };
  }

  /** Settles the call now; false when it was settled before. */
  private finish(): boolean {
    if (this.settled) return false;
    this.settled = true;
    clearTimeout(this.timer);
    if (this.onAbort !== undefined) this.signal?.removeEventListener("abort", this.onAbort);
    return true;
  }

  private fail(error: ConnectError): void {
    if (!this.finish()) return;
    const stream = this.stream;
    if (stream !== undefined && !stream.closed) {
      stream.close(
        error.code === Code.Canceled || error.code === Code.DeadlineExceeded
          ? NGHTTP2_CANCEL
          : NGHTTP2_INTERNAL_ERROR,
      );
    }
    this.reject(error);
  }
}
