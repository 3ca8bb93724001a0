"""Replay: re-run a recorded execution with every tool call answered from its record.

    ptc replay EXECUTION_ID --audit-db PATH [--tools MANIFEST] [--limit NAME=VALUE] [--json]

The recorded script runs again in a fresh sandbox, against the *current* stub generator,
runtime and limits (the recorded effective limits, under today's defaults and ceilings, unless
overridden), and with the recorded manifest unless another is given. No tool runs: each call is
answered from the record (`dispatch`), matched by tool and arguments in the recorded order; a call
the record cannot answer is refused in the script and reported, never invented. The replay is
itself recorded, naming the execution it replays, and `compare` lists what differs: status, exit
code, error, stdout, stderr, violations and the call sequence.

Modules: `source` (what a record must hold to be replayed), `dispatch` (the record-answered
handlers and approver), `compare` (the differences), `run` (the embedded flow). The result a
caller gets, `ReplayReport`, is a plain value in `sandbox.replay_report` (re-exported here), so
that its protobuf form (`sandbox.codec.replay`) and the client need none of this package.
"""

from __future__ import annotations

from sandbox.replay_report import Difference, ReplayReport

__all__ = ["Difference", "ReplayReport"]
