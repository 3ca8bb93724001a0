/**
 * Many executions at once over one client: every call ends with its result, none is refused
 * by the client's own HTTP/2 layer, none hangs. Against a real `ptc serve` through a TCP relay
 * (`support/relay.ts`) whose uplink stalls for a few seconds, as a server too busy to read its
 * socket makes it: 240 calls, each with a 256 KiB input file, are being sent while 24 earlier
 * calls finish and their answers come back.
 *
 * Before the session's write budget (`src/transport/budget.ts`), the client handed Node a piece
 * of every request at once; what Node could not yet write to the socket counted against the
 * connection's `maxSessionMemory` (10 MB), and while over it Node refused every header block
 * the server sent: a finished call's answer was reset (ENHANCE_YOUR_CALM) by the client itself,
 * and the call failed (or, with retries, ran again) although the server had answered it.
 */

import assert from "node:assert/strict";
import { test } from "node:test";
import { PtcClient } from "../src/index.js";
import { call, type Ended, tally } from "./support/load.js";
import { startRelay } from "./support/relay.js";
import { servedClient } from "./support/served.js";

const served = servedClient("--allow-degraded", "--pool-size", "8");

const ANSWERED = 24;
const SENDING = 240;
const FILE_BYTES = 1024 * 1024;
const DEADLINE_MS = 45_000;

const pause = (ms: number) => new Promise((done) => setTimeout(done, ms));

test("calls answered while many large requests wait on a stalled uplink all end with their result", async () => {
  const relay = await startRelay(served.serving.address);
  // One attempt: a call the client's HTTP/2 layer refused must show here, not be run again.
  const client = new PtcClient({ address: relay.address, retry: { attempts: 1 } });
  try {
    await client.execute("print(1)", { deadlineMs: DEADLINE_MS }); // the connection, warm
    const answered = Array.from({ length: ANSWERED }, (_, i) =>
      call(client, {
        streamed: i % 2 === 0,
        sleepS: 1.5,
        stdoutBytes: 100,
        fileBytes: 0,
        deadlineMs: DEADLINE_MS,
      }),
    );
    await pause(300);
    const sending = Array.from({ length: SENDING }, (_, i) =>
      call(client, {
        streamed: i % 2 === 0,
        sleepS: 0,
        stdoutBytes: 100,
        fileBytes: FILE_BYTES,
        deadlineMs: DEADLINE_MS,
      }),
    );
    await pause(200);
    relay.stall(3_000);
    const ends: Ended[] = await Promise.all([...answered, ...sending]);
    const failed = ends.filter((end) => end.outcome !== "ok").slice(0, 3);
    assert.deepEqual(
      tally(ends),
      { ok: ANSWERED + SENDING },
      `not every call ended with its result: ${JSON.stringify(tally(ends))}, e.g. ${JSON.stringify(failed)}`,
    );
    // The connection still serves.
    const after = await client.execute("print(2)", { deadlineMs: DEADLINE_MS });
    assert.equal(after.stdout, "2\n");
  } finally {
    client.close();
    relay.close();
  }
});
