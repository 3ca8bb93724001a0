/**
 * The execute tool over a session (`session: true`, or a `Session` passed in), in two
 * frameworks' own loops against a real `ptc serve`: a name the script sets in the model's
 * first call is there in its second, and the model reads each cell's observation, exactly.
 * Once the session has ended, the model reads why, in the Python session runner's words: the
 * shared vectors (tests/data/session_refusal_vectors.json, checked against the Python execute
 * tool by tests/integrations/test_session_refusal_vectors.py) give the text.
 */

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { AIMessage, ToolMessage } from "@langchain/core/messages";
import { fakeModel } from "@langchain/core/testing";
import { generateText, stepCountIs } from "ai";
import { MockLanguageModelV2 } from "ai/test";
import { createAgent } from "langchain";
import { errorFromStatus, GrpcCode } from "../../src/errors.js";
import { aiExecuteTool } from "../../src/frameworks/ai.js";
import { ExecuteTool, refusedInSession } from "../../src/frameworks/core.js";
import { executeTool as langchainExecuteTool } from "../../src/frameworks/langchain.js";
import type { Tools } from "../../src/options.js";
import { REPO_ROOT } from "../support/serve.js";
import { servedClient } from "../support/served.js";
import { answer, callExecute, weatherTool } from "./scripted.js";

interface Vector {
  code: keyof typeof GrpcCode;
  details: string;
  text: string;
}

const VECTORS = join(REPO_ROOT, "tests", "data", "session_refusal_vectors.json");
const vectors = JSON.parse(readFileSync(VECTORS, "utf8")) as Vector[];
/** The first vector's text (a closed session) for the session `id`. */
const closedText = (id: string) => vectors[0]?.text.replace("s-4f2a", id);

const served = servedClient("--allow-degraded");

/** The texts of the tool results in a prompt, in order. */
function givenBack(prompt: readonly unknown[]): string[] {
  const texts: string[] = [];
  for (const message of prompt as { role: string; content: unknown }[]) {
    if (message.role !== "tool") continue;
    for (const part of message.content as { type: string; output: { value: unknown } }[]) {
      if (part.type === "tool-result") texts.push(String(part.output.value));
    }
  }
  return texts;
}

interface DescriptionVector {
  case: string;
  session: boolean;
  tools: Tools;
  instructions: string;
  description: string;
}

const DESCRIPTIONS = join(REPO_ROOT, "tests", "data", "execute_tool_description_vectors.json");

test("the description says what persists, in each mode, word for word the Python tool's", async () => {
  const cases = JSON.parse(readFileSync(DESCRIPTIONS, "utf8")) as DescriptionVector[];
  assert.deepEqual(new Set(cases.map((c) => c.session)), new Set([false, true]));
  for (const c of cases) {
    const core = await ExecuteTool.create({
      client: served.client,
      tools: c.tools,
      instructions: c.instructions,
      session: c.session,
    });
    assert.equal(core.description, c.description, c.case);
    assert.equal(core.sessionId, undefined); // describing opens no session
  }
});

test("the vectors are there, and each refusal renders as the Python tool's", () => {
  assert.ok(vectors.length >= 5, `only ${vectors.length} vectors`);
  for (const v of vectors) {
    const error = errorFromStatus(GrpcCode[v.code], v.details);
    const observation = refusedInSession(error);
    assert.equal(observation.text, v.text, v.details);
    assert.equal(observation.isError, true);
    assert.equal(observation.result, undefined);
  }
});

test("generateText, session: true: call 2 reads the name call 1 set, and close ends it", async () => {
  const core = await ExecuteTool.create({ client: served.client, session: true });
  assert.equal(core.sessionId, undefined); // opened on the first run, not before
  let givenSession = "";
  const model = new MockLanguageModelV2({
    doGenerate: [
      callExecute("x = 41\nprint('set')", "c1"),
      callExecute("print(x + 1)", "c2"),
      callExecute("x * 2", "c3"),
      answer(),
    ],
  });
  try {
    const result = await generateText({
      model,
      tools: { execute_python: aiExecuteTool(core) },
      prompt: "Keep x.",
      stopWhen: stepCountIs(5),
    });
    givenSession = core.sessionId ?? "";
    assert.equal(result.text, "done");
    assert.deepEqual(givenBack(model.doGenerateCalls[3]?.prompt ?? []), [
      "status: ok · exit code 0 · 0 tool calls\n--- stdout ---\nset",
      "status: ok · exit code 0 · 0 tool calls\n--- stdout ---\n42",
      "status: ok · exit code 0 · 0 tool calls\n--- value ---\n82",
    ]);
  } finally {
    await core.close();
  }
  const id = givenSession;
  const info = await served.client.getSession(id);
  assert.equal(info.executionIds.length, 3); // the three calls, cells of one session
  assert.equal(info.state, "closed");
  assert.equal(core.sessionId, undefined);
  await core.close(); // a second close is nothing
});

test("a call after the session ended is the observation naming why, as in Python", async () => {
  const session = await served.client.createSession();
  const core = await ExecuteTool.create({ client: served.client, session });
  assert.equal((await core.run("y = 1")).isError, false);
  await session.close();
  const observation = await core.run("print(y)");
  assert.equal(observation.text, closedText(session.id));
  assert.equal(observation.isError, true);
  assert.equal(observation.result, undefined);
  await core.close(); // the caller's session: left alone, no error
  // The server still serves: a single-use tool runs.
  const single = await ExecuteTool.create({ client: served.client });
  assert.equal(
    (await single.run("print(2)")).text,
    "status: ok · exit code 0 · 0 tool calls\n--- stdout ---\n2",
  );
});

test("a single-use tool keeps nothing between calls", async () => {
  const single = await ExecuteTool.create({ client: served.client });
  await single.run("z = 1");
  const observation = await single.run("print(z)");
  assert.equal(observation.result?.status, "error");
  assert.match(observation.text, /NameError: name 'z' is not defined/);
});

test("createAgent with a Session passed in: a client tool's result set in call 1 is read in call 2", async () => {
  const session = await served.client.createSession();
  try {
    const execute = await langchainExecuteTool({
      client: served.client,
      tools: [weatherTool()],
      session,
    });
    const first =
      "import tools\ntemps = {c: tools.get_weather(city=c)['temp'] for c in ['Oslo', 'Ys']}\n";
    const model = fakeModel()
      .respondWithTools([{ name: "execute_python", args: { code: first }, id: "lc1" }])
      .respondWithTools([
        { name: "execute_python", args: { code: "print(sorted(temps))" }, id: "lc2" },
      ])
      .respond(new AIMessage("Oslo and Ys."));
    const agent = createAgent({ model, tools: [execute] });
    await agent.invoke({ messages: [{ role: "user", content: "Weather?" }] });
    assert.equal(model.callCount, 3);
    const given = (model.calls[2]?.messages ?? []).filter((m): m is ToolMessage =>
      ToolMessage.isInstance(m),
    );
    assert.deepEqual(
      given.map((m) => m.content),
      [
        [
          "status: ok · exit code 0 · 2 tool calls (2 ok)",
          "--- calls (2) ---",
          '#1 get_weather({"city":"Oslo"}) -> ok {"city":"Oslo","temp":3,"wind":"N"}',
          '#2 get_weather({"city":"Ys"}) -> ok {"city":"Ys","temp":3,"wind":"N"}',
        ].join("\n"),
        "status: ok · exit code 0 · 0 tool calls\n--- stdout ---\n['Oslo', 'Ys']",
      ],
    );
    assert.equal((await session.get()).executionIds.length, 2);
  } finally {
    await session.close();
  }
});

test("two calls at once open one session; one cell is refused as the server says, and the tool goes on", async () => {
  const core = await ExecuteTool.create({ client: served.client, session: true });
  try {
    const both = await Promise.all([
      core.run("import time\ntime.sleep(1)\nv = 'first'"),
      core.run("import time\ntime.sleep(1)\nv = 'second'"),
    ]);
    const id = core.sessionId ?? "";
    const ran = both.filter((o) => o.result?.status === "ok");
    const refused = both.filter((o) => o.result === undefined);
    assert.equal(ran.length, 1); // which one reaches the server first is not ours to say
    assert.equal(refused.length, 1);
    assert.equal(ran[0]?.text, "status: ok · exit code 0 · 0 tool calls");
    assert.equal(
      refused[0]?.text,
      `error: the sandbox refused the request: session_id: session '${id}' is running execution '${ran[0]?.result?.executionId}'; a session runs one execution at a time (refused, not queued)`,
    );
    const kept = both[0] === ran[0] ? "first" : "second";
    const after = await core.run("print(v)");
    assert.equal(after.text, `status: ok · exit code 0 · 0 tool calls\n--- stdout ---\n${kept}`);
    assert.equal((await served.client.getSession(id)).executionIds.length, 2); // the refused one is no cell
  } finally {
    await core.close();
  }
});
