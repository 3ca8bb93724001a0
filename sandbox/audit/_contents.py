# ruff: noqa: S608  -- SQL here is assembled from constants and "?" marks; values are bound.
"""The contents role of the SQL audit store: text that repeats, stored once per tenant.

An agent sends the same manifest with every execution and often the same script again (a retry,
a scheduled run, a template filled in again); kept inline, each admission entry carried both in
full, most of a store's bytes. An admission entry written since schema step 10 names them by
their SHA-256 instead (``"by_digest": ["manifest_json", "script"]``, each digest under
``<field>_sha256``), and the text is a row of ``contents`` keyed by (tenant, digest), written
once. The entry's hash covers the digests, and a digest fixes its text, so the chain proves
what it proved when it held the text: `verify` checks each referenced row against its digest
(`ContentCheck`), and a read (`Contents.expand`) does too before it returns the text.

Each row keeps the sequence number of the latest admission that named it (``last_seq``, moved
by the same statement that writes the row, which does nothing else when the text is there), so
retention removes the rows no entry it keeps refers to (`prune_named`): of those the pruned
admissions name, the ones no later entry names, each by its key, never a search of the history.
One table, one statement, no index but the key: a second table for the last use cost an
admission of a new script 25 us more CPU (two more statements' worth of B-trees), and SQLite
rewrites only the changed page of a row whose record keeps its size.
"""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

from sandbox.audit._codec import sha256_text
from sandbox.audit._db import Tx
from sandbox.errors import PtcError

__all__ = [
    "BY_DIGEST",
    "STORED",
    "ContentCheck",
    "Contents",
    "prune_named",
    "references",
    "stored_form",
    "texts",
]

STORED = ("manifest_json", "script")  # the admission fields stored by digest, sorted
BY_DIGEST = "by_digest"  # the admission key that lists them
_CACHE_BYTES = 16 * 1024 * 1024  # of text kept in memory by a store, most recently read first
_MEMO_CHARS = 256 * 1024  # texts up to this long have their digests remembered (`_recent_digest`)


def stored_form(data: dict[str, Any]) -> dict[str, Any]:
    """The admission ``data`` as its entry holds it: each `STORED` field replaced by its
    digest, which is added to ``data`` too (``data["script_sha256"]`` is already the
    script's), so `texts` finds the rows to write without hashing again."""
    for field in STORED:
        key = f"{field}_sha256"
        if key not in data:
            text = str(data[field])
            data[key] = _recent_digest(text) if len(text) <= _MEMO_CHARS else sha256_text(text)
    entry = {k: v for k, v in data.items() if k not in STORED}
    entry[BY_DIGEST] = list(STORED)
    return entry


@functools.lru_cache(maxsize=16)
def _recent_digest(text: str) -> str:
    """`sha256_text`, remembered for the last few texts: a tenant's manifest comes with every
    execution, and a dictionary look-up of it (Python's string hash, then one comparison)
    costs a fraction of hashing its kilobytes again on every admission."""
    return sha256_text(text)


def texts(data: Mapping[str, Any]) -> dict[str, str]:
    """{digest: text} of the `STORED` fields of an admission `stored_form` saw."""
    return {str(data[f"{field}_sha256"]): str(data[field]) for field in STORED}


def references(data: Mapping[str, Any]) -> list[tuple[str, str]] | None:
    """(field, digest) of each field an admission payload stores by digest; [] for an entry
    that holds its text inline (written before step 10); None when the listing is malformed."""
    fields = data.get(BY_DIGEST)
    if fields is None:
        return []
    if not isinstance(fields, list) or sorted(fields) != list(STORED):
        return None
    out = [(str(f), data.get(f"{f}_sha256")) for f in fields]
    if any(not isinstance(digest, str) or f in data for f, digest in out):
        return None
    return [(f, str(digest)) for f, digest in out]


class Contents:
    """Writes and reads ``contents`` rows, keeping recently read text in memory: a digest fixes
    its text, so a cached row is never stale (only text that matched its digest is kept)."""

    def __init__(self, cache_bytes: int = _CACHE_BYTES) -> None:
        self._cache: OrderedDict[tuple[str, str], str] = OrderedDict()
        self._cached = 0
        self._limit = cache_bytes
        self._lock = threading.Lock()

    def put(self, tx: Tx, tenant: str, seq: int, texts: Mapping[str, str]) -> None:
        """Writes each text not yet stored, and notes that entry ``seq`` names it."""
        marks = ", ".join("(?, ?, ?, ?)" for _ in texts)
        rows = [v for digest, text in texts.items() for v in (tenant, digest, seq, text)]
        tx.execute(
            f"INSERT INTO contents (tenant, digest, last_seq, body) VALUES {marks} "
            "ON CONFLICT (tenant, digest) DO UPDATE SET last_seq = excluded.last_seq",
            rows,
        )

    def expand(self, tx: Tx, tenant: str, admissions: Sequence[dict[str, Any]]) -> None:
        """Puts back, in place, the text of every field the admissions store by digest.

        Raises `PtcError` (INTERNAL: the store was edited, which `ptc audit verify` names) when
        a row is missing or holds other text than its digest fixes: a read never returns text
        the chain did not commit to."""
        wanted: set[str] = set()  # digests not in memory
        found: dict[str, str] = {}
        for data in admissions:
            for _, digest in references(data) or ():
                text = self._cached_text(tenant, digest)
                if text is None:
                    wanted.add(digest)
                else:
                    found[digest] = text
        names = sorted(wanted)
        for start in range(0, len(names), 500):
            chunk = names[start : start + 500]
            marks = ", ".join("?" for _ in chunk)
            for digest, body in tx.execute(
                f"SELECT digest, body FROM contents WHERE tenant = ? AND digest IN ({marks})",
                (tenant, *chunk),
            ):
                if sha256_text(str(body)) == digest:
                    found[str(digest)] = str(body)
                    self._keep(tenant, str(digest), str(body))
        for data in admissions:
            fields = references(data)
            if fields is None:
                raise PtcError(
                    f"audit store: record {data.get('execution_id')}: its admission lists "
                    f"{BY_DIGEST} malformed (run `ptc audit verify`)"
                )
            for field, digest in fields:
                if digest not in found:
                    raise PtcError(
                        f"audit store: record {data.get('execution_id')}: its {field} (sha256 "
                        f"{digest}) is missing from the store or does not match its digest "
                        "(run `ptc audit verify`)"
                    )
                data[field] = found[digest]

    def _cached_text(self, tenant: str, digest: str) -> str | None:
        with self._lock:
            text = self._cache.get((tenant, digest))
            if text is not None:
                self._cache.move_to_end((tenant, digest))
            return text

    def _keep(self, tenant: str, digest: str, text: str) -> None:
        if len(text) > self._limit // 8:
            return  # a huge text would push out everything else: read it each time
        with self._lock:
            if (tenant, digest) in self._cache:
                return
            self._cache[(tenant, digest)] = text
            self._cached += len(text)
            while self._cached > self._limit:
                _, dropped = self._cache.popitem(last=False)
                self._cached -= len(dropped)


class ContentCheck:
    """What `verify` asks of ``contents``: whether a digest's row is there, matches it, and
    is known to be named as late as entry ``seq`` (else retention could remove it while an
    entry still names it). ``preload``: every row of the tenant read once (a whole-chain
    verification); else each digest is read when first asked (verification since a
    checkpoint, whose cost is what was appended since)."""

    def __init__(self, tx: Tx, tenant: str, *, preload: bool) -> None:
        self._tx, self._tenant = tx, tenant
        self._known: dict[str, tuple[bool, int]] = {}  # digest -> (text matches, last use)
        self._preloaded = preload
        if preload:
            for digest, body, last in tx.stream(_SELECT + " WHERE c.tenant = ?", (tenant,)):
                self._known[str(digest)] = _state(digest, body, last)

    def problem(self, field: str, digest: str, seq: int) -> str | None:
        """Why entry ``seq``'s ``field`` fails (None when it does not)."""
        state = self._known.get(digest)
        if state is None and not self._preloaded:
            rows = self._tx.execute(
                _SELECT + " WHERE c.tenant = ? AND c.digest = ?", (self._tenant, digest)
            )
            if rows:
                state = self._known[digest] = _state(*rows[0])
        if state is None:
            return f"its {field} (sha256 {digest}) is missing from the store's contents: deleted"
        if not state[0]:
            return f"its {field} (sha256 {digest}) does not match its digest: edited"
        if state[1] < seq:
            return (
                f"its {field} (sha256 {digest}) is noted as last named before it, so retention "
                "could remove it: contents edited"
            )
        return None


_SELECT = "SELECT c.digest, c.body, c.last_seq FROM contents c"


def _state(digest: object, body: object, last: object) -> tuple[bool, int]:
    return sha256_text(str(body)) == str(digest), -1 if last is None else int(str(last))


def prune_named(tx: Tx, tenant: str, named: set[str], through_seq: int) -> None:
    """Removes the tenant's rows that no entry after ``through_seq`` names, retention being
    about to remove the entries up to it: of the rows ``named`` by its admissions (read from
    them by the caller: what is pruned), those no later entry names (``last_seq``), each by its
    key."""
    stale = sorted(named)
    for start in range(0, len(stale), 500):
        chunk = stale[start : start + 500]
        marks = ", ".join("?" for _ in chunk)
        tx.execute(
            f"DELETE FROM contents WHERE tenant = ? AND digest IN ({marks}) AND last_seq <= ?",
            (tenant, *chunk, through_seq),
        )
