/**
 * What the TypeScript SDK costs against the Python SDK, same server, same run:
 *
 *     npm run build && node dist/bench/sdk_overhead.js [--rounds 6] [--list 100] [--print 30] [--tools 3]
 *
 * One `ptc serve` (process backend) serves three clients: the TypeScript SDK (`PtcClient`, in
 * this process), the Python SDK (its `AsyncClient`, in a worker process, `.venv/bin/python`,
 * taking orders on stdin) and the baseline, a unary gRPC call made by hand over `node:http2`
 * (`bare_grpc.ts`). They are measured in interleaved blocks on warm connections, the order of
 * the three turning every round, so that a machine busier in one moment than the next weighs
 * on all of them alike. Three workloads: ListSessions (a unary call the server answers from
 * memory, well under a millisecond), `print(1)` through the unary Execute, and a script making
 * 100 client-side tool calls over the stream (each a round trip to a function of the client).
 *
 * The target is about a client's *per-call overhead*, defined here as the client's p50 minus
 * the bare call's p50 on the same workload in the same run. The bare call costs the server's own
 * handling plus the least a client on this machine spends on the wire, so the difference is
 * what the SDK adds: encoding, its own layers, decoding into its types. (The server's own time
 * cannot be read from the answer instead: its only clock is the script's wall time, in whole
 * milliseconds.) Beside it, the median over rounds of the same difference taken within one
 * round, to show the noise. Read the ListSessions rows for the overhead: in `print(1)` the
 * server spawns and reaps a sandbox, whose time varies by milliseconds from call to call on a
 * shared machine, more than either SDK's overhead, so that row's differences are mostly noise
 * (printed because the acceptance names it). Both SDKs' overheads are a fraction of a
 * millisecond; their ratio is printed as the target states it, and is unstable when both are
 * near zero.
 *
 * Client tools: (p50 of the 100-call script - p50 of print(1)) / 100 per SDK, a call being a
 * stream message each way plus the client's function; no bare baseline, as the stream's
 * protocol is the SDKs' own work.
 */

import { spawn } from "node:child_process";
import { randomUUID } from "node:crypto";
import { createInterface } from "node:readline";
import { parseArgs } from "node:util";
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import * as pb from "../src/gen/ptc/sandbox/v1/sandbox_pb.js";
import { clientTool, PtcClient } from "../src/index.js";
import { REPO_ROOT, startServe, venvPython } from "../test/support/serve.js";
import { BareGrpc } from "./bare_grpc.js";

const TOOLS_SCRIPT =
  "import tools\ns = 0\nfor i in range(100):\n    s += tools.add(a=i, b=1)\nprint(s)";

const PYTHON_WORKER = `
import asyncio, json, sys, time
from sandbox.client import AsyncClient, function_tool

SCRIPT = ${JSON.stringify(TOOLS_SCRIPT)}

def add(a: int, b: int):
    return a + b

async def main(address):
    add_tool = function_tool(add)
    async with AsyncClient(address) as client:
        print("ready", flush=True)
        for line in sys.stdin:
            kind, count = line.split()
            times = []
            for _ in range(int(count)):
                started = time.perf_counter()
                if kind == "list":
                    await client.list_sessions()
                    times.append((time.perf_counter() - started) * 1000)
                    continue
                if kind == "print":
                    result = await client.execute("print(1)")
                else:
                    result = await client.run(SCRIPT, tools=[add_tool])
                times.append((time.perf_counter() - started) * 1000)
                assert result.status == "ok", result
            print(json.dumps(times), flush=True)

asyncio.run(main(sys.argv[1]))
`;

function p50(values: readonly number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  const middle = Math.floor(sorted.length / 2);
  return sorted.length % 2 === 1
    ? (sorted[middle] ?? 0)
    : ((sorted[middle - 1] ?? 0) + (sorted[middle] ?? 0)) / 2;
}

type Who = "bare" | "ts" | "py";
const ORDERS: readonly (readonly Who[])[] = [
  ["bare", "ts", "py"],
  ["py", "bare", "ts"],
  ["ts", "py", "bare"],
  ["py", "ts", "bare"],
  ["bare", "py", "ts"],
  ["ts", "bare", "py"],
];
const EXECUTE_PATH = `/${pb.SandboxService.typeName}/${pb.SandboxService.method.execute.name}`;
const LIST_PATH = `/${pb.SandboxService.typeName}/${pb.SandboxService.method.listSessions.name}`;

type Unary = "list" | "print";

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      rounds: { type: "string", default: "6" },
      list: { type: "string", default: "100" },
      print: { type: "string", default: "30" },
      tools: { type: "string", default: "3" },
    },
  });
  const rounds = Number(values.rounds);
  const counts = {
    list: Number(values.list),
    print: Number(values.print),
    tools: Number(values.tools),
  };
  const serving = await startServe("--allow-degraded", "--pool-size", "2");
  const worker = spawn(venvPython(), ["-c", PYTHON_WORKER, serving.hostPort], {
    cwd: REPO_ROOT,
    stdio: ["pipe", "pipe", "inherit"],
  });
  const lines = createInterface({ input: worker.stdout })[Symbol.asyncIterator]();
  const readLine = async (): Promise<string> => {
    const next = await lines.next();
    if (next.done === true) throw new Error("the Python worker ended");
    return next.value;
  };
  const client = new PtcClient({ address: serving.address });
  const bare = new BareGrpc(serving.address);
  const add = clientTool({
    name: "add",
    inputSchema: {
      type: "object",
      properties: { a: { type: "integer" }, b: { type: "integer" } },
      required: ["a", "b"],
    },
    execute: ({ a, b }: { a: number; b: number }) => a + b,
  });
  // Per workload, per client, per round: the times of that round's block.
  const unary: Record<Unary, Record<Who, number[][]>> = {
    list: { bare: [], ts: [], py: [] },
    print: { bare: [], ts: [], py: [] },
  };
  const tools: Record<"ts" | "py", number[][]> = { ts: [], py: [] };
  const tsCall = async (kind: Unary | "tools"): Promise<void> => {
    if (kind === "list") {
      await client.listSessions();
      return;
    }
    const result =
      kind === "print"
        ? await client.execute("print(1)")
        : await client.execute(TOOLS_SCRIPT, { tools: [add] });
    if (result.status !== "ok") throw new Error(`TS ${kind}: ${result.status} ${result.stderr}`);
  };
  const tsBlock = async (kind: Unary | "tools"): Promise<number[]> => {
    const times: number[] = [];
    for (let i = 0; i < counts[kind]; i++) {
      const started = performance.now();
      await tsCall(kind);
      times.push(performance.now() - started);
    }
    return times;
  };
  const pyBlock = async (kind: Unary | "tools"): Promise<number[]> => {
    worker.stdin.write(`${kind} ${counts[kind]}\n`);
    return JSON.parse(await readLine()) as number[];
  };
  const bareBlock = async (kind: Unary): Promise<number[]> => {
    // Encoded before the clock starts; each Execute with its own idempotency key, as the SDKs.
    const requests = Array.from({ length: counts[kind] }, () =>
      kind === "list"
        ? toBinary(pb.ListSessionsRequestSchema, create(pb.ListSessionsRequestSchema))
        : toBinary(
            pb.ExecuteRequestSchema,
            create(pb.ExecuteRequestSchema, { script: "print(1)", idempotencyKey: randomUUID() }),
          ),
    );
    const path = kind === "list" ? LIST_PATH : EXECUTE_PATH;
    const times: number[] = [];
    const answers: Uint8Array[] = [];
    for (const request of requests) {
      const started = performance.now();
      const answer = await bare.call(path, request);
      times.push(performance.now() - started);
      if (answer.grpcStatus !== "0") throw new Error(`bare: grpc-status ${answer.grpcStatus}`);
      answers.push(answer.message);
    }
    for (const message of kind === "print" ? answers : []) {
      const result = fromBinary(pb.ExecutionResultSchema, message);
      if (result.status !== pb.ExecutionStatus.OK)
        throw new Error(`bare: ${pb.ExecutionStatus[result.status]}`);
    }
    return times;
  };
  try {
    if ((await readLine()) !== "ready") throw new Error("the Python worker did not start");
    // Warm all three (connections, the server's stub cache, the pool) before measuring.
    for (const kind of ["list", "print", "tools"] as const) {
      await tsCall(kind);
      worker.stdin.write(`${kind} 1\n`);
      await readLine();
    }
    await bareBlock("list");
    await bareBlock("print");
    for (let round = 0; round < rounds; round++) {
      const order = ORDERS[round % ORDERS.length] ?? ["bare", "ts", "py"];
      for (const kind of ["list", "print"] as const) {
        for (const who of order) {
          unary[kind][who].push(
            await (who === "bare" ? bareBlock(kind) : who === "ts" ? tsBlock(kind) : pyBlock(kind)),
          );
        }
      }
      for (const who of order) {
        if (who === "ts") tools.ts.push(await tsBlock("tools"));
        if (who === "py") tools.py.push(await pyBlock("tools"));
      }
    }
  } finally {
    worker.stdin.end();
    client.close();
    bare.close();
    await new Promise((done) => worker.once("exit", done));
    await serving.stop();
  }
  report(rounds, counts, unary, tools);
}

const ms = (value: number) => `${value.toFixed(2)} ms`;
/** One line of the report: its label in a column, then its figures. */
const row = (label: string, figures: string) => console.log(`${label.padEnd(27)}${figures}`);
const ratio = (ts: number, py: number) => `${(ts / py).toFixed(2)}x`;

/** The p50s of one unary workload and each SDK's overhead over the bare call. */
function unaryRows(name: string, times: Record<Who, number[][]>): void {
  const p = { bare: p50(times.bare.flat()), ts: p50(times.ts.flat()), py: p50(times.py.flat()) };
  const over = { ts: p.ts - p.bare, py: p.py - p.bare };
  // The same difference within each round, then its median over the rounds.
  const paired = (who: "ts" | "py") =>
    p50(times[who].map((block, i) => p50(block) - p50(times.bare[i] ?? [])));
  row(`${name} p50:`, `bare ${ms(p.bare)}   TS ${ms(p.ts)}   Python ${ms(p.py)}`);
  row(
    "  overhead over bare:",
    `TS ${ms(over.ts)}   Python ${ms(over.py)}   ratio ${ratio(over.ts, over.py)} (target <= 1.30x)`,
  );
  row(
    "  same, paired per round:",
    `TS ${ms(paired("ts"))}   Python ${ms(paired("py"))}   ratio ${ratio(paired("ts"), paired("py"))}`,
  );
}

function report(
  rounds: number,
  counts: Record<Unary | "tools", number>,
  unary: Record<Unary, Record<Who, number[][]>>,
  tools: Record<"ts" | "py", number[][]>,
): void {
  console.log(
    `${rounds} rounds, the clients' order turning; per block: ListSessions x${counts.list},` +
      ` print(1) x${counts.print}, 100-call script x${counts.tools}`,
  );
  unaryRows("ListSessions", unary.list);
  unaryRows("print(1)", unary.print);
  const printP50 = { ts: p50(unary.print.ts.flat()), py: p50(unary.print.py.flat()) };
  const t = { ts: p50(tools.ts.flat()), py: p50(tools.py.flat()) };
  const perCall = { ts: (t.ts - printP50.ts) / 100, py: (t.py - printP50.py) / 100 };
  row(
    "100 client tool calls p50:",
    `TS ${ms(t.ts)}   Python ${ms(t.py)}   ratio ${ratio(t.ts, t.py)}`,
  );
  row(
    "  per tool call overhead:",
    `TS ${ms(perCall.ts)}   Python ${ms(perCall.py)}   ratio ${ratio(perCall.ts, perCall.py)} (target <= 1.30x)`,
  );
  console.log(
    "(the unary overhead is ListSessions': print(1)'s server time spreads by more than either" +
      " SDK adds; both near zero make their ratio unstable. docs/benchmarks.md has recorded runs)",
  );
}

await main();
