"""Replay: re-run a recorded script against its recorded tool results after a tool changed.

One execution is recorded (in a temporary audit store) with a plain function as its tool. It is
then replayed twice, no tool running either time: as recorded (identical: every call is answered
from the record) and after the tool gained a required argument, where the replay says exactly
what changed. `ptc replay EXECUTION_ID --audit-db PATH` and `Client.replay` do the same.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from sandbox.integrations import EmbeddedRunner, RunRequest

TEMPERATURES = {"Paris": 21.5, "Oslo": 4.0}
SCRIPT = """\
import tools
warmest = max(["Paris", "Oslo"], key=lambda city: tools.get_weather(city=city)["temp_c"])
print(warmest)
"""


def get_weather(city: str) -> dict[str, Any]:
    """Current weather for a city."""
    return {"city": city, "temp_c": TEMPERATURES[city]}


def get_weather_v2(city: str, units: str) -> dict[str, Any]:
    """Current weather for a city, in the units asked for."""
    raise AssertionError("a replay never calls a tool")


get_weather_v2.__name__ = "get_weather"  # the same tool, with a new required argument


def main() -> None:
    with (
        tempfile.TemporaryDirectory() as tmp,
        EmbeddedRunner(audit=str(Path(tmp) / "audit.db")) as runner,
    ):
        recorded = runner.run(RunRequest(SCRIPT, tools=[get_weather]))
        print(f"recorded: {recorded.status}, {len(recorded.calls)} calls, {recorded.stdout!r}")
        same = runner.replay(recorded.execution_id)
        print(f"replayed as recorded: {'identical' if same.identical else 'differs'}")
        changed = runner.replay(recorded.execution_id, tools=[get_weather_v2])
        print(f"replayed after the change: {len(changed.differences)} differences")
        for difference in changed.differences:
            print(f"  {difference.what} ({difference.kind}): {difference.detail}")


if __name__ == "__main__":
    main()
