"""Checkpoints the SQLite audit file's write-ahead log from a thread of its own.

SQLite's own checkpoint runs inside the COMMIT that pushes the WAL past `wal_autocheckpoint`
pages (1000 by default): that commit copies the log into the database file first. The server
writes the audit on its event loop, so every ~100 executions one admit or completion took 15-40
ms and held every execution on the server that long: a write's p99 was 16-19 ms against 0.3 ms
at p50 (`/tmp` script, 3,000 admits and completions in a row on this machine; with SQLite's
checkpoint off, p99 0.4-0.6 ms). Here a thread with a connection of its own checkpoints
(``PASSIVE``: never waiting for, nor blocking, the writer or any reader) whenever the log has
grown past `THRESHOLD_BYTES`, and the writer's own checkpoint stays only as a backstop, at
`BACKSTOP_PAGES`, should this thread fall behind. sqlite3 releases the GIL while SQLite works,
so the loop runs meanwhile. Durability is unchanged: a checkpoint only moves committed frames.

A checkpoint is SQLite's to do; the thread only decides when. No library does that part.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading

__all__ = ["BACKSTOP_PAGES", "THRESHOLD_BYTES", "WalCheckpointer"]

THRESHOLD_BYTES = 4 * 1024 * 1024  # about SQLite's own default (1000 pages of 4 KiB)
BACKSTOP_PAGES = 16384  # the writer's own checkpoint, should this thread fall behind (64 MiB)
INTERVAL_S = 0.2
log = logging.getLogger(__name__)


class WalCheckpointer:
    def __init__(
        self,
        path: str,
        threshold_bytes: int = THRESHOLD_BYTES,
        interval_s: float = INTERVAL_S,
    ) -> None:
        self.path = path
        self.threshold_bytes = threshold_bytes
        self.interval_s = interval_s
        self.checkpoints = 0  # PASSIVE checkpoints run
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._warned = False

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        """Starts the thread (once; the first write calls it, so readers never have one)."""
        with self._lock:
            if self._thread is not None or self._stop.is_set():
                return
            self._thread = threading.Thread(
                target=self._run, name="ptc-audit-checkpoint", daemon=True
            )
            self._thread.start()

    def close(self) -> None:
        """Stops the thread and waits for it (a checkpoint under way finishes first)."""
        self._stop.set()
        with self._lock:
            thread = self._thread
        if thread is not None:
            thread.join()

    def _run(self) -> None:
        wal = self.path + "-wal"
        conn: sqlite3.Connection | None = None
        try:
            while not self._stop.wait(self.interval_s):
                try:
                    if os.stat(wal).st_size < self.threshold_bytes:
                        continue
                except FileNotFoundError:
                    continue
                try:
                    if conn is None:
                        conn = sqlite3.connect(self.path, isolation_level=None, timeout=0)
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                    self.checkpoints += 1
                except sqlite3.Error as exc:
                    # The writer's own checkpoint (the backstop) still bounds the log.
                    if not self._warned:
                        self._warned = True
                        log.warning("audit store %s: checkpoint failed: %s", self.path, exc)
        finally:
            if conn is not None:
                conn.close()
