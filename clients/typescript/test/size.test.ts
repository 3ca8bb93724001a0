/**
 * A message over a size cap is "message_too_large", never "rate_limited" (issue 37): the two
 * share the gRPC status RESOURCE_EXHAUSTED but not a remedy, so a caller must tell them apart by
 * code. Against a real `ptc serve`: a result larger than the client's `readMaxBytes`, on unary
 * Execute and on the stream, fails with the cap and the size in typed fields, is not retried,
 * leaves no handle open, and the server serves on; a request over the server's own receive
 * limit is the server's "message_too_large". (The server's rate limit staying "rate_limited",
 * with its retry-after, is in errors.test.ts.)
 *
 * A request over the server's receive limit is refused by the server as soon as it has read the
 * message's length prefix; the caller must get that refusal at once, with no deadline set:
 * written whole, such a request made Node drop the server's answer and the call hung
 * (`src/transport/pieces.ts`).
 */

import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { test } from "node:test";
import { create, toBinary } from "@bufbuild/protobuf";
import { executeRequest } from "../src/client.js";
import { ClientMessageSchema, ExecuteRequestSchema } from "../src/gen/ptc/sandbox/v1/sandbox_pb.js";
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

/** A message over a size cap, refused by `side`: the typed fields say so, and it was not
 * retried. The size is checked when given (a response cut on the stream does not know it). */
function tooLarge(
  error: unknown,
  side: "client" | "server",
  direction: "request" | "response",
  limitBytes: number,
  sizeBytes?: number,
): boolean {
  assert.ok(error instanceof MessageTooLargeError, `not MessageTooLargeError: ${String(error)}`);
  assert.equal(error.code, "message_too_large");
  assert.equal(error.grpcCode, 8);
  assert.equal(error.side, side);
  assert.equal(error.direction, direction);
  assert.equal(error.limitBytes, limitBytes);
  if (sizeBytes !== undefined) assert.equal(error.sizeBytes, sizeBytes);
  assert.equal(error.attempts, undefined, "a size cap was retried");
  return true;
}

/** The client's own readMaxBytes refused a response. */
function tooLargeResponse(error: unknown): boolean {
  return tooLarge(error, "client", "response", READ_MAX);
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

// Just under: a request larger than Node's maxSessionMemory (10 MB) and than a piece, which the
// server takes, reaches it whole and in order, on unary Execute and on the stream.
test("a 12 MiB request the server takes arrives whole, unary and stream alike", async () => {
  const content = new Uint8Array(12 * 1024 * 1024);
  for (let i = 0; i < content.length; i++) content[i] = (i * 31 + (i >> 12)) & 0xff;
  const digest = createHash("sha256").update(content).digest("hex");
  const options = {
    files: [{ name: "big.bin", content }],
    limits: { inputBytes: 16 * 1024 * 1024, fileSizeBytes: 32 * 1024 * 1024 },
  };
  const script = "import hashlib\nprint(hashlib.sha256(open('big.bin', 'rb').read()).hexdigest())";
  const unary = await settlesWithin(served.client.execute(script, options), 30_000).then(unwrap);
  assert.equal(unary.stdout, `${digest}\n`, unary.stderr);
  const streamed = await settlesWithin(served.client.stream(script, options).result, 30_000);
  assert.equal(unwrap(streamed).stdout, `${digest}\n`);
});

// The server's grpc.max_receive_message_length: RECEIVE_LIMIT_BYTES in sandbox/server/app.py.
const SERVER_RECEIVE_LIMIT = 72 * 1024 * 1024;
// A script just over it (one request at a time: each is ~73 MiB, held a few times over).
const OVER = `#${"x".repeat(SERVER_RECEIVE_LIMIT + 1024)}`;
const KEY = "size-test-over-the-server-limit";

const REQUEST = executeRequest(OVER, { idempotencyKey: KEY }).request;
/** The sizes of the message over the limit: unary Execute's request, the stream's first. */
const UNARY_BYTES = toBinary(ExecuteRequestSchema, REQUEST).byteLength;
const STREAM_BYTES = toBinary(
  ClientMessageSchema,
  create(ClientMessageSchema, { message: { case: "start", value: REQUEST } }),
).byteLength;

/** The server's own refusal of our request, with its limit and the message's exact size. */
function tooLargeRequest(error: unknown, sizeBytes: number): boolean {
  return tooLarge(error, "server", "request", SERVER_RECEIVE_LIMIT, sizeBytes);
}

test("unary Execute: a request over the server's receive limit is the server's message_too_large, at once", async () => {
  const baseline = await activeResources();
  const client = new PtcClient({ address: served.serving.address });
  // No deadline: before the fix this waited forever.
  await assert.rejects(
    settlesWithin(client.execute(OVER, { idempotencyKey: KEY }), 10_000).then(unwrap),
    (error: unknown) => tooLargeRequest(error, UNARY_BYTES),
  );
  // The same connection still serves.
  assert.equal((await client.execute("print(2)")).stdout, "2\n");
  client.close();
  assert.deepEqual(await activeResources(), baseline);
  await stillServes();
});

test("stream: a request over the server's receive limit is the server's message_too_large, at once", async () => {
  const baseline = await activeResources();
  const client = new PtcClient({ address: served.serving.address });
  const run = client.stream(OVER, { idempotencyKey: KEY });
  const iterated = (async () => {
    for await (const _event of run) {
      // no event comes before the refusal
    }
  })();
  const refused = (error: unknown) => tooLargeRequest(error, STREAM_BYTES);
  await assert.rejects(settlesWithin(run.result, 10_000).then(unwrap), refused);
  await assert.rejects(settlesWithin(iterated, 2000).then(unwrap), refused);
  assert.equal((await client.stream("print(3)").result).stdout, "3\n");
  client.close();
  assert.deepEqual(await activeResources(), baseline);
  await stillServes();
});
