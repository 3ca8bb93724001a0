/**
 * One streamed execution (ExecuteStream): the client in the loop. The server streams output
 * and progress, asks this client to run its `client`-mode tools and to approve calls that need
 * approval, and ends with the full result.
 *
 * `Execution` reads the stream from the moment it is made, whether or not anyone iterates it,
 * so that tool calls are answered and `result` settles on its own; events are kept for the
 * one iterator in the order they came. When the stream ends for any reason every tool call
 * still running has its `signal` aborted, the iterator ends (with the error, if any) and
 * `result` settles: nothing of the SDK's is left pending.
 */

import { create } from "@bufbuild/protobuf";
import type { Client } from "@connectrpc/connect";
import { limitsFromProto, resultFromProto } from "./convert.js";
import { PtcError, toPtcError } from "./errors.js";
import * as pb from "./gen/ptc/sandbox/v1/sandbox_pb.js";
import type { ClientTool } from "./tools.js";
import type { ExecutionResult, Limits } from "./types.js";

export interface ApprovalRequest {
  seq: number;
  tool: string;
  arguments: unknown;
}

/** true/false, or with a reason shown to the script when denied. */
export type ApprovalAnswer = boolean | { approved: boolean; reason?: string };
export type OnApproval = (request: ApprovalRequest) => Promise<ApprovalAnswer> | ApprovalAnswer;

export type StreamEvent =
  | { kind: "started"; executionId: string; isolation: string[]; effectiveLimits: Limits }
  | { kind: "output"; stream: "stdout" | "stderr"; text: string; data: Uint8Array }
  | { kind: "call"; seq: number; tool: string; arguments: unknown; idempotencyKey: string }
  | {
      kind: "approval";
      seq: number;
      tool: string;
      arguments: unknown;
      approved: boolean;
      reason: string;
    }
  | {
      kind: "progress";
      elapsedMs: number;
      toolCalls: number;
      cpuTimeMs: number;
      peakMemoryBytes: number;
      stdoutBytes: number;
      stderrBytes: number;
    };

/** A queue of values read by one async iterator; `end` finishes it (after what it holds). */
class Channel<T> implements AsyncIterable<T> {
  private readonly items: T[] = [];
  private waiting: ((value: IteratorResult<T>) => void) | undefined;
  private failWaiting: ((error: unknown) => void) | undefined;
  private ended = false;
  private error: unknown;

  push(item: T): void {
    if (this.ended) return;
    if (this.waiting !== undefined) {
      const resolve = this.waiting;
      this.waiting = this.failWaiting = undefined;
      resolve({ value: item, done: false });
    } else {
      this.items.push(item);
    }
  }

  end(error?: unknown): void {
    if (this.ended) return;
    this.ended = true;
    this.error = error;
    if (this.waiting !== undefined) {
      const [resolve, reject] = [this.waiting, this.failWaiting];
      this.waiting = this.failWaiting = undefined;
      if (error === undefined) resolve({ value: undefined, done: true });
      else reject?.(error);
    }
  }

  private next(): Promise<IteratorResult<T>> {
    const item = this.items.shift();
    if (item !== undefined) return Promise.resolve({ value: item, done: false });
    if (this.ended) {
      if (this.error !== undefined) {
        const error = this.error;
        this.error = undefined; // thrown once; the iterator is then done
        return Promise.reject(error);
      }
      return Promise.resolve({ value: undefined, done: true });
    }
    return new Promise((resolve, reject) => {
      this.waiting = resolve;
      this.failWaiting = reject;
    });
  }

  // A generator, so that the iterator has `return` and `throw` (connect calls both).
  async *[Symbol.asyncIterator](): AsyncGenerator<T, void, undefined> {
    for (;;) {
      const step = await this.next();
      if (step.done === true) return;
      yield step.value;
    }
  }
}

export interface OpenStream {
  client: Promise<Client<typeof pb.SandboxService>>;
  request: pb.ExecuteRequest;
  local: ReadonlyMap<string, ClientTool>;
  headers: Record<string, string>;
  timeoutMs: number | undefined;
  signal: AbortSignal | undefined;
  onApproval: OnApproval | undefined;
}

/** A streamed execution: iterate it for events, await `result` for the end. */
export class Execution implements AsyncIterable<StreamEvent> {
  /** Settles when the stream ends: the result, or the call's `PtcError`. */
  readonly result: Promise<ExecutionResult>;
  /** Known once the server said "started". */
  executionId = "";
  private readonly outgoing = new Channel<pb.ClientMessage>();
  private readonly events = new Channel<StreamEvent>();
  private readonly running = new Set<AbortController>();
  private readonly decoders = { stdout: new TextDecoder(), stderr: new TextDecoder() };
  private iterated = false;

  constructor(private readonly open: OpenStream) {
    this.outgoing.push(
      create(pb.ClientMessageSchema, { message: { case: "start", value: open.request } }),
    );
    this.result = this.pump();
    this.result.catch(() => undefined); // the caller may only iterate; the iterator then throws
  }

  /** Asks the server to end the execution now; its result says "cancelled". */
  cancel(reason = ""): void {
    this.outgoing.push(
      create(pb.ClientMessageSchema, {
        message: { case: "cancel", value: create(pb.CancelSchema, { reason }) },
      }),
    );
  }

  [Symbol.asyncIterator](): AsyncIterator<StreamEvent> {
    if (this.iterated) throw new TypeError("an Execution can be iterated once");
    this.iterated = true;
    return this.events[Symbol.asyncIterator]();
  }

  private async pump(): Promise<ExecutionResult> {
    const { headers, timeoutMs, signal } = this.open;
    let result: ExecutionResult | undefined;
    try {
      const client = await this.open.client;
      const responses = client.executeStream(this.outgoing, { headers, timeoutMs, signal });
      for await (const event of responses) {
        result ??= this.handle(event);
        // The result is the last event: say we are done writing, and read the stream to its
        // end (its status), rather than reset it under a server that is finishing cleanly.
        if (result !== undefined) this.outgoing.end();
      }
      if (result === undefined) {
        throw new PtcError("protocol", "the server ended the stream without a result", {
          grpcCode: 13,
        });
      }
      this.flushText();
      this.events.end();
      return result;
    } catch (error) {
      if (result !== undefined) {
        this.events.end(); // what came after the result cannot change it
        return result;
      }
      const failure = toPtcError(error, signal);
      this.events.end(failure);
      throw failure;
    } finally {
      this.outgoing.end();
      for (const controller of this.running) controller.abort(new Error("the execution ended"));
      this.running.clear();
    }
  }

  /** Bytes held back as the start of a character that never finished come out as U+FFFD. */
  private flushText(): void {
    for (const stream of ["stdout", "stderr"] as const) {
      const text = this.decoders[stream].decode();
      if (text !== "") this.events.push({ kind: "output", stream, text, data: new Uint8Array() });
    }
  }

  private handle(event: pb.ServerEvent): ExecutionResult | undefined {
    const body = event.event;
    switch (body.case) {
      case "result":
        return resultFromProto(body.value);
      case "started":
        this.executionId = body.value.executionId;
        this.events.push({
          kind: "started",
          executionId: body.value.executionId,
          isolation: [...body.value.isolation],
          effectiveLimits: limitsFromProto(body.value.effectiveLimits),
        });
        return undefined;
      case "output": {
        const stream = body.value.stream === pb.Stream.STDERR ? "stderr" : "stdout";
        const text = this.decoders[stream].decode(body.value.data, { stream: true });
        this.events.push({ kind: "output", stream, text, data: body.value.data });
        return undefined;
      }
      case "progress": {
        const p = body.value;
        this.events.push({
          kind: "progress",
          elapsedMs: Number(p.elapsedMs),
          toolCalls: Number(p.toolCalls),
          cpuTimeMs: Number(p.cpuTimeMs),
          peakMemoryBytes: Number(p.peakMemoryBytes),
          stdoutBytes: Number(p.stdoutBytes),
          stderrBytes: Number(p.stderrBytes),
        });
        return undefined;
      }
      case "toolCall":
        void this.runTool(body.value);
        return undefined;
      case "approval":
        void this.decide(body.value);
        return undefined;
      default:
        return undefined; // an event this SDK does not know yet: newer server, ignored
    }
  }

  private async runTool(request: pb.ToolCallRequest): Promise<void> {
    const seq = Number(request.seq);
    const tool = this.open.local.get(request.tool);
    const controller = new AbortController();
    this.running.add(controller);
    let outcome: { case: "resultJson"; value: string } | { case: "error"; value: string };
    try {
      this.events.push({
        kind: "call",
        seq,
        tool: request.tool,
        arguments: JSON.parse(request.argumentsJson) as unknown,
        idempotencyKey: request.idempotencyKey,
      });
      if (tool === undefined) {
        throw new Error(`the client has no function for tool ${JSON.stringify(request.tool)}`);
      }
      const value = await tool.invokeJson(request.argumentsJson, {
        seq,
        idempotencyKey: request.idempotencyKey,
        signal: controller.signal,
      });
      outcome = { case: "resultJson", value };
    } catch (error) {
      const name = error instanceof Error ? error.name : "Error";
      const message = error instanceof Error ? error.message : String(error);
      outcome = { case: "error", value: message ? `${name}: ${message}` : name };
    } finally {
      this.running.delete(controller);
    }
    const answer = create(pb.ToolCallAnswerSchema, { seq: request.seq, outcome });
    this.outgoing.push(
      create(pb.ClientMessageSchema, { message: { case: "toolAnswer", value: answer } }),
    );
  }

  private async decide(request: pb.ApprovalRequest): Promise<void> {
    let approved = false;
    let reason = "no approver is configured on the client";
    let args: unknown;
    try {
      args = JSON.parse(request.argumentsJson) as unknown;
      if (this.open.onApproval !== undefined) {
        const answer = await this.open.onApproval({
          seq: Number(request.seq),
          tool: request.tool,
          arguments: args,
        });
        if (typeof answer === "boolean") [approved, reason] = [answer, ""];
        else [approved, reason] = [answer.approved === true, answer.reason ?? ""];
      }
    } catch (error) {
      approved = false;
      reason = `the approver failed: ${error instanceof Error ? `${error.name}: ${error.message}` : String(error)}`;
    }
    this.events.push({
      kind: "approval",
      seq: Number(request.seq),
      tool: request.tool,
      arguments: args,
      approved,
      reason,
    });
    const decision = create(pb.ApprovalDecisionSchema, { seq: request.seq, approved, reason });
    this.outgoing.push(
      create(pb.ClientMessageSchema, { message: { case: "approval", value: decision } }),
    );
  }
}
