"""Limits, modelled once: names, units, defaults, ceilings, parsing and clamping.

Every limit has one name (used on the command line, in violations and in tenant configs), one
field in canonical units (milliseconds, bytes, counts; the proto's field names carry the unit),
and one human unit for reports (times in seconds, sizes in bytes). A field set to ``None`` means
"inherit": `Limits.resolve` fills it from the server's defaults once, and the resolved value is
passed unchanged to the broker and the backend.

Every limit has a minimum (`LimitSpec.minimum`: 1 unit, more where a backend cannot apply less)
checked wherever limits are built (`Limits.__post_init__`), and a maximum, the ceiling, applied
by `apply_ceilings` (clamp or refuse). What one request may carry (its script's and manifest's
sizes, its labels) is not a limit of a run: `sandbox.request_caps`.

| name           | field            | default  | enforced by
|----------------|------------------|----------|---------------------------------------------------
| wall_time      | wall_time_ms     | 10 s     | host deadline; SIGKILL of the whole sandbox
| cpu_time       | cpu_time_ms      | 10 s     | RLIMIT_CPU per process; cgroup cpuacct overall
| memory         | memory_bytes     | 256 MiB  | cgroup memory limit; RLIMIT_AS without cgroups
| processes      | processes        | 64       | cgroup pids limit
| stdout_bytes   | stdout_bytes     | 1 MiB    | host capture; the rest dropped with a marker
| stderr_bytes   | stderr_bytes     | 256 KiB  | host capture; the rest dropped with a marker
| file_size      | file_size_bytes  | 16 MiB   | RLIMIT_FSIZE; size of the private tmpfs
| max_tool_calls | max_tool_calls   | 1000     | broker; further calls raise in the script
| open_files     | open_files       | 256      | RLIMIT_NOFILE
| call_log_bytes | call_log_bytes   | 8 MiB    | broker; calls whose arguments do not fit refused
| input_files    | input_files      | 64       | request check; more input files refused
| input_bytes    | input_bytes      | 8 MiB    | request check (also within file_size: the tmpfs)
| output_files   | output_files     | 64       | host; further files under outputs/ omitted
| output_file_bytes | output_file_bytes | 8 MiB | host; a larger file under outputs/ omitted
| output_bytes   | output_bytes     | 16 MiB   | host; files past the total omitted
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from sandbox.errors import InvalidLimits

__all__ = [
    "CEILINGS",
    "DEFAULTS",
    "LIMIT_SPECS",
    "MIN_MEMORY",
    "LimitAdjustment",
    "LimitSpec",
    "Limits",
    "ResolvedLimits",
    "apply_ceilings",
    "parse_limit_args",
]

Unit = Literal["s", "bytes", "count"]

# A warm sandbox already holds its interpreter and bootstrap when the execution's limits are
# applied, and cgroup v1 refuses (EBUSY) a memory limit below what the group uses (a request for
# 1 byte failed as INTERNAL); Docker refuses a container limit below 6 MiB. The smallest memory
# limit is well above both, so it always applies. The process backend ran `print(1)` at 8 MiB.
MIN_MEMORY = 32 * 1024**2
# A container's init, the guest and its channel thread are tasks, and the guest's standard
# streams and channel are descriptors, before the script runs: the smallest `processes` and
# `open_files` leave room for them on every backend. 4 processes is what the gVisor fork-bomb
# test runs under; 16 descriptors is a margin over the guest's own, not measured per backend
# (the process backend lowers its own limits after its start and ran `print(1)` at 1 of each).
MIN_TASKS = 4
MIN_FILES = 16


@dataclass(frozen=True)
class LimitSpec:
    """How one limit is named, stored and shown."""

    name: str
    field: str
    unit: Unit
    scale: int  # canonical units per human unit (1000 ms per s; 1 otherwise)
    doc: str
    # The smallest value a sandbox can start and run under (canonical units): below it a
    # backend cannot apply the limit at all (a cgroup refuses a memory limit below what the
    # sandbox already uses), so a request for less is refused naming the limit, never run.
    minimum: int = 1

    def to_human(self, canonical: int) -> float:
        return canonical / self.scale if self.scale != 1 else float(canonical)

    def describe(self, canonical: int) -> str:
        """The value with its unit for messages: ``1.5 s``, ``1048576 bytes``, ``64 count``
        (exact: never ``1.04858e+06``)."""
        if self.unit == "s":
            return f"{canonical / self.scale:g} s"
        return f"{canonical} {self.unit}"

    def check(self, canonical: int, where: str) -> int:
        """``canonical`` if it is at least this limit's minimum; otherwise `InvalidLimits` naming
        ``where`` (the field or option the value came from). Above the ceiling is not an error
        here: `apply_ceilings` clamps or refuses it under the tenant's policy."""
        if canonical < self.minimum:
            raise InvalidLimits(
                f"{where}: {self.describe(canonical)} is below the minimum of "
                f"{self.describe(self.minimum)}"
            )
        return canonical

    def from_human(self, text: str) -> int:
        """Parses a human value (seconds or bytes, with optional k/m/g suffix for sizes)."""
        raw = text.strip().lower()
        multiplier = 1
        if self.unit == "bytes" and raw and raw[-1] in "kmg":
            multiplier = {"k": 1024, "m": 1024**2, "g": 1024**3}[raw[-1]]
            raw = raw[:-1]
        try:
            value = float(raw)
        except ValueError:
            raise InvalidLimits(
                f"limit {self.name}: {text!r} is not a number ({self.unit})"
            ) from None
        if not math.isfinite(value) or value <= 0:
            raise InvalidLimits(f"limit {self.name}: {text!r} must be a positive number")
        canonical = value * multiplier * self.scale
        if self.unit != "s" and canonical != int(canonical):
            raise InvalidLimits(f"limit {self.name}: {text!r} must be a whole number")
        return self.check(max(1, int(canonical)), f"limit {self.name}")


LIMIT_SPECS: tuple[LimitSpec, ...] = (
    LimitSpec("wall_time", "wall_time_ms", "s", 1000, "wall-clock time of the script"),
    LimitSpec("cpu_time", "cpu_time_ms", "s", 1000, "CPU time of all processes together"),
    LimitSpec("memory", "memory_bytes", "bytes", 1, "memory of the whole sandbox", MIN_MEMORY),
    LimitSpec("processes", "processes", "count", 1, "processes and threads at once", MIN_TASKS),
    LimitSpec("stdout_bytes", "stdout_bytes", "bytes", 1, "captured standard output"),
    LimitSpec("stderr_bytes", "stderr_bytes", "bytes", 1, "captured standard error"),
    LimitSpec("file_size", "file_size_bytes", "bytes", 1, "largest file; size of private tmp"),
    LimitSpec("max_tool_calls", "max_tool_calls", "count", 1, "tool calls per execution"),
    LimitSpec(
        "open_files", "open_files", "count", 1, "open file descriptors per process", MIN_FILES
    ),
    LimitSpec("call_log_bytes", "call_log_bytes", "bytes", 1, "call log: arguments and results"),
    LimitSpec("input_files", "input_files", "count", 1, "input files of one request"),
    LimitSpec("input_bytes", "input_bytes", "bytes", 1, "input files together"),
    LimitSpec("output_files", "output_files", "count", 1, "files returned from outputs/"),
    LimitSpec("output_file_bytes", "output_file_bytes", "bytes", 1, "one returned file"),
    LimitSpec("output_bytes", "output_bytes", "bytes", 1, "returned files together"),
)
SPEC_BY_NAME: dict[str, LimitSpec] = {spec.name: spec for spec in LIMIT_SPECS}
SPEC_BY_FIELD: dict[str, LimitSpec] = {spec.field: spec for spec in LIMIT_SPECS}


@dataclass(frozen=True)
class Limits:
    """Requested limits; ``None`` means inherit the default."""

    wall_time_ms: int | None = None
    cpu_time_ms: int | None = None
    memory_bytes: int | None = None
    processes: int | None = None
    stdout_bytes: int | None = None
    stderr_bytes: int | None = None
    file_size_bytes: int | None = None
    max_tool_calls: int | None = None
    open_files: int | None = None
    call_log_bytes: int | None = None
    input_files: int | None = None
    input_bytes: int | None = None
    output_files: int | None = None
    output_file_bytes: int | None = None
    output_bytes: int | None = None

    def __post_init__(self) -> None:
        # However limits are built (the Python API, a request, a tenants file), a value
        # below a limit's minimum never reaches a backend.
        for spec in LIMIT_SPECS:
            value = getattr(self, spec.field)
            if value is not None:
                spec.check(value, f"limits.{spec.field}")

    def resolve(self, defaults: ResolvedLimits) -> ResolvedLimits:
        """Fills every unset field from ``defaults``."""
        values = {
            spec.field: (
                getattr(self, spec.field)
                if getattr(self, spec.field) is not None
                else getattr(defaults, spec.field)
            )
            for spec in LIMIT_SPECS
        }
        return ResolvedLimits(**values)

    def merged(self, other: Limits) -> Limits:
        """``other``'s set fields over this one's."""
        changes = {
            spec.field: getattr(other, spec.field)
            for spec in LIMIT_SPECS
            if getattr(other, spec.field) is not None
        }
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_mapping(cls, values: Mapping[str, object], where: str = "limits") -> Limits:
        """Builds limits from a mapping, naming bad keys.

        A unit-named field (``wall_time_ms``, ``memory_bytes``, ...) takes its canonical
        integer. A limit's short name takes its human unit, as on the command line and in a
        tenants file: ``{"wall_time": 2}`` is two seconds, ``{"memory": "256m"}`` 256 MiB. (The
        short names once took canonical integers here, so ``{"wall_time": 90}`` meant 90 ms in
        the SDK and 90 s everywhere else: a first-day trap, and this module's own example.)"""
        fields: dict[str, int] = {}
        for key, value in values.items():
            field_spec = SPEC_BY_FIELD.get(key)
            if field_spec is not None:
                if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                    unit = "ms" if field_spec.unit == "s" else field_spec.unit
                    shown = repr(value)[:40]
                    raise InvalidLimits(
                        f"{where}.{key}: must be a positive integer ({unit}), got {shown}"
                    )
                fields[key] = field_spec.check(value, f"{where}.{key}")
                continue
            spec = SPEC_BY_NAME.get(key)
            if spec is None:
                known = ", ".join(s.name for s in LIMIT_SPECS)
                raise InvalidLimits(f"{where}.{key}: unknown limit (known: {known})")
            if isinstance(value, bool) or not isinstance(value, int | float | str):
                shown = repr(value)[:40]
                raise InvalidLimits(f"{where}.{key}: must be a number ({spec.unit}), got {shown}")
            try:
                fields[spec.field] = spec.from_human(str(value))
            except InvalidLimits as exc:
                said = exc.message.removeprefix(f"limit {spec.name}: ")
                raise InvalidLimits(f"{where}.{key}: {said}") from None
        for spec in LIMIT_SPECS:
            if spec.name != spec.field and spec.name in values and spec.field in values:
                raise InvalidLimits(
                    f"{where}: {spec.name} and {spec.field} are the same limit; give one"
                )
        return cls(**fields)


@dataclass(frozen=True)
class ResolvedLimits:
    """Effective limits of one execution: every field set, in canonical units."""

    wall_time_ms: int
    cpu_time_ms: int
    memory_bytes: int
    processes: int
    stdout_bytes: int
    stderr_bytes: int
    file_size_bytes: int
    max_tool_calls: int
    open_files: int
    call_log_bytes: int
    input_files: int
    input_bytes: int
    output_files: int
    output_file_bytes: int
    output_bytes: int

    def to_fields(self) -> dict[str, int]:
        """The limits as results, audit records and ``ptc run --json`` carry them: keyed by the
        proto's unit-named fields (``wall_time_ms``, ``memory_bytes``, ...), canonical integers,
        in `LIMIT_SPECS` order. A new dict each call (the caller may change it), copied from the
        one remembered per limits: every result and admission asks for it."""
        return dict(_fields_of(self))

    @classmethod
    def from_record(cls, data: object, where: str = "limits") -> ResolvedLimits | None:
        """`to_fields`'s inverse, as a result or an audit record read back carries it.

        None for limits written before every limit was recorded by field: an empty mapping (a
        result that never resolved any), one keyed by limit name in report units (``wall_time``
        in seconds), or one lacking a limit added since. Such a record says what was enforced
        then, which is no complete set of today's limits, so none is made up; its entry keeps the
        text as written and still verifies. A complete set with a value that is not a positive
        integer is refused naming it (`InvalidLimits`). Today's minimums are not applied: a
        record says what ran, under the minimums of its day."""
        if type(data) is dict and len(data) == len(_FIELDS):
            # Every result a client reads and every record read back: the limits remembered,
            # not rebuilt, when they are the fields alone, each a positive int.
            given = tuple(map(data.get, _FIELDS))
            if all(type(value) is int and value > 0 for value in given):
                return _resolved(given)
        if not isinstance(data, Mapping):
            raise InvalidLimits(f"{where}: expected an object of limits, got {type(data).__name__}")
        if data.keys() != SPEC_BY_FIELD.keys():
            unknown = [k for k in data if k not in SPEC_BY_FIELD and k not in SPEC_BY_NAME]
            if unknown:
                known = ", ".join(s.field for s in LIMIT_SPECS)
                raise InvalidLimits(f"{where}.{unknown[0]}: unknown limit (known: {known})")
            return None
        values: dict[str, int] = {}
        for spec in LIMIT_SPECS:
            value = data[spec.field]
            if type(value) is float and value.is_integer():
                value = int(value)
            if type(value) is not int or value <= 0:
                unit = "ms" if spec.unit == "s" else spec.unit
                shown = repr(value)[:40]
                raise InvalidLimits(
                    f"{where}.{spec.field}: must be a positive integer ({unit}), got {shown}"
                )
            values[spec.field] = value
        return cls(**values)

    def value(self, name: str) -> int:
        value: int = getattr(self, SPEC_BY_NAME[name].field)
        return value

    def human(self, name: str) -> float:
        """The limit's value in its report unit (seconds for times)."""
        return SPEC_BY_NAME[name].to_human(self.value(name))

    def to_json(self) -> dict[str, float]:
        return {spec.name: self.human(spec.name) for spec in LIMIT_SPECS}


_FIELDS = tuple(spec.field for spec in LIMIT_SPECS)


@functools.lru_cache(maxsize=256)
def _resolved(values: tuple[int, ...]) -> ResolvedLimits:
    return ResolvedLimits(**dict(zip(_FIELDS, values, strict=True)))


@functools.lru_cache(maxsize=256)
def _fields_of(limits: ResolvedLimits) -> dict[str, int]:
    return {spec.field: getattr(limits, spec.field) for spec in LIMIT_SPECS}


DEFAULTS = ResolvedLimits(
    wall_time_ms=10_000,
    cpu_time_ms=10_000,
    memory_bytes=256 * 1024**2,
    processes=64,
    stdout_bytes=1024**2,
    stderr_bytes=256 * 1024,
    file_size_bytes=16 * 1024**2,
    max_tool_calls=1000,
    open_files=256,
    call_log_bytes=8 * 1024**2,
    input_files=64,
    input_bytes=8 * 1024**2,
    output_files=64,
    output_file_bytes=8 * 1024**2,
    output_bytes=16 * 1024**2,
)

CEILINGS = ResolvedLimits(
    wall_time_ms=600_000,
    cpu_time_ms=600_000,
    memory_bytes=8 * 1024**3,
    processes=1024,
    stdout_bytes=64 * 1024**2,
    stderr_bytes=64 * 1024**2,
    file_size_bytes=4 * 1024**3,
    max_tool_calls=1_000_000,
    open_files=4096,
    call_log_bytes=64 * 1024**2,
    # Inputs travel in the request and the job frame, outputs in the result: these ceilings also
    # size the server's and the client's gRPC message limits (`sandbox.message_bounds`).
    input_files=1024,
    input_bytes=64 * 1024**2,
    output_files=1024,
    output_file_bytes=64 * 1024**2,
    output_bytes=64 * 1024**2,
)


@dataclass(frozen=True)
class LimitAdjustment:
    """A requested limit that a ceiling lowered."""

    limit: str
    requested: float
    applied: float
    action: str = "clamped"


def apply_ceilings(
    requested: Limits,
    defaults: ResolvedLimits,
    ceilings: ResolvedLimits,
    policy: Literal["clamp", "refuse"] = "clamp",
) -> tuple[ResolvedLimits, list[LimitAdjustment]]:
    """Effective limits = request (or default) capped by ceilings, once, for the whole run.

    Remembered for the last few hundred combinations (all four are immutable): nearly every
    request asks for the same limits, and resolving them field by field was a tenth of the
    host's Python work per execution (`bench.host_profile`). A refusal is not remembered."""
    resolved, adjustments = _apply_ceilings(requested, defaults, ceilings, policy)
    return resolved, list(adjustments)


@functools.lru_cache(maxsize=256)
def _apply_ceilings(
    requested: Limits,
    defaults: ResolvedLimits,
    ceilings: ResolvedLimits,
    policy: Literal["clamp", "refuse"],
) -> tuple[ResolvedLimits, tuple[LimitAdjustment, ...]]:
    resolved = requested.resolve(defaults)
    adjustments: list[LimitAdjustment] = []
    changes: dict[str, int] = {}
    for spec in LIMIT_SPECS:
        value = resolved.value(spec.name)
        ceiling = ceilings.value(spec.name)
        if value <= ceiling:
            continue
        if policy == "refuse":
            raise InvalidLimits(
                f"limits.{spec.name}: {spec.describe(value)} is above the "
                f"ceiling of {spec.describe(ceiling)}"
            )
        changes[spec.field] = ceiling
        adjustments.append(LimitAdjustment(spec.name, spec.to_human(value), spec.to_human(ceiling)))
    return dataclasses.replace(resolved, **changes), tuple(adjustments)


def parse_limit_args(args: Iterable[str]) -> Limits:
    """Parses ``NAME=VALUE`` pairs (times in seconds, sizes in bytes) as on the command line."""
    fields: dict[str, int] = {}
    for arg in args:
        name, sep, text = arg.partition("=")
        spec = SPEC_BY_NAME.get(name.strip())
        if not sep or spec is None:
            known = ", ".join(s.name for s in LIMIT_SPECS)
            raise InvalidLimits(f"--limit {arg!r}: expected NAME=VALUE with NAME one of {known}")
        fields[spec.field] = spec.from_human(text)
    return Limits(**fields)
