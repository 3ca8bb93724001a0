/**
 * JSON as the Python observation reads and prints it: `json.loads` of a call's arguments and
 * result text, then `json.dumps(value, ensure_ascii=False, separators=(",", ":"))`.
 *
 * `JSON.parse` and `JSON.stringify` would print another text for the same JSON: `1.0` as `1`,
 * `1e16` as `10000000000000000`, an integer beyond 2^53 rounded, the keys `"2"` and `"1"` moved
 * before every other key, `NaN` refused, a lone surrogate escaped. So a number keeps the text
 * Python prints for it (`PyNumber`), an object its key order (`PyDict`, a `Map`: a repeated key
 * keeps its first place and its last value, as a Python dict does), and strings are escaped as
 * Python escapes them.
 */

import { pyFloatRepr } from "./pytext.js";

/** A JSON number as Python prints it after reading it (`repr` of its int or float). */
export class PyNumber {
  constructor(readonly repr: string) {}
}

/** A JSON object in Python's key order. */
export class PyDict {
  readonly entries = new Map<string, PyValue>();
}

export type PyValue = null | boolean | string | PyNumber | PyValue[] | PyDict;

/** Python refuses to read an integer of more digits than this (`sys.get_int_max_str_digits`). */
const INT_MAX_DIGITS = 4300;

class Reader {
  private at = 0;

  constructor(private readonly text: string) {}

  fail(): never {
    throw new SyntaxError(`not JSON Python reads, at offset ${this.at}`);
  }

  whitespace(): void {
    while (" \t\n\r".includes(this.text.charAt(this.at)) && this.at < this.text.length) {
      this.at += 1;
    }
  }

  done(): boolean {
    return this.at >= this.text.length;
  }

  literal(word: string): void {
    if (!this.text.startsWith(word, this.at)) this.fail();
    this.at += word.length;
  }

  value(): PyValue {
    const ch = this.text.charAt(this.at);
    switch (ch) {
      case '"':
        return this.string();
      case "{":
        return this.object();
      case "[":
        return this.array();
      case "n":
        this.literal("null");
        return null;
      case "t":
        this.literal("true");
        return true;
      case "f":
        this.literal("false");
        return false;
      case "N":
        this.literal("NaN");
        return new PyNumber("NaN");
      case "I":
        this.literal("Infinity");
        return new PyNumber("Infinity");
      default:
        if (this.text.startsWith("-Infinity", this.at)) {
          this.at += "-Infinity".length;
          return new PyNumber("-Infinity");
        }
        return this.number();
    }
  }

  number(): PyNumber {
    const match = /-?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?/y;
    match.lastIndex = this.at;
    const m = match.exec(this.text);
    if (m === null) this.fail();
    this.at += m[0].length;
    if (m[1] === undefined && m[2] === undefined) {
      const digits = m[0].replace("-", "");
      if (digits.length > INT_MAX_DIGITS) this.fail();
      return new PyNumber(BigInt(m[0]).toString());
    }
    return new PyNumber(pyFloatRepr(Number(m[0])));
  }

  string(): string {
    this.at += 1; // the opening quote
    let out = "";
    for (;;) {
      const ch = this.text.charAt(this.at);
      if (this.done()) this.fail();
      this.at += 1;
      if (ch === '"') return out;
      if (ch < " ") this.fail(); // Python reads strictly: no raw control characters
      if (ch !== "\\") {
        out += ch;
        continue;
      }
      const code = this.text.charAt(this.at);
      this.at += 1;
      const simple: Record<string, string> = {
        '"': '"',
        "\\": "\\",
        "/": "/",
        b: "\b",
        f: "\f",
        n: "\n",
        r: "\r",
        t: "\t",
      };
      if (code in simple) {
        out += simple[code];
      } else if (code === "u") {
        const hex = this.text.slice(this.at, this.at + 4);
        if (!/^[0-9a-fA-F]{4}$/.test(hex)) this.fail();
        this.at += 4;
        out += String.fromCharCode(parseInt(hex, 16)); // a pair of escapes joins, as in Python
      } else {
        this.fail();
      }
    }
  }

  object(): PyDict {
    this.at += 1;
    const dict = new PyDict();
    this.whitespace();
    if (this.text.charAt(this.at) === "}") {
      this.at += 1;
      return dict;
    }
    for (;;) {
      if (this.text.charAt(this.at) !== '"') this.fail();
      const key = this.string();
      this.whitespace();
      this.literal(":");
      this.whitespace();
      dict.entries.set(key, this.value());
      this.whitespace();
      const next = this.text.charAt(this.at);
      this.at += 1;
      if (next === "}") return dict;
      if (next !== ",") this.fail();
      this.whitespace();
    }
  }

  array(): PyValue[] {
    this.at += 1;
    const items: PyValue[] = [];
    this.whitespace();
    if (this.text.charAt(this.at) === "]") {
      this.at += 1;
      return items;
    }
    for (;;) {
      this.whitespace();
      items.push(this.value());
      this.whitespace();
      const next = this.text.charAt(this.at);
      this.at += 1;
      if (next === "]") return items;
      if (next !== ",") this.fail();
    }
  }
}

/**
 * What the Python client holds for a call's JSON text
 * (`sandbox.codec.values.value_of_json_text`): nothing for an empty text, the value read, or the
 * text itself when Python cannot read it.
 */
export function loadsLikePython(text: string): PyValue {
  if (text === "") return null;
  try {
    const reader = new Reader(text);
    reader.whitespace();
    const value = reader.value();
    reader.whitespace();
    if (!reader.done()) reader.fail();
    return value;
  } catch {
    return text;
  }
}

/**
 * A JavaScript value (a call's arguments or result already parsed, without its JSON text) in
 * the Python model: an integral number below 2^53 as an int, any other as a float. The text of
 * the original JSON is lost here, so `1.0` prints as `1`: pass the JSON text where there is one.
 */
export function fromJs(value: unknown): PyValue {
  if (value === null || value === undefined) return null;
  if (typeof value === "boolean" || typeof value === "string") return value;
  if (typeof value === "bigint") return new PyNumber(value.toString());
  if (typeof value === "number") {
    return new PyNumber(
      Number.isSafeInteger(value) && !Object.is(value, -0) ? String(value) : pyFloatRepr(value),
    );
  }
  if (Array.isArray(value)) return value.map(fromJs);
  if (typeof value === "object") {
    const dict = new PyDict();
    for (const [key, item] of Object.entries(value)) dict.entries.set(key, fromJs(item));
    return dict;
  }
  return String(value); // Python's default=str
}

const ESCAPES: Record<string, string> = {
  '"': '\\"',
  "\\": "\\\\",
  "\n": "\\n",
  "\r": "\\r",
  "\t": "\\t",
  "\b": "\\b",
  "\f": "\\f",
};

function quote(text: string): string {
  const body = text.replace(
    // biome-ignore lint/suspicious/noControlCharactersInRegex: these are the characters Python escapes
    /["\\\u0000-\u001f]/g,
    (ch) => ESCAPES[ch] ?? `\\u${ch.charCodeAt(0).toString(16).padStart(4, "0")}`,
  );
  return `"${body}"`;
}

/** Python's `json.dumps(value, ensure_ascii=False, separators=(",", ":"))`. */
export function dumpsCompact(value: PyValue): string {
  if (value === null) return "null";
  if (value === true) return "true";
  if (value === false) return "false";
  if (typeof value === "string") return quote(value);
  if (value instanceof PyNumber) return value.repr;
  if (Array.isArray(value)) return `[${value.map(dumpsCompact).join(",")}]`;
  const parts: string[] = [];
  for (const [key, item] of value.entries) parts.push(`${quote(key)}:${dumpsCompact(item)}`);
  return `{${parts.join(",")}}`;
}

/**
 * `value` reduced to the declared `fields` (dotted paths reach into nested objects); lists are
 * reduced element by element; anything else is returned unchanged. Python's
 * `summarize_result`, aliasing included: a nested summary merges into the object already kept.
 */
export function summarize(value: PyValue, fields: readonly string[]): PyValue {
  if (fields.length === 0) return value;
  if (Array.isArray(value)) return value.map((item) => summarize(item, fields));
  if (!(value instanceof PyDict)) return value;
  const out = new PyDict();
  for (const path of fields) {
    const dot = path.indexOf(".");
    const head = dot < 0 ? path : path.slice(0, dot);
    const rest = dot < 0 ? "" : path.slice(dot + 1);
    if (!value.entries.has(head)) continue;
    const found = value.entries.get(head) ?? null;
    if (rest) {
      const inner = summarize(found, [rest]);
      const kept = out.entries.get(head);
      if (inner instanceof PyDict && kept instanceof PyDict) {
        for (const [key, item] of inner.entries) kept.entries.set(key, item);
      } else {
        out.entries.set(head, inner);
      }
    } else {
      out.entries.set(head, found);
    }
  }
  return out;
}
