/**
 * The execute tool for the Vercel AI SDK (`ai` 5 and 6), from its own `tool`:
 *
 *     const execute = await executeTool({ client, tools: [getWeather] });
 *     await generateText({ model, tools: { execute_python: execute }, prompt });
 *
 * The input schema is the script parameter (`jsonSchema`), the description carries the compact
 * stubs. `execute` is an async generator: while the script runs, each chunk of its output is a
 * preliminary result (`{ state: "running", output }`, the output so far), and the last result
 * carries the observation, which `toModelOutput` hands the model as text, the same text as the
 * Python SDK's. The AI SDK's `abortSignal` cancels the run. With `session` (see `core`), every
 * call is the next cell of one session.
 *
 * AI SDK 6 calls `toModelOutput` with `{ toolCallId, input, output }` where 5 passes the output
 * itself; `modelOutputOf` takes either, so the model reads the observation under both.
 */

import { jsonSchema, type Tool, tool } from "ai";
import { ExecuteTool, type ExecuteToolOptions } from "./core.js";

export { ExecuteTool, type ExecuteToolOptions, type Observation } from "./core.js";

export interface ExecuteToolOutput {
  /** "running" for a preliminary result, "done" for the last. */
  state: "running" | "done";
  /** The script's stdout and stderr so far, as printed. */
  output: string;
  /** What the model reads; empty until done. */
  observation: string;
  /** The execution's status once done ("ok", "error", ...); "refused" when it was not run. */
  status?: string;
  executionId?: string;
}

/** The AI SDK tool over an `ExecuteTool` already made. */
export function aiExecuteTool(core: ExecuteTool): Tool<{ code: string }, ExecuteToolOutput> {
  return tool<{ code: string }, ExecuteToolOutput>({
    description: core.description,
    inputSchema: jsonSchema<{ code: string }>(core.parameters),
    async *execute({ code }, { abortSignal }): AsyncGenerator<ExecuteToolOutput> {
      let output = "";
      for await (const event of core.stream(code, { signal: abortSignal })) {
        if (event.kind === "output") {
          output += event.text;
          yield { state: "running", output, observation: "" };
        } else {
          const { text, result } = event.observation;
          yield {
            state: "done",
            output,
            observation: text,
            status: result?.status ?? "refused",
            executionId: result?.executionId,
          };
        }
      }
    },
    toModelOutput: (given: ExecuteToolOutput) => modelOutputOf(given),
  });
}

/**
 * What the model reads of a result: its observation, as text. `given` is the tool's output
 * (AI SDK 5) or `{ toolCallId, input, output }` (AI SDK 6); an `ExecuteToolOutput` never has a
 * `toolCallId`, so the two cannot be mistaken for each other.
 */
export function modelOutputOf(given: unknown): { type: "text"; value: string } {
  let result = given as Partial<ExecuteToolOutput> | undefined;
  if (typeof given === "object" && given !== null && "toolCallId" in given) {
    result = (given as { output?: Partial<ExecuteToolOutput> }).output;
  }
  const observation = result?.observation;
  if (typeof observation === "string") return { type: "text", value: observation };
  return { type: "text", value: "error: the execute tool's result carried no observation" };
}

/** The execute tool for the AI SDK; put it in `tools` under the name you choose. */
export async function executeTool(
  options: ExecuteToolOptions,
): Promise<Tool<{ code: string }, ExecuteToolOutput>> {
  return aiExecuteTool(await ExecuteTool.create(options));
}
