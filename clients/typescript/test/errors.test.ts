/**
 * The error cases a caller must tell apart without reading a message, each produced by a real
 * `ptc serve`: rate limited (with the server's retry-after), a session that ended (and why), a
 * draining server; and the server's own message formats for the cases a test cannot easily
 * make happen (a session lost with its sandbox), checked table-driven against `errorFromStatus`.
 */

import assert from "node:assert/strict";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { connect, createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { Code, ConnectError } from "@connectrpc/connect";
import { errorFromStatus, GrpcCode, toPtcError } from "../src/errors.js";
import {
  MessageTooLargeError,
  PtcClient,
  PtcError,
  RateLimitedError,
  SessionLostError,
} from "../src/index.js";
import { startServe, tenantsFile } from "./support/serve.js";

test("rate limited: RateLimitedError with the server's retry-after, not retried", async () => {
  const dir = mkdtempSync(join(tmpdir(), "ptc-ts-rate-"));
  const tenants = tenantsFile(dir, { slow: "key-slow" });
  writeFileSync(tenants, `${readFileSync(tenants, "utf8")}rate_per_minute = 1\nrate_burst = 1\n`);
  const serving = await startServe("--allow-degraded", "--tenants", tenants);
  const client = new PtcClient({ address: serving.address, apiKey: "key-slow" });
  try {
    assert.equal((await client.execute("print(1)")).status, "ok");
    const started = Date.now();
    await assert.rejects(client.execute("print(2)"), (error: unknown) => {
      assert.ok(error instanceof RateLimitedError, String(error));
      assert.equal(error.code, "rate_limited");
      assert.equal(error.grpcCode, GrpcCode.RESOURCE_EXHAUSTED);
      assert.ok(
        error.retryAfterMs !== undefined &&
          error.retryAfterMs > 50_000 &&
          error.retryAfterMs <= 60_000,
      );
      return true;
    });
    assert.ok(Date.now() - started < 2000, "a rate limit was retried");
  } finally {
    client.close();
    const stopped = await serving.stop();
    rmSync(dir, { recursive: true, force: true });
    assert.equal(stopped.code, 0, stopped.stderr);
  }
});

test("a session that ended: SessionLostError naming it and why; a draining server: draining", async () => {
  const serving = await startServe("--allow-degraded", "--grace", "10");
  const client = new PtcClient({ address: serving.address, retry: { attempts: 1 } });
  try {
    const session = await client.createSession({ maxExecutions: 1 });
    assert.equal((await session.run("x = 1")).status, "ok");
    await assert.rejects(session.run("x"), (error: unknown) => {
      assert.ok(error instanceof SessionLostError, String(error));
      assert.equal(error.code, "session_lost");
      assert.equal(error.sessionId, session.id);
      assert.match(error.reason, /^expired: /);
      return true;
    });
    const running = client.execute("import time\ntime.sleep(2)\nprint('finished')");
    await new Promise((done) => setTimeout(done, 700));
    process.kill(serving.pid, "SIGTERM");
    await new Promise((done) => setTimeout(done, 300));
    await assert.rejects(client.execute("print(1)"), (error: unknown) => {
      assert.ok(error instanceof PtcError);
      assert.equal(error.code, "draining", error.message);
      assert.equal(error.grpcCode, GrpcCode.UNAVAILABLE);
      return true;
    });
    assert.equal((await running).stdout, "finished\n"); // in flight: let finish
  } finally {
    client.close();
    const stopped = await serving.stop();
    assert.equal(stopped.code, 0, stopped.stderr);
  }
});

const CASES: [string, number, string, string, Record<string, unknown>][] = [
  [
    "a lost session (sandbox/sessions/session.py gone_error)",
    GrpcCode.FAILED_PRECONDITION,
    "session_lost: session 's-1f' is lost: memory: the sandbox used 268435456 bytes",
    "session_lost",
    { sessionId: "s-1f", reason: "memory: the sandbox used 268435456 bytes" },
  ],
  [
    "a closed session",
    GrpcCode.NOT_FOUND,
    "session_lost: session 's-2' is closed: closed by the client",
    "session_lost",
    { sessionId: "s-2", reason: "closed: closed by the client" },
  ],
  [
    "a session whose server is stopping (sandbox/server/runner.py)",
    GrpcCode.FAILED_PRECONDITION,
    "session_lost: session 's-3' is ending: the server that holds it is shutting down",
    "session_lost",
    { sessionId: "s-3", reason: "ending: the server that holds it is shutting down" },
  ],
  [
    "an idempotency key reused (sandbox/server/idempotency.py)",
    GrpcCode.FAILED_PRECONDITION,
    "idempotency_key: 'k' was already used for execution abc with another script; a key names one request",
    "idempotency_key_reused",
    {},
  ],
  [
    "a key whose record is gone is not a reuse",
    GrpcCode.FAILED_PRECONDITION,
    "idempotency_key: 'k' was admitted as execution abc, whose record is gone (retention pruned it)",
    "failed_precondition",
    {},
  ],
  [
    "no new sessions while stopping (sandbox/sessions/manager.py)",
    GrpcCode.FAILED_PRECONDITION,
    "sessions: the server is stopping; no new sessions",
    "draining",
    {},
  ],
  [
    "a busy session",
    GrpcCode.FAILED_PRECONDITION,
    "session 's-4' is running another execution",
    "failed_precondition",
    {},
  ],
  [
    "a plain unavailable",
    GrpcCode.UNAVAILABLE,
    "execution not admitted: disk full",
    "unavailable",
    {},
  ],
  [
    "a request over the server's receive limit (grpc's own refusal, as a real server words it)",
    GrpcCode.RESOURCE_EXHAUSTED,
    "SERVER: Received message larger than max (76000006 vs. 75497472)",
    "message_too_large",
    { side: "server", direction: "request", sizeBytes: 76000006, limitBytes: 75497472 },
  ],
  [
    "a response over the server's send limit",
    GrpcCode.RESOURCE_EXHAUSTED,
    "SERVER: Sent message larger than max (90000000 vs. 80000000)",
    "message_too_large",
    { side: "server", direction: "response", sizeBytes: 90000000, limitBytes: 80000000 },
  ],
  [
    "the queue full (sandbox/tenants/registry.py)",
    GrpcCode.RESOURCE_EXHAUSTED,
    "tenant t: 4 executions running (the maximum) and 8 waiting (the queue is full)",
    "rate_limited",
    { retryAfterMs: undefined },
  ],
  [
    "a tenant's session maximum (sandbox/sessions/manager.py)",
    GrpcCode.RESOURCE_EXHAUSTED,
    "sessions: tenant 't' has 2 open sessions, its maximum; close one first",
    "rate_limited",
    {},
  ],
  ["an unknown status", 99, "what", "internal", {}],
];

for (const [name, code, message, expected, fields] of CASES) {
  test(`the server's message for ${name} is "${expected}"`, () => {
    const error = errorFromStatus(code, message);
    assert.equal(error.code, expected);
    assert.equal(error.grpcCode, code);
    assert.equal(error.message, message);
    for (const [field, value] of Object.entries(fields)) {
      assert.equal((error as unknown as Record<string, unknown>)[field], value, field);
    }
  });
}

test("the client's own size caps (connect's wording, no grpc-status) are message_too_large", () => {
  const cases = [
    ["message size 10 is larger than configured writeMaxBytes 5", "request", 10, 5],
    ["message size is larger than configured readMaxBytes 7", "response", undefined, 7],
  ] as const;
  for (const [text, direction, sizeBytes, limitBytes] of cases) {
    const error = toPtcError(new ConnectError(text, Code.ResourceExhausted));
    assert.ok(error instanceof MessageTooLargeError, String(error));
    assert.equal(error.code, "message_too_large");
    assert.equal(error.grpcCode, GrpcCode.RESOURCE_EXHAUSTED);
    assert.deepEqual(
      [error.side, error.direction, error.sizeBytes, error.limitBytes],
      ["client", direction, sizeBytes, limitBytes],
    );
  }
});

test("retry-after: seconds as text become milliseconds; garbage is no hint", () => {
  const hinted = errorFromStatus(GrpcCode.RESOURCE_EXHAUSTED, "queue full", "1.5");
  assert.ok(hinted instanceof RateLimitedError);
  assert.equal(hinted.retryAfterMs, 1500);
  const garbage = errorFromStatus(GrpcCode.RESOURCE_EXHAUSTED, "queue full", "soon");
  assert.ok(garbage instanceof RateLimitedError);
  assert.equal(garbage.retryAfterMs, undefined);
});

test("no server there: unavailable after the policy's attempts, with the key to ask again", async () => {
  const client = new PtcClient({
    address: "http://127.0.0.1:1",
    retry: { attempts: 3, backoffMs: 20 },
  });
  try {
    await assert.rejects(
      client.execute("print(1)", { idempotencyKey: "ask-again-1" }),
      (error: unknown) => {
        assert.ok(error instanceof PtcError, String(error));
        assert.equal(error.code, "unavailable", error.message);
        assert.equal(error.attempts, 3);
        assert.equal(error.idempotencyKey, "ask-again-1");
        return true;
      },
    );
    // The deadline bounds the attempts together: far fewer than 50 fit in 300 ms of backoff.
    const many = new PtcClient({
      address: "http://127.0.0.1:1",
      retry: { attempts: 50, backoffMs: 100 },
    });
    const started = Date.now();
    await assert.rejects(many.execute("print(1)", { deadlineMs: 300 }), (error: unknown) => {
      assert.ok(error instanceof PtcError);
      assert.ok((error.attempts ?? 0) < 50, String(error.attempts));
      return true;
    });
    assert.ok(Date.now() - started < 1500);
    // The caller's signal during the pause between attempts ends the call as aborted.
    const controller = new AbortController();
    setTimeout(() => controller.abort(new Error("stop retrying")), 150);
    await assert.rejects(
      many.execute("print(1)", { signal: controller.signal }),
      (error: unknown) => {
        assert.ok(error instanceof PtcError);
        assert.equal(error.code, "aborted_by_signal", error.message);
        assert.match(error.message, /stop retrying/);
        return true;
      },
    );
    many.close();
  } finally {
    client.close();
  }
});

test("a connection cut after the request was sent: retried with the same key, one execution", async () => {
  const serving = await startServe("--allow-degraded");
  const [host, port] = serving.hostPort.split(":");
  let connections = 0;
  // A proxy that cuts its first connection 800 ms in (the script is running by then) and
  // carries the later ones whole: the first attempt's outcome is unknown to the client.
  const proxy = createServer((inbound) => {
    connections += 1;
    const outbound = connect(Number(port), host);
    inbound.pipe(outbound).pipe(inbound);
    inbound.on("error", () => outbound.destroy());
    outbound.on("error", () => inbound.destroy());
    if (connections === 1) {
      setTimeout(() => {
        inbound.destroy();
        outbound.destroy();
      }, 800);
    }
  });
  await new Promise<void>((done) => proxy.listen(0, "127.0.0.1", done));
  const address = proxy.address();
  assert.ok(address !== null && typeof address === "object");
  const client = new PtcClient({
    address: `http://127.0.0.1:${address.port}`,
    retry: { backoffMs: 50 },
  });
  const direct = new PtcClient({ address: serving.address });
  try {
    const key = `cut-${Date.now()}`;
    const result = await client.execute(
      "import time, random\ntime.sleep(1.5)\nprint(random.random())",
      {
        idempotencyKey: key,
      },
    );
    assert.equal(result.status, "ok");
    assert.ok(connections >= 2, "the first connection was not cut");
    const page = await direct.listExecutions({ pageSize: 100 });
    const withKey = page.records.filter((r) => r.idempotencyKey === key);
    assert.equal(withKey.length, 1, "the retry ran the script again");
    assert.equal(withKey[0]?.result.executionId, result.executionId);
    assert.equal(withKey[0]?.result.stdout, result.stdout);
  } finally {
    client.close();
    direct.close();
    await new Promise((done) => proxy.close(done));
    const stopped = await serving.stop();
    assert.equal(stopped.code, 0, stopped.stderr);
  }
});
