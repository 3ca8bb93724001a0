/**
 * Hostile input at the client, and calls abandoned midway. Each case ends with a typed error,
 * every promise the SDK gave out settles, and the process's active resources (sockets, timers,
 * HTTP/2 sessions) are back to what they were once the client is closed; the real server still
 * serves afterwards and records the abandoned execution as cancelled.
 *
 * - a TCP server that answers garbage (not HTTP/2 at all);
 * - an HTTP/2 server that starts a gRPC answer and cuts it in the middle of a message, by a
 *   reset and by a clean end of stream;
 * - an HTTP/2 server that resets every stream with REFUSED_STREAM, or ENHANCE_YOUR_CALM (what
 *   Node itself does to an answer it refuses over `maxSessionMemory`);
 * - the call's deadline passing while a client-side tool runs;
 * - the caller's AbortSignal fired while a client-side tool runs.
 */

import assert from "node:assert/strict";
import {
  type Http2ServerRequest,
  type Http2ServerResponse,
  constants as h2,
  createServer as h2Server,
} from "node:http2";
import { type Server, createServer as tcpServer } from "node:net";
import { after, before, test } from "node:test";
import { clientTool, PtcClient, PtcError } from "../src/index.js";
import { activeResources, type Serving, settlesWithin, startServe } from "./support/serve.js";

let serving: Serving;

before(async () => {
  serving = await startServe("--allow-degraded");
});

after(async () => {
  const stopped = await serving.stop();
  assert.equal(stopped.code, 0, stopped.stderr);
});

function listen(server: Server | ReturnType<typeof h2Server>): Promise<string> {
  return new Promise((done) => {
    server.listen(0, "127.0.0.1", () => {
      const address = server.address();
      assert.ok(address !== null && typeof address === "object");
      done(`http://127.0.0.1:${address.port}`);
    });
  });
}

function close(server: Server | ReturnType<typeof h2Server>): Promise<void> {
  return new Promise((done) => server.close(() => done()));
}

function typed(codes: string[]) {
  return (error: unknown) => {
    assert.ok(error instanceof PtcError, `not a PtcError: ${String(error)}`);
    assert.ok(codes.includes(error.code), `${error.code}: ${error.message}`);
    return true;
  };
}

/** The server still serves: a plain execution succeeds on a fresh client. */
async function stillServes(): Promise<void> {
  const client = new PtcClient({ address: serving.address });
  try {
    assert.equal((await client.execute("print('alive')")).stdout, "alive\n");
  } finally {
    client.close();
  }
}

/** The record of an abandoned execution ends as cancelled (the server saw the client go). */
async function recordedCancelled(executionId: string): Promise<void> {
  assert.notEqual(executionId, "");
  const client = new PtcClient({ address: serving.address });
  try {
    for (let i = 0; i < 50; i++) {
      const record = await client.getExecution(executionId);
      if (record.result.status !== "unspecified") {
        assert.equal(record.result.status, "cancelled");
        return;
      }
      await new Promise((done) => setTimeout(done, 100));
    }
    assert.fail(`execution ${executionId} never ended`);
  } finally {
    client.close();
  }
}

test("a TCP server answering garbage: a typed error, no handle left", async () => {
  const baseline = await activeResources();
  const server = tcpServer((socket) => {
    socket.on("error", () => undefined);
    socket.resume(); // reads, so that it sees the client's end and closes
    socket.end(
      "HTTP/1.1 200 OK\r\ncontent-type: text/html\r\n\r\n<html>not grpc</html>\x00\xff\xfe",
    );
  });
  const address = await listen(server);
  const client = new PtcClient({ address, retry: { attempts: 1 } });
  await assert.rejects(
    settlesWithin(client.execute("print(1)", { deadlineMs: 5000 }), 6000).then(unwrap),
    typed(["protocol"]),
  );
  const run = client.stream("print(1)", { deadlineMs: 5000 });
  await assert.rejects(settlesWithin(run.result, 6000).then(unwrap), typed(["protocol"]));
  client.close();
  await close(server);
  assert.deepEqual(await activeResources(), baseline);
});

function unwrap<T>(outcome: PromiseSettledResult<T>): T {
  if (outcome.status === "rejected") throw outcome.reason;
  return outcome.value;
}

for (const [name, cut] of [
  ["reset", (res: Http2ServerResponse) => res.stream.close(h2.NGHTTP2_INTERNAL_ERROR)],
  ["clean end", (res: Http2ServerResponse) => res.end()],
] as const) {
  test(`a gRPC answer cut mid-message (${name}): a typed error, no handle left`, async () => {
    const baseline = await activeResources();
    const server = h2Server((req: Http2ServerRequest, res: Http2ServerResponse) => {
      req.resume();
      res.writeHead(200, { "content-type": "application/grpc+proto" });
      // A message announced as 1000 bytes, of which 10 come.
      const prefix = Buffer.from([0, 0, 0, 0x03, 0xe8]);
      res.write(Buffer.concat([prefix, Buffer.alloc(10, 0x2a)]), () => cut(res));
    });
    const address = await listen(server);
    const client = new PtcClient({ address, retry: { attempts: 1 } });
    const run = client.stream("print(1)", { deadlineMs: 5000 });
    const events: string[] = [];
    const iterated = (async () => {
      for await (const event of run) events.push(event.kind);
    })();
    const codes = ["protocol"];
    await assert.rejects(settlesWithin(run.result, 6000).then(unwrap), typed(codes));
    await assert.rejects(settlesWithin(iterated, 1000).then(unwrap), typed(codes));
    assert.deepEqual(events, []);
    await assert.rejects(
      settlesWithin(client.execute("print(1)"), 6000).then(unwrap),
      typed(codes),
    );
    client.close();
    await close(server);
    assert.deepEqual(await activeResources(), baseline);
  });
}

for (const [name, code, said] of [
  ["REFUSED_STREAM", h2.NGHTTP2_REFUSED_STREAM, /refused the HTTP\/2 stream \(REFUSED_STREAM\)/],
  ["ENHANCE_YOUR_CALM", h2.NGHTTP2_ENHANCE_YOUR_CALM, /reset with ENHANCE_YOUR_CALM/],
] as const) {
  test(`every stream reset with ${name}: unavailable saying so, retried with the same key`, async () => {
    const baseline = await activeResources();
    const keys: string[] = [];
    const server = h2Server((req: Http2ServerRequest, res: Http2ServerResponse) => {
      // The request's first bytes hold its idempotency key (a stream's request never ends).
      req.once("data", (chunk: Buffer) => {
        keys.push(chunk.toString("latin1").match(/[0-9a-f-]{36}/)?.[0] ?? "");
        res.stream.close(code);
      });
    });
    const address = await listen(server);
    const client = new PtcClient({ address, retry: { attempts: 3, backoffMs: 1 } });
    const refused = (attempts: number | undefined) => (error: unknown) => {
      assert.ok(typed(["unavailable"])(error));
      const failure = error as PtcError;
      assert.equal(failure.grpcCode, 14);
      assert.match(failure.message, said);
      assert.equal(failure.attempts, attempts);
      return true;
    };
    try {
      const run = client.stream("print(1)", { deadlineMs: 5000 }); // a stream is not retried
      await assert.rejects(settlesWithin(run.result, 6000).then(unwrap), refused(undefined));
      assert.equal(keys.length, 1);
      await assert.rejects(
        settlesWithin(client.execute("print(1)", { deadlineMs: 5000 }), 6000).then(unwrap),
        refused(3),
      );
      assert.equal(keys.length, 4);
      assert.equal(new Set(keys.slice(1)).size, 1, `one key for every attempt: ${keys}`);
    } finally {
      client.close();
      await close(server);
    }
    assert.deepEqual(await activeResources(), baseline);
  });
}

/** A client tool that waits until its signal fires (a well-behaved long call). */
function waitingTool(started: () => void, stopped: (reason: unknown) => void) {
  return clientTool({
    name: "slow",
    inputSchema: { type: "object" },
    execute: (_args, context) =>
      new Promise((_resolve, reject) => {
        started();
        context.signal.addEventListener("abort", () => {
          stopped(context.signal.reason);
          reject(new Error("stopped"));
        });
      }),
  });
}

test("the deadline passes during a client-side tool call: deadline_exceeded, the tool is told", async () => {
  const baseline = await activeResources();
  let toolStarted = false;
  let toolStopped: unknown;
  const client = new PtcClient({ address: serving.address });
  const slow = waitingTool(
    () => {
      toolStarted = true;
    },
    (reason) => {
      toolStopped = reason;
    },
  );
  const run = client.stream("import tools\ntools.slow()", { tools: [slow], deadlineMs: 1500 });
  const iterated = (async () => {
    for await (const _ of run) {
      // events until the error
    }
  })();
  await assert.rejects(settlesWithin(run.result, 5000).then(unwrap), typed(["deadline_exceeded"]));
  await assert.rejects(settlesWithin(iterated, 1000).then(unwrap), typed(["deadline_exceeded"]));
  assert.ok(toolStarted);
  assert.ok(toolStopped instanceof Error);
  const executionId = run.executionId;
  client.close();
  assert.deepEqual(await activeResources(), baseline);
  await recordedCancelled(executionId);
  await stillServes();
});

test("the AbortSignal fires during a client-side tool call: aborted_by_signal, the tool is told", async () => {
  const baseline = await activeResources();
  const controller = new AbortController();
  let toolStopped: unknown;
  const client = new PtcClient({ address: serving.address });
  const slow = waitingTool(
    () => controller.abort(new Error("user pressed stop")),
    (reason) => {
      toolStopped = reason;
    },
  );
  const started = Date.now();
  const result = client.execute("import tools\ntools.slow()", {
    tools: [slow],
    signal: controller.signal,
  });
  await assert.rejects(settlesWithin(result, 5000).then(unwrap), (error: unknown) => {
    assert.ok(error instanceof PtcError);
    assert.equal(error.code, "aborted_by_signal");
    assert.match(error.message, /user pressed stop/);
    return true;
  });
  assert.ok(Date.now() - started < 3000);
  assert.ok(toolStopped instanceof Error);
  client.close();
  assert.deepEqual(await activeResources(), baseline);
  await stillServes();
});

test("a signal aborted before the call: aborted_by_signal at once, nothing sent", async () => {
  const client = new PtcClient({ address: serving.address });
  const signal = AbortSignal.abort(new Error("too late"));
  await assert.rejects(client.execute("print(1)", { signal }), typed(["aborted_by_signal"]));
  await assert.rejects(client.getExecution("x", { signal }), typed(["aborted_by_signal"]));
  client.close();
});

// The unary Execute is the SDK's own gRPC path (src/transport/unary.ts), not connect's: the
// same guarantees, checked on it. The script sleeps far past the test, so only the cut ends it.
for (const [name, code, cut] of [
  [
    "the AbortSignal fires",
    "aborted_by_signal",
    (controller: AbortController) => ({
      signal: controller.signal,
      timer: setTimeout(() => controller.abort(new Error("user pressed stop")), 300),
    }),
  ],
  ["the deadline passes", "deadline_exceeded", () => ({ deadlineMs: 300, timer: undefined })],
] as const) {
  test(`${name} during a unary Execute: ${code}, no handle left, the server serves on`, async () => {
    const baseline = await activeResources();
    const client = new PtcClient({ address: serving.address });
    const { timer, ...options } = cut(new AbortController());
    const started = Date.now();
    await assert.rejects(
      settlesWithin(client.execute("import time\ntime.sleep(60)", options), 5000).then(unwrap),
      typed([code]),
    );
    assert.ok(Date.now() - started < 3000, "the call outlived its cut");
    clearTimeout(timer);
    client.close();
    assert.deepEqual(await activeResources(), baseline);
    await stillServes();
  });
}
