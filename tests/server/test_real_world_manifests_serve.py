"""Real-world manifests through a real `ptc serve` and the client SDK: a non-ASCII parameter
name the model writes as it was shown (a ligature included, which Python reads in NFKC) reaches
the tool under the schema's own key, and an array-level ``enum`` is read as its items' (the
server's GenerateStubs says so as a warning), in Execute and ExecuteStream."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from sandbox.client import Client
from tests.ptc_serve import ptc_serve
from tests.real_world_manifest import LIGATURE, SENT
from tests.real_world_manifest import MANIFEST as TOOLS

MANIFEST = json.dumps(TOOLS)
SCRIPT = f"""\
import tools
print(tools.cotizar_vehículo(año_vehiculo=2019, {LIGATURE}="F-1", acciones=["view"]))
try:
    await tools.aio.cotizar_vehículo(año_vehiculo=2019, acciones=["fly"])
except tools.InvalidArguments as exc:
    print("invalid:", exc)
"""
REFUSED = 'argument \'acciones[0]\': expected one of "view", "edit", got "fly"'


@pytest.fixture(scope="module")
def address() -> Iterator[str]:
    with ptc_serve("--pool-size", "1", "--audit-db", "memory") as serving:
        yield serving.address


def test_served_stubs_keep_the_names_and_warn(address: str) -> None:
    with Client(address) as client:
        stubs = client.stubs(MANIFEST)
    assert stubs.names == {"cotizar_vehículo": "cotizar_vehículo"}
    assert stubs.warnings == [
        "tool 'cotizar_vehículo' at $[0].parameters.properties.acciones.enum: an array's "
        "'enum' lists item values, which no array matches; read as the enum of its items"
    ]
    assert (
        "def cotizar_vehículo(*, año_vehiculo: int, ficha: str=..., "
        "acciones: list[Literal['view', 'edit']]=...):" in stubs.compact
    )


def test_served_calls_arrive_under_the_schemas_keys(address: str) -> None:
    with Client(address) as client:
        unary = client.execute(SCRIPT, MANIFEST)
        streamed = client.run(SCRIPT, MANIFEST)
        healthy = client.execute("print('still ok')")
    for result in (unary, streamed):
        assert (result.status, result.stderr) == ("ok", "")
        assert result.stdout == f"{SENT!r}\ninvalid: {REFUSED}\n"
        calls = [(c.tool, c.arguments, c.status.value, c.error) for c in result.calls]
        assert calls == [
            ("cotizar_vehículo", SENT, "ok", None),
            (
                "cotizar_vehículo",
                {"año_vehiculo": 2019, "acciones": ["fly"]},
                "invalid_arguments",
                REFUSED,
            ),
        ]
    assert (healthy.status, healthy.stdout) == ("ok", "still ok\n")
