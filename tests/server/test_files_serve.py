"""Files in and out through a real `ptc serve`-style server, on both backends.

Input files reach the script's working directory byte for byte (binary included) and read-only;
files under outputs/ come back byte for byte with the host's sha256; inputs past their limits are
refused with INVALID_ARGUMENT naming the limit; outputs past their limits are listed as omitted
with their sizes, and a violation says so; names that try to escape are refused (inputs) or
omitted (outputs: a symlink out, a fifo). The audit record keeps the hashes, never the bytes.
After the hostile cases the server still serves.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox._proto import sandbox_pb2 as pb
from sandbox.client import InputFile
from sandbox.errors import InvalidArgument

ServerHarness = Any  # the class comes from tests/server/conftest.py (`server_harness`)
BACKENDS = [
    "process",
    pytest.param("docker", marks=pytest.mark.requires_docker),
]
BINARY = bytes(range(256)) * 4096 + b"\x00tail"  # 1 MiB and a bit, every byte value


def _docker_ok() -> bool:
    from sandbox.backends.docker import engine_client
    from sandbox.errors import Unavailable

    try:
        client = engine_client.connect(engine_client.engine_address())
    except Unavailable:
        return False
    try:
        engine_client.check_image(client, engine_client.default_image())
    except Unavailable:
        return False
    finally:
        client.close()
    return True


@pytest.fixture(scope="module")
def fserver(
    tmp_path_factory: pytest.TempPathFactory, server_harness: type[ServerHarness]
) -> Iterator[ServerHarness]:
    db = tmp_path_factory.mktemp("files-audit") / "audit.db"
    harness = server_harness(docker=_docker_ok(), audit_db=str(db))
    yield harness
    harness.close()
    assert harness.leftovers() == []


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize("backend", BACKENDS)
def test_files_in_and_out_byte_exact(fserver: ServerHarness, backend: str) -> None:
    script = """
import hashlib, os, stat
data = open('in.bin', 'rb').read()
text = open('docs/readme.txt', 'rb').read()
print(len(data), hashlib.sha256(data).hexdigest(), text.decode())
print(oct(stat.S_IMODE(os.stat('in.bin').st_mode)), sorted(os.listdir('.')))
open('outputs/rev.bin', 'wb').write(data[::-1])
os.makedirs('outputs/sub')
open('outputs/sub/empty', 'wb').close()
open('outputs/sub/note.txt', 'w').write('h\\u00e9')
"""
    files = {"in.bin": BINARY, "docs/readme.txt": "héllo".encode()}
    result = fserver.client.execute(script, backend=backend, files=files)
    assert result.status == "ok", result.stderr
    first, second = result.stdout.splitlines()
    assert first == f"{len(BINARY)} {_sha(BINARY)} héllo"
    assert second == "0o444 ['docs', 'in.bin', 'outputs']"
    outputs = {f.name: f for f in result.output_files}
    assert sorted(outputs) == ["rev.bin", "sub/empty", "sub/note.txt"]
    rev = outputs["rev.bin"]
    assert (rev.data, rev.size, rev.sha256) == (BINARY[::-1], len(BINARY), _sha(BINARY[::-1]))
    assert outputs["sub/empty"].data == b"" and outputs["sub/empty"].sha256 == _sha(b"")
    assert outputs["sub/note.txt"].data == "hé".encode()
    assert result.omitted_outputs == [] and result.violations == []
    assert [(d.name, d.size, d.sha256) for d in result.input_files] == [
        ("in.bin", len(BINARY), _sha(BINARY)),
        ("docs/readme.txt", 6, _sha("héllo".encode())),
    ]
    # The audit record has the hashes, never the bytes.
    record = fserver.client.get_execution(result.execution_id)
    assert record.result is not None
    assert [(f.name, f.size, f.sha256, f.data) for f in record.result.output_files] == [
        (f.name, f.size, f.sha256, b"") for f in result.output_files
    ]
    assert [d.sha256 for d in record.result.input_files] == [
        _sha(BINARY),
        _sha(files["docs/readme.txt"]),
    ]


@pytest.mark.parametrize("backend", BACKENDS)
def test_stream_and_paths_and_save(fserver: ServerHarness, backend: str, tmp_path: Path) -> None:
    source = tmp_path / "data.csv"
    source.write_bytes(b"a,b\n1,2\n")
    result = fserver.client.run(
        "import shutil\nshutil.copy('data.csv', 'outputs/copy.csv')\nprint(open('x').read())",
        backend=backend,
        files=[source, ("x", b"named")],
    )
    assert (result.status, result.stdout) == ("ok", "named\n"), result.stderr
    saved = result.save_outputs(tmp_path / "out")
    assert saved == [tmp_path / "out" / "copy.csv"]
    assert saved[0].read_bytes() == b"a,b\n1,2\n"


@pytest.mark.parametrize("backend", BACKENDS)
def test_inputs_are_read_only_copies(fserver: ServerHarness, backend: str) -> None:
    script = """
try:
    open('in.txt', 'a').write('more')
except PermissionError as exc:
    print('refused', exc.errno)
"""
    result = fserver.client.execute(script, backend=backend, files={"in.txt": b"x"})
    assert (result.status, result.stdout) == ("ok", "refused 13\n"), result.stderr


@pytest.mark.parametrize(
    ("files", "limits", "message"),
    [
        pytest.param(
            {f"f{i}": b"" for i in range(4)},
            {"input_files": 3},
            "input_files: 4 files is more than the input_files limit of 3",
            id="too-many",
        ),
        pytest.param(
            {"a": b"x" * 600, "b": b"x" * 500},
            {"input_bytes": 1000},
            "input_files: 'b': the input files take more than the input_bytes limit of 1000 bytes",
            id="too-large",
        ),
        pytest.param(
            {"a": b"x" * 600},
            {"file_size_bytes": 500},
            "input_files: 600 bytes do not fit the sandbox's working directory (file_size "
            "limit of 500 bytes)",
            id="over-file-size",
        ),
        pytest.param(
            {"../x": b""},
            {},
            "input_files: '../x': the file name has a '..' component (no '..', '.' or '//')",
            id="dotdot",
        ),
        pytest.param(
            {"/etc/x": b""},
            {},
            "input_files: '/etc/x': the file name is an absolute path",
            id="abs",
        ),
        pytest.param(
            {"a\x00b": b""},
            {},
            "input_files: 'a\\x00b': the file name contains a NUL or control character",
            id="nul",
        ),
        pytest.param(
            {"outputs/x": b""},
            {},
            "input_files: 'outputs/x': inputs may not be placed under outputs/",
            id="under-outputs",
        ),
        pytest.param(
            {"a": b"", "a/b": b""},
            {},
            "input_files: 'a/b': 'a' is a file, not a directory",
            id="file-as-dir",
        ),
    ],
)
def test_bad_inputs_are_invalid_argument(
    fserver: ServerHarness, files: dict[str, bytes], limits: dict[str, int], message: str
) -> None:
    with pytest.raises(InvalidArgument) as info:
        fserver.client.execute("print(1)", files=files, limits=limits or None)
    assert info.value.message == message
    fserver.assert_healthy()


def test_duplicate_input_name_is_invalid_argument(fserver: ServerHarness) -> None:
    files = [InputFile("a", b"1"), InputFile("a", b"2")]
    with pytest.raises(InvalidArgument) as info:
        fserver.client.execute("print(1)", files=files)
    assert info.value.message == "input_files: 'a': the name is given twice"


@pytest.mark.parametrize("backend", BACKENDS)
def test_outputs_over_caps_are_reported(fserver: ServerHarness, backend: str) -> None:
    script = """
for i in range(4):
    open(f'outputs/f{i}', 'wb').write(b'x' * 100)
open('outputs/big', 'wb').write(b'x' * 300)
"""
    limits = {"output_files": 3, "output_file_bytes": 200, "output_bytes": 250}
    result = fserver.client.execute(script, backend=backend, limits=limits)
    assert result.status == "limit_exceeded", result.stderr
    assert [(f.name, f.size) for f in result.output_files] == [("f0", 100), ("f1", 100)]
    assert [(o.name, o.reason, o.size, o.limit) for o in result.omitted_outputs] == [
        ("big", "output_file_bytes", 300, 200),
        ("f2", "output_bytes", 100, 250),
        ("f3", "output_bytes", 100, 250),
    ]
    assert [(v.limit, v.limit_value, v.observed, v.action) for v in result.violations] == [
        ("output_file_bytes", 200, 300, "truncated"),
        ("output_bytes", 250, 400, "truncated"),
    ]
    assert result.violations[1].detail == "2 output files omitted: f2 (100 bytes), f3 (100 bytes)"


@pytest.mark.parametrize("backend", BACKENDS)
def test_output_count_cap(fserver: ServerHarness, backend: str) -> None:
    script = "for i in range(5):\n    open(f'outputs/f{i}', 'w').write(str(i))"
    result = fserver.client.execute(script, backend=backend, limits={"output_files": 2})
    assert [f.name for f in result.output_files] == ["f0", "f1"]
    assert [(o.name, o.reason, o.size, o.limit) for o in result.omitted_outputs] == [
        ("f2", "output_files", 1, 2),
        ("f3", "output_files", 1, 2),
        ("f4", "output_files", 1, 2),
    ]
    assert [(v.limit, v.observed, v.evidence) for v in result.violations] == [
        ("output_files", 5, "guest")
    ]


@pytest.mark.parametrize("backend", BACKENDS)
def test_escapes_from_outputs_are_omitted(fserver: ServerHarness, backend: str) -> None:
    script = """
import os
os.symlink('/etc/passwd', 'outputs/passwd')
os.symlink('/ptc', 'outputs/runtime')
os.symlink('../in.txt', 'outputs/up')
os.mkfifo('outputs/fifo')
os.mkdir('outputs/d')
open('outputs/d/ok', 'w').write('ok')
open('outputs/bad\\x01name', 'w').write('x')
"""
    result = fserver.client.execute(script, backend=backend, files={"in.txt": b"secret"})
    assert result.status == "ok", result.stderr
    assert [(f.name, f.data) for f in result.output_files] == [("d/ok", b"ok")]
    assert sorted((o.name, o.reason) for o in result.omitted_outputs) == [
        ("bad?name", "bad_name"),
        ("fifo", "not_regular"),
        ("passwd", "symlink"),
        ("runtime", "symlink"),
        ("up", "symlink"),
    ]
    fserver.assert_healthy()


@pytest.mark.parametrize("backend", BACKENDS)
def test_outputs_dir_replaced_by_a_link(fserver: ServerHarness, backend: str) -> None:
    script = "import os, shutil\nshutil.rmtree('outputs')\nos.symlink('/etc', 'outputs')"
    result = fserver.client.execute(script, backend=backend)
    assert result.status == "ok", result.stderr
    assert result.output_files == []
    assert [(o.name, o.reason) for o in result.omitted_outputs] == [("outputs", "symlink")]


def test_forged_out_frames_are_checked_by_the_host(fserver: ServerHarness) -> None:
    """A script that speaks the channel protocol itself gains nothing: names are checked
    again, duplicates refused, caps enforced, and a chunk out of order is a protocol
    violation."""
    script = r"""
import base64, json, socket, struct, sys
sock = socket.socket(fileno=int(sys.argv[1]))
def send(obj):
    body = json.dumps(obj).encode()
    sock.sendall(struct.pack('>I', len(body)) + body)
d = base64.b64encode(b'abc').decode()
send({'t': 'out', 'name': '../etc/x', 'size': 3, 'offset': 0, 'data': d})
send({'t': 'out', 'name': 'ok', 'size': 3, 'offset': 0, 'data': d})
send({'t': 'out', 'name': 'ok', 'size': 3, 'offset': 0, 'data': d})
send({'t': 'out', 'name': 'big', 'size': 10**9, 'offset': 0, 'data': d})
send({'t': 'out', 'name': 'late', 'size': 6, 'offset': 0, 'data': d})
send({'t': 'out', 'name': 'late', 'size': 6, 'offset': 5, 'data': d})
"""
    result = fserver.client.execute(script)
    assert [(f.name, f.data) for f in result.output_files] == [("ok", b"abc")]
    assert [(o.name, o.reason, o.detail) for o in result.omitted_outputs][:3] == [
        ("../etc/x", "bad_name", "the name has a '..' component (no '..', '.' or '//')"),
        ("ok", "bad_name", "the name was returned twice"),
        ("big", "output_file_bytes", ""),
    ]
    assert result.violations[0].limit == "protocol"
    assert result.violations[0].detail == "out frame for 'late': chunk at 5 out of order"
    fserver.assert_healthy()


def test_execute_request_proto_carries_files(fserver: ServerHarness) -> None:
    """The raw proto, as any gRPC client sends it."""
    import grpc

    from sandbox._proto import sandbox_pb2_grpc as pb_grpc

    request = pb.ExecuteRequest(script="print(open('a').read())")
    request.input_files.add(name="a", content=b"raw")
    with grpc.insecure_channel(fserver.address) as channel:
        answer = pb_grpc.SandboxServiceStub(channel).Execute(request)
    assert (answer.stdout, [d.name for d in answer.input_files]) == ("raw\n", ["a"])
    assert [d.sha256 for d in answer.input_files] == [_sha(b"raw")]


@pytest.mark.parametrize("backend", BACKENDS)
def test_file_size_still_bounds_what_the_script_writes(
    fserver: ServerHarness, backend: str
) -> None:
    script = "open('outputs/big', 'wb').write(b'x' * (2 << 20))"
    limits = {"file_size_bytes": 1 << 20}
    result = fserver.client.execute(script, backend=backend, limits=limits)
    assert result.status == "limit_exceeded", result.stderr
    assert [v.limit for v in result.violations] == ["file_size"]
    assert result.error is not None and result.error.type == "OSError"
    # What the script did write (up to the limit) is still returned, and says its size.
    [big] = result.output_files
    assert big.name == "big" and 0 < big.size <= 1 << 20 and big.data == b"x" * big.size
    fserver.assert_healthy()


def test_many_omitted_outputs_are_counted_not_all_listed(fserver: ServerHarness) -> None:
    script = "for i in range(300):\n    open(f'outputs/f{i:03d}', 'w').write('x')"
    result = fserver.client.execute(script, limits={"output_files": 2})
    assert [f.name for f in result.output_files] == ["f000", "f001"]
    assert len(result.omitted_outputs) == 101
    assert result.omitted_outputs[0].name == "f002"
    last = result.omitted_outputs[-1]
    assert (last.name, last.reason, last.size) == ("", "more", 198)
    [violation] = result.violations
    assert (violation.limit, violation.limit_value, violation.observed) == ("output_files", 2, 300)
    assert violation.detail.startswith("298 output files omitted: f002 (1 bytes), ")
    assert violation.detail.endswith(" and 293 more")


@pytest.mark.parametrize(
    ("frame", "detail"),
    [
        ({"t": "out", "name": "x", "size": 3, "offset": 0, "data": "a$c="}, "not base64"),
        ({"t": "out", "name": 7, "size": 3, "offset": 0, "data": ""}, "name must be a string"),
        ({"t": "out", "name": "x", "size": -1, "offset": 0, "data": ""}, "size must be"),
        ({"t": "omit", "name": "x", "reason": 5}, "reason must be a short string"),
    ],
    ids=["bad-base64", "name-type", "negative-size", "reason-type"],
)
def test_malformed_file_frames_are_protocol_violations(
    fserver: ServerHarness, frame: dict[str, object], detail: str
) -> None:
    script = (
        "import json, socket, struct, sys\n"
        "sock = socket.socket(fileno=int(sys.argv[1]))\n"
        f"body = json.dumps({frame!r}).encode()\n"
        "sock.sendall(struct.pack('>I', len(body)) + body)\n"
        "import time; time.sleep(5)\n"
    )
    result = fserver.client.execute(script)
    assert result.status == "limit_exceeded"
    assert [v.limit for v in result.violations] == ["protocol"]
    assert detail in result.violations[0].detail
    assert result.output_files == []
    fserver.assert_healthy()
