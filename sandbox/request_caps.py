"""What one request may carry, and the label names the server keeps for itself.

Not limits of a run (`sandbox.limits`) but caps on a request's own size: its script, its
manifest, its labels. They are checked with the same message embedded, by the server and by the
client SDK before sending; `sandbox.message_bounds` sizes the gRPC receive limits from them.

Labels whose key starts with ``ptc.`` are the server's: the audit record and the session look-up
trust them, so a caller may never set one. The names are stated here once, for the code that
writes them (sessions, the engine, the recorder) and the code that reads them back (the audit
index, its schema steps, the session rebuild).
"""

from __future__ import annotations

from collections.abc import Mapping

from sandbox.errors import InvalidArgument

__all__ = [
    "IDLE_TIMEOUT_LABEL",
    "KIND_LABEL",
    "MAX_EXECUTIONS_LABEL",
    "MAX_LABELS",
    "MAX_LABEL_KEY",
    "MAX_LABEL_VALUE",
    "MAX_LIFETIME_LABEL",
    "MAX_MANIFEST_BYTES",
    "MAX_SCRIPT_BYTES",
    "RESERVED_LABEL_PREFIX",
    "SESSION_LABEL",
    "check_labels",
    "check_manifest_size",
    "check_script_size",
]

MAX_SCRIPT_BYTES = 1024**2
MAX_MANIFEST_BYTES = 4 * 1024**2
# Labels a request or session may carry, and their keys' and values' lengths in characters.
MAX_LABELS = 64
MAX_LABEL_KEY = 128
MAX_LABEL_VALUE = 1024

RESERVED_LABEL_PREFIX = "ptc."
SESSION_LABEL = "ptc.session_id"  # on each cell of a session: the session's id
KIND_LABEL = "ptc.kind"  # "session" on a session's own record
# A session's settings on its own record (decimal strings), which a rebuild and the session
# row read back: its idle timeout and lifetime in milliseconds, its most cells (0: no cap).
IDLE_TIMEOUT_LABEL = "ptc.idle_timeout_ms"
MAX_LIFETIME_LABEL = "ptc.max_lifetime_ms"
MAX_EXECUTIONS_LABEL = "ptc.max_executions"


def check_script_size(script: str) -> None:
    """Refuses a script larger than `MAX_SCRIPT_BYTES` (as UTF-8)."""
    # A str longer than the cap in characters is too large whatever it encodes to: checked
    # first, so that a huge script is refused without encoding it.
    if len(script) > MAX_SCRIPT_BYTES or len(script.encode("utf-8", "surrogatepass")) > (
        MAX_SCRIPT_BYTES
    ):
        raise InvalidArgument(f"script: larger than {MAX_SCRIPT_BYTES} bytes")


def check_manifest_size(manifest: str | bytes) -> None:
    """Refuses a manifest (JSON text) larger than `MAX_MANIFEST_BYTES`."""
    size = len(manifest)
    if isinstance(manifest, str) and size <= MAX_MANIFEST_BYTES:
        size = len(manifest.encode("utf-8", "surrogatepass"))
    if size > MAX_MANIFEST_BYTES:
        raise InvalidArgument(f"manifest: larger than {MAX_MANIFEST_BYTES} bytes")


def check_labels(labels: Mapping[str, str], *, reserved_ok: bool = False) -> None:
    """Refuses more than `MAX_LABELS` labels, an empty or long key, a long value, or a key in
    the server's own namespace (`RESERVED_LABEL_PREFIX`: ``ptc.session_id``, ``ptc.kind``, which
    the audit record and the session look-up trust). ``reserved_ok`` is for a request the
    server or engine already labelled: its own keys are then not counted."""
    if reserved_ok:
        labels = {k: v for k, v in labels.items() if not k.startswith(RESERVED_LABEL_PREFIX)}
    if len(labels) > MAX_LABELS:
        raise InvalidArgument(f"labels: more than {MAX_LABELS} labels")
    for key, value in labels.items():
        if not key or len(key) > MAX_LABEL_KEY:
            raise InvalidArgument(f"labels: key {key[:40]!r} must be 1-{MAX_LABEL_KEY} characters")
        if key.startswith(RESERVED_LABEL_PREFIX):
            raise InvalidArgument(
                f"labels: key {key[:40]!r} is reserved: keys starting with "
                f"{RESERVED_LABEL_PREFIX!r} are set by the server"
            )
        if len(value) > MAX_LABEL_VALUE:
            raise InvalidArgument(f"labels[{key!r}]: longer than {MAX_LABEL_VALUE} characters")
