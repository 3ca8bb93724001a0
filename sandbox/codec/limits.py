"""`Limits` <-> protobuf: a request's limits (each unset field inherits) and the effective limits
a result, a record and a session carry (`ResolvedLimits`: every field set, in canonical integers,
or None for a record in an older format)."""

from __future__ import annotations

from sandbox._proto import sandbox_pb2 as pb
from sandbox.errors import InvalidArgument
from sandbox.limits import LIMIT_SPECS, SPEC_BY_FIELD, Limits, ResolvedLimits

__all__ = [
    "limits_fields_from_proto",
    "limits_from_proto",
    "limits_to_proto",
    "resolved_from_proto",
]

_LIMIT_FIELDS = {d: d.name for d in pb.Limits.DESCRIPTOR.fields if d.name in SPEC_BY_FIELD}
_NO_LIMITS = Limits()  # frozen: one for every request that sets none


def limits_from_proto(message: pb.Limits, where: str = "limits") -> Limits:
    """A request's limits, each checked against its spec; a bad one names ``where.field``."""
    values: dict[str, int] = {}
    # The fields set, in field-number order (the limits' own order): most requests set none.
    for descriptor, raw in message.ListFields():
        spec = SPEC_BY_FIELD.get(descriptor.name)
        if spec is not None:
            value = int(raw)
            if value <= 0:
                raise InvalidArgument(
                    f"{where}.{spec.field}: must be positive (leave it unset to inherit the "
                    "default)"
                )
            values[spec.field] = spec.check(value, f"{where}.{spec.field}")
    return Limits(**values) if values else _NO_LIMITS


def limits_to_proto(limits: Limits | ResolvedLimits | None) -> pb.Limits:
    """A request's limits (the fields set), or effective limits (every field); None, a record's
    limits in an older format (`ResolvedLimits.from_record`), is an empty message."""
    if isinstance(limits, ResolvedLimits):
        return pb.Limits(**limits.to_fields())  # built in one call: a result's hot path
    message = pb.Limits()
    if limits is not None:
        for spec in LIMIT_SPECS:
            value = getattr(limits, spec.field)
            if value is not None:
                setattr(message, spec.field, value)
    return message


def resolved_from_proto(
    message: pb.Limits, where: str = "effective_limits"
) -> ResolvedLimits | None:
    """The effective limits a result, a record or a session carries: every field set (in field
    number order, which is `LIMIT_SPECS` order); None when none or only some are, as from a
    server before every limit was sent (`ResolvedLimits.from_record`)."""
    return ResolvedLimits.from_record(limits_fields_from_proto(message), where)


def limits_fields_from_proto(message: pb.Limits) -> dict[str, int]:
    """The set fields of ``message`` as ``{field: value}``, as a session's info carries them: a
    live session shows its whole-sandbox limits only (in field number order, which is
    `LIMIT_SPECS` order)."""
    return {
        _LIMIT_FIELDS[descriptor]: int(value)
        for descriptor, value in message.ListFields()
        if descriptor in _LIMIT_FIELDS
    }
