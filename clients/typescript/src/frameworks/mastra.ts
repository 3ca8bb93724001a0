/**
 * The execute tool for Mastra, from its own `createTool`:
 *
 *     const execute = await executeTool({ client, tools: [getWeather] });
 *     const agent = new Agent({ name, instructions, model, tools: { execute_python: execute } });
 *
 * The input schema is the script parameter as a zod object (Mastra's tools take zod), the
 * description carries the compact stubs, and the result is the observation text, the same as
 * the Python SDK's. While the script runs, each chunk of its output is written to the tool's
 * stream (`writer`, `{ type: "ptc-output", stream, text }`) for a UI to show; the agent's abort
 * signal cancels the run.
 */

import { createTool } from "@mastra/core/tools";
import { z } from "zod";
import { ExecuteTool, type ExecuteToolOptions } from "./core.js";

export { ExecuteTool, type ExecuteToolOptions, type Observation } from "./core.js";

const INPUT = z.object({
  code: z.string().describe("The complete Python script to run."),
});

/** The Mastra tool over an `ExecuteTool` already made. */
export function mastraExecuteTool(core: ExecuteTool) {
  return createTool({
    id: core.name,
    description: core.description,
    inputSchema: INPUT,
    outputSchema: z.string(),
    execute: async ({ context, writer }, options) => {
      const signal = options?.abortSignal;
      for await (const event of core.stream(context.code, { signal })) {
        if (event.kind === "output") {
          await writer?.write({ type: "ptc-output", stream: event.stream, text: event.text });
        } else {
          return event.observation.text;
        }
      }
      throw new Error("the execute tool's run ended without an observation"); // unreachable
    },
  });
}

/** The execute tool for a Mastra agent; put it in `tools` under the name you choose. */
export async function executeTool(options: ExecuteToolOptions) {
  return mastraExecuteTool(await ExecuteTool.create(options));
}
