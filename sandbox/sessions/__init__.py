"""Sessions: one sandbox kept for many executions of one conversation (REPL semantics).

`manager` owns the sessions: their lifetimes, expiry, concurrency and hand-over; `session` is
one session's state; `cells` says what a cell sent to a session runs as, and under which limits;
`record` writes a session's audit record; `rebuild` resumes a session from its record on another
server. A cell itself runs in the session's sandbox through `sandbox.execution.cell`.
"""

from sandbox.execution.cell import CellOutcome, SessionSandbox

__all__ = ["CellOutcome", "SessionSandbox"]
