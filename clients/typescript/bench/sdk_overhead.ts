/**
 * What the TypeScript SDK costs against the Python SDK, same server, same run:
 *
 *     npm run build && node dist/bench/sdk_overhead.js [--rounds 4] [--print 10] [--tools 4]
 *
 * One `ptc serve` (process backend) serves both clients. The Python SDK runs in a worker
 * process (`.venv/bin/python`, its `AsyncClient`) that takes orders on stdin, so the two are
 * measured in interleaved blocks (TS, Python, then Python, TS in the next round), each block a
 * few calls on a warm connection: `print(1)` through the unary Execute, and a script making 100
 * client-side tool calls over the stream (each call a round trip to the client's function).
 *
 * Printed: p50 of each, and the per-call overhead of a client-side tool call, taken as
 * (p50 of the 100-call script - p50 of print(1)) / 100 for each SDK; the ratio TS / Python is
 * the figure the target is about (the TS client adds at most 1.3x the Python one's).
 */

import { spawn } from "node:child_process";
import { createInterface } from "node:readline";
import { parseArgs } from "node:util";
import { clientTool, PtcClient } from "../src/index.js";
import { REPO_ROOT, startServe, venvPython } from "../test/support/serve.js";

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
                if kind == "print":
                    result = await client.execute("print(1)")
                else:
                    result = await client.run(SCRIPT, tools=[add_tool])
                times.append((time.perf_counter() - started) * 1000)
                assert result.status == "ok", result
            print(json.dumps(times), flush=True)

asyncio.run(main(sys.argv[1]))
`;

function p50(values: number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  const middle = Math.floor(sorted.length / 2);
  return sorted.length % 2 === 1
    ? (sorted[middle] ?? 0)
    : ((sorted[middle - 1] ?? 0) + (sorted[middle] ?? 0)) / 2;
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      rounds: { type: "string", default: "4" },
      print: { type: "string", default: "10" },
      tools: { type: "string", default: "4" },
    },
  });
  const rounds = Number(values.rounds);
  const counts = { print: Number(values.print), tools: Number(values.tools) };
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
  const add = clientTool({
    name: "add",
    inputSchema: {
      type: "object",
      properties: { a: { type: "integer" }, b: { type: "integer" } },
      required: ["a", "b"],
    },
    execute: ({ a, b }: { a: number; b: number }) => a + b,
  });
  const ts = { print: [] as number[], tools: [] as number[] };
  const py = { print: [] as number[], tools: [] as number[] };
  try {
    if ((await readLine()) !== "ready") throw new Error("the Python worker did not start");
    const tsBlock = async (kind: "print" | "tools") => {
      for (let i = 0; i < counts[kind]; i++) {
        const started = performance.now();
        const result =
          kind === "print"
            ? await client.execute("print(1)")
            : await client.execute(TOOLS_SCRIPT, { tools: [add] });
        ts[kind].push(performance.now() - started);
        if (result.status !== "ok")
          throw new Error(`TS ${kind}: ${result.status} ${result.stderr}`);
      }
    };
    const pyBlock = async (kind: "print" | "tools") => {
      worker.stdin.write(`${kind} ${counts[kind]}\n`);
      py[kind].push(...(JSON.parse(await readLine()) as number[]));
    };
    // Warm both (connections, the server's stub cache, the pool) before measuring.
    await client.execute("print(1)");
    await client.execute(TOOLS_SCRIPT, { tools: [add] });
    worker.stdin.write("print 1\ntools 1\n");
    await readLine();
    await readLine();
    for (let round = 0; round < rounds; round++) {
      for (const kind of ["print", "tools"] as const) {
        if (round % 2 === 0) {
          await tsBlock(kind);
          await pyBlock(kind);
        } else {
          await pyBlock(kind);
          await tsBlock(kind);
        }
      }
    }
  } finally {
    worker.stdin.end();
    client.close();
    await new Promise((done) => worker.once("exit", done));
    await serving.stop();
  }
  const figures = {
    ts: { print: p50(ts.print), tools: p50(ts.tools) },
    py: { print: p50(py.print), tools: p50(py.tools) },
  };
  const perCall = (f: { print: number; tools: number }) => (f.tools - f.print) / 100;
  const fmt = (ms: number) => `${ms.toFixed(2)} ms`;
  console.log(
    `rounds ${rounds}; per block: print(1) x${counts.print}, 100-call script x${counts.tools}`,
  );
  console.log(
    `print(1) p50:              TS ${fmt(figures.ts.print)}   Python ${fmt(figures.py.print)}   ratio ${(figures.ts.print / figures.py.print).toFixed(2)}x`,
  );
  console.log(
    `100 client tool calls p50: TS ${fmt(figures.ts.tools)}   Python ${fmt(figures.py.tools)}   ratio ${(figures.ts.tools / figures.py.tools).toFixed(2)}x`,
  );
  console.log(
    `per tool call overhead:    TS ${fmt(perCall(figures.ts))}   Python ${fmt(perCall(figures.py))}   ratio ${(perCall(figures.ts) / perCall(figures.py)).toFixed(2)}x (target <= 1.30x)`,
  );
}

await main();
