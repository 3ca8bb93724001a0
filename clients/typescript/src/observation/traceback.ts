/**
 * The script's own frames of a traceback, as the Python observation shows them
 * (`sandbox/integrations/script_frames.py`, `script_frames` and `_frame_lines`): frames of the
 * sandbox's runtime, the generated stubs, the standard library and an adapter's prelude are
 * folded into one counted marker; the script's frames carry the model's line numbers and, when
 * the script is known, its source line.
 *
 * Line numbers are `bigint`: Python's `int()` reads a frame's number whatever its size and in any
 * script's digits, and a guest may print any of them.
 */

import { pyInt, pyStrip, splitLines } from "./pytext.js";

/** The file name the guest compiles the script under. */
export const SCRIPT_FILE = "<script>";

/** The script that ran; `preludeLines` lines an adapter put before the model's code. */
export interface ScriptSource {
  readonly text: string;
  readonly preludeLines?: number;
}

const FRAME = /^ {2}File "([^"]*)", line (\p{Nd}+), in (.*)$/u;

function own(source: ScriptSource, line: bigint): bigint | null {
  const prelude = BigInt(source.preludeLines ?? 0);
  return line > prelude ? line - prelude : null;
}

function sourceLine(lines: readonly string[], number: bigint): string {
  return number > 0n && number <= BigInt(lines.length)
    ? pyStrip(lines[Number(number) - 1] ?? "")
    : "";
}

/** Line numbers of the script's frames in the last traceback of `stderr`. */
function frameLines(stderr: string): bigint[] {
  let lines: bigint[] = [];
  for (const text of splitLines(stderr)) {
    if (text.startsWith("Traceback (most recent call last):")) lines = [];
    const match = FRAME.exec(text);
    if (match && match[1] === SCRIPT_FILE) lines.push(pyInt(match[2] ?? ""));
  }
  return lines;
}

/** ` (line N)` of the model's code, or "" when it is not known. */
export function errorLine(stderr: string, reported: number, source: ScriptSource): string {
  const mine = frameLines(stderr).filter((n) => own(source, n) !== null);
  let line: bigint | null;
  if (mine.length > 0) line = own(source, mine[mine.length - 1] ?? 0n);
  else if (source.preludeLines) line = reported ? own(source, BigInt(reported)) : null;
  else line = reported ? BigInt(reported) : null;
  return line ? ` (line ${line})` : "";
}

function isException(text: string): boolean {
  return text.startsWith("_ptc_runtime.") && text.includes(":");
}

/** `stderr` with every traceback reduced to the script's own frames. */
export function scriptFrames(stderr: string, source: ScriptSource): string {
  const out: string[] = [];
  const scriptLines = splitLines(source.text);
  let hidden = 0;
  let inFrame = false;
  let keepBody = false;
  const flush = (): void => {
    if (hidden) {
      out.push(
        `  [... ${hidden} ${hidden === 1 ? "frame" : "frames"} of the sandbox runtime hidden ...]`,
      );
      hidden = 0;
    }
  };
  for (const text of splitLines(stderr)) {
    const match = FRAME.exec(text);
    if (match) {
      const number = pyInt(match[2] ?? "");
      const mine = match[1] === SCRIPT_FILE ? own(source, number) : null;
      inFrame = true;
      if (mine === null) {
        hidden += 1;
        keepBody = false;
        continue;
      }
      flush();
      keepBody = !source.text;
      out.push(`  File "${SCRIPT_FILE}", line ${mine}, in ${match[3] ?? ""}`);
      const code = sourceLine(scriptLines, number);
      if (code) out.push(`    ${code}`);
      continue;
    }
    if (inFrame && text.startsWith("    ")) {
      if (keepBody) out.push(text);
      continue;
    }
    inFrame = false;
    flush();
    out.push(isException(text) ? text.replace("_ptc_runtime.", "tools.") : text);
  }
  flush();
  return out.join("\n") + (stderr.endsWith("\n") ? "\n" : "");
}
