/**
 * `ptc-sandbox`: the TypeScript SDK of PTC Sandbox. The client, its typed results and errors,
 * client-side tools. Imports no Node built-in: the Node transport is `ptc-sandbox/node`.
 */

export { type ClientTlsOptions, PtcClient, type PtcClientOptions } from "./client.js";
export {
  GrpcCode,
  type MessageTooLargeDetails,
  MessageTooLargeError,
  PtcError,
  type PtcErrorCode,
  RateLimitedError,
  SessionLostError,
} from "./errors.js";
export {
  KEEPALIVE_FAILURE,
  type KeepaliveOptions,
  MIN_KEEPALIVE_INTERVAL_MS,
} from "./keepalive.js";
export {
  DEFAULT_BUDGET,
  type ObservationBudget,
  type ObservationOptions,
  type ObservedResult,
  renderObservation,
  type ScriptSource,
} from "./observation.js";
export type * from "./options.js";
export type { RetryPolicy } from "./retry.js";
export { type CellOptions, Session, type SessionOptions } from "./sessions.js";
export {
  type ApprovalAnswer,
  type ApprovalRequest,
  Execution,
  type OnApproval,
  type StreamEvent,
} from "./stream.js";
export {
  type ClientTool,
  type ClientToolOptions,
  clientTool,
  type JsonSchema,
  type StandardSchemaLike,
  type ToolContext,
  type ToolManifest,
} from "./tools.js";
export type * from "./types.js";
