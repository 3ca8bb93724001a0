/**
 * Python's text semantics, as the Python observation relies on them, so that the TypeScript
 * observation cuts, counts and prints exactly where and what the Python one does.
 *
 * JavaScript differs from Python in each of these: a string's length counts UTF-16 units where
 * Python counts code points; `split("\n")` knows one line boundary where `str.splitlines` knows
 * eleven; `trim()` strips a different set of characters than `str.strip()`; `toFixed` rounds a
 * tie away from zero where Python's formatting rounds it to even; `String(x)` switches to an
 * exponent at other magnitudes than Python's `repr(x)`. A byte count is of UTF-8 with lone
 * surrogates encoded as three bytes (Python's `surrogatepass`), and a cut by bytes drops them,
 * as Python's decoding with `ignore` does.
 */

/** The code points of `text`, a lone surrogate as one (Python's `list(text)`). */
export function codePoints(text: string): string[] {
  return Array.from(text);
}

/** Python's `len(text)`. */
export function pyLen(text: string): number {
  let n = 0;
  for (const _ of text) n += 1;
  return n;
}

/** Python's `text[:end]`, `end` counted in code points. */
export function pyHead(text: string, end: number): string {
  return codePoints(text).slice(0, Math.max(end, 0)).join("");
}

function utf8Width(point: number): number {
  if (point < 0x80) return 1;
  if (point < 0x800) return 2;
  if (point < 0x10000) return 3; // lone surrogates too, as surrogatepass encodes them
  return 4;
}

function isSurrogate(point: number): boolean {
  return point >= 0xd800 && point <= 0xdfff;
}

/** Python's `len(text.encode("utf-8", "surrogatepass"))`. */
export function utf8Size(text: string): number {
  let n = 0;
  for (const ch of text) n += utf8Width(ch.codePointAt(0) ?? 0);
  return n;
}

/**
 * At most `limit` UTF-8 bytes of `text` (its start, or its end with `fromEnd`), cut on a
 * character boundary: Python's encode, slice and `decode("utf-8", "ignore")`, which also drops
 * lone surrogates from the piece kept.
 */
export function clipBytes(text: string, limit: number, fromEnd = false): string {
  if (utf8Size(text) <= limit) return text;
  const points = codePoints(text);
  if (fromEnd) points.reverse();
  const kept: string[] = [];
  let used = 0;
  for (const ch of points) {
    const point = ch.codePointAt(0) ?? 0;
    used += utf8Width(point);
    if (used > limit) break;
    if (!isSurrogate(point)) kept.push(ch);
  }
  if (fromEnd) kept.reverse();
  return kept.join("");
}

// str.splitlines' boundaries: \n, \r, \r\n, \v, \f, \x1c, \x1d, \x1e, \x85, \u2028, \u2029.
// biome-ignore lint/suspicious/noControlCharactersInRegex: these are Python's line boundaries
const LINE_BREAK = /\r\n|[\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029]/g;

/** Python's `text.splitlines(keepends)`. */
export function splitLines(text: string, keepEnds = false): string[] {
  const lines: string[] = [];
  let start = 0;
  LINE_BREAK.lastIndex = 0;
  for (let m = LINE_BREAK.exec(text); m !== null; m = LINE_BREAK.exec(text)) {
    const end = m.index + m[0].length;
    lines.push(text.slice(start, keepEnds ? end : m.index));
    start = end;
  }
  if (start < text.length) lines.push(text.slice(start));
  return lines;
}

// str.isspace(): Unicode White_Space with bidi class WS, B or S, or general category Zs.
const PY_SPACE = new Set(
  Array.from(
    "\t\n\v\f\r\x1c\x1d\x1e\x1f \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006" +
      "\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000",
  ),
);

/** Python's `text.rstrip()`. */
export function pyRstrip(text: string): string {
  let end = text.length;
  while (end > 0 && PY_SPACE.has(text.charAt(end - 1))) end -= 1;
  return text.slice(0, end);
}

/** Python's `text.strip()`. */
export function pyStrip(text: string): string {
  let start = 0;
  while (start < text.length && PY_SPACE.has(text.charAt(start))) start += 1;
  return pyRstrip(text.slice(start));
}

/** Python's `text.rstrip(chars)` for a set of single-unit characters. */
export function rstripChars(text: string, chars: string): string {
  let end = text.length;
  while (end > 0 && chars.includes(text.charAt(end - 1))) end -= 1;
  return text.slice(0, end);
}

/** Python's `int(text)` of a run of Unicode decimal digits (any script's). */
export function pyInt(digits: string): bigint {
  let value = 0n;
  for (const ch of digits) value = value * 10n + BigInt(digitValue(ch.codePointAt(0) ?? 0));
  return value;
}

const DECIMAL = /^\p{Nd}$/u;

// Decimal digits come in runs of ten, zero first (a Unicode stability guarantee), and runs may
// be adjacent (the mathematical digits): the value is the distance from the run's start mod 10.
function digitValue(point: number): number {
  let start = point;
  while (DECIMAL.test(String.fromCodePoint(start - 1))) start -= 1;
  return (point - start) % 10;
}

/** The sign, the exact significand and the binary exponent of a finite double. */
function exact(value: number): { negative: boolean; mantissa: bigint; exponent: number } {
  const view = new DataView(new ArrayBuffer(8));
  view.setFloat64(0, value);
  const bits = view.getBigUint64(0);
  const negative = bits >> 63n === 1n;
  const biased = Number((bits >> 52n) & 0x7ffn);
  const fraction = bits & 0xfffffffffffffn;
  if (biased === 0) return { negative, mantissa: fraction, exponent: -1074 };
  return { negative, mantissa: fraction | (1n << 52n), exponent: biased - 1075 };
}

/**
 * Python's `f"{value:.{digits}f}"`: the exact binary value rounded to `digits` decimals, a tie
 * to the even neighbour (JavaScript's `toFixed` takes the larger one), the sign kept on a
 * negative value that rounds to zero.
 */
export function pyFixed(value: number, digits: number): string {
  if (Number.isNaN(value)) return "nan";
  if (!Number.isFinite(value)) return value > 0 ? "inf" : "-inf";
  const { negative, mantissa, exponent } = exact(value);
  const scale = 10n ** BigInt(digits);
  // value * 10^digits = mantissa * 2^exponent * scale = numerator / denominator
  let numerator = mantissa * scale;
  let denominator = 1n;
  if (exponent >= 0) numerator <<= BigInt(exponent);
  else denominator <<= BigInt(-exponent);
  let whole = numerator / denominator;
  const twice = (numerator % denominator) * 2n;
  if (twice > denominator || (twice === denominator && whole % 2n === 1n)) whole += 1n;
  let text = whole.toString().padStart(digits + 1, "0");
  if (digits > 0) text = `${text.slice(0, -digits)}.${text.slice(-digits)}`;
  return (negative ? "-" : "") + text;
}

/** Python's `str(int(value))` for an integral double: every digit, no exponent. */
export function pyIntegral(value: number): string {
  return BigInt(value).toString();
}

/**
 * Python's `repr(value)` of a float (as `json.dumps` prints it): the shortest digits that read
 * back as the same double, in positional form from 1e-4 up to 1e16 with ".0" on an integral
 * value, else as `d.ddde+XX`.
 */
export function pyFloatRepr(value: number): string {
  if (Number.isNaN(value)) return "NaN";
  if (!Number.isFinite(value)) return value > 0 ? "Infinity" : "-Infinity";
  if (value === 0) return Object.is(value, -0) ? "-0.0" : "0.0";
  const sign = value < 0 ? "-" : "";
  const [mantissa = "", exp = "0"] = Math.abs(value).toExponential().split("e");
  const digits = mantissa.replace(".", "");
  const point = Number(exp) + 1; // value = 0.DIGITS * 10^point
  if (point <= -4 || point > 16) {
    const e = point - 1;
    const body = digits.length > 1 ? `${digits[0]}.${digits.slice(1)}` : digits;
    const magnitude = String(Math.abs(e)).padStart(2, "0");
    return `${sign}${body}e${e < 0 ? "-" : "+"}${magnitude}`;
  }
  if (point <= 0) return `${sign}0.${"0".repeat(-point)}${digits}`;
  if (point >= digits.length) return `${sign}${digits}${"0".repeat(point - digits.length)}.0`;
  return `${sign}${digits.slice(0, point)}.${digits.slice(point)}`;
}
