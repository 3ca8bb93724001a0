/**
 * A session: one sandbox kept for many executions (cells), with the interpreter's state
 * between them, as `sandbox/client/sessions.py`.
 *
 *     const session = await client.createSession({ tools, limits: { memoryBytes: 256 << 20 } });
 *     await session.run("x = 41");
 *     const cell = await session.run("x + 1");   // cell.value === "42"
 *     await session.close();
 *
 * A cell that ends the session (a memory limit, ...) is a result whose `sessionLost` says why;
 * a call on a session that has ended fails with `SessionLostError` (code "session_lost") and
 * its `reason`.
 *
 * The client imports this module and this module imports nothing of the client: what a session
 * uses of its client is declared here (`SessionClient`), which `PtcClient` meets as it is, and
 * the call options both use live in `options.ts`.
 */

import type { CallOptions, StreamOptions, Tools } from "./options.js";
import { buildManifest, type JsonSchema, type ToolManifest } from "./tools.js";
import type { BackendName, ExecutionResult, Limits, SessionInfo } from "./types.js";

export interface SessionOptions extends CallOptions {
  /** The session's tools, served by the server (a manifest): the server refuses client tools
   * here; a cell may bring them (`Session.run`). */
  tools?: ToolManifest | ReadonlyArray<JsonSchema>;
  /** Whole-session limits (memory, processes, file size, open files, total CPU). */
  limits?: Limits;
  backend?: BackendName;
  idleTimeoutMs?: number;
  maxLifetimeMs?: number;
  maxExecutions?: number;
  labels?: Record<string, string>;
  runtime?: string;
}

export type CellOptions = Omit<StreamOptions, "sessionId">;

/** What a `Session` uses of its `PtcClient`: `execute` for its cells (which then go through the
 * client's retries and its stream for client tools), and the two session calls. */
export interface SessionClient {
  execute(script: string, options?: StreamOptions): Promise<ExecutionResult>;
  getSession(sessionId: string, options?: CallOptions): Promise<SessionInfo>;
  closeSession(sessionId: string, options?: CallOptions): Promise<SessionInfo>;
}

export class Session {
  /** As the server last described it (refreshed by `get` and `close`). */
  info: SessionInfo;
  /** The tools the last cell that brought tools brought, and whether any runs here. */
  private tools: Tools | undefined;
  private clientTools = false;

  constructor(
    private readonly client: SessionClient,
    info: SessionInfo,
  ) {
    this.info = info;
  }

  get id(): string {
    return this.info.sessionId;
  }

  /**
   * Runs `code` as the session's next cell. With `tools`, they replace the session's (the
   * server keeps them for the next cells). Client tools run over the stream, and the server
   * keeps only their manifest: so once a cell brought client tools, the following cells send
   * the same tools again, for their functions to serve the calls.
   */
  async run(code: string, options: CellOptions = {}): Promise<ExecutionResult> {
    const tools = options.tools ?? (this.clientTools ? this.tools : undefined);
    const result = await this.client.execute(code, {
      ...options,
      ...(tools === undefined ? {} : { tools }),
      sessionId: this.id,
    });
    if (options.tools !== undefined) {
      this.tools = options.tools;
      this.clientTools = buildManifest(options.tools).local.size > 0;
    }
    return result;
  }

  /** The session as the server describes it now. */
  async get(options: CallOptions = {}): Promise<SessionInfo> {
    this.info = await this.client.getSession(this.id, options);
    return this.info;
  }

  /** Ends the session and releases its sandbox. */
  async close(options: CallOptions = {}): Promise<SessionInfo> {
    this.info = await this.client.closeSession(this.id, options);
    return this.info;
  }
}
