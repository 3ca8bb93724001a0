/**
 * HTTP/2 keepalive, as the Python SDK has it (`sandbox/keepalive.py`): how a client learns that
 * its server stopped answering. A server that freezes (SIGSTOP, a hung host, a path that drops
 * packets silently) sends no RST and no FIN; without pings a call on its connection waits for
 * its deadline, or forever without one. With keepalive on (the default) the Node transport
 * sends a PING after `intervalMs` without data on a connection with calls in flight, and
 * destroys the connection when one is not answered within `timeoutMs` (connect-node's session
 * manager does the pinging); every call on it then fails with "unavailable" and a message
 * saying that the server stopped answering keepalive pings, and within how long.
 *
 * The server accepts pings as often as every 500 ms (`SERVER_MIN_PING_INTERVAL_MS` in
 * `sandbox/keepalive.py`), so the shortest interval allowed here, 1 s, is never answered with
 * GOAWAY too_many_pings. No Node import: the root entry's types name it.
 */

import { ConnectError } from "@connectrpc/connect";
import { GrpcCode, PtcError } from "./errors.js";

export interface KeepaliveOptions {
  /** A PING after this long without data on a connection with calls in flight (default
   * 20000; at least 1000). */
  intervalMs?: number;
  /** The connection is given up, its calls failed, when a PING is not answered within this
   * (default 15000). */
  timeoutMs?: number;
}

export interface ResolvedKeepalive {
  intervalMs: number;
  timeoutMs: number;
}

/** The shortest interval: twice what the server accepts, so it never refuses our pings. */
export const MIN_KEEPALIVE_INTERVAL_MS = 1000;
/** How the message of a call ended by an unanswered ping starts (the Python SDK's words). */
export const KEEPALIVE_FAILURE = "the server stopped answering keepalive pings";

const DEFAULTS: ResolvedKeepalive = { intervalMs: 20_000, timeoutMs: 15_000 };

/** The options with their defaults; `false`: no pings (undefined). Bad values are refused. */
export function resolveKeepalive(
  options: KeepaliveOptions | false | undefined,
): ResolvedKeepalive | undefined {
  if (options === false) return undefined;
  const resolved = { ...DEFAULTS, ...options };
  const { intervalMs, timeoutMs } = resolved;
  if (!Number.isFinite(intervalMs) || intervalMs < MIN_KEEPALIVE_INTERVAL_MS) {
    throw new PtcError(
      "invalid_argument",
      `keepalive.intervalMs: at least ${MIN_KEEPALIVE_INTERVAL_MS} ms (the server refuses ` +
        `pings more often than every 500 ms), or keepalive: false for no pings; got ${intervalMs}`,
    );
  }
  if (!Number.isFinite(timeoutMs) || timeoutMs <= 0) {
    throw new PtcError(
      "invalid_argument",
      `keepalive.timeoutMs: a positive number of milliseconds, got ${timeoutMs}`,
    );
  }
  return resolved;
}

// connect-node's words when it destroys a connection whose PING went unanswered.
const PING_TIMED_OUT = "PING timed out";

/**
 * `error` as the caller should read it: a connection ended by an unanswered ping (connect-node's
 * "PING timed out", also as the cause of a stream's error) becomes "unavailable" saying so;
 * anything else is returned as it is.
 */
export function namingKeepalive(error: unknown, keepalive: ResolvedKeepalive): unknown {
  for (let e: unknown = error, depth = 0; e instanceof Error && depth < 8; e = e.cause, depth++) {
    const text = e instanceof ConnectError ? e.rawMessage : e.message;
    if (text === PING_TIMED_OUT) {
      return new PtcError(
        "unavailable",
        `${KEEPALIVE_FAILURE}: a ping sent after ${keepalive.intervalMs / 1000} s without data ` +
          `was not answered within ${keepalive.timeoutMs / 1000} s (the server is frozen, ` +
          `overloaded or unreachable; connect-node: ${PING_TIMED_OUT})`,
        { grpcCode: GrpcCode.UNAVAILABLE, cause: error },
      );
    }
  }
  return error;
}
