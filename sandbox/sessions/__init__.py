"""Sessions: one sandbox kept for many executions of one conversation (REPL semantics).

`driver` runs one execution as one cell of a session's sandbox; `manager` owns the sessions:
their limits, expiry, concurrency and audit records.
"""

from sandbox.execution.cell import CellOutcome, SessionSandbox

__all__ = ["CellOutcome", "SessionSandbox"]
