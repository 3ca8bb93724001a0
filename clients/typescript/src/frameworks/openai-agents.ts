/**
 * The execute tool for the OpenAI Agents SDK for JavaScript, from its own `tool`:
 *
 *     const execute = await executeTool({ client, tools: [getWeather] });
 *     const agent = new Agent({ name, instructions, model, tools: [execute] });
 *
 * The parameters are the script parameter as a strict JSON Schema (the Responses API's strict
 * function calling), the description carries the compact stubs, and the tool's output, what the
 * model reads, is the observation text, the same as the Python SDK's. The run's signal cancels
 * the script.
 */

import { tool } from "@openai/agents";
import { ExecuteTool, type ExecuteToolOptions } from "./core.js";

export { ExecuteTool, type ExecuteToolOptions, type Observation } from "./core.js";

/** The Agents SDK tool over an `ExecuteTool` already made. */
export function openaiAgentsExecuteTool(core: ExecuteTool) {
  return tool({
    name: core.name,
    description: core.description,
    parameters: core.parameters,
    strict: true,
    execute: async (input, _context, details) => {
      const observation = await core.runArguments(input, { signal: details?.signal });
      return observation.text;
    },
  });
}

/** The execute tool for an OpenAI Agents SDK agent. */
export async function executeTool(options: ExecuteToolOptions) {
  return openaiAgentsExecuteTool(await ExecuteTool.create(options));
}
