/**
 * Mastra's own agent loop (`Agent.generate`) driven by the AI SDK's mock language model, calling
 * `ptc-sandbox/mastra`'s execute tool against a real `ptc serve`: the model is given back the
 * observation, exactly.
 */

import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { Agent } from "@mastra/core/agent";
import { MockLanguageModelV2 } from "ai/test";
import { executeTool } from "../../src/frameworks/mastra.js";
import { PtcClient } from "../../src/index.js";
import { type Serving, startServe } from "../support/serve.js";
import { WEATHER_OBSERVATION, WEATHER_SCRIPT, weatherTool } from "./scripted.js";

let serving: Serving;
let client: PtcClient;

before(async () => {
  serving = await startServe("--allow-degraded");
  client = new PtcClient({ address: serving.address });
});

after(async () => {
  client.close();
  const stopped = await serving.stop();
  assert.equal(stopped.code, 0, stopped.stderr);
});

const usage = { inputTokens: 1, outputTokens: 1, totalTokens: 2 };

/** The tool results the model was given in a prompt, as text. */
function givenBack(prompt: readonly unknown[]): string[] {
  const out: string[] = [];
  for (const message of prompt as { role: string; content: unknown }[]) {
    if (message.role !== "tool") continue;
    for (const part of message.content as {
      type: string;
      output: { type: string; value: unknown };
    }[]) {
      if (part.type !== "tool-result") continue;
      out.push(
        typeof part.output.value === "string"
          ? part.output.value
          : JSON.stringify(part.output.value),
      );
    }
  }
  return out;
}

test("Agent.generate: the model reads the observation of a script calling a client tool", async () => {
  const execute = await executeTool({ client, tools: [weatherTool()] });
  // Mastra's generate asks the model for whole responses (doGenerate), one per step.
  const model = new MockLanguageModelV2({
    doGenerate: [
      {
        content: [
          {
            type: "tool-call",
            toolCallId: "m1",
            toolName: "execute_python",
            input: JSON.stringify({ code: WEATHER_SCRIPT }),
          },
        ],
        finishReason: "tool-calls",
        usage,
        warnings: [],
      },
      {
        content: [{ type: "text", text: "It is 3 degrees." }],
        finishReason: "stop",
        usage,
        warnings: [],
      },
    ],
  });
  const agent = new Agent({
    name: "weather",
    instructions: "Answer with the tools.",
    model,
    tools: { execute_python: execute },
  });
  const result = await agent.generate("Weather in Oslo and Ys?", { maxSteps: 3 });
  assert.equal(result.text, "It is 3 degrees.");
  assert.equal(model.doGenerateCalls.length, 2);
  const offered = model.doGenerateCalls[0]?.tools?.[0];
  assert.equal(offered?.name, "execute_python");
  assert.equal(givenBack(model.doGenerateCalls[1]?.prompt ?? []).join(""), WEATHER_OBSERVATION);
});
