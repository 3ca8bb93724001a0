/**
 * The execute tool, framework-neutral: one tool whose argument is a Python script, as the
 * Python SDK's `ExecuteTool` (`sandbox/integrations/execute_tool.py`) is. The framework modules
 * beside this one (`ai`, `mastra`, `langchain`, `openai-agents`) wrap it in each framework's own
 * tool API, a few lines each.
 *
 * Its description carries the calling convention and the compact stub module the server
 * generates for the tools (`GenerateStubs`, compact), so the model knows every typed function
 * it may call without one JSON definition per tool. A run goes over the stream, so that tools
 * written as TypeScript functions (`clientTool`) run in this process when the script calls
 * them, beside the server's own tools, and the script's output arrives as it is printed. What
 * the model reads back is the observation (`ptc-sandbox/observation`), the same text as the
 * Python SDK's. A request the service refuses comes back as an error observation, so the model
 * can correct itself; only the caller's own `AbortSignal` ends a run with an error.
 *
 * With `session`, every run is the next cell of one session, as the Python SDK's session
 * runners (`sandbox/integrations/session_runners.py`) make it: the model's names, imports and
 * files persist from one call of the tool to the next. `session: true` opens the session on the
 * first run and `close()` ends it; a `Session` passed in is the caller's to close. Once the
 * session has ended (lost, closed, expired), a run's refusal is the observation, naming why, in
 * the Python session runner's words.
 */

import type { PtcClient } from "../client.js";
import { GrpcCode, PtcError } from "../errors.js";
import { type ObservationBudget, renderObservation, summaryFieldsOf } from "../observation.js";
import type { ExecuteOptions, Tools } from "../options.js";
import type { Session, SessionOptions } from "../sessions.js";
import type { OnApproval } from "../stream.js";
import { isClientTool } from "../tools.js";
import type { ExecutionResult, ExpectedCalls, InputFile, Limits } from "../types.js";

/**
 * What a run keeps, the description's first line: nothing for a single-use tool, everything the
 * earlier cells left for one over a session, so that a model neither redoes work that is still
 * there nor counts on state that is gone. Word for word the Python SDK's
 * (tests/data/execute_tool_description_vectors.json holds both descriptions, checked by both).
 */
const FRESH =
  "Run a Python 3 script in a fresh sandbox (no network, nothing persists between runs).\n";
const IN_SESSION =
  "Run a Python 3 script as the next cell of one sandbox session (no network). State persists\n" +
  "between runs: the names, imports and files of earlier runs are still there.\n";

const CONVENTION = `The tools below are typed functions of the module \`tools\`: \`import tools\`, then call
\`tools.NAME(arg=...)\` with keyword arguments. Use loops and branches, and for many independent
calls fan out with \`await asyncio.gather(*(tools.aio.NAME(...) for ...))\` (top-level await
works). A failing call raises \`tools.ToolError\` (subclasses: \`InvalidArguments\`, \`CallRefused\`,
\`CallDenied\`); catch it where a failure is expected. Only what you print() comes back, with a
one-line summary of each tool call, so print the reduced answer, not raw results.
`;

/** The calling convention of a single-use tool, word for word the Python SDK's. */
export const CALLING_CONVENTION = FRESH + CONVENTION;
/** The calling convention of a tool over a session (`session` given). */
export const SESSION_CALLING_CONVENTION = IN_SESSION + CONVENTION;

/** The tool's one argument. */
export function codeParameter(): {
  type: "object";
  properties: { code: { type: "string"; description: string } };
  required: ["code"];
  additionalProperties: false;
} {
  return {
    type: "object",
    properties: { code: { type: "string", description: "The complete Python script to run." } },
    required: ["code"],
    additionalProperties: false,
  };
}

/** The text of a call whose arguments carried no `code`. */
export const BAD_ARGUMENTS = 'error: the tool takes one argument, {"code": "<a Python script>"}';

export interface ExecuteToolOptions {
  client: PtcClient;
  /** Client tools (`clientTool`, run here) and server-side manifest entries, mixed freely. */
  tools?: Tools;
  /** The tool's name; "execute_python" by default, as in Python. */
  name?: string;
  /** Added to the description after the calling convention. */
  instructions?: string;
  limits?: Limits;
  /** Checked on every run's call log (a violation when not met), unless a run gives its own. */
  expectedCalls?: ExpectedCalls[];
  /** Input files every run finds in its working directory. */
  files?: InputFile[];
  /** The deadline of each run's call, in milliseconds. */
  deadlineMs?: number;
  onApproval?: OnApproval;
  budget?: Partial<ObservationBudget>;
  /** Per tool, the result fields the observation shows; by default the manifest's declared
   * `x-ptc.summary_fields`. */
  summaryFields?: Record<string, readonly string[]>;
  /**
   * Run every call as a cell of one session, so state persists between calls: `true` opens
   * one on the first run (with `sessionOptions`), closed by `ExecuteTool.close`; or a
   * `Session` of the caller's, which the caller closes.
   */
  session?: boolean | Session;
  /** How a session opened by `session: true` is made (its limits, idle timeout, ...). */
  sessionOptions?: SessionOptions;
}

/** One run's outcome: the model's text and the full result behind it. */
export interface Observation {
  text: string;
  /** Undefined when the service refused the request. */
  result: ExecutionResult | undefined;
  isError: boolean;
}

export interface RunOptions {
  signal?: AbortSignal;
  /** Replaces the tool's own expected calls for this run. */
  expectedCalls?: ExpectedCalls[];
  /** Added to the tool's own input files for this run. */
  files?: InputFile[];
}

/** What a streamed run yields: the script's output as it arrives, then the observation. */
export type RunEvent =
  | { kind: "output"; stream: "stdout" | "stderr"; text: string }
  | { kind: "done"; observation: Observation };

/** The code of a tool call's arguments (JSON text or a parsed object), or undefined. */
export function parseCode(args: unknown): string | undefined {
  let value = args;
  if (typeof value === "string") {
    try {
      value = JSON.parse(value) as unknown;
    } catch {
      return undefined;
    }
  }
  if (value === null || typeof value !== "object" || Array.isArray(value)) return undefined;
  const code = (value as { code?: unknown }).code;
  return typeof code === "string" ? code : undefined;
}

function manifestEntries(tools: Tools | undefined): unknown[] {
  if (tools === undefined) return [];
  if (typeof tools === "string") {
    let parsed: unknown;
    try {
      parsed = JSON.parse(tools);
    } catch (error) {
      throw new PtcError("invalid_argument", `tools: the manifest is not JSON (${String(error)})`, {
        grpcCode: GrpcCode.INVALID_ARGUMENT,
      });
    }
    return manifestEntries(parsed as Tools);
  }
  if (Array.isArray(tools)) return tools.map((t) => (isClientTool(t) ? t.entry : t));
  const inner = (tools as { tools?: unknown }).tools;
  return Array.isArray(inner) ? inner : [];
}

/** The execute tool over `tools`, run by `client`. Make it with `ExecuteTool.create`. */
export class ExecuteTool {
  /** The session the runs go to: the caller's, or the one opened on the first run. */
  private session: Session | undefined;
  /** The opening of the session, while under way (two calls at once open one session). */
  private opening: Promise<Session> | undefined;

  private constructor(
    readonly options: ExecuteToolOptions,
    /** The compact stub module of the tools, as the model sees it. */
    readonly stubs: string,
    readonly summaryFields: Record<string, readonly string[]>,
  ) {
    if (typeof options.session === "object") this.session = options.session;
  }

  /** Asks the server for the tools' compact stubs (one call), and builds the tool. */
  static async create(options: ExecuteToolOptions): Promise<ExecuteTool> {
    const entries = manifestEntries(options.tools);
    let stubs = "";
    if (entries.length > 0) {
      const generated = await options.client.generateStubs(options.tools ?? [], {
        compact: true,
        deadlineMs: options.deadlineMs,
      });
      stubs = generated.compact;
    }
    const fields = options.summaryFields ?? summaryFieldsOf(entries);
    return new ExecuteTool(options, stubs, fields);
  }

  get name(): string {
    return this.options.name ?? "execute_python";
  }

  /** Whether the runs are cells of one session (`session` given), so state persists. */
  get inSession(): boolean {
    return this.options.session !== undefined && this.options.session !== false;
  }

  /** The calling convention (of its mode), the builder's instructions and the stubs, as in
   * Python. */
  get description(): string {
    const convention = this.inSession ? SESSION_CALLING_CONVENTION : CALLING_CONVENTION;
    const instructions = (this.options.instructions ?? "").trim();
    const extra = instructions ? `${instructions}\n` : "";
    if (!this.stubs) return `${convention}${extra}No tools are available to this script.\n`;
    return `${convention}${extra}\n\`\`\`python\n${this.stubs.trimEnd()}\n\`\`\`\n`;
  }

  /** The JSON Schema of the tool's arguments (a fresh object: callers may change it). */
  get parameters(): ReturnType<typeof codeParameter> {
    return codeParameter();
  }

  /** The id of the session the runs go to; undefined before a `session: true` tool's first run
   * and for a single-use tool. */
  get sessionId(): string | undefined {
    return this.session?.id;
  }

  /** The session of the runs, opened now if this is the first run of a `session: true` tool. */
  private async sessionOf(run: RunOptions): Promise<Session | undefined> {
    const wanted = this.options.session;
    if (wanted === undefined || wanted === false) return undefined;
    if (this.session !== undefined) return this.session;
    this.opening ??= this.options.client
      .createSession({
        deadlineMs: this.options.deadlineMs,
        ...this.options.sessionOptions,
        signal: run.signal,
      })
      .finally(() => {
        this.opening = undefined;
      });
    this.session = await this.opening;
    return this.session;
  }

  /**
   * Ends the session that `session: true` opened (nothing when none was opened, or when the
   * session was the caller's). A session that has already ended is not an error.
   */
  async close(): Promise<void> {
    const owned = this.options.session === true ? this.session : undefined;
    if (owned === undefined) return;
    this.session = undefined;
    try {
      await owned.close({ deadlineMs: this.options.deadlineMs });
    } catch (error) {
      if (!(error instanceof PtcError)) throw error;
      if (!["session_lost", "not_found", "failed_precondition"].includes(error.code)) throw error;
    }
  }

  private request(run: RunOptions): ExecuteOptions & { onApproval?: OnApproval } {
    const o = this.options;
    return {
      tools: o.tools,
      limits: o.limits,
      expectedCalls: run.expectedCalls ?? o.expectedCalls,
      files: [...(o.files ?? []), ...(run.files ?? [])],
      deadlineMs: o.deadlineMs,
      signal: run.signal,
      onApproval: o.onApproval,
    };
  }

  /** The observation of `result` for the script `code`. */
  observe(result: ExecutionResult, code: string): Observation {
    const text = renderObservation(result, {
      summaryFields: this.summaryFields,
      budget: this.options.budget,
      script: { text: code },
    });
    return { text, result, isError: result.status !== "ok" };
  }

  /**
   * Runs `code`, yielding its output as it is printed and then the observation. A refusal of
   * the service is an error observation; the caller's signal firing ends the run by throwing.
   */
  async *stream(code: string, run: RunOptions = {}): AsyncGenerator<RunEvent, Observation> {
    const inSession = this.inSession;
    let observation: Observation;
    try {
      const session = await this.sessionOf(run);
      const request = this.request(run);
      const execution = this.options.client.stream(
        code,
        session === undefined ? request : { ...request, sessionId: session.id },
      );
      for await (const event of execution) {
        if (event.kind === "output") {
          yield { kind: "output", stream: event.stream, text: event.text };
        }
      }
      observation = this.observe(await execution.result, code);
    } catch (error) {
      if (!(error instanceof PtcError) || error.code === "aborted_by_signal") throw error;
      observation = inSession ? refusedInSession(error) : refused(error);
    }
    yield { kind: "done", observation };
    return observation;
  }

  /** Runs `code` to its end: the observation. */
  async run(code: string, run: RunOptions = {}): Promise<Observation> {
    const events = this.stream(code, run);
    for (;;) {
      const next = await events.next();
      if (next.done) return next.value;
    }
  }

  /** Runs a tool call given its raw arguments (JSON text or a parsed object). */
  async runArguments(args: unknown, run: RunOptions = {}): Promise<Observation> {
    const code = parseCode(args);
    if (code === undefined) return { text: BAD_ARGUMENTS, result: undefined, isError: true };
    return this.run(code, run);
  }
}

/**
 * A refusal of a session's cell, in the Python session runner's words: its client raises the
 * server's error, which its execute tool shows as "the sandbox refused the request" followed
 * by the server's message (`session_lost: session '…' is closed: closed by the client`, ...).
 * tests/data/session_refusal_vectors.json holds the texts both languages must give.
 */
export function refusedInSession(error: PtcError): Observation {
  return {
    text: `error: the sandbox refused the request: ${error.message}`,
    result: undefined,
    isError: true,
  };
}

function refused(error: PtcError): Observation {
  return {
    text: `error: the sandbox service refused the request: ${error.message}`,
    result: undefined,
    isError: true,
  };
}
