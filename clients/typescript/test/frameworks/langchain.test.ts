/**
 * LangChain's own agent loop (`createAgent` from `langchain`) driven by its fake chat model
 * with scripted tool calls (`fakeModel` from `@langchain/core/testing`), calling
 * `ptc-sandbox/langchain`'s execute tool against a real `ptc serve`: the `ToolMessage` the model
 * is given back is the observation, exactly.
 */

import assert from "node:assert/strict";
import { test } from "node:test";
import { AIMessage, ToolMessage } from "@langchain/core/messages";
import { fakeModel } from "@langchain/core/testing";
import { createAgent } from "langchain";
import { executeTool } from "../../src/frameworks/langchain.js";
import { servedClient } from "../support/served.js";
import { WEATHER_OBSERVATION, WEATHER_SCRIPT, weatherTool } from "./scripted.js";

const served = servedClient("--allow-degraded");

function toolMessages(messages: readonly unknown[]): ToolMessage[] {
  return messages.filter((m): m is ToolMessage => ToolMessage.isInstance(m));
}

test("createAgent: the model reads the observation of a script calling a client tool", async () => {
  const execute = await executeTool({ client: served.client, tools: [weatherTool()] });
  const model = fakeModel()
    .respondWithTools([{ name: "execute_python", args: { code: WEATHER_SCRIPT }, id: "lc1" }])
    .respond(new AIMessage("It is 3 degrees."));
  const agent = createAgent({ model, tools: [execute] });
  const state = await agent.invoke({ messages: [{ role: "user", content: "Weather?" }] });
  assert.equal(model.callCount, 2);
  const given = toolMessages(model.calls[1]?.messages ?? []);
  assert.equal(given.length, 1);
  assert.equal(given[0]?.tool_call_id, "lc1");
  assert.equal(given[0]?.content, WEATHER_OBSERVATION);
  assert.equal(String(state.messages.at(-1)?.content), "It is 3 degrees.");
});

test("a call without code is refused by LangChain's schema check, and the agent goes on", async () => {
  const execute = await executeTool({ client: served.client });
  const model = fakeModel()
    .respondWithTools([{ name: "execute_python", args: { script: "print(1)" }, id: "lc2" }])
    .respondWithTools([{ name: "execute_python", args: { code: "print(6 * 7)" }, id: "lc3" }])
    .respond(new AIMessage("42"));
  // The schema check is LangChain's: a call its schema refuses never reaches the tool, and the
  // model is told so; the next call runs.
  const agent = createAgent({ model, tools: [execute] });
  await agent.invoke({ messages: [{ role: "user", content: "6*7?" }] });
  assert.equal(model.callCount, 3);
  const [refused, last] = toolMessages(model.calls[2]?.messages ?? []);
  assert.equal(refused?.status, "error");
  assert.match(
    String(refused?.content),
    /^Error invoking tool 'execute_python' with kwargs \{"script"/,
  );
  assert.equal(last?.content, "status: ok · exit code 0 · 0 tool calls\n--- stdout ---\n42");
});
