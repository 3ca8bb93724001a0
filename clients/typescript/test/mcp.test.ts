/**
 * The MCP path from TypeScript: `ptc mcp` as a real process over stdio, with an upstream MCP
 * server (the Python suite's fixture, tests/integrations/upstream_server.py) whose tools become
 * stubs, driven by the official TypeScript MCP client (`@modelcontextprotocol/sdk`) and by the
 * AI SDK's MCP client (`@ai-sdk/mcp`) inside the AI SDK's agent loop on its mock model. Both list
 * the execute tool with the upstream's stubs in its description and run a script that calls an
 * upstream tool; the text they get back is the observation.
 */

import assert from "node:assert/strict";
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { experimental_createMCPClient } from "@ai-sdk/mcp";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { generateText, stepCountIs, type ToolSet } from "ai";
import { MockLanguageModelV2 } from "ai/test";
import { ptcBinary, REPO_ROOT, venvPython } from "./support/serve.js";

const UPSTREAM = join(REPO_ROOT, "tests", "integrations", "upstream_server.py");
/** `ptc mcp` with the upstream server, as a user starts it. */
const COMMAND = ptcBinary();
const ARGS = ["mcp", "--upstream", `${venvPython()} ${UPSTREAM}`];

const SCRIPT = [
  "import tools",
  "w = tools.get_weather(city='Oslo')",
  "print(w['city'], w['temp_c'], w['sky'])",
  "try:",
  "    tools.get_weather(city='Atlantis')",
  "except tools.ToolError as e:",
  "    print('refused:', e)",
  "",
].join("\n");

const OBSERVATION = [
  "status: ok · exit code 0 · 2 tool calls (1 error, 1 ok)",
  "--- stdout ---",
  "Oslo 4.0 clear",
  "refused: Error executing tool get_weather: unknown city: Atlantis", // the upstream's words
  "--- calls (2) ---",
  '#1 get_weather({"city":"Oslo"}) -> ok {"city":"Oslo","temp_c":4.0,"sky":"clear"}',
  '#2 get_weather({"city":"Atlantis"}) -> error Error executing tool get_weather: unknown city: Atlantis',
].join("\n");

/** The processes whose parent is this one (a `ptc mcp` left running would be one). */
function children(): string[] {
  const mine: string[] = [];
  for (const pid of readdirSync("/proc").filter((name) => /^\d+$/.test(name))) {
    try {
      const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
      const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
      if (fields[1] === String(process.pid) && fields[0] !== "Z")
        mine.push(`${pid} ${stat.slice(0, 60)}`);
    } catch {
      // the process ended while we looked
    }
  }
  return mine;
}

/** Waits until no child of this process is left, failing after `ms`. */
async function noChildLeft(ms = 10_000): Promise<void> {
  const deadline = Date.now() + ms;
  while (children().length > 0 && Date.now() < deadline) {
    await new Promise((done) => setTimeout(done, 50));
  }
  assert.deepEqual(children(), []);
}

function textOf(content: unknown): string {
  assert.ok(Array.isArray(content), JSON.stringify(content));
  return (content as { type: string; text?: string }[])
    .filter((c) => c.type === "text")
    .map((c) => c.text ?? "")
    .join("\n");
}

test("the official MCP client lists the execute tool and runs a script calling an upstream tool", async () => {
  const client = new Client({ name: "ptc-ts-test", version: "0.0.0" });
  const transport = new StdioClientTransport({ command: COMMAND, args: ARGS, stderr: "pipe" });
  await client.connect(transport);
  try {
    const { tools } = await client.listTools();
    assert.deepEqual(
      tools.map((t) => t.name),
      ["execute_python"],
    );
    const [execute] = tools;
    assert.deepEqual(execute?.inputSchema.required, ["code"]);
    assert.match(execute?.description ?? "", /def get_weather\(\*, city: str\)/);
    const called = await client.callTool({ name: "execute_python", arguments: { code: SCRIPT } });
    assert.equal(called.isError, false);
    assert.equal(textOf(called.content), OBSERVATION);
    const failing = await client.callTool({
      name: "execute_python",
      arguments: { code: "import tools\ntools.get_weather(city='Nowhere')\n" },
    });
    assert.equal(failing.isError, true);
    // ptc mcp (the Python MCP SDK) reports an error observation with its own prefix.
    const failed = textOf(failing.content).split("\n");
    assert.equal(
      failed[0],
      "Error executing tool execute_python: status: error · exit code 1 · 1 tool call (1 error)",
    );
    assert.equal(failed[1], "--- calls (1) ---");
    assert.equal(
      failed[2],
      '#1 get_weather({"city":"Nowhere"}) -> error Error executing tool get_weather: unknown city: Nowhere',
    );
  } finally {
    await client.close();
  }
  await noChildLeft();
});

test("the AI SDK's MCP client gives the AI SDK's agent loop the execute tool of ptc mcp", async () => {
  // The AI SDK's client over the official SDK's stdio transport, as the AI SDK documents for
  // stdio: @ai-sdk/mcp's own Experimental_StdioMCPTransport (0.0.23) left `ptc mcp` running
  // after close() (no end of its input, no signal), which this test would report.
  const mcp = await experimental_createMCPClient({
    transport: new StdioClientTransport({ command: COMMAND, args: ARGS, stderr: "pipe" }),
  });
  try {
    const tools = await mcp.tools();
    assert.deepEqual(Object.keys(tools), ["execute_python"]);
    assert.match(tools.execute_python?.description ?? "", /def get_weather\(\*, city: str\)/);
    const usage = { inputTokens: 1, outputTokens: 1, totalTokens: 2 };
    const model = new MockLanguageModelV2({
      doGenerate: [
        {
          content: [
            {
              type: "tool-call",
              toolCallId: "mcp1",
              toolName: "execute_python",
              input: JSON.stringify({ code: SCRIPT }),
            },
          ],
          finishReason: "tool-calls",
          usage,
          warnings: [],
        },
        {
          content: [{ type: "text", text: "4 degrees" }],
          finishReason: "stop",
          usage,
          warnings: [],
        },
      ],
    });
    // @ai-sdk/mcp builds its tools with its own copy of @ai-sdk/provider-utils, whose schema
    // type TypeScript tells apart from ai's; at run time they are the same tools.
    const result = await generateText({
      model,
      tools: tools as unknown as ToolSet,
      prompt: "Oslo?",
      stopWhen: stepCountIs(3),
    });
    assert.equal(result.text, "4 degrees");
    const prompt = model.doGenerateCalls[1]?.prompt ?? [];
    const parts = prompt
      .filter((m) => m.role === "tool")
      .flatMap((m) => m.content)
      .filter((p) => p.type === "tool-result");
    assert.equal(parts.length, 1);
    // An MCP tool's result reaches the model as the CallToolResult, its text content the
    // observation.
    const output = parts[0]?.output;
    assert.equal(output?.type, "json");
    const value = (output as unknown as { value: { content: unknown; isError?: boolean } }).value;
    assert.equal(textOf(value.content), OBSERVATION);
    assert.notEqual(value.isError, true);
  } finally {
    await mcp.close();
  }
  await noChildLeft();
});
