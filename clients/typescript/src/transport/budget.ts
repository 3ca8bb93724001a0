/**
 * The request bytes a connection has handed `node:http2` and not yet seen written, bounded for
 * all of its streams together. Why: what Node has taken from a stream and not yet written to
 * the socket counts against the connection's `maxSessionMemory` (10 MB), and while the
 * connection is over it Node refuses every header block the server sends: a call's answer (its
 * headers or its trailers) is reset by the client itself with ENHANCE_YOUR_CALM, although the
 * server ran the call. One stream writes a piece (64 KiB, `pieces.ts`) at a time, but 160
 * streams writing at once are 10 MB: with a server slower to read than the client writes (a
 * loaded machine, a congested link; it grants windows of hundreds of MB), finished calls'
 * answers were refused (`bench/many_calls.ts`: 12 of 24 with 240 calls sending 1 MiB each).
 * With every write of the connection taken from this budget (4 MiB), the writes wait their turn
 * here, the answers are read, and Node's bound on what a server can make the client hold stays
 * as it is (grpc-js lifts `maxSessionMemory` to the largest integer instead).
 */

import type { ClientHttp2Stream } from "node:http2";

/** What one connection may have handed Node and not seen written: far under 10 MB, which also
 * holds nghttp2's own memory and the header blocks the server sends. */
export const BUDGET_BYTES = 4 * 1024 * 1024;

type WriteDone = (error?: Error | null) => void;

/** Free bytes, and the writes waiting for them in the order they asked. */
export class WriteBudget {
  private free: number;
  private readonly waiting: { bytes: number; grant: () => void }[] = [];

  constructor(readonly limit: number = BUDGET_BYTES) {
    this.free = limit;
  }

  /** Bytes taken and not yet given back. */
  get taken(): number {
    return this.limit - this.free;
  }

  /** Calls `grant` once `bytes` are free (at once when they are and no one waits), in order. A
   * write larger than the whole budget takes all of it. */
  take(bytes: number, grant: () => void): void {
    const size = Math.min(bytes, this.limit);
    if (this.waiting.length === 0 && size <= this.free) {
      this.free -= size;
      grant();
    } else {
      this.waiting.push({ bytes: size, grant });
    }
  }

  give(bytes: number): void {
    this.free += Math.min(bytes, this.limit);
    for (let next = this.waiting[0]; next !== undefined && next.bytes <= this.free; ) {
      this.waiting.shift();
      this.free -= next.bytes;
      next.grant();
      next = this.waiting[0];
    }
  }
}

/**
 * `write(chunk, done)` on `stream` once `budget` has room for `chunk`; the room is given back
 * when the write is done or the stream has closed, whichever comes first (a reset stream may
 * drop its queued writes without their callbacks).
 */
export function writeWithin(
  budget: WriteBudget,
  stream: ClientHttp2Stream,
  chunk: Uint8Array,
  write: (chunk: Uint8Array, done: WriteDone) => unknown,
  done: WriteDone,
): void {
  budget.take(chunk.byteLength, () => {
    let held = true;
    const release = () => {
      if (!held) return;
      held = false;
      stream.off("close", release);
      budget.give(chunk.byteLength);
    };
    // On a stream that has closed meanwhile, Node fails the write itself (its callback gets
    // ERR_STREAM_DESTROYED or ERR_STREAM_WRITE_AFTER_END, which connect reads as it always has).
    if (!stream.closed) stream.once("close", release);
    write(chunk, (error) => {
      release();
      done(error);
    });
  });
}
