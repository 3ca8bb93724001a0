/**
 * The client against a real `ptc serve` (process backend): results of every kind with their
 * typed fields, the stream with client tools, approvals and live output, sessions with files,
 * stubs, records with page tokens, idempotency, and the deadline told apart from a script's
 * wall-time limit.
 */

import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { z } from "zod";
import { clientTool, PtcError, type StreamEvent } from "../src/index.js";
import { servedClient } from "./support/served.js";

const served = servedClient("--allow-degraded");

const ECHO = [
  {
    name: "lookup",
    description: "Echoes.",
    parameters: { type: "object", properties: { q: { type: "string" } } },
  },
];

describe("execute", () => {
  test("ok: stdout, exit code, the call log with parsed arguments", async () => {
    const result = await served.client.execute(
      "import tools\nprint(tools.lookup(q='x')['q'] * 2)",
      {
        tools: ECHO,
      },
    );
    assert.equal(result.status, "ok");
    assert.equal(result.exitCode, 0);
    assert.equal(result.stdout, "xx\n");
    assert.equal(result.calls.length, 1);
    const [call] = result.calls;
    assert.equal(call?.tool, "lookup");
    assert.deepEqual(call?.arguments, { q: "x" });
    assert.equal(call?.status, "ok");
    assert.match(result.executionId, /^[0-9a-f]{32}$/);
    assert.equal(result.backend, "process");
    assert.ok(result.usage.wallTimeMs >= 0);
  });

  test("error: a raising script is a result with its ScriptError", async () => {
    const result = await served.client.execute("raise ValueError('boom')");
    assert.equal(result.status, "error");
    assert.equal(result.exitCode, 1);
    assert.equal(result.error?.type, "ValueError");
    assert.equal(result.error?.message, "boom");
    assert.equal(result.error?.line, 1);
  });

  test("limit_exceeded: a wall_time violation, typed", async () => {
    const result = await served.client.execute("while True:\n    pass", {
      limits: { wallTimeMs: 400 },
    });
    assert.equal(result.status, "limit_exceeded");
    const violation = result.violations.find((v) => v.limit === "wall_time");
    assert.ok(violation, JSON.stringify(result.violations));
    assert.equal(violation.limitValue, 0.4);
    assert.equal(violation.unit, "s");
    assert.equal(violation.action, "killed");
    assert.equal(violation.evidence, "host");
    assert.ok(typeof violation.observed === "number" && violation.observed >= 0.4);
    assert.equal(result.effectiveLimits.wallTimeMs, 400);
  });

  test("the call's deadline is an error, distinct from the script's wall-time limit", async () => {
    const started = Date.now();
    await assert.rejects(
      served.client.execute("import time\ntime.sleep(5)", { deadlineMs: 500 }),
      (error: unknown) =>
        error instanceof PtcError && error.code === "deadline_exceeded" && error.grpcCode === 4,
    );
    assert.ok(Date.now() - started < 3000);
  });

  test("a bad request is invalid_argument naming the field", async () => {
    await assert.rejects(
      served.client.execute("print(1)", { tools: "{not json" }),
      (error: unknown) =>
        error instanceof PtcError &&
        error.code === "invalid_argument" &&
        /manifest/.test(error.message),
    );
    // A limit the SDK can tell is wrong never leaves the process.
    await assert.rejects(
      served.client.execute("print(1)", { limits: { wallTimeMs: -1 } }),
      /limits.wallTimeMs/,
    );
  });

  test("idempotency: the same key replays the execution, another script with it is refused", async () => {
    const key = `ts-${Date.now()}`;
    const first = await served.client.execute("import random\nprint(random.random())", {
      idempotencyKey: key,
    });
    const again = await served.client.execute("import random\nprint(random.random())", {
      idempotencyKey: key,
    });
    assert.equal(again.executionId, first.executionId);
    assert.equal(again.stdout, first.stdout);
    await assert.rejects(
      served.client.execute("print('other')", { idempotencyKey: key }),
      (error: unknown) =>
        error instanceof PtcError &&
        error.code === "idempotency_key_reused" &&
        error.grpcCode === 9,
    );
  });

  test("expectedCalls: a shortfall is an expected_calls violation, reported", async () => {
    const result = await served.client.execute("import tools\ntools.lookup(q='once')", {
      tools: ECHO,
      expectedCalls: [{ tool: "lookup", min: 2, max: 3 }],
    });
    const violation = result.violations.find((v) => v.limit === "expected_calls");
    assert.ok(violation, JSON.stringify(result.violations));
    assert.equal(violation.action, "reported");
    assert.equal(violation.observed, 1);
    assert.match(violation.detail, /lookup/);
  });

  test("input files in, output files out", async () => {
    const result = await served.client.execute(
      "import os\ndata = open('in/data.txt').read()\nos.makedirs('outputs', exist_ok=True)\n" +
        "open('outputs/upper.txt', 'w').write(data.upper())\nprint(len(data))",
      { files: [{ name: "in/data.txt", content: "héllo" }] },
    );
    assert.equal(result.status, "ok", result.stderr);
    assert.equal(result.stdout, "5\n");
    assert.deepEqual(
      result.inputFiles.map((f) => [f.name, f.sizeBytes]),
      [["in/data.txt", 6]],
    );
    const out = result.outputFiles.find((f) => f.name === "upper.txt");
    assert.ok(out, JSON.stringify(result.outputFiles));
    assert.equal(new TextDecoder().decode(out.content), "HÉLLO");
    assert.equal(out.sizeBytes, 6);
  });
});

describe("stream", () => {
  test("client tools run here; output chunks come in order, then the result", async () => {
    const seen: number[] = [];
    const add = clientTool({
      name: "add",
      description: "Adds two numbers.",
      inputSchema: {
        type: "object",
        properties: { a: { type: "number" }, b: { type: "number" } },
        required: ["a", "b"],
      },
      execute: async ({ a, b }: { a: number; b: number }, context) => {
        seen.push(context.seq);
        return a + b;
      },
    });
    const run = served.client.stream(
      "import sys, tools\nfor i in range(5):\n    print(i, tools.add(a=i, b=10), flush=True)\n" +
        "print('done', file=sys.stderr)",
      { tools: [add] },
    );
    const events: StreamEvent[] = [];
    for await (const event of run) events.push(event);
    const result = await run.result;
    assert.equal(result.status, "ok", result.stderr);
    assert.equal(result.stdout, "0 10\n1 11\n2 12\n3 13\n4 14\n");
    assert.equal(result.stderr, "done\n");
    assert.deepEqual(seen, [1, 2, 3, 4, 5]);
    assert.deepEqual(
      result.calls.map((c) => [c.seq, c.tool, c.result]),
      [1, 2, 3, 4, 5].map((seq) => [seq, "add", seq - 1 + 10]),
    );
    assert.equal(events[0]?.kind, "started");
    assert.equal(run.executionId, result.executionId);
    const stdout = events.flatMap((e) =>
      e.kind === "output" && e.stream === "stdout" ? [e.text] : [],
    );
    assert.equal(stdout.join(""), result.stdout);
    const calls = events.flatMap((e) => (e.kind === "call" ? [e.seq] : []));
    assert.deepEqual(calls, [1, 2, 3, 4, 5]);
  });

  test("execute() with client tools runs over the stream; a zod schema validates arguments", async () => {
    const shout = clientTool({
      name: "shout",
      // The refinement has no JSON Schema form: only the client's validation can refuse 'bad'.
      inputSchema: z.object({ text: z.string().refine((t) => t !== "bad", "not bad") }),
      execute: async ({ text }) => text.toUpperCase(),
    });
    const result = await served.client.execute(
      "import tools\nprint(tools.shout(text='hi'))\ntry:\n    tools.shout(text='bad')\n" +
        "except Exception as e:\n    print(type(e).__name__)",
      { tools: [shout] },
    );
    assert.equal(result.status, "ok", result.stderr);
    assert.equal(result.stdout, "HI\nToolError\n");
    assert.equal(result.calls[1]?.status, "error");
    assert.match(result.calls[1]?.error ?? "", /invalid arguments: text: not bad/);
    // The schema the server got is zod's JSON Schema: a missing field is refused there.
    const missing = await served.client.execute("import tools\ntools.shout(text=5)", {
      tools: [shout],
    });
    assert.equal(missing.calls[0]?.status, "invalid_arguments");
  });

  test("a tool that throws: the script sees ToolError with its message", async () => {
    const fail = clientTool({
      name: "fail",
      inputSchema: { type: "object" },
      execute: async () => {
        throw new RangeError("out of range");
      },
    });
    const result = await served.client.execute("import tools\ntools.fail()", { tools: [fail] });
    assert.equal(result.status, "error");
    assert.equal(result.error?.type, "ToolError");
    assert.match(result.error?.message ?? "", /RangeError: out of range/);
  });

  test("approvals: onApproval decides, a denial's reason reaches the script", async () => {
    const asked: string[] = [];
    const send = clientTool({
      name: "send",
      inputSchema: { type: "object", properties: { to: { type: "string" } } },
      needsApproval: true,
      execute: async ({ to }) => `sent to ${String(to)}`,
    });
    const result = await served.client.execute(
      "import tools\nprint(tools.send(to='ann'))\ntry:\n    tools.send(to='bob')\n" +
        "except Exception as e:\n    print(type(e).__name__, e)",
      {
        tools: [send],
        onApproval: async (request) => {
          asked.push(String((request.arguments as { to: string }).to));
          return request.seq === 1 ? true : { approved: false, reason: "not bob" };
        },
      },
    );
    assert.deepEqual(asked, ["ann", "bob"]);
    assert.equal(result.calls[0]?.status, "ok");
    assert.equal(result.calls[1]?.status, "denied");
    assert.match(result.stdout, /^sent to ann\n/);
    assert.match(result.stdout, /not bob/);
  });
});

describe("server tools that need approval", () => {
  test("execute() with onApproval runs over the stream, and its answer decides each call", async () => {
    const guarded = [{ ...ECHO[0], "x-ptc": { needs_approval: true } }];
    const script =
      "import tools\ntry:\n    print(tools.lookup(q='a')['q'])\nexcept Exception as e:\n    print('no')";
    const asked: number[] = [];
    const approved = await served.client.execute(script, {
      tools: guarded,
      onApproval: (request) => {
        asked.push(request.seq);
        return true;
      },
    });
    assert.deepEqual(asked, [1]);
    assert.equal(approved.stdout, "a\n");
    assert.equal(approved.calls[0]?.status, "ok");
    const denied = await served.client.execute(script, { tools: guarded, onApproval: () => false });
    assert.equal(denied.stdout, "no\n");
    assert.equal(denied.calls[0]?.status, "denied");
  });
});

describe("sessions", () => {
  test("state across cells, files, get, list, close; a closed session is session_lost", async () => {
    const session = await served.client.createSession({ tools: ECHO });
    assert.equal(session.info.state, "active");
    await session.run("x = 41");
    const cell = await session.run("x + 1");
    assert.equal(cell.value, "42");
    assert.equal(cell.sessionId, session.id);
    const withFile = await session.run("print(open('n.txt').read())", {
      files: [{ name: "n.txt", content: "seven" }],
    });
    assert.equal(withFile.stdout, "seven\n");
    const info = await session.get();
    assert.equal(info.executionIds.length, 3);
    const listed = await served.client.listSessions();
    assert.ok(listed.some((s) => s.sessionId === session.id));
    const closed = await session.close();
    assert.equal(closed.state, "closed");
    assert.ok(!(await served.client.listSessions()).some((s) => s.sessionId === session.id));
    const ended = await served.client.listSessions({ includeEnded: true });
    assert.equal(ended.find((s) => s.sessionId === session.id)?.state, "closed");
    await assert.rejects(session.run("x"), (error: unknown) => {
      assert.ok(error instanceof PtcError);
      assert.equal(error.code, "session_lost", error.message);
      assert.match((error as PtcError & { reason: string }).reason, /^closed/);
      return true;
    });
  });
});

describe("a session and client tools", () => {
  test("a cell brings client tools; the next cells can call them and the server's", async () => {
    const double = clientTool({
      name: "double",
      inputSchema: { type: "object", properties: { n: { type: "integer" } }, required: ["n"] },
      execute: ({ n }: { n: number }) => n * 2,
    });
    await assert.rejects(
      served.client.createSession({ tools: [double] as never }),
      (error: unknown) => {
        assert.ok(error instanceof PtcError);
        assert.equal(error.code, "invalid_argument");
        assert.match(
          error.message,
          /^manifest: tools\[0\] 'double': 'client'-mode tools are not served in sessions/,
        );
        return true;
      },
    );
    const session = await served.client.createSession({ tools: ECHO });
    try {
      await session.run("import tools\nx = tools.double(n=4)", { tools: [double, ...ECHO] });
      const cell = await session.run("print(x, tools.double(n=x), tools.lookup(q='k')['q'])");
      assert.equal(cell.status, "ok", cell.stderr);
      assert.equal(cell.stdout, "8 16 k\n");
      assert.deepEqual(
        cell.calls.map((c) => c.tool),
        ["double", "lookup"],
      );
    } finally {
      await session.close();
    }
  });
});

describe("stubs and records", () => {
  test("generateStubs renders the module and its compact form", async () => {
    const stubs = await served.client.generateStubs([
      {
        name: "get-weather",
        description: "Weather.",
        parameters: { type: "object", properties: { city: { type: "string" } } },
      },
    ]);
    assert.match(stubs.module, /def get_weather\(/);
    assert.match(stubs.compact, /get_weather/);
    assert.deepEqual(stubs.names, { get_weather: "get-weather" });
    assert.match(stubs.manifestHash, /^[0-9a-f]{64}$/);
  });

  test("getExecution, and listExecutions filtered and paged by token", async () => {
    const ids: string[] = [];
    for (let i = 0; i < 3; i++)
      ids.push((await served.client.execute(`print(${i})`, { labels: { page: "t" } })).executionId);
    const record = await served.client.getExecution(ids[0] ?? "");
    assert.equal(record.script, "print(0)");
    assert.equal(record.result.stdout, "0\n");
    assert.equal(record.interruptedReason, ""); // only an interrupted record without a result has one
    const first = await served.client.listExecutions({ status: "ok", pageSize: 2 });
    assert.equal(first.records.length, 2);
    assert.notEqual(first.nextPageToken, "");
    const second = await served.client.listExecutions({
      status: "ok",
      pageSize: 2,
      pageToken: first.nextPageToken,
    });
    assert.ok(second.records.length >= 1);
    const seen = [...first.records, ...second.records].map((r) => r.result.executionId);
    assert.equal(new Set(seen).size, seen.length, "a record came on two pages");
    const future = await served.client.listExecutions({ since: new Date(Date.now() + 3_600_000) });
    assert.deepEqual(future.records, []);
    const recent = await served.client.listExecutions({
      since: Date.now() - 60_000,
      until: new Date(Date.now() + 60_000),
    });
    assert.ok(recent.records.some((r) => r.result.executionId === ids[2]));
    const errors = await served.client.listExecutions({ status: "error" });
    assert.ok(errors.records.every((r) => r.result.status === "error"));
    await assert.rejects(
      served.client.getExecution("0".repeat(32)),
      (error: unknown) => error instanceof PtcError && error.code === "not_found",
    );
  });
});

describe("a long stream", () => {
  test("progress events while it runs; cancel() ends it as cancelled", async () => {
    const run = served.client.stream(
      "import time\nprint('start', flush=True)\ntime.sleep(1.6)\nprint('late')\ntime.sleep(30)",
    );
    const kinds: string[] = [];
    for await (const event of run) {
      kinds.push(event.kind);
      if (event.kind === "progress") run.cancel("enough");
    }
    const result = await run.result;
    assert.equal(result.status, "cancelled");
    assert.equal(kinds[0], "started");
    assert.ok(kinds.includes("progress"), kinds.join(","));
    assert.ok(result.usage.wallTimeMs < 10_000);
  });
});
