/**
 * Mastra's own agent loop (`Agent.generate`) driven by the AI SDK's mock language model, calling
 * `ptc-sandbox/mastra`'s execute tool against a real `ptc serve`: the model is given back the
 * observation, exactly, and with `Agent.stream` the script's output chunks reach the stream as
 * the tool's own output (its writer) while it runs. Over a session (`session: true`), the
 * loop's second call of the tool sees the names its first call set.
 */

import assert from "node:assert/strict";
import { test } from "node:test";
import { Agent } from "@mastra/core/agent";
import { MockLanguageModelV2 } from "ai/test";
import { ExecuteTool, executeTool, mastraExecuteTool } from "../../src/frameworks/mastra.js";
import { servedClient } from "../support/served.js";
import * as scripted from "./scripted.js";

const served = servedClient("--allow-degraded");

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
  const execute = await executeTool({ client: served.client, tools: [scripted.weatherTool()] });
  // Mastra's generate asks the model for whole responses (doGenerate), one per step.
  const model = new MockLanguageModelV2({
    doGenerate: [
      scripted.callExecute(scripted.WEATHER_SCRIPT, "m1"),
      scripted.answer("It is 3 degrees."),
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
  assert.equal(
    givenBack(model.doGenerateCalls[1]?.prompt ?? []).join(""),
    scripted.WEATHER_OBSERVATION,
  );
});

test("Agent.stream: the script's output reaches the stream through the tool's writer", async () => {
  const execute = await executeTool({ client: served.client });
  const code = "import time\nprint('one', flush=True)\ntime.sleep(0.3)\nprint('two')\n";
  const chunks = (parts: unknown[]) =>
    new ReadableStream({
      start(c) {
        for (const part of parts) c.enqueue(part);
        c.close();
      },
    });
  const model = new MockLanguageModelV2({
    doStream: [
      {
        stream: chunks([
          {
            type: "tool-call",
            toolCallId: "s1",
            toolName: "execute_python",
            input: JSON.stringify({ code }),
          },
          { type: "finish", finishReason: "tool-calls", usage: scripted.usage },
        ]),
      },
      {
        stream: chunks([
          { type: "text-start", id: "t" },
          { type: "text-delta", id: "t", delta: "two lines" },
          { type: "text-end", id: "t" },
          { type: "finish", finishReason: "stop", usage: scripted.usage },
        ]),
      },
    ],
  });
  const agent = new Agent({
    name: "printer",
    instructions: "Print.",
    model,
    tools: { execute_python: execute },
  });
  const stream = await agent.stream("Print two lines.", { maxSteps: 3 });
  const written: string[] = [];
  for await (const chunk of stream.fullStream) {
    const c = chunk as { type: string; payload?: { output?: { type?: string; text?: string } } };
    if (c.type === "tool-output" && c.payload?.output?.type === "ptc-output") {
      written.push(c.payload.output.text ?? "");
    }
  }
  assert.equal(written.join(""), "one\ntwo\n");
  assert.equal(
    givenBack(model.doStreamCalls[1]?.prompt ?? []).join(""),
    "status: ok · exit code 0 · 0 tool calls\n--- stdout ---\none\ntwo",
  );
});

test("Agent.generate over a session: call 2 reads the names call 1 set, and close ends it", async () => {
  const core = await ExecuteTool.create({ client: served.client, session: true });
  const model = new MockLanguageModelV2({
    doGenerate: [
      scripted.callExecute("import math\nr = 2\nprint('set')", "ms1"),
      scripted.callExecute("print(round(math.pi * r * r, 2))", "ms2"),
      scripted.answer("12.57"),
    ],
  });
  const agent = new Agent({
    name: "circle",
    instructions: "Keep state.",
    model,
    tools: { execute_python: mastraExecuteTool(core) },
  });
  let id = "";
  try {
    const result = await agent.generate("Area of a circle of radius 2?", { maxSteps: 4 });
    id = core.sessionId ?? "";
    assert.equal(result.text, "12.57");
    assert.equal(model.doGenerateCalls.length, 3);
    assert.deepEqual(givenBack(model.doGenerateCalls[2]?.prompt ?? []), [
      "status: ok · exit code 0 · 0 tool calls\n--- stdout ---\nset",
      "status: ok · exit code 0 · 0 tool calls\n--- stdout ---\n12.57",
    ]);
  } finally {
    await core.close();
  }
  const info = await served.client.getSession(id);
  assert.equal(info.executionIds.length, 2); // both calls were cells of the one session
  assert.equal(info.state, "closed");
});
