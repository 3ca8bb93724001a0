/**
 * A frozen server must not hang its clients (as `tests/client/test_keepalive.py` holds for the
 * Python SDK): against a real `ptc serve` frozen with SIGSTOP, a client with keepalive pings
 * fails the stream, a unary execute (through its retries) and a session's cell with
 * "unavailable" saying that the server stopped answering keepalive pings, in bounded time; after
 * SIGCONT the server serves a new client. Pings at the fastest rate allowed, on a call quiet for
 * seconds, are never answered with GOAWAY too_many_pings.
 */

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { KEEPALIVE_FAILURE, MIN_KEEPALIVE_INTERVAL_MS, PtcClient, PtcError } from "../src/index.js";
import { type Serving, startServe } from "./support/serve.js";

/** A ping after 1 s without data, 1 s to answer. */
const FAST = { intervalMs: 1000, timeoutMs: 1000 };
/** Noticed within ~2 s on an idle machine; generous for a loaded one, far below "forever". */
const BOUND_MS = 30_000;
const CHATTY = "import time\nfor i in range(600):\n    print(i, flush=True)\n    time.sleep(0.1)";
const QUIET = "import time\ntime.sleep(30)\nprint('woke')";

let serving: Serving;
before(async () => {
  serving = await startServe();
});
after(async () => {
  const stopped = await serving.stop();
  assert.equal(stopped.code, 0, stopped.stderr);
  assert.doesNotMatch(stopped.stderr, /Traceback/);
});

/** `run` with the server frozen by `freeze()`, thawed (SIGCONT) however it ends. */
async function whileFrozen<T>(run: (freeze: () => void) => Promise<T>): Promise<T> {
  try {
    return await run(() => process.kill(serving.pid, "SIGSTOP"));
  } finally {
    process.kill(serving.pid, "SIGCONT");
  }
}

function assertNamesKeepalive(error: unknown): void {
  assert.ok(error instanceof PtcError, `ended with ${String(error)}`);
  assert.equal(error.code, "unavailable", error.message);
  assert.equal(error.grpcCode, 14);
  assert.ok(error.message.startsWith(`${KEEPALIVE_FAILURE}: a ping sent after 1 s`), error.message);
  assert.match(error.message, /not answered within 1 s/);
}

async function assertServesAgain(): Promise<void> {
  const client = new PtcClient({ address: serving.address });
  try {
    const result = await client.execute("print('thawed')", { deadlineMs: BOUND_MS });
    assert.equal(result.stdout, "thawed\n");
  } finally {
    client.close();
  }
}

/** What `promise` settled with (its error, or its value), failing if it took over `ms`. */
async function settled(promise: Promise<unknown>, ms: number): Promise<unknown> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`still waiting after ${ms} ms`)), ms);
  });
  try {
    return await Promise.race([
      promise.then(
        (value) => value,
        (error: unknown) => error,
      ),
      late,
    ]);
  } finally {
    clearTimeout(timer);
  }
}

describe("a frozen server", () => {
  test("ends the stream with unavailable naming keepalive", async () => {
    const client = new PtcClient({ address: serving.address, keepalive: FAST });
    try {
      const { took, ended } = await whileFrozen(async (freeze) => {
        const run = client.stream(CHATTY);
        let outputs = 0;
        let frozenAt = 0;
        const iterate = async (): Promise<number> => {
          for await (const event of run) {
            if (event.kind === "output" && ++outputs === 3) {
              freeze();
              frozenAt = Date.now();
            }
          }
          return outputs;
        };
        const ended = await settled(iterate(), BOUND_MS + 10_000);
        assert.ok(frozenAt > 0, `fewer than 3 outputs came: ${String(ended)}`);
        assertNamesKeepalive(await settled(run.result, 1000)); // the result says the same
        return { took: Date.now() - frozenAt, ended };
      });
      assertNamesKeepalive(ended);
      assert.ok(took < BOUND_MS, `took ${took} ms`);
    } finally {
      client.close();
    }
    await assertServesAgain();
  });

  test("ends a unary execute, through its retries, naming keepalive", async () => {
    const client = new PtcClient({ address: serving.address, keepalive: FAST });
    try {
      assert.ok(client.retry.attempts > 1); // the default policy: the failure is retried
      const started = Date.now();
      const ended = await whileFrozen(async (freeze) => {
        const timer = setTimeout(freeze, 1500); // while the script sleeps
        try {
          return await settled(client.execute(QUIET), 2 * BOUND_MS);
        } finally {
          clearTimeout(timer);
        }
      });
      assertNamesKeepalive(ended);
      assert.ok(ended instanceof PtcError && ended.attempts === client.retry.attempts);
      assert.ok(Date.now() - started < 2 * BOUND_MS);
    } finally {
      client.close();
    }
    await assertServesAgain();
  });

  test("ends a session's cell naming keepalive", async () => {
    const client = new PtcClient({
      address: serving.address,
      keepalive: FAST,
      retry: { attempts: 1 },
    });
    try {
      const session = await client.createSession();
      await session.run("x = 41");
      const started = Date.now();
      const ended = await whileFrozen(async (freeze) => {
        const timer = setTimeout(freeze, 1500); // while the cell sleeps
        try {
          return await settled(session.run("import time\ntime.sleep(30)"), BOUND_MS + 10_000);
        } finally {
          clearTimeout(timer);
        }
      });
      assertNamesKeepalive(ended);
      assert.ok(Date.now() - started < BOUND_MS);
    } finally {
      client.close();
    }
    await assertServesAgain();
  });
});

test("keepalive values are checked when the client is made", () => {
  assert.throws(
    () => new PtcClient({ address: serving.address, keepalive: { intervalMs: 200 } }),
    (error: unknown) =>
      error instanceof PtcError &&
      error.code === "invalid_argument" &&
      error.message.startsWith("keepalive.intervalMs: at least 1000 ms"),
  );
  assert.throws(
    () => new PtcClient({ address: serving.address, keepalive: { timeoutMs: 0 } }),
    /keepalive\.timeoutMs: a positive number/,
  );
  new PtcClient({ address: serving.address, keepalive: false }).close();
});

test("pings at the fastest rate allowed are never refused as too many", async () => {
  // A unary call quiet for 6 s, a ping a second without data: a default gRPC server sends
  // GOAWAY too_many_pings at the third. Then a default client's calls over a few seconds.
  const fastest = new PtcClient({
    address: serving.address,
    keepalive: { intervalMs: MIN_KEEPALIVE_INTERVAL_MS, timeoutMs: 5000 },
    retry: { attempts: 1 }, // a GOAWAY must fail the call, not be retried
  });
  try {
    const quiet = await fastest.execute("import time\ntime.sleep(6)\nprint('done')", {
      deadlineMs: BOUND_MS,
    });
    assert.equal(quiet.stdout, "done\n");
  } finally {
    fastest.close();
  }
  const plain = new PtcClient({ address: serving.address, retry: { attempts: 1 } });
  try {
    for (let i = 0; i < 3; i++) {
      assert.equal((await plain.execute("print(1)", { deadlineMs: BOUND_MS })).stdout, "1\n");
      await new Promise((done) => setTimeout(done, 1000));
    }
  } finally {
    plain.close();
  }
});
