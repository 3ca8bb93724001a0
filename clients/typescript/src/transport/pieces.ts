/**
 * A large request message handed to `node:http2` in pieces, each after the one before it was
 * taken. Why: Node counts the DATA a stream has queued and not yet sent against the
 * connection's `maxSessionMemory` (10 MB by default), and while the connection is over it, it
 * refuses every header block the server sends: the stream is reset with ENHANCE_YOUR_CALM on
 * the client's side, its response headers are dropped, and it never closes. A message written
 * whole is queued whole. So a request over the server's receive limit (72 MiB), which the
 * server refuses as soon as it has read the message's 5-byte length prefix (a trailers-only
 * answer, RESOURCE_EXHAUSTED "Received message larger than max (size vs. limit)", then
 * RST_STREAM NO_ERROR), never reached the caller: the call waited for its deadline, or forever.
 * In pieces, at most one piece of a stream is queued at a time, the server's answer is read, and
 * the caller gets the server's "message_too_large". Many streams writing at once are the same
 * trap again (160 pieces are 10 MB): every piece, of every stream, is taken from the
 * connection's write budget (`budget.ts`).
 *
 * grpc-js avoids the same trap by lifting `maxSessionMemory` to the largest integer, which also
 * lifts Node's bound on what a server can make the client hold; this keeps the bound.
 */

import type { ClientHttp2Stream } from "node:http2";
import { type WriteBudget, writeWithin } from "./budget.js";

/** The most one write hands to Node at a time: far under `maxSessionMemory` (10 MB), which the
 * pieces of every stream of the connection share (`budget.ts` bounds them together). */
export const PIECE_BYTES = 64 * 1024;

type WriteDone = (error?: Error | null) => void;
/** Hands `chunk` to Node; `last` is the message's last piece. */
type Write = (chunk: Uint8Array, done: WriteDone, last: boolean) => unknown;

/** Writes `data` through `write` piece by piece, each within the connection's `budget`; `done`
 * once the last was taken, or with the first write's error (the stream closed: its own events
 * say why). */
export function writeInPieces(
  stream: ClientHttp2Stream,
  budget: WriteBudget,
  write: Write,
  data: Uint8Array,
  done: WriteDone,
): void {
  const next = (at: number): void => {
    const end = Math.min(at + PIECE_BYTES, data.byteLength);
    const last = end >= data.byteLength;
    writeWithin(
      budget,
      stream,
      data.subarray(at, end),
      (piece, then) => write(piece, then, last),
      (error) => {
        if (error !== undefined && error !== null) done(error);
        else if (last) done(null);
        else next(end);
      },
    );
  };
  next(0);
}

/**
 * `stream.write` made to hand every chunk to Node within the connection's `budget`, and one
 * larger than a piece piece by piece (its callback called after the last), for the writer that
 * is not ours: connect-node's bidirectional stream, which writes each request message whole and
 * waits for the callback before its next write or its `end()`.
 */
export function writesInPieces(stream: ClientHttp2Stream, budget: WriteBudget): void {
  const write = stream.write.bind(stream) as (...args: unknown[]) => boolean;
  const piecewise = (chunk: unknown, encoding?: unknown, callback?: unknown): boolean => {
    if (!(chunk instanceof Uint8Array)) return write(chunk, encoding, callback);
    const done = (typeof encoding === "function" ? encoding : callback) as WriteDone | undefined;
    writeInPieces(
      stream,
      budget,
      (piece, then) => write(piece, then),
      chunk,
      (error) => done?.(error),
    );
    return false; // the caller waits for the callback (or "drain"), as after a full buffer
  };
  stream.write = piecewise as ClientHttp2Stream["write"];
}
