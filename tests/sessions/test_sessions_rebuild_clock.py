"""A rebuilt session's clock points (`RebuildClock`): the request that found no holder, the
take-over's commit, the first replayed cell's job sent, in that order and on one clock; what
`bench.session_rebuild` times a take-over by.

Through a real server: a session of three cells is let go of as a draining server does (its
sandbox disposed, its record handed over in the SQLite store), and its next cell, sent by the
client, rebuilds it on the same server's miss path."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from tests.sessions.conftest import SessionServer


def test_a_rebuild_marks_its_take_over_and_its_first_replayed_cell(srv: SessionServer) -> None:
    manager = srv.server.runner.sessions
    store: Any = srv.server.runner.store  # a SQLite store, which moves sessions
    with srv.a.session(backend=srv.backend) as session:
        for i in range(3):
            assert session.execute(f"x{i} = {i}\nprint(x{i})").stdout == f"{i}\n"
        held = manager._sessions[session.id]
        assert held.rebuilt is None  # created here, never rebuilt
        created_first_job = held.sandbox.first_job_at
        assert created_first_job is not None

        async def let_go() -> None:
            manager._sessions.pop(session.id)
            await held.sandbox.dispose()
            assert await asyncio.to_thread(store.hand_over, session.id, "test")

        srv.call(let_go())
        before = time.monotonic()
        done = session.execute("print(x0 + x1 + x2)")
        after = time.monotonic()
        assert (done.status, done.stdout) == ("ok", "3\n")  # the state came back
        rebuilt = manager._sessions[session.id]
        assert rebuilt is not held
        clock, first_job = rebuilt.rebuilt, rebuilt.sandbox.first_job_at
        assert clock is not None and first_job is not None
        assert before <= clock.asked <= clock.taken_over <= first_job <= after
        assert first_job > created_first_job  # the new sandbox's, not the old one's
