/**
 * API keys, TLS and mTLS against a real `ptc serve`: the key travels as the Python SDK sends it
 * (`authorization: Bearer`), a missing or wrong one is "unauthenticated"; a TLS server serves a
 * client given its CA; under mTLS a client without a certificate is refused at the handshake
 * and one with a certificate from the clients' CA is served.
 */

import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, test } from "node:test";
import { PtcClient, PtcError } from "../src/index.js";
import { createNodeTransport } from "../src/transport/node.js";
import {
  type Certificates,
  makeCertificates,
  type Serving,
  startServe,
  tenantsFile,
} from "./support/serve.js";

const KEY = "ptc-ts-test-key-0123456789abcdef";
let dir: string;
let certs: Certificates;
let keyed: Serving;
let tls: Serving;
let mtls: Serving;

before(async () => {
  dir = mkdtempSync(join(tmpdir(), "ptc-ts-tls-"));
  certs = makeCertificates(dir);
  const tenants = tenantsFile(dir, { acme: KEY });
  [keyed, tls, mtls] = await Promise.all([
    startServe("--allow-degraded", "--tenants", tenants),
    startServe("--allow-degraded", "--tls-cert", certs.serverCert, "--tls-key", certs.serverKey),
    startServe(
      "--allow-degraded",
      "--tenants",
      tenants,
      "--tls-cert",
      certs.serverCert,
      "--tls-key",
      certs.serverKey,
      "--tls-client-ca",
      certs.clientsCa,
    ),
  ]);
});

after(async () => {
  for (const serving of [keyed, tls, mtls]) {
    const stopped = await serving.stop();
    assert.equal(stopped.code, 0, stopped.stderr);
  }
  rmSync(dir, { recursive: true, force: true });
});

function isCode(code: string) {
  return (error: unknown) => {
    assert.ok(error instanceof PtcError, String(error));
    assert.equal(error.code, code, error.message);
    return true;
  };
}

test("API key: served with it; none or a wrong one is unauthenticated", async () => {
  const good = new PtcClient({ address: keyed.address, apiKey: KEY });
  const none = new PtcClient({ address: keyed.address, retry: { attempts: 1 } });
  const wrong = new PtcClient({
    address: keyed.address,
    apiKey: "not-the-key",
    retry: { attempts: 1 },
  });
  try {
    assert.equal((await good.execute("print(2)")).stdout, "2\n");
    await assert.rejects(none.execute("print(2)"), isCode("unauthenticated"));
    await assert.rejects(wrong.listSessions(), isCode("unauthenticated"));
    // The stream is refused the same way, and its iterator throws the same error.
    const run = wrong.stream("print(2)");
    await assert.rejects(run.result, isCode("unauthenticated"));
    await assert.rejects(
      (async () => {
        for await (const _ of run) {
          // nothing arrives
        }
      })(),
      isCode("unauthenticated"),
    );
  } finally {
    for (const c of [good, none, wrong]) c.close();
  }
});

test("TLS: served given the CA; a plaintext client is refused", async () => {
  const secure = new PtcClient({ address: tls.hostPort, tls: { ca: certs.ca } });
  const plain = new PtcClient({ address: tls.address, retry: { attempts: 1 } });
  try {
    assert.equal((await secure.execute("print('tls')")).stdout, "tls\n");
    await assert.rejects(plain.execute("print(1)", { deadlineMs: 5000 }), (error: unknown) => {
      assert.ok(error instanceof PtcError);
      assert.ok(
        ["unavailable", "protocol", "internal"].includes(error.code),
        `${error.code}: ${error.message}`,
      );
      return true;
    });
  } finally {
    secure.close();
    plain.close();
  }
});

test("mTLS: a client certificate from the clients' CA is served, none is refused", async () => {
  const transport = createNodeTransport({
    address: mtls.hostPort,
    tls: { ca: certs.ca, cert: certs.clientCert, key: certs.clientKey },
  });
  const withCert = new PtcClient({ transport, apiKey: KEY });
  const without = new PtcClient({
    address: mtls.hostPort,
    apiKey: KEY,
    tls: { ca: certs.ca },
    retry: { attempts: 1 },
  });
  try {
    assert.equal((await withCert.execute("print('mtls')")).stdout, "mtls\n");
    await assert.rejects(without.execute("print(1)", { deadlineMs: 5000 }), isCode("unavailable"));
  } finally {
    withCert.close();
    without.close();
    transport.close();
  }
});

test("TLS options are checked before any connection", () => {
  assert.throws(
    () => createNodeTransport({ address: "127.0.0.1:1", tls: { cert: certs.clientCert } }),
    /tls.cert: a client certificate needs its key; tls.key is not set/,
  );
  assert.throws(
    () => createNodeTransport({ address: "127.0.0.1:1", tls: { ca: join(dir, "missing.pem") } }),
    /tls.ca .*missing.pem: ENOENT/,
  );
  assert.throws(
    () => createNodeTransport({ address: "127.0.0.1:1", tls: { ca: "MIIB" } }),
    /tls.ca .*ENOENT/,
  );
  assert.throws(
    () => createNodeTransport({ address: "http://127.0.0.1:1", tls: { ca: certs.ca } }),
    /address: http:\/\/127.0.0.1:1 is plaintext/,
  );
});
