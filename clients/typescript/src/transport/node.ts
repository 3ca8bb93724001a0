/**
 * `ptc-sandbox/node`: the gRPC transport over HTTP/2 for Node, speaking the real gRPC protocol
 * to the grpcio server, with TLS and mTLS: the streaming call by connect-node's gRPC transport,
 * the unary calls by our own (`unary.ts`, which says why) on the same connection. The only module of
 * the package that imports Node built-ins; the root entry loads it lazily at the first call
 * when no `transport` is given.
 *
 *     import { createNodeTransport } from "ptc-sandbox/node";
 *     const transport = createNodeTransport({ address: "https://ptc.internal:50051",
 *       tls: { ca: "/etc/ptc/ca.pem", cert: "/etc/ptc/client.pem", key: "/etc/ptc/client.key" } });
 */

import { readFileSync } from "node:fs";
import type { Http2Session } from "node:http2";
import { connect as tcpConnect } from "node:net";
import type { Duplex } from "node:stream";
import { connect as tlsConnect } from "node:tls";
import type { Transport } from "@connectrpc/connect";
import {
  createGrpcTransport,
  type GrpcTransportOptions,
  Http2SessionManager,
} from "@connectrpc/connect-node";

type SessionManager = NonNullable<GrpcTransportOptions["sessionManager"]>;

import { PtcError } from "../errors.js";
import { type KeepaliveOptions, namingKeepalive, resolveKeepalive } from "../keepalive.js";
import { WriteBudget } from "./budget.js";
import { writesInPieces } from "./pieces.js";
import { createUnary } from "./unary.js";

/** A PEM file's path, its text, or its bytes. */
export type PemLike = string | Uint8Array;

export interface TlsOptions {
  /** The CA bundle to trust; unset: the system's CAs. */
  ca?: PemLike;
  /** mTLS: the client certificate chain (needs `key`). */
  cert?: PemLike;
  /** mTLS: the client certificate's private key (needs `cert`). */
  key?: PemLike;
  /** The name to check the server's certificate against, when not the address's host. */
  serverName?: string;
}

export interface NodeTransportOptions {
  /** `http://host:port`, `https://host:port`, or `host:port` (https when `tls` is given). */
  address: string;
  tls?: TlsOptions;
  /** Largest message received; default 64 MiB (results carry output files). */
  readMaxBytes?: number;
  /** HTTP/2 keepalive pings (`keepalive.ts`): on by default (a PING after 20 s without data,
   * answered within 15 s); `false`: none, and a frozen server holds a call until its deadline. */
  keepalive?: KeepaliveOptions | false;
}

/** A transport the client can close: it owns one HTTP/2 connection. */
export interface ClosableTransport extends Transport {
  close(): void;
}

function pem(name: string, value: PemLike): Buffer {
  let data: Buffer;
  let where = "(bytes)";
  if (typeof value === "string" && !value.includes("-----BEGIN ")) {
    where = value;
    try {
      data = readFileSync(value);
    } catch (error) {
      throw new PtcError("invalid_argument", `tls.${name} ${value}: ${(error as Error).message}`, {
        cause: error,
      });
    }
  } else {
    data = Buffer.from(value);
  }
  if (!data.includes("-----BEGIN ")) {
    throw new PtcError("invalid_argument", `tls.${name} ${where}: not PEM (no '-----BEGIN' line)`);
  }
  return data;
}

/** The base URL for `address`: a scheme is added when missing, https with TLS. */
export function baseUrl(address: string, tls: boolean): string {
  const url = /^[a-z][a-z0-9+.-]*:\/\//i.test(address)
    ? address
    : `${tls ? "https" : "http"}://${address}`;
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    throw new PtcError(
      "invalid_argument",
      `address: not host:port or a URL: ${JSON.stringify(address)}`,
    );
  }
  if (parsed.protocol !== "http:" && parsed.protocol !== "https:") {
    throw new PtcError(
      "invalid_argument",
      `address: the scheme must be http or https, got ${parsed.protocol}`,
    );
  }
  if (tls && parsed.protocol === "http:") {
    throw new PtcError(
      "invalid_argument",
      `address: ${address} is plaintext (http) but tls options are set`,
    );
  }
  return parsed.origin;
}

export function createNodeTransport(options: NodeTransportOptions): ClosableTransport {
  const tls = options.tls;
  if (tls !== undefined && (tls.cert === undefined) !== (tls.key === undefined)) {
    const [given, missing] = tls.key === undefined ? ["cert", "key"] : ["key", "cert"];
    throw new PtcError(
      "invalid_argument",
      `tls.${given}: a client certificate needs its key; tls.${missing} is not set`,
    );
  }
  const url = baseUrl(options.address, tls !== undefined);
  const tlsOptions =
    tls === undefined
      ? undefined
      : {
          ...(tls.ca === undefined ? {} : { ca: pem("ca", tls.ca) }),
          ...(tls.cert === undefined ? {} : { cert: pem("cert", tls.cert) }),
          ...(tls.key === undefined ? {} : { key: pem("key", tls.key) }),
        };
  // Every socket is ours, made here and destroyed by `close()`: a connection that failed (a
  // server answering garbage) is one connect-node no longer tracks, and its socket would
  // otherwise stay open, holding the process.
  const sockets = new Set<Duplex>();
  const parsed = new URL(url);
  const host = parsed.hostname.replace(/^\[|\]$/g, "");
  const port = Number(parsed.port || (tlsOptions === undefined ? 80 : 443));
  const nodeOptions = {
    createConnection: (): Duplex => {
      const socket =
        tlsOptions === undefined
          ? tcpConnect({ host, port })
          : tlsConnect({
              host,
              port,
              ALPNProtocols: ["h2"],
              servername: tls?.serverName ?? (/^[\d.:]+$/.test(host) ? undefined : host),
              ...tlsOptions,
            });
      socket.setNoDelay(true); // a call is a few small frames: Nagle would hold them back
      sockets.add(socket);
      socket.once("close", () => sockets.delete(socket));
      return socket;
    },
  };
  // Our own session manager, so that `close()` can end the connection: an idle HTTP/2 session
  // would otherwise keep the process alive until connect-node's idle timeout.
  const keepalive = resolveKeepalive(options.keepalive);
  const pings =
    keepalive === undefined
      ? {}
      : { pingIntervalMs: keepalive.intervalMs, pingTimeoutMs: keepalive.timeoutMs };
  const budget = new WriteBudget();
  const sessionManager = guarded(new Http2SessionManager(url, pings, nodeOptions), budget);
  const readMaxBytes = options.readMaxBytes ?? 64 * 1024 * 1024;
  if (!Number.isSafeInteger(readMaxBytes) || readMaxBytes < 1) {
    throw new TypeError(`readMaxBytes: a whole number of bytes of at least 1, got ${readMaxBytes}`);
  }
  const transport = createGrpcTransport({
    baseUrl: url,
    sessionManager,
    nodeOptions,
    readMaxBytes,
  });
  const unary = createUnary({
    sessionManager: { ...sessionManager, request: sessionManager.unwritten },
    readMaxBytes,
    budget,
  });
  const stream = transport.stream.bind(transport);
  const named = (error: unknown): unknown =>
    keepalive === undefined ? error : namingKeepalive(error, keepalive);
  return {
    // Unary calls are ours (`unary.ts`: connect's per-call machinery was most of their cost);
    // the bidirectional stream is connect's, on the same connection. A call ended by an
    // unanswered keepalive ping fails saying so (`keepalive.ts`).
    unary: (...args) =>
      unary(...args).catch((error: unknown) => {
        throw named(error);
      }),
    stream: async (...args) => {
      const response = await stream(...args).catch((error: unknown) => {
        throw named(error);
      });
      return { ...response, message: renamed(response.message, named) };
    },
    close: () => {
      sessionManager.close();
      for (const socket of sockets) socket.destroy();
      sockets.clear();
    },
  };
}

/** `messages`, whose failure is `named`'s reading of it. */
async function* renamed<T>(
  messages: AsyncIterable<T>,
  named: (error: unknown) => unknown,
): AsyncIterable<T> {
  try {
    yield* messages;
  } catch (error) {
    throw named(error);
  }
}

/**
 * `manager` with every HTTP/2 session it hands out kept from crashing the process, and ended
 * for good when it fails or the client closes, and the writes of connect's streams made in
 * pieces within the connection's budget (`pieces.ts`, `budget.ts`); `unwritten` hands out
 * streams whose writer does that itself (`unary.ts`), unchanged: a write made in pieces twice
 * would take the budget twice, and wait for itself once the budget is spent. A server that
 * answers garbage makes a session emit "error" more than once, and connect-node's own listener
 * is gone by the second, which Node then throws as uncaught; and the failed session's socket
 * stayed open. The error also reaches every stream of the session, so each call still fails
 * with it (as a `PtcError`).
 */
function guarded(
  manager: Http2SessionManager,
  budget: WriteBudget,
): SessionManager & { unwritten: SessionManager["request"]; close(): void } {
  const live = new Set<Http2Session>();
  const unwritten: SessionManager["request"] = async (method, path, headers, options) => {
    const stream = await manager.request(method, path, headers, options);
    const session = stream.session;
    if (session !== undefined && !live.has(session)) {
      live.add(session);
      session.on("error", () => session.destroy());
      session.once("close", () => live.delete(session));
    }
    return stream;
  };
  return {
    authority: manager.authority,
    async request(method, path, headers, options) {
      const stream = await unwritten(method, path, headers, options);
      writesInPieces(stream, budget); // too much unwritten hides the server's answers (budget.ts)
      return stream;
    },
    unwritten,
    notifyResponseByteRead: (stream) => manager.notifyResponseByteRead(stream),
    close() {
      manager.abort();
      for (const session of live) session.destroy();
      live.clear();
    },
  };
}
