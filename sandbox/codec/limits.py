"""`Limits` <-> protobuf: a request's limits (each unset field inherits) and the effective limits
a result, a record and a session carry (every field set, keyed by the proto's unit-named field,
``wall_time_ms``, in canonical integers)."""

from __future__ import annotations

from collections.abc import Mapping

from sandbox._proto import sandbox_pb2 as pb
from sandbox.errors import InvalidArgument
from sandbox.limits import LIMIT_SPECS, SPEC_BY_FIELD, Limits, ResolvedLimits

__all__ = ["limits_fields_from_proto", "limits_from_proto", "limits_to_proto"]

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


def limits_to_proto(limits: Limits | ResolvedLimits | Mapping[str, float]) -> pb.Limits:
    """From canonical dataclasses, or from a mapping keyed by field (``wall_time_ms``, what
    results and audit records carry) or, in records written before that, by limit name in the
    limit's report unit (``wall_time`` in seconds)."""
    if isinstance(limits, Mapping) and limits.keys() <= SPEC_BY_FIELD.keys():
        # Keyed by field, as every result is: built in one call (a result's hot path).
        return pb.Limits(**{field: int(value) for field, value in limits.items()})
    message = pb.Limits()
    for spec in LIMIT_SPECS:
        value: float | None
        if not isinstance(limits, Mapping):
            value = getattr(limits, spec.field)
        elif spec.field in limits:
            value = limits[spec.field]
        else:
            human = limits.get(spec.name)
            value = None if human is None else round(human * spec.scale)
        if value is not None:
            setattr(message, spec.field, int(value))
    return message


def limits_fields_from_proto(message: pb.Limits) -> dict[str, int]:
    """The set fields of ``message`` as ``{field: value}``, as a result carries them (in field
    number order, which is `LIMIT_SPECS` order)."""
    return {
        _LIMIT_FIELDS[descriptor]: int(value)
        for descriptor, value in message.ListFields()
        if descriptor in _LIMIT_FIELDS
    }
