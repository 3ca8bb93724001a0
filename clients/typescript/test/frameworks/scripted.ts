/**
 * What every framework's test runs: a client tool, a script calling it, and the observation
 * the model must be given back for it, written out in full.
 */

import { clientTool } from "../../src/index.js";

export function weatherTool() {
  return clientTool({
    name: "get_weather",
    description: "Current weather for a city.",
    inputSchema: {
      type: "object",
      properties: { city: { type: "string", description: "The city's name." } },
      required: ["city"],
    },
    execute: async (args: Record<string, unknown>) => ({ city: args.city, temp: 3.0, wind: "N" }),
  });
}

export const WEATHER_SCRIPT = [
  "import tools",
  "cities = ['Oslo', 'Ys']",
  "for city in cities:",
  "    print(city, tools.get_weather(city=city)['temp'])",
  "",
].join("\n");

export const WEATHER_OBSERVATION = [
  "status: ok · exit code 0 · 2 tool calls (2 ok)",
  "--- stdout ---",
  "Oslo 3",
  "Ys 3",
  "--- calls (2) ---",
  '#1 get_weather({"city":"Oslo"}) -> ok {"city":"Oslo","temp":3,"wind":"N"}',
  '#2 get_weather({"city":"Ys"}) -> ok {"city":"Ys","temp":3,"wind":"N"}',
].join("\n");

/** The token usage every scripted answer of the AI SDK's mock model reports. */
export const usage = { inputTokens: 1, outputTokens: 1, totalTokens: 2 };

/** A mock language model's answer (`doGenerate`) calling the execute tool with `code`. */
export function callExecute(code: string, id = "call-1") {
  return {
    content: [
      {
        type: "tool-call" as const,
        toolCallId: id,
        toolName: "execute_python",
        input: JSON.stringify({ code }),
      },
    ],
    finishReason: "tool-calls" as const,
    usage,
    warnings: [],
  };
}

/** A mock language model's final answer (`doGenerate`): `text`, and the loop stops. */
export function answer(text = "done") {
  return {
    content: [{ type: "text" as const, text }],
    finishReason: "stop" as const,
    usage,
    warnings: [],
  };
}
