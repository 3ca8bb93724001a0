/**
 * The execute tool for LangChain.js, from `tool` in `@langchain/core/tools`:
 *
 *     const execute = await executeTool({ client, tools: [getWeather] });
 *     const agent = createAgent({ model, tools: [execute] });
 *
 * The schema is the script parameter (JSON Schema, which LangChain's `tool` takes as it is),
 * the description carries the compact stubs, and the tool's result, the `ToolMessage` the model
 * reads, is the observation text, the same as the Python SDK's. The run's `signal` (from the
 * agent's config) cancels the script.
 */

import { tool } from "@langchain/core/tools";
import { ExecuteTool, type ExecuteToolOptions } from "./core.js";

export { ExecuteTool, type ExecuteToolOptions, type Observation } from "./core.js";

/** The LangChain tool over an `ExecuteTool` already made. */
export function langchainExecuteTool(core: ExecuteTool) {
  return tool(
    async (input: { code: string }, config?: { signal?: AbortSignal }) => {
      const observation = await core.runArguments(input, { signal: config?.signal });
      return observation.text;
    },
    { name: core.name, description: core.description, schema: core.parameters },
  );
}

/** The execute tool for a LangChain agent or a model's `bindTools`. */
export async function executeTool(options: ExecuteToolOptions) {
  return langchainExecuteTool(await ExecuteTool.create(options));
}
