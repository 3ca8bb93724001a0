/**
 * A message over a size cap is "message_too_large", never "rate_limited" (issue 37): the two
 * share the gRPC status RESOURCE_EXHAUSTED but not a remedy, so a caller must tell them apart by
 * code. Against a real `ptc serve`: a result larger than the client's `readMaxBytes`, on unary
 * Execute and on the stream, fails with the cap and the size in typed fields, is not retried,
 * leaves no handle open, and the server serves on; a request over the server's own receive
 * limit is the server's "message_too_large". (The server's rate limit staying "rate_limited",
 * with its retry-after, is in errors.test.ts.)
 */

import assert from "node:assert/strict";
import { test } from "node:test";
import { MessageTooLargeError, PtcClient, PtcError } from "../src/index.js";
import { activeResources, settlesWithin } from "./support/serve.js";
import { servedClient } from "./support/served.js";

const served = servedClient("--allow-degraded");
const READ_MAX = 2048;
// 10 000 bytes of stdout: the result message is larger than READ_MAX whatever else it holds.
const BIG = "print('x' * 10_000)";

function unwrap<T>(outcome: PromiseSettledResult<T>): T {
  if (outcome.status === "rejected") throw outcome.reason;
  return outcome.value;
}

/** The client's own readMaxBytes refused a response: the fields say so. */
function tooLargeResponse(error: unknown): boolean {
  assert.ok(error instanceof MessageTooLargeError, `not MessageTooLargeError: ${String(error)}`);
  assert.equal(error.code, "message_too_large");
  assert.equal(error.grpcCode, 8);
  assert.equal(error.side, "client");
  assert.equal(error.direction, "response");
  assert.equal(error.limitBytes, READ_MAX);
  assert.equal(error.attempts, undefined, "a size cap was retried");
  return true;
}

async function stillServes(): Promise<void> {
  assert.equal((await served.client.execute("print('alive')")).stdout, "alive\n");
}

test("unary Execute: a result over readMaxBytes is message_too_large with its size", async () => {
  const baseline = await activeResources();
  const client = new PtcClient({ address: served.serving.address, readMaxBytes: READ_MAX });
  // A small answer still passes under the cap.
  assert.equal((await client.execute("print(1)")).stdout, "1\n");
  await assert.rejects(
    settlesWithin(client.execute(BIG), 10_000).then(unwrap),
    (error: unknown) => {
      tooLargeResponse(error);
      assert.ok(error instanceof MessageTooLargeError);
      // The unary path reads the size from the message's prefix.
      assert.ok((error.sizeBytes ?? 0) > 10_000, `size ${error.sizeBytes}`);
      assert.match(error.message, /larger than configured readMaxBytes 2048/);
      return true;
    },
  );
  client.close();
  assert.deepEqual(await activeResources(), baseline);
  await stillServes();
});

test("stream: a result over readMaxBytes is message_too_large, iteration and result alike", async () => {
  const baseline = await activeResources();
  const client = new PtcClient({ address: served.serving.address, readMaxBytes: READ_MAX });
  const run = client.stream(BIG);
  const iterated = (async () => {
    for await (const _event of run) {
      // events before the large one, if any, are fine
    }
  })();
  await assert.rejects(settlesWithin(run.result, 10_000).then(unwrap), tooLargeResponse);
  await assert.rejects(settlesWithin(iterated, 2000).then(unwrap), tooLargeResponse);
  client.close();
  assert.deepEqual(await activeResources(), baseline);
  await stillServes();
});

test("readMaxBytes that is not a positive whole number is refused, naming it", () => {
  for (const bad of [0, -1, 1.5, Number.NaN]) {
    assert.throws(
      () => new PtcClient({ address: served.serving.address, readMaxBytes: bad }),
      (error: unknown) => {
        assert.ok(error instanceof PtcError, String(error));
        assert.equal(error.code, "invalid_argument");
        assert.equal(
          error.message,
          `readMaxBytes: a whole number of bytes of at least 1, got ${bad}`,
        );
        return true;
      },
    );
  }
});
