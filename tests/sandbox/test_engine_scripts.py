"""How the engine treats a script: syntax and policy checks before any sandbox, top-level await,
an empty stdin, exit codes and the line of an error; bad requests raise typed errors.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from sandbox.engine import ExecutionRequest
from sandbox.errors import InvalidArgument, InvalidLimits, InvalidManifest
from sandbox.integrations.runners import execution_request
from sandbox.limits import parse_limit_args
from sandbox.options import RunOptions

if TYPE_CHECKING:
    from tests.conftest import EngineHarness

ECHO = '[{"name": "echo", "description": "d", "parameters": {"type": "object", "properties": {"i": {"type": "integer"}}}}]'


@pytest.mark.parametrize(
    ("script", "line", "message"),
    [
        ("print(1)\nprint(2\n", 2, "'(' was never closed"),
        ("x = 1\n  y = 2\n", 2, "unexpected indent"),
        ("def f(:\n    pass\n", 1, "invalid syntax"),
        ("print('a')\nreturn 5\n", 2, "'return' outside function"),
    ],
    ids=["unclosed", "indent", "invalid", "return-outside"],
)
def test_syntax_error_is_rejected_with_its_line(
    clean: EngineHarness, script: str, line: int, message: str
) -> None:
    result = clean.run(script)
    assert (result.status, result.exit_code) == ("rejected", 1)
    assert result.error is not None
    assert (result.error.type, result.error.line, result.error.message) == (
        "SyntaxError",
        line,
        message,
    )
    assert result.isolation == []  # rejected before any sandbox was taken
    assert result.stdout == ""


@pytest.mark.parametrize(
    ("script", "line", "reason"),
    [
        ("import json\nimport os\n", 2, "import of 'os' is not allowed"),
        ("from subprocess import run\n", 1, "import of 'subprocess' is not allowed"),
        (
            "x = 1\ny = ().__class__\n",
            2,
            '"__class__" is an invalid attribute name because it starts with "_".',
        ),
        ("f = getattr\n", 1, "'getattr' is not allowed under the restricted policy"),
        ("\n\nopen('/etc/passwd')\n", 3, "'open' is not allowed under the restricted policy"),
        ("exec('1')\n", 1, "'exec' is not allowed under the restricted policy"),
        (
            "import tools\n_secret = 1\n",
            2,
            '"_secret" is an invalid variable name because it starts with "_"',
        ),
    ],
    ids=[
        "import-os",
        "from-subprocess",
        "dunder-attr",
        "getattr",
        "open",
        "exec",
        "underscore-name",
    ],
)
def test_restricted_policy_rejects_with_line_and_reason(
    clean: EngineHarness, script: str, line: int, reason: str
) -> None:
    result = clean.run(script, policy="restricted")
    assert (result.status, result.exit_code) == ("rejected", 1)
    assert result.error is not None
    assert result.error.type == "PolicyError"
    assert result.error.line == line
    assert result.error.message.startswith(reason)
    assert result.isolation == []
    assert result.stderr == f"PolicyError: {result.error.message} (line {line})\n"


def test_restricted_policy_allows_ordinary_tool_scripts(clean: EngineHarness) -> None:
    script = """
import asyncio, json, math, tools
from collections import Counter
results = await asyncio.gather(*(tools.aio.echo(i=i) for i in range(3)))
print(json.dumps([r["i"] for r in results]), math.floor(2.5), Counter("aab")["a"])
"""
    result = clean.run(script, policy="restricted", manifest=ECHO)
    assert (result.status, result.stdout) == ("ok", "[0, 1, 2] 2 2\n"), result.stderr
    # Without the policy the same script runs the same.
    assert clean.run(script, manifest=ECHO).stdout == "[0, 1, 2] 2 2\n"


def test_top_level_await(clean: EngineHarness) -> None:
    result = clean.run(
        "import asyncio\nawait asyncio.sleep(0)\nx = await asyncio.gather(asyncio.sleep(0, 'a'))\nprint(x)"
    )
    assert (result.status, result.stdout) == ("ok", "['a']\n")


def test_top_level_await_error_line(clean: EngineHarness) -> None:
    result = clean.run("import asyncio\nawait asyncio.sleep(0)\n\nraise KeyError('k')")
    assert result.error is not None
    assert (result.status, result.error.type, result.error.line) == ("error", "KeyError", 4)


def test_stdin_is_empty(clean: EngineHarness) -> None:
    result = clean.run(
        "import sys\nprint(repr(sys.stdin.read()))\ntry:\n    input()\nexcept EOFError:\n    print('eof')"
    )
    assert (result.status, result.stdout) == ("ok", "''\neof\n")


@pytest.mark.parametrize(
    ("script", "status", "exit_code", "error_type"),
    [
        ("print('fine')", "ok", 0, None),
        ("import sys\nsys.exit(0)", "ok", 0, None),
        ("import sys\nsys.exit()", "ok", 0, None),
        ("import sys\nsys.exit(3)", "error", 3, "SystemExit"),
        ("import sys\nsys.exit(200)", "error", 200, "SystemExit"),
        ("import sys\nsys.exit('bye')", "error", 1, "SystemExit"),
        ("raise ValueError('boom')", "error", 1, "ValueError"),
        ("import os\nos._exit(7)", "error", 7, "NoReport"),
        # A signal the kernel delivers (a fault) kills the script. (The script is pid 1 of its
        # namespace, so signals it sends itself without a handler are ignored, as for any init.)
        ("import ctypes\nctypes.string_at(0)", "error", -11, "Killed"),
    ],
    ids=["ok", "exit0", "exit-none", "exit3", "exit200", "exit-str", "raise", "os-exit", "segv"],
)
def test_exit_codes(
    clean: EngineHarness, script: str, status: str, exit_code: int, error_type: str | None
) -> None:
    result = clean.run(script)
    assert (result.status, result.exit_code, result.violations) == (status, exit_code, [])
    assert (result.error.type if result.error else None) == error_type


def test_script_error_reports_message_line_and_traceback(clean: EngineHarness) -> None:
    result = clean.run("x = 1\n\ndef f():\n    return 1 / 0\n\nf()")
    assert result.error is not None
    assert (result.error.type, result.error.message, result.error.line) == (
        "ZeroDivisionError",
        "division by zero",
        4,
    )
    assert result.stderr.startswith("Traceback (most recent call last):\n")
    assert "bootstrap" not in result.stderr


def test_tools_module_documents_itself(clean: EngineHarness) -> None:
    result = clean.run("import tools, inspect\nprint(inspect.signature(tools.echo))", manifest=ECHO)
    assert result.stdout.startswith("(*, i: 'int' = ")


def test_bad_requests_raise_typed_errors(clean: EngineHarness) -> None:
    with pytest.raises(InvalidManifest):
        clean.run("print(1)", manifest="{not json")
    with pytest.raises(InvalidArgument, match="larger than"):
        clean.run("#" * (1024 * 1024 + 1))
    with pytest.raises(InvalidLimits, match="wall_time"):
        parse_limit_args(["wall_time=-1"])
    with pytest.raises(InvalidLimits, match="unknown_limit"):
        parse_limit_args(["unknown_limit=1"])
    clean.assert_healthy()


def test_labels_are_capped_embedded_as_served(clean: EngineHarness) -> None:
    """The engine refuses the labels a server refuses (a server's own ``ptc.`` keys are not
    counted: a session cell carries ``ptc.session_id`` beside the caller's 64)."""
    many = {f"k{i}": "v" for i in range(65)}
    with pytest.raises(InvalidArgument, match=r"^labels: more than 64 labels$"):
        clean.call(clean.engine.execute(ExecutionRequest(script="print(1)", labels=many)))
    with pytest.raises(InvalidArgument, match=r"^labels\['k'\]: longer than 1024 characters$"):
        clean.call(clean.engine.execute(ExecutionRequest(script="1", labels={"k": "v" * 1025})))
    ours = {**dict(list(many.items())[:64]), "ptc.session_id": "s"}
    result = clean.call(clean.engine.execute(ExecutionRequest(script="print(1)", labels=ours)))
    assert result.stdout == "1\n"
    with pytest.raises(InvalidArgument) as raised:
        execution_request("1", "[]", RunOptions(labels={"ptc.kind": "session"}))
    assert raised.value.message == (
        "labels: key 'ptc.kind' is reserved: keys starting with 'ptc.' are set by the server"
    )
    clean.assert_healthy()


def test_isolation_layers_are_reported(clean: EngineHarness) -> None:
    result = clean.run("print(1)")
    for layer in (
        "userns",
        "pidns",
        "netns:empty",
        "mntns",
        "caps:none",
        "cgroup:memory",
        "cgroup:pids",
        "rlimits",
        "seccomp",
    ):
        assert layer in result.isolation
    assert result.backend == "process"


def test_a_sandbox_never_runs_a_second_job(clean: EngineHarness) -> None:
    first = clean.run("open('/tmp/mark', 'w').write('1')\nimport os\nprint(os.getpid())")
    second = clean.run("import os\nprint(os.path.exists('/tmp/mark'))")
    assert (first.status, second.stdout) == ("ok", "False\n")
    assert first.execution_id != second.execution_id


def test_signals_the_script_sends_itself_are_ignored_as_for_any_init(clean: EngineHarness) -> None:
    # The guest is pid 1 of its namespace: the kernel drops signals sent to it from inside
    # without a handler, SIGKILL included (SECURITY.md, pid namespace).
    result = clean.run("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\nprint('alive')")
    assert (result.status, result.exit_code, result.stdout) == ("ok", 0, "alive\n")
