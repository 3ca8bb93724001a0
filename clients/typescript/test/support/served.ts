/**
 * The setup every test file against one server shares: a `ptc serve` (test/support/serve.ts)
 * and a `PtcClient` to it, for the whole file, with the server's clean exit checked at the end.
 */

import assert from "node:assert/strict";
import { after, before } from "node:test";
import { PtcClient } from "../../src/index.js";
import { type Serving, startServe } from "./serve.js";

/** A file's server and its client, ready from the file's `before` hook on. */
export interface Served {
  readonly serving: Serving;
  readonly client: PtcClient;
}

/**
 * One `ptc serve` and one `PtcClient` for the calling test file: started in a `before` hook,
 * closed and stopped in an `after` hook, where the server must exit 0 with no traceback in its
 * log (a test that made the server crash or log an internal error fails here, not silently).
 * Call it at the top level of the file; read `client` and `serving` inside tests only.
 */
export function servedClient(...args: string[]): Served {
  let serving: Serving | undefined;
  let client: PtcClient | undefined;
  before(async () => {
    serving = await startServe(...args);
    client = new PtcClient({ address: serving.address });
  });
  after(async () => {
    client?.close();
    if (serving === undefined) return;
    const stopped = await serving.stop();
    assert.equal(stopped.code, 0, stopped.stderr);
    assert.doesNotMatch(stopped.stderr, /Traceback/);
  });
  const ready = <T>(value: T | undefined): T => {
    if (value === undefined) throw new Error("servedClient: read it inside a test, not at load");
    return value;
  };
  return {
    get serving() {
      return ready(serving);
    },
    get client() {
      return ready(client);
    },
  };
}
