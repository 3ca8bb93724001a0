"""Limits as a record written by an older version keeps them, read back without losing them.

A record's limits read back as `ResolvedLimits` when they are today's complete set by field
(`ResolvedLimits.from_record`). An older version wrote other shapes: limit names in report units
(``{"wall_time": 10.0, "memory": 268435456.0}``: seconds and bytes), or only some of the fields
(a limit added since is absent). No complete set can be made of those without making values up,
so the typed value is None; `OlderLimits` keeps what the record says, as written, so that
``ptc audit show``, the export and a result's JSON print it, and a replay can run under it:
each recorded limit converted to its field (a name in seconds to milliseconds), each limit the
record lacks at today's default, and the replay names those (`OlderLimits.unrecorded`), since it
runs under limits the record never had.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import overload

from sandbox.errors import InvalidLimits
from sandbox.limits import LIMIT_SPECS, SPEC_BY_FIELD, Limits, ResolvedLimits

__all__ = ["OlderLimits", "limits_json", "read_limits"]


@dataclass(frozen=True)
class OlderLimits:
    """A record's limits in an older format, in the units it wrote them (sorted by key, as the
    chain's canonical JSON writes them, so that two equal sets compare equal)."""

    recorded: tuple[tuple[str, int | float], ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "recorded", tuple(sorted(self.recorded)))

    def to_json(self) -> dict[str, int | float]:
        """The limits exactly as the record holds them."""
        return dict(self.recorded)

    def unrecorded(self) -> tuple[str, ...]:
        """The limits (by name, in `LIMIT_SPECS` order) the record does not hold, which a replay
        runs at today's default."""
        held = {key for key, _ in self.recorded}
        return tuple(
            spec.name for spec in LIMIT_SPECS if spec.name not in held and spec.field not in held
        )

    def as_request(self, where: str = "recorded effective_limits") -> Limits:
        """The recorded limits as a request: a name in report units converted to its field
        (``wall_time`` 10.0 s is ``wall_time_ms`` 10000), a field's whole float to its integer;
        every limit the record lacks unset (the defaults of the engine or tenant fill it).
        `InvalidLimits` naming ``where`` for a value today's minimums refuse."""
        values: dict[str, object] = {
            key: int(value)
            if key in SPEC_BY_FIELD and type(value) is float and value.is_integer()
            else value
            for key, value in self.recorded
        }
        return Limits.from_mapping(values, where)


def read_limits(
    data: object, where: str = "limits"
) -> tuple[ResolvedLimits | None, OlderLimits | None]:
    """A record's limits: the typed complete set (`ResolvedLimits.from_record`), else the older
    format as written; (None, None) for none at all (``{}``: a result that never resolved any).
    A key that names no limit, or a value that is not a number, is refused naming it."""
    resolved = ResolvedLimits.from_record(data, where)
    if resolved is not None or not isinstance(data, Mapping) or not data:
        return resolved, None
    recorded: list[tuple[str, int | float]] = []
    for key, value in data.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            shown = repr(value)[:40]
            raise InvalidLimits(f"{where}.{key}: must be a positive number, got {shown}")
        recorded.append((str(key), value))
    return None, OlderLimits(tuple(recorded))


@overload
def limits_json(resolved: ResolvedLimits | None, older: None = None) -> dict[str, int]: ...


@overload
def limits_json(
    resolved: ResolvedLimits | None, older: OlderLimits | None
) -> dict[str, int] | dict[str, int | float]: ...


def limits_json(
    resolved: ResolvedLimits | None, older: OlderLimits | None = None
) -> dict[str, int] | dict[str, int | float]:
    """What a result's ``limits`` and an admission's ``effective_limits`` hold as JSON (the
    bytes the audit chain hashes), and a session's limits: the fields of the complete set
    (`ResolvedLimits.to_fields`), else the older limits as recorded, else ``{}`` (no limits at
    all, or a caller that leaves an older record's out: a session, a replay's request)."""
    if resolved is not None:
        return resolved.to_fields()
    return {} if older is None else older.to_json()
