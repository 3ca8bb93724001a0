"""Protobuf <-> the house's own values: every message's two halves, encode and decode, in one
module per message family, as pure functions (no I/O, no engine, no store).

| module | message | reads back as |
| --- | --- | --- |
| `limits` | `Limits` | `Limits` (a request's), `{field: value}` (effective) |
| `request` | `ExecuteRequest` | `Request`: script, manifest, `RunOptions` |
| `result` | `ExecutionResult` | `ExecutionResult` |
| `record` | `ExecutionRecord` (an `AuditRecord`), a page | `ExecutionRecord`, `ExecutionPage` |
| `query` | `ListExecutionsRequest` | `ExecutionQuery` |
| `session` | `SessionInfo` (written by `sandbox.server.sessions`) | `SessionInfo` |
| `replay` | `ReplayReport` | `ReplayReport` |
| `values` | enums, timestamps, JSON text | what the modules above share |

The client and the server both import these modules, so they import nothing of the server, the
engine, the backends or a store at run time: `sandbox.client` stays a light import. A decoder
checks what it reads and refuses a bad field with `InvalidArgument` naming its path
(``limits.memory_bytes: ...``), which the server's error interceptor sends as INVALID_ARGUMENT.
The package re-exports nothing: its modules are imported by name.
"""

__all__: list[str] = []
