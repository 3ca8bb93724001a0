/**
 * The AI SDK's own agent loop (`generateText` and `streamText` with `stopWhen`) driven by its
 * mock language model, calling `ptc-sandbox/ai`'s execute tool against a real `ptc serve`: the
 * model is given back the observation, exactly, as text; the script's output streams as
 * preliminary results; a client tool runs in this process; a refused request is an observation.
 */

import assert from "node:assert/strict";
import { test } from "node:test";
import { generateText, stepCountIs, streamText, type Tool } from "ai";
import { MockLanguageModelV2, simulateReadableStream } from "ai/test";
import { z } from "zod";
import { executeTool, modelOutputOf } from "../../src/frameworks/ai.js";
import { clientTool, PtcError } from "../../src/index.js";
import { servedClient } from "../support/served.js";
import {
  answer,
  callExecute,
  usage,
  WEATHER_OBSERVATION,
  WEATHER_SCRIPT,
  weatherTool,
} from "./scripted.js";

const served = servedClient("--allow-degraded");

/** The text of the tool result the model was given in its `n`-th call's prompt. */
function givenBack(prompt: readonly unknown[]): string {
  for (const message of prompt as { role: string; content: unknown }[]) {
    if (message.role !== "tool") continue;
    for (const part of message.content as {
      type: string;
      output: { type: string; value: unknown };
    }[]) {
      if (part.type === "tool-result") {
        assert.equal(part.output.type, "text");
        return String(part.output.value);
      }
    }
  }
  throw new Error("no tool result in the prompt");
}

/** What the model is given back when its first step calls `execute` with `code`. */
async function observationOf(execute: Tool, code: string): Promise<string> {
  const model = new MockLanguageModelV2({ doGenerate: [callExecute(code), answer()] });
  await generateText({
    model,
    tools: { execute_python: execute },
    prompt: "x",
    stopWhen: stepCountIs(3),
  });
  return givenBack(model.doGenerateCalls[1]?.prompt ?? []);
}

test("generateText: the model reads the observation of a script calling a client tool", async () => {
  const execute = await executeTool({ client: served.client, tools: [weatherTool()] });
  const model = new MockLanguageModelV2({ doGenerate: [callExecute(WEATHER_SCRIPT), answer()] });
  const result = await generateText({
    model,
    tools: { execute_python: execute },
    prompt: "Weather in Oslo?",
    stopWhen: stepCountIs(3),
  });
  assert.equal(result.text, "done");
  assert.equal(model.doGenerateCalls.length, 2);
  const first = model.doGenerateCalls[0];
  const offered = first?.tools?.[0];
  assert.equal(offered?.name, "execute_python");
  assert.match(
    String(offered && "description" in offered ? offered.description : ""),
    /def get_weather\(\*, city: str\):/,
  );
  assert.equal(givenBack(model.doGenerateCalls[1]?.prompt ?? []), WEATHER_OBSERVATION);
});

test("streamText: output arrives as preliminary results before the observation", async () => {
  const execute = await executeTool({ client: served.client });
  const code = "import time\nprint('first', flush=True)\ntime.sleep(0.5)\nprint('second')\n";
  const chunks = (id: string, code_: string) => [
    {
      type: "tool-call" as const,
      toolCallId: id,
      toolName: "execute_python",
      input: JSON.stringify({ code: code_ }),
    },
    { type: "finish" as const, finishReason: "tool-calls" as const, usage },
  ];
  const model = new MockLanguageModelV2({
    doStream: [
      { stream: simulateReadableStream({ chunks: chunks("s1", code) }) },
      {
        stream: simulateReadableStream({
          chunks: [
            { type: "text-start" as const, id: "t" },
            { type: "text-delta" as const, id: "t", delta: "ok" },
            { type: "text-end" as const, id: "t" },
            { type: "finish" as const, finishReason: "stop" as const, usage },
          ],
        }),
      },
    ],
  });
  const run = streamText({
    model,
    tools: { execute_python: execute },
    prompt: "go",
    stopWhen: stepCountIs(3),
  });
  const results: {
    preliminary: boolean;
    output: { state: string; output: string; observation: string };
  }[] = [];
  for await (const part of run.fullStream) {
    if (part.type === "tool-result") {
      results.push({ preliminary: part.preliminary === true, output: part.output as never });
    }
  }
  const preliminary = results.filter((r) => r.preliminary);
  const final = results.filter((r) => !r.preliminary);
  assert.ok(
    preliminary.some((r) => r.output.output === "first\n"),
    JSON.stringify(results),
  );
  assert.equal(final.length, 1);
  const expected = "status: ok · exit code 0 · 0 tool calls\n--- stdout ---\nfirst\nsecond";
  assert.equal(final[0]?.output.observation, expected);
  assert.equal(givenBack(model.doStreamCalls[1]?.prompt ?? []), expected);
});

test("a request the service refuses is an observation the model reads, not a thrown error", async () => {
  const execute = await executeTool({
    client: served.client,
    tools: [weatherTool()],
    expectedCalls: [{ tool: "no_such_tool", min: 1 }],
  });
  const text = await observationOf(execute, "print(1)");
  assert.match(text, /^error: the sandbox service refused the request: .*no_such_tool/);
});

test("a client tool defined with zod, failing: the script's error and the call line", async () => {
  const flaky = clientTool({
    name: "flaky",
    description: "Fails.",
    inputSchema: z.object({ n: z.number() }),
    execute: async () => {
      throw new Error("upstream down");
    },
  });
  const execute = await executeTool({ client: served.client, tools: [flaky] });
  const code = "import tools\ntools.flaky(n=1)\n";
  const text = await observationOf(execute, code);
  const lines = text.split("\n");
  assert.equal(lines[0], "status: error · exit code 1 · 1 tool call (1 error)");
  // The function's error as the Python SDK reports one: its class, then its message.
  assert.equal(lines[2], '#1 flaky({"n":1}) -> error Error: upstream down');
  assert.ok(text.includes("--- error ---\nToolError: Error: upstream down (line 2)"), text);
});

test("server tools from a manifest beside a client tool; declared summary fields cut the result", async () => {
  const manifest = {
    name: "lookup",
    description: "Echoes its arguments (no handler configured).",
    parameters: {
      type: "object",
      properties: { q: { type: "string" }, padding: { type: "string" } },
      required: ["q"],
    },
    "x-ptc": { summary_fields: ["q"] },
  };
  const execute = await executeTool({ client: served.client, tools: [manifest, weatherTool()] });
  const code =
    "import tools\nr = tools.lookup(q='x', padding='y' * 10)\nprint(tools.get_weather(city=r['q'])['wind'])\n";
  const text = await observationOf(execute, code);
  assert.equal(
    text,
    [
      "status: ok · exit code 0 · 2 tool calls (2 ok)",
      "--- stdout ---",
      "N",
      "--- calls (2) ---",
      "(results of tools with declared summary fields show only those fields)",
      '#1 lookup({"q":"x","padding":"yyyyyyyyyy"}) -> ok {"q":"x"}',
      '#2 get_weather({"city":"x"}) -> ok {"city":"x","temp":3,"wind":"N"}',
    ].join("\n"),
  );
});

test("the caller's abort signal ends a running script with the abort, and the server serves on", async () => {
  const execute = await executeTool({ client: served.client });
  const model = new MockLanguageModelV2({
    doGenerate: [callExecute("import time\ntime.sleep(60)\n"), answer()],
  });
  const controller = new AbortController();
  const timer = setTimeout(() => controller.abort(new Error("user left")), 500);
  const started = Date.now();
  await assert.rejects(
    generateText({
      model,
      tools: { execute_python: execute },
      prompt: "x",
      stopWhen: stepCountIs(3),
      abortSignal: controller.signal,
    }),
    (error: unknown) => {
      // The AI SDK ends the step with the signal's own reason.
      assert.ok(error instanceof Error && error.message === "user left", String(error));
      return true;
    },
  );
  clearTimeout(timer);
  assert.ok(Date.now() - started < 20_000, "the abort did not end the run");
  assert.equal(model.doGenerateCalls.length, 1); // the model was never given a made-up result
  const after = await served.client.execute("print('still serving')");
  assert.equal(after.stdout, "still serving\n");
});

test("a manifest that is not JSON is refused when the tool is made, naming what was wrong", async () => {
  await assert.rejects(
    executeTool({ client: served.client, tools: "[{not json" }),
    (error: unknown) => {
      assert.ok(error instanceof PtcError);
      assert.equal(error.code, "invalid_argument");
      assert.match(error.message, /^tools: the manifest is not JSON \(SyntaxError: /);
      return true;
    },
  );
});

test("toModelOutput reads the observation as AI SDK 5 and AI SDK 6 pass the result", () => {
  const output = { state: "done" as const, output: "4\n", observation: "status: ok", status: "ok" };
  assert.deepEqual(modelOutputOf(output), { type: "text", value: "status: ok" });
  const v6 = { toolCallId: "c1", input: { code: "print(4)" }, output };
  assert.deepEqual(modelOutputOf(v6), { type: "text", value: "status: ok" });
  const none = { type: "text", value: "error: the execute tool's result carried no observation" };
  assert.deepEqual(modelOutputOf({ toolCallId: "c2", input: {}, output: undefined }), none);
  assert.deepEqual(modelOutputOf(undefined), none);
});
