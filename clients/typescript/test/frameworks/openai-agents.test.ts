/**
 * The OpenAI Agents SDK's own loop (`Runner.run`) driven by a scripted `Model` (the SDK's model
 * interface, answering from a list), calling `ptc-sandbox/openai-agents`' execute tool against a
 * real `ptc serve`: the function call output the model is given back is the observation, exactly.
 * Over a session passed in, the loop's second call of the tool sees the names its first set.
 */

import assert from "node:assert/strict";
import { test } from "node:test";
import {
  Agent,
  type AgentOutputItem,
  type Model,
  type ModelRequest,
  type ModelResponse,
  Runner,
  setTracingDisabled,
  Usage,
} from "@openai/agents";
import { executeTool } from "../../src/frameworks/openai-agents.js";
import { servedClient } from "../support/served.js";
import { WEATHER_OBSERVATION, WEATHER_SCRIPT, weatherTool } from "./scripted.js";

setTracingDisabled(true); // nothing leaves this machine

const served = servedClient("--allow-degraded");

/** A model answering each request with the next of its scripted outputs, keeping the requests. */
class ScriptedModel implements Model {
  readonly requests: ModelRequest[] = [];
  constructor(private readonly outputs: AgentOutputItem[][]) {}

  async getResponse(request: ModelRequest): Promise<ModelResponse> {
    this.requests.push(request);
    const output = this.outputs.shift();
    if (output === undefined) throw new Error("the scripted model has no answer left");
    return { usage: new Usage(), output };
  }

  // biome-ignore lint/correctness/useYield: the loop under test asks for whole responses only
  async *getStreamedResponse(): AsyncIterable<never> {
    throw new Error("not scripted");
  }
}

function callExecute(code: string, callId: string): AgentOutputItem[] {
  return [
    {
      type: "function_call",
      callId,
      name: "execute_python",
      arguments: JSON.stringify({ code }),
      status: "completed",
    },
  ];
}

function say(text: string): AgentOutputItem[] {
  return [
    {
      type: "message",
      role: "assistant",
      status: "completed",
      content: [{ type: "output_text", text }],
    },
  ];
}

/** The outputs of function calls the model was given in `request`, by call id. */
function givenBack(request: ModelRequest | undefined): Map<string, unknown> {
  const out = new Map<string, unknown>();
  const input = request?.input;
  if (!Array.isArray(input)) return out;
  for (const item of input) {
    if (item.type === "function_call_result") {
      const output = item.output;
      out.set(
        item.callId,
        typeof output === "string" ? output : (output as { text?: string }).text,
      );
    }
  }
  return out;
}

test("Runner.run: the model reads the observation of a script calling a client tool", async () => {
  const execute = await executeTool({ client: served.client, tools: [weatherTool()] });
  const model = new ScriptedModel([callExecute(WEATHER_SCRIPT, "oa1"), say("3 degrees")]);
  const agent = new Agent({
    name: "weather",
    instructions: "Use the tool.",
    model,
    tools: [execute],
  });
  const runner = new Runner({ tracingDisabled: true });
  const result = await runner.run(agent, "Weather in Oslo and Ys?");
  assert.equal(result.finalOutput, "3 degrees");
  assert.equal(model.requests.length, 2);
  const offered = model.requests[0]?.tools[0];
  assert.equal(offered?.type === "function" ? offered.name : "", "execute_python");
  assert.equal(givenBack(model.requests[1]).get("oa1"), WEATHER_OBSERVATION);
});

test("expectedCalls: a script that calls too little gets the violation in its observation", async () => {
  const execute = await executeTool({
    client: served.client,
    tools: [weatherTool()],
    expectedCalls: [{ tool: "get_weather", min: 2 }],
  });
  const code = "import tools\nprint(tools.get_weather(city='Oslo')['temp'])\n";
  const model = new ScriptedModel([callExecute(code, "oa2"), say("done")]);
  const agent = new Agent({
    name: "weather",
    instructions: "Use the tool.",
    model,
    tools: [execute],
  });
  await new Runner({ tracingDisabled: true }).run(agent, "Weather?");
  const text = String(givenBack(model.requests[1]).get("oa2"));
  const lines = text.split("\n");
  assert.equal(lines[0], "status: limit_exceeded · exit code 0 · 1 tool call (1 ok)");
  assert.equal(lines.at(-2), "--- violations ---");
  assert.match(
    lines.at(-1) ?? "",
    /^expected_calls: .*get_weather.* \(checked after the script ended\)$/,
  );
});

test("arguments without code: the model reads the Python SDK's error text and can try again", async () => {
  const execute = await executeTool({ client: served.client });
  const model = new ScriptedModel([
    [
      {
        type: "function_call",
        callId: "bad",
        name: "execute_python",
        arguments: JSON.stringify({ script: "print(1)" }),
        status: "completed",
      },
    ],
    callExecute("print(1)", "good"),
    say("1"),
  ]);
  const agent = new Agent({ name: "x", instructions: "Use the tool.", model, tools: [execute] });
  await new Runner({ tracingDisabled: true }).run(agent, "print 1");
  assert.equal(model.requests.length, 3);
  assert.equal(
    givenBack(model.requests[1]).get("bad"),
    'error: the tool takes one argument, {"code": "<a Python script>"}',
  );
  assert.equal(
    givenBack(model.requests[2]).get("good"),
    "status: ok · exit code 0 · 0 tool calls\n--- stdout ---\n1",
  );
});

test("Runner.run over a caller's Session: call 2 reads the names call 1 set", async () => {
  const session = await served.client.createSession();
  try {
    const execute = await executeTool({ client: served.client, tools: [weatherTool()], session });
    const first = "import tools\noslo = tools.get_weather(city='Oslo')\nprint(oslo['wind'])";
    const model = new ScriptedModel([
      callExecute(first, "os1"),
      callExecute("print(oslo['temp'] + 1)", "os2"),
      say("4 degrees"),
    ]);
    const agent = new Agent({
      name: "weather",
      instructions: "Keep state.",
      model,
      tools: [execute],
    });
    const result = await new Runner({ tracingDisabled: true }).run(agent, "Oslo, one warmer?");
    assert.equal(result.finalOutput, "4 degrees");
    assert.equal(model.requests.length, 3);
    const given = givenBack(model.requests[2]);
    assert.equal(
      given.get("os1"),
      [
        "status: ok · exit code 0 · 1 tool call (1 ok)",
        "--- stdout ---",
        "N",
        "--- calls (1) ---",
        '#1 get_weather({"city":"Oslo"}) -> ok {"city":"Oslo","temp":3,"wind":"N"}',
      ].join("\n"),
    );
    assert.equal(given.get("os2"), "status: ok · exit code 0 · 0 tool calls\n--- stdout ---\n4");
    assert.equal((await session.get()).executionIds.length, 2); // two cells of the one session
  } finally {
    await session.close();
  }
});
