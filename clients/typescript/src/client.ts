/**
 * `PtcClient`: the TypeScript client of the sandbox service, method for method the Python
 * SDK's (`sandbox/client/aio.py`).
 *
 *     const client = new PtcClient({ address: "http://127.0.0.1:50051", apiKey });
 *     const result = await client.execute("print(1)");
 *
 * Every call takes `deadlineMs` (the whole call, retries included) and `signal`; every failure
 * is a `PtcError` with a `code` (`errors.ts`). A script that fails or hits a limit is a result.
 * This module imports nothing from Node: without a `transport`, the Node transport
 * (`ptc-sandbox/node`) is loaded at the first call, and a runtime without it gets
 * "transport_unavailable" then, never at import.
 */

import { create } from "@bufbuild/protobuf";
import { timestampFromMs } from "@bufbuild/protobuf/wkt";
import { type Client, createClient, type Transport } from "@connectrpc/connect";
import {
  BACKEND_TO_PROTO,
  limitsToProto,
  pageFromProto,
  recordFromProto,
  resultFromProto,
  STATUS_TO_PROTO,
  sessionFromProto,
} from "./convert.js";
import { PtcError, toPtcError } from "./errors.js";
import * as pb from "./gen/ptc/sandbox/v1/sandbox_pb.js";
import { type KeepaliveOptions, resolveKeepalive } from "./keepalive.js";
import type {
  CallOptions,
  ExecuteOptions,
  GenerateStubsOptions,
  ListExecutionsOptions,
  StreamOptions,
  Tools,
} from "./options.js";
import {
  Deadline,
  newKey,
  type ResolvedRetryPolicy,
  type RetryPolicy,
  resolvePolicy,
  retrying,
} from "./retry.js";
import { Session, type SessionOptions } from "./sessions.js";
import { Execution } from "./stream.js";
import { buildManifest, type ClientTool } from "./tools.js";
import type {
  ExecutionPage,
  ExecutionRecord,
  ExecutionResult,
  SessionInfo,
  Stubs,
} from "./types.js";

/** TLS options for the default Node transport (see `ptc-sandbox/node`). */
export interface ClientTlsOptions {
  ca?: string | Uint8Array;
  cert?: string | Uint8Array;
  key?: string | Uint8Array;
  serverName?: string;
}

export interface PtcClientOptions {
  /** `http://host:port`, `https://host:port` or `host:port`. Needed unless `transport` is given. */
  address?: string;
  /** Sent as `authorization: Bearer <apiKey>`, as the Python SDK does. */
  apiKey?: string;
  tls?: ClientTlsOptions;
  /** A connect transport (e.g. `createNodeTransport` from `ptc-sandbox/node`). */
  transport?: Transport;
  retry?: RetryPolicy;
  /** Largest response message the client reads, in bytes (default 64 MiB; results carry
   * output files). A larger one fails as "message_too_large", never as "rate_limited". Not
   * used with `transport` (give it to `createNodeTransport` then). */
  readMaxBytes?: number;
  /** HTTP/2 keepalive pings of the default Node transport (`keepalive.ts`): by default a PING
   * after 20 s without data on a connection with calls in flight, the connection given up
   * (its calls failing "unavailable", saying the server stopped answering keepalive pings)
   * when not answered within 15 s. `false`: no pings. Not used with `transport`. */
  keepalive?: KeepaliveOptions | false;
}

type SandboxClient = Client<typeof pb.SandboxService>;

interface Connection {
  client: SandboxClient;
  close: () => void;
}

const NODE_TRANSPORT = "ptc-sandbox/node"; // a variable: bundlers leave the import alone

function transportUnavailable(cause?: unknown): PtcError {
  return new PtcError(
    "transport_unavailable",
    "no transport: this runtime has no Node HTTP/2 (node:http2), so the default transport " +
      "(ptc-sandbox/node) cannot load; pass `transport` to PtcClient (a connect Transport, e.g. " +
      "@connectrpc/connect-web's createGrpcWebTransport behind a gRPC-web proxy)",
    { cause },
  );
}

export class PtcClient {
  readonly retry: ResolvedRetryPolicy;
  private readonly options: PtcClientOptions;
  private readonly headers: Record<string, string>;
  private connection: Promise<Connection> | undefined;
  private closed = false;

  constructor(options: PtcClientOptions) {
    if (options.transport === undefined && !options.address) {
      throw new PtcError("invalid_argument", "PtcClient: give `address` or `transport`");
    }
    const max = options.readMaxBytes;
    if (max !== undefined && (!Number.isSafeInteger(max) || max < 1)) {
      throw new PtcError(
        "invalid_argument",
        `readMaxBytes: a whole number of bytes of at least 1, got ${max}`,
      );
    }
    resolveKeepalive(options.keepalive); // a bad value is refused here, not at the first call
    this.options = options;
    this.retry = resolvePolicy(options.retry);
    this.headers = options.apiKey ? { authorization: `Bearer ${options.apiKey}` } : {};
  }

  /** Ends the client's connection (one it made itself; a `transport` given is the caller's). */
  close(): void {
    this.closed = true;
    const connection = this.connection;
    this.connection = undefined;
    connection?.then(
      (c) => c.close(),
      () => undefined,
    );
  }

  private connect(): Promise<Connection> {
    if (this.closed) return Promise.reject(new PtcError("unavailable", "the client is closed"));
    this.connection ??= this.makeConnection();
    const made = this.connection;
    made.catch(() => {
      if (this.connection === made) this.connection = undefined; // the next call tries again
    });
    return made;
  }

  private async makeConnection(): Promise<Connection> {
    const given = this.options.transport;
    if (given !== undefined)
      return { client: createClient(pb.SandboxService, given), close: () => undefined };
    const runtime = (globalThis as { process?: { versions?: { node?: string } } }).process;
    if (typeof runtime?.versions?.node !== "string") throw transportUnavailable();
    let module: typeof import("./transport/node.js");
    try {
      module = (await import(NODE_TRANSPORT)) as typeof import("./transport/node.js");
    } catch (error) {
      throw transportUnavailable(error);
    }
    const transport = module.createNodeTransport({
      address: this.options.address ?? "",
      ...(this.options.tls === undefined ? {} : { tls: this.options.tls }),
      ...(this.options.readMaxBytes === undefined
        ? {}
        : { readMaxBytes: this.options.readMaxBytes }),
      ...(this.options.keepalive === undefined ? {} : { keepalive: this.options.keepalive }),
    });
    return { client: createClient(pb.SandboxService, transport), close: () => transport.close() };
  }

  /** One call, its failure a `PtcError`. */
  private async unary<T>(
    options: CallOptions,
    call: (client: SandboxClient, timeoutMs: number | undefined) => Promise<T>,
  ): Promise<T> {
    const deadline = new Deadline(options.deadlineMs);
    try {
      const { client } = await this.connect();
      return await call(client, deadline.remaining());
    } catch (error) {
      throw toPtcError(error, options.signal);
    }
  }

  private callOptions(timeoutMs: number | undefined, signal: AbortSignal | undefined) {
    return { headers: this.headers, timeoutMs, signal };
  }

  /**
   * Runs `script` to the end and returns its result. With client tools among `tools`, or an
   * `onApproval`, it runs over the stream (`stream`); otherwise the unary Execute. An attempt that fails with the
   * outcome unknown is made again with the same idempotency key (`retry.ts`).
   */
  async execute(script: string, options: StreamOptions = {}): Promise<ExecutionResult> {
    const { request, local } = executeRequest(script, options);
    const deadline = new Deadline(options.deadlineMs);
    return retrying(
      this.retry,
      request.idempotencyKey,
      deadline,
      options.signal,
      async (timeoutMs) => {
        if (local.size > 0 || options.onApproval !== undefined) {
          return this.openStream(request, local, timeoutMs, options).result;
        }
        try {
          const { client } = await this.connect();
          const message = await client.execute(
            request,
            this.callOptions(timeoutMs, options.signal),
          );
          return resultFromProto(message);
        } catch (error) {
          throw toPtcError(error, options.signal);
        }
      },
    );
  }

  /** Starts a streamed execution: iterate it for live events, await `.result` for the end. */
  stream(script: string, options: StreamOptions = {}): Execution {
    const { request, local } = executeRequest(script, options);
    const deadline = new Deadline(options.deadlineMs);
    return this.openStream(request, local, deadline.remaining(), options);
  }

  private openStream(
    request: pb.ExecuteRequest,
    local: ReadonlyMap<string, ClientTool>,
    timeoutMs: number | undefined,
    options: StreamOptions,
  ): Execution {
    return new Execution({
      client: this.connect().then((connection) => connection.client),
      request,
      local,
      headers: this.headers,
      timeoutMs,
      signal: options.signal,
      onApproval: options.onApproval,
    });
  }

  /** The stub module scripts import as `tools` for `manifest`, and its compact prompt form. */
  async generateStubs(manifest: Tools, options: GenerateStubsOptions = {}): Promise<Stubs> {
    const { json } = buildManifest(manifest);
    const request = create(pb.GenerateStubsRequestSchema, {
      manifest: create(pb.ToolManifestSchema, { json: json ?? "[]" }),
    });
    const response = await this.unary(options, (client, timeoutMs) =>
      client.generateStubs(request, this.callOptions(timeoutMs, options.signal)),
    );
    return {
      module: response.module,
      compact: response.compact,
      names: { ...response.names },
      warnings: [...response.warnings],
      manifestHash: response.manifestHash,
    };
  }

  /** The audit record of one of this tenant's executions. */
  async getExecution(executionId: string, options: CallOptions = {}): Promise<ExecutionRecord> {
    const request = create(pb.GetExecutionRequestSchema, { executionId });
    const record = await this.unary(options, (client, timeoutMs) =>
      client.getExecution(request, this.callOptions(timeoutMs, options.signal)),
    );
    return recordFromProto(record);
  }

  /** One page of this tenant's records, newest first; pass `nextPageToken` for the next. */
  async listExecutions(options: ListExecutionsOptions = {}): Promise<ExecutionPage> {
    const request = create(pb.ListExecutionsRequestSchema, {
      running: options.running ?? false,
      tool: options.tool ?? "",
      violation: options.violation ?? "",
      sessionId: options.sessionId ?? "",
      pageSize: options.pageSize ?? 0,
      pageToken: options.pageToken ?? "",
      status:
        options.status === undefined
          ? pb.ExecutionStatus.UNSPECIFIED
          : STATUS_TO_PROTO[options.status],
    });
    if (options.since !== undefined) request.since = timestampFromMs(Number(options.since));
    if (options.until !== undefined) request.until = timestampFromMs(Number(options.until));
    const response = await this.unary(options, (client, timeoutMs) =>
      client.listExecutions(request, this.callOptions(timeoutMs, options.signal)),
    );
    return pageFromProto(response);
  }

  /** Opens a session: one sandbox kept for many cells, with state between them. */
  async createSession(options: SessionOptions = {}): Promise<Session> {
    const { json } = buildManifest(options.tools);
    const request = create(pb.CreateSessionRequestSchema, {
      labels: options.labels ?? {},
      runtime: options.runtime ?? "",
      backend:
        options.backend === undefined ? pb.Backend.UNSPECIFIED : BACKEND_TO_PROTO[options.backend],
    });
    if (json !== undefined) request.manifest = create(pb.ToolManifestSchema, { json });
    if (options.limits !== undefined) request.limits = limitsToProto(options.limits);
    if (options.idleTimeoutMs !== undefined) request.idleTimeoutMs = BigInt(options.idleTimeoutMs);
    if (options.maxLifetimeMs !== undefined) request.maxLifetimeMs = BigInt(options.maxLifetimeMs);
    if (options.maxExecutions !== undefined) request.maxExecutions = BigInt(options.maxExecutions);
    const info = await this.unary(options, (client, timeoutMs) =>
      client.createSession(request, this.callOptions(timeoutMs, options.signal)),
    );
    return new Session(this, sessionFromProto(info));
  }

  /** A session of this tenant, open or ended (with why it ended). */
  async getSession(sessionId: string, options: CallOptions = {}): Promise<SessionInfo> {
    const request = create(pb.GetSessionRequestSchema, { sessionId });
    const info = await this.unary(options, (client, timeoutMs) =>
      client.getSession(request, this.callOptions(timeoutMs, options.signal)),
    );
    return sessionFromProto(info);
  }

  /** This tenant's open sessions (and the ended ones still remembered, with `includeEnded`). */
  async listSessions(
    options: CallOptions & { includeEnded?: boolean } = {},
  ): Promise<SessionInfo[]> {
    const request = create(pb.ListSessionsRequestSchema, {
      includeEnded: options.includeEnded ?? false,
    });
    const response = await this.unary(options, (client, timeoutMs) =>
      client.listSessions(request, this.callOptions(timeoutMs, options.signal)),
    );
    return response.sessions.map(sessionFromProto);
  }

  /** Ends a session and releases its sandbox. */
  async closeSession(sessionId: string, options: CallOptions = {}): Promise<SessionInfo> {
    const request = create(pb.CloseSessionRequestSchema, { sessionId });
    const info = await this.unary(options, (client, timeoutMs) =>
      client.closeSession(request, this.callOptions(timeoutMs, options.signal)),
    );
    return sessionFromProto(info);
  }
}

const POLICY = { none: pb.ScriptPolicy.NONE, restricted: pb.ScriptPolicy.RESTRICTED } as const;

/** The request for `script` and the client's own functions among its tools. */
export function executeRequest(
  script: string,
  options: ExecuteOptions,
): { request: pb.ExecuteRequest; local: Map<string, ClientTool> } {
  if (typeof script !== "string")
    throw new PtcError("invalid_argument", "script: must be a string");
  const { json, local } = buildManifest(options.tools);
  const encoder = new TextEncoder();
  const request = create(pb.ExecuteRequestSchema, {
    script,
    idempotencyKey: options.idempotencyKey ?? newKey(),
    sessionId: options.sessionId ?? "",
    runtime: options.runtime ?? "",
    labels: options.labels ?? {},
    backend:
      options.backend === undefined ? pb.Backend.UNSPECIFIED : BACKEND_TO_PROTO[options.backend],
    policy: options.policy === undefined ? pb.ScriptPolicy.UNSPECIFIED : POLICY[options.policy],
    expectedCalls: (options.expectedCalls ?? []).map((e) =>
      create(pb.ExpectedCallsSchema, {
        tool: e.tool,
        ...(e.min === undefined ? {} : { min: BigInt(e.min) }),
        ...(e.max === undefined ? {} : { max: BigInt(e.max) }),
      }),
    ),
    inputFiles: (options.files ?? []).map((f) =>
      create(pb.InputFileSchema, {
        name: f.name,
        content: typeof f.content === "string" ? encoder.encode(f.content) : f.content,
      }),
    ),
  });
  if (json !== undefined) request.manifest = create(pb.ToolManifestSchema, { json });
  if (options.limits !== undefined) request.limits = limitsToProto(options.limits);
  return { request, local };
}
