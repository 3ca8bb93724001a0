/**
 * Client-side tools: an async TypeScript function becomes a manifest entry in `client` mode,
 * which the server asks this client to run when the script calls it (over ExecuteStream).
 *
 * A tool's input schema is a JSON Schema object, or a Standard Schema that can describe itself
 * as JSON Schema (`~standard.jsonSchema`, e.g. zod >= 4.2): then the arguments are also
 * validated by that schema here, before the function sees them, as the Python SDK validates
 * them with pydantic. No schema library is imported: the package works without one.
 */

import { PtcError } from "./errors.js";

export type JsonSchema = Record<string, unknown>;

/** The part of the Standard Schema spec (standardschema.dev) the SDK uses. */
export interface StandardSchemaLike {
  readonly "~standard": {
    readonly types?: { readonly output: unknown } | undefined;
    readonly validate: (value: unknown) => StandardResult | Promise<StandardResult>;
    readonly jsonSchema?: { readonly input: (options: { target: string }) => JsonSchema };
  };
}

type StandardResult =
  | { readonly value: unknown; readonly issues?: undefined }
  | {
      readonly issues: ReadonlyArray<{
        readonly message: string;
        readonly path?: ReadonlyArray<unknown>;
      }>;
    };

/** What a client tool's function is given besides its arguments. */
export interface ToolContext {
  /** The call's order in the script (1-based), as in the call log. */
  seq: number;
  /** Stable for a retry of the same execution and call: an idempotency key for side effects. */
  idempotencyKey: string;
  /** Fires when the execution ends or the call is abandoned (deadline, abort): stop then. */
  signal: AbortSignal;
}

/** The arguments' type a schema describes: a Standard Schema's output, else a JSON object (annotate
 * `execute`'s parameter to say more). */
export type InferArgs<S> = S extends { readonly "~standard": { readonly types?: infer T } }
  ? NonNullable<T> extends { readonly output: infer O }
    ? O
    : unknown
  : Record<string, unknown>;

export interface ClientToolOptions<S extends JsonSchema | StandardSchemaLike> {
  name: string;
  description?: string;
  inputSchema: S;
  /** The result must be JSON-serialisable; a thrown error reaches the script as ToolError. */
  // A method, so that a JSON Schema tool may annotate its parameter with the arguments' type.
  execute(args: InferArgs<S>, context: ToolContext): Promise<unknown> | unknown;
  readOnly?: boolean;
  needsApproval?: boolean;
}

/** A manifest entry in `client` mode and the function that serves it. */
export interface ClientTool {
  readonly kind: "client_tool";
  readonly name: string;
  /** The manifest entry sent to the server (flat dialect with an `x-ptc` key). */
  readonly entry: JsonSchema;
  /** Validates the arguments (JSON text from the script), runs the function, returns JSON text. */
  invokeJson(argumentsJson: string, context: ToolContext): Promise<string>;
}

function isStandard(schema: JsonSchema | StandardSchemaLike): schema is StandardSchemaLike {
  return typeof (schema as Partial<StandardSchemaLike>)["~standard"] === "object";
}

/** A client-side tool: `clientTool({ name, inputSchema, execute: async (args) => result })`. */
export function clientTool<S extends JsonSchema | StandardSchemaLike>(
  options: ClientToolOptions<S>,
): ClientTool {
  const { name, inputSchema } = options;
  if (typeof name !== "string" || name === "") {
    throw new TypeError("clientTool: name must be a non-empty string");
  }
  let parameters: JsonSchema;
  let validate: ((value: unknown) => Promise<unknown>) | undefined;
  const schema: JsonSchema | StandardSchemaLike = inputSchema;
  if (isStandard(schema)) {
    const standard = schema["~standard"];
    if (standard.jsonSchema === undefined) {
      throw new TypeError(
        `clientTool ${JSON.stringify(name)}: inputSchema is a Standard Schema that cannot describe ` +
          "itself as JSON Schema (no ~standard.jsonSchema; zod needs >= 4.2): pass a JSON Schema",
      );
    }
    const { $schema: _ignored, ...rest } = standard.jsonSchema.input({ target: "draft-2020-12" });
    parameters = rest;
    validate = async (value) => {
      const outcome = await standard.validate(value);
      if (outcome.issues !== undefined) {
        const text = outcome.issues
          .map(
            (issue) => `${(issue.path ?? []).map(String).join(".") || "(root)"}: ${issue.message}`,
          )
          .join("; ");
        throw new TypeError(`invalid arguments: ${text}`);
      }
      return outcome.value;
    };
  } else if (schema !== null && typeof schema === "object" && !Array.isArray(schema)) {
    parameters = schema;
  } else {
    throw new TypeError(
      `clientTool ${JSON.stringify(name)}: inputSchema must be a JSON Schema object or a zod schema`,
    );
  }
  const entry: JsonSchema = {
    name,
    description: options.description ?? "",
    parameters,
    "x-ptc": {
      mode: "client",
      read_only: options.readOnly ?? false,
      needs_approval: options.needsApproval ?? false,
    },
  };
  return {
    kind: "client_tool",
    name,
    entry,
    async invokeJson(argumentsJson, context) {
      let args = JSON.parse(argumentsJson) as unknown;
      if (validate !== undefined) args = await validate(args);
      const value = await options.execute(args as InferArgs<S>, context);
      const text = JSON.stringify(value === undefined ? null : value);
      if (text === undefined) throw new TypeError("the tool's result is not JSON-serialisable");
      return text;
    },
  };
}

/** A server-side manifest: JSON text, an array of tool definitions, or `{ tools: [...] }`. */
export type ToolManifest = string | JsonSchema | JsonSchema[];

export function isClientTool(value: unknown): value is ClientTool {
  return (
    typeof value === "object" && value !== null && (value as ClientTool).kind === "client_tool"
  );
}

/**
 * The manifest JSON for `tools` and the client's own functions among them, by name. Server-side
 * entries (plain objects, or a whole manifest) and client tools mix freely; a name given twice
 * among the client tools is refused here rather than by the server later.
 */
export function buildManifest(
  tools: ToolManifest | ReadonlyArray<ClientTool | JsonSchema> | undefined,
): { json: string | undefined; local: Map<string, ClientTool> } {
  const local = new Map<string, ClientTool>();
  if (tools === undefined) return { json: undefined, local };
  if (typeof tools === "string") return { json: tools, local };
  if (!Array.isArray(tools)) {
    const manifest = tools as JsonSchema;
    return { json: JSON.stringify(manifest), local };
  }
  const entries: unknown[] = [];
  tools.forEach((tool: ClientTool | JsonSchema, index: number) => {
    if (isClientTool(tool)) {
      if (local.has(tool.name)) {
        throw new PtcError(
          "invalid_argument",
          `tools[${index}]: a second client tool named ${JSON.stringify(tool.name)}`,
        );
      }
      local.set(tool.name, tool);
      entries.push(tool.entry);
    } else {
      entries.push(tool);
    }
  });
  return { json: JSON.stringify(entries), local };
}
