"""The durable outbox every MLflow record goes through first (SQLite, `<outbox_dir>/outbox.db`),
and how it names a server. Apart from `tracking` so that reading it (`ranknas status`: how many
records wait) does not import MLflow's client, which takes seconds."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

OUTBOX_FILE = "outbox.db"

LOOPBACK_NAMES = ("localhost", "[::1]")  # this machine's server, as 127.0.0.1 names it


def server_key(uri: str) -> str:
    """The server `uri` names, as the outbox keeps it: no credentials, no trailing '/', the
    host in lower case and this machine's by one name (a study logged to 127.0.0.1, then
    resumed with localhost, logged every run again as if MLflow had been off)."""
    parts = urllib.parse.urlsplit(uri)
    host, _, port = parts.netloc.rpartition("@")[2].lower().rpartition(":")
    if not host or not port.isdigit():  # no port given
        host, port = f"{host}:{port}".strip(":"), ""
    host = "127.0.0.1" if host in LOOPBACK_NAMES else host
    netloc = f"{host}:{port}" if port else host
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc)).rstrip("/")


def same_server(one: str | None, other: str) -> bool:
    """Whether two tracking URIs (or outbox keys) name one server (`server_key`)."""
    return one is not None and server_key(one) == server_key(other)


def waiting_records(outbox_dir: Path) -> int:
    """The records an outbox holds for delivery (0 where there is none): a study's logs that
    no server took yet. Read only: `ranknas status` writes nothing."""
    path = Path(outbox_dir) / OUTBOX_FILE
    if not path.exists():
        return 0
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)) as conn:
        try:
            return _count(conn, "pending")
        except sqlite3.OperationalError:  # created, its table not yet
            return 0


def _count(conn: sqlite3.Connection, state: str) -> int:
    return conn.execute("SELECT COUNT(*) FROM records WHERE state = ?", (state,)).fetchone()[0]


class Outbox:
    """Append-only SQLite queue of records; states: pending -> done | failed."""

    _SCHEMA = """
        CREATE TABLE IF NOT EXISTS records (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            kind TEXT NOT NULL,
            payload TEXT,
            state TEXT NOT NULL DEFAULT 'pending',
            created_at REAL NOT NULL,
            finished_at REAL,
            error TEXT,
            subject TEXT,
            uri TEXT
        );
        CREATE INDEX IF NOT EXISTS records_by_state ON records (state, id);
    """

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / OUTBOX_FILE
        self.lock_path = directory / "deliver.lock"
        with self._connect() as conn:
            conn.executescript(self._SCHEMA)
            columns = {row[1] for row in conn.execute("PRAGMA table_info(records)")}
            for column in ("subject", "uri"):  # an outbox written before runs were kept
                if column not in columns:
                    with contextlib.suppress(sqlite3.OperationalError):  # another process did
                        conn.execute(f"ALTER TABLE records ADD COLUMN {column} TEXT")

    @contextlib.contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        conn = sqlite3.connect(self.path, timeout=30.0)
        try:
            with conn:  # one transaction, committed on success
                yield conn
        finally:
            conn.close()

    def append(
        self, kind: str, payload: dict[str, Any], subject: str | None = None, uri: str = ""
    ) -> None:
        with self._connect() as conn:
            conn.execute(
                "INSERT INTO records (kind, payload, created_at, subject, uri)"
                " VALUES (?, ?, ?, ?, ?)",
                (kind, json.dumps(payload), time.time(), subject, uri),
            )

    def subjects(self, uri: str) -> set[str] | None:
        """The subjects of the run records queued for server `uri`, delivered or not; None
        where a run record has none (written before they were kept)."""
        with self._connect() as conn:
            rows = conn.execute("SELECT subject, uri FROM records WHERE kind = 'trial'").fetchall()
        if any(subject is None for subject, _ in rows):
            return None
        return {subject for subject, queued_for in rows if same_server(queued_for, uri)}

    def delivered(self, uri: str) -> int:
        """How many run records were delivered to server `uri`."""
        with self._connect() as conn:
            rows = conn.execute("SELECT uri FROM records WHERE kind = 'trial' AND "
                                "state = 'done'").fetchall()  # fmt: skip
        return sum(same_server(queued_for, uri) for (queued_for,) in rows)

    def forget(self, uri: str) -> None:
        """Drop the records delivered (or refused) to server `uri`; pending ones stay."""
        with self._connect() as conn:
            rows = conn.execute("SELECT id, uri FROM records WHERE state != 'pending'").fetchall()
            ids = [(i,) for i, queued_for in rows if same_server(queued_for, uri)]
            conn.executemany("DELETE FROM records WHERE id = ?", ids)

    def next_pending(self) -> tuple[int, str, dict[str, Any]] | None:
        with self._connect() as conn:
            row = conn.execute(
                "SELECT id, kind, payload FROM records WHERE state = 'pending' ORDER BY id LIMIT 1"
            ).fetchone()
        return None if row is None else (row[0], row[1], json.loads(row[2]))

    def mark_done(self, record_id: int) -> None:
        self._finish(record_id, "done", None)

    def mark_failed(self, record_id: int, error: str) -> None:
        self._finish(record_id, "failed", error)

    def _finish(self, record_id: int, state: str, error: str | None) -> None:
        with self._connect() as conn:
            conn.execute(
                "UPDATE records SET state = ?, error = ?, finished_at = ?,"
                " payload = CASE WHEN ? = 'done' THEN NULL ELSE payload END WHERE id = ?",
                (state, error, time.time(), state, record_id),
            )

    def count(self, state: str) -> int:
        with self._connect() as conn:
            return _count(conn, state)

    def failures(self) -> list[str]:
        with self._connect() as conn:
            rows = conn.execute(
                "SELECT id, kind, error FROM records WHERE state = 'failed' ORDER BY id"
            ).fetchall()
        return [f"record {rid} ({kind}): {error}" for rid, kind, error in rows]
