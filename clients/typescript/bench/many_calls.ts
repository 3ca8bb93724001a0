/**
 * Many executions at once over one `PtcClient`: does every call end, and how?
 *
 *     npm run build && node dist/bench/many_calls.js [--sending 240] [--file-bytes 1048576]
 *       [--answered 24] [--stdout-bytes 100] [--stall-ms 3000] [--mode mixed|stream|unary]
 *       [--deadline-ms 45000] [--attempts 1] [--pool 8]
 *
 * One `ptc serve` (process backend, warm pool `--pool`), reached through a TCP relay
 * (`test/support/relay.ts`). First `--answered` calls with small requests that sleep 1.5 s on
 * the server; then `--sending` calls that each carry an input file of `--file-bytes`; then the
 * relay's uplink stalls for `--stall-ms` (0: never), as a server too busy to read its socket
 * makes it, while the first calls' answers come back. Every script prints `--stdout-bytes`. Calls
 * go over the stream, the unary Execute, or alternate (`mixed`), each with `--deadline-ms` and
 * the retry policy's `--attempts` (1: a refused call shows, rather than running again). Each
 * ends `ok`, `result:<status>`, `error:<code>` or `hung` (`test/support/load.ts`).
 *
 * Beside the tally, what `node:http2` said about the connection: the server's settings,
 * `goaway`, `frameError`, session errors, and how each stream closed (its reset code; 11 is
 * ENHANCE_YOUR_CALM, Node refusing a header block over `maxSessionMemory`), read by wrapping
 * `http2.connect` in this process (`NODE_DEBUG=http2` says more).
 */

import { createRequire, syncBuiltinESMExports } from "node:module";
import { parseArgs } from "node:util";
import { PtcClient } from "../src/index.js";
import { call, tally } from "../test/support/load.js";
import { startRelay } from "../test/support/relay.js";
import { startServe } from "../test/support/serve.js";

const require = createRequire(import.meta.url);
const http2 = require("node:http2") as typeof import("node:http2");

/** What the connection's sessions and streams reported, counted by kind. */
const seen = new Map<string, number>();
const note = (what: string) => seen.set(what, (seen.get(what) ?? 0) + 1);

function watchHttp2(): void {
  const connect = http2.connect;
  http2.connect = ((...args: Parameters<typeof connect>) => {
    const session = connect(...args);
    note("session");
    session.on("goaway", (code, last) => note(`session goaway code ${code} last stream ${last}`));
    session.on("frameError", (type, code) => note(`session frameError type ${type} code ${code}`));
    session.on("error", (error: NodeJS.ErrnoException) => note(`session error ${error.code}`));
    session.on("remoteSettings", (s) =>
      note(`server settings initialWindowSize ${s.initialWindowSize}`),
    );
    const request = session.request.bind(session);
    session.request = ((...a: Parameters<typeof request>) => {
      const stream = request(...a);
      stream.on("frameError", (type, code) => note(`stream frameError type ${type} code ${code}`));
      stream.on("close", () => note(`stream closed, reset code ${stream.rstCode}`));
      return stream;
    }) as typeof session.request;
    return session;
  }) as typeof connect;
  syncBuiltinESMExports();
}

const pause = (ms: number) => new Promise((done) => setTimeout(done, ms));

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      sending: { type: "string", default: "240" },
      "file-bytes": { type: "string", default: String(1024 * 1024) },
      answered: { type: "string", default: "24" },
      "stdout-bytes": { type: "string", default: "100" },
      "stall-ms": { type: "string", default: "3000" },
      mode: { type: "string", default: "mixed" },
      "deadline-ms": { type: "string", default: "45000" },
      attempts: { type: "string", default: "1" },
      pool: { type: "string", default: "8" },
    },
  });
  const number = (name: keyof typeof values) => {
    const value = Number(values[name]);
    if (!Number.isSafeInteger(value) || value < 0) throw new Error(`--${name}: a whole number`);
    return value;
  };
  const mode = values.mode;
  if (mode !== "stream" && mode !== "unary" && mode !== "mixed") {
    throw new Error(`--mode: stream, unary or mixed, got ${mode}`);
  }
  const streamed = (i: number) => mode === "stream" || (mode === "mixed" && i % 2 === 0);
  const [deadlineMs, stdoutBytes, fileBytes] = [
    number("deadline-ms"),
    number("stdout-bytes"),
    number("file-bytes"),
  ];
  watchHttp2();
  const serving = await startServe("--allow-degraded", "--pool-size", String(number("pool")));
  const relay = await startRelay(serving.address);
  const client = new PtcClient({
    address: relay.address,
    retry: { attempts: Math.max(1, number("attempts")) },
  });
  try {
    await client.execute("print(1)", { deadlineMs }); // the connection, warm
    const started = Date.now();
    const answered = Array.from({ length: number("answered") }, (_, i) =>
      call(client, { streamed: streamed(i), sleepS: 1.5, stdoutBytes, fileBytes: 0, deadlineMs }),
    );
    await pause(300);
    const sending = Array.from({ length: number("sending") }, (_, i) =>
      call(client, { streamed: streamed(i), sleepS: 0, stdoutBytes, fileBytes, deadlineMs }),
    );
    if (number("stall-ms") > 0) relay.stall(number("stall-ms"));
    const ends = await Promise.all([...answered, ...sending]);
    console.log(
      `${answered.length} answered + ${sending.length} sending ${fileBytes} bytes (${mode}): ` +
        `${Date.now() - started} ms`,
    );
    for (const [outcome, count] of Object.entries(tally(ends))) {
      const example = ends.find((end) => end.outcome === outcome);
      const slowest = Math.max(...ends.filter((e) => e.outcome === outcome).map((e) => e.ms));
      console.log(`  ${outcome}: ${count} (slowest ${slowest} ms) ${example?.detail ?? ""}`);
    }
    console.log("node:http2 said:");
    for (const [what, count] of [...seen].sort()) console.log(`  ${what}: ${count}`);
    process.exitCode = ends.every((end) => end.outcome === "ok") ? 0 : 1;
  } finally {
    client.close();
    relay.close();
    const stopped = await serving.stop();
    if (stopped.code !== 0) console.log(stopped.stderr.slice(-2000));
  }
}

await main();
