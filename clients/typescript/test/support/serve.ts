/**
 * A real `ptc serve` for the tests, as `tests/ptc_serve.py` starts one for the Python suite: on
 * an ephemeral loopback port, its address read from the line it prints first, its audit a
 * SQLite file in a temporary directory of its own, stopped with SIGTERM (exit code 0 expected)
 * and the directory removed. `ptc` is `$PTC_BIN`, else the checkout's `.venv/bin/ptc`, else the
 * one on PATH (`scripts/test.sh` puts `.venv/bin` there).
 */

import { type ChildProcess, spawn, spawnSync } from "node:child_process";
import { createHash } from "node:crypto";
import { existsSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";

/** clients/typescript, from dist/test/support. */
export const PACKAGE_ROOT = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..", "..");
export const REPO_ROOT = resolve(PACKAGE_ROOT, "..", "..");

export function ptcBinary(): string {
  if (process.env.PTC_BIN) return process.env.PTC_BIN;
  const venv = join(REPO_ROOT, ".venv", "bin", "ptc");
  return existsSync(venv) ? venv : "ptc";
}

/** The venv's python (for the test certificates, made by tests/server/tls_support.py). */
export function venvPython(): string {
  return join(dirname(ptcBinary()), "python");
}

export interface Serving {
  address: string; // http://127.0.0.1:PORT
  hostPort: string;
  dir: string;
  pid: number;
  stop(): Promise<{ code: number | null; stderr: string }>;
}

export async function startServe(...args: string[]): Promise<Serving> {
  const dir = mkdtempSync(join(tmpdir(), "ptc-ts-test-"));
  const child: ChildProcess = spawn(
    ptcBinary(),
    [
      "serve",
      "--listen",
      "127.0.0.1:0",
      "--audit-db",
      join(dir, "audit.db"),
      "--pool-size",
      "1",
      ...args,
    ],
    { cwd: dir, stdio: ["ignore", "pipe", "pipe"] },
  );
  // A test file that dies (a timeout, a crash) must not leave its server behind.
  const backstop = () => child.kill("SIGKILL");
  process.once("exit", backstop);
  let stderr = "";
  child.stderr?.setEncoding("utf8");
  child.stderr?.on("data", (chunk: string) => {
    stderr += chunk;
  });
  const exited = new Promise<number | null>((done) => child.once("exit", (code) => done(code)));
  const lines = createInterface({ input: child.stdout as NodeJS.ReadableStream });
  let hostPort = "";
  for await (const line of lines) {
    if (line.startsWith("listening on ")) {
      hostPort = line.split(" ").at(-1) ?? "";
      break;
    }
  }
  lines.close();
  child.stdout?.resume(); // later lines are not read, but must not fill the pipe
  if (hostPort === "") {
    const code = await exited;
    rmSync(dir, { recursive: true, force: true });
    throw new Error(`ptc serve did not start (exit ${code}): ${stderr}`);
  }
  return {
    address: `http://${hostPort}`,
    hostPort,
    dir,
    pid: child.pid ?? 0,
    async stop() {
      if (child.exitCode === null && child.signalCode === null) child.kill("SIGTERM");
      const timer = setTimeout(() => child.kill("SIGKILL"), 30_000);
      const code = await exited;
      clearTimeout(timer);
      process.off("exit", backstop);
      rmSync(dir, { recursive: true, force: true });
      return { code, stderr };
    },
  };
}

/** A tenants file with one tenant per key, as the server reads it (`sha256:` key hashes). */
export function tenantsFile(dir: string, keys: Record<string, string>): string {
  const path = join(dir, "tenants.toml");
  const body = Object.entries(keys)
    .map(([tenant, key]) => {
      const hash = `sha256:${createHash("sha256").update(key).digest("hex")}`;
      return `[[tenant]]\nid = "${tenant}"\nkeys = ["${hash}"]\n`;
    })
    .join("");
  writeFileSync(path, body);
  return path;
}

export interface Certificates {
  ca: string;
  serverCert: string;
  serverKey: string;
  clientsCa: string;
  clientCert: string;
  clientKey: string;
}

/** A server certificate for 127.0.0.1 and a client certificate, each from its own CA, made by
 * the Python suite's own helper so that both suites test the same kind of certificates. */
export function makeCertificates(dir: string): Certificates {
  const code = [
    "import sys, pathlib",
    `sys.path.insert(0, ${JSON.stringify(REPO_ROOT)})`,
    "from tests.server.tls_support import issue, make_ca",
    `d = pathlib.Path(${JSON.stringify(dir)})`,
    "ca = make_ca(d, 'ts-ca'); clients = make_ca(d, 'ts-clients-ca')",
    "issue(ca, d, 'server', server=True); issue(clients, d, 'client', server=False)",
  ].join("\n");
  const done = spawnSync(venvPython(), ["-c", code], { encoding: "utf8" });
  if (done.status !== 0) throw new Error(`certificates: ${done.stderr}`);
  return {
    ca: join(dir, "ts-ca.crt"),
    serverCert: join(dir, "server.crt"),
    serverKey: join(dir, "server.key"),
    clientsCa: join(dir, "ts-clients-ca.crt"),
    clientCert: join(dir, "client.crt"),
    clientKey: join(dir, "client.key"),
  };
}

/** The process's active resources (handles, timers) once pending callbacks have run. */
export async function activeResources(): Promise<string[]> {
  for (let i = 0; i < 5; i++) await new Promise((done) => setImmediate(done));
  return process.getActiveResourcesInfo().sort();
}

/** Fails unless `promise` settles within `ms` (a pending promise is a leak). */
export async function settlesWithin<T>(
  promise: Promise<T>,
  ms: number,
): Promise<PromiseSettledResult<T>> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<"late">((done) => {
    timer = setTimeout(() => done("late"), ms);
  });
  const outcome = await Promise.race([
    promise.then(
      (value): PromiseSettledResult<T> => ({ status: "fulfilled", value }),
      (reason: unknown): PromiseSettledResult<T> => ({ status: "rejected", reason }),
    ),
    late,
  ]);
  clearTimeout(timer);
  if (outcome === "late") throw new Error(`a promise was still pending after ${ms} ms`);
  return outcome;
}
