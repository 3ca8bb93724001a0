"""Write tests/data/observation_vectors.json: results in, the Python observation text out.

Run `.venv/bin/python scripts/gen_observation_vectors.py` after changing the observation
(`sandbox/integrations/observation.py`, `script_frames.py`) or the cases below; `--check` exits 1
when the committed file differs from what the Python code renders now. Both test suites read
the file: `tests/integrations/test_observation_vectors.py` renders every case with the Python SDK
and the TypeScript package's `test/observation.test.ts` with `ptc-sandbox/observation`, each
expecting the text recorded here, so the two languages cannot drift apart.

A case's ``result`` is the wire form of a result (the proto's fields in snake case; a call's
arguments and result as the JSON text the proto carries), turned into a protobuf message and
read back with `sandbox.codec.result.result_from_proto`, the path every result of the Python client
takes, before it is rendered. Budgets, declared summary fields and the script's source are
optional per case. The seeded cases at the end mix lines, unicode and budgets at random, with a
fixed seed, so the file is the same at every run.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

from sandbox._proto import sandbox_pb2 as pb
from sandbox.codec.result import result_from_proto
from sandbox.integrations.observation import ObservationBudget, ScriptSource, render_observation

ROOT = Path(__file__).resolve().parent.parent
VECTORS = ROOT / "tests" / "data" / "observation_vectors.json"

_CALL_STATUS = {
    "ok": pb.CALL_STATUS_OK,
    "error": pb.CALL_STATUS_ERROR,
    "invalid_arguments": pb.CALL_STATUS_INVALID_ARGUMENTS,
    "refused": pb.CALL_STATUS_REFUSED,
    "denied": pb.CALL_STATUS_DENIED,
    "cancelled": pb.CALL_STATUS_CANCELLED,
}
_ACTION = {
    "killed": pb.VIOLATION_ACTION_KILLED,
    "truncated": pb.VIOLATION_ACTION_TRUNCATED,
    "refused": pb.VIOLATION_ACTION_REFUSED,
    "reported": pb.VIOLATION_ACTION_REPORTED,
    "interrupted": pb.VIOLATION_ACTION_INTERRUPTED,
}
_EVIDENCE = {
    "kernel": pb.VIOLATION_EVIDENCE_KERNEL,
    "host": pb.VIOLATION_EVIDENCE_HOST,
    "guest": pb.VIOLATION_EVIDENCE_GUEST,
}


def to_proto(wire: dict[str, Any]) -> pb.ExecutionResult:
    """The protobuf message of a case's wire-form result."""
    message = pb.ExecutionResult(
        execution_id="vector",
        status=pb.ExecutionStatus.Name(
            pb.ExecutionStatus.Value("EXECUTION_STATUS_" + wire.get("status", "ok").upper())
        ),
        exit_code=wire.get("exit_code", 0),
        stdout=wire.get("stdout", ""),
        stderr=wire.get("stderr", ""),
        session_lost=wire.get("session_lost", ""),
    )
    if wire.get("value") is not None:
        message.value = wire["value"]
    for c in wire.get("calls", []):
        message.calls.add(
            seq=c["seq"],
            tool=c["tool"],
            arguments_json=c.get("arguments_json", ""),
            status=_CALL_STATUS[c["status"]],
            result_json=c.get("result_json", ""),
            error=c.get("error", ""),
        )
    for v in wire.get("violations", []):
        violation = message.violations.add(
            limit=v["limit"],
            limit_value=v["limit_value"],
            unit=v["unit"],
            action=_ACTION[v["action"]],
            detail=v.get("detail", ""),
            evidence=_EVIDENCE[v.get("evidence", "host")],
        )
        if v.get("observed") is not None:
            violation.observed = v["observed"]
    if wire.get("error") is not None:
        e = wire["error"]
        message.error.CopyFrom(pb.ScriptError(type=e["type"], message=e["message"], line=e["line"]))
    for f in wire.get("output_files", []):
        message.output_files.add(name=f["name"], size_bytes=f["size"], sha256=f["sha256"])
    for o in wire.get("omitted_outputs", []):
        omitted = message.omitted_outputs.add(name=o["name"], reason=o["reason"])
        if o.get("size") is not None:
            omitted.size_bytes = o["size"]
    return message


def render(case: dict[str, Any]) -> str:
    """The observation the Python SDK gives for ``case``."""
    result = result_from_proto(to_proto(case["result"]))
    budget = ObservationBudget(**case["budget"]) if "budget" in case else None
    script = ScriptSource(**case["script"]) if "script" in case else None
    return render_observation(result, case.get("summary_fields"), budget, script)


def _call(seq: int, tool: str, args: Any, status: str = "ok", **rest: Any) -> dict[str, Any]:
    call = {"seq": seq, "tool": tool, "arguments_json": json.dumps(args), "status": status}
    if status == "ok":
        call["result_json"] = json.dumps(rest.get("result", {"n": seq}), ensure_ascii=False)
    else:
        call["error"] = rest.get("error", "")
    return call


def _violation(limit: str, value: float, observed: float | None, unit: str, action: str,
               detail: str = "", evidence: str = "host") -> dict[str, Any]:  # fmt: skip
    return {
        "limit": limit,
        "limit_value": value,
        "observed": observed,
        "unit": unit,
        "action": action,
        "detail": detail,
        "evidence": evidence,
    }


_TRACEBACK = """\
Traceback (most recent call last):
  File "/usr/lib/python3.11/asyncio/runners.py", line 190, in run
    return runner.run(main)
           ^^^^^^^^^^^^^^^^
  File "<script>", line 6, in <module>
  File "<script>", line 4, in g
  File "tools.py", line 31, in get_weather
  File "/ptc/_ptc_runtime.py", line 264, in call
    return _require().call(tool, arguments)
           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
_ptc_runtime.InvalidArguments: argument 'city': expected string, got 5
"""
_SCRIPT = "import tools\n\ndef g():\n    return tools.get_weather(city=5)\n\nprint(g())\n"
# JSON numbers Python reads as ints and floats, printed back as Python prints them.
_NUMBERS = (
    '{"a": 1.0, "b": 1e2, "c": 1.5E-7, "d": 12345678901234567890, "e": 1e16, "f": 0.1,'
    ' "g": -0.0, "h": 1e400, "i": -1e400, "j": NaN, "k": 123456789012345.678, "l": 1e-4,'
    ' "m": 2.5e-5, "n": [0, -1, 10.10], "o": 1e15, "p": 9007199254740993,'
    ' "q": 1234567890123456.7, "r": 0.00012345, "s": -0}'
)
_INVALID = {"type": "InvalidArguments", "message": "argument 'city': expected string, got 5"}


def cases() -> list[dict[str, Any]]:
    """Every case, in a fixed order, without its expected text."""
    weather = [
        _call(i, "get_weather", {"city": f"c{i}"}, result={"temp": i}) for i in range(1, 101)
    ]
    weather[49] = _call(50, "get_weather", {"city": "Atlantis"}, "error", error="unknown city")
    weather[76] = _call(77, "get_weather", {"city": "Ys"}, "refused", error="call budget")
    out: list[dict[str, Any]] = [
        {"name": "empty output", "result": {}},
        {"name": "only a newline", "result": {"stdout": "\n"}},
        {"name": "small stdout whole", "result": {"stdout": "a\nb\n"}},
        {
            "name": "stdout head and tail by lines",
            "result": {"stdout": "".join(f"line {i:05d}\n" for i in range(2_000))},
            "budget": {"stdout_bytes": 1000, "stdout_lines": 40},
        },
        {
            "name": "stdout without final newline cut",
            "result": {"stdout": "\n".join(f"row {i}" for i in range(500))},
            "budget": {"stdout_lines": 10},
        },
        {
            "name": "one huge line of two-byte characters",
            "result": {"stdout": "é" * 5_000},
            "budget": {"stdout_bytes": 1000},
        },
        {
            "name": "one huge line of four-byte characters, odd budget",
            "result": {"stdout": "😀" * 800 + "\nend\n"},
            "budget": {"stdout_bytes": 1001},
        },
        {
            "name": "unicode line separators count as lines",
            "result": {"stdout": "a\u2028b\u2029c\x85d\x0be\x0cf\x1cg\r\nh\ri\n" * 30},
            "budget": {"stdout_lines": 8},
        },
        {
            "name": "cjk and combining marks cut by bytes",
            "result": {"stdout": ("東京の天気は晴れ e\u0301 " * 20 + "\n") * 8},
            "budget": {"stdout_bytes": 700, "stdout_lines": 100},
        },
        {
            "name": "one call singular",
            "result": {"calls": [_call(1, "get_weather", {"city": "c1"})]},
        },
        {
            "name": "many calls, failures kept",
            "result": {"calls": weather},
            "budget": {"calls": 10},
        },
        {"name": "many calls, default budget", "result": {"calls": weather}},
        {
            "name": "calls budget of one",
            "result": {"calls": weather[:5]},
            "budget": {"calls": 1},
        },
        {
            "name": "long arguments never push the outcome off",
            "result": {
                "calls": [
                    _call(1, "echo", {"text": "y" * 20_000}, "error", error="argument too large"),
                    _call(2, "echo", {"text": "z" * 5000}, result={"n": 1}),
                ]
            },
        },
        {
            "name": "long result line cut",
            "result": {"calls": [_call(1, "get", {"k": 1}, result={"blob": "z" * 5000})]},
            "budget": {"call_chars": 100},
        },
        {
            "name": "json numbers as python prints them",
            "result": {
                "calls": [
                    {
                        "seq": 1,
                        "tool": "nums",
                        "arguments_json": _NUMBERS,
                        "status": "ok",
                        "result_json": "[1e22, 1e21, 123e-20, 5e-324, 1.7976931348623157e308]",
                    }
                ]
            },
            "budget": {"call_chars": 2000},
        },
        {
            "name": "json strings, escapes and key order",
            "result": {
                "calls": [
                    {
                        "seq": 7,
                        "tool": "send-email",
                        "arguments_json": '{"b": 1, "2": "two", "1": "one", "a": "x", "b": 3,'
                        ' "ctl": "\\u0000\\u001f\\t\\n\\r\\b\\f\\"\\\\/\\u007f\\u0085",'
                        ' "pair": "\\ud83d\\ude00", "lone": "\\ud800x", "é": "日本"}',
                        "status": "ok",
                        "result_json": '{"ok": true, "none": null, "empty": {}, "list": []}',
                    },
                    {
                        "seq": 8,
                        "tool": "raw",
                        "arguments_json": "not json {",
                        "status": "error",
                        "error": "boom",
                    },
                    {"seq": 9, "tool": "empty", "arguments_json": "", "status": "ok"},
                    {
                        "seq": 10,
                        "tool": "nested",
                        "arguments_json": ' [ {"x" : [ 1 , {"y":"z"} ] } ] ',
                        "status": "cancelled",
                    },
                ]
            },
            "budget": {"call_chars": 1000},
        },
        {
            "name": "unicode arguments cut by characters",
            "result": {
                "calls": [
                    _call(1, "echo", {"text": "😀é東" * 100}, result={"r": "ß" * 300}),
                ]
            },
            "budget": {"call_chars": 120},
        },
        {
            "name": "summary fields",
            "result": {
                "calls": [
                    _call(
                        1,
                        "get_weather",
                        {"city": "Oslo"},
                        result={"temp": 3, "humidity": 9, "wind": {"kph": 5, "dir": "N"}},
                    ),
                    _call(2, "get_weather", {"city": "Rome"}, result=[{"temp": 1, "x": 2}, "s"]),
                    _call(3, "other", {}, result={"temp": 1, "x": 2}),
                    _call(
                        4,
                        "get_weather",
                        {"city": "Nice"},
                        result={"wind": 1, "temp": {"deep": {"a": 1, "b": 2}}},
                    ),
                ]
            },
            "summary_fields": {"get_weather": ["temp", "wind.kph", "temp.deep.b", "missing"]},
        },
        {
            "name": "violations with binary units, seconds, counts",
            "result": {
                "status": "limit_exceeded",
                "exit_code": -9,
                "violations": [
                    _violation("stdout_bytes", 1_048_576, 1_048_577, "bytes", "truncated"),
                    _violation("memory", 268_435_456, 11_612_160, "bytes", "killed", "", "kernel"),
                    _violation("file_size", 3 * (1 << 30), 1023, "bytes", "refused"),
                    _violation("output_bytes", 1536, None, "bytes", "refused"),
                    _violation("wall_time", 2.5, 2.5031, "s", "killed"),
                    _violation("cpu_time", 0.1, 1e-7, "s", "killed"),
                    _violation("processes", 64, 65, "count", "refused"),
                    _violation("open_files", 16, None, "count", "refused", "EMFILE", "guest"),
                    _violation("odd", 1e21, 123456.7890123, "", "reported"),
                ],
            },
        },
        {
            "name": "expected calls with and without detail",
            "result": {
                "status": "limit_exceeded",
                "exit_code": 1,
                "violations": [
                    _violation(
                        "expected_calls",
                        100,
                        70,
                        "count",
                        "reported",
                        "get_weather: expected at least 100 calls, saw 70",
                    ),
                    _violation("expected_calls", 1, 0, "count", "reported"),
                ],
            },
        },
        {
            "name": "error with traceback and the script",
            "result": {
                "status": "error",
                "exit_code": 1,
                "stderr": _TRACEBACK,
                "error": {**_INVALID, "line": 4},
            },
            "script": {"text": _SCRIPT},
        },
        {
            "name": "error with traceback without the script",
            "result": {
                "status": "error",
                "exit_code": 1,
                "stderr": _TRACEBACK,
                "error": {**_INVALID, "line": 4},
            },
        },
        {
            "name": "a prelude is hidden and lines count from the code",
            "result": {
                "status": "error",
                "exit_code": 1,
                "stderr": "Traceback (most recent call last):\n"
                '  File "<script>", line 5, in <module>\n'
                '  File "<script>", line 3, in get_weather\n'
                '  File "tools.py", line 31, in get_weather\n'
                "_ptc_runtime.InvalidArguments: argument 'city': expected string, got 5\n",
                "error": {**_INVALID, "line": 3},
            },
            "script": {
                "text": "import tools as _t\ndef get_weather(*a, **k):\n"
                "    return _t.get_weather(**k)\nx = 1\nget_weather(city=5)\n",
                "prelude_lines": 3,
            },
        },
        {
            "name": "error only in the prelude",
            "result": {
                "status": "error",
                "exit_code": 1,
                "error": {"type": "NameError", "message": "name 'x' is not defined", "line": 2},
            },
            "script": {"text": "a = 1\nb = x\n", "prelude_lines": 2},
        },
        {
            "name": "error without a line, stderr tail cut",
            "result": {
                "status": "error",
                "exit_code": 1,
                "stderr": "Traceback ...\n"
                + "x" * 5000
                + "\nZeroDivisionError: division by zero\n",
                "error": {"type": "ZeroDivisionError", "message": "division by zero", "line": 0},
            },
            "budget": {"stderr_bytes": 200},
        },
        {
            "name": "stderr without error, unicode, cut",
            "result": {"stderr": "warning: ünïcödé\n" * 200, "stdout": "done\n"},
            "budget": {"stderr_bytes": 333},
        },
        {
            "name": "frame lines in odd forms",
            "result": {
                "status": "error",
                "exit_code": 1,
                "stderr": "Traceback (most recent call last):\n"
                '  File "<script>", line 99999999999999999999, in <module>\n'
                '  File "<script>", line ٣, in f\n'
                "    indented source of an unknown frame\n"
                '  File "<script>", line 2, in g \n'
                "       ^^^^\n"
                "_ptc_runtime.ToolError\n"
                "_ptc_runtime.ToolError: x: _ptc_runtime.y\n"
                "Traceback (most recent call last):\n"
                '  File "<script>", line 1, in <module>\n'
                "KeyError: 'k'",
                "error": {"type": "KeyError", "message": "'k'", "line": 1},
            },
            "script": {"text": "  d = {}  \n\x1c\x85 g() \ufeff\n\u3000f()\n"},
        },
        {
            "name": "session value and loss",
            "result": {
                "value": "{'a': 1}\n" + "v" * 9000,
                "session_lost": "memory: the sandbox was killed",
                "stdout": "x\n",
            },
        },
        {"name": "session empty value", "result": {"value": ""}},
        {
            "name": "output files",
            "result": {
                "output_files": [
                    {"name": "report.csv", "size": 2048, "sha256": "ab" * 32},
                    {"name": "tiny", "size": 0, "sha256": "cd" * 32},
                ],
                "omitted_outputs": [
                    {"name": "huge.bin", "reason": "too_large", "size": 5 * (1 << 20) + 1},
                    {"name": "sock", "reason": "not_a_file", "size": None},
                    {"name": "", "reason": "more", "size": 12},
                ],
            },
        },
        {
            "name": "everything, over the hard ceiling",
            "result": {
                "status": "error",
                "exit_code": 2,
                "stdout": "s" * 1500,
                "calls": [_call(i, "get", {"i": i}, result={"v": "y" * 200}) for i in range(1, 30)],
                "error": {"type": "RuntimeError", "message": "late", "line": 9},
                "stderr": "boom\n",
            },
            "budget": {"max_bytes": 2000, "calls": 30, "call_chars": 400},
        },
        {
            "name": "hard ceiling cuts in a multibyte character",
            "result": {"stdout": "ü" * 3000},
            "budget": {"max_bytes": 1001, "stdout_bytes": 8000},
        },
        {
            "name": "tiny ceiling",
            "result": {"stdout": "hello world\n"},
            "budget": {"max_bytes": 10},
        },
    ]
    return out + _seeded(20)


_PIECES = ["a", "é", "東", "😀", "\n", "\r\n", "\u2028", " ", "\t", "x" * 50, "\x00", "🇫🇷"]


def _seeded(count: int) -> list[dict[str, Any]]:
    """Random mixes of lines, unicode, calls and small budgets; the seed fixes them."""
    rng = random.Random(37)
    out = []
    for n in range(count):

        def text(size: int) -> str:
            return "".join(rng.choice(_PIECES) for _ in range(size))

        calls = [
            _call(
                i,
                rng.choice(["get", "put", "ünï"]),
                {"q": text(rng.randrange(0, 30)), "n": rng.choice([1, 2.5, -3, 1e-9, 10**20])},
                rng.choice(["ok", "ok", "error", "denied"]),
                result={"r": text(rng.randrange(0, 40))},
                error=text(rng.randrange(0, 20)),
            )
            for i in range(1, rng.randrange(0, 25))
        ]
        out.append(
            {
                "name": f"seeded {n}",
                "result": {
                    "stdout": text(rng.randrange(0, 1500)),
                    "stderr": text(rng.randrange(0, 600)),
                    "calls": calls,
                },
                "budget": {
                    "max_bytes": rng.randrange(300, 6000),
                    "stdout_bytes": rng.randrange(1, 1500),
                    "stdout_lines": rng.randrange(1, 30),
                    "stderr_bytes": rng.randrange(1, 300),
                    "calls": rng.randrange(1, 12),
                    "call_chars": rng.randrange(1, 200),
                },
            }
        )
    return out


def vectors() -> list[dict[str, Any]]:
    """Every case with the observation the Python SDK renders for it."""
    return [{**case, "observation": render(case)} for case in cases()]


def dump(items: list[dict[str, Any]]) -> str:
    # ASCII escapes: a lone surrogate in an expected text survives the file in both languages.
    return json.dumps(items, indent=1, ensure_ascii=True) + "\n"


def main(argv: list[str]) -> int:
    text = dump(vectors())
    if "--check" in argv:
        if not VECTORS.exists() or VECTORS.read_text(encoding="utf-8") != text:
            print(f"{VECTORS} is stale: run scripts/gen_observation_vectors.py", file=sys.stderr)
            return 1
        return 0
    VECTORS.write_text(text, encoding="utf-8")
    print(f"wrote {len(json.loads(text))} vectors to {VECTORS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
