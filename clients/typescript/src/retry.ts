/**
 * When the SDK asks again, and how: the Python SDK's policy (`sandbox/client/_retry.py`), the
 * same numbers and the same meaning.
 *
 * Every `execute` sends an idempotency key (a random UUID made once per call, or the caller's)
 * and, when an attempt fails in a way that leaves the execution's outcome unknown, sends the
 * same request with the same key again: the server answers a key it already admitted with that
 * execution's result instead of running it again. Outcome unknown means UNAVAILABLE (no server
 * answered, or one refused for now: a balancer's 504, a draining server), INTERNAL and UNKNOWN
 * (what a balancer makes of a stream it reset; here also bytes that were not gRPC). Everything
 * else is final, and so are the caller's own deadline and AbortSignal. Attempts are at most
 * `attempts`, spaced by an exponential backoff with full jitter, all within the call's
 * `deadlineMs`. When they run out the last error is thrown with `idempotencyKey` and
 * `attempts` set: ask again with that key, never a new one, to learn the outcome.
 */

import { GrpcCode, PtcError, toPtcError } from "./errors.js";

export interface RetryPolicy {
  /** Attempts at most (1: never retry). Default 5. */
  attempts?: number;
  /** The pause before the second attempt, doubled each time after. Default 250 ms. */
  backoffMs?: number;
  /** The longest pause. Default 4000 ms. */
  maxBackoffMs?: number;
}

export interface ResolvedRetryPolicy {
  attempts: number;
  backoffMs: number;
  maxBackoffMs: number;
}

export function resolvePolicy(policy: RetryPolicy = {}): ResolvedRetryPolicy {
  const resolved = {
    attempts: policy.attempts ?? 5,
    backoffMs: policy.backoffMs ?? 250,
    maxBackoffMs: policy.maxBackoffMs ?? 4000,
  };
  if (!Number.isInteger(resolved.attempts) || resolved.attempts < 1) {
    throw new TypeError(`retry.attempts: an integer of at least 1, got ${policy.attempts}`);
  }
  if (!(resolved.backoffMs >= 0) || !(resolved.maxBackoffMs >= 0)) {
    throw new TypeError("retry.backoffMs, retry.maxBackoffMs: must not be negative");
  }
  return resolved;
}

/** The pause after failed attempt number `attempt` (1-based): full jitter, so that clients a
 * balancer failed together do not come back together. */
export function retryDelayMs(policy: ResolvedRetryPolicy, attempt: number): number {
  return Math.random() * Math.min(policy.maxBackoffMs, policy.backoffMs * 2 ** (attempt - 1));
}

const RETRY_STATUSES: ReadonlySet<number> = new Set([
  GrpcCode.UNAVAILABLE,
  GrpcCode.INTERNAL,
  GrpcCode.UNKNOWN,
]);
const FINAL_CODES = new Set(["aborted_by_signal", "deadline_exceeded", "transport_unavailable"]);

export function retryable(error: PtcError): boolean {
  return RETRY_STATUSES.has(error.grpcCode) && !FINAL_CODES.has(error.code);
}

/** The call's deadline, shared by every attempt. */
export class Deadline {
  private readonly ends: number | undefined;

  constructor(deadlineMs: number | undefined) {
    if (deadlineMs !== undefined && !(deadlineMs > 0)) {
      throw new TypeError(`deadlineMs: a positive number of milliseconds, got ${deadlineMs}`);
    }
    this.ends = deadlineMs === undefined ? undefined : Date.now() + deadlineMs;
  }

  remaining(): number | undefined {
    return this.ends === undefined ? undefined : Math.max(1, this.ends - Date.now());
  }

  allows(pauseMs: number): boolean {
    return this.ends === undefined || this.ends - Date.now() > pauseMs;
  }
}

/** A pause that the caller's signal ends early (rejecting); it leaves no timer behind. */
export function sleep(ms: number, signal: AbortSignal | undefined): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) {
      reject(signal.reason);
      return;
    }
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal?.reason);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

/** A random UUID (v4) for an idempotency key. */
export function newKey(): string {
  return globalThis.crypto.randomUUID();
}

/**
 * `attempt` until it returns, fails for good, or the policy's attempts or the deadline run
 * out; each attempt gets what is left of the deadline.
 */
export async function retrying<T>(
  policy: ResolvedRetryPolicy,
  key: string,
  deadline: Deadline,
  signal: AbortSignal | undefined,
  attempt: (timeoutMs: number | undefined) => Promise<T>,
): Promise<T> {
  for (let number = 1; ; number++) {
    try {
      return await attempt(deadline.remaining());
    } catch (error) {
      if (!(error instanceof PtcError) || !retryable(error)) throw error;
      const pause = retryDelayMs(policy, number);
      if (number >= policy.attempts || !deadline.allows(pause)) {
        throw Object.assign(error, { idempotencyKey: key, attempts: number });
      }
      try {
        await sleep(pause, signal);
      } catch (reason) {
        // The caller's signal ended the pause: that, not the attempt's failure, ends the call.
        throw Object.assign(toPtcError(reason, signal), { idempotencyKey: key, attempts: number });
      }
    }
  }
}
