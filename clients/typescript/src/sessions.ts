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
 */

import type { CallOptions, PtcClient, StreamOptions, Tools } from "./client.js";
import type { ClientTool } from "./tools.js";
import type { BackendName, ExecutionResult, Limits, SessionInfo } from "./types.js";

export interface SessionOptions extends CallOptions {
  /** The session's tools; a cell may bring its own (which replace them for that cell). */
  tools?: Tools;
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

export class Session {
  /** As the server last described it (refreshed by `get` and `close`). */
  info: SessionInfo;

  constructor(
    private readonly client: PtcClient,
    info: SessionInfo,
    private readonly local: ReadonlyMap<string, ClientTool>,
  ) {
    this.info = info;
  }

  get id(): string {
    return this.info.sessionId;
  }

  /** Runs `code` as the session's next cell; the session's client tools stay callable. */
  run(code: string, options: CellOptions = {}): Promise<ExecutionResult> {
    let tools = options.tools;
    if (tools === undefined && this.local.size > 0) {
      // The session's manifest stays on the server; its functions must come along to serve
      // the calls, and sending them again names the same tools.
      tools = [...this.local.values()];
    }
    return this.client.execute(code, {
      ...options,
      ...(tools === undefined ? {} : { tools }),
      sessionId: this.id,
    });
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
